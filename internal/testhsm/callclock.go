package testhsm

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hagroup/hagroup/pkg/slot"
)

// CallClock is a slot.WrapInterceptor that counts and times the member
// calls, per member and op: where a benchmark's wall time goes.
type CallClock struct {
	mu sync.Mutex
	n  map[string]int
	d  map[string]time.Duration
}

// Before lets every call through.
func (c *CallClock) Before(context.Context, string, slot.Op) error { return nil }

// Wrap times call.
func (c *CallClock) Wrap(_ context.Context, token string, op slot.Op, call func() error) error {
	start := time.Now()
	err := call()
	k := token + " " + string(op)
	c.mu.Lock()
	if c.n == nil {
		c.n, c.d = map[string]int{}, map[string]time.Duration{}
	}
	c.n[k]++
	c.d[k] += time.Since(start)
	c.mu.Unlock()
	return err
}

// Count returns how many op calls token got since the last Reset.
func (c *CallClock) Count(token string, op slot.Op) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[token+" "+string(op)]
}

// String lists every call counted, as Report does for one operation.
func (c *CallClock) String() string { return c.Report(1) }

// Reset forgets the calls counted so far.
func (c *CallClock) Reset() {
	c.mu.Lock()
	c.n, c.d = nil, nil
	c.mu.Unlock()
}

// Report lists the calls, longest first, each as calls and ms per one of
// per operations, after the time of them all.
func (c *CallClock) Report(per int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	ks := make([]string, 0, len(c.n))
	var total time.Duration
	for k := range c.n {
		ks = append(ks, k)
		total += c.d[k]
	}
	sort.Slice(ks, func(i, j int) bool { return c.d[ks[i]] > c.d[ks[j]] })
	out := []string{fmt.Sprintf("all calls %.0f ms", total.Seconds()*1e3)}
	for _, k := range ks {
		out = append(out, fmt.Sprintf("%s: %.1f, %.2f ms", k, float64(c.n[k])/float64(per), c.d[k].Seconds()*1e3/float64(per)))
	}
	return strings.Join(out, "; ")
}
