package recover

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/miekg/pkcs11"
)

// S1 of the chaos soak: one object a member will not describe (SoftHSM
// 2.6.1 left an object file without CKA_CLASS, answering
// CKR_ATTRIBUTE_VALUE_INVALID) made every catch-up plan fail, so failed
// members never returned. Now the member is caught up with every readable
// object and returns to rotation; the unreadable objects, on the member
// and on a peer, are reported by member and handle and left alone.
func TestRecoveryWithUnreadableObjects(t *testing.T) {
	r := newRig(t, rigOpts{n: 3, retries: 0})
	victim := r.name(2)
	if err := r.g.FailMember(victim, errors.New("test: taken out")); err != nil {
		t.Fatal(err)
	}
	s := r.session()
	for i := range 3 {
		r.genEC(s, fmt.Sprintf("while-away-%d", i))
	}
	plantClasslessObject(t, r.toks[1])
	plantClasslessObject(t, r.toks[2])

	res, err := r.rec.Recover(rigCtx(t), victim)
	if err != nil {
		t.Fatalf("recover with unreadable objects: %v", err)
	}
	if st := r.state(victim); st != member.Active {
		t.Fatalf("victim is %v after recovery, want active", st)
	}
	if res.CatchUp.Copied != 6 || res.CatchUp.Deleted != 0 {
		t.Errorf("catch-up copied %d and deleted %d, want the 3 pairs (6) and nothing", res.CatchUp.Copied, res.CatchUp.Deleted)
	}
	on := map[string]int{}
	for _, u := range res.CatchUp.Unreadable {
		on[u.Member]++
		if u.Handle == 0 || !strings.Contains(u.String(), "CKR_ATTRIBUTE_VALUE_INVALID") {
			t.Errorf("unreadable object reported as %q (handle %d)", u, u.Handle)
		}
	}
	if len(res.CatchUp.Unreadable) != 2 || on[r.name(1)] != 1 || on[victim] != 1 {
		t.Errorf("unreadable objects reported: %v; want one on %s and one on %s", res.CatchUp.Unreadable, r.name(1), victim)
	}
	r.rev.mu.Lock()
	var recovered *Event
	for _, e := range r.rev.all {
		if e.Kind == Recovered && e.Member == victim {
			recovered = &e
		}
	}
	r.rev.mu.Unlock()
	if recovered == nil || len(recovered.Unreadable) != 2 {
		t.Errorf("recovered event %+v does not carry the 2 unreadable objects", recovered)
	}
	if st := r.rec.Status(victim); st.OutOfSync != 1 {
		t.Errorf("victim out of sync by %d, want 1 (its unreadable object)", st.OutOfSync)
	}
	onVictim := inventory(t, r.direct(r.toks[2], "-check"))
	onFirst := inventory(t, r.direct(r.toks[0], "-check"))
	if dump(onVictim) != dump(onFirst) {
		t.Fatalf("victim differs from %s:\nvictim:\n  %s\n%s:\n  %s", r.name(0), dump(onVictim), r.name(0), dump(onFirst))
	}

	rep, err := r.rec.Synchronize(rigCtx(t), SyncOptions{Check: true})
	if err != nil {
		t.Fatalf("synchronize --check: %v", err)
	}
	if rep.InSync() || len(rep.Plan.Unreadable) != 2 || len(rep.Plan.Actions) != 0 || len(rep.Plan.Conflicts) != 0 {
		t.Errorf("check: in sync %v, unreadable %v, actions %v, conflicts %v; want out of sync by the 2 unreadable objects only",
			rep.InSync(), rep.Plan.Unreadable, rep.Plan.Actions, rep.Plan.Conflicts)
	}
}

// classlessObject is the object file the chaos soak found on a SoftHSM
// 2.6.1 token (seed 1796060757859084627, member m3), rebuilt: generation
// 0x1f and the attributes a private EC key's initialisation writes last,
// without CKA_CLASS, CKA_TOKEN, CKA_LABEL or CKA_KEY_TYPE.
func classlessObject() []byte {
	var b []byte
	u := func(v uint64) { b = binary.BigEndian.AppendUint64(b, v) }
	const boolean, bytestr, attrmap = 1, 3, 4
	u(0x1f)
	for _, typ := range []uint64{pkcs11.CKA_VALUE, pkcs11.CKA_PUBLIC_KEY_INFO} {
		u(typ)
		u(bytestr)
		u(0)
	}
	u(pkcs11.CKA_NEVER_EXTRACTABLE)
	u(boolean)
	b = append(b, 0xff)
	u(pkcs11.CKA_ALWAYS_SENSITIVE)
	u(boolean)
	b = append(b, 0)
	u(pkcs11.CKA_EC_PARAMS)
	u(bytestr)
	u(0)
	for _, typ := range []uint64{pkcs11.CKA_ALWAYS_AUTHENTICATE, pkcs11.CKA_WRAP_WITH_TRUSTED} {
		u(typ)
		u(boolean)
		b = append(b, 0)
	}
	u(pkcs11.CKA_UNWRAP_TEMPLATE)
	u(attrmap)
	u(0)
	return b
}

// plantClasslessObject writes that object file into tok's token directory
// and moves the token's generation, so that SoftHSM, in this process,
// lists it on its next search.
func plantClasslessObject(t *testing.T, tok testhsm.Token) {
	t.Helper()
	dir := tokenDir(t, tok)
	uuid := make([]byte, 16)
	rand.Read(uuid)
	name := fmt.Sprintf("%x-%x-%x-%x-%x.object", uuid[:4], uuid[4:6], uuid[6:8], uuid[8:10], uuid[10:])
	if err := os.WriteFile(filepath.Join(dir, name), classlessObject(), 0o600); err != nil {
		t.Fatal(err)
	}
	genPath := filepath.Join(dir, "generation")
	gen, err := os.ReadFile(genPath)
	if err != nil || len(gen) != 8 {
		t.Fatalf("token generation of %s: %v (%d bytes)", tok.Label, err, len(gen))
	}
	binary.BigEndian.PutUint64(gen, binary.BigEndian.Uint64(gen)+1)
	if err := os.WriteFile(genPath, gen, 0o600); err != nil {
		t.Fatal(err)
	}
}

// tokenDir finds tok's directory under SOFTHSM2_CONF's tokendir by the
// padded label in its token.object.
func tokenDir(t *testing.T, tok testhsm.Token) string {
	t.Helper()
	f, err := os.Open(os.Getenv("SOFTHSM2_CONF"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var root string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok && strings.TrimSpace(k) == "directories.tokendir" {
			root = strings.TrimSpace(v)
		}
	}
	if root == "" {
		t.Fatal("no directories.tokendir in SOFTHSM2_CONF")
	}
	ents, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	padded := []byte(fmt.Sprintf("%-32s", tok.Label))
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(root, e.Name(), "token.object"))
		if err == nil && bytes.Contains(b, padded) {
			return filepath.Join(root, e.Name())
		}
	}
	t.Fatalf("no token directory for %s under %s", tok.Label, root)
	return ""
}
