package sync

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// Facts keeps what a process found out about a member's token by trying
// it, beyond the process (pkg/tokenfacts keeps them in the state
// directory, for every process on the host): what it can wrap
// (ProbeWrapKnown) and that it refuses the trial copies of a domain key
// (Replicator.Facts). A fact missing or unreadable is found out again.
type Facts interface {
	Load(key string) ([]byte, bool)
	Store(key string, value []byte) error
}

// tokenKey names the token behind s for Facts: the member, its module,
// and the token's manufacturer, model, serial, firmware and hardware
// versions, so that a token replaced or upgraded is tried again. "" when
// the token has no serial to name it by.
func tokenKey(s *slot.Slot) string {
	t := s.Token()
	if t.Serial == "" {
		return ""
	}
	return fmt.Sprintf("%s\x00%s\x00%s\x00%s\x00%s\x00%s\x00%s", s.Name(), s.Module(), t.Manufacturer, t.Model, t.Serial, t.Firmware, t.Hardware)
}

// wireCapability is a WrapCapability as Facts keep it.
type wireCapability struct {
	Mechanism bool          `json:"mechanism"`
	Probed    []Kind        `json:"probed,omitempty"`
	Refused   []wireRefusal `json:"refused,omitempty"`
}

type wireRefusal struct {
	Kind Kind   `json:"kind"`
	Code uint   `json:"code,omitempty"` // the CKR_ code of the token's answer
	Msg  string `json:"msg"`
}

// probedRefusal is a refusal read back from Facts: the token's answer as
// it was worded, and its CKR_ code for slot.CodeOf.
type probedRefusal struct {
	msg  string
	code uint
}

func (e probedRefusal) Error() string { return e.msg }

func (e probedRefusal) Unwrap() error {
	if e.code == 0 {
		return nil
	}
	return pkcs11.Error(e.code)
}

// ProbeWrapKnown is ProbeWrap, answered from facts when a process probed
// the same token (tokenKey) offering the same mechanisms before; a probe
// made is kept there. facts may be nil.
func ProbeWrapKnown(ctx context.Context, s *slot.Slot, mechs []uint, facts Facts) (WrapCapability, error) {
	key := ""
	if tk := tokenKey(s); tk != "" && facts != nil {
		sorted := slices.Clone(mechs)
		slices.Sort(sorted)
		key = fmt.Sprintf("wrap\x00%s\x00%x", tk, sorted)
		if b, ok := facts.Load(key); ok {
			if c, ok := decodeCapability(b); ok {
				return c, nil
			}
		}
	}
	c, err := ProbeWrap(ctx, s, mechs)
	// Kept for the next process (one that cannot be kept is probed again
	// then), unless the token offered the mechanism and nothing was tried:
	// a trial wrapping key it would not make this time says nothing lasting.
	if err == nil && key != "" && (!c.Mechanism || len(c.Probed) > 0) {
		if b, err := encodeCapability(c); err == nil {
			_ = facts.Store(key, b)
		}
	}
	return c, err
}

func encodeCapability(c WrapCapability) ([]byte, error) {
	w := wireCapability{Mechanism: c.Mechanism, Probed: c.Probed}
	for _, k := range c.Probed {
		if err, ok := c.Refused[k]; ok {
			w.Refused = append(w.Refused, wireRefusal{Kind: k, Code: slot.CodeOf(err), Msg: err.Error()})
		}
	}
	return json.Marshal(w)
}

func decodeCapability(b []byte) (WrapCapability, bool) {
	var w wireCapability
	if json.Unmarshal(b, &w) != nil {
		return WrapCapability{}, false
	}
	c := WrapCapability{Mechanism: w.Mechanism, Probed: w.Probed}
	for _, r := range w.Refused {
		if !slices.Contains(c.Probed, r.Kind) {
			return WrapCapability{}, false
		}
		if c.Refused == nil {
			c.Refused = map[Kind]error{}
		}
		c.Refused[r.Kind] = probedRefusal{msg: r.Msg, code: r.Code}
	}
	return c, true
}
