package security

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/remote"
	"github.com/miekg/pkcs11"
)

// hsmserveNobody is the uid and gid of the other local user (setpriv).
const hsmserveNobody = 65534

// hsmserveImpostorScript binds a Unix socket at argv[1] (mode 0777, so
// that anyone may connect), says "ready", and records what each client
// sends (one read, until data or EOF) until its stdin closes; then it
// prints the connections, the bytes and the bytes in hex.
const hsmserveImpostorScript = `
import os, select, socket, sys
path = sys.argv[1]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(path)
os.chmod(path, 0o777)
s.listen(64)
print("ready", flush=True)
conns, got = 0, b""
while True:
    r, _, _ = select.select([s, sys.stdin], [], [])
    if sys.stdin in r:
        break
    c, _ = s.accept()
    conns += 1
    c.settimeout(20)
    try:
        got += c.recv(65536)
    except socket.timeout:
        pass
    c.close()
print(conns, len(got), got.hex(), flush=True)
`

// hsmserveImpostor is a process of another user bound at a member's
// socket path.
type hsmserveImpostor struct {
	sock  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
}

// hsmserveStartImpostor runs the impostor as uid 65534 on sock and waits
// until it listens.
func hsmserveStartImpostor(t *testing.T, sock string) *hsmserveImpostor {
	t.Helper()
	cmd := exec.Command("setpriv", "--reuid="+strconv.Itoa(hsmserveNobody), "--regid="+strconv.Itoa(hsmserveNobody),
		"--clear-groups", "/usr/bin/python3", "-c", hsmserveImpostorScript, sock)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the impostor: %v", err)
	}
	im := &hsmserveImpostor{sock: sock, cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout)}
	t.Cleanup(func() { im.stdin.Close(); cmd.Process.Kill(); cmd.Wait() })
	line, err := hsmserveReadLine(im.out, 20*time.Second)
	if err != nil || line != "ready" {
		t.Fatalf("impostor did not start: %q, %v", line, err)
	}
	return im
}

// received stops the impostor and returns how many connections it saw and
// the bytes they sent.
func (im *hsmserveImpostor) received(t *testing.T) (conns int, got []byte) {
	t.Helper()
	im.stdin.Close()
	line, err := hsmserveReadLine(im.out, 30*time.Second)
	if err != nil {
		t.Fatalf("impostor's report: %v", err)
	}
	var n int
	var hx string
	if _, err := fmt.Sscan(line, &conns, &n); err != nil {
		t.Fatalf("impostor's report %q: %v", line, err)
	}
	if f := strings.Fields(line); len(f) == 3 {
		hx = f[2]
	}
	got, err = hex.DecodeString(hx)
	if err != nil || len(got) != n {
		t.Fatalf("impostor's report %q: %d bytes, %v", line, len(got), err)
	}
	return conns, got
}

// hsmserveReadLine reads one line within d.
func hsmserveReadLine(r *bufio.Reader, d time.Duration) (string, error) {
	type res struct {
		s   string
		err error
	}
	ch := make(chan res, 1)
	go func() { s, err := r.ReadString('\n'); ch <- res{strings.TrimSpace(s), err} }()
	select {
	case x := <-ch:
		return x.s, x.err
	case <-time.After(d):
		return "", fmt.Errorf("no line within %v", d)
	}
}

// hsmserveSharedDir makes a directory with mode perm (0o1777: like /tmp)
// that uid 65534 can reach, removed when the test ends.
func hsmserveSharedDir(t *testing.T, perm os.FileMode) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "hsmsrv-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, perm); err != nil {
		t.Fatal(err)
	}
	return dir
}

// hsmserveConnect returns an initialised client of srv and a fresh
// session on its one slot.
func hsmserveConnect(t *testing.T, srv *testhsm.Served) (*remote.Client, pkcs11.SessionHandle) {
	t.Helper()
	c, err := remote.NewClient(srv.Token().Module, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Initialize(); err != nil {
		t.Fatalf("connect to %s: %v", srv.Socket(), err)
	}
	t.Cleanup(func() { c.Finalize() })
	ids, err := c.GetSlotList(true)
	if err != nil || len(ids) != 1 {
		t.Fatalf("GetSlotList: %v, %v", ids, err)
	}
	sh, err := c.OpenSession(ids[0], pkcs11.CKF_SERIAL_SESSION|pkcs11.CKF_RW_SESSION)
	if err != nil {
		t.Fatalf("OpenSession: %v", err)
	}
	return c, sh
}

// hsmserveFrame is one frame of the protocol as an attacker writes it.
func hsmserveFrame(body []byte) []byte {
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)
}

func hsmserveUvarints(vs ...uint64) []byte {
	var b []byte
	for _, v := range vs {
		b = binary.AppendUvarint(b, v)
	}
	return b
}

// hsmserveGetInfo is the body of request id C_GetInfo (op 1), which takes
// no argument.
func hsmserveGetInfo(id uint64) []byte {
	return hsmserveUvarints(id, 1)
}

// hsmserveDialRaw connects to sock and does the handshake by hand.
func hsmserveDialRaw(t *testing.T, sock string) net.Conn {
	t.Helper()
	nc, err := net.DialTimeout("unix", sock, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	hello := append(hsmserveUvarints(uint64(len("hagroup-remote"))), "hagroup-remote"...)
	hello = append(hello, hsmserveUvarints(remote.ProtocolVersion)...)
	nc.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := nc.Write(hsmserveFrame(hello)); err != nil {
		t.Fatal(err)
	}
	var h [4]byte
	if _, err := io.ReadFull(nc, h[:]); err != nil {
		t.Fatalf("read welcome: %v", err)
	}
	w := make([]byte, binary.BigEndian.Uint32(h[:]))
	if _, err := io.ReadFull(nc, w); err != nil || !bytes.Equal(w, hsmserveUvarints(remote.ProtocolVersion, 0)) {
		t.Fatalf("welcome %x, %v: want version %d, no error", w, err, remote.ProtocolVersion)
	}
	nc.SetDeadline(time.Time{})
	return nc
}

// hsmserveRSS returns the resident set (VmRSS, bytes) of pid and of each
// of its children, by pid.
func hsmserveRSS(t *testing.T, pid int) map[int]int64 {
	t.Helper()
	out := map[int]int64{pid: hsmserveVmRSS(t, pid)}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // gone
		}
		// pid (comm) state ppid …; comm may hold spaces and parentheses.
		rest := stat[bytes.LastIndexByte(stat, ')')+1:]
		f := strings.Fields(string(rest))
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			if rss := hsmserveVmRSS(t, child); rss >= 0 {
				out[child] = rss
			}
		}
	}
	return out
}

// hsmserveVmRSS reads VmRSS of pid; -1 when the process is gone.
func hsmserveVmRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("VmRSS of %d: %q", pid, l)
			}
			return kb << 10
		}
	}
	return -1 // a zombie has none
}

// hsmserveCtx is bounded by the test and 60 s.
func hsmserveCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}
