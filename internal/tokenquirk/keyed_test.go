package tokenquirk

import (
	"context"
	"slices"
	"strings"
	"testing"
)

// Each quirk applies to the makes it was measured on, and to no other:
// the strings are C_GetTokenInfo's, blank-padded as tokens give them.
func TestQuirksKeyedByMake(t *testing.T) {
	pad := func(s string, n int) string {
		for len(s) < n {
			s += " "
		}
		return s
	}
	makes := []struct{ name, manufacturer, model string }{
		{"softhsm", pad("SoftHSM project", 32), pad("SoftHSM v2", 16)},
		{"nss", pad("Mozilla Foundation", 32), pad("NSS 3", 16)},
		{"opencryptoki", pad("IBM Corp.", 32), pad("IBM SoftTok", 16)},
		{"tpm", pad("IBM", 32), "SW   TPM\x00\x00\x00\x00\x00\x00\x00\x00"},
		{"other", pad("Thales", 32), pad("Luna K7", 16)},
	}
	quirks := []struct {
		name string
		has  func(manufacturer, model string) bool
		on   string // the makes that have it
	}{
		{"NeedsObjectLock", NeedsObjectLock, "softhsm"},
		{"SerialCreations", SerialCreations, "softhsm"},
		{"GeneralErrorMeansOtherKey", GeneralErrorMeansOtherKey, "softhsm"},
		{"RetriesGeneralError", RetriesGeneralError, "softhsm"},
		{"DoubtsProbe", DoubtsProbe, "softhsm"},
		{"LeavesHalfMadeObjects", LeavesHalfMadeObjects, "softhsm"},
		{"ownChangeHidesOthers", ownChangeHidesOthers, "softhsm"},
		{"NoTokenDataObjects", NoTokenDataObjects, "nss"},
		{"HostMemoryIsRequestError", HostMemoryIsRequestError, "nss"},
		{"TruncatesToShortBuffer", TruncatesToShortBuffer, "nss"},
		{"DefaultExtractable", DefaultExtractable, "nss opencryptoki"},
		{"CarriesKeysByPairOnly", CarriesKeysByPairOnly, "opencryptoki"},
		{"ReusesLiveHandles", ReusesLiveHandles, "tpm"},
	}
	for _, q := range quirks {
		for _, m := range makes {
			if got, want := q.has(m.manufacturer, m.model), slices.Contains(strings.Fields(q.on), m.name); got != want {
				t.Errorf("%s(%q, %q) = %v, want %v", q.name, m.manufacturer, m.model, got, want)
			}
		}
	}
}

// A call rereads the object list first only when it changes which objects
// a token with the quirk holds: not for a read or an attribute change,
// and never on another make.
func TestRereadFirstOnlyBeforeChanges(t *testing.T) {
	var ls Locks
	for _, c := range []struct {
		manufacturer, model string
		a                   Access
		want                bool
	}{
		{"SoftHSM project", "SoftHSM v2", Change, true},
		{"SoftHSM project", "SoftHSM v2", Write, false},
		{"SoftHSM project", "SoftHSM v2", Read, false},
		{"Mozilla Foundation", "NSS 3", Change, false},
	} {
		h, err := ls.For(1, c.manufacturer, c.model).Acquire(context.Background(), c.a)
		if err != nil {
			t.Fatal(err)
		}
		if got := h.RereadFirst(); got != c.want {
			t.Errorf("%s, access %d: RereadFirst = %v, want %v", c.model, c.a, got, c.want)
		}
		h.Release()
	}
}
