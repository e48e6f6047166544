package conformance

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"golang.org/x/sys/unix"
)

// clientDeadline bounds one client command: a command that a member's
// death holds up waits command_timeout (10 s) per member it tries.
const clientDeadline = 90 * time.Second

// keyFile is one object imported into every world, so that every world
// holds the same keys and the clients' outputs (public keys, RSA
// signatures, fingerprints) compare byte for byte.
type keyFile struct {
	label, id string
	kind      string // pkcs11-tool --type
	name      string // file name in the material directory
}

var (
	materialOnce sync.Once
	materialDir  string
	materialErr  error
	keyFiles     = []keyFile{
		{"ec1", "01", "privkey", "ec1.key.pem"},
		{"ec1", "01", "pubkey", "ec1.pub.der"},
		{"ec1", "01", "cert", "ec1.crt.der"},
		{"rsa1", "02", "privkey", "rsa1.key.pem"},
		{"rsa1", "02", "pubkey", "rsa1.pub.der"},
		{"rsa1", "02", "cert", "rsa1.crt.der"},
	}
)

// material makes the key pairs and self-signed certificates once per
// test binary.
func material(t *testing.T) string {
	t.Helper()
	materialOnce.Do(func() {
		materialDir = filepath.Join(workDir, "material")
		materialErr = makeMaterial(materialDir)
	})
	if materialErr != nil {
		t.Fatalf("client key material: %v", materialErr)
	}
	return materialDir
}

func makeMaterial(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	rk, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	for _, k := range []struct {
		label string
		key   crypto.Signer
	}{{"ec1", ec}, {"rsa1", rk}} {
		if err := writeKeyFiles(dir, k.label, k.key); err != nil {
			return fmt.Errorf("%s: %w", k.label, err)
		}
	}
	return nil
}

func writeKeyFiles(dir, label string, key crypto.Signer) error {
	priv, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "hagroup client " + label},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
	crt, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return err
	}
	files := map[string][]byte{
		label + ".key.pem": pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: priv}),
		label + ".pub.der": pub,
		label + ".crt.der": crt,
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// clientWorld is a world prepared for real clients: the same keys and
// certificates imported, the PIN where each client reads it (never on a
// command line), an NSS database with the module added, and a SunPKCS11
// configuration.
type clientWorld struct {
	*world
	env    []string // the world's, plus the clients' PIN sources
	rawPIN string   // libp11's pin-source: the PIN byte for byte
	nssDB  string
	nssPW  string // certutil -f: the token's PIN
	javaCf string
}

func newClientWorld(t *testing.T, name string, members int, served bool) *clientWorld {
	t.Helper()
	c := &clientWorld{world: newWorld(t, name, members, served)}
	c.env = append(c.world.env,
		"HA_PIN="+testhsm.UserPIN,      // pkcs11-tool --pin env:HA_PIN
		"GNUTLS_PIN="+testhsm.UserPIN,  // p11tool
		"PKCS11_MODULE_PATH="+c.module, // OpenSSL's pkcs11 engine
	)
	c.rawPIN = c.write("user.pin.raw", testhsm.UserPIN)
	c.nssPW = c.rawPIN
	c.importKeys("rsa1")
	c.nssDB = filepath.Join(c.dir, "nssdb")
	if err := os.Mkdir(c.nssDB, 0o700); err != nil {
		t.Fatal(err)
	}
	c.mustRun("certutil", "-N", "-d", "sql:"+c.nssDB, "--empty-password")
	c.mustRun("modutil", "-force", "-dbdir", "sql:"+c.nssDB, "-add", "token", "-libfile", c.module)
	// slotListIndex, not slot: the first slot is the token on both (the
	// bare token lists its empty slot last, the group lists only its
	// virtual slot), and slot ids differ.
	c.javaCf = c.write("sunpkcs11.cfg", "name = conform\nlibrary = "+c.module+"\nslotListIndex = 0\n")
	return c
}

// importKeys imports the objects labelled object from the material.
func (c *clientWorld) importKeys(object string) {
	c.t.Helper()
	mat := material(c.t)
	for _, k := range keyFiles {
		if k.label != object {
			continue
		}
		c.mustRun("pkcs11-tool", "--module", c.module, "--token-label", label, "--login", "--pin", "env:HA_PIN",
			"--write-object", filepath.Join(mat, k.name), "--type", k.kind, "--id", k.id, "--label", k.label)
	}
}

// outcome is what one client command did: its exit status and its
// output, stdout then stderr.
type outcome struct {
	exit int
	out  string
}

func (o outcome) String() string { return fmt.Sprintf("exit %d\n%s", o.exit, o.out) }

// run runs one client command in the world's directory and environment.
func (c *clientWorld) run(argv ...string) outcome {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(c.t.Context(), clientDeadline)
	defer cancel()
	return c.wait(ctx, c.start(ctx, argv, ""))
}

// start starts argv; wait collects it. Apart, so that a member can be
// killed while a command runs: p.seen is closed once stdout shows marker
// (never for "").
func (c *clientWorld) start(ctx context.Context, argv []string, marker string) *clientProc {
	c.t.Helper()
	p := &clientProc{cmd: exec.CommandContext(ctx, argv[0], argv[1:]...)}
	p.stdout.marker, p.stdout.seen = marker, make(chan struct{})
	p.cmd.Dir, p.cmd.Env = c.dir, c.env
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	if err := p.cmd.Start(); err != nil {
		c.t.Fatalf("%s: %v", argv[0], err)
	}
	return p
}

type clientProc struct {
	cmd    *exec.Cmd
	stdout watchBuffer
	stderr syncBuffer
}

// watchBuffer is a client's stdout, which says when it shows marker.
type watchBuffer struct {
	syncBuffer
	marker string
	seen   chan struct{}
	once   sync.Once
}

func (b *watchBuffer) Write(p []byte) (int, error) {
	n, err := b.syncBuffer.Write(p)
	if b.marker != "" && strings.Contains(b.String(), b.marker) {
		b.once.Do(func() { close(b.seen) })
	}
	return n, err
}

func (c *clientWorld) wait(ctx context.Context, p *clientProc) outcome {
	c.t.Helper()
	err := p.cmd.Wait()
	if ctx.Err() != nil {
		c.t.Fatalf("%s: %v: %v\n%s%s", c.name, p.cmd.Args, ctx.Err(), p.stdout.String(), p.stderr.String())
	}
	o := outcome{out: p.stdout.String() + p.stderr.String()}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		o.exit = ee.ExitCode()
	} else if err != nil {
		c.t.Fatalf("%s: %v: %v", c.name, p.cmd.Args, err)
	}
	return o
}

func (c *clientWorld) mustRun(argv ...string) string {
	c.t.Helper()
	o := c.run(argv...)
	if o.exit != 0 {
		c.t.Fatalf("%s: %v: %s", c.name, argv, o)
	}
	return o.out
}

// rewrite is one rule of the normaliser: what legitimately differs
// between the bare token and the virtual slot, applied to both outputs.
type rewrite struct {
	re   *regexp.Regexp
	with string
	fn   func(string) string // instead of re, for what a regexp cannot say
	// design is the docs/DESIGN.md entry ("Differences from the member
	// token") that allows it; "" for what differs between any two fresh
	// SoftHSM tokens (slot ids, serials, object order).
	design string
}

func rewriteRule(re, with, design string) rewrite {
	return rewrite{re: regexp.MustCompile(re), with: with, design: design}
}

func (r rewrite) apply(s string) string {
	if r.fn != nil {
		return r.fn(s)
	}
	return r.re.ReplaceAllString(s, r.with)
}

// normalise applies every rule to an output.
func normalise(rules []rewrite, s string) string {
	for _, r := range rules {
		s = r.apply(s)
	}
	return strings.TrimSpace(s)
}

// sortBlocks sorts each run of blocks that begin at a line matching
// start; a block ends at the next such line or at a command line ("$ ").
func sortBlocks(start string) func(string) string {
	re := regexp.MustCompile(start)
	return func(s string) string {
		var out, run []string
		cur := -1 // index in run of the open block
		flush := func() {
			// A block compares without the blank lines after it, which
			// the last one of a command lacks.
			for i := range run {
				run[i] = strings.TrimRight(run[i], "\n") + "\n"
			}
			sort.Strings(run)
			out = append(out, run...)
			run, cur = nil, -1
		}
		for _, l := range strings.SplitAfter(s, "\n") {
			switch {
			case re.MatchString(strings.TrimSuffix(l, "\n")):
				run = append(run, l)
				cur = len(run) - 1
			case strings.HasPrefix(l, "$ "):
				flush()
				out = append(out, l)
			case cur >= 0:
				run[cur] += l
			default:
				out = append(out, l)
			}
		}
		flush()
		return strings.Join(out, "")
	}
}

// dropBlocks removes the blocks that begin at a line matching start and
// contain marker, ending at the next line matching start or a blank line.
func dropBlocks(start, marker string) func(string) string {
	re := regexp.MustCompile(start)
	return func(s string) string {
		var out []string
		var block []string
		end := func() {
			if !strings.Contains(strings.Join(block, ""), marker) {
				out = append(out, block...)
			}
			block = nil
		}
		for _, l := range strings.SplitAfter(s, "\n") {
			switch {
			case re.MatchString(strings.TrimSuffix(l, "\n")):
				end()
				block = []string{l}
			case block != nil && strings.TrimSpace(l) == "":
				block = append(block, l)
				end()
			case block != nil:
				block = append(block, l)
			default:
				out = append(out, l)
			}
		}
		end()
		return strings.Join(out, "")
	}
}

// setPolicy sets the group's load-balancing policy in the world's
// configuration (each client process reads it when it starts).
func (c *clientWorld) setPolicy(policy string) {
	c.t.Helper()
	p := filepath.Join(c.dir, "hagroup.toml")
	b, err := os.ReadFile(p)
	if err != nil {
		c.t.Fatal(err)
	}
	conf := strings.Replace(string(b), "[ha]\n", "[ha]\npolicy = \""+policy+"\"\n", 1)
	if err := os.WriteFile(p, []byte(conf), 0o600); err != nil {
		c.t.Fatal(err)
	}
}

// rsaSignature is the signature the token's rsa1 key makes of data with
// CKM_SHA256_RSA_PKCS (deterministic), made in software from the material.
func rsaSignature(t *testing.T, data []byte) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(material(t), "rsa1.key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatal("rsa1.key.pem: no PEM block")
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	sig, err := rsa.SignPKCS1v15(nil, k.(*rsa.PrivateKey), crypto.SHA256, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	return sig
}

// openFIFO opens fifo for writing once its reader has opened it.
func openFIFO(ctx context.Context, t *testing.T, fifo string) *os.File {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0)
		if err == nil {
			return f
		}
		if !errors.Is(err, syscall.ENXIO) { // ENXIO: no reader yet
			t.Fatal(err)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: no reader opened it: %v", fifo, ctx.Err())
		case <-tick.C:
		}
	}
}

// waitBlockedReading waits until process pid has read everything written
// to w and its main thread waits in read(2) for more.
func waitBlockedReading(ctx context.Context, t *testing.T, pid int, w *os.File) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		wchan, err := os.ReadFile(fmt.Sprintf("/proc/%d/wchan", pid))
		if err != nil {
			t.Fatalf("process %d: %v", pid, err)
		}
		unread, err := unix.IoctlGetInt(int(w.Fd()), unix.TIOCINQ) // FIONREAD
		if err != nil {
			t.Fatal(err)
		}
		if unread == 0 && strings.Contains(string(wchan), "pipe_read") {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("process %d never waited for more input (%d bytes unread, in %q): %v", pid, unread, wchan, ctx.Err())
		case <-tick.C:
		}
	}
}
