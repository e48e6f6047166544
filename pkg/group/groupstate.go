package group

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/state"
)

// Group state on the members (DESIGN.md, "Group state on the members"):
// the behind marks that keep a member that missed changes out of every
// process's rotation until it is caught up. See pkg/sync/state's marker.go
// for the rule.

// StateSlots returns the slots of the members whose group state (see
// pkg/sync/state's Label) can be read and written now: serving (and,
// with recovering, being recovered), open, logged in, and of a make that
// carries group state (state.Carries: not a tpm2-pkcs11 token). A plan reads a
// recovering member's too: it may hold a destroy no other member saw, and
// its catch-up gives it what the others hold. Writes made outside a plan
// go to the serving members only, as the objects themselves do.
func (g *Group) StateSlots(recovering bool) []*slot.Slot {
	ms := g.view().members
	out := make([]*slot.Slot, 0, len(ms))
	for _, m := range ms {
		st := m.State()
		if !st.Serving() && !(recovering && st == member.Recovering) {
			continue
		}
		if s := m.Slot(); s != nil && s.LoggedIn() && state.Carries(s) {
			out = append(out, s)
		}
	}
	return out
}

// untold refuses a change of an object (a destroy, an attribute change)
// that a member out of rotation would miss while no serving member
// carries the group's state (each is of a make that carries none:
// state.Carries): no mark could tell another host that the member
// is behind, and that host's catch-up would undo the change — bring a
// destroyed key back (DESIGN.md, "Group state on every make"). The change
// can be made again once a member that carries the state serves, or
// every member does.
func (g *Group) untold(op string) error {
	var missed []string
	carried := false
	for _, m := range g.view().members {
		if !m.State().Serving() {
			missed = append(missed, m.Name())
			continue
		}
		if s := m.Slot(); s == nil || state.Carries(s) {
			carried = true
		}
	}
	if len(missed) == 0 || carried {
		return nil
	}
	return wrap(ErrNoMember, op, "", fmt.Errorf("%s out of rotation, and no serving member carries the group's state to mark it behind: another host's catch-up would undo the change",
		strings.Join(missed, ", ")))
}

// marks is this process's share of the behind marks.
type marks struct {
	writer string // names this process in the marks it leaves

	mu sync.Mutex
	// mine: missed member → member marked on → the latest mark left
	// there; an older one is removed once a newer one stands.
	mine map[string]map[*slot.Slot]ownMark
	// read: member under recovery → the marks naming it read before its
	// catch-up's first listing, which its activation clears.
	read map[string][]state.Mark
}

// ownMark is a mark this process left, with the slot's Epoch then: while
// it has not changed, the handle still names the mark.
type ownMark struct {
	state.Mark
	epoch uint64
}

func newMarks() *marks {
	b := make([]byte, 8)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return &marks{writer: hex.EncodeToString(b), mine: map[string]map[*slot.Slot]ownMark{}, read: map[string][]state.Mark{}}
}

// markMissed runs after every object change through the group (see
// beginWrite): each configured member out of rotation missed it, and
// every serving member is given a mark saying so. Nothing is written
// while every member serves. A new mark is left each time, after the
// change, so that a catch-up that read the older one before its listing
// and clears it cannot clear the news of this change.
func (g *Group) markMissed(ctx context.Context) {
	var missed []string
	for _, m := range g.view().members {
		if !m.State().Serving() {
			missed = append(missed, m.Name())
		}
	}
	if len(missed) == 0 {
		return
	}
	targets := g.StateSlots(false)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.commandDeadline())
	defer cancel()
	g.marks.mu.Lock()
	defer g.marks.mu.Unlock()
	for _, name := range missed {
		if g.marks.mine[name] == nil {
			g.marks.mine[name] = map[*slot.Slot]ownMark{}
		}
	}
	var mu sync.Mutex // guards g.marks.mine's inner maps below
	var wg sync.WaitGroup
	for _, s := range targets {
		wg.Go(func() {
			for _, name := range missed {
				epoch := s.Epoch()
				h, err := state.WriteMark(ctx, s, g.serial, name, g.marks.writer)
				if err != nil {
					g.emit(Event{Kind: GroupStateFailed, Member: s.Name(), Err: fmt.Errorf("member %s missed a change, and %s could not be told: %w", name, s.Name(), err)})
					continue
				}
				mine := g.marks.mine[name]
				mu.Lock()
				old, had := mine[s]
				mine[s] = ownMark{Mark: state.Mark{Member: name, Writer: g.marks.writer, On: s, Handle: h}, epoch: epoch}
				mu.Unlock()
				if !had {
					continue
				}
				// A leftover only costs a catch-up.
				if old.epoch == epoch {
					_ = s.DestroyObject(ctx, old.Handle)
				} else {
					_ = state.ClearMark(ctx, g.serial, old.Mark)
				}
			}
		})
	}
	wg.Wait()
}

// readMarks reads the behind marks on every serving member, in parallel.
// A member that cannot be read is reported and left out.
func (g *Group) readMarks(ctx context.Context, recovering bool) []state.Mark {
	slots := g.StateSlots(recovering)
	found := make([][]state.Mark, len(slots))
	var wg sync.WaitGroup
	for i, s := range slots {
		wg.Go(func() {
			ks, err := state.ReadMarks(ctx, s, g.serial)
			if err != nil {
				g.emit(Event{Kind: GroupStateFailed, Member: s.Name(), Err: err})
				return
			}
			found[i] = ks
		})
	}
	wg.Wait()
	var out []state.Mark
	for _, ks := range found {
		out = append(out, ks...)
	}
	return out
}

// admitMembers keeps out of rotation every serving member that another
// member marks behind, and returns their names: it missed a change made through the group (by any
// process, on any host) and has not been caught up since. It is failed
// with the reason, so recovery catches it up and returns it. When every
// serving member is marked, none is failed (each holds what another
// lacks: the hosts were partitioned from different members) and a
// GroupStateFailed event says to synchronize. Called once the group is
// logged in: marks are private objects.
func (g *Group) admitMembers(ctx context.Context) []string {
	ks := g.readMarks(ctx, false)
	if len(ks) == 0 {
		return nil
	}
	why := map[string]state.Mark{}
	for _, k := range ks {
		if k.On.Name() != k.Member {
			why[k.Member] = k
		}
	}
	var behind []*member.Member
	current := 0
	for _, m := range g.serving() {
		if _, ok := why[m.Name()]; ok {
			behind = append(behind, m)
		} else {
			current++
		}
	}
	if len(behind) == 0 {
		return nil
	}
	if current == 0 {
		g.emit(Event{Kind: GroupStateFailed, Err: errors.New(
			"every serving member is marked as having missed changes made through the group while it was away (hosts were partitioned from different members): all stay in service; run hactl hagroup synchronize to merge them")})
		return nil
	}
	var names []string
	for _, m := range behind {
		k := why[m.Name()]
		g.failMember(m, fmt.Errorf("behind: member %s holds a mark that %s missed a change made through the group while it was away; it serves again once it is caught up", k.On.Name(), m.Name()))
		names = append(names, m.Name())
	}
	return names
}

// noteMarks reads the marks naming member m, before its catch-up lists
// anything, for its activation to clear.
func (g *Group) noteMarks(ctx context.Context, m *member.Member) {
	var mine []state.Mark
	for _, k := range g.readMarks(ctx, true) {
		if k.Member == m.Name() {
			mine = append(mine, k)
		}
	}
	g.marks.mu.Lock()
	g.marks.read[m.Name()] = mine
	g.marks.mu.Unlock()
}

// missedHeldAway returns, when this process changed the group while
// member name was out of rotation and none of the members it told so
// (the marks it left naming name) serves now, those members: the
// catch-up read none of them, so it took in none of those changes, and
// the member must not serve (a key destroyed meanwhile would be served
// again). When every mark failed to be written, any other serving member
// will do: the changes went to the members serving then, which are
// unknown here. Nil when the member missed nothing this process knows of.
func (g *Group) missedHeldAway(name string) []string {
	g.marks.mu.Lock()
	told, missed := g.marks.mine[name]
	var holders []string
	for s := range told {
		holders = append(holders, s.Name())
	}
	g.marks.mu.Unlock()
	if !missed {
		return nil
	}
	var away []string
	for _, m := range g.view().members {
		if m.Name() == name || (len(holders) > 0 && !slices.Contains(holders, m.Name())) {
			continue
		}
		if m.State().Serving() {
			return nil
		}
		away = append(away, m.Name())
	}
	return away
}

// clearMarks removes, once member name is caught up and back in rotation,
// the marks naming it that were read before its catch-up, and those this
// process left (its changes were all in the catch-up's final pass, under
// the write barrier). A mark left since by another process stays: that
// change may have been missed, and the member is caught up again.
func (g *Group) clearMarks(ctx context.Context, name string) {
	g.marks.mu.Lock()
	ks := g.marks.read[name]
	delete(g.marks.read, name)
	for _, k := range g.marks.mine[name] {
		ks = append(ks, k.Mark)
	}
	delete(g.marks.mine, name)
	g.marks.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.commandDeadline())
	defer cancel()
	for _, k := range ks {
		if err := state.ClearMark(ctx, g.serial, k); err != nil {
			g.emit(Event{Kind: GroupStateFailed, Member: k.On.Name(), Err: err})
		}
	}
}

// BehindMarks returns the behind marks on the serving members, for a
// caller that is about to make them equal (a synchronize) and may then
// clear the marks it read before (ClearBehindMarks).
func (g *Group) BehindMarks(ctx context.Context) []state.Mark {
	return g.readMarks(ctx, false)
}

// ClearBehindMarks removes marks read by BehindMarks before a
// synchronisation that made every serving member equal: the changes they
// tell of were in its listing. Only marks naming a serving member go; a
// member out of rotation was not synchronised.
func (g *Group) ClearBehindMarks(ctx context.Context, ks []state.Mark) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.commandDeadline())
	defer cancel()
	for _, k := range ks {
		if m, ok := g.Member(k.Member); !ok || !m.State().Serving() {
			continue
		}
		if err := state.ClearMark(ctx, g.serial, k); err != nil {
			g.emit(Event{Kind: GroupStateFailed, Member: k.On.Name(), Err: err})
		}
	}
}

// FollowMarks is the login's admission (admitMembers) for a process that
// lives on after its login: a serving member that another member now marks
// behind (another process, on any host, changed the group while the member
// was away from it) is failed with the reason "behind", and its name is
// returned for the caller to catch it up. Nothing is read before the group
// is logged in (marks are private). One FindObjects per serving member,
// and one GetAttributeValue per mark found.
func (g *Group) FollowMarks(ctx context.Context) []string {
	if _, ok := g.LoggedIn(); !ok {
		return nil
	}
	return g.admitMembers(ctx)
}
