package module

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestPkcs11ToolSelfTest compares `pkcs11-tool --test --login` on the
// virtual slot with the same run directly on a SoftHSM token. Both hold EC
// keys only: Debian's pkcs11-tool aborts on SoftHSM's RSA-OAEP whatever the
// module (see DESIGN.md), so RSA keys would compare two failures.
func TestPkcs11ToolSelfTest(t *testing.T) {
	r := newRig(t, rigOpts{})
	r.keypair("ec1", "01")
	r.keypair("ec2", "02")
	// A plain SoftHSM token with the same kind of keys and no domain key.
	r.initToken("plain")
	plain := []string{"--module", "/usr/lib/softhsm/libsofthsm2.so", "--token-label", "plain"}
	for _, id := range []string{"01", "02"} {
		r.mustRun(time.Minute, "pkcs11-tool", append(append([]string{}, plain...), "--login", "--pin", "env:HA_PIN",
			"--keypairgen", "--key-type", "EC:prime256v1", "--label", "ec"+id[1:], "--id", id)...)
	}
	direct, derr := r.run(2*time.Minute, nil, "pkcs11-tool", append(append([]string{}, plain...), "--login", "--pin", "env:HA_PIN", "--test")...)
	virt, verr := r.run(2*time.Minute, nil, "pkcs11-tool", "--module", r.lib, "--slot", virtualSlot, "--login", "--pin", "env:HA_PIN", "--test")
	t.Logf("directly on SoftHSM (err %v):\n%s", derr, direct)
	t.Logf("on the virtual slot (err %v):\n%s", verr, virt)
	if derr != nil || !strings.Contains(direct, "No errors") {
		t.Fatalf("the reference run directly on SoftHSM failed; the comparison means nothing")
	}
	if verr != nil || !strings.Contains(virt, "No errors") {
		t.Errorf("pkcs11-tool --test fails on the virtual slot but passes directly on SoftHSM")
	}
	// The same sections pass: compare the outcome lines, not key names.
	// One difference is expected and checked: the virtual slot does not
	// take a seed (seeding one member would not seed the others), which
	// pkcs11-tool reports and then goes on.
	const noSeed = "seeding (C_SeedRandom) not supported"
	if !strings.Contains(virt, noSeed) {
		t.Errorf("pkcs11-tool no longer reports %q on the virtual slot: update this test", noSeed)
	}
	if got, want := strings.Replace(outcomes(virt), noSeed+"\n", "", 1), outcomes(direct); got != want {
		t.Errorf("outcomes differ:\nvirtual slot:\n%s\nSoftHSM:\n%s", got, want)
	}
}

// outcomes keeps the lines of a pkcs11-tool --test report that state a
// result, without key names and numbers.
func outcomes(report string) string {
	var keep []string
	for _, line := range strings.Split(report, "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "testing key") || strings.HasPrefix(line, "Using slot") || line == "" {
			continue
		}
		keep = append(keep, line)
	}
	return strings.Join(keep, "\n")
}

// TestFailoverSign: a C program signs in 8 threads through the module
// while one member is killed and restarted. No C_Sign may fail and every
// signature must verify; the HA event log shows the member was dropped and
// recovered. Both transports to a member are covered:
//   - hsmserve (hagroup's own server, which carries CKM_AES_KEY_WRAP_PAD and
//     nested templates): the key is generated THROUGH libhapkcs11.so and
//     replicated to the served member, whose own slot then lists it;
//   - p11-kit server 0.24, whose RPC cannot carry CKA_UNWRAP_TEMPLATE: the
//     key is made before the library starts, with every member reached
//     directly (hsmprep -ec-key).
func TestFailoverSign(t *testing.T) {
	t.Run("hsmserve", func(t *testing.T) {
		r := newRig(t, rigOpts{remote: true})
		r.keypair("load1", "0c")
		// The private half reached the served member through its server.
		served := r.tool("--slot", r.memberSlot("hsm-2"), "--login", "--pin", "env:HA_PIN", "--list-objects", "--type", "privkey")
		if !containsAll(served, "load1", "ID:         0c") {
			t.Fatalf("the key generated through libhapkcs11.so is not on the hsmserve member:\n%s", served)
		}
		failoverSign(t, r)
	})
	t.Run("p11-kit", func(t *testing.T) {
		failoverSign(t, newRig(t, rigOpts{served: true, ecKey: "load1,0c"}))
	})
}

// failoverSign runs signload with key load1 on r's virtual slot, kills the
// served member under load, restarts it and checks every signature.
func failoverSign(t *testing.T, r *rig) {
	prog := cprog(t, "signload")

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, prog, r.lib, virtualSlot, r.pinFile, "load1", "8")
	cmd.Env = r.env
	cmd.Dir = r.dir
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 1024)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<16), 1<<20)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	var all []string
	progress := 0
	// waitFor reads lines until cond holds or the deadline passes.
	waitFor := func(what string, d time.Duration, cond func() bool) {
		t.Helper()
		deadline := time.NewTimer(d)
		defer deadline.Stop()
		for !cond() {
			select {
			case line, ok := <-lines:
				if !ok {
					t.Fatalf("signload ended while waiting for %s:\n%s\nstderr: %s", what, notProgress(all), stderr.String())
				}
				all = append(all, line)
				if n, ok := strings.CutPrefix(line, "progress "); ok {
					progress, _ = strconv.Atoi(n)
				}
				if strings.HasPrefix(line, "error ") {
					t.Errorf("signload: %s", line)
				}
			case <-deadline.C:
				t.Fatalf("no %s within %v (progress %d):\n%s\nHA event log:\n%s", what, d, progress, notProgress(all), r.haLog())
			}
		}
	}
	ready := false
	waitFor("ready", time.Minute, func() bool { ready = ready || (len(all) > 0 && all[len(all)-1] == "ready"); return ready })
	waitFor("signing", time.Minute, func() bool { return progress >= 400 })

	start := time.Now()
	r.served.Kill()
	atKill := progress
	waitFor("signing after the kill", 2*time.Minute, func() bool { return progress >= atKill+1000 })
	waitFor("the member dropped", time.Minute, func() bool { return strings.Contains(r.haLog(), `"member":"hsm-2","event":"member_failed"`) })

	dropped := time.Since(start)
	r.served.Restart(t)
	restarted := time.Now()
	atRestart := progress
	waitFor("the member back in rotation", 2*time.Minute, func() bool {
		return strings.Contains(r.haLog(), `"member":"hsm-2","event":"member_recovered"`)
	})
	back := time.Since(restarted)
	waitFor("signing after the restart", 2*time.Minute, func() bool { return progress >= atRestart+1000 })
	t.Logf("member dropped %v after the kill; back in rotation %v after its restart", dropped.Round(time.Millisecond), back.Round(time.Millisecond))

	stdin.Close()
	for line := range lines {
		all = append(all, line)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("signload: %v\nstderr: %s", err, stderr.String())
	}
	var total string
	var pub []byte
	var samples [][2][]byte
	for _, line := range all {
		f := strings.Fields(line)
		switch {
		case len(f) == 4 && f[0] == "total":
			total = line
		case len(f) == 2 && f[0] == "pub":
			pub, _ = hex.DecodeString(f[1])
		case len(f) == 3 && f[0] == "sample":
			d, _ := hex.DecodeString(f[1])
			s, _ := hex.DecodeString(f[2])
			samples = append(samples, [2][]byte{d, s})
		}
	}
	var signed, signFailed, verifyFailed int
	if _, err := fmt.Sscanf(total, "total signed=%d sign_failed=%d verify_failed=%d", &signed, &signFailed, &verifyFailed); err != nil {
		t.Fatalf("no totals in signload's output (%v):\n%s", err, notProgress(all))
	}
	t.Logf("%s (killed at %d, restarted at %d)", total, atKill, atRestart)
	if signFailed != 0 || verifyFailed != 0 {
		t.Errorf("%d C_Sign calls failed and %d signatures did not verify, want none", signFailed, verifyFailed)
	}
	// Check the last signature of every thread independently.
	der := ecPointToSPKI(t, pub)
	for _, s := range samples {
		verifyRaw(t, der, s[0], s[1], false)
	}
	if len(samples) != 8 {
		t.Errorf("%d threads reported a signature, want 8", len(samples))
	}
}

// ecPointToSPKI turns a CKA_EC_POINT (a DER OCTET STRING around an
// uncompressed P-256 point) into a DER SubjectPublicKeyInfo.
func ecPointToSPKI(t *testing.T, ecPoint []byte) []byte {
	t.Helper()
	if len(ecPoint) != 67 || ecPoint[0] != 0x04 || ecPoint[1] != 65 {
		t.Fatalf("CKA_EC_POINT is %x, want an OCTET STRING of a 65-byte point", ecPoint)
	}
	pub, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), ecPoint[2:])
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

// notProgress drops signload's progress lines.
func notProgress(lines []string) string {
	var keep []string
	for _, l := range lines {
		if !strings.HasPrefix(l, "progress ") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}
