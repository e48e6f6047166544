package module

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/x509"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"
)

// TestExports: the library exports the PKCS#11 entry points and nothing
// else (no Go runtime, cgo or miekg/pkcs11 symbols).
func TestExports(t *testing.T) {
	lib := library(t)
	out, err := exec.Command("nm", "-D", "--defined-only", lib).Output()
	if err != nil {
		t.Fatalf("nm: %v", err)
	}
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		got = append(got, f[len(f)-1])
	}
	hdr, err := os.ReadFile(filepath.Join(repoDir, "cmd", "hapkcs11", "pkcs11f.h"))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"hap_helper_serve"} // the helper's entry (conn.c)
	for _, m := range regexp.MustCompile(`CK_PKCS11_FUNCTION_INFO\((C_\w+)\)`).FindAllStringSubmatch(string(hdr), -1) {
		want = append(want, m[1])
	}
	sort.Strings(got)
	sort.Strings(want)
	if len(want) != 69 {
		t.Fatalf("pkcs11f.h declares %d functions, want the 68 of v2.40", len(want))
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("exported symbols differ from the PKCS#11 v2.40 functions:\n got  %v\n want %v", got, want)
	}
}

// TestABI runs the C conformance checks (initialisation arguments and
// locking, buffer conventions, C_GetAttributeValue with sensitive, missing
// and short attributes, operation state, searches, fork, finalize) on the
// virtual slot and on a member's own slot, with the engine in process and
// through a helper (library.process = "helper": every call crosses the
// helper's generated client and dispatch).
func TestABI(t *testing.T) {
	r := newRig(t, rigOpts{})
	r.keypair("ec1", "01")
	r.tool("--slot", virtualSlot, "--login", "--pin", "env:HA_PIN", "--keypairgen",
		"--key-type", "rsa:2048", "--label", "rsa1", "--id", "02")
	prog := cprog(t, "abicheck")
	conf, err := os.ReadFile(r.conf)
	if err != nil {
		t.Fatal(err)
	}
	helperConf := r.write("helper.toml", "[library]\nprocess = \"helper\"\n\n"+string(conf))
	for _, mode := range []struct{ name, conf string }{{"in process", r.conf}, {"helper", helperConf}} {
		for _, slot := range []string{virtualSlot, r.memberSlot("hsm-1")} {
			out, err := r.run(2*time.Minute, []string{"HAGROUP_CONF=" + mode.conf}, prog, r.lib, slot, r.pinFile, "ec1", "rsa1")
			if err != nil {
				t.Errorf("abicheck %s on slot %s: %v", mode.name, slot, err)
			}
			for _, line := range strings.Split(out, "\n") {
				if !strings.HasPrefix(line, "ok ") && line != "" {
					t.Logf("%s, slot %s: %s", mode.name, slot, line)
				}
			}
		}
	}
}

// TestPkcs11Tool: the virtual slot and the members are listed; a key made
// on the virtual slot is on every member with the same ID and public key;
// signatures made through the group verify; deleting the key removes it
// from every member.
func TestPkcs11Tool(t *testing.T) {
	r := newRig(t, rigOpts{})
	slots := parseSlots(r.tool("-L"))
	if len(slots) != 4 {
		t.Fatalf("pkcs11-tool -L lists %d slots, want the virtual slot and 3 members: %+v", len(slots), slots)
	}
	v := slots[0]
	// The token behind the group shows: the members' manufacturer and
	// model (docs/DESIGN.md, "Differences from the member token").
	m0 := slots[1]
	if v.ID != virtualSlot || v.Label != groupLabel || v.Serial != groupSerial || v.Manufacturer != m0.Manufacturer || v.Model != m0.Model || m0.Model != "SoftHSM v2" {
		t.Errorf("virtual slot = %+v, want ID %s, label %s, serial %s, the manufacturer and model of member %+v (SoftHSM v2)", v, virtualSlot, groupLabel, groupSerial, m0)
	}
	for i, m := range r.members {
		s := slots[i+1]
		if s.Desc != "hagroup member "+m.Name+" of "+groupLabel || s.Label != m.Label {
			t.Errorf("slot %d = %+v, want member %s (token %s)", i+1, s, m.Name, m.Label)
		}
	}
	// Slot IDs are stable: a second process sees the same.
	if again := parseSlots(r.tool("-L")); again[1].ID != slots[1].ID || again[0].ID != slots[0].ID {
		t.Errorf("slot IDs changed between processes: %+v then %+v", slots, again)
	}

	r.keypair("sig1", "a1")
	vpub := r.readPub([]string{"--module", r.lib, "--slot", virtualSlot}, "a1")
	for _, m := range r.members {
		objs := r.direct(m, "--login", "--pin", "env:HA_PIN", "-O")
		if !containsAll(objs, "Private Key Object; EC", "Public Key Object; EC", "label:      sig1", "ID:         a1") {
			t.Errorf("member %s does not hold the key pair made on the virtual slot:\n%s", m.Name, objs)
		}
		if mpub := r.readPub(memberArgs(m), "a1"); !bytes.Equal(mpub, vpub) {
			t.Errorf("member %s: public key differs from the virtual slot's", m.Name)
		}
	}

	data := r.write("data", "the quick brown fox")
	sig := filepath.Join(r.dir, "sig")
	r.tool("--slot", virtualSlot, "--login", "--pin", "env:HA_PIN", "--sign", "--mechanism", "ECDSA",
		"--id", "a1", "--input-file", data, "--output-file", sig)
	r.tool("--slot", virtualSlot, "--login", "--pin", "env:HA_PIN", "--verify", "--mechanism", "ECDSA",
		"--id", "a1", "--input-file", data, "--signature-file", sig)
	// pkcs11-tool signed the raw data with CKM_ECDSA; check it
	// independently with the public key.
	raw, _ := os.ReadFile(sig)
	verifyRaw(t, vpub, []byte("the quick brown fox"), raw, false)

	r.tool("--slot", virtualSlot, "--login", "--pin", "env:HA_PIN", "--delete-object", "--type", "privkey", "--id", "a1")
	r.tool("--slot", virtualSlot, "--login", "--pin", "env:HA_PIN", "--delete-object", "--type", "pubkey", "--id", "a1")
	for _, m := range r.members {
		if objs := r.direct(m, "--login", "--pin", "env:HA_PIN", "-O"); strings.Contains(objs, "ID:         a1") {
			t.Errorf("member %s still holds the deleted key:\n%s", m.Name, objs)
		}
	}
	if objs := r.tool("--slot", virtualSlot, "--login", "--pin", "env:HA_PIN", "-O"); strings.Contains(objs, "ID:         a1") {
		t.Errorf("the virtual slot still lists the deleted key:\n%s", objs)
	}
}

// TestOnly: with only = true the virtual slot is the only slot.
func TestOnly(t *testing.T) {
	r := newRig(t, rigOpts{only: true})
	slots := parseSlots(r.tool("-L"))
	if len(slots) != 1 || slots[0].ID != virtualSlot || slots[0].Label != groupLabel {
		t.Fatalf("with only = true pkcs11-tool -L lists %+v, want the virtual slot alone", slots)
	}
}

// verifyRaw checks an ECDSA signature (r||s, 64 bytes) over data, hashed
// with SHA-256 first when hashed is set, with a DER SubjectPublicKeyInfo.
func verifyRaw(t *testing.T, der, data, sig []byte, hashed bool) {
	t.Helper()
	k, err := x509.ParsePKIXPublicKey(der)
	if err != nil {
		t.Fatalf("public key: %v", err)
	}
	pub, ok := k.(*ecdsa.PublicKey)
	if !ok {
		t.Fatalf("public key is %T, want ECDSA", k)
	}
	if len(sig) != 64 {
		t.Fatalf("signature is %d bytes, want 64 (r||s)", len(sig))
	}
	digest := data
	if hashed {
		h := sha256.Sum256(data)
		digest = h[:]
	}
	rr, ss := new(big.Int).SetBytes(sig[:32]), new(big.Int).SetBytes(sig[32:])
	if !ecdsa.Verify(pub, digest, rr, ss) {
		t.Errorf("signature does not verify with the public key")
	}
}

// TestCoexist: an application using SoftHSM directly and through the
// library at once keeps its SoftHSM after C_Finalize of the library.
func TestCoexist(t *testing.T) {
	r := newRig(t, rigOpts{})
	out := r.mustRun(time.Minute, cprog(t, "coexist"), r.lib, "/usr/lib/softhsm/libsofthsm2.so", virtualSlot)
	if strings.TrimSpace(out) != "ok" {
		t.Errorf("coexist: %s", out)
	}
}

// TestSignBesideSoftHSM: one process logged in to a member's token through
// SoftHSM directly and to the group through the library signs through
// both in turn, from one thread and from two (interleave.c, which make
// bench measures with), and every signature succeeds; so does the same
// harness run A/A, the library against itself (bench.sh AA=1).
func TestSignBesideSoftHSM(t *testing.T) {
	r := newRig(t, rigOpts{ecKey: "beside,0d"})
	m := r.members[0]
	var base string
	for _, s := range parseSlots(r.direct(m, "-L")) {
		if s.Label == m.Label {
			base = s.ID
		}
	}
	if base == "" {
		t.Fatalf("SoftHSM lists no slot with token %s", m.Label)
	}
	checkInterleaved(t, "SoftHSM against the group", r.mustRun(2*time.Minute, cprog(t, "interleave"), m.Module, base, r.lib, virtualSlot, r.pinFile, "beside", "-", "20", "3"))
	checkInterleaved(t, "the group against itself", r.mustRun(2*time.Minute, cprog(t, "interleave"), r.lib, virtualSlot, r.lib, virtualSlot, r.pinFile, "beside", "-", "20", "3"))
}

// checkInterleaved checks interleave's output for ECDSA with 1 and 2
// threads over 3 rounds: signatures and CPU counted on both sides.
func checkInterleaved(t *testing.T, what, out string) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("%s: interleave printed %d lines, want ECDSA with 1 and 2 threads:\n%s", what, len(lines), out)
	}
	for i, line := range lines {
		var threads, rounds int
		var direct, group, ratio, q1, q3, directCPU, groupCPU, cpuRatio, cq1, cq3 float64
		_, err := fmt.Sscanf(line, "sign ecdsa-p256 threads=%d base_per_s=%g module_per_s=%g ratio=%g q1=%g q3=%g "+
			"base_cpu_us=%g module_cpu_us=%g cpu_ratio=%g cpu_q1=%g cpu_q3=%g rounds=%d",
			&threads, &direct, &group, &ratio, &q1, &q3, &directCPU, &groupCPU, &cpuRatio, &cq1, &cq3, &rounds)
		if err != nil || threads != i+1 || rounds != 3 {
			t.Fatalf("%s: interleave line %q: want ECDSA with %d thread(s) over 3 rounds (%v)", what, line, i+1, err)
		}
		if direct <= 0 || group <= 0 {
			t.Errorf("%s, %d thread(s): %.0f signatures/s on the base side, %.0f on the other: want both above 0", what, threads, direct, group)
		}
		if directCPU <= 0 || groupCPU <= 0 {
			t.Errorf("%s, %d thread(s): %.1f µs of CPU per signature on the base side, %.1f on the other: want both above 0", what, threads, directCPU, groupCPU)
		}
	}
}

// TestDiagnostics: a missing configuration fails C_Initialize quietly
// unless HAGROUP_DEBUG is set, and then says why; a wrong PIN is reported
// as CKR_PIN_INCORRECT and no PIN reaches stderr or the HA event log.
func TestDiagnostics(t *testing.T) {
	r := newRig(t, rigOpts{})
	missing := filepath.Join(r.dir, "absent.toml")
	out, err := r.run(time.Minute, []string{"HAGROUP_CONF=" + missing}, "pkcs11-tool", "--module", r.lib, "-L")
	if err == nil || !strings.Contains(out, "CKR_GENERAL_ERROR") || strings.Contains(out, missing) {
		t.Errorf("without a configuration and without HAGROUP_DEBUG: err %v, output:\n%s", err, out)
	}
	out, err = r.run(time.Minute, []string{"HAGROUP_CONF=" + missing, "HAGROUP_DEBUG=1"}, "pkcs11-tool", "--module", r.lib, "-L")
	if err == nil || !containsAll(out, "cannot load the configuration", missing) {
		t.Errorf("with HAGROUP_DEBUG the failure should name the file: err %v, output:\n%s", err, out)
	}

	const wrong = "wrong-pin-5555"
	out, err = r.run(time.Minute, []string{"HAGROUP_DEBUG=1", "BAD_PIN=" + wrong}, "pkcs11-tool", "--module", r.lib,
		"--slot", virtualSlot, "--login", "--pin", "env:BAD_PIN", "-O")
	if err == nil || !strings.Contains(out, "CKR_PIN_INCORRECT") {
		t.Errorf("a wrong PIN: err %v, output:\n%s", err, out)
	}
	for _, pin := range []string{wrong, "test-user-1234"} {
		if strings.Contains(out, pin) || strings.Contains(r.haLog(), pin) {
			t.Errorf("a PIN reached stderr or the HA event log")
		}
	}
}
