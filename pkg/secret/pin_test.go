package secret

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

func TestPINNeverPrints(t *testing.T) {
	p := PINFromString("s3cr3t-1234")
	var logBuf bytes.Buffer
	slog.New(slog.NewTextHandler(&logBuf, nil)).Info("login", "pin", p)
	slog.New(slog.NewJSONHandler(&logBuf, nil)).Info("login", "pin", p)
	js, err := json.Marshal(struct{ PIN PIN }{p})
	if err != nil {
		t.Fatal(err)
	}
	outputs := map[string]string{
		"%s": fmt.Sprintf("%s", p), "%v": fmt.Sprintf("%v", p), "%+v": fmt.Sprintf("%+v", struct{ P PIN }{p}),
		"%#v": fmt.Sprintf("%#v", struct{ P PIN }{p}), "%x": fmt.Sprintf("%x", p), "%q": fmt.Sprintf("%q", p),
		"slog": logBuf.String(), "json": string(js),
	}
	for name, out := range outputs {
		if strings.Contains(out, "s3cr3t") || strings.Contains(out, fmt.Sprintf("%x", "s3cr3t")) {
			t.Errorf("%s leaks the PIN: %s", name, out)
		}
		if !strings.Contains(out, mask) {
			t.Errorf("%s does not show the mask: %s", name, out)
		}
	}
}

func TestPINZero(t *testing.T) {
	p := PINFromString("1234")
	c := p.Clone()
	p.Zero()
	if !bytes.Equal(p.Bytes(), []byte{0, 0, 0, 0}) {
		t.Fatalf("Zero left %q", p.Bytes())
	}
	if c.Reveal() != "1234" {
		t.Fatalf("Clone shares bytes with the original")
	}
}
