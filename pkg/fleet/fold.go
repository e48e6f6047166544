package fleet

import (
	"fmt"
	"sync"
	"time"
)

// FoldWindow is how long repeats of one event are folded into one line.
const FoldWindow = 60 * time.Second

// maxFolds bounds the keys a Folder tracks; past it events are written
// unfolded (never dropped).
const maxFolds = 1024

// Folder writes the first occurrence of an event at once and folds its
// repeats within Window into one summary line, written when the window
// ends (Flush) or when the same event comes after it. The key says what
// counts as the same event. Safe for concurrent use; Write is called with
// the Folder's lock held, so lines come out in order.
type Folder[E any] struct {
	Window time.Duration
	Now    func() time.Time
	// Write writes one line: repeats is 0 for a first occurrence, else
	// the count of repeats folded into this summary (e is the last one).
	Write func(e E, repeats int, window time.Duration)

	mu    sync.Mutex
	folds map[string]*fold[E]
}

type fold[E any] struct {
	start   time.Time
	repeats int
	last    E
}

// NewFolder returns a folder over window writing with write.
func NewFolder[E any](window time.Duration, write func(e E, repeats int, window time.Duration)) *Folder[E] {
	return &Folder[E]{Window: window, Now: time.Now, Write: write, folds: map[string]*fold[E]{}}
}

// Add writes e or folds it into the current window of key.
func (f *Folder[E]) Add(key string, e E) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.Now()
	if fo, ok := f.folds[key]; ok {
		if now.Sub(fo.start) < f.Window {
			fo.repeats++
			fo.last = e
			return
		}
		f.endLocked(key, fo)
	}
	f.Write(e, 0, f.Window)
	if len(f.folds) < maxFolds {
		f.folds[key] = &fold[E]{start: now}
	}
}

// Flush writes the summaries of the windows that have ended.
func (f *Folder[E]) Flush() {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.Now()
	for k, fo := range f.folds {
		if now.Sub(fo.start) >= f.Window {
			f.endLocked(k, fo)
		}
	}
}

// FlushAll writes every pending summary now (at close).
func (f *Folder[E]) FlushAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for k, fo := range f.folds {
		f.endLocked(k, fo)
	}
}

func (f *Folder[E]) endLocked(key string, fo *fold[E]) {
	delete(f.folds, key)
	if fo.repeats > 0 {
		f.Write(fo.last, fo.repeats, f.Now().Sub(fo.start).Round(time.Second))
	}
}

// FoldedDetail is the detail of a summary line: the last detail and how
// many repeats it stands for.
func FoldedDetail(detail string, repeats int, window time.Duration) string {
	s := fmt.Sprintf("×%d more in %v", repeats, window)
	if detail == "" {
		return s
	}
	return s + " (last: " + detail + ")"
}
