package module

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/remote"
)

// Apache httpd will not serve as root: its prefork children run as
// nobody, and so do their helpers. The rig is handed to nobody, and each
// member is an hsmserve run as nobody (the master, root, reaches them with
// server_uid).
const nobody = 65534

const apacheConf = `ServerRoot %[1]s
DefaultRuntimeDir %[1]s
PidFile %[1]s/httpd.pid
ErrorLog %[1]s/apache-error.log
LogLevel info
Mutex file:%[1]s default
Listen 127.0.0.1:%[2]d
LoadModule mpm_prefork_module /usr/lib/apache2/modules/mod_mpm_prefork.so
LoadModule authz_core_module /usr/lib/apache2/modules/mod_authz_core.so
LoadModule dir_module /usr/lib/apache2/modules/mod_dir.so
LoadModule ssl_module /usr/lib/apache2/modules/mod_ssl.so
User #%[5]d
Group #%[5]d
ServerName localhost
StartServers 4
MinSpareServers 4
MaxSpareServers 4
ServerLimit 8
MaxRequestWorkers 8
KeepAlive Off
SSLCryptoDevice pkcs11
SSLSessionCache none
DocumentRoot %[1]s/www
DirectoryIndex index.html
<Directory %[1]s/www>
	Require all granted
</Directory>
<VirtualHost 127.0.0.1:%[2]d>
	SSLEngine on
	SSLSessionTickets off
	SSLCertificateFile %[3]s
	SSLCertificateKeyFile "%[4]s"
</VirtualHost>
`

// TestApachePrefork: Apache httpd 2.4 with the prefork MPM and mod_ssl,
// the key by pkcs11: URI through the engine, starts (its second
// configuration pass runs in a forked child) and serves 1,000 fresh TLS
// handshakes from children forked from the master, all of them, and again
// 0 fail while the primary member's hsmserve is killed and restarted.
func TestApachePrefork(t *testing.T) {
	r := newRig(t, rigOpts{})
	cert, uri := r.tlsKey()
	if err := os.MkdirAll(filepath.Join(r.dir, "www"), 0o755); err != nil {
		t.Fatal(err)
	}
	r.write("www/index.html", "ok\n")
	sockDir := filepath.Join(r.dir, "sock")
	if err := os.Mkdir(sockDir, 0o700); err != nil {
		t.Fatal(err)
	}
	hsmserve := filepath.Join(r.dir, "hsmserve")
	copyFile(t, testhsm.HSMServe(t), hsmserve, 0o755)
	giveToNobody(t, r.dir)
	for _, d := range []string{filepath.Dir(r.dir), filepath.Dir(r.lib)} {
		if err := os.Chmod(d, 0o755); err != nil { // the children reach the rig and the library
			t.Fatal(err)
		}
	}

	// Every member behind an hsmserve of nobody's, each token alone in a
	// directory of its own: the prefork children start their helpers at
	// once, and SoftHSM processes that initialise while another logs in
	// on tokens of one directory abort when two tokens read torn
	// (docs/DESIGN.md, "SoftHSM and processes that start together").
	conf, err := os.ReadFile(r.conf)
	if err != nil {
		t.Fatal(err)
	}
	cfg := string(conf)
	servers := make([]*nobodyServer, len(r.members))
	confs := make([]string, len(r.members))
	socks := make([]string, len(r.members))
	for i, m := range r.members {
		confs[i] = r.tokenAlone(m.Label)
		socks[i] = filepath.Join(sockDir, m.Name+".sock")
		local := fmt.Sprintf("  module = %q\n  token_label = %q\n", m.Module, m.Label)
		served := fmt.Sprintf("  module = %q\n  token_label = %q\n  server_uid = %d\n", remote.ModulePath(socks[i]), m.Label, nobody)
		if !strings.Contains(cfg, local) {
			t.Fatalf("the rig's configuration has no member %s as expected:\n%s", m.Name, cfg)
		}
		cfg = strings.Replace(cfg, local, served, 1)
	}
	if err := os.WriteFile(r.conf, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	giveToNobody(t, r.dir)
	for i, m := range r.members {
		servers[i] = startNobodyServer(t, hsmserve, confs[i], socks[i], m.Label)
	}
	primary := servers[0]

	port := freePort(t)
	httpdConf := r.write("httpd.conf", fmt.Sprintf(apacheConf, r.dir, port, cert, uri, nobody))
	giveToNobody(t, r.dir)
	cmd := r.startServer("/usr/sbin/apache2", "-f", httpdConf, "-DFOREGROUND")
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	errLog := filepath.Join(r.dir, "apache-error.log")
	waitListening(t, addr, cmd, errLog)

	start := time.Now()
	failed, errs := handshakes(t, addr, cert, 1000, 8, nil)
	t.Logf("1000 handshakes in %v", time.Since(start).Round(time.Millisecond))
	if failed != 0 {
		b, _ := os.ReadFile(errLog)
		t.Fatalf("%d of 1000 handshakes failed: %v\nApache error log:\n%s", failed, errs, tail(b, 30))
	}
	failed, errs = handshakes(t, addr, cert, 1000, 8, func() {
		time.Sleep(200 * time.Millisecond) // let handshakes be in flight: the kill lands mid-traffic
		primary.kill(t)
		primary = startNobodyServer(t, hsmserve, confs[0], socks[0], r.members[0].Label)
	})
	if failed != 0 {
		b, _ := os.ReadFile(errLog)
		t.Fatalf("%d of 1000 handshakes failed while member hsm-0 was killed and restarted: %v\nApache error log:\n%s", failed, errs, tail(b, 30))
	}
	if !logHas(r.haLog(), `"member":"hsm-0","event":"member_failed"`, `"program":"apache2 (pid `, `, through hapkcs11-helper)"`) {
		t.Errorf("no child's helper saw member hsm-0 fail: the kill missed the traffic\n%s", r.haLog())
	}
}

// giveToNobody makes nobody the owner of everything under dir.
func giveToNobody(t *testing.T, dir string) {
	t.Helper()
	err := filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, nobody, nobody)
	})
	if err != nil {
		t.Fatal(err)
	}
}

type nobodyServer struct{ cmd *exec.Cmd }

// startNobodyServer runs hsmserve as nobody on the token labelled label
// and waits until its socket answers.
func startNobodyServer(t *testing.T, bin, softConf, sock, label string) *nobodyServer {
	t.Helper()
	os.Remove(sock) // a killed server leaves it
	cmd := exec.Command(bin, "--module", testhsm.SoftHSMModule, "--socket", sock, "--token-label", label)
	cmd.Env = append(os.Environ(), "SOFTHSM2_CONF="+softConf)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	out := &strings.Builder{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start hsmserve as nobody: %v", err)
	}
	s := &nobodyServer{cmd: cmd}
	t.Cleanup(func() { s.kill(t) })
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(sock); err == nil {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("hsmserve as nobody did not create %s within 30 s:\n%s", sock, out)
		}
		time.Sleep(20 * time.Millisecond) // polling a path: nothing to wait on
	}
}

func (s *nobodyServer) kill(t *testing.T) {
	if s.cmd.ProcessState != nil {
		return
	}
	syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	s.cmd.Wait()
}

// tokenAlone moves the rig's token labelled label into a SoftHSM token
// directory of its own and returns that directory's configuration.
func (r *rig) tokenAlone(label string) string {
	r.t.Helper()
	tokens := filepath.Join(filepath.Dir(r.softConf), "tokens")
	dirs, err := os.ReadDir(tokens)
	if err != nil {
		r.t.Fatal(err)
	}
	// SoftHSM's token.object holds the label blank-padded to 32 bytes.
	padded := []byte(fmt.Sprintf("%-32s", label))
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(tokens, d.Name(), "token.object"))
		if err != nil || !bytes.Contains(b, padded) {
			continue
		}
		own := filepath.Join(r.dir, "tokens-"+label)
		if err := os.Mkdir(own, 0o700); err != nil {
			r.t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(tokens, d.Name()), filepath.Join(own, d.Name())); err != nil {
			r.t.Fatal(err)
		}
		return r.write("softhsm2-"+label+".conf", "directories.tokendir = "+own+"\nobjectstore.backend = file\nlog.level = ERROR\nslots.removable = false\n")
	}
	r.t.Fatalf("no token labelled %s in %s", label, tokens)
	return ""
}
