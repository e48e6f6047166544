package sync

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/miekg/pkcs11"
)

// PlanMember is one member taking part in a plan: its name and its opened,
// logged-in slot.
type PlanMember struct {
	Name string
	Slot *slot.Slot
}

// Tombstones answers whether an object was destroyed through the group
// (within the tombstone horizon). *tombstone.Set implements it, and
// IdentityTombstones too.
type Tombstones interface {
	Contains(id object.Identity, fingerprint []byte) bool
}

// IdentityTombstones is implemented by Tombstones that can also say
// whether an identity was destroyed whatever its fingerprint. A plan
// asks it of objects whose fingerprint a member cannot compute (nil): a
// private key whose public half is gone from the member, say, is still
// the destroyed key.
type IdentityTombstones interface {
	Tombstones
	ContainsIdentity(id object.Identity) bool
}

// tombstoned reports whether tombs say the version (id, fp) was
// destroyed; a version without a fingerprint matches any tombstone of its
// identity.
func tombstoned(tombs Tombstones, id object.Identity, fp []byte) bool {
	if tombs == nil {
		return false
	}
	if tombs.Contains(id, fp) {
		return true
	}
	it, ok := tombs.(IdentityTombstones)
	return ok && fp == nil && it.ContainsIdentity(id)
}

// IntentTombstones is implemented by Tombstones that also know creations
// sent to a member and never answered (*tombstone.Set: its Intent
// records). See PlanOptions.Returning.
type IntentTombstones interface {
	Unanswered(id object.Identity) bool
}

func unanswered(tombs Tombstones, id object.Identity) bool {
	it, ok := tombs.(IntentTombstones)
	return ok && it.Unanswered(id)
}

// FlightTombstones is implemented by Tombstones that also know creations
// running now in another process of the host (*tombstone.Set: its held
// intents). See Plan.InFlight.
type FlightTombstones interface {
	InFlight(id object.Identity) bool
}

func inFlight(tombs Tombstones, id object.Identity) bool {
	ft, ok := tombs.(FlightTombstones)
	return ok && ft.InFlight(id)
}

// PlanOptions tune MakePlan.
type PlanOptions struct {
	// Prune deletes objects found on some members only, with no
	// tombstone, instead of copying them to the members that lack them.
	// DESTRUCTIVE: a key generated while a member was away is deleted
	// everywhere, since the member that missed it is one that lacks it.
	Prune bool
	// SkipUnreachable leaves out a member whose listing fails for a
	// health reason (slot.ClassHealth: down, hung, device error) and names
	// it in Plan.Skipped, instead of failing the whole plan.
	SkipUnreachable bool
	// LoadTombstones, when set, is called after every member has been
	// listed, and what it returns is used instead of MakePlan's tombs
	// argument; Apply calls it again after its copies. Reading the
	// tombstones after the listing matters: an object destroyed through
	// the group during the listing is absent from it, and its tombstone,
	// read before the listing, would be missing, so the plan would copy
	// the destroyed object back from a member that was away.
	LoadTombstones func(ctx context.Context) (Tombstones, error)
	// Returning names the member being caught up (a recovery's plan). A
	// version of an identity whose creation was sent and never answered
	// (IntentTombstones) that it alone holds is what that creation left
	// on it when it died under the call: the group never made it, so it
	// is deleted there (ReasonUnanswered), not copied to the others.
	Returning string
}

// ActionKind says what an action does.
type ActionKind int

// Action kinds.
const (
	// Copy replicates the object from Source to Member.
	Copy ActionKind = iota + 1
	// Delete destroys the object with exactly this fingerprint on Member.
	Delete
)

func (k ActionKind) String() string {
	switch k {
	case Copy:
		return "copy"
	case Delete:
		return "delete"
	}
	return fmt.Sprintf("action(%d)", int(k))
}

// MarshalText lets kinds appear by name in JSON.
func (k ActionKind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// Reason says why an action is planned.
type Reason string

// Reasons.
const (
	// ReasonMissing: the member lacks an object the others hold.
	ReasonMissing Reason = "missing"
	// ReasonTombstone: a tombstone says the object was destroyed through
	// the group while the member was away.
	ReasonTombstone Reason = "tombstone"
	// ReasonPrune: the object is on some members only, with no tombstone,
	// and PlanOptions.Prune asked for such objects to go.
	ReasonPrune Reason = "prune"
	// ReasonUnanswered: the object is what a creation that was never
	// answered left on the member being caught up, which alone holds it
	// (PlanOptions.Returning).
	ReasonUnanswered Reason = "unanswered"
	// ReasonDuplicate: the member holds one version of an object more
	// than once (two hosts copied it at the same moment); the extra copy
	// goes, and Source names a member the last copy can be taken from
	// again should a concurrent clean-up have removed the others too.
	ReasonDuplicate Reason = "duplicate"
	// ReasonHalfMade: the object is what an interrupted creation left on
	// the member being caught up (ErrHalfMade, PlanOptions.Returning).
	ReasonHalfMade Reason = "half-made"
)

// Action is one change to one object on one member.
type Action struct {
	Kind        ActionKind
	Identity    object.Identity
	Fingerprint []byte
	Member      string // the member changed: copy target, or where the object is deleted
	Source      string // Copy: the member the object is copied from; a duplicate's Delete: a member holding it too
	Reason      Reason

	handle pkcs11.ObjectHandle // the object on Source (Copy) or Member (Delete) when listed
	absent bool                // Copy: the listing showed no object with the identity on Member
}

// String describes the action for messages.
func (a Action) String() string {
	fp := object.FormatFingerprint(a.Fingerprint)
	if a.Kind == Copy {
		return fmt.Sprintf("copy %s (fingerprint %s) from %s to %s (%s)", a.Identity, fp, a.Source, a.Member, a.Reason)
	}
	return fmt.Sprintf("delete %s (fingerprint %s) on %s (%s)", a.Identity, fp, a.Member, a.Reason)
}

// Version is one fingerprint of an identity and the members holding it.
type Version struct {
	Fingerprint []byte
	Members     []string
}

// Conflict is one identity held with different key material by different
// members (or twice on one member): the duplicate-label hazard. It is
// reported, never resolved by guessing; no action touches the identity.
type Conflict struct {
	Identity object.Identity
	Versions []Version // two or more, in member order
}

// Involves reports whether member holds one of the conflicting versions.
func (c Conflict) Involves(member string) bool {
	for _, v := range c.Versions {
		for _, m := range v.Members {
			if m == member {
				return true
			}
		}
	}
	return false
}

// String describes the conflict with every fingerprint and its holders.
func (c Conflict) String() string {
	parts := make([]string, len(c.Versions))
	for i, v := range c.Versions {
		parts[i] = fmt.Sprintf("%s on %s", object.FormatFingerprint(v.Fingerprint), strings.Join(v.Members, ","))
	}
	return fmt.Sprintf("%s: %v: fingerprints %s", c.Identity, object.ErrConflict, strings.Join(parts, "; "))
}

// Plan is what it takes to make the members equal: actions and the
// conflicts no action may touch. Make one with MakePlan, carry it out with
// Replicator.Apply.
type Plan struct {
	// Members are the members listed, in the order given.
	Members []string
	// Tombstones is the tombstone set the plan was made with (nil:
	// none).
	Tombstones Tombstones
	// Skipped are members left out because their listing failed for a
	// health reason (PlanOptions.SkipUnreachable), with the error.
	Skipped map[string]error
	// InFlight are identities that the member being caught up alone holds
	// while a creation of them runs in another process of the host
	// (FlightTombstones): what it holds may be what that creation is
	// making, or what one that died left. Neither is decided until the
	// creation returns, so nothing is planned for them, and the member is
	// not caught up by this plan.
	InFlight []object.Identity
	// Actions, deletes first (private halves before public ones, so a
	// private key's fingerprint stays readable), then copies (public
	// halves first: a private EC key's fingerprint on SoftHSM comes from
	// its public half).
	Actions []Action
	// Conflicts found; their identities have no actions.
	Conflicts []Conflict
	// Objects is the number of distinct token objects (identity +
	// fingerprint) seen across the members.
	Objects int
	// Unreadable are objects a member listed but would not describe (see
	// Unreadable): no action touches them and they are no conflict, but
	// they are reported, and count as out of sync for their member, since
	// what they hold is unknown.
	Unreadable []Unreadable

	slots     map[string]*slot.Slot
	loadTombs func(ctx context.Context) (Tombstones, error)
	reapplied bool // Apply ran on the plan before: its listing is stale
}

// Empty reports whether there is nothing to do and nothing to resolve: no
// action, no conflict. Unreadable objects are not counted: see
// Plan.Unreadable.
func (p *Plan) Empty() bool { return len(p.Actions) == 0 && len(p.Conflicts) == 0 }

// UnreadableOn returns the unreadable objects listed by member.
func (p *Plan) UnreadableOn(member string) []Unreadable {
	return keep(p.Unreadable, func(u Unreadable) bool { return u.Member == member })
}

// For returns the actions that change member.
func (p *Plan) For(member string) []Action {
	return keep(p.Actions, func(a Action) bool { return a.Member == member })
}

// ConflictsOf returns the conflicts in which member holds a version.
func (p *Plan) ConflictsOf(member string) []Conflict {
	return keep(p.Conflicts, func(c Conflict) bool { return c.Involves(member) })
}

// keep returns the elements of xs that ok accepts, in order (nil for none).
func keep[T any](xs []T, ok func(T) bool) []T {
	var out []T
	for _, x := range xs {
		if ok(x) {
			out = append(out, x)
		}
	}
	return out
}

// OutOfSync returns how many objects member lacks, holds in excess, holds
// in conflict, or holds unreadable: its actions, its conflicts and its
// unreadable objects.
func (p *Plan) OutOfSync(member string) int {
	return len(p.For(member)) + len(p.ConflictsOf(member)) + len(p.UnreadableOn(member))
}

// holding is one version of an identity during planning.
type holding struct {
	fp      []byte
	holders map[int]pkcs11.ObjectHandle // member index -> handle
	// extra are the members' further handles of this very version:
	// duplicates, left by two hosts copying it at the same moment.
	extra map[int][]pkcs11.ObjectHandle
	// unknown are the members whose object of the identity has no
	// fingerprint (nil) there, merged into this, the identity's only
	// known version: they hold it as far as anyone can tell.
	unknown map[int]pkcs11.ObjectHandle
}

// holds reports whether the member at pos holds the version, known or
// merged.
func (v *holding) holds(pos int) bool {
	if _, ok := v.holders[pos]; ok {
		return true
	}
	_, ok := v.unknown[pos]
	return ok
}

// mergeUnknown joins the fingerprint-less version of an identity (a
// member that cannot compute the object's fingerprint: a SoftHSM EC
// private key whose public half is gone, say) with the identity's
// versions that remain after the tombstones. An unknown fingerprint
// matches: with one known version it is that version; with none, the
// fingerprint-less holders are one version; with two or more known ones
// (a conflict) it stays a version of its own, so the conflict names its
// holders too. vs keeps its order (first holder in member order).
func mergeUnknown(vs []*holding) []*holding {
	var unknown *holding
	var known []*holding
	for _, v := range vs {
		if v.fp == nil {
			unknown = v
		} else {
			known = append(known, v)
		}
	}
	if unknown == nil || len(known) != 1 {
		return vs
	}
	v := &holding{fp: known[0].fp, holders: known[0].holders, extra: known[0].extra, unknown: map[int]pkcs11.ObjectHandle{}}
	for pos, h := range unknown.holders {
		if _, dup := v.holders[pos]; !dup {
			v.unknown[pos] = h
		}
	}
	return []*holding{v}
}

// MakePlan lists every member's token objects once (the members in
// parallel), joins the listings on identity, and plans:
//
//   - a version (identity + fingerprint) that a tombstone says was
//     destroyed is deleted wherever it remains, even where every member
//     holds it. Holding it everywhere is no sign that it was made again:
//     a catch-up's copy that lands just before the destroy, or a second
//     copy on one member that a destroy did not see, leaves it on members
//     the destroy did not reach. An object made again through the group
//     revokes its tombstone (see pkg/group); one re-imported on the
//     members directly, outside the group, within the tombstone horizon
//     is deleted: re-import it through the group;
//   - of what remains, two or more fingerprints under one identity are a
//     Conflict, reported with every fingerprint, and nothing is done;
//   - one version held by some members only is copied from the first
//     holder (in member order) to the others, or with Prune deleted from
//     its holders.
//
// An object a member lists but will not describe (a request error such as
// CKR_ATTRIBUTE_VALUE_INVALID while reading it) does not fail the plan: it
// is left out and named in Plan.Unreadable. A member whose listing fails
// for any other reason fails the plan (or, for a health reason with
// SkipUnreachable, is skipped).
//
// Session objects are ignored. An object whose fingerprint a member
// cannot compute (nil: a SoftHSM EC private key whose public half is gone,
// say) matches any fingerprint of its identity: it counts as holding the
// identity's one known version (never copied to that member, and never a
// conflict), or, where no member knows a fingerprint, the fingerprint-less
// objects are one version. Only two known fingerprints that differ are a
// conflict. A tombstone of its identity, whatever the fingerprint, makes
// it a destroyed object. The members must be all
// logged in or all logged out: otherwise private objects would look
// missing where they are merely invisible.
func MakePlan(ctx context.Context, members []PlanMember, tombs Tombstones, opts PlanOptions) (*Plan, error) {
	if len(members) == 0 {
		return nil, errors.New("plan: no members")
	}
	seen := map[string]bool{}
	for _, m := range members {
		if m.Slot == nil {
			return nil, fmt.Errorf("plan: member %s has no open slot", m.Name)
		}
		if seen[m.Name] {
			return nil, fmt.Errorf("plan: member %s given twice", m.Name)
		}
		seen[m.Name] = true
	}

	listings := make([]Listing, len(members))
	errs := make([]error, len(members))
	var wg sync.WaitGroup
	for i, m := range members {
		wg.Go(func() { listings[i], errs[i] = list(ctx, m.Slot, m.Name) })
	}
	wg.Wait()

	p := &Plan{slots: map[string]*slot.Slot{}}
	var live []int // indexes of members taking part
	for i, m := range members {
		if err := errs[i]; err != nil {
			if opts.SkipUnreachable && slot.ClassOf(err) == slot.ClassHealth {
				if p.Skipped == nil {
					p.Skipped = map[string]error{}
				}
				p.Skipped[m.Name] = err
				continue
			}
			return nil, fmt.Errorf("plan: %w", err)
		}
		live = append(live, i)
	}
	var in, out []string
	for _, i := range live {
		m := members[i]
		p.Members = append(p.Members, m.Name)
		p.slots[m.Name] = m.Slot
		p.Unreadable = append(p.Unreadable, listings[i].Unreadable...)
		halfMadeActions(p, m.Name, listings[i].HalfMade, opts.Returning)
		if m.Slot.LoggedIn() {
			in = append(in, m.Name)
		} else {
			out = append(out, m.Name)
		}
	}
	if len(in) > 0 && len(out) > 0 {
		return nil, fmt.Errorf("plan: members %s are logged in and %s are not: private objects would look missing",
			strings.Join(in, ","), strings.Join(out, ","))
	}
	if opts.LoadTombstones != nil {
		// After the listings: see PlanOptions.LoadTombstones.
		t, err := opts.LoadTombstones(ctx)
		if err != nil {
			return nil, fmt.Errorf("plan: read tombstones: %w", err)
		}
		tombs = t
		p.loadTombs = opts.LoadTombstones
	}
	p.Tombstones = tombs

	type entry struct {
		id       object.Identity
		versions []*holding
	}
	byID := map[string]*entry{}
	var order []string
	for pos, i := range live {
		for _, o := range listings[i].Objects {
			if !o.Token {
				continue
			}
			k := o.Identity.Key()
			e := byID[k]
			if e == nil {
				e = &entry{id: o.Identity}
				byID[k] = e
				order = append(order, k)
			}
			var v *holding
			for _, h := range e.versions {
				if bytes.Equal(h.fp, o.Fingerprint) {
					v = h
					break
				}
			}
			if v == nil {
				v = &holding{fp: o.Fingerprint, holders: map[int]pkcs11.ObjectHandle{}}
				e.versions = append(e.versions, v)
				p.Objects++
			}
			if _, dup := v.holders[pos]; !dup {
				v.holders[pos] = o.Handle
			} else if o.Fingerprint != nil {
				if v.extra == nil {
					v.extra = map[int][]pkcs11.ObjectHandle{}
				}
				v.extra[pos] = append(v.extra[pos], o.Handle)
			}
		}
	}
	sort.Strings(order)

	n := len(live)
	returning := slices.Index(p.Members, opts.Returning)
	var deletes, copies []Action
	for _, k := range order {
		e := byID[k]
		var remaining []*holding
		leftover := returning >= 0 && unanswered(tombs, e.id)
		if returning >= 0 && inFlight(tombs, e.id) && slices.ContainsFunc(e.versions, func(v *holding) bool { return heldAlone(v, returning) }) {
			p.InFlight = append(p.InFlight, e.id)
			continue
		}
		for _, v := range e.versions {
			if leftover && heldAlone(v, returning) {
				h := v.holders[returning]
				for _, h := range append([]pkcs11.ObjectHandle{h}, v.extra[returning]...) {
					deletes = append(deletes, Action{Kind: Delete, Identity: e.id, Fingerprint: v.fp,
						Member: opts.Returning, Reason: ReasonUnanswered, handle: h})
				}
				continue
			}
			if tombstoned(tombs, e.id, v.fp) {
				for pos := 0; pos < n; pos++ {
					if h, ok := v.holders[pos]; ok {
						deletes = append(deletes, Action{Kind: Delete, Identity: e.id, Fingerprint: v.fp,
							Member: p.Members[pos], Reason: ReasonTombstone, handle: h})
					}
				}
				continue
			}
			remaining = append(remaining, v)
		}
		merged := mergeUnknown(remaining)
		p.Objects -= len(remaining) - len(merged) // one object, not two versions
		remaining = merged
		switch len(remaining) {
		case 0:
			continue
		case 1:
		default:
			c := Conflict{Identity: e.id}
			for _, v := range remaining {
				c.Versions = append(c.Versions, Version{Fingerprint: v.fp, Members: holderNames(p.Members, v.holders)})
			}
			p.Conflicts = append(p.Conflicts, c)
			continue
		}
		v := remaining[0]
		deletes = append(deletes, duplicates(e.id, v, p.Members)...)
		if len(v.holders)+len(v.unknown) == n {
			continue
		}
		if opts.Prune {
			for pos := 0; pos < n; pos++ {
				if h, ok := v.holders[pos]; ok {
					deletes = append(deletes, Action{Kind: Delete, Identity: e.id, Fingerprint: v.fp,
						Member: p.Members[pos], Reason: ReasonPrune, handle: h})
				} else if h, ok := v.unknown[pos]; ok {
					// Deleted as it is listed there: without a fingerprint.
					deletes = append(deletes, Action{Kind: Delete, Identity: e.id,
						Member: p.Members[pos], Reason: ReasonPrune, handle: h})
				}
			}
			continue
		}
		src := -1 // a holder that knows the fingerprint, which the copy checks
		for pos := 0; pos < n; pos++ {
			if _, ok := v.holders[pos]; ok {
				src = pos
				break
			}
		}
		for pos := 0; pos < n; pos++ {
			if !v.holds(pos) {
				absent := true
				for _, other := range e.versions {
					if _, held := other.holders[pos]; held {
						absent = false // a tombstoned version, deleted first
					}
				}
				copies = append(copies, Action{Kind: Copy, Identity: e.id, Fingerprint: v.fp,
					Member: p.Members[pos], Source: p.Members[src], Reason: ReasonMissing, handle: v.holders[src], absent: absent})
			}
		}
	}
	// Deletes: private halves and everything else before public keys.
	// Copies: public keys before everything else.
	sort.SliceStable(deletes, func(a, b int) bool {
		return deletes[a].Identity.Class != pkcs11.CKO_PUBLIC_KEY && deletes[b].Identity.Class == pkcs11.CKO_PUBLIC_KEY
	})
	sort.SliceStable(copies, func(a, b int) bool {
		return copies[a].Identity.Class == pkcs11.CKO_PUBLIC_KEY && copies[b].Identity.Class != pkcs11.CKO_PUBLIC_KEY
	})
	p.Actions = append(append(p.Actions, deletes...), copies...) // half-made deletes first
	return p, nil
}

// heldAlone reports whether the member at pos holds v and no other does.
func heldAlone(v *holding, pos int) bool {
	_, ok := v.holders[pos]
	return ok && len(v.holders) == 1
}

// duplicates plans the removal of v's extra copies on each member that
// holds it more than once, where another member holds it too: should a
// concurrent clean-up by another host take the member's last copy, it is
// copied again from there (see Replicator.Apply). A lone holder's
// duplicates are left: they are harmless (counted once), and removing one
// while another host removes the other would lose the object.
func duplicates(id object.Identity, v *holding, names []string) []Action {
	var out []Action
	for pos, hs := range v.extra {
		src := -1
		for other := range v.holders {
			if other != pos && (src < 0 || other < src) {
				src = other
			}
		}
		if src < 0 {
			continue
		}
		for _, h := range hs {
			out = append(out, Action{Kind: Delete, Identity: id, Fingerprint: v.fp, Member: names[pos],
				Source: names[src], Reason: ReasonDuplicate, handle: h})
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Member < out[b].Member })
	return out
}

func holderNames(names []string, holders map[int]pkcs11.ObjectHandle) []string {
	var out []string
	for pos, name := range names {
		if _, ok := holders[pos]; ok {
			out = append(out, name)
		}
	}
	return out
}

// ActionError is one action that failed.
type ActionError struct {
	Action Action
	Err    error
}

func (e *ActionError) Error() string { return e.Action.String() + ": " + e.Err.Error() }

// Unwrap returns the cause.
func (e *ActionError) Unwrap() error { return e.Err }

// ApplyResult says what Apply did.
type ApplyResult struct {
	Done   []Action      // actions carried out (or found already done)
	Failed []ActionError // actions that failed
	// Vanished are copies not made, or made and taken back, because the
	// object was destroyed while it was being copied: its source no
	// longer held it, or a tombstone for it appeared. Not failures.
	Vanished []Action
}

// Apply carries out p's actions in four phases: deletes of everything but
// public keys, deletes of public keys, copies of public keys, the other
// copies. Within a phase the members are worked on in parallel, and each
// member's actions one after the other: SoftHSM 2.6 sometimes answers
// CKR_TEMPLATE_INCONSISTENT when objects are created on one token from
// several threads at once, and gains nothing from it (it writes one file
// per object). Conflicts are left alone.
//
// A copy to a member whose listing showed no object with the identity
// does not search that member for an existing copy (Target.Absent): the
// plan's listing already said. So a member must not get objects of the
// plan's identities from elsewhere between MakePlan and Apply (a
// recovering member is out of rotation; a concurrent replication of the
// same object would leave a second, identical copy, which plans count
// once).
//
// It is idempotent: a copy whose target already holds the version, and a
// delete whose object is gone, succeed without change, so applying the
// same plan twice changes nothing the second time (the second Apply of a
// plan no longer trusts its listing). A copy never leaves a
// half-made object (Replicate's guarantee), so an Apply cut short, even by
// the death of the process, is finished by the next MakePlan + Apply.
//
// A copy whose object is destroyed while it is being copied is not a
// failure and does not bring the object back: when the source no longer
// holds it, before or after the copy is made, or when, after the copies,
// a tombstone for it has appeared (re-read with the plan's
// PlanOptions.LoadTombstones), the copy is not made or is taken back, and
// the action is in the result's Vanished.
//
// One failed action does not stop the others. The error, when not nil,
// joins every *ActionError (also in the result's Failed).
func (r *Replicator) Apply(ctx context.Context, p *Plan) (*ApplyResult, error) {
	// Phases, each finished before the next: a private EC key's
	// fingerprint on SoftHSM comes from its public half, so that half must
	// outlive the private key's deletion and precede its copy.
	var phases [4][]Action
	for _, a := range p.Actions {
		pub := a.Identity.Class == pkcs11.CKO_PUBLIC_KEY
		switch {
		case a.Kind == Delete && !pub:
			phases[0] = append(phases[0], a)
		case a.Kind == Delete:
			phases[1] = append(phases[1], a)
		case pub:
			phases[2] = append(phases[2], a)
		default:
			phases[3] = append(phases[3], a)
		}
	}
	defer func() { p.reapplied = true }()
	res := &ApplyResult{}
	var mu sync.Mutex
	var copied []copyDone
	progress, done := progressOf(ctx), 0
	for _, phase := range phases {
		byMember := map[string][]Action{}
		for _, a := range phase {
			byMember[a.Member] = append(byMember[a.Member], a)
		}
		var wg sync.WaitGroup
		for _, acts := range byMember {
			wg.Go(func() {
				for _, a := range acts {
					err := context.Cause(ctx)
					var srcH, dstH pkcs11.ObjectHandle
					if err == nil {
						srcH, dstH, err = r.apply(ctx, p, a)
					}
					mu.Lock()
					switch {
					case errors.Is(err, errVanished):
						res.Vanished = append(res.Vanished, a)
					case err != nil:
						res.Failed = append(res.Failed, ActionError{Action: a, Err: err})
					case a.Kind == Copy:
						copied = append(copied, copyDone{a, srcH, dstH})
					default:
						res.Done = append(res.Done, a)
					}
					done++
					progress(Progress{Done: done, Total: len(p.Actions), Member: a.Member})
					mu.Unlock()
				}
			})
		}
		wg.Wait()
	}
	r.settleCopies(ctx, p, copied, res)
	if len(res.Failed) == 0 {
		return res, nil
	}
	errs := make([]error, len(res.Failed))
	for i := range res.Failed {
		errs[i] = &res.Failed[i]
	}
	return res, errors.Join(errs...)
}

// errVanished: the object of a copy was destroyed while it was being
// copied.
var errVanished = errors.New("destroyed while being copied")

// copyDone is a copy made: the source handle it was made from and the
// copy's handle.
type copyDone struct {
	a          Action
	srcH, dstH pkcs11.ObjectHandle
}

// apply carries out a; for a copy it returns the source's handle and the
// copy's.
func (r *Replicator) apply(ctx context.Context, p *Plan, a Action) (srcH, dstH pkcs11.ObjectHandle, err error) {
	dst := p.slots[a.Member]
	if dst == nil {
		return 0, 0, fmt.Errorf("member %s is not in the plan", a.Member)
	}
	if a.Kind == Delete && a.Reason == ReasonDuplicate {
		return 0, 0, r.removeDuplicate(ctx, p, a)
	}
	if a.Kind == Delete && a.Reason == ReasonHalfMade {
		return 0, 0, destroyHalfMade(ctx, dst, a.handle)
	}
	if a.Kind == Delete {
		return 0, 0, destroyExact(ctx, dst, a.Identity, a.Fingerprint, a.handle)
	}
	src := p.slots[a.Source]
	if src == nil {
		return 0, 0, fmt.Errorf("member %s is not in the plan", a.Source)
	}
	h, err := findExact(ctx, src, a.Identity, a.Fingerprint, a.handle)
	if err != nil {
		return 0, 0, fmt.Errorf("find the source on %s: %w", a.Source, err)
	}
	if h == 0 {
		return 0, 0, fmt.Errorf("member %s no longer holds it: %w", a.Source, errVanished)
	}
	// Where the listing showed the identity absent on dst, the copy skips
	// its search of dst for an existing one (Target.Absent): a search
	// costs a visit of every object on a SoftHSM token, which made a
	// catch-up's cost grow with the square of its size. Otherwise
	// Replicate finds a copy already there (an earlier Apply of this
	// plan) and makes nothing then. On failure it leaves nothing on dst.
	dh, err := r.Replicate(ctx, src, h, Target{Slot: dst, Absent: a.absent && !p.reapplied})
	if err != nil {
		if ctx.Err() == nil {
			// Destroyed under the copy (the source's wrap or read found
			// no object): not a failure of the copy.
			if there, cerr := stillThere(ctx, src, h, a.Identity); cerr == nil && !there {
				return 0, 0, fmt.Errorf("member %s no longer holds it: %w", a.Source, errors.Join(errVanished, err))
			}
		}
		return 0, 0, err
	}
	return h, dh, nil
}

// stillThere reports whether handle h on s still is an object with
// identity id: one GetAttributes, where a full read (findExact) would cost
// a search of the token for a private EC key's public half.
func stillThere(ctx context.Context, s *slot.Slot, h pkcs11.ObjectHandle, id object.Identity) (bool, error) {
	a, err := object.ReadAttrs(ctx, s, h, object.IdentTypes)
	if object.IsGone(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("member %s: read attributes of object %d: %w", s.Name(), h, err)
	}
	got, err := object.IdentityOf(a)
	if err != nil {
		return false, nil
	}
	return got.Equal(id), nil
}

// settleCopies checks the copies made, after they are all made: one whose
// source no longer holds the object, or whose version a tombstone now
// names, was destroyed while it was being copied, and is taken back from
// its target (then Vanished). The rest are Done. Copies are taken back
// by their handle, private and secret keys before public ones: a private
// EC key's fingerprint on SoftHSM comes from its public half, so once
// that is gone it could no longer be found by fingerprint.
func (r *Replicator) settleCopies(ctx context.Context, p *Plan, copied []copyDone, res *ApplyResult) {
	if len(copied) == 0 {
		return
	}
	var kept []copyDone
	defer func() { r.settlePairs(ctx, p, kept, res) }()
	sort.SliceStable(copied, func(i, j int) bool {
		return copied[i].a.Identity.Class != pkcs11.CKO_PUBLIC_KEY && copied[j].a.Identity.Class == pkcs11.CKO_PUBLIC_KEY
	})
	tombs := p.Tombstones
	var tombErr error
	if p.loadTombs != nil {
		tombs, tombErr = p.loadTombs(ctx)
	}
	for _, c := range copied {
		a := c.a
		if tombErr != nil {
			res.Failed = append(res.Failed, ActionError{Action: a,
				Err: fmt.Errorf("copied, but the tombstones could not be read again to check that it was not destroyed meanwhile: %w", tombErr)})
			continue
		}
		gone := tombstoned(tombs, a.Identity, a.Fingerprint)
		if !gone {
			there, err := stillThere(ctx, p.slots[a.Source], c.srcH, a.Identity)
			if err != nil {
				res.Failed = append(res.Failed, ActionError{Action: a,
					Err: fmt.Errorf("copied, but whether the source still holds it is unknown: %w", err)})
				continue
			}
			gone = !there
		}
		if !gone {
			kept = append(kept, c)
			continue
		}
		if err := p.slots[a.Member].DestroyObject(ctx, c.dstH); err != nil && !object.IsGone(err) {
			res.Failed = append(res.Failed, ActionError{Action: a,
				Err: fmt.Errorf("destroyed on %s while being copied, and the copy could not be taken back: %w", a.Source, err)})
			continue
		}
		res.Vanished = append(res.Vanished, a)
	}
}

// findExact returns the handle of the object with identity id and exactly
// fingerprint fp on s (0 when there is none), trying the listed handle
// first: handles go stale after a re-login.
func findExact(ctx context.Context, s *slot.Slot, id object.Identity, fp []byte, listed pkcs11.ObjectHandle) (pkcs11.ObjectHandle, error) {
	if listed != 0 {
		if ok, err := isVersion(ctx, s, id, fp, listed); err != nil {
			return 0, err
		} else if ok {
			return listed, nil
		}
	}
	return otherCopy(ctx, s, id, fp, listed)
}

// isVersion reports whether h on s is the object with identity id and
// exactly fingerprint fp.
func isVersion(ctx context.Context, s *slot.Slot, id object.Identity, fp []byte, h pkcs11.ObjectHandle) (bool, error) {
	o, err := object.Read(ctx, s, s.Name(), h, nil)
	if object.IsGone(err) || unreadable(ctx, err) {
		// Gone, or an object the member will not describe (see
		// Unreadable): not the one sought.
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return o.Identity.Equal(id) && bytes.Equal(o.Fingerprint, fp), nil
}

// destroyExact destroys every object on s with identity id and exactly
// fingerprint fp (nil matches only objects without one, unlike
// Replicator.Destroy). None left is success.
func destroyExact(ctx context.Context, s *slot.Slot, id object.Identity, fp []byte, listed pkcs11.ObjectHandle) error {
	for range maxDuplicates {
		h, err := findExact(ctx, s, id, fp, listed)
		if err != nil {
			return err
		}
		if h == 0 {
			return nil
		}
		if err := s.DestroyObject(ctx, h); err != nil && !object.IsGone(err) {
			return fmt.Errorf("member %s: destroy %s (handle %d): %w", s.Name(), id, h, err)
		}
		listed = 0
	}
	return fmt.Errorf("member %s: %s: more than %d copies with fingerprint %s", s.Name(), id, maxDuplicates, object.FormatFingerprint(fp))
}

// maxDuplicates bounds destroyExact, so a token that reports success but
// keeps the object cannot loop it forever.
const maxDuplicates = 64
