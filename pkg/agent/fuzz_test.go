package agent

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
)

// FuzzRequest feeds raw HTTP requests to the handler with write access and
// checks the answer is well-formed: a success, or {error, code} JSON with
// a known code. It never panics.
func FuzzRequest(f *testing.F) {
	seeds := []string{
		"GET /v1/status HTTP/1.1\r\nHost: haagent.sock\r\n\r\n",
		"GET /v1/groups?group=signing HTTP/1.1\r\nHost: haagent.sock\r\n\r\n",
		"GET /v1/halog?since=1h&group=g HTTP/1.1\r\nHost: haagent.sock\r\n\r\n",
		"POST /v1/recover HTTP/1.1\r\nHost: haagent.sock\r\nContent-Length: 34\r\n\r\n{\"group\":\"signing\",\"member\":\"b\"}\n",
		"POST /v1/sync/check HTTP/1.1\r\nHost: haagent.sock\r\nContent-Length: 26\r\n\r\n{\"group\":\"g\",\"check\":true}",
		"POST /v1/synchronize HTTP/1.1\r\nHost: haagent.sock\r\nContent-Length: 26\r\n\r\n{\"group\":\"g\",\"prune\":true}",
		"POST /v1/reload HTTP/1.1\r\nHost: haagent.sock\r\nContent-Length: 2\r\n\r\n{}",
		"POST /v1/recover HTTP/1.1\r\nHost: haagent.sock\r\nContent-Length: 5\r\n\r\n[1,2]",
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	log, _ := OpenEventLog("", 0)
	srv := NewServer(&testBackend{log: log}, Policy{}, "fuzz", nil)
	codes := map[string]bool{CodeBadRequest: true, CodeNotFound: true, CodePermissionDenied: true,
		CodeMemberUnreachable: true, CodeConflict: true, CodeInvalidConfig: true, CodeUnavailable: true, CodeInternal: true}
	f.Fuzz(func(t *testing.T, raw []byte) {
		req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(raw)))
		if err != nil {
			return
		}
		req = req.WithContext(WithDecision(t.Context(), Decision{Level: LevelWrite, Reason: "fuzz"}))
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, req)
		if w.Header().Get(HeaderAPI) != APIVersion {
			t.Fatalf("no API header on %d", w.Code)
		}
		if w.Code/100 == 2 {
			return
		}
		var eb ErrorBody
		if err := json.Unmarshal(w.Body.Bytes(), &eb); err != nil {
			t.Fatalf("status %d with non-JSON body %q", w.Code, w.Body)
		}
		if !codes[eb.Code] || eb.Error == "" {
			t.Fatalf("status %d with bad error body %q", w.Code, w.Body)
		}
	})
}

// FuzzDecodeBody checks the strict decoder never panics and never accepts
// trailing data.
func FuzzDecodeBody(f *testing.F) {
	f.Add([]byte(`{"group":"g","member":"m"}`))
	f.Add([]byte(`{"group":"g"} {}`))
	f.Add([]byte(`{"group":1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := DecodeBody[RecoverRequest](bytes.NewReader(b))
		if err != nil {
			return
		}
		// Accepted input re-encodes and decodes to the same value.
		re, _ := json.Marshal(v)
		v2, err := DecodeBody[RecoverRequest](bytes.NewReader(re))
		if err != nil || v2 != v {
			t.Fatalf("round trip of %q: %+v vs %+v (%v)", b, v, v2, err)
		}
	})
}
