package remote_test

import (
	"context"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/filelock"
	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/remote"
	"github.com/miekg/pkcs11"
)

// held is how long a call must stay blocked behind the store lock for the
// test to count it as waiting: without the lock, the call ends in a few
// milliseconds.
const held = 2 * time.Second

// SoftHSM rewrites its token's file at every login, and a process that
// reads it meanwhile reads it torn (docs/DESIGN.md). hsmserve's processes
// for one token keep a store lock beside the socket: a connection's
// C_Initialize waits while a login holds it, and a SoftHSM login waits
// while an initialisation does. The test holds the lock as the other
// process would and sees each wait, then go on once it is let go.
func TestStoreLockKeepsLoginsFromInitialisations(t *testing.T) {
	srv := testhsm.ServeRemote(t, "storelock")
	sock, err := remote.ParseModulePath(srv.Token().Module)
	if err != nil {
		t.Fatal(err)
	}
	lockPath := remote.StoreLockPath(sock)

	// A login elsewhere holds the lock: a new connection's module does not
	// initialise (its handshake waits) until it is let go.
	login, err := filelock.Lock(context.Background(), lockPath, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	c, err := remote.NewClient(srv.Token().Module, nil)
	if err != nil {
		t.Fatal(err)
	}
	initialised := make(chan error, 1)
	go func() { initialised <- c.Initialize() }()
	select {
	case err := <-initialised:
		login.Close()
		t.Fatalf("a connection initialised the module while a login held the store lock (%v)", err)
	case <-time.After(held):
	}
	login.Close()
	select {
	case err := <-initialised:
		if err != nil {
			t.Fatalf("Initialize once the lock was let go: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Initialize still waits 20s after the store lock was let go")
	}
	t.Cleanup(func() { c.Finalize() })

	ids, err := c.GetSlotList(true)
	if err != nil || len(ids) != 1 {
		t.Fatalf("GetSlotList: %v, %v", ids, err)
	}
	sh, err := c.OpenSession(ids[0], pkcs11.CKF_SERIAL_SESSION)
	if err != nil {
		t.Fatal(err)
	}
	// An initialisation elsewhere holds it shared: the SoftHSM login
	// waits.
	initialising, err := filelock.LockShared(context.Background(), lockPath, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	loggedIn := make(chan error, 1)
	go func() { loggedIn <- c.Login(sh, pkcs11.CKU_USER, srv.Token().UserPIN) }()
	select {
	case err := <-loggedIn:
		initialising.Close()
		t.Fatalf("a SoftHSM login ran while an initialisation held the store lock (%v)", err)
	case <-time.After(held):
	}
	initialising.Close()
	select {
	case err := <-loggedIn:
		if err != nil {
			t.Fatalf("Login once the lock was let go: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Login still waits 20s after the store lock was let go")
	}
}
