package history

import (
	"fmt"
	"testing"
	"time"
)

// at is a time t0 + ms milliseconds.
var t0 = time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

func op(proc string, k Kind, label string, inv, ret int, ok bool, found int) Op {
	o := Op{Host: "A", Process: proc, Kind: k, Label: label, Invoke: at(inv), Return: at(ret), OK: ok, Found: found}
	if !ok {
		o.Result = "CKR 0x30"
	}
	return o
}

func final(held ...map[string]int) Final {
	f := Final{Want: 2}
	for i, h := range held {
		f.Members = append(f.Members, fmt.Sprintf("m%d", i))
		f.Holdings = append(f.Holdings, h)
	}
	return f
}

// A clean history, with concurrency the checker must not take for a
// violation, has no finding.
func TestCheckClean(t *testing.T) {
	ops := []Op{
		op("p1", Create, "a", 0, 10, true, 0),
		op("p2", Find, "a", 11, 12, true, 1),
		op("p2", Sign, "a", 12, 14, true, 0),
		// A search overlapping the destroy may see the object or not.
		op("p1", Destroy, "a", 20, 30, true, 2),
		op("p2", Find, "a", 25, 26, true, 1),
		op("p2", Sign, "a", 29, 31, true, 0),
		op("p2", Find, "a", 31, 32, true, 0),
		// A search overlapping the creation may miss it.
		op("p1", Create, "b", 40, 50, true, 0),
		op("p3", Find, "b", 45, 46, true, 0),
		// A failed destroy leaves the object's fate open.
		op("p1", Destroy, "b", 60, 70, false, 2),
		// A failed creation that left nothing.
		op("p1", Create, "c", 80, 90, false, 0),
		// Made, never destroyed, everywhere.
		op("p1", Create, "d", 100, 110, true, 0),
	}
	held := map[string]int{"d": 2, "soak-sign": 2}
	if vs := Check(ops, final(held, held, held)); len(vs) != 0 {
		t.Fatalf("clean history: %d findings, first: %v", len(vs), vs[0])
	}
}

// Every kind of violation, planted alone in an otherwise clean history,
// is caught, and only it.
func TestCheckCatchesPlantedViolations(t *testing.T) {
	base := []Op{
		op("p1", Create, "x", 0, 10, true, 0),
		op("p1", Destroy, "x", 20, 30, true, 2),
		op("p1", Create, "live", 0, 10, true, 0),
		op("p1", Create, "failed", 0, 10, false, 0),
	}
	clean := map[string]int{"live": 2}
	for _, tc := range []struct {
		name  string
		ops   []Op
		final []map[string]int
		want  ViolationKind
	}{
		{"another process finds the object after its destroy returned",
			[]Op{op("p2@B", Find, "x", 31, 32, true, 1)}, nil, FoundAfterDestroy},
		{"a later destroy finds it again",
			[]Op{op("p2@B", Destroy, "x", 40, 41, true, 1)}, nil, FoundAfterDestroy},
		{"a member holds a destroyed object at the end",
			nil, []map[string]int{clean, {"live": 2, "x": 1}, clean}, FoundAfterDestroy},
		{"a signature by a destroyed key",
			[]Op{op("p2@B", Sign, "x", 35, 36, true, 0)}, nil, SignedAfterDestroy},
		{"a search misses an object created and not destroyed",
			[]Op{op("p2@B", Find, "live", 11, 12, true, 0)}, nil, Missing},
		{"a member lacks an object at the end",
			nil, []map[string]int{clean, {"live": 1}, clean}, Missing},
		{"a failed creation's object is on a member at the end",
			nil, []map[string]int{clean, {"live": 2, "failed": 2}, clean}, LeftByFailedCreate},
		{"a search finds a failed creation's object",
			[]Op{op("p2@B", Find, "failed", 11, 12, true, 1)}, nil, LeftByFailedCreate},
		{"a label created twice",
			[]Op{op("p2@B", Create, "live", 50, 60, true, 0)}, nil, Malformed},
		{"a call returning before its invoke",
			[]Op{op("p2@B", Find, "live", 12, 11, true, 1)}, nil, Malformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fin := tc.final
			if fin == nil {
				fin = []map[string]int{clean, clean, clean}
			}
			vs := Check(append(append([]Op(nil), base...), tc.ops...), final(fin...))
			if len(vs) != 1 || vs[0].Kind != tc.want {
				t.Fatalf("findings %v; want exactly one %q", vs, tc.want)
			}
			if len(vs[0].Ops) == 0 {
				t.Errorf("finding %v names no call", vs[0])
			}
		})
	}
}

func TestParseHaload(t *testing.T) {
	o, ok, err := ParseHaload("B", "haload[42]", "hist destroy cb1-0-3 2 1765022400000.250 1765022400012.500 0x30 2")
	if err != nil || !ok {
		t.Fatalf("ParseHaload = %v, %v", ok, err)
	}
	want := Op{Host: "B", Process: "haload[42]/t2", Kind: Destroy, Label: "cb1-0-3",
		Invoke: time.UnixMicro(1765022400000250), Return: time.UnixMicro(1765022400012500), Result: "CKR 0x30", Found: 2}
	if !o.Invoke.Equal(want.Invoke) || !o.Return.Equal(want.Return) {
		t.Errorf("times %v %v, want %v %v", o.Invoke, o.Return, want.Invoke, want.Return)
	}
	o.Invoke, o.Return, want.Invoke, want.Return = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	if o != want {
		t.Errorf("ParseHaload = %+v, want %+v", o, want)
	}
	if _, ok, _ := ParseHaload("B", "p", "created x"); ok {
		t.Error("a line that is not history parsed as history")
	}
	for _, bad := range []string{"hist create x 1 2", "hist frob x 1 1.0 2.0 0x0 0", "hist create x 1 one 2.0 0x0 0"} {
		if _, ok, err := ParseHaload("B", "p", bad); !ok || err == nil {
			t.Errorf("ParseHaload(%q) = %v, %v; want an error", bad, ok, err)
		}
	}
}
