package conformance

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// callDeadline bounds one call: a call that a member's death holds up
// waits at most command_timeout (10 s) per member it tries.
const callDeadline = 60 * time.Second

// driver is one p11drive process on a world's module.
type driver struct {
	cmd    *exec.Cmd
	in     io.WriteCloser
	lines  chan string
	ctx    context.Context
	cancel context.CancelFunc
	stderr syncBuffer
}

// syncBuffer is the driver's stderr, written by exec's copier while a
// failing call reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func startDriver(w *world) (*driver, error) {
	if w.reset != nil {
		w.reset()
	}
	ctx, cancel := context.WithCancel(context.Background())
	d := &driver{cancel: cancel, lines: make(chan string)}
	d.ctx = ctx
	d.cmd = exec.CommandContext(ctx, driverBinary(w.t), w.module, w.pinFile)
	if w.wrap != nil {
		d.cmd = w.wrap(ctx, driverBinary(w.t), w.module, w.pinFile)
	}
	d.cmd.Env = w.env
	d.cmd.Dir = w.dir
	d.cmd.Stderr = &d.stderr
	var err error
	if d.in, err = d.cmd.StdinPipe(); err != nil {
		cancel()
		return nil, err
	}
	out, err := d.cmd.StdoutPipe()
	if err != nil {
		cancel()
		return nil, err
	}
	if err := d.cmd.Start(); err != nil {
		cancel()
		return nil, err
	}
	go func() {
		defer close(d.lines)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<16), 1<<24)
		for sc.Scan() {
			select {
			case d.lines <- sc.Text():
			case <-ctx.Done():
				return
			}
		}
	}()
	return d, nil
}

// call sends one call line and returns the answer line.
func (d *driver) call(line string) (string, error) {
	if _, err := io.WriteString(d.in, line+"\n"); err != nil {
		return "", fmt.Errorf("p11drive: %v (stderr: %s)", err, d.stderr.String())
	}
	select {
	case l, ok := <-d.lines:
		if !ok {
			return "", fmt.Errorf("p11drive exited (stderr: %s)", d.stderr.String())
		}
		return l, nil
	case <-time.After(callDeadline):
		return "", fmt.Errorf("no answer within %v", callDeadline)
	}
}

// close ends the driver and waits for it.
func (d *driver) close() {
	d.in.Close()
	done := make(chan struct{})
	go func() { d.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
	}
	// Cancel kills a driver still running and ends the reader.
	d.cancel()
	<-done
}
