package sync

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hagroup/hagroup/pkg/slot"
)

// opLog is a slot.WrapInterceptor that counts module calls and their time
// per token and operation.
type opLog struct {
	mu    sync.Mutex
	calls map[string]int
	spent map[string]time.Duration
}

func newOpLog() *opLog {
	return &opLog{calls: map[string]int{}, spent: map[string]time.Duration{}}
}

func (l *opLog) Before(context.Context, string, slot.Op) error { return nil }

func (l *opLog) Wrap(_ context.Context, token string, op slot.Op, call func() error) error {
	start := time.Now()
	err := call()
	d := time.Since(start)
	l.mu.Lock()
	k := token + " " + string(op)
	l.calls[k]++
	l.spent[k] += d
	l.mu.Unlock()
	return err
}

// count returns the number of op calls on token since the last reset.
func (l *opLog) count(token string, op slot.Op) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.calls[token+" "+string(op)]
}

func (l *opLog) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	clear(l.calls)
	clear(l.spent)
}

// String lists every token and op with count and time, sorted.
func (l *opLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	keys := make([]string, 0, len(l.calls))
	for k := range l.calls {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%-40s %4d %v\n", k, l.calls[k], l.spent[k].Round(time.Microsecond))
	}
	return b.String()
}
