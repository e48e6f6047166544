package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Client talks to haagent over its Unix socket. The zero value is not
// usable; create one with NewClient. Safe for concurrent use.
type Client struct {
	path string
	hc   *http.Client

	mu            sync.Mutex
	serverVersion string
}

// NewClient returns a client for the agent socket at path. Nothing is
// dialled until a method is called.
func NewClient(path string) *Client {
	c := &Client{path: path}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			conn, err := d.DialContext(ctx, "unix", path)
			if err != nil {
				if errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM) {
					return nil, &SocketPermissionError{Path: path, Err: err}
				}
				return nil, &UnreachableError{Path: path, Err: err}
			}
			return conn, nil
		},
		DisableCompression:  true,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     30 * time.Second,
	}
	c.hc = &http.Client{Transport: tr}
	return c
}

// Path returns the socket path the client dials.
func (c *Client) Path() string { return c.path }

// Close releases idle connections.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

// Status returns the agent's status.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var v Status
	return v, c.call(ctx, http.MethodGet, "/v1/status", nil, nil, &v)
}

// ListGroups returns every group's state, or one group's when group is
// not empty, with the agent's last comparison of the members (see
// GroupStatus.ComparedAt).
func (c *Client) ListGroups(ctx context.Context, group string) (GroupsReport, error) {
	return c.listGroups(ctx, group, url.Values{})
}

// CompareGroups is ListGroups with the members compared now, for this
// request.
func (c *Client) CompareGroups(ctx context.Context, group string) (GroupsReport, error) {
	return c.listGroups(ctx, group, url.Values{"compare": {"now"}})
}

func (c *Client) listGroups(ctx context.Context, group string, q url.Values) (GroupsReport, error) {
	if group != "" {
		q.Set("group", group)
	}
	var v GroupsReport
	return v, c.call(ctx, http.MethodGet, "/v1/groups", q, nil, &v)
}

// Recover asks for a manual recovery now. fn, when not nil, is called with
// each progress report of the agent while it catches members up.
func (c *Client) Recover(ctx context.Context, req RecoverRequest, fn func(Progress)) (RecoverResult, error) {
	req.Progress = fn != nil
	var v RecoverResult
	return v, c.callProgress(ctx, "/v1/recover", req, &v, fn)
}

// Synchronize plans (req.Check) or runs a synchronisation of a group. A
// check needs only read access. fn, when not nil, is called with each
// progress report of the agent while it applies the plan.
func (c *Client) Synchronize(ctx context.Context, req SyncRequest, fn func(Progress)) (SyncReport, error) {
	path := "/v1/synchronize"
	if req.Check {
		path = "/v1/sync/check"
	}
	req.Progress = fn != nil
	var v SyncReport
	return v, c.callProgress(ctx, path, req, &v, fn)
}

// callProgress posts in and reads the answer's JSON lines: progress lines
// go to fn, the result into out, an error line becomes an *Error. Without
// fn the answer is the result alone.
func (c *Client) callProgress(ctx context.Context, path string, in, out any, fn func(Progress)) error {
	if fn == nil {
		return c.call(ctx, http.MethodPost, path, nil, in, out)
	}
	b, err := json.Marshal(in)
	if err != nil {
		return err
	}
	resp, err := c.do(ctx, http.MethodPost, path, nil, bytes.NewReader(b))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for {
		var line ProgressLine
		if err := dec.Decode(&line); err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("haagent at %s: POST %s: %w", c.path, path, ctx.Err())
			}
			return fmt.Errorf("reading haagent's answer to POST %s: %w", path, err)
		}
		switch {
		case line.Code != "":
			return &Error{Status: statusOf(line.Code), Code: line.Code, Message: line.Error}
		case line.Result != nil:
			if err := json.Unmarshal(line.Result, out); err != nil {
				return fmt.Errorf("decoding haagent's answer to POST %s: %w", path, err)
			}
			return nil
		case line.Progress != nil:
			fn(*line.Progress)
		}
	}
}

// Reload tells the agent to re-read its config file.
func (c *Client) Reload(ctx context.Context) (ReloadResult, error) {
	var v ReloadResult
	return v, c.call(ctx, http.MethodPost, "/v1/reload", nil, struct{}{}, &v)
}

// HALog calls fn for each event the agent sends, in order. With
// req.Follow it returns only when ctx ends (nil), the agent stops (nil) or
// fn fails (its error).
func (c *Client) HALog(ctx context.Context, req HALogRequest, fn func(Event) error) error {
	q := url.Values{}
	if req.Since > 0 {
		q.Set("since", req.Since.String())
	}
	if req.Group != "" {
		q.Set("group", req.Group)
	}
	if req.Follow {
		q.Set("follow", "true")
	}
	resp, err := c.do(ctx, http.MethodGet, "/v1/halog", q, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var line struct {
			Event
			Error string `json:"error"`
			Code  string `json:"code"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			return fmt.Errorf("reading halog stream from %s: %w", c.path, err)
		}
		if line.Code != "" {
			return &Error{Status: resp.StatusCode, Code: line.Code, Message: line.Error}
		}
		if err := fn(line.Event); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil && ctx.Err() == nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return nil // the agent stopped
		}
		return fmt.Errorf("reading halog stream from %s: %w", c.path, err)
	}
	return nil
}

// call does one request/response exchange and decodes the answer into out.
func (c *Client) call(ctx context.Context, method, path string, q url.Values, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	resp, err := c.do(ctx, method, path, q, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decoding haagent's answer to %s %s: %w", method, path, err)
	}
	return nil
}

// do sends a request and checks the protocol version and status; on
// success the caller owns resp.Body.
func (c *Client) do(ctx context.Context, method, path string, q url.Values, body io.Reader) (*http.Response, error) {
	u := "http://" + Host + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		var ue *UnreachableError
		var pe *SocketPermissionError
		switch {
		case errors.As(err, &ue):
			return nil, ue
		case errors.As(err, &pe):
			return nil, pe
		case ctx.Err() != nil:
			return nil, fmt.Errorf("haagent at %s: %s %s: %w", c.path, method, path, ctx.Err())
		}
		return nil, fmt.Errorf("haagent at %s: %s %s: %w", c.path, method, path, err)
	}
	api := resp.Header.Get(HeaderAPI)
	if api == "" {
		resp.Body.Close()
		return nil, fmt.Errorf("%s answers HTTP but is not haagent (no %s header)", c.path, HeaderAPI)
	}
	if api != APIVersion {
		resp.Body.Close()
		return nil, &VersionError{Client: APIVersion, Server: api}
	}
	c.mu.Lock()
	c.serverVersion = resp.Header.Get(HeaderVersion)
	c.mu.Unlock()
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		var eb ErrorBody
		b, _ := io.ReadAll(io.LimitReader(resp.Body, maxBody))
		if err := json.Unmarshal(b, &eb); err != nil || eb.Code == "" {
			return nil, &Error{Status: resp.StatusCode, Code: CodeInternal,
				Message: "haagent answered " + strconv.Itoa(resp.StatusCode) + " " + http.StatusText(resp.StatusCode)}
		}
		return nil, &Error{Status: resp.StatusCode, Code: eb.Code, Message: eb.Error}
	}
	return resp, nil
}
