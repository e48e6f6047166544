package slot_test

import (
	"bufio"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/slot"
)

// TestServedTokensOpenSideBySide: opening a token served by hsmserve (a
// connection, and the server's C_Initialize of its token, where SoftHSM
// reads every object) does not wait for another served token's opening.
// One server is stopped, so the opening of its token hangs in its
// handshake; the other token opens meanwhile. The registry used to hold
// its lock through every C_Initialize, so a process's served members were
// opened one after another, and a hung one held up the rest until its
// deadline.
func TestServedTokensOpenSideBySide(t *testing.T) {
	t.Parallel()
	hung, up := testhsm.ServeRemote(t, "side-hung"), testhsm.ServeRemote(t, "side-up")
	hungSpec := specOf(hung.Token())
	hungSpec.CommandTimeout = 30 * time.Second // the handshake's own bound (remote.DialTimeout) ends it first
	hung.Stop()
	stopped := true
	defer func() {
		if stopped {
			hung.Cont()
		}
	}()
	before := connections(t, hung.Socket())
	hungDone := make(chan error, 1)
	go func() {
		s, err := slot.Open(ctxT(t), hungSpec)
		if err == nil {
			s.Close()
		}
		hungDone <- err
	}()
	// The stopped server's kernel queues the connection: the opening is
	// now in its handshake.
	for connections(t, hung.Socket()) == before {
		select {
		case err := <-hungDone:
			t.Fatalf("Open of the stopped server's token returned before it connected: %v", err)
		case <-time.After(5 * time.Millisecond): // polling /proc/net/unix
		}
	}
	upDone := make(chan error, 1)
	go func() {
		s, err := slot.Open(ctxT(t), specOf(up.Token()))
		if err == nil {
			s.Close()
		}
		upDone <- err
	}()
	select {
	case err := <-upDone:
		if err != nil {
			t.Fatalf("Open of the served token while another server hangs: %v", err)
		}
	case err := <-hungDone:
		t.Fatalf("Open of the stopped server's token returned (%v) before the other token opened: the other waited for it", err)
	}
	hung.Cont()
	stopped = false
	if err := <-hungDone; err != nil {
		t.Fatalf("Open of the token whose server went on: %v", err)
	}
}

// connections counts the sockets bound to path (/proc/net/unix): the
// listener, and each connection to it, accepted or queued.
func connections(t *testing.T, path string) int {
	t.Helper()
	f, err := os.Open("/proc/net/unix")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.HasSuffix(sc.Text(), " "+path) {
			n++
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}
