package history

import (
	"fmt"
	"sort"
)

// Final is what every member holds once recovery has settled: the
// objects under each label, per member.
type Final struct {
	Members  []string
	Holdings []map[string]int // by member, as Members
	// Want is how many objects one creation makes under its label (a key
	// pair: 2).
	Want int
}

// ViolationKind names the rule a history breaks.
type ViolationKind string

// The findings.
const (
	// FoundAfterDestroy: a search (or another destroy's) invoked after
	// the object's destroy returned OK found it, or a member holds it at
	// the end.
	FoundAfterDestroy ViolationKind = "found after its destroy returned"
	// SignedAfterDestroy: a signature invoked after the key's destroy
	// returned OK was made.
	SignedAfterDestroy ViolationKind = "signature by a destroyed key"
	// Missing: a search invoked after the object's creation returned OK,
	// and before any destroy of it was invoked, did not find it, or a
	// member lacks it at the end.
	Missing ViolationKind = "missing after its creation returned"
	// LeftByFailedCreate: the creation returned an error, and a member
	// holds the object at the end or a later search found it.
	LeftByFailedCreate ViolationKind = "left by a failed creation"
	// Malformed: the history itself is wrong (a label created twice, a
	// call returning before its invoke): nothing else about the label can
	// be judged.
	Malformed ViolationKind = "malformed history"
)

// Violation is one finding, with the calls that show it.
type Violation struct {
	Kind   ViolationKind
	Label  string
	Detail string
	Ops    []Op
}

func (v Violation) String() string {
	s := fmt.Sprintf("%s: %s: %s", v.Label, v.Kind, v.Detail)
	for _, o := range v.Ops {
		s += "\n    " + o.String()
	}
	return s
}

// Check returns every way ops and final break the specification (see the
// package comment), ordered by label and kind. A call is after another
// when it was invoked after the other returned: calls that overlap may
// take effect in either order and are not judged against each other.
func Check(ops []Op, final Final) []Violation {
	byLabel := map[string][]Op{}
	for _, o := range ops {
		byLabel[o.Label] = append(byLabel[o.Label], o)
	}
	for _, h := range final.Holdings {
		for l := range h {
			if _, ok := byLabel[l]; !ok {
				byLabel[l] = nil // held, never made through the soak: not judged
			}
		}
	}
	var out []Violation
	for label, lops := range byLabel {
		sortByInvoke(lops)
		out = append(out, checkLabel(label, lops, final)...)
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Label != out[j].Label {
			return out[i].Label < out[j].Label
		}
		return out[i].Kind < out[j].Kind
	})
	return out
}

// checkLabel judges the calls on one label, ordered by invoke.
func checkLabel(label string, ops []Op, final Final) []Violation {
	var out []Violation
	add := func(k ViolationKind, detail string, shown ...Op) {
		out = append(out, Violation{Kind: k, Label: label, Detail: detail, Ops: shown})
	}
	var create *Op
	var destroyed *Op // the first destroy to return OK
	var destroyAt *Op // the first destroy invoked, whatever it returned
	for i := range ops {
		o := &ops[i]
		if o.Return.Before(o.Invoke) {
			add(Malformed, "returned before it was invoked", *o)
			return out
		}
		switch o.Kind {
		case Create:
			if create != nil {
				add(Malformed, "created twice: labels must be unique", *create, *o)
				return out
			}
			create = o
		case Destroy:
			if destroyAt == nil {
				destroyAt = o
			}
			if o.OK && (destroyed == nil || o.Return.Before(destroyed.Return)) {
				destroyed = o
			}
		}
	}
	if create == nil {
		return out // not made through the soak (the signing key, the AES key)
	}
	for _, o := range ops {
		switch {
		case destroyed != nil && o.Invoke.After(destroyed.Return) && (o.Kind == Find || o.Kind == Destroy) && o.Found > 0:
			add(FoundAfterDestroy, fmt.Sprintf("found %d object(s)", o.Found), *destroyed, o)
		case destroyed != nil && o.Invoke.After(destroyed.Return) && o.Kind == Sign && o.OK:
			add(SignedAfterDestroy, "the signature was made", *destroyed, o)
		case create.OK && o.Kind == Find && o.OK && o.Found == 0 && o.Invoke.After(create.Return) &&
			(destroyAt == nil || o.Return.Before(destroyAt.Invoke)):
			add(Missing, "a search did not find it", *create, o)
		case !create.OK && o.Kind == Find && o.Found > 0 && o.Invoke.After(create.Return):
			add(LeftByFailedCreate, fmt.Sprintf("a search found %d object(s)", o.Found), *create, o)
		}
	}
	for i, h := range final.Holdings {
		n, member := h[label], final.Members[i]
		switch {
		case destroyed != nil && n > 0:
			add(FoundAfterDestroy, fmt.Sprintf("%d object(s) on %s at the end", n, member), *destroyed)
		case create.OK && destroyAt == nil && n < final.Want:
			add(Missing, fmt.Sprintf("%d of %d object(s) on %s at the end", n, final.Want, member), *create)
		case !create.OK && destroyAt == nil && n > 0:
			add(LeftByFailedCreate, fmt.Sprintf("%d object(s) on %s at the end", n, member), *create)
		}
	}
	return out
}

// Counts returns how many of vs are of each kind.
func Counts(vs []Violation) map[ViolationKind]int {
	c := map[ViolationKind]int{}
	for _, v := range vs {
		c[v.Kind]++
	}
	return c
}
