package testhsm

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

	"github.com/miekg/pkcs11"
)

// unreadableObject is the object file the chaos soak found on a SoftHSM
// 2.6.1 token (seed 1796060757859084627, member m3), rebuilt: generation
// 0x1f and the attributes a private EC key's initialisation writes last,
// without CKA_CLASS, CKA_TOKEN, CKA_LABEL or CKA_KEY_TYPE (SoftHSM's file
// store left it so when another thread refreshed it mid-write). SoftHSM
// lists it and answers CKR_ATTRIBUTE_VALUE_INVALID to every
// C_GetAttributeValue on it.
func unreadableObject() []byte {
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

// PlantUnreadableObject writes that object file into the token directory
// of tok (a token of the pool Main made) and moves the token's generation,
// so that SoftHSM, in this process, lists the object on its next search.
func PlantUnreadableObject(t testing.TB, tok Token) {
	t.Helper()
	plantObject(t, tok, unreadableObject(), false)
}

// plantObject writes body as a new object file into tok's directory
// (with the empty lock file SoftHSM keeps beside each object it made,
// when lock) and moves the token's generation.
func plantObject(t testing.TB, tok Token, body []byte, lock bool) {
	t.Helper()
	dir := tokenDir(t, tok)
	uuid := make([]byte, 16)
	if _, err := rand.Read(uuid); err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("%x-%x-%x-%x-%x.object", uuid[:4], uuid[4:6], uuid[6:8], uuid[8:10], uuid[10:])
	if err := os.WriteFile(filepath.Join(dir, name), body, 0o600); err != nil {
		t.Fatal(err)
	}
	if lock {
		if err := os.WriteFile(filepath.Join(dir, strings.TrimSuffix(name, ".object")+".lock"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	bumpGeneration(t, tok, dir)
}

// bumpGeneration moves the generation of tok (in dir), so that SoftHSM
// looks at the token's files again on its next search.
func bumpGeneration(t testing.TB, tok Token, dir string) {
	t.Helper()
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
func tokenDir(t testing.TB, tok Token) string {
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
