package slot

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hagroup/hagroup/pkg/slot/dispatch"
	"github.com/miekg/pkcs11"
)

// tokenQuery is what a Spec asks for: a label, a serial, or the attributes
// of an RFC 7512 URI.
type tokenQuery struct {
	what  string // for errors: `token label "ha-b"`
	byURI bool   // list tokens with serials in errors

	attrs map[string]string // URI path attributes that select a token (token, serial, …)
	slot  *uint             // slot-id
}

// tokenAttrs are the RFC 7512 path attributes that select a token or its
// slot or library; objectAttrs name an object in it and do not narrow the
// token.
var (
	tokenAttrs  = []string{"token", "serial", "manufacturer", "model", "slot-id", "slot-description", "slot-manufacturer", "library-manufacturer", "library-description", "library-version"}
	objectAttrs = []string{"object", "type", "id"}
)

// parseQuery builds the query of spec; exactly one way of naming the token.
func parseQuery(spec *Spec) (tokenQuery, error) {
	var set []string
	if spec.TokenLabel != "" {
		set = append(set, "token label")
	}
	if spec.TokenSerial != "" {
		set = append(set, "token serial")
	}
	if spec.URI != "" {
		set = append(set, "URI")
	}
	switch {
	case len(set) == 0:
		return tokenQuery{}, fmt.Errorf("%w: no token label, token serial or URI", ErrInvalidSpec)
	case len(set) > 1:
		return tokenQuery{}, fmt.Errorf("%w: %s given together; name the token one way", ErrInvalidSpec, strings.Join(set, " and "))
	}
	switch {
	case spec.TokenLabel != "":
		return tokenQuery{what: fmt.Sprintf("token label %q", spec.TokenLabel), attrs: map[string]string{"token": spec.TokenLabel}}, nil
	case spec.TokenSerial != "":
		return tokenQuery{what: fmt.Sprintf("token serial %q", spec.TokenSerial), byURI: true, attrs: map[string]string{"serial": spec.TokenSerial}}, nil
	}
	return parseURI(spec.URI)
}

// parseURI parses an RFC 7512 pkcs11: URI for the attributes that select a
// token (token, serial, manufacturer, model, slot-id, slot-description,
// slot-manufacturer, library-manufacturer, library-description,
// library-version), percent-decoding their values. Object attributes
// (object, type, id) are accepted and ignored; any other path attribute is
// an error, as is a PIN (pin-value, pin-source) in the path or the query.
// Errors quote the URI only as RedactURI gives it and name attributes,
// never a value that could be a PIN.
func parseURI(uri string) (tokenQuery, error) {
	shown := RedactURI(uri)
	q := tokenQuery{what: fmt.Sprintf("token matching %q", shown), byURI: true, attrs: map[string]string{}}
	rest, ok := strings.CutPrefix(uri, "pkcs11:")
	if !ok {
		return q, fmt.Errorf("%w: URI %q does not start with pkcs11:", ErrInvalidSpec, shown)
	}
	path, query, _ := strings.Cut(rest, "?")
	if path != "" {
		for i, part := range strings.Split(path, ";") {
			k, v, ok := strings.Cut(part, "=")
			if !ok || k == "" {
				return q, fmt.Errorf("%w: URI %q: path attribute %d is not name=value", ErrInvalidSpec, shown, i+1)
			}
			if isPINAttr(k) {
				return q, fmt.Errorf("%w: URI %q carries a PIN (%s); give the PIN through a PIN file or variable", ErrInvalidSpec, shown, k)
			}
			val, err := url.PathUnescape(v)
			if err != nil {
				return q, fmt.Errorf("%w: URI %q: attribute %s: bad percent-encoding", ErrInvalidSpec, shown, k)
			}
			switch {
			case slices.Contains(objectAttrs, k):
				continue
			case !slices.Contains(tokenAttrs, k):
				return q, fmt.Errorf("%w: URI %q: unknown attribute %q", ErrInvalidSpec, shown, k)
			}
			if _, dup := q.attrs[k]; dup {
				return q, fmt.Errorf("%w: URI %q: attribute %s given twice", ErrInvalidSpec, shown, k)
			}
			if k == "slot-id" {
				id, err := strconv.ParseUint(val, 10, 64)
				if err != nil {
					return q, fmt.Errorf("%w: URI %q: slot-id %q is not a decimal number", ErrInvalidSpec, shown, val)
				}
				u := uint(id)
				q.slot = &u
			}
			q.attrs[k] = val
		}
	}
	if query != "" {
		for _, part := range strings.Split(query, "&") {
			k, _, _ := strings.Cut(part, "=")
			if isPINAttr(k) {
				return q, fmt.Errorf("%w: URI %q carries a PIN (%s); give the PIN through a PIN file or variable", ErrInvalidSpec, shown, k)
			}
		}
	}
	return q, nil
}

// isPINAttr reports whether URI attribute k carries a PIN or says where
// one is (RFC 7512's pin-value and pin-source, wherever they are put).
func isPINAttr(k string) bool { return strings.HasPrefix(strings.ToLower(k), "pin-") }

// RedactURI returns uri as messages may show it: the values of PIN attributes
// in the path replaced by "…", and the query, which may hold a PIN,
// dropped.
func RedactURI(uri string) string {
	if i := strings.IndexByte(uri, '?'); i >= 0 {
		uri = uri[:i] + "?…"
	}
	path, query, hasQuery := strings.Cut(uri, "?")
	parts := strings.Split(path, ";")
	for i, part := range parts {
		if part == "" || part == "pkcs11:" {
			continue
		}
		k, _, ok := strings.Cut(part, "=")
		if i == 0 {
			k = strings.TrimPrefix(k, "pkcs11:")
		}
		if !ok || isPINAttr(k) {
			// Not name=value: it could be anything, a PIN included.
			prefix := ""
			if i == 0 && strings.HasPrefix(part, "pkcs11:") {
				prefix = "pkcs11:"
			}
			if ok {
				parts[i] = prefix + k + "=…"
			} else {
				parts[i] = prefix + "…"
			}
		}
	}
	out := strings.Join(parts, ";")
	if hasQuery {
		out += "?" + query
	}
	return out
}

// found is one token a module offers, with what matching needs.
type found struct {
	TokenSummary
	slotDesc, slotManuf string
}

// listTokens lists the tokens present on c's slots.
func listTokens(c p11, withSlotInfo bool) ([]found, error) {
	ids, err := c.GetSlotList(true)
	if err != nil {
		return nil, err
	}
	out := make([]found, 0, len(ids))
	for _, id := range ids {
		ti, err := c.GetTokenInfo(id)
		if err != nil {
			if code, ok := codeIn(err); ok && (code == pkcs11.CKR_TOKEN_NOT_PRESENT || code == pkcs11.CKR_SLOT_ID_INVALID) {
				continue // gone between the two calls
			}
			return nil, err
		}
		f := found{TokenSummary: TokenSummary{
			SlotID:       id,
			Label:        ti.Label,
			Serial:       ti.SerialNumber,
			Manufacturer: ti.ManufacturerID,
			Model:        ti.Model,
			Firmware:     fmt.Sprintf("%d.%d", ti.FirmwareVersion.Major, ti.FirmwareVersion.Minor),
			Hardware:     fmt.Sprintf("%d.%d", ti.HardwareVersion.Major, ti.HardwareVersion.Minor),
			Flags:        ti.Flags,
			Initialized:  ti.Flags&pkcs11.CKF_TOKEN_INITIALIZED != 0,
		}}
		if withSlotInfo {
			si, err := c.GetSlotInfo(id)
			if err != nil {
				return nil, err
			}
			f.slotDesc, f.slotManuf = si.SlotDescription, si.ManufacturerID
		}
		out = append(out, f)
	}
	return out, nil
}

// match reports whether token f (of a library described by info) matches q.
func (q tokenQuery) match(f found, info pkcs11.Info) bool {
	for k, v := range q.attrs {
		var have string
		switch k {
		case "token":
			have = f.Label
		case "serial":
			have = f.Serial
		case "manufacturer":
			have = f.Manufacturer
		case "model":
			have = f.Model
		case "slot-id":
			if q.slot == nil || *q.slot != f.SlotID {
				return false
			}
			continue
		case "slot-description":
			have = f.slotDesc
		case "slot-manufacturer":
			have = f.slotManuf
		case "library-manufacturer":
			have = info.ManufacturerID
		case "library-description":
			have = info.LibraryDescription
		case "library-version":
			have = fmt.Sprintf("%d.%d", info.LibraryVersion.Major, info.LibraryVersion.Minor)
			if !strings.Contains(v, ".") {
				v += ".0" // RFC 7512: "M" means "M.0"
			}
		}
		if strings.TrimRight(have, " ") != v {
			return false
		}
	}
	return true
}

func (q tokenQuery) needsSlotInfo() bool {
	_, a := q.attrs["slot-description"]
	_, b := q.attrs["slot-manufacturer"]
	return a || b
}

func (q tokenQuery) needsLibInfo() bool {
	for k := range q.attrs {
		if strings.HasPrefix(k, "library-") {
			return true
		}
	}
	return false
}

// notFoundError says which token was searched where, and what is there.
type notFoundError struct {
	what, module string
	there        []found
	byURI        bool
}

func (e *notFoundError) Error() string {
	var names []string
	for _, f := range e.there {
		if !f.Initialized {
			continue
		}
		if e.byURI {
			names = append(names, fmt.Sprintf("%s (serial %s)", f.Label, f.Serial))
		} else {
			names = append(names, f.Label)
		}
	}
	list := "none"
	if len(names) > 0 {
		list = strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s not found in %s; tokens there: %s", e.what, e.module, list)
}

func (e *notFoundError) Unwrap() error { return ErrTokenNotFound }

// findToken finds the one token matching q on module m's current
// context. It never trusts a slot ID remembered from before: it lists the
// slots every time. The listing is a call per slot the module offers, not
// one command, so it is bounded as C_Initialize is (initializeTimeout of
// the command timeout given).
func findToken(ctx context.Context, spec *Spec, q tokenQuery, m *module, timeout time.Duration) (TokenSummary, error) {
	c := modules.current(m)
	var (
		toks []found
		info pkcs11.Info
	)
	err := callOn(ctx, m, initializeTimeout(timeout), func() error {
		return spec.intercepted(ctx, OpTokenInfo, func() error {
			var err error
			if q.needsLibInfo() {
				if info, err = c.GetInfo(); err != nil {
					return err
				}
			}
			toks, err = listTokens(c, q.needsSlotInfo())
			return err
		})
	})
	if err != nil {
		return TokenSummary{}, newError(spec.Name, OpTokenInfo, err)
	}
	var hits []found
	for _, f := range toks {
		if f.Initialized && q.match(f, info) {
			hits = append(hits, f)
		}
	}
	switch len(hits) {
	case 1:
		return hits[0].TokenSummary, nil
	case 0:
		return TokenSummary{}, &Error{Member: spec.Name, Err: &notFoundError{what: q.what, module: spec.Module, there: toks, byURI: q.byURI}}
	}
	serials := make([]string, len(hits))
	for i, h := range hits {
		serials[i] = h.Serial
	}
	return TokenSummary{}, &Error{Member: spec.Name, Err: fmt.Errorf("%w: %s matches %d tokens in %s (serials %s); name the token by serial or a narrower URI",
		ErrInvalidSpec, q.what, len(hits), spec.Module, strings.Join(serials, ", "))}
}

// ListModuleTokens lists the tokens the module of ref offers, the
// uninitialised ones included.
func ListModuleTokens(ctx context.Context, ref ModuleRef) ([]TokenSummary, error) {
	module := ref.Path
	m, err := modules.acquire(ctx, ref, dispatch.DefaultCommandTimeout)
	if err != nil {
		return nil, err
	}
	defer modules.release(m)
	c := modules.current(m)
	var toks []found
	err = callOn(ctx, m, dispatch.DefaultCommandTimeout, func() error {
		var err error
		toks, err = listTokens(c, false)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list tokens of %s: %w", module, err)
	}
	out := make([]TokenSummary, len(toks))
	for i, f := range toks {
		out[i] = f.TokenSummary
	}
	return out, nil
}
