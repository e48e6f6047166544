package module

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/binary"
	"encoding/pem"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
)

// TestP11tool: GnuTLS's p11tool lists the virtual token and its objects
// and its signing self-test passes on a key of the virtual slot.
func TestP11tool(t *testing.T) {
	r := newRig(t, rigOpts{})
	r.keypair("ec1", "01")
	tokens := r.mustRun(time.Minute, "p11tool", "--provider", r.lib, "--list-tokens")
	if !containsAll(tokens, "Label: signing", "Serial: 1000001", "Manufacturer: SoftHSM project", "Model: SoftHSM v2") {
		t.Errorf("p11tool --list-tokens does not show the virtual token:\n%s", tokens)
	}
	objs := r.mustRun(time.Minute, "p11tool", "--provider", r.lib, "--login", "--list-all", "pkcs11:token=signing")
	if !containsAll(objs, "Label: ec1", "Private key (EC/ECDSA-SECP256R1)", "Public key (EC/ECDSA-SECP256R1)") {
		t.Errorf("p11tool --list-all does not show the key pair:\n%s", objs)
	}
	out := r.mustRun(time.Minute, "p11tool", "--provider", r.lib, "--login", "--test-sign",
		"pkcs11:token=signing;object=ec1;type=private")
	if strings.Count(out, "... ok") < 2 {
		t.Errorf("p11tool --test-sign did not verify the signature twice:\n%s", out)
	}
}

// selfSigned makes a self-signed certificate with OpenSSL's pkcs11 engine
// from key label on the virtual slot and returns the PEM file.
func (r *rig) selfSigned(label string) string {
	r.t.Helper()
	// libp11 reads the PIN from a file (pin-source), byte for byte.
	rawPIN := r.write("user.pin.raw", testhsm.UserPIN)
	cert := filepath.Join(r.dir, label+".pem")
	key := "pkcs11:token=" + groupLabel + ";object=" + label + ";type=private?pin-source=" + rawPIN
	out, err := r.run(2*time.Minute, []string{"PKCS11_MODULE_PATH=" + r.lib}, "openssl", "req", "-new", "-x509",
		"-days", "1", "-subj", "/CN=hagroup module test", "-engine", "pkcs11", "-keyform", "engine",
		"-key", key, "-sha256", "-out", cert)
	if err != nil {
		r.t.Fatalf("openssl req with the pkcs11 engine: %v\n%s", err, out)
	}
	return cert
}

// TestOpenSSL: OpenSSL's pkcs11 engine signs a self-signed certificate
// with a key of the virtual slot; openssl verifies it, and its public key
// is the token's.
func TestOpenSSL(t *testing.T) {
	r := newRig(t, rigOpts{})
	r.keypair("ec1", "01")
	cert := r.selfSigned("ec1")
	if out := r.mustRun(time.Minute, "openssl", "verify", "-CAfile", cert, cert); !strings.Contains(out, ": OK") {
		t.Errorf("openssl verify: %s", out)
	}
	text := r.mustRun(time.Minute, "openssl", "x509", "-in", cert, "-noout", "-subject", "-text")
	if !containsAll(text, "CN = hagroup module test", "ecdsa-with-SHA256", "prime256v1") {
		t.Errorf("certificate is not what was asked for:\n%s", text)
	}
	b, _ := os.ReadFile(cert)
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatal("no PEM certificate")
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CheckSignatureFrom(c); err != nil {
		t.Errorf("certificate signature: %v", err)
	}
	pub := r.readPub([]string{"--module", r.lib, "--slot", virtualSlot}, "01")
	if want, _ := x509.MarshalPKIXPublicKey(c.PublicKey); !bytes.Equal(want, pub) {
		t.Errorf("certificate public key is not the token's")
	}
}

// TestSSHKeygen: ssh-keygen -D prints the public keys of the virtual slot.
func TestSSHKeygen(t *testing.T) {
	r := newRig(t, rigOpts{only: true})
	r.keypair("ssh1", "0a")
	pub := r.readPub([]string{"--module", r.lib, "--slot", virtualSlot}, "0a")
	out := r.mustRun(time.Minute, "ssh-keygen", "-D", r.lib)
	want := sshECDSA(t, pub)
	if !strings.Contains(out, want) {
		t.Errorf("ssh-keygen -D does not print the key's public key\nwant %s\ngot:\n%s", want, out)
	}
}

// sshECDSA renders a P-256 DER public key in OpenSSH's one-line form.
func sshECDSA(t *testing.T, der []byte) string {
	t.Helper()
	k, err := x509.ParsePKIXPublicKey(der)
	if err != nil {
		t.Fatal(err)
	}
	ek, ok := k.(*ecdsa.PublicKey)
	if !ok {
		t.Fatalf("public key is %T", k)
	}
	point, err := ek.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	var b []byte
	for _, f := range [][]byte{[]byte("ecdsa-sha2-nistp256"), []byte("nistp256"), point} {
		b = binary.BigEndian.AppendUint32(b, uint32(len(f)))
		b = append(b, f...)
	}
	return "ecdsa-sha2-nistp256 " + base64.StdEncoding.EncodeToString(b)
}

const javaProgram = `import java.nio.file.*;
import java.security.*;
import java.security.cert.Certificate;
import java.util.*;

public class HaSign {
    public static void main(String[] a) throws Exception {
        Provider p = Security.getProvider("SunPKCS11").configure(a[0]);
        char[] pin = new String(Files.readAllBytes(Paths.get(a[1]))).trim().toCharArray();
        KeyStore ks = KeyStore.getInstance("PKCS11", p);
        ks.load(null, pin);
        for (String alias : Collections.list(ks.aliases())) System.out.println("alias " + alias);
        byte[] data = "signed by Java through hagroup".getBytes();

        PrivateKey k = (PrivateKey) ks.getKey(a[2], null);
        Certificate c = ks.getCertificate(a[2]);
        Signature s = Signature.getInstance("SHA256withECDSA", p);
        s.initSign(k);
        s.update(data);
        byte[] sig = s.sign();
        Signature v = Signature.getInstance("SHA256withECDSA", "SunEC");
        v.initVerify(c.getPublicKey());
        v.update(data);
        System.out.println("token key verified " + v.verify(sig));

        KeyPairGenerator g = KeyPairGenerator.getInstance("EC", p);
        g.initialize(256);
        KeyPair kp = g.generateKeyPair();
        s.initSign(kp.getPrivate());
        s.update(data);
        sig = s.sign();
        Signature v2 = Signature.getInstance("SHA256withECDSA", p);
        v2.initVerify(kp.getPublic());
        v2.update(data);
        System.out.println("session key verified " + v2.verify(sig));
    }
}
`

// TestJava: Java 17's SunPKCS11 provider lists the key of the virtual
// slot (with its certificate) and signs with it; the signature verifies in
// software. It also signs with a session key pair made through the module.
func TestJava(t *testing.T) {
	javac, err := exec.LookPath("javac")
	if err != nil {
		t.Skip("no JDK (javac) installed: install openjdk-17-jdk-headless to run the SunPKCS11 test")
	}
	r := newRig(t, rigOpts{})
	r.keypair("java1", "0b")
	cert := r.selfSigned("java1")
	der := filepath.Join(r.dir, "java1.der")
	r.mustRun(time.Minute, "openssl", "x509", "-in", cert, "-outform", "DER", "-out", der)
	r.tool("--slot", virtualSlot, "--login", "--pin", "env:HA_PIN", "--write-object", der,
		"--type", "cert", "--id", "0b", "--label", "java1")

	src := r.write("HaSign.java", javaProgram)
	r.mustRun(2*time.Minute, javac, "-d", r.dir, src)
	cfg := r.write("sunpkcs11.cfg", "name = hagroup\nlibrary = "+r.lib+"\nslot = "+groupSerial+"\n")
	out := r.mustRun(2*time.Minute, "java", "-cp", r.dir, "HaSign", cfg, r.pinFile, "java1")
	t.Logf("java:\n%s", out)
	if !containsAll(out, "alias java1", "token key verified true", "session key verified true") {
		t.Errorf("Java SunPKCS11 on the virtual slot:\n%s", out)
	}
}
