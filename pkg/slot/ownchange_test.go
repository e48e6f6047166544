package slot_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/filelock"
	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/internal/tokenquirk"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// A process that loads SoftHSM itself and changes a token's object list
// must not lose sight of what another process made just before
// (internal/tokenquirk: SoftHSM 2.6.1 takes its own change's count of
// changes for having read the list): the slot has the token read its list
// again before each creation or key generation. The other process here is
// hsmserve serving the same token store, as an agent of the same host
// would be.
func TestOwnChangeHidesNoOtherProcessesObject(t *testing.T) {
	tok := testhsm.Take(t, 1)[0]
	here := open(t, specOf(tok))
	other := open(t, specOf(testhsm.ServeTaken(t, tok).Token()))
	for _, change := range []string{"creation", "key generation"} {
		expectFound(t, here, "none", 0) // the list is read after the last change
		theirs := "made elsewhere before a " + change
		if _, err := other.CreateObject(ctxT(t), dataObject(theirs)); err != nil {
			t.Fatalf("create %q in the other process: %v", theirs, err)
		}
		var err error
		switch change {
		case "creation":
			_, err = here.CreateObject(ctxT(t), dataObject("made here"))
		case "key generation":
			pub, priv := ecKeyTemplates("generated here", true)
			_, _, err = here.GenerateKeyPair(ctxT(t), pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil), pub, priv)
		}
		if err != nil {
			t.Fatalf("%s here: %v", change, err)
		}
		expectFound(t, here, theirs, 1)
	}
}

// dataObject is a private data token object labelled label.
func dataObject(label string) []*pkcs11.Attribute {
	return []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_DATA),
		pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true), pkcs11.NewAttribute(pkcs11.CKA_PRIVATE, true),
		pkcs11.NewAttribute(pkcs11.CKA_LABEL, label), pkcs11.NewAttribute(pkcs11.CKA_VALUE, []byte(label))}
}

// expectFound fails t unless a search on s finds want objects labelled
// label.
func expectFound(t *testing.T, s *slot.Slot, label string, want int) {
	t.Helper()
	hs, err := s.FindObjects(ctxT(t), []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_LABEL, label)})
	if err != nil {
		t.Fatalf("find %q: %v", label, err)
	}
	if len(hs) != want {
		t.Errorf("a search for %q finds %d objects, want %d", label, len(hs), want)
	}
}

// Processes of one host that load SoftHSM themselves take a store lock
// around "read the list, change it" (Spec.StoreLock), so that no change of
// another falls between the two: a creation waits while another process
// holds it (here the test, as that process would), a moment at most
// (tokenquirk.ChangeLockWait), and then goes on with the read alone.
func TestChangeTakesTheStoreLock(t *testing.T) {
	tok := testhsm.Take(t, 1)[0]
	spec := specOf(tok)
	spec.StoreLock = filepath.Join(t.TempDir(), "member.store.lock")
	here := open(t, spec)
	expectFound(t, here, "none", 0)
	held, err := filelock.Lock(ctxT(t), spec.StoreLock, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	done := make(chan error, 1)
	go func() {
		_, err := here.CreateObject(ctxT(t), dataObject("made while the lock was held"))
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("the creation returned (%v) at once while another process held the store lock", err)
	case <-time.After(tokenquirk.ChangeLockWait / 3):
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the creation after its wait for the store lock: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the creation still waits for the store lock after 20 s")
	}
	expectFound(t, here, "made while the lock was held", 1)
}
