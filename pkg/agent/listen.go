package agent

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/hagroup/hagroup/internal/filelock"
)

// ErrSocketInUse is returned by Listen when another agent holds the socket.
var ErrSocketInUse = errors.New("another haagent is running on this socket")

// ListenOptions say how the socket file is made.
type ListenOptions struct {
	// Mode is the socket file's mode (0660 when zero).
	Mode os.FileMode
	// GID, when >= 0, becomes the socket file's group (allowed_group).
	GID int
}

// Listen creates the agent's Unix socket at path. It never replaces a live
// socket: an agent holding path+".lock", or answering on path, makes it
// fail with ErrSocketInUse. A stale socket (nobody answers) is removed. A
// file at path that is not a socket is an error and is left alone. The
// returned listener removes the socket and releases the lock on Close.
func Listen(path string, opt ListenOptions) (net.Listener, error) {
	if opt.Mode == 0 {
		opt.Mode = 0o660
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("socket directory: %w", err)
	}
	lock, err := filelock.TryLock(path+".lock", 0o600)
	if err != nil {
		if errors.Is(err, filelock.ErrBusy) {
			return nil, fmt.Errorf("%s: %w (it holds %s.lock)", path, ErrSocketInUse, path)
		}
		return nil, fmt.Errorf("socket lock: %w", err)
	}
	fail := func(err error) (net.Listener, error) {
		lock.Close()
		return nil, err
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != os.ModeSocket {
			return fail(fmt.Errorf("%s exists and is not a socket; not touching it", path))
		}
		c, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			c.Close()
			return fail(fmt.Errorf("%s: %w (it answers)", path, ErrSocketInUse))
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return fail(fmt.Errorf("probing existing socket %s: %w", path, err))
		}
		if err := os.Remove(path); err != nil {
			return fail(fmt.Errorf("removing stale socket %s: %w", path, err))
		}
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return fail(fmt.Errorf("listening on %s: %w", path, err))
	}
	if err := os.Chmod(path, opt.Mode); err != nil {
		ln.Close()
		return fail(fmt.Errorf("chmod %s: %w", path, err))
	}
	if opt.GID >= 0 {
		if err := os.Chown(path, -1, opt.GID); err != nil {
			ln.Close()
			return fail(fmt.Errorf("chown %s to gid %d: %w", path, opt.GID, err))
		}
	}
	return &lockedListener{Listener: ln, lock: lock}, nil
}

type lockedListener struct {
	net.Listener
	lock *os.File
}

func (l *lockedListener) Close() error {
	err := l.Listener.Close() // unlinks the socket
	l.lock.Close()
	return err
}
