package agent

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
)

type progressKey struct{}

// WithProgress returns a context that carries fn to the Backend: a
// Backend reports the progress of the work it does under ctx through
// ProgressFrom(ctx).
func WithProgress(ctx context.Context, fn func(Progress)) context.Context {
	return context.WithValue(ctx, progressKey{}, fn)
}

// ProgressFrom returns the progress callback of ctx, nil when the caller
// asked for none.
func ProgressFrom(ctx context.Context) func(Progress) {
	fn, _ := ctx.Value(progressKey{}).(func(Progress))
	return fn
}

// serveWithProgress runs work with a progress callback in its context and
// answers with JSON lines: the latest progress whenever the writer is
// free (a slow reader never holds the work up: it misses intermediate
// lines, not the last), then the result or the error.
func (s *Server) serveWithProgress(w http.ResponseWriter, r *http.Request, work func(ctx context.Context) (any, error)) {
	var mu sync.Mutex
	var latest *Progress
	wake := make(chan struct{}, 1)
	ctx := WithProgress(r.Context(), func(p Progress) {
		mu.Lock()
		latest = &p
		mu.Unlock()
		select {
		case wake <- struct{}{}:
		default:
		}
	})
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	enc := json.NewEncoder(w)
	send := func(l ProgressLine) {
		enc.Encode(l)
		if fl != nil {
			fl.Flush()
		}
	}
	var sent *Progress
	sendLatest := func() {
		mu.Lock()
		p := latest
		mu.Unlock()
		if p != sent { // a wake-up for a count already sent is none
			sent = p
			send(ProgressLine{Progress: p})
		}
	}
	type outcome struct {
		v   any
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		v, err := work(ctx)
		done <- outcome{v, err}
	}()
	for {
		select {
		case <-wake:
			sendLatest()
		case o := <-done:
			// The work reported its last count before it returned:
			// that count goes out before the result.
			select {
			case <-wake:
				sendLatest()
			default:
			}
			if o.err != nil {
				e := s.errorOf(r, o.err)
				send(ProgressLine{Error: e.Message, Code: e.Code})
				return
			}
			b, err := json.Marshal(o.v)
			if err != nil {
				send(ProgressLine{Error: err.Error(), Code: CodeInternal})
				return
			}
			send(ProgressLine{Result: b})
			return
		}
	}
}
