package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Backend is what the server serves: the running engine of every group.
// haagent's daemon implements it. Methods are called concurrently. An
// error that is an *Error crosses the wire with its code; any other error
// becomes code "internal".
type Backend interface {
	Status(ctx context.Context) (Status, error)
	// Groups reports every group, or the one labelled group; compareNow
	// asks for the members compared for this request rather than the last
	// comparison.
	Groups(ctx context.Context, group string, compareNow bool) (GroupsReport, error)
	Recover(ctx context.Context, req RecoverRequest) (RecoverResult, error)
	Synchronize(ctx context.Context, req SyncRequest) (SyncReport, error)
	Reload(ctx context.Context) (ReloadResult, error)
	// HALog calls emit for each selected event, oldest first; with
	// req.Follow it then waits for new events until ctx ends.
	HALog(ctx context.Context, req HALogRequest, emit func(Event) error) error
	FleetBackend
}

// maxBody bounds a request body. Every request this API takes is tiny.
const maxBody = 64 << 10

// route is one entry of the route table: the access it needs is declared
// here, next to the path, and enforced in one place (ServeHTTP).
type route struct {
	method string
	path   string
	level  Level
	serve  func(s *Server, w http.ResponseWriter, r *http.Request) (any, error)
}

// routes is the whole API.
var routes = []route{
	{http.MethodGet, "/v1/status", LevelRead, (*Server).serveStatus},
	{http.MethodGet, "/v1/groups", LevelRead, (*Server).serveGroups},
	{http.MethodPost, "/v1/recover", LevelWrite, (*Server).serveRecover},
	{http.MethodPost, "/v1/sync/check", LevelRead, (*Server).serveSyncCheck},
	{http.MethodPost, "/v1/synchronize", LevelWrite, (*Server).serveSynchronize},
	{http.MethodPost, "/v1/reload", LevelWrite, (*Server).serveReload},
	{http.MethodGet, "/v1/halog", LevelRead, (*Server).serveHALog},
	{http.MethodPost, ReportPath, LevelReport, (*Server).serveReport},
	{http.MethodGet, "/v1/clients", LevelRead, (*Server).serveClients},
}

// Server serves a Backend on a listener. Create it with NewServer; it is
// safe for concurrent use.
type Server struct {
	backend Backend
	logger  *slog.Logger
	version string
	policy  atomic.Pointer[Policy]

	// DrainTimeout bounds how long Run waits for in-flight requests when
	// its context ends (default 30s). Streams (halog --follow) end at once.
	DrainTimeout time.Duration

	stopOnce sync.Once
	stop     chan struct{} // closed when draining starts: ends streams
}

// NewServer returns a server for b. version is the agent's build version,
// sent in every response. logger receives one line per connection (the
// access decision and its reason) and one per failed request.
func NewServer(b Backend, p Policy, version string, logger *slog.Logger) *Server {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{backend: b, logger: logger, version: version, stop: make(chan struct{})}
	s.policy.Store(&p)
	return s
}

// SetPolicy replaces the access policy; connections made afterwards use it
// (a connection's decision never changes once made).
func (s *Server) SetPolicy(p Policy) { s.policy.Store(&p) }

type decisionKey struct{}

// WithDecision returns ctx carrying an access decision, as the server's
// ConnContext does for every connection. Exported for fuzzing and for
// callers that serve the Handler over their own transport.
func WithDecision(ctx context.Context, d Decision) context.Context {
	return context.WithValue(ctx, decisionKey{}, d)
}

func decisionOf(ctx context.Context) Decision {
	d, _ := ctx.Value(decisionKey{}).(Decision)
	return d
}

// connContext decides, once, what the new connection may do.
func (s *Server) connContext(ctx context.Context, c net.Conn) context.Context {
	peer, err := PeerOf(c)
	d := s.policy.Load().Decide(peer)
	if err != nil {
		d.Reason += ": " + err.Error()
	}
	s.logger.Info("connection", "uid", peer.UID, "gid", peer.GID, "pid", peer.PID,
		"access", d.Level.String(), "reason", d.Reason)
	return WithDecision(ctx, d)
}

// Run serves on ln until ctx ends, then stops accepting, ends streams,
// waits up to DrainTimeout for in-flight requests and returns nil. It
// closes ln. A listener failure is returned.
func (s *Server) Run(ctx context.Context, ln net.Listener) error {
	hs := &http.Server{
		Handler:           s,
		ConnContext:       s.connContext,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(s.logger.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serving on %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	s.stopOnce.Do(func() { close(s.stop) })
	d := s.DrainTimeout
	if d <= 0 {
		d = 30 * time.Second
	}
	dctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if err := hs.Shutdown(dctx); err != nil {
		hs.Close()
		return fmt.Errorf("draining requests: %w", err)
	}
	<-errc
	return nil
}

// ServeHTTP checks Host, browser headers, the route and its access, then
// serves the route.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set(HeaderAPI, APIVersion)
	w.Header().Set(HeaderVersion, s.version)
	if r.Host != Host {
		s.fail(w, r, Errorf(CodeBadRequest, "wrong Host %q: this socket serves only hactl (Host %q)", r.Host, Host))
		return
	}
	if r.Header.Get("Origin") != "" || r.Header.Get("Referer") != "" {
		s.fail(w, r, Errorf(CodePermissionDenied, "requests carrying Origin or Referer are refused: the agent API is not for browsers"))
		return
	}
	var rt *route
	pathKnown := false
	for i := range routes {
		if routes[i].path == r.URL.Path {
			pathKnown = true
			if routes[i].method == r.Method {
				rt = &routes[i]
				break
			}
		}
	}
	if rt == nil {
		if pathKnown {
			w.Header().Set("Allow", allowed(r.URL.Path))
			e := Errorf(CodeBadRequest, "method %s not allowed on %s", r.Method, r.URL.Path)
			e.Status = http.StatusMethodNotAllowed
			s.fail(w, r, e)
			return
		}
		s.fail(w, r, Errorf(CodeNotFound, "no such API path %s (this agent speaks API version %s)", r.URL.Path, APIVersion))
		return
	}
	d := decisionOf(r.Context())
	if rt.level >= LevelWrite {
		aw := &auditWriter{ResponseWriter: w}
		defer s.audit(r, d, d.Level < rt.level, aw, time.Now())
		w = aw
	}
	if d.Level < rt.level {
		who := "this connection"
		if d.Peer.Known {
			who = "uid " + strconv.Itoa(d.Peer.UID)
		}
		s.fail(w, r, Errorf(CodePermissionDenied, "%s may not %s %s: it needs %s access, has %s (%s)",
			who, r.Method, r.URL.Path, rt.level, d.Level, d.Reason))
		return
	}
	v, err := rt.serve(s, w, r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if v == nil { // the route wrote its own (streamed) answer
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

// auditWriter remembers the status a write route answered with.
type auditWriter struct {
	http.ResponseWriter
	status int
}

func (a *auditWriter) WriteHeader(code int) {
	if a.status == 0 {
		a.status = code
	}
	a.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (a *auditWriter) Unwrap() http.ResponseWriter { return a.ResponseWriter }

func (a *auditWriter) Write(b []byte) (int, error) {
	if a.status == 0 {
		a.status = http.StatusOK
	}
	return a.ResponseWriter.Write(b)
}

// audit logs one line per request to a write route, after its answer:
// who asked (from the connection's SO_PEERCRED), which route, and whether
// it was refused, failed or done. It goes to the agent's own log (the
// journal under systemd), not the HA event log that read-only users read.
func (s *Server) audit(r *http.Request, d Decision, refused bool, aw *auditWriter, start time.Time) {
	outcome := "ok"
	switch {
	case refused:
		outcome = "refused"
	case aw.status >= 400:
		outcome = "failed"
	}
	uid := "unknown"
	if d.Peer.Known {
		uid = strconv.Itoa(d.Peer.UID)
	}
	s.logger.Info("audit", "uid", uid, "gid", d.Peer.GID, "pid", d.Peer.PID, "access", d.Level.String(),
		"route", r.Method+" "+r.URL.Path, "outcome", outcome, "status", aw.status, "reason", d.Reason,
		"duration", time.Since(start).Round(time.Millisecond))
}

func allowed(path string) string {
	var out string
	for _, rt := range routes {
		if rt.path == path {
			if out != "" {
				out += ", "
			}
			out += rt.method
		}
	}
	return out
}

// fail writes err as {error, code} with its HTTP status.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	e := s.errorOf(r, err)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.Status)
	json.NewEncoder(w).Encode(ErrorBody{Error: e.Message, Code: e.Code})
}

// errorOf makes err an *Error with its status set, and logs it.
func (s *Server) errorOf(r *http.Request, err error) *Error {
	var e *Error
	if !errors.As(err, &e) {
		code := CodeInternal
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			code = CodeUnavailable
		}
		e = Errorf(code, "%s", err.Error())
	}
	out := *e
	if out.Status == 0 {
		out.Status = statusOf(out.Code)
	}
	level := slog.LevelInfo
	if out.Status >= 500 {
		level = slog.LevelWarn
	}
	s.logger.Log(r.Context(), level, "request failed", "method", r.Method, "path", r.URL.Path,
		"status", out.Status, "code", out.Code, "error", out.Message)
	return &out
}

// DecodeBody decodes a request body strictly: one JSON object of type T,
// no unknown fields, no trailing data, at most 64 KiB.
func DecodeBody[T any](body io.Reader) (T, error) { return decodeBodyLimit[T](body, maxBody) }

func decodeBodyLimit[T any](body io.Reader, maxBody int64) (T, error) {
	var v T
	dec := json.NewDecoder(io.LimitReader(body, maxBody+1))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		return v, Errorf(CodeBadRequest, "bad request body: %v", err)
	}
	if dec.InputOffset() > maxBody {
		return v, Errorf(CodeBadRequest, "request body larger than %d bytes", maxBody)
	}
	if _, err := dec.Token(); err != io.EOF {
		return v, Errorf(CodeBadRequest, "bad request body: trailing data after the JSON object")
	}
	return v, nil
}

// ParseHALogQuery reads a halog request from URL query values
// (since=DURATION, group=LABEL, follow=true).
func ParseHALogQuery(q map[string][]string) (HALogRequest, error) {
	var req HALogRequest
	get := func(k string) string {
		if v := q[k]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	for k, v := range q {
		switch k {
		case "since", "group", "follow":
			if len(v) != 1 {
				return req, Errorf(CodeBadRequest, "query parameter %q given %d times", k, len(v))
			}
		default:
			return req, Errorf(CodeBadRequest, "unknown query parameter %q", k)
		}
	}
	if s := get("since"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d < 0 {
			return req, Errorf(CodeBadRequest, "since=%q: want a positive duration such as 90m", s)
		}
		req.Since = d
	}
	req.Group = get("group")
	if f := get("follow"); f != "" {
		b, err := strconv.ParseBool(f)
		if err != nil {
			return req, Errorf(CodeBadRequest, "follow=%q: want true or false", f)
		}
		req.Follow = b
	}
	return req, nil
}

// groupsQuery reads listgroups' query: group=LABEL and compare=now, each
// at most once.
func groupsQuery(r *http.Request) (group string, compareNow bool, err error) {
	q := r.URL.Query()
	for k, v := range q {
		switch {
		case len(v) != 1 || (k != "group" && k != "compare"):
			return "", false, Errorf(CodeBadRequest, "bad query parameter %q: only group=LABEL and compare=now are taken", k)
		case k == "compare" && v[0] != "now":
			return "", false, Errorf(CodeBadRequest, "bad query parameter compare=%q: only compare=now is taken", v[0])
		}
	}
	return q.Get("group"), q.Has("compare"), nil
}

func (s *Server) serveStatus(w http.ResponseWriter, r *http.Request) (any, error) {
	st, err := s.backend.Status(r.Context())
	if err != nil {
		return nil, err
	}
	st.SchemaVersion = SchemaVersion
	st.APIVersion = APIVersion
	st.Version = s.version
	st.Access = decisionOf(r.Context()).Level.String()
	return st, nil
}

func (s *Server) serveGroups(w http.ResponseWriter, r *http.Request) (any, error) {
	g, now, err := groupsQuery(r)
	if err != nil {
		return nil, err
	}
	res, err := s.backend.Groups(r.Context(), g, now)
	if err != nil {
		return nil, err
	}
	res.SchemaVersion = SchemaVersion
	res.Source = SourceAgent
	return res, nil
}

func (s *Server) serveRecover(w http.ResponseWriter, r *http.Request) (any, error) {
	req, err := DecodeBody[RecoverRequest](r.Body)
	if err != nil {
		return nil, err
	}
	if req.Group == "" {
		return nil, Errorf(CodeBadRequest, "recover: group is required")
	}
	recoverIt := func(ctx context.Context) (any, error) {
		res, err := s.backend.Recover(ctx, req)
		if err != nil {
			return nil, err
		}
		res.SchemaVersion = SchemaVersion
		return res, nil
	}
	if req.Progress {
		s.serveWithProgress(w, r, recoverIt)
		return nil, nil
	}
	return recoverIt(r.Context())
}

func (s *Server) serveSyncCheck(w http.ResponseWriter, r *http.Request) (any, error) {
	req, err := DecodeBody[SyncRequest](r.Body)
	if err != nil {
		return nil, err
	}
	if !req.Check || req.Prune {
		return nil, Errorf(CodeBadRequest, "sync/check takes check=true and no prune")
	}
	return s.sync(r.Context(), req)
}

func (s *Server) serveSynchronize(w http.ResponseWriter, r *http.Request) (any, error) {
	req, err := DecodeBody[SyncRequest](r.Body)
	if err != nil {
		return nil, err
	}
	if req.Progress {
		s.serveWithProgress(w, r, func(ctx context.Context) (any, error) { return s.sync(ctx, req) })
		return nil, nil
	}
	return s.sync(r.Context(), req)
}

func (s *Server) sync(ctx context.Context, req SyncRequest) (any, error) {
	if req.Group == "" {
		return nil, Errorf(CodeBadRequest, "synchronize: group is required")
	}
	if req.Check && req.Prune {
		return nil, Errorf(CodeBadRequest, "synchronize: check and prune exclude each other")
	}
	res, err := s.backend.Synchronize(ctx, req)
	if err != nil {
		return nil, err
	}
	res.SchemaVersion = SchemaVersion
	return res, nil
}

func (s *Server) serveReload(w http.ResponseWriter, r *http.Request) (any, error) {
	if _, err := DecodeBody[struct{}](r.Body); err != nil {
		return nil, err
	}
	res, err := s.backend.Reload(r.Context())
	if err != nil {
		return nil, err
	}
	res.SchemaVersion = SchemaVersion
	return res, nil
}

// serveHALog streams events as JSON lines. Until the first event is sent
// an error still gets a proper status; after it, an error ends the stream
// with a final {"error","code"} line.
func (s *Server) serveHALog(w http.ResponseWriter, r *http.Request) (any, error) {
	req, err := ParseHALogQuery(r.URL.Query())
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	go func() {
		select {
		case <-s.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	fl, _ := w.(http.Flusher)
	enc := json.NewEncoder(w)
	started := false
	start := func() {
		if !started {
			started = true
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.WriteHeader(http.StatusOK)
			if fl != nil {
				fl.Flush()
			}
		}
	}
	if req.Follow {
		start() // let the client know the stream is open before any event
	}
	err = s.backend.HALog(ctx, req, func(e Event) error {
		start()
		if err := enc.Encode(e); err != nil {
			return err
		}
		if fl != nil {
			fl.Flush()
		}
		return nil
	})
	if err != nil && ctx.Err() != nil {
		err = nil // the client left or the agent is stopping: a normal end
	}
	if err != nil {
		if !started {
			return nil, err
		}
		var e *Error
		if !errors.As(err, &e) {
			e = Errorf(CodeInternal, "%s", err.Error())
		}
		enc.Encode(ErrorBody{Error: e.Message, Code: e.Code})
		return nil, nil
	}
	start()
	return nil, nil
}
