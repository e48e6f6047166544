package remote_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/filelock"
	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/remote"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// SoftHSM 2.6.1 counts the changes of a token's object list in a file and
// reads the list again only when the count differs from the one it last
// saw; a process's own change adds one to the count on disk and takes the
// sum for seen, so an object another process made just before stays
// hidden from it until yet another process changes the list
// (internal/tokenquirk). hsmserve serves each connection from a process
// of its own: one connection's creation or key generation must hide
// nothing that another made before it. (A destroy, a copy, an unwrap or a
// derivation reads an object first, and with it the list.)
func TestOwnChangeHidesNoOtherConnectionsObject(t *testing.T) {
	srv := testhsm.ServeRemote(t, "ownchange")
	a := open(t, srv.Token(), 10*time.Second)
	b := open(t, srv.Token(), 10*time.Second)
	for _, change := range []string{"creation", "key generation"} {
		seen(t, a, "none", 0) // a has read the list since its last change
		theirs := "b-before-a's-" + change
		makeData(t, b, theirs)
		switch change {
		case "creation":
			makeData(t, a, "a-made")
		case "key generation":
			genEC(t, a, "a-generated")
		}
		seen(t, a, theirs, 1)
	}
}

// makeData makes a private data token object labelled label on s.
func makeData(t *testing.T, s *slot.Slot, label string) pkcs11.ObjectHandle {
	t.Helper()
	h, err := s.CreateObject(ctxT(t), dataTemplate(label))
	if err != nil {
		t.Fatalf("%s: create %q: %v", s.Name(), label, err)
	}
	return h
}

// dataTemplate is a private data token object labelled label.
func dataTemplate(label string) []*pkcs11.Attribute {
	return []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_DATA),
		attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_APPLICATION, "ownchange"),
		attr(pkcs11.CKA_LABEL, label), attr(pkcs11.CKA_VALUE, []byte(label))}
}

// seen fails t unless a search on s finds want objects labelled label.
func seen(t *testing.T, s *slot.Slot, label string, want int) {
	t.Helper()
	hs, err := s.FindObjects(ctxT(t), []*pkcs11.Attribute{attr(pkcs11.CKA_LABEL, label)})
	if err != nil {
		t.Fatalf("%s: find %q: %v", s.Name(), label, err)
	}
	if len(hs) != want {
		t.Errorf("%s: a search for %q finds %d objects, want %d", s.Name(), label, len(hs), want)
	}
}

// The same under load: connections make objects at once, and each, right
// after its own creation returns, searches for every object whose creation
// had returned before its own began. The processes serving one token make
// "read the list, change it" one step under their store lock
// (remote.Server.StoreLock), so no other connection's change can fall
// between the two and be hidden.
func TestConcurrentCreationsHideNothing(t *testing.T) {
	const conns, each = 3, 40
	srv := testhsm.ServeRemote(t, "ownchangeload")
	var (
		mu       sync.Mutex
		returned []string // labels whose creation has returned
		wg       sync.WaitGroup
	)
	for c := range conns {
		s := open(t, srv.Token(), 10*time.Second)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				mu.Lock()
				before := slices.Clone(returned)
				mu.Unlock()
				label := fmt.Sprintf("c%d-%d", c, i)
				if _, err := s.CreateObject(ctxT(t), dataTemplate(label)); err != nil {
					t.Errorf("connection %d: create %q: %v", c, label, err)
					return
				}
				hs, err := s.FindObjects(ctxT(t), []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_DATA),
					attr(pkcs11.CKA_APPLICATION, "ownchange")})
				if err != nil {
					t.Errorf("connection %d: search: %v", c, err)
					return
				}
				// Its own object, and every one returned before it began.
				if len(hs) < len(before)+1 {
					t.Errorf("connection %d: after its creation of %q a search finds %d objects; %d had been made before it began",
						c, label, len(hs), len(before))
				}
				mu.Lock()
				returned = append(returned, label)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
}

// A change waits for the store lock a moment at most: held by another
// connection's long key generation (or here by the test, as that process
// would hold it), a creation goes on without it after about a second
// rather than wait out its client's deadline.
func TestChangeDoesNotWaitOutTheStoreLock(t *testing.T) {
	srv := testhsm.ServeRemote(t, "changewait")
	sock, err := remote.ParseModulePath(srv.Token().Module)
	if err != nil {
		t.Fatal(err)
	}
	a := open(t, srv.Token(), 30*time.Second)
	seen(t, a, "none", 0)
	held, err := filelock.Lock(context.Background(), remote.StoreLockPath(sock), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	start := time.Now()
	makeData(t, a, "made while the lock was held")
	if took := time.Since(start); took < 500*time.Millisecond {
		t.Errorf("the creation took %v with the store lock held elsewhere: it did not wait for the lock", took)
	}
	seen(t, a, "made while the lock was held", 1)
}
