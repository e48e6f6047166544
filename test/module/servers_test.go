package module

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// The forking servers: nginx and Apache httpd load the TLS key through
// OpenSSL's pkcs11 engine (libp11) in their master process, and their
// workers, forked from it, sign every handshake: each worker's libp11
// calls C_Initialize again, and libhapkcs11.so serves it through a helper.

// tlsKey makes the rig's TLS key (EC P-256, on every member) and a
// certificate for it, and returns the certificate's PEM file and the
// key's pkcs11: URI as libp11 takes it (PIN from a file).
//
// Other keys come first, so that the handle the master got for the key
// (libp11 lists every key) is not the one a worker's helper, which has
// seen no other, would give it first: a worker works only if libp11 finds
// its key again after its C_Initialize, or if the handles agree.
func (r *rig) tlsKey() (cert, uri string) {
	r.t.Helper()
	r.keypair("other-1", "0d01")
	r.keypair("other-2", "0d02")
	r.keypair("tls", "0e01")
	cert = r.selfSigned("tls")
	uri = "pkcs11:token=" + groupLabel + ";object=tls;type=private?pin-source=" + filepath.Join(r.dir, "user.pin.raw")
	return cert, uri
}

// freePort returns a loopback TCP port no one listens on.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startServer runs a server in the foreground of its own process group
// with the rig's environment (and the engine pointed at the library) and
// stops it, and every worker, when the test ends.
func (r *rig) startServer(name string, args ...string) *exec.Cmd {
	r.t.Helper()
	return r.startServerModule(r.lib, name, args...)
}

// startServerModule is startServer with the engine pointed at module.
func (r *rig) startServerModule(module, name string, args ...string) *exec.Cmd {
	r.t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(withoutPIN(r.env), "PKCS11_MODULE_PATH="+module)
	cmd.Dir = r.dir
	log, err := os.Create(filepath.Join(r.dir, filepath.Base(name)+".out"))
	if err != nil {
		r.t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = newProcessGroup()
	if err := cmd.Start(); err != nil {
		r.t.Fatalf("start %s: %v", name, err)
	}
	r.t.Cleanup(func() {
		stopGroup(cmd)
		log.Close()
	})
	return cmd
}

// handshakes makes n fresh TLS handshakes (no session reuse) to addr, c at
// a time, each followed by one HTTP request, and returns how many failed
// and the first failures. during, when set, runs while they go.
func handshakes(t *testing.T, addr, certFile string, n, c int, during func()) (failed int64, errs []string) {
	t.Helper()
	pemBytes, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(pemBytes)
	if blk == nil {
		t.Fatal("no certificate in " + certFile)
	}
	// The certificate is self-signed: the check is that the server sent
	// it (and so signed the handshake with its key).
	cfg := &tls.Config{SessionTicketsDisabled: true, InsecureSkipVerify: true,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 || !bytes.Equal(raw[0], blk.Bytes) {
				return fmt.Errorf("the server's certificate is not the key's")
			}
			return nil
		}}
	var next atomic.Int64
	var mu sync.Mutex
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	for range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) {
				if err := oneHandshake(ctx, addr, cfg); err != nil {
					atomic.AddInt64(&failed, 1)
					mu.Lock()
					if len(errs) < 5 {
						errs = append(errs, err.Error())
					}
					mu.Unlock()
				}
			}
		}()
	}
	if during != nil {
		during()
	}
	wg.Wait()
	return failed, errs
}

func oneHandshake(ctx context.Context, addr string, cfg *tls.Config) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	d := tls.Dialer{Config: cfg}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	dl, _ := ctx.Deadline()
	conn.SetDeadline(dl)
	if _, err := io.WriteString(conn, "GET / HTTP/1.0\r\nHost: test\r\n\r\n"); err != nil {
		return err
	}
	status, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return fmt.Errorf("read the response: %w", err)
	}
	if !strings.Contains(status, " 200 ") {
		return fmt.Errorf("response %q", strings.TrimSpace(status))
	}
	return nil
}

// waitListening waits until something accepts connections on addr.
func waitListening(t *testing.T, addr string, cmd *exec.Cmd, logFile string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			return
		}
		if cmd.ProcessState != nil {
			break
		}
		time.Sleep(50 * time.Millisecond) // polling a port: nothing to wait on
	}
	b, _ := os.ReadFile(logFile)
	t.Fatalf("%s does not listen on %s within a minute:\n%s", cmd.Path, addr, b)
}

const nginxConf = `daemon off;
master_process on;
worker_processes 4;
user root;
pid %[1]s/nginx.pid;
error_log %[1]s/nginx-error.log info;
ssl_engine pkcs11;
events { worker_connections 256; }
http {
	access_log off;
	client_body_temp_path %[1]s/tmp-body;
	proxy_temp_path %[1]s/tmp-proxy;
	fastcgi_temp_path %[1]s/tmp-fastcgi;
	uwsgi_temp_path %[1]s/tmp-uwsgi;
	scgi_temp_path %[1]s/tmp-scgi;
	server {
		listen 127.0.0.1:%[2]d ssl;
		ssl_certificate %[3]s;
		ssl_certificate_key "engine:pkcs11:%[4]s";
		ssl_session_cache off;
		ssl_session_tickets off;
		keepalive_timeout 0;
		location / { return 200 "ok\n"; }
	}
}
`

// TestNginxForkedWorkers: nginx with 4 workers forked from the master that
// loaded the key through the engine serves 1,000 fresh TLS handshakes, all
// of them, and again 0 fail while the primary member's server is killed
// and restarted.
func TestNginxForkedWorkers(t *testing.T) {
	r := newRig(t, rigOpts{remote: true, allRemote: true})
	cert, uri := r.tlsKey()
	port := freePort(t)
	conf := r.write("nginx.conf", fmt.Sprintf(nginxConf, r.dir, port, cert, uri))
	cmd := r.startServer("/usr/sbin/nginx", "-p", r.dir, "-e", filepath.Join(r.dir, "nginx-error.log"), "-c", conf)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	errLog := filepath.Join(r.dir, "nginx-error.log")
	waitListening(t, addr, cmd, errLog)

	start := time.Now()
	failed, errs := handshakes(t, addr, cert, 1000, 8, nil)
	t.Logf("1000 handshakes in %v", time.Since(start).Round(time.Millisecond))
	if failed != 0 {
		b, _ := os.ReadFile(errLog)
		t.Fatalf("%d of 1000 handshakes failed: %v\nnginx error log:\n%s", failed, errs, tail(b, 30))
	}

	primary := r.remotes[0]
	failed, errs = handshakes(t, addr, cert, 1000, 8, func() {
		time.Sleep(200 * time.Millisecond) // let handshakes be in flight: the kill lands mid-traffic
		primary.Kill()
		primary.Restart(t)
	})
	if failed != 0 {
		b, _ := os.ReadFile(errLog)
		t.Fatalf("%d of 1000 handshakes failed while member hsm-0 was killed and restarted: %v\nnginx error log:\n%s", failed, errs, tail(b, 30))
	}
	// The kill landed while the workers' helpers signed: they saw the
	// member fail and went on without it.
	if !logHas(r.haLog(), `"member":"hsm-0","event":"member_failed"`, `"program":"nginx (pid `, `, through hapkcs11-helper)"`) {
		t.Errorf("no worker's helper saw member hsm-0 fail: the kill missed the traffic\n%s", r.haLog())
	}
}

// logHas reports whether one line of log holds every one of subs.
func logHas(log string, subs ...string) bool {
	for _, line := range strings.Split(log, "\n") {
		if containsAll(line, subs...) {
			return true
		}
	}
	return false
}

func tail(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func newProcessGroup() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

// stopGroup ends a server and its workers (and their helpers): SIGTERM to
// its process group, SIGKILL after 10 s.
func stopGroup(cmd *exec.Cmd) {
	pgid := cmd.Process.Pid
	syscall.Kill(-pgid, syscall.SIGTERM)
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		syscall.Kill(-pgid, syscall.SIGKILL)
		<-done
	}
}
