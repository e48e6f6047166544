package soak

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/group/signer"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/test/soak/history"
	"github.com/miekg/pkcs11"
)

// goLoad drives the group through the Go API (pkg/group) in the test
// process: the same operations haload does through the C module.
type goLoad struct {
	g      *group.Group
	pin    secret.PIN
	prefix string

	keysMu sync.RWMutex // the keys, found again after a full outage
	signer *signer.Signer
	pub    *ecdsa.PublicKey
	hPub   group.ObjectHandle
	hAES   group.ObjectHandle
	relogs int
	// keypairs: create and destroy EC key pairs (private halves replicated
	// under the domain key), otherwise data objects.
	keypairs bool
	// hist records every object life-cycle call and probe, for the
	// history checker; host names this process's host in it.
	hist *history.Log
	host string
	// lock serialises object creation and destruction with haload (see
	// lifecycle).
	lock   *os.File
	lifeMu sync.Mutex

	mu        sync.Mutex
	ops       map[string]*opStat
	failures  []string // "time op: error", the first 50
	lastFails []string // the last 10, for the failure report
	bad       []string
	created   []string
	destroyed []string
	createErr map[string]string
	destErr   map[string]string
	maxLat    time.Duration
	maxLatAt  time.Time
	stop      atomic.Bool
	lostLogin atomic.Bool
	reloginMu sync.Mutex
}

type opStat struct{ ok, failed int }

// newGoLoad finds the keys on the group.
func newGoLoad(ctx context.Context, g *group.Group, pin secret.PIN, prefix string, keypairs bool, lockFile string, hist *history.Log, host string) (*goLoad, error) {
	if hist == nil {
		hist = &history.Log{}
	}
	l := &goLoad{g: g, pin: pin, prefix: prefix, keypairs: keypairs, hist: hist, host: host,
		ops: map[string]*opStat{}, createErr: map[string]string{}, destErr: map[string]string{}}
	var err error
	if lockFile != "" {
		if l.lock, err = os.OpenFile(lockFile, os.O_RDWR|os.O_CREATE, 0o600); err != nil {
			return nil, err
		}
	}
	if err := l.findKeys(ctx); err != nil {
		return nil, err
	}
	return l, nil
}

// findKeys (re)finds the signing and AES keys.
func (l *goLoad) findKeys(ctx context.Context) error {
	signer, err := signer.New(ctx, l.g, signer.KeySelector{Label: signLabel})
	if err != nil {
		return fmt.Errorf("signer: %w", err)
	}
	pub, ok := signer.Public().(*ecdsa.PublicKey)
	if !ok {
		return fmt.Errorf("signer's public key is %T", signer.Public())
	}
	find := func(class uint, label string) (group.ObjectHandle, error) {
		hs, err := l.g.Find(ctx, []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_CLASS, class), pkcs11.NewAttribute(pkcs11.CKA_LABEL, label)})
		if err != nil {
			return 0, err
		}
		if len(hs) != 1 {
			return 0, fmt.Errorf("%d objects labelled %s, want 1", len(hs), label)
		}
		return hs[0], nil
	}
	hPub, err := find(pkcs11.CKO_PUBLIC_KEY, signLabel)
	if err != nil {
		return err
	}
	hAES, err := find(pkcs11.CKO_SECRET_KEY, aesLabel)
	if err != nil {
		return err
	}
	l.keysMu.Lock()
	l.signer, l.pub, l.hPub, l.hAES = signer, pub, hPub, hAES
	l.keysMu.Unlock()
	return nil
}

// keys returns the current key handles.
func (l *goLoad) keys() (*signer.Signer, *ecdsa.PublicKey, group.ObjectHandle, group.ObjectHandle) {
	l.keysMu.RLock()
	defer l.keysMu.RUnlock()
	return l.signer, l.pub, l.hPub, l.hAES
}

// lost reports whether err says the login or the handles are gone (after a
// full outage under activeBasic every session and the login are lost).
func lost(err error) bool {
	switch group.CodeOf(err) {
	case pkcs11.CKR_USER_NOT_LOGGED_IN, pkcs11.CKR_OBJECT_HANDLE_INVALID, pkcs11.CKR_KEY_HANDLE_INVALID,
		pkcs11.CKR_SESSION_HANDLE_INVALID, pkcs11.CKR_SESSION_CLOSED:
		return err != nil
	}
	return false
}

// relogin logs in again and finds the keys again, as a well-behaved
// application does once the group is back.
func (l *goLoad) relogin(ctx context.Context) {
	l.reloginMu.Lock()
	defer l.reloginMu.Unlock()
	err := l.g.Login(ctx, pkcs11.CKU_USER, l.pin.Clone())
	if err != nil && group.CodeOf(err) != pkcs11.CKR_USER_ALREADY_LOGGED_IN {
		time.Sleep(50 * time.Millisecond) // the group is still down: a later operation tries again
		return
	}
	if err := l.findKeys(ctx); err == nil {
		l.mu.Lock()
		l.relogs++
		l.mu.Unlock()
	}
}

// done records one single-part operation.
func (l *goLoad) done(op string, start time.Time, err error) {
	lat := time.Since(start)
	if lost(err) {
		l.lostLogin.Store(true)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.ops[op]
	if s == nil {
		s = &opStat{}
		l.ops[op] = s
	}
	if err != nil {
		s.failed++
		f := fmt.Sprintf("%s %s: %v", start.Format("15:04:05.000"), op, err)
		if len(l.failures) < 50 {
			l.failures = append(l.failures, f)
		}
		if len(l.lastFails) >= 10 {
			l.lastFails = l.lastFails[1:]
		}
		l.lastFails = append(l.lastFails, f)
	} else {
		s.ok++
	}
	if lat > l.maxLat {
		l.maxLat, l.maxLatAt = lat, start
	}
}

func (l *goLoad) wrong(what string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.bad = append(l.bad, what)
}

// run is one worker until stop; seed makes its choices replayable.
func (l *goLoad) run(ctx context.Context, worker int, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, uint64(worker)))
	var lastDigest, lastSig []byte
	var mine []string
	made := 0
	for !l.stop.Load() && ctx.Err() == nil {
		if l.lostLogin.Swap(false) {
			l.relogin(ctx)
		}
		signer, pub, hPub, hAES := l.keys()
		switch p := rng.IntN(1000); {
		case p < 400: // sign, checked here with crypto/ecdsa
			d := sha256.Sum256(binary.BigEndian.AppendUint64([]byte(l.prefix), rng.Uint64()))
			start := time.Now()
			sig, err := signer.SignContext(ctx, d[:], crypto.SHA256)
			l.done("sign", start, err)
			if err == nil {
				if !ecdsa.VerifyASN1(pub, d[:], sig) {
					l.wrong("a signature from the group does not verify")
				}
				lastDigest, lastSig = d[:], sig
			}
		case p < 550: // verify through the group: good and corrupted
			if lastSig == nil {
				continue
			}
			r, s, ok := derToRaw(lastSig)
			if !ok {
				l.wrong("signature is not DER")
				continue
			}
			raw := append(r, s...)
			corrupt := rng.IntN(4) == 0
			if corrupt {
				raw = append([]byte(nil), raw...)
				raw[5] ^= 0x20
			}
			start := time.Now()
			err := l.g.Verify(ctx, pkcs11.NewMechanism(pkcs11.CKM_ECDSA, nil), hPub, lastDigest, raw)
			switch {
			case corrupt && group.CodeOf(err) == pkcs11.CKR_SIGNATURE_INVALID:
				l.done("verify", start, nil)
			case corrupt && err == nil:
				l.done("verify", start, nil)
				l.wrong("the group accepted a corrupted signature")
			case !corrupt && group.CodeOf(err) == pkcs11.CKR_SIGNATURE_INVALID:
				l.done("verify", start, nil)
				l.wrong("the group refused a good signature")
			default:
				l.done("verify", start, err)
			}
		case p < 750: // AES-ECB round trip (p11-kit 0.24's RPC carries no IV)
			plain := make([]byte, 32)
			for i := range plain {
				plain[i] = byte(rng.Uint32())
			}
			mech := pkcs11.NewMechanism(pkcs11.CKM_AES_ECB, nil)
			start := time.Now()
			ct, err := l.g.Encrypt(ctx, mech, hAES, plain)
			l.done("crypt", start, err)
			if err != nil {
				continue
			}
			start = time.Now()
			back, err := l.g.Decrypt(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_ECB, nil), hAES, ct)
			l.done("crypt", start, err)
			if err == nil && !bytes.Equal(back, plain) {
				l.wrong("decryption did not give back the plaintext")
			}
		case p < 870: // find
			start := time.Now()
			hs, err := l.g.Find(ctx, []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY),
				pkcs11.NewAttribute(pkcs11.CKA_LABEL, aesLabel)})
			l.done("find", start, err)
			if err == nil && (len(hs) != 1 || hs[0] != hAES) {
				l.wrong(fmt.Sprintf("find returned %v, want the AES key %v", hs, hAES))
			}
		case p < 940: // random
			start := time.Now()
			_, err := l.g.GenerateRandom(ctx, 32)
			l.done("random", start, err)
		case p < 984: // probe an object any process made or destroyed
			l.probe(ctx, worker, rng)
		case p < 992 || len(mine) == 0: // create a token data object
			label := fmt.Sprintf("%s-%d-%d", l.prefix, worker, made)
			made++
			var invoked time.Time
			err := l.lifecycle(func() error {
				invoked = time.Now()
				return l.create(ctx, label, binary.BigEndian.AppendUint64(nil, rng.Uint64()))
			})
			l.record(worker, history.Create, label, invoked, err, 0)
			if err != nil {
				l.mu.Lock()
				l.createErr[label] = err.Error()
				l.mu.Unlock()
				continue
			}
			l.mu.Lock()
			l.created = append(l.created, label)
			l.mu.Unlock()
			mine = append(mine, label)
		default: // destroy the oldest of ours
			label := mine[0]
			var found int
			var invoked time.Time
			err := l.lifecycle(func() (err error) {
				invoked = time.Now()
				found, err = l.destroy(ctx, label)
				return err
			})
			l.record(worker, history.Destroy, label, invoked, err, found)
			l.mu.Lock()
			_, retrying := l.destErr[label]
			l.mu.Unlock()
			if err != nil {
				l.mu.Lock()
				l.destErr[label] = err.Error()
				l.mu.Unlock()
				continue // tried again later
			}
			// An object this worker made and never destroyed must be
			// found; after a failed destroy it may be gone already.
			if found == 0 && !retrying {
				// Not destroyed: it stays among the created objects
				// expected on every member.
				l.wrong("find did not see " + label + ", created by this worker")
				mine = mine[1:]
				continue
			}
			l.mu.Lock()
			l.destroyed = append(l.destroyed, label)
			delete(l.destErr, label)
			l.mu.Unlock()
			mine = mine[1:]
		}
	}
}

// record adds one call of worker, invoked at invoked and returning now
// with err, to the history.
func (l *goLoad) record(worker int, kind history.Kind, label string, invoked time.Time, err error, found int) {
	op := history.Op{Host: l.host, Process: fmt.Sprintf("go/w%d", worker), Kind: kind, Label: label,
		Invoke: invoked, Return: time.Now(), OK: err == nil, Found: found}
	if err != nil {
		op.Result = err.Error()
	}
	l.hist.Add(op)
}

// probe searches for an object that some process, on any host, made or
// destroyed (as the history has it so far), and signs with it when it is
// a key pair that was found: the history checker judges what it saw
// (history.Check). A probe's failure is no finding by itself (the object
// may be destroyed meanwhile); it is not counted with the single-part
// operations.
func (l *goLoad) probe(ctx context.Context, worker int, rng *rand.Rand) {
	labels := l.hist.Destroyed()
	if rng.IntN(2) == 0 {
		labels = l.hist.Live()
	}
	if len(labels) == 0 {
		return
	}
	label := labels[rng.IntN(len(labels))]
	class := uint(pkcs11.CKO_DATA)
	if l.keypairs {
		class = pkcs11.CKO_PRIVATE_KEY
	}
	invoked := time.Now()
	hs, err := l.g.Find(ctx, []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_CLASS, class), pkcs11.NewAttribute(pkcs11.CKA_LABEL, label)})
	l.record(worker, history.Find, label, invoked, err, len(hs))
	if err != nil || len(hs) != 1 || !l.keypairs {
		return
	}
	d := sha256.Sum256([]byte(label))
	invoked = time.Now()
	_, err = l.g.Sign(ctx, pkcs11.NewMechanism(pkcs11.CKM_ECDSA, nil), hs[0], d[:])
	l.record(worker, history.Sign, label, invoked, err, 0)
}

// lifecycle runs fn holding the object life-cycle lock: within this
// process (a mutex) and with haload (flock(2) on the shared lock file),
// because SoftHSM 2.6 answers concurrent object creation on one token with
// CKR_GENERAL_ERROR or CKR_TEMPLATE_INCONSISTENT, which a real HSM would
// not. The engine never fails a member for CKR_GENERAL_ERROR from a
// creation and tries it once more (pkg/group), but a second refusal fails
// the creation, and the soak's created/destroyed accounting wants the
// objects made, so the loads do not race each other for it.
func (l *goLoad) lifecycle(fn func() error) error {
	l.lifeMu.Lock()
	defer l.lifeMu.Unlock()
	if l.lock != nil {
		for {
			err := syscall.Flock(int(l.lock.Fd()), syscall.LOCK_EX)
			if err == nil {
				break
			}
			if err != syscall.EINTR {
				return fmt.Errorf("life-cycle lock: %w", err)
			}
		}
		defer syscall.Flock(int(l.lock.Fd()), syscall.LOCK_UN)
	}
	return fn()
}

// create makes a token object labelled label: an EC key pair (with
// keypairs) or a data object holding value.
func (l *goLoad) create(ctx context.Context, label string, value []byte) error {
	s, err := l.g.OpenSession(ctx, pkcs11.CKF_SERIAL_SESSION|pkcs11.CKF_RW_SESSION)
	if err != nil {
		return err
	}
	defer s.Close()
	if l.keypairs {
		p256 := []byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07}
		common := func(private bool) []*pkcs11.Attribute {
			return []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true), pkcs11.NewAttribute(pkcs11.CKA_PRIVATE, private),
				pkcs11.NewAttribute(pkcs11.CKA_LABEL, label), pkcs11.NewAttribute(pkcs11.CKA_ID, value)}
		}
		_, _, err = s.GenerateKeyPair(ctx, pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil),
			append(common(false), pkcs11.NewAttribute(pkcs11.CKA_EC_PARAMS, p256), pkcs11.NewAttribute(pkcs11.CKA_VERIFY, true)),
			append(common(true), pkcs11.NewAttribute(pkcs11.CKA_SIGN, true), pkcs11.NewAttribute(pkcs11.CKA_SENSITIVE, true)))
		return err
	}
	_, err = s.CreateObject(ctx, []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_DATA), pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true),
		pkcs11.NewAttribute(pkcs11.CKA_PRIVATE, false), pkcs11.NewAttribute(pkcs11.CKA_LABEL, label),
		pkcs11.NewAttribute(pkcs11.CKA_APPLICATION, "soak"), pkcs11.NewAttribute(pkcs11.CKA_VALUE, value),
	})
	return err
}

// errLoginLost: the group's login was lost (in activeBasic, when every
// member failed): a search now sees no private object, so a destroy by
// label would leave the private half and report success.
var errLoginLost = errors.New("the group's login was lost (every member failed): log in again")

// destroy destroys the objects labelled label (both halves of a key pair)
// and returns how many it found. Logged out, it destroys nothing and
// fails, as an application that checks its login before it searches by
// label; a login lost during the destroy fails it too (it is tried again).
func (l *goLoad) destroy(ctx context.Context, label string) (found int, err error) {
	if _, in := l.g.LoggedIn(); !in {
		l.lostLogin.Store(true)
		return 0, errLoginLost
	}
	defer func() {
		if _, in := l.g.LoggedIn(); !in && err == nil {
			l.lostLogin.Store(true)
			err = errLoginLost
		}
	}()
	classes := []uint{pkcs11.CKO_DATA}
	if l.keypairs {
		classes = []uint{pkcs11.CKO_PRIVATE_KEY, pkcs11.CKO_PUBLIC_KEY}
	}
	for _, class := range classes {
		hs, err := l.g.Find(ctx, []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_CLASS, class), pkcs11.NewAttribute(pkcs11.CKA_LABEL, label)})
		if err != nil {
			return found, err
		}
		found += len(hs)
		for _, h := range hs {
			if err := l.g.DestroyObject(ctx, h); err != nil {
				return found, err
			}
		}
	}
	return found, nil
}

// derToRaw splits an ASN.1 DER ECDSA signature into 32-byte r and s.
func derToRaw(der []byte) (r, s []byte, ok bool) {
	// SEQUENCE { INTEGER r, INTEGER s } with short lengths (P-256).
	if len(der) < 8 || der[0] != 0x30 {
		return nil, nil, false
	}
	rest := der[2:]
	read := func() ([]byte, bool) {
		if len(rest) < 2 || rest[0] != 0x02 || int(rest[1])+2 > len(rest) {
			return nil, false
		}
		v := rest[2 : 2+int(rest[1])]
		rest = rest[2+int(rest[1]):]
		v = bytes.TrimLeft(v, "\x00")
		if len(v) > 32 {
			return nil, false
		}
		return append(make([]byte, 32-len(v)), v...), true
	}
	if r, ok = read(); !ok {
		return nil, nil, false
	}
	s, ok = read()
	return r, s, ok
}
