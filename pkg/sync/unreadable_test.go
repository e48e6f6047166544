package sync_test

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	hasync "github.com/hagroup/hagroup/pkg/sync"
	"github.com/miekg/pkcs11"
)

// classlessObject is the object file the chaos soak found on a SoftHSM
// 2.6.1 token (seed 1796060757859084627, member m3), rebuilt: generation
// 0x1f and the attributes a private EC key's initialisation writes last,
// without CKA_CLASS, CKA_TOKEN, CKA_LABEL or CKA_KEY_TYPE. SoftHSM lists
// it and answers CKR_ATTRIBUTE_VALUE_INVALID to every C_GetAttributeValue
// on it.
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
	raw := classlessObject()
	uuid := make([]byte, 16)
	if _, err := rand.Read(uuid); err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("%x-%x-%x-%x-%x.object", uuid[:4], uuid[4:6], uuid[6:8], uuid[8:10], uuid[10:])
	if err := os.WriteFile(filepath.Join(dir, name), raw, 0o600); err != nil {
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

// tokenDir finds tok's directory under the SOFTHSM2_CONF's tokendir by the
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

// A member holding an object it will not describe (SoftHSM's classless
// object) is still planned and synchronised: the object is reported by
// member and handle, never copied nor counted as a conflict, and the
// readable objects are copied as usual.
func TestPlanReportsUnreadableObject(t *testing.T) {
	ms, toks := planMembersToks(t, 2)
	ctx := planCtx(t)
	id := planID(t)
	planGenEC(t, ms[0].Slot, "unreadable-neighbour", id)
	plantClasslessObject(t, toks[1])

	p, err := hasync.MakePlan(ctx, ms, nil, hasync.PlanOptions{})
	if err != nil {
		t.Fatalf("plan failed for one unreadable object: %v", err)
	}
	if len(p.Unreadable) != 1 {
		t.Fatalf("unreadable objects = %v, want exactly the planted one on m1", p.Unreadable)
	}
	u := p.Unreadable[0]
	if u.Member != "m1" || u.Handle == 0 || u.Identity != nil {
		t.Errorf("unreadable = %+v, want member m1, its handle, no identity", u)
	}
	if got := u.String(); !strings.Contains(got, "m1") || !strings.Contains(got, fmt.Sprint(u.Handle)) ||
		!strings.Contains(got, "CKR_ATTRIBUTE_VALUE_INVALID") {
		t.Errorf("report %q does not name member, handle and the member's answer", got)
	}
	if len(p.Conflicts) != 0 {
		t.Errorf("conflicts = %v, want none", p.Conflicts)
	}
	if len(p.Actions) != 2 {
		t.Fatalf("actions = %v, want the copies of both halves to m1", p.Actions)
	}
	for _, a := range p.Actions {
		if a.Kind != hasync.Copy || a.Member != "m1" || a.Source != "m0" {
			t.Errorf("action %v: want copy from m0 to m1", a)
		}
	}
	if n := p.OutOfSync("m1"); n != 3 {
		t.Errorf("m1 out of sync by %d, want 3 (two copies, one unreadable)", n)
	}
	if n := p.OutOfSync("m0"); n != 0 {
		t.Errorf("m0 out of sync by %d, want 0", n)
	}
	r := &hasync.Replicator{GroupSerial: planSerial}
	if _, err := r.Apply(ctx, p); err != nil {
		t.Fatalf("apply: %v", err)
	}
	again, err := hasync.MakePlan(ctx, ms, nil, hasync.PlanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(again.Actions) != 0 || len(again.Conflicts) != 0 || len(again.Unreadable) != 1 {
		t.Errorf("after apply: actions %v, conflicts %v, unreadable %v; want none, none, the planted one",
			again.Actions, again.Conflicts, again.Unreadable)
	}
	objs, err := hasync.List(ctx, ms[1].Slot)
	if err != nil {
		t.Fatalf("List with an unreadable object: %v", err)
	}
	n := 0
	for _, o := range objs {
		if bytes.Equal(o.ID, id) {
			n++
		}
	}
	if n != 2 {
		t.Errorf("m1 holds %d halves of the pair, want 2", n)
	}
}

// planMembersToks is planMembers that also returns the tokens.
func planMembersToks(t *testing.T, n int) ([]hasync.PlanMember, []testhsm.Token) {
	t.Helper()
	toks := testhsm.Take(t, n)
	ms := make([]hasync.PlanMember, n)
	var dts []hasync.DomainTarget
	for i, tok := range toks {
		s, err := slot.Open(planCtx(t), slot.Spec{
			Name: fmt.Sprintf("m%d", i), Module: tok.Module, ModuleEnv: tok.ModuleEnv, TokenLabel: tok.Label,
			PIN: secret.PINFromString(tok.UserPIN), CommandTimeout: 10 * time.Second,
		})
		if err != nil {
			t.Fatalf("open %s: %v", tok.Label, err)
		}
		t.Cleanup(func() { s.Close() })
		ms[i] = hasync.PlanMember{Name: s.Name(), Slot: s}
		dts = append(dts, hasync.DomainTarget{Slot: s})
	}
	if err := hasync.InstallDomainKey(planCtx(t), dts, planSerial); err != nil {
		t.Fatalf("install domain key: %v", err)
	}
	return ms, toks
}
