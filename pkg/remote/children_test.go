package remote_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/remote"
	"github.com/miekg/pkcs11"
)

// A Server with Child serves each connection in a process of its own, at
// most MaxConns at once (one more is refused and closed, and served once
// a connection ends); when its context ends it stops the children, whose
// clients then fail with CKR_DEVICE_ERROR.
func TestServeChildren(t *testing.T) {
	bin := testhsm.HSMServe(t)
	var mu sync.Mutex
	var refused []string
	srv := &remote.Server{
		Module:   testhsm.SoftHSMModule,
		MaxConns: 2,
		Refused:  func(err error) { mu.Lock(); refused = append(refused, err.Error()); mu.Unlock() },
		Child: func() *exec.Cmd {
			return exec.Command(bin, "--serve-fd", "--module", testhsm.SoftHSMModule)
		},
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "c.sock")
	l, err := remote.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, l) }()

	dial := func() (*remote.Client, error) {
		c, err := remote.NewClient(remote.ModulePath(sock), nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Initialize(); err != nil {
			return nil, err
		}
		if _, err := c.GetSlotList(true); err != nil {
			c.Finalize()
			return nil, err
		}
		return c, nil
	}
	c1, err := dial()
	if err != nil {
		t.Fatalf("first client: %v", err)
	}
	c2, err := dial()
	if err != nil {
		t.Fatalf("second client: %v", err)
	}
	defer c2.Finalize()
	if _, err := dial(); !errors.Is(err, pkcs11.Error(pkcs11.CKR_DEVICE_ERROR)) {
		t.Errorf("a third client with MaxConns 2: %v, want CKR_DEVICE_ERROR", err)
	}
	mu.Lock()
	if len(refused) != 1 || !strings.Contains(refused[0], "2 connections are served already") {
		t.Errorf("Refused saw %q, want the refusal of the third connection", refused)
	}
	mu.Unlock()

	// Once the first client leaves and its process is reaped, a new one
	// is served.
	c1.Finalize()
	deadline := time.Now().Add(15 * time.Second)
	for {
		c3, err := dial()
		if err == nil {
			c3.Finalize()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no client served within 15s of the first one leaving: %v", err)
		}
		time.Sleep(20 * time.Millisecond) // poll: the reaping is the server's
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("Serve did not return within 15s of its context ending")
	}
	if _, err := c2.GetSlotList(true); !errors.Is(err, pkcs11.Error(pkcs11.CKR_DEVICE_ERROR)) {
		t.Errorf("a client of a stopped server: %v, want CKR_DEVICE_ERROR", err)
	}
}

// A parent killed outright (SIGKILL to it alone, not its group) takes its
// connections' processes along: their clients fail with CKR_DEVICE_ERROR
// and no process serves the token any more.
func TestKilledParentTakesChildren(t *testing.T) {
	bin := testhsm.HSMServe(t)
	sock := filepath.Join(t.TempDir(), "k.sock")
	cmd := exec.Command(bin, "--module", testhsm.SoftHSMModule, "--socket", sock)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	defer func() { cmd.Process.Kill(); <-exited }()

	var c *remote.Client
	deadline := time.Now().Add(15 * time.Second)
	for {
		var err error
		if c, err = remote.NewClient(remote.ModulePath(sock), nil); err != nil {
			t.Fatal(err)
		}
		if err = c.Initialize(); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("hsmserve did not answer within 15s: %v", err)
		}
		time.Sleep(20 * time.Millisecond) // poll: hsmserve is starting
	}
	defer c.Finalize()
	if _, err := c.GetSlotList(true); err != nil {
		t.Fatal(err)
	}
	// The client's process, and the one started ahead for the next
	// connection.
	var kids []int
	deadline = time.Now().Add(15 * time.Second)
	for kids = childrenOf(t, cmd.Process.Pid); len(kids) < 2; kids = childrenOf(t, cmd.Process.Pid) {
		if time.Now().After(deadline) {
			t.Fatalf("hsmserve has %d children with one client 15s on, want 2 (the client's, the next one's): %v", len(kids), kids)
		}
		time.Sleep(20 * time.Millisecond) // poll: hsmserve starts the next one after handing this one
	}
	if len(kids) != 2 {
		t.Fatalf("hsmserve has %d children with one client, want 2 (the client's, the next one's): %v", len(kids), kids)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-exited
	deadline = time.Now().Add(15 * time.Second)
	for _, kid := range kids {
		for syscall.Kill(kid, 0) == nil && !zombie(kid) {
			if time.Now().After(deadline) {
				t.Fatalf("connection process %d still runs 15s after its parent was killed", kid)
			}
			time.Sleep(20 * time.Millisecond) // poll: the kernel delivers the parent-death signal
		}
	}
	if _, err := c.GetSlotList(true); !errors.Is(err, pkcs11.Error(pkcs11.CKR_DEVICE_ERROR)) {
		t.Errorf("a client after its server was killed: %v, want CKR_DEVICE_ERROR", err)
	}
}

// childrenOf lists the processes whose parent is pid.
func childrenOf(t *testing.T, pid int) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if f := statFields(n); len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, n)
		}
	}
	return out
}

// statFields returns /proc/pid/stat after the command name: state,
// ppid, …; nil when the process is gone.
func statFields(pid int) []string {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return nil
	}
	return strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
}

// zombie reports whether pid has exited and awaits its reaper.
func zombie(pid int) bool {
	f := statFields(pid)
	return len(f) > 0 && f[0] == "Z"
}
