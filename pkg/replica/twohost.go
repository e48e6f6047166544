package replica

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// Two hosts may catch up one member at the same moment: each has its own
// recovery lock (state_dir is per host), each lists the member before the
// other copies, so each plan says the member lacks the object. What keeps
// the member right is re-checking it, never a lock: after the copies each
// target is looked at again (recheckTargets), a public key is kept only
// with its private half (settlePairs), and a plan removes the duplicates
// of one version that a race left (ReasonDuplicate, removeDuplicate).

// settlePairs finishes the copies Apply made and found still wanted
// (kept): a public key copied in this Apply whose private half (same
// CKA_ID and key type, to the same member) was not copied — it failed,
// vanished or was left out — is taken back, since a member with the
// public half of a key and not its private half answers "key not found"
// for a key it seems to hold; then every target is re-checked for copies
// another host made meanwhile. What survives is Done.
func (r *Replicator) settlePairs(ctx context.Context, p *Plan, kept []copyDone, res *ApplyResult) {
	lost := map[string]error{} // pair key -> why its private half is not there
	for _, f := range res.Failed {
		if f.Action.Kind == Copy && f.Action.Identity.Class == pkcs11.CKO_PRIVATE_KEY {
			lost[f.Action.PairKey()] = f.Err
		}
	}
	for _, a := range res.Vanished {
		if a.Identity.Class == pkcs11.CKO_PRIVATE_KEY {
			lost[a.PairKey()] = errVanished
		}
	}
	var done []copyDone
	for _, c := range kept {
		why, orphan := lost[c.a.PairKey()]
		// Only a copy this Apply made for certain (the member held no
		// object of the identity) is taken back: otherwise the handle may
		// be an object that was there before.
		if !orphan || c.a.Identity.Class != pkcs11.CKO_PUBLIC_KEY || !c.a.absent || p.reapplied {
			done = append(done, c)
			continue
		}
		cc := cleanupContext(ctx)
		err := p.slots[c.a.Member].DestroyObject(cc.ctx, c.dstH)
		cc.cancel()
		switch {
		case err != nil && !isGone(err):
			res.Failed = append(res.Failed, ActionError{Action: c.a,
				Err: fmt.Errorf("copied without its private half (%v), and could not be taken back: %w", why, err)})
		case errors.Is(why, errVanished):
			res.Vanished = append(res.Vanished, c.a)
		default:
			res.Failed = append(res.Failed, ActionError{Action: c.a,
				Err: fmt.Errorf("taken back: its private half was not copied: %w", why)})
		}
	}
	r.recheckTargets(ctx, p, done, res)
}

// PairKey names the key pair the action's object belongs to on the
// member it changes: equal for a private key and its public half (same
// CKA_ID and key type) on one member.
func (a Action) PairKey() string {
	return fmt.Sprintf("%s\x00%x\x00%x", a.Member, a.Identity.KeyType, a.Identity.ID)
}

// recheckTargets looks at every member copied to once more, after the
// copies: one FindObjects per member and one GetAttributes per object
// (the identities), so a catch-up's cost still grows with the token, not
// its square. A copy whose identity the member now holds more than once,
// with the same material, was made by another host too: ours is taken
// back, and should the other host have taken its own back at the same
// moment (none left), the object is copied once more. Every copy ends
// Done unless that fails.
func (r *Replicator) recheckTargets(ctx context.Context, p *Plan, done []copyDone, res *ApplyResult) {
	byMember := map[string][]copyDone{}
	for _, c := range done {
		byMember[c.a.Member] = append(byMember[c.a.Member], c)
	}
	for member, cs := range byMember {
		dst := p.slots[member]
		// Public keys first: a private EC key's fingerprint on SoftHSM
		// comes from its public half, which cannot be told while that half
		// is there twice.
		sort.SliceStable(cs, func(i, j int) bool {
			return cs[i].a.Identity.Class == pkcs11.CKO_PUBLIC_KEY && cs[j].a.Identity.Class != pkcs11.CKO_PUBLIC_KEY
		})
		held, err := identityCounts(ctx, dst, cs)
		if err != nil {
			for _, c := range cs {
				res.Failed = append(res.Failed, ActionError{Action: c.a,
					Err: fmt.Errorf("copied, but member %s could not be re-checked for a second copy: %w", member, err)})
			}
			continue
		}
		for _, c := range cs {
			if held[c.a.Identity.Key()] > 1 {
				if err := r.dropSecondCopy(ctx, p, c); err != nil {
					res.Failed = append(res.Failed, ActionError{Action: c.a, Err: err})
					continue
				}
			}
			res.Done = append(res.Done, c.a)
		}
	}
}

// identityCounts counts, on s, the token objects of each identity copied
// by cs.
func identityCounts(ctx context.Context, s *slot.Slot, cs []copyDone) (map[string]int, error) {
	want := map[string]bool{}
	for _, c := range cs {
		want[c.a.Identity.Key()] = true
	}
	hs, err := s.FindObjects(ctx, []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true)})
	if err != nil {
		return nil, fmt.Errorf("find objects: %w", err)
	}
	counts := map[string]int{}
	for _, h := range hs {
		a, err := readAttrs(ctx, s, h, identTypes)
		if isGone(err) || unreadable(ctx, err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read object %d: %w", h, err)
		}
		id, err := identityOf(a)
		if err != nil {
			continue
		}
		if k := id.Key(); want[k] {
			counts[k]++
		}
	}
	return counts, nil
}

// dropSecondCopy takes back copy c where its target holds another object
// with the same identity and material, and makes sure one stays.
func (r *Replicator) dropSecondCopy(ctx context.Context, p *Plan, c copyDone) error {
	dst := p.slots[c.a.Member]
	other, err := otherCopy(ctx, dst, c.a.Identity, c.a.Fingerprint, c.dstH)
	if err != nil {
		return fmt.Errorf("copied, but the second copy on %s could not be checked: %w", c.a.Member, err)
	}
	if other == 0 {
		return nil // another version under the identity: MakePlan reports the conflict
	}
	if err := dst.DestroyObject(ctx, c.dstH); err != nil && !isGone(err) {
		return fmt.Errorf("member %s: %s copied twice (by another host too), and the second copy (handle %d) could not be destroyed: %w",
			c.a.Member, c.a.Identity, c.dstH, err)
	}
	return r.keepOne(ctx, p, c.a, c.srcH)
}

// otherCopy returns an object on s other than mine with identity id and
// fingerprint fp, 0 when there is none.
func otherCopy(ctx context.Context, s *slot.Slot, id Identity, fp []byte, mine pkcs11.ObjectHandle) (pkcs11.ObjectHandle, error) {
	hs, err := s.FindObjects(ctx, id.template())
	if err != nil {
		return 0, fmt.Errorf("member %s: find %s: %w", s.Name(), id, err)
	}
	for _, h := range hs {
		if h == mine {
			continue
		}
		if ok, err := isVersion(ctx, s, id, fp, h); err != nil || ok {
			return h, err
		}
	}
	return 0, nil
}

// keepOne makes sure a.Member still holds a's version after a duplicate
// of it was destroyed there: another host cleaning up the same duplicates
// at the same moment may have destroyed the other copy. Then it is copied
// again from src (srcH when known), which searches the member first.
func (r *Replicator) keepOne(ctx context.Context, p *Plan, a Action, srcH pkcs11.ObjectHandle) error {
	dst := p.slots[a.Member]
	if h, err := findExact(ctx, dst, a.Identity, a.Fingerprint, 0); err != nil || h != 0 {
		return err
	}
	src := p.slots[a.Source]
	if src == nil {
		return fmt.Errorf("member %s: its last copy of %s was destroyed by a concurrent clean-up and no member is named to copy it from", a.Member, a.Identity)
	}
	h, err := findExact(ctx, src, a.Identity, a.Fingerprint, srcH)
	if err != nil {
		return fmt.Errorf("find the source on %s: %w", a.Source, err)
	}
	if h == 0 {
		return fmt.Errorf("member %s no longer holds it: %w", a.Source, errVanished)
	}
	if _, err := r.Replicate(ctx, src, h, Target{Slot: dst}); err != nil {
		return fmt.Errorf("copy again after a concurrent clean-up: %w", err)
	}
	return nil
}

// removeDuplicate carries out a ReasonDuplicate delete: the listed extra
// copy goes (when it still is the very version), and one copy is kept.
func (r *Replicator) removeDuplicate(ctx context.Context, p *Plan, a Action) error {
	dst := p.slots[a.Member]
	h := a.handle
	if ok, err := isVersion(ctx, dst, a.Identity, a.Fingerprint, h); err != nil || !ok {
		return err // gone already (or the handle went stale): nothing to remove by it
	}
	if other, err := otherCopy(ctx, dst, a.Identity, a.Fingerprint, h); err != nil || other == 0 {
		return err // the other copies went meanwhile: this one stays
	}
	if err := dst.DestroyObject(ctx, h); err != nil && !isGone(err) {
		return fmt.Errorf("member %s: destroy a duplicate of %s (handle %d): %w", a.Member, a.Identity, h, err)
	}
	return r.keepOne(ctx, p, a, 0)
}
