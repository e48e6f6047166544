// Package tokenquirk holds the workarounds hagroup applies to particular
// tokens, each keyed to the tokens that need it (by the manufacturer and
// model C_GetTokenInfo reports), so that no other token pays for them.
package tokenquirk

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/hagroup/hagroup/internal/filelock"
)

// NeedsObjectLock reports whether a token keeps two threads of one process
// apart on its object store by itself. SoftHSM 2 does not (its fcntl locks
// work between processes only): a search or attribute read that refreshes
// an object while another thread writes it can leave the object without
// CKA_CLASS for good (CKR_ATTRIBUTE_VALUE_INVALID ever after), and the
// write then fails with CKR_GENERAL_ERROR.
func NeedsObjectLock(manufacturer, model string) bool { return isSoftHSM(manufacturer, model) }

// SerialCreations reports whether a token must be given the objects
// copied into it one at a time. SoftHSM 2.6.1 now and then answers
// CKR_GENERAL_ERROR (or CKR_TEMPLATE_INCONSISTENT) to objects created on
// one token from several threads at once, and gains nothing from them (it
// writes one file per object). Not measured on another make: NSS softokn
// (sqlite, its own locking) takes them at once.
func SerialCreations(manufacturer, model string) bool { return isSoftHSM(manufacturer, model) }

// GeneralErrorMeansOtherKey reports whether a token answers an unwrap
// under a key other than the one that wrapped the blob with
// CKR_GENERAL_ERROR, as SoftHSM 2.6.1 does (so that answer from it says
// the members' domain keys differ). NSS softokn answered
// CKR_WRAPPED_KEY_INVALID to every blob it could not unwrap in the pair
// trials (pkg/sync.ProvePair), which says so by its name.
func GeneralErrorMeansOtherKey(manufacturer, model string) bool {
	return isSoftHSM(manufacturer, model)
}

// LoginRewritesStore reports whether a token rewrites the file of its
// state at every C_Login, so that another process's C_Initialize or
// C_Login reading it meanwhile reads it torn: SoftHSM 2.6's token.object
// (the token missing from the slot list, or CKR_GENERAL_ERROR, or
// CKR_USER_PIN_NOT_INITIALIZED at the login). The processes serving one
// such token keep their logins apart from each other and from their
// initialisations (pkg/remote's store lock).
func LoginRewritesStore(manufacturer, model string) bool { return isSoftHSM(manufacturer, model) }

// RetriesGeneralError reports whether a creation or copy a token answers
// with CKR_GENERAL_ERROR is asked once more (after what it left is
// removed) before the answer counts, and a single-part call that leaves
// no state when no other member can serve it: SoftHSM 2.6.1 answers so
// now and then to a creation that overlaps another on the token, and to
// a signature while another process's files change under it, and takes
// it when asked again. Not on another make: there the answer is the
// token's, held back by the ambiguous-error rule (member.Charged).
// opencryptoki's soft token, asked again on the session that refused an
// HMAC length query so, crashed (SIGSEGV) in the C_SignFinal that came
// after (test/conformance's "ops: sign single then update").
func RetriesGeneralError(manufacturer, model string) bool { return isSoftHSM(manufacturer, model) }

// DoubtsProbe reports whether a health probe (C_GetTokenInfo) a token
// answers ambiguously (CKR_GENERAL_ERROR, CKR_FUNCTION_FAILED) is doubted
// until the next probe answers so too: SoftHSM 2.6.1 answers a
// C_GetTokenInfo so while another process's C_Login rewrites its token
// file. On another make such an answer to the probe fails the member at
// once, as a device error would.
func DoubtsProbe(manufacturer, model string) bool { return isSoftHSM(manufacturer, model) }

// LeavesHalfMadeObjects reports whether a token killed in mid-creation
// can keep the object at its defaults (no label, no CKA_ID, not a token
// object, no key material): SoftHSM 2.6.1 writes a new key's file with
// its defaults first and the caller's template in a second write
// (pkg/sync.ErrHalfMade). Only on such a make is an object without
// identity or key material taken for that and removed.
func LeavesHalfMadeObjects(manufacturer, model string) bool { return isSoftHSM(manufacturer, model) }

// ownChangeHidesOthers reports whether a process's own change of which
// objects a token holds (a creation or a destroy) hides from that process
// the objects other processes made since it last read the token's object
// list, until yet another process changes it. SoftHSM 2.6.1 (and its
// development head) keeps a count of such changes in a file and reads the
// list again when the count differs from the one it last saw; a change of
// its own adds one to the count on disk and takes the sum for seen, so
// another process's change counted before it is never read. Asking for
// the token's info reads the list again (its flags are read from a file
// that refreshes the list first): so a change on such a token is preceded
// by C_GetTokenInfo (Hold.RereadFirst), and the processes serving one
// token make the two one step under their store lock (pkg/remote).
func ownChangeHidesOthers(manufacturer, model string) bool { return isSoftHSM(manufacturer, model) }

// isSoftHSM reports whether a token is SoftHSM 2's, by the manufacturer
// and model C_GetTokenInfo reports (blank-padded).
func isSoftHSM(manufacturer, model string) bool {
	manufacturer = strings.TrimRight(manufacturer, " \x00")
	model = strings.TrimRight(model, " \x00")
	return manufacturer == "SoftHSM project" || strings.HasPrefix(model, "SoftHSM")
}

// Access is what a call does to the token's objects.
type Access int

// The kinds of access.
const (
	None   Access = iota // cryptographic and session calls: no lock
	Read                 // searches and attribute reads
	Write                // changes of an object's attributes
	Change               // creations, copies, deletions, key generation: which objects the token holds
)

// writes reports whether a holds the lock alone.
func (a Access) writes() bool { return a == Write || a == Change }

// ErrStuck is Acquire's error when the lock is held, against the access
// asked for, by a call that outlived its deadline: the token is hung, and
// waiting for it would only hide that.
var ErrStuck = errors.New("the token's object lock is held by a call past its deadline")

// ObjectLock keeps the calls of this process that write one token's
// objects apart from those that read them. Unlike sync.RWMutex, a wait for
// it ends with its ctx, so a caller queued behind a long key generation
// decides how long it waits without that wait being charged to the token;
// and once a holder's call has outlived its deadline (Hold.Stuck), waiters
// fail with ErrStuck rather than wait for a hung token. A waiting writer
// keeps new readers out, so writers are not starved. A nil *ObjectLock is
// a token without the quirk: Acquire returns at once.
type ObjectLock struct {
	rereads bool // a change must read the object list first (ownChangeHidesOthers)

	mu      sync.Mutex
	readers int
	writer  bool
	wanting int           // writers waiting
	stuck   int           // holders whose call outlived its deadline
	changed chan struct{} // closed and replaced when the lock changes
}

// Hold is one call's hold on an ObjectLock; nil for a call that takes no
// lock. Its methods may be called from any goroutine.
type Hold struct {
	l        *ObjectLock
	a        Access
	stuck    bool // guarded by l.mu
	released bool // guarded by l.mu
}

// Acquire takes the lock a call with access a needs, waiting at most until
// ctx ends (its error) or a conflicting holder is stuck (ErrStuck).
func (l *ObjectLock) Acquire(ctx context.Context, a Access) (*Hold, error) {
	if l == nil || a == None {
		return nil, nil
	}
	waiting := false
	for {
		l.mu.Lock()
		if l.grantLocked(a) {
			if waiting {
				l.wanting--
			}
			l.mu.Unlock()
			return &Hold{l: l, a: a}, nil
		}
		if l.stuck > 0 {
			l.giveUpLocked(waiting)
			l.mu.Unlock()
			return nil, ErrStuck
		}
		if a.writes() && !waiting {
			waiting = true
			l.wanting++
		}
		if l.changed == nil {
			l.changed = make(chan struct{})
		}
		ch := l.changed
		l.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			l.mu.Lock()
			l.giveUpLocked(waiting)
			l.mu.Unlock()
			return nil, ctx.Err()
		}
	}
}

// grantLocked takes the lock for a when it is free for a.
func (l *ObjectLock) grantLocked(a Access) bool {
	switch {
	case a.writes() && !l.writer && l.readers == 0:
		l.writer = true
		return true
	case a == Read && !l.writer && l.wanting == 0:
		l.readers++
		return true
	}
	return false
}

// giveUpLocked ends a wait that was not granted.
func (l *ObjectLock) giveUpLocked(waiting bool) {
	if waiting {
		l.wanting--
		l.signalLocked() // readers held back by this writer may go now
	}
}

// Writing reports whether a writer holds the lock (for tests and
// diagnostics).
func (l *ObjectLock) Writing() bool {
	if l == nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.writer
}

// Release lets the lock go. Releasing twice, or a nil Hold, is harmless.
func (h *Hold) Release() {
	if h == nil {
		return
	}
	l := h.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if h.released {
		return
	}
	h.released = true
	if h.stuck {
		l.stuck--
	}
	if h.a.writes() {
		l.writer = false
	} else {
		l.readers--
	}
	l.signalLocked()
}

// ChangeLockWait bounds a change's wait for a lock that the processes
// using one token take around "read the object list, change it" (hsmserve's
// store lock, pkg/slot's Spec.StoreLock), after which the change goes on
// with the read alone: only another process's long key generation (RSA of
// 4096 bits and more, seconds on SoftHSM) holds it that long, and a change
// that waited on would be charged with its caller's deadline.
const ChangeLockWait = time.Second

// LockChange takes that lock, the file at path (made with perm), for a
// change and returns its release: waiting ChangeLockWait at most, or until
// ctx ends, and then going on without it (the release a no-op), as also
// when the lock cannot be opened: the read before the change still
// narrows what another process's change can hide.
func LockChange(ctx context.Context, path string, perm os.FileMode) (release func()) {
	ctx, cancel := context.WithTimeout(ctx, ChangeLockWait)
	defer cancel()
	f, err := filelock.LockBriefly(ctx, path, perm)
	if err != nil {
		return func() {}
	}
	return func() { f.Close() }
}

// RereadFirst reports whether the holder's call must make the token read
// its object list again (C_GetTokenInfo) just before it: a change on a
// token whose own changes hide other processes' objects
// (ownChangeHidesOthers).
func (h *Hold) RereadFirst() bool { return h != nil && h.a == Change && h.l.rereads }

// Stuck records that the holder's call outlived its deadline: until it
// releases, conflicting callers fail with ErrStuck. After Release it is
// harmless.
func (h *Hold) Stuck() {
	if h == nil {
		return
	}
	l := h.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if h.released || h.stuck {
		return
	}
	h.stuck = true
	l.stuck++
	l.signalLocked()
}

func (l *ObjectLock) signalLocked() {
	if l.changed != nil {
		close(l.changed)
		l.changed = nil
	}
}

// Locks holds the object locks of the tokens of one module, by slot ID.
// The zero value is ready. Safe for concurrent use.
type Locks struct {
	m sync.Map // uint → *ObjectLock
}

// For returns the lock of the token in slot id, or nil when the token,
// described by its manufacturer and model, does not need one.
func (ls *Locks) For(id uint, manufacturer, model string) *ObjectLock {
	if !NeedsObjectLock(manufacturer, model) {
		return nil
	}
	l, _ := ls.m.LoadOrStore(id, &ObjectLock{rereads: ownChangeHidesOthers(manufacturer, model)})
	return l.(*ObjectLock)
}

// NoTokenDataObjects reports whether a token refuses every CKO_DATA token
// object, private or public, as NSS softokn 3.87 does
// (CKR_ATTRIBUTE_VALUE_INVALID): the group's state is carried there by
// private generic secret keys instead (pkg/sync, "state forms"). NSS also
// holds one key per class and CKA_ID (a second key made with the same
// CKA_ID replaces the first and gets its handle), and marks every token
// secret key sensitive whatever the template asked.
func NoTokenDataObjects(manufacturer, model string) bool { return isNSS(manufacturer, model) }

// HostMemoryIsRequestError reports whether a token answers
// CKR_HOST_MEMORY to a request it cannot serve, as NSS softokn 3.87 does
// when it cannot make the context an operation's mechanism parameter asks
// (C_EncryptInit of CKM_AES_CBC_PAD without an IV, an HMAC key of a
// length it refuses …): there the answer is the request's, and the token
// serves the next call. Elsewhere it is a health answer (the host's
// memory, or a network HSM client's exhausted buffers: pkg/slot).
func HostMemoryIsRequestError(manufacturer, model string) bool { return isNSS(manufacturer, model) }

// TruncatesToShortBuffer reports whether a token answers a single-part
// call given an output buffer shorter than its output with the output cut
// to the buffer and CKR_OK, rather than CKR_BUFFER_TOO_SMALL: NSS softokn
// 3.87 signs a CKM_SHA256_HMAC into 4 bytes as the MAC's first 4. So the
// one-shot's first buffer for such a token is never the session's last
// output length (pkg/slot): an HMAC after an AES block would be cut.
func TruncatesToShortBuffer(manufacturer, model string) bool { return isNSS(manufacturer, model) }

// DefaultExtractable reports a token's CKA_EXTRACTABLE for a private or
// secret key whose template gives none: NSS softokn 3.87 and
// opencryptoki 3.8's soft token make it extractable (test/conformance's
// key sweeps on the bare tokens); SoftHSM 2.6 does not, and the safe side
// (false) holds for every make not measured.
func DefaultExtractable(manufacturer, model string) bool {
	return isNSS(manufacturer, model) || isOCKSoftTok(manufacturer, model)
}

// CarriesKeysByPairOnly reports whether a token offers none of the AES
// key wraps a domain key is used with (CKM_AES_KEY_WRAP*), so that keys
// reach it, and leave it, only by the ways its pairs proved, under
// transit keys agreed for each copy: opencryptoki 3.8's soft token (it
// wraps with AES ECB/CBC/CBC-PAD). A member that lacks the mechanism for
// another reason (a p11-kit 0.24 RPC between it and its token) holds
// nothing wrapped, as before.
func CarriesKeysByPairOnly(manufacturer, model string) bool { return isOCKSoftTok(manufacturer, model) }

// isOCKSoftTok reports whether a token is opencryptoki's soft token.
func isOCKSoftTok(manufacturer, model string) bool {
	manufacturer = strings.TrimRight(manufacturer, " \x00")
	model = strings.TrimRight(model, " \x00")
	return manufacturer == "IBM Corp." && model == "IBM SoftTok"
}

// isNSS reports whether a token is NSS softokn's, by the manufacturer
// and model C_GetTokenInfo reports (blank-padded).
func isNSS(manufacturer, model string) bool {
	manufacturer = strings.TrimRight(manufacturer, " \x00")
	model = strings.TrimRight(model, " \x00")
	return manufacturer == "Mozilla Foundation" && strings.HasPrefix(model, "NSS")
}

// ReusesLiveHandles reports whether a token may give a new object the
// handle of a live one: tpm2-pkcs11 1.9 numbers a new object one past the
// count of the token's objects, so once an object other than the last
// made is destroyed, the next one made gets the handle of a live object,
// cannot be reached by its own handle, and a destroy by that handle
// removes the other object. The group keeps no state on such a token
// (pkg/sync/state.Carries): its state is rewritten and removed by handle.
// Measured on swtpm through tpm2-pkcs11 (manufacturer "IBM", model
// "SW   TPM", the TPM's own strings); a hardware TPM shows its vendor's
// and is added once measured.
func ReusesLiveHandles(manufacturer, model string) bool {
	manufacturer = strings.TrimRight(manufacturer, " \x00")
	model = strings.TrimRight(model, " \x00")
	return manufacturer == "IBM" && model == "SW   TPM"
}
