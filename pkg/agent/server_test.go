package agent

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// testBackend serves fixed answers; the socket layer is what is under test.
type testBackend struct {
	log *EventLog

	mu       sync.Mutex
	recovers []RecoverRequest
	reports  []peerReport
	block    chan struct{} // when set, Recover waits for it
	started  chan struct{}
	// progressN is how many progress reports Synchronize makes; syncDone,
	// when set, is closed when it has made them.
	progressN int
	syncDone  chan struct{}
}

func (b *testBackend) Status(ctx context.Context) (Status, error) {
	return Status{PID: os.Getpid(), Groups: []string{"signing"}, ConfigPath: "/etc/hagroup/hagroup.toml"}, nil
}

func (b *testBackend) Groups(ctx context.Context, group string, compareNow bool) (GroupsReport, error) {
	all := []GroupStatus{{Label: "signing", Serial: "1000001", Healthy: true,
		Members: []MemberStatus{{Name: "hsm-a", State: StateActive, Primary: true}}}}
	if group == "" {
		return GroupsReport{Groups: all}, nil
	}
	for _, g := range all {
		if g.Label == group {
			return GroupsReport{Groups: []GroupStatus{g}}, nil
		}
	}
	return GroupsReport{}, Errorf(CodeNotFound, "group %q is not configured", group)
}

func (b *testBackend) Recover(ctx context.Context, req RecoverRequest) (RecoverResult, error) {
	b.mu.Lock()
	b.recovers = append(b.recovers, req)
	block, started := b.block, b.started
	b.mu.Unlock()
	if started != nil {
		close(started)
	}
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
			return RecoverResult{}, ctx.Err()
		}
	}
	if req.Member == "ghost" {
		return RecoverResult{}, Errorf(CodeNotFound, "group %q has no member %q", req.Group, req.Member)
	}
	return RecoverResult{Group: req.Group, Members: []MemberResult{{Member: "hsm-b", OK: true, State: StateActive}}}, nil
}

func (b *testBackend) Synchronize(ctx context.Context, req SyncRequest) (SyncReport, error) {
	if req.Group == "ghost" {
		return SyncReport{}, Errorf(CodeNotFound, "group %q is not configured", req.Group)
	}
	b.mu.Lock()
	n, done := b.progressN, b.syncDone
	b.mu.Unlock()
	if fn := ProgressFrom(ctx); fn != nil {
		for i := 1; i <= n; i++ {
			fn(Progress{Done: i, Total: n, Member: "hsm-b"})
		}
	}
	if done != nil {
		close(done)
	}
	return SyncReport{Group: req.Group, Checked: req.Check, InSync: true, Applied: n}, nil
}

func (b *testBackend) Reload(ctx context.Context) (ReloadResult, error) {
	return ReloadResult{}, Errorf(CodeInvalidConfig, "/etc/hagroup/hagroup.toml:3: unknown key \"bogus\"")
}

func (b *testBackend) HALog(ctx context.Context, req HALogRequest, emit func(Event) error) error {
	return b.log.Read(ctx, req, emit)
}

// startServer runs a server on a fresh socket; it stops at test end.
func startServer(t *testing.T, p Policy) (*Client, *testBackend, string) {
	t.Helper()
	log, err := OpenEventLog(filepath.Join(t.TempDir(), "ha.log"), 0)
	if err != nil {
		t.Fatal(err)
	}
	b := &testBackend{log: log}
	sock := filepath.Join(t.TempDir(), "haagent.sock")
	ln, err := Listen(sock, ListenOptions{GID: -1})
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(b, p, "v-test", nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		log.Close()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("Run did not return 10s after its context ended")
		}
	})
	c := NewClient(sock)
	t.Cleanup(c.Close)
	return c, b, sock
}

func TestClientRoundTrip(t *testing.T) {
	c, b, sock := startServer(t, Policy{AgentUID: os.Getuid()})
	ctx := t.Context()

	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.SchemaVersion != SchemaVersion || st.Version != "v-test" || st.Access != "write" || st.PID != os.Getpid() {
		t.Errorf("status = %+v", st)
	}
	if c.ServerVersion() != "v-test" {
		t.Errorf("ServerVersion = %q", c.ServerVersion())
	}

	gr, err := c.ListGroups(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if gr.Source != SourceAgent || gr.SchemaVersion != SchemaVersion || len(gr.Groups) != 1 || gr.Groups[0].Label != "signing" {
		t.Errorf("groups = %+v", gr)
	}

	_, err = c.ListGroups(ctx, "nope")
	var ae *Error
	if !errors.As(err, &ae) || ae.Status != http.StatusNotFound || ae.Code != CodeNotFound || !strings.Contains(ae.Message, `"nope"`) {
		t.Fatalf("ListGroups(nope) = %v, want a not_found *Error naming the group", err)
	}
	if !errors.Is(err, ErrNotFound) || errors.Is(err, ErrPermissionDenied) {
		t.Errorf("errors.Is does not match by code: %v", err)
	}

	rr, err := c.Recover(ctx, RecoverRequest{Group: "signing", Member: "hsm-b"}, nil)
	if err != nil || rr.Failed() || rr.SchemaVersion != SchemaVersion {
		t.Fatalf("Recover = %+v, %v", rr, err)
	}
	if len(b.recovers) != 1 || b.recovers[0].Member != "hsm-b" {
		t.Errorf("backend saw %+v", b.recovers)
	}

	sr, err := c.Synchronize(ctx, SyncRequest{Group: "signing", Check: true}, nil)
	if err != nil || !sr.Checked || !sr.InSync {
		t.Fatalf("Synchronize(check) = %+v, %v", sr, err)
	}

	_, err = c.Reload(ctx)
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "hagroup.toml:3") {
		t.Errorf("Reload = %v, want invalid_config with file:line", err)
	}

	if _, err := os.Stat(sock); err != nil {
		t.Fatal(err)
	}
}

func TestSocketMode(t *testing.T) {
	_, _, sock := startServer(t, Policy{})
	fi, err := os.Stat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o660 {
		t.Errorf("socket mode = %v, want socket 0660", fi.Mode())
	}
}

func TestUnreachable(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "none.sock")
	_, err := NewClient(sock).Status(t.Context())
	var ue *UnreachableError
	if !errors.As(err, &ue) || !IsUnreachable(err) {
		t.Fatalf("err = %v, want *UnreachableError", err)
	}
	want := "cannot reach haagent at " + sock + ": is it running?"
	if !strings.HasPrefix(err.Error(), want) {
		t.Errorf("message %q does not start with %q", err, want)
	}
}

// rawRequest sends one hand-written HTTP request over the socket.
func rawRequest(t *testing.T, sock, req string) (*http.Response, string) {
	t.Helper()
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sb strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		sb.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return resp, sb.String()
}

func TestBrowserAndHostChecks(t *testing.T) {
	_, _, sock := startServer(t, Policy{})
	cases := []struct {
		name, req  string
		status     int
		code, text string
	}{
		{"wrong host", "GET /v1/status HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n", 400, CodeBadRequest, "wrong Host"},
		{"origin", "GET /v1/status HTTP/1.1\r\nHost: haagent.sock\r\nOrigin: http://evil.example\r\nConnection: close\r\n\r\n", 403, CodePermissionDenied, "Origin or Referer"},
		{"referer", "GET /v1/status HTTP/1.1\r\nHost: haagent.sock\r\nReferer: http://evil.example/\r\nConnection: close\r\n\r\n", 403, CodePermissionDenied, "Origin or Referer"},
		{"unknown path", "GET /v2/status HTTP/1.1\r\nHost: haagent.sock\r\nConnection: close\r\n\r\n", 404, CodeNotFound, "no such API path"},
		{"wrong method", "DELETE /v1/status HTTP/1.1\r\nHost: haagent.sock\r\nConnection: close\r\n\r\n", 405, CodeBadRequest, "not allowed"},
		{"unknown field", "POST /v1/recover HTTP/1.1\r\nHost: haagent.sock\r\nContent-Length: 29\r\nConnection: close\r\n\r\n{\"group\":\"g\",\"memberz\":\"x\"}\n", 400, CodeBadRequest, "unknown field"},
		{"trailing data", "POST /v1/recover HTTP/1.1\r\nHost: haagent.sock\r\nContent-Length: 15\r\nConnection: close\r\n\r\n{\"group\":\"g\"}{}", 400, CodeBadRequest, "trailing"},
		{"ok", "GET /v1/status HTTP/1.1\r\nHost: haagent.sock\r\nConnection: close\r\n\r\n", 200, "", `"schemaVersion":1`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := rawRequest(t, sock, tc.req)
			if resp.StatusCode != tc.status {
				t.Errorf("status %d, want %d; body %s", resp.StatusCode, tc.status, body)
			}
			if resp.Header.Get(HeaderAPI) != APIVersion {
				t.Errorf("missing %s header", HeaderAPI)
			}
			if tc.code != "" && !strings.Contains(body, `"code":"`+tc.code+`"`) {
				t.Errorf("body %s lacks code %s", body, tc.code)
			}
			if !strings.Contains(body, tc.text) {
				t.Errorf("body %s lacks %q", body, tc.text)
			}
		})
	}
}

// TestRouteAccess checks every route against every access level through
// the handler, with the decision a connection would carry.
func TestRouteAccess(t *testing.T) {
	log, _ := OpenEventLog("", 0)
	srv := NewServer(&testBackend{log: log}, Policy{}, "v", nil)
	bodies := map[string]string{
		"/v1/recover":     `{"group":"signing"}`,
		"/v1/sync/check":  `{"group":"signing","check":true}`,
		"/v1/synchronize": `{"group":"signing"}`,
		"/v1/reload":      `{}`,
		"/v1/report":      `{"program":"t","pid":1,"host":"h","started":"2026-01-01T00:00:00Z","groups":[]}`,
	}
	for _, rt := range routes {
		if !strings.HasPrefix(rt.path, "/v1/") {
			t.Errorf("route %s outside /v1/", rt.path)
		}
		for _, lvl := range []Level{LevelNone, LevelReport, LevelRead, LevelWrite} {
			t.Run(fmt.Sprintf("%s %s as %s", rt.method, rt.path, lvl), func(t *testing.T) {
				req := httptest.NewRequest(rt.method, "http://"+Host+rt.path, strings.NewReader(bodies[rt.path]))
				req = req.WithContext(WithDecision(req.Context(), Decision{Level: lvl, Reason: "test", Peer: Peer{UID: 1234, Known: true}}))
				w := httptest.NewRecorder()
				srv.ServeHTTP(w, req)
				denied := w.Code == http.StatusForbidden
				if want := lvl < rt.level; denied != want {
					t.Errorf("status %d (denied=%v), want denied=%v; body %s", w.Code, denied, want, w.Body)
				}
				if denied && !strings.Contains(w.Body.String(), "uid 1234 may not") {
					t.Errorf("denial does not say who and what: %s", w.Body)
				}
			})
		}
	}
}

func TestPolicyDecide(t *testing.T) {
	groups := func(uid int) ([]int, error) {
		if uid == 2001 {
			return []int{50, 4242}, nil
		}
		return nil, nil
	}
	cases := []struct {
		name   string
		p      Policy
		peer   Peer
		want   Level
		reason string
	}{
		{"root", Policy{AgentUID: 999}, Peer{UID: 0, Known: true}, LevelWrite, "root"},
		{"agent uid", Policy{AgentUID: 999}, Peer{UID: 999, Known: true}, LevelWrite, "agent's own uid"},
		{"allowed uid", Policy{AgentUID: 999, AllowedUIDs: []int{1000}}, Peer{UID: 1000, Known: true}, LevelWrite, "allowed_uids"},
		{"allowed group primary", Policy{AgentUID: 999, AllowedGroup: "4242", GroupIDs: groups}, Peer{UID: 2000, GID: 4242, Known: true}, LevelWrite, "allowed_group"},
		{"allowed group supplementary", Policy{AgentUID: 999, AllowedGroup: "4242", GroupIDs: groups}, Peer{UID: 2001, GID: 100, Known: true}, LevelWrite, "allowed_group"},
		{"other read-only", Policy{AgentUID: 999, OthersReadOnly: true, AllowedGroup: "4242", GroupIDs: groups}, Peer{UID: 3000, GID: 100, Known: true}, LevelRead, "read-only"},
		{"other may only report", Policy{AgentUID: 999}, Peer{UID: 3000, Known: true}, LevelReport, "may only report"},
		{"no credentials", Policy{OthersReadOnly: true}, Peer{}, LevelNone, "no peer credentials"},
		{"unknown group", Policy{AgentUID: 999, OthersReadOnly: true, AllowedGroup: "no-such-group-hagroup"}, Peer{UID: 3000, Known: true}, LevelRead, "not checked"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := tc.p.Decide(tc.peer)
			if d.Level != tc.want || !strings.Contains(d.Reason, tc.reason) {
				t.Errorf("Decide = %v (%s), want %v (…%s…)", d.Level, d.Reason, tc.want, tc.reason)
			}
		})
	}
}

func TestPeerOfRealSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "p.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := net.Dial("unix", sock)
		if err == nil {
			defer c.Close()
			c.Read(make([]byte, 1))
		}
	}()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p, err := PeerOf(c)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Known || p.UID != os.Getuid() || p.PID != os.Getpid() {
		t.Errorf("peer = %+v, want our own uid %d pid %d", p, os.Getuid(), os.Getpid())
	}
}

func TestListenNeverReplacesLiveSocket(t *testing.T) {
	_, _, sock := startServer(t, Policy{})
	_, err := Listen(sock, ListenOptions{GID: -1})
	if !errors.Is(err, ErrSocketInUse) {
		t.Fatalf("second Listen = %v, want ErrSocketInUse", err)
	}
	// The first agent still answers.
	if _, err := NewClient(sock).Status(t.Context()); err != nil {
		t.Errorf("first agent no longer answers: %v", err)
	}
}

func TestListenRemovesStaleSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "stale.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close() // a crashed agent's leftover
	if _, err := os.Stat(sock); err != nil {
		t.Fatal(err)
	}
	ln, err := Listen(sock, ListenOptions{GID: -1})
	if err != nil {
		t.Fatalf("Listen over stale socket: %v", err)
	}
	ln.Close()
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket not removed on Close: %v", err)
	}
}

func TestListenRefusesNonSocket(t *testing.T) {
	p := filepath.Join(t.TempDir(), "file")
	os.WriteFile(p, []byte("keep me"), 0o600)
	if _, err := Listen(p, ListenOptions{GID: -1}); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("Listen on a regular file = %v", err)
	}
	if b, _ := os.ReadFile(p); string(b) != "keep me" {
		t.Errorf("file changed to %q", b)
	}
}

// TestDrain: ending Run's context lets an in-flight request finish, ends a
// follow stream, and Run returns nil.
func TestDrain(t *testing.T) {
	log, _ := OpenEventLog("", 0)
	b := &testBackend{log: log, block: make(chan struct{}), started: make(chan struct{})}
	sock := filepath.Join(t.TempDir(), "d.sock")
	ln, err := Listen(sock, ListenOptions{GID: -1})
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(b, Policy{AgentUID: os.Getuid()}, "v", nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, ln) }()
	c := NewClient(sock)

	followEnded := make(chan error, 1)
	opened := make(chan struct{})
	go func() {
		followEnded <- c.HALog(context.Background(), HALogRequest{Follow: true}, func(e Event) error {
			if e.Event == "opened" {
				close(opened)
			}
			return nil
		})
	}()
	log.Append(Event{Group: "g", Event: "opened"})
	<-opened

	recDone := make(chan error, 1)
	go func() {
		_, err := c.Recover(context.Background(), RecoverRequest{Group: "g"}, nil)
		recDone <- err
	}()
	<-b.started
	cancel()
	select {
	case err := <-followEnded:
		if err != nil {
			t.Errorf("follow ended with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("follow stream did not end on shutdown")
	}
	select {
	case <-done:
		t.Fatal("Run returned while a request was in flight")
	default:
	}
	close(b.block)
	if err := <-recDone; err != nil {
		t.Errorf("in-flight recover failed during drain: %v", err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after draining")
	}
}

// TestClientComparesAPIVersion: an agent speaking another API version is
// reported as such, not misread.
func TestClientComparesAPIVersion(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "v.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(HeaderAPI, "2")
		w.Write([]byte(`{}`))
	})}
	go srv.Serve(ln)
	defer srv.Close()
	_, err = NewClient(sock).Status(t.Context())
	var ve *VersionError
	if !errors.As(err, &ve) || ve.Server != "2" || ve.Client != APIVersion {
		t.Fatalf("err = %v, want *VersionError", err)
	}
}

// A synchronisation asked with progress streams the counts and then the
// report; the last count always arrives; a reader that does not read
// never holds the work up; an error arrives as a typed error.
func TestProgressStream(t *testing.T) {
	c, b, _ := startServer(t, Policy{AgentUID: os.Getuid()})
	ctx := t.Context()
	const n = 5000
	done := make(chan struct{})
	b.mu.Lock()
	b.progressN, b.syncDone = n, done
	b.mu.Unlock()

	release := make(chan struct{})
	var got []Progress
	rep, err := c.Synchronize(ctx, SyncRequest{Group: "signing"}, func(p Progress) {
		if len(got) == 0 {
			// The reader stalls on its first line: the work must
			// still finish.
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Error("the work was held up by a reader that did not read")
			}
			close(release)
		}
		got = append(got, p)
	})
	if err != nil {
		t.Fatal(err)
	}
	<-release
	if rep.Group != "signing" || rep.Applied != n || rep.SchemaVersion != SchemaVersion {
		t.Errorf("report %+v", rep)
	}
	if len(got) == 0 || got[len(got)-1] != (Progress{Done: n, Total: n, Member: "hsm-b"}) {
		t.Fatalf("last progress %v, want %d of %d on hsm-b", got[len(got)-1:], n, n)
	}
	for i := 1; i < len(got); i++ {
		if got[i].Done <= got[i-1].Done {
			t.Fatalf("progress went back: %v then %v", got[i-1], got[i])
		}
	}

	_, err = c.Synchronize(ctx, SyncRequest{Group: "ghost"}, func(Progress) {})
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), `group "ghost" is not configured`) {
		t.Errorf("error through the stream: %v", err)
	}
}
