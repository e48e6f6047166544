package group

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hagroup/hagroup/pkg/group/opstate"
	"github.com/hagroup/hagroup/pkg/group/vtable"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// An operation's way down lives here, from the virtual session's Do to
// the member's call, in the order a call goes: the session's operations
// (opstate.Table's runner), then the attempts.
//
// Failover lives here. Every operation that may run on more than one
// member goes through exec: it chooses the member (the scheduler's pick,
// or configured order for key management), resolves the virtual handles
// on it, runs, classifies the error, charges the member's health by the
// one rule (member.Charged, gathered in a member.Verdict), and fails over
// or stops. A change every member must take (a destroy, an attribute
// change) goes to the first through exec and then to the others
// (writeAll). A call made on one member with no other to compare (call)
// never fails a member for an ambiguous error. A member that does not
// hold an object is skipped without charge, and "no such key" is
// answered only when no serving member holds it. A hedgeable plan's
// attempt may have a second one beside it on another member (hedge.go):
// their answers come back here one at a time and are charged here, but
// for the one exec no longer waits for, which race.abandon charges by
// the same rule (a member.Verdict). A single-part call that changes
// nothing (hedged) is exec with such a race when the group
// hedges.

// ---- operations: the virtual session's runner for opstate.Table ----

// Init starts operation k (C_SignInit …) with mech and key (0 for a
// digest). The Init is sent to a member now, so that its answer
// (CKR_KEY_SIZE_RANGE, CKR_MECHANISM_PARAM_INVALID …) is the call's, as on
// a bare token; a member that fails for a health reason passes it on to
// the next. It is not sent when the same Init was accepted before (see
// opstate.Proofs): then the first data call sends it, on the member the
// scheduler picks then.
func (s *Session) Init(ctx context.Context, k OpKind, mech *pkcs11.Mechanism, key ObjectHandle) error {
	op := &operation{Mech: mech} // copied by the Table: stays on the stack
	if k != OpDigest {
		var err error
		if op.At.key, err = s.g.key(k.InitName(), key, argOpKey); err != nil {
			return err
		}
		if err := usable(k.InitName(), []*vtable.Object{op.At.key}); err != nil {
			return err
		}
	}
	if err := s.enter(k.InitName()); err != nil {
		return err
	}
	defer s.leave()
	return s.ops.Init(ctx, (*opRunner)(s), k, op)
}

// Active reports whether an operation is active in the session (a search
// is the caller's: it must not start one then, as the token would not).
func (s *Session) Active() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ops.Active()
}

// Cancel ends operation k without a result (C_SignInit with a NULL
// mechanism …).
func (s *Session) Cancel(k OpKind) error {
	if err := s.enter(k.InitName()); err != nil {
		return err
	}
	defer s.leave()
	return s.ops.Cancel((*opRunner)(s), k)
}

// Do runs step st of operation k with in (and sig, for a verification's
// single part and Final) and returns its output, within room: a length
// query (RoomQuery) or a short buffer keeps the output and the operation
// for the next call of the same step with the same input (then the error
// is nil, or opstate.ErrBufferTooSmall), as PKCS#11's buffer convention says. A
// single-part step and a Final end the operation, and so does any error
// but opstate.ErrBufferTooSmall.
//
// A single-part step that no Update came before runs in one call (its
// Init and itself) from the members' session pools, by the group's
// failover and hedging, whether its Init was proven (deferred) or sent to
// a member at the application's *Init (that member's session, which holds
// the Init, is let go first): one route for both. Any other step runs on
// the operation's member (opRunner.Run).
func (s *Session) Do(ctx context.Context, k OpKind, st Step, in, sig []byte, room Room) ([]byte, error) {
	if err := s.enter(st.Name(k)); err != nil {
		return nil, err
	}
	defer s.leave()
	r := (*opRunner)(s)
	op, out, held, err := s.ops.Begin(ctx, r, k, st, in)
	if err != nil {
		return nil, err
	}
	switch {
	case held:
	case st == StepSingle && !op.Started:
		s.stop(k, op, true) // (a placed Init's member session)
		var objs []*vtable.Object
		if op.At.key != nil {
			objs = []*vtable.Object{op.At.key}
		}
		out, err = hedged(ctx, s.g, k.String(), objs, shotCall{k, op.Mech, in, sig})
	default:
		out, err = r.Run(ctx, k, op, st, in, sig, nil)
	}
	return s.ops.End(r, k, op, st, in, out, err, false, room)
}

// enter begins an operation's call op: inside the group's gate, with the
// session locked, and refused when the session is closed or lost (the
// call's one look at that). On success the caller defers leave.
func (s *Session) enter(op string) error {
	if err := s.g.gate.Enter(); err != nil {
		return err
	}
	s.mu.Lock()
	if err := s.checkOpen(op); err != nil {
		s.leave()
		return err
	}
	return nil
}

// leave ends what enter began.
func (s *Session) leave() {
	s.mu.Unlock()
	s.g.gate.Leave()
}

// opRunner is a Session as its opstate.Table's Runner (kept off the
// Session API).
type opRunner Session

func (r *opRunner) Start(ctx context.Context, k OpKind, op *operation) error {
	return (*Session)(r).start(ctx, k, op)
}

func (r *opRunner) Stop(k OpKind, op *operation, live bool) { (*Session)(r).stop(k, op, live) }

func (r *opRunner) Code(err error) uint { return CodeOf(err) }

// start is the Runner's Start: the Init goes to a member now, unless proven.
func (s *Session) start(ctx context.Context, k OpKind, op *operation) error {
	pk, provable := proofKeyOf(k, op)
	changes := s.g.changes.Load()
	if provable && s.g.proofs.Proven(pk, changes) {
		return nil
	}
	_, err := s.place(ctx, k, op, k.InitName(), 0, nil, nil, nil)
	if err == nil && provable {
		s.g.proofs.Record(pk, changes)
	}
	return err
}

// stop is the Runner's Stop: the operation's member session is closed, which
// ends whatever the member still holds of it.
func (s *Session) stop(_ OpKind, op *operation, _ bool) {
	if op.At.ps != nil {
		op.At.ps.Close()
	}
	if op.Started {
		op.At.m.Unpin()
	}
	op.At.m, op.At.ps, op.Started = nil, nil, false
}

// Run is the Runner's Run, for a step on the operation's member (Do
// sends a single-part step before any Update through the pools). Before
// any Update was accepted there nothing is committed, so a member that
// fails for a health reason (or left) passes the operation on: the Init
// is sent again, with its kept parameters, on the next member, then this
// step. Once an Update was accepted it is pinned: if the member fails,
// the operation ends with ErrMemberLost (CKR_DEVICE_ERROR) and the
// application must start again. A deferred operation (proven Init) is
// placed at this, its first step on a member.
func (r *opRunner) Run(ctx context.Context, k OpKind, op *operation, st Step, in, sig []byte, with *vtable.Object) ([]byte, error) {
	s := (*Session)(r)
	opName := st.Name(k)
	if with != nil {
		opName = "DigestKey"
	}
	fn := func(ps *slot.Session, wh *pkcs11.ObjectHandle) ([]byte, error) {
		return opstate.StepOn(ctx, k, st, ps, in, sig, wh)
	}
	var skip memberSet
	var v *member.Verdict
	if m := op.At.m; m != nil {
		if m.State().Serving() && m.Epoch() == op.At.epoch {
			out, class, fail, err := s.onMember(ctx, op, with, fn)
			switch {
			case err == nil:
				s.started(op, st)
				return out, nil
			case class != slot.ClassHealth || ctx.Err() != nil:
				return nil, opErr(opName, m.Name(), err)
			case op.Started && !member.Charged(err, false):
				// Pinned: no other member can serve the same request, so
				// the rule makes it the token's answer, and m stays.
				return nil, opErr(opName, m.Name(), err)
			case op.Started:
				s.g.failMember(m, err)
				return nil, wrap(ErrMemberLost, opName, m.Name(), err)
			}
			v = new(member.Verdict) // the operation moves on: charged as exec's own
			if v.Health(m, err, fail) {
				s.g.failMember(m, err)
			}
			m.AddFailover()
		} else if op.Started {
			return nil, wrap(ErrMemberLost, opName, m.Name(), nil)
		}
		skip.add(m.Index())
		s.stop(k, op, true)
	}
	out, err := s.place(ctx, k, op, opName, skip, v, with, fn)
	if err == nil {
		s.started(op, st)
	}
	return out, err
}

// started records that an Update was accepted: the operation is pinned
// to its member from now on.
func (s *Session) started(op *operation, st Step) {
	if st == StepUpdate && !op.Started && op.At.m != nil {
		op.Started = true
		op.At.m.Pin()
	}
}

// onMember runs fn on the operation's member session, with resolved on
// that member.
func (s *Session) onMember(ctx context.Context, op *operation, with *vtable.Object,
	fn func(*slot.Session, *pkcs11.ObjectHandle) ([]byte, error)) ([]byte, slot.Class, bool, error) {
	var wh *pkcs11.ObjectHandle
	if with != nil {
		h, err := s.g.resolveHeld(ctx, "DigestKey", with, op.At.m)
		switch {
		case errors.Is(err, ErrKeyHandle), errors.Is(err, ErrObjectHandle):
			// Nothing reached the member: its operation goes on, as a
			// token's does after a bad handle.
			return nil, slot.ClassRequest, false, err
		case err != nil:
			return nil, slot.ClassOf(err), false, err
		}
		wh = &h
	}
	var out []byte
	class, fail, err := s.g.measure(ctx, op.At.m, func() (err error) {
		out, err = fn(op.At.ps, wh)
		return err
	})
	return out, class, fail, err
}

// stepFn runs one step on a member session; wh is the object the step
// names besides the key (C_DigestKey), resolved on that member.
type stepFn func(ps *slot.Session, wh *pkcs11.ObjectHandle) ([]byte, error)

// place puts op on a member and runs fn there (nil: the Init alone), by
// the group's failover (exec): members in skip, and those that do not
// hold the objects, are passed over. On success op runs on that member
// from now on.
func (s *Session) place(ctx context.Context, k OpKind, op *operation, opName string, skip memberSet, v *member.Verdict, with *vtable.Object, fn stepFn) ([]byte, error) {
	var objs []*vtable.Object // the operation's key, then with's object
	if op.At.key != nil {
		objs = append(objs, op.At.key)
	}
	if with != nil {
		objs = append(objs, with)
	}
	next := func(tried memberSet) *member.Member { return s.g.pickFor(op.At.key, tried|skip) }
	absent := argOpKey.bad() // no member holds the Init's key (one a logout hid, too)
	if op.At.key == nil {
		absent = argKey.bad() // C_DigestKey's
	}
	var out []byte
	var ps *slot.Session
	var ep uint64
	m, err := s.g.exec(ctx, plan{op: opName, objs: objs, next: next, verdict: v, absent: absent}, func(ctx context.Context, m *member.Member, sl *slot.Slot, hs []pkcs11.ObjectHandle) (err error) {
		var kh pkcs11.ObjectHandle
		if op.At.key != nil {
			kh = hs[0]
		}
		var wh *pkcs11.ObjectHandle
		if with != nil {
			wh = &hs[len(hs)-1]
		}
		ep = m.Epoch()
		if ps, err = sl.OpenSession(ctx); err != nil {
			return err
		}
		if err = opstate.InitOn(ctx, k, ps, op.Mech, kh); err == nil && fn != nil {
			out, err = fn(ps, wh)
		}
		if err != nil {
			ps.Close()
			ps = nil
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	op.At.m, op.At.ps, op.At.epoch = m, ps, ep
	return out, nil
}

// ---- attempts: failover, charging and hedging of one request ----

// errAbsent says a member does not hold the object (not its fault). It
// never leaves this file and resolve.
var errAbsent = errors.New("object not on this member")

// attempt is one try of an operation on one member, with the physical
// handles of the objects it names already resolved there.
type attempt func(ctx context.Context, m *member.Member, s *slot.Slot, hs []pkcs11.ObjectHandle) error

// plan says where exec may run an operation.
type plan struct {
	op   string
	objs []*vtable.Object // resolved on each member tried
	// next returns the member to try next, not one in skip; nil: the
	// scheduler (pickFor the first of objs, pick without objs).
	next func(skip memberSet) *member.Member
	// avoid: members tried only when no other can serve.
	avoid memberSet
	// ready, when set, gets a member ready for fn after the look-ups (a
	// lone call, charged by itself); its errors count as a look-up's.
	ready func(ctx context.Context, m *member.Member) error
	// verdict, when set, holds this request's answers before exec (a
	// placed operation's first step on its member), charged as exec's own.
	verdict *member.Verdict
	// absent is the error when no serving member holds objs; nil:
	// ErrKeyHandle for a key, ErrObjectHandle otherwise.
	absent *Error
	// race, when set, runs the request on two members at once when one
	// is late (hedge.go, set up by raced): a single-part call that leaves
	// no state on a member and changes no object, whose fn keeps each
	// member's answer apart.
	race *race
	// again: the request leaves no state on a member and changes no
	// object, so when no other member can serve it, the member whose
	// held-back CKR_GENERAL_ERROR the caller would get is asked once more
	// if its make answers so in passing (retriesAmbiguous), and its
	// serving then charges nothing (member.Verdict.ServedBy).
	again bool
}

// stop marks an attempt's error as final: exec charges it by the rule
// but tries no other member (a write that may have half-happened).
type stop struct{ err error }

func (e *stop) Error() string { return e.err.Error() }
func (e *stop) Unwrap() error { return e.err }

// unserved is the error when no member served v's request: the token's
// own answer wherever a token answered and held it back (member.Charged),
// even where others were down: the request is at fault, as on the bare
// token (the conformance harness's sweeps under a primary kill: a PSS salt
// the token refuses with CKR_GENERAL_ERROR read CKR_DEVICE_ERROR while the
// primary was dead).
func unserved(v *member.Verdict, op string) error {
	if _, err := v.Unserved(); err != nil {
		return opErr(op, "", err)
	}
	return wrap(ErrNoMember, op, "", v.Last())
}

// exec runs fn by p (see the rule above) and returns the member that
// served it, or that gave the error returned.
func (g *Group) exec(ctx context.Context, p plan, fn attempt) (*member.Member, error) {
	if err := g.gate.Enter(); err != nil {
		return nil, err
	}
	defer g.gate.Leave()
	if err := usable(p.op, p.objs); err != nil {
		return nil, err
	}
	var v member.Verdict
	if p.verdict != nil {
		v = *p.verdict
	}
	var skip, stale memberSet
	avoid := p.avoid
	absent, retriedAbsent, askedAgain := false, false, false
	hs := make([]pkcs11.ObjectHandle, len(p.objs))
	r := p.race
	served := false
	if r != nil {
		defer func() { r.abandon(served) }()
	}
	for {
		if err := ctx.Err(); err != nil {
			return nil, opErr(p.op, "", err)
		}
		var o outcome
		if r.pending() {
			// A hedge's other attempt is still out: its answer comes next.
			var err error
			if o, err = r.wait(ctx); err != nil {
				return nil, opErr(p.op, "", err)
			}
		} else {
			m := g.nextFor(p, skip|avoid)
			if m == nil && avoid != 0 {
				avoid = 0
				continue
			}
			if m == nil {
				if absent && v.Last() == nil && !retriedAbsent {
					// Every live member said "not here" from its cache: look
					// again once, in case another process replicated it since.
					retriedAbsent = true
					for _, o := range p.objs {
						o.ForgetAbsent()
					}
					skip, absent = 0, false
					continue
				}
				if again, err := v.Unserved(); p.again && !askedAgain && again != nil &&
					slot.CodeOf(err) == pkcs11.CKR_GENERAL_ERROR && retriesAmbiguous(again.Slot()) {
					askedAgain = true
					skip, avoid = skip.without(again.Index()), avoid.without(again.Index())
					continue
				}
				break
			}
			if r == nil {
				o = g.try(ctx, p, m, hs, fn)
			} else {
				var err error
				o, err = r.start(ctx, m, hs, skip|avoid)
				if err != nil {
					return nil, opErr(p.op, "", err)
				}
			}
		}
		m, class, fail, err := o.m, o.class, o.fail, o.err
		if err := o.prep; err != nil {
			skip.add(m.Index())
			switch {
			case errors.Is(err, errAbsent):
				absent = true
				continue
			case errors.Is(err, ErrConflict):
				return m, wrap(ErrConflict, p.op, m.Name(), err)
			case slot.ClassOf(err) == slot.ClassHealth && ctx.Err() == nil:
				v.Noted(err)
				m.AddFailover()
				continue
			}
			return m, opErr(p.op, m.Name(), err)
		}
		final := finalErr(err)
		if final != nil {
			err = final.err
		}
		switch {
		case class == slot.ClassNone:
			served = true
			v.ServedBy(m, g.failMember)
			return m, nil
		case class == slot.ClassHealth:
			if v.Health(m, err, fail) {
				g.failMember(m, err)
			}
			m.AddFailover()
			skip.add(m.Index())
			if final != nil {
				return m, opErr(p.op, m.Name(), err)
			}
			continue
		case len(p.objs) > 0 && slot.StaleHandle(err) && !stale.has(m.Index()):
			// The cached physical handle went stale (re-login, object
			// replaced): find it again once.
			stale.add(m.Index())
			for _, o := range p.objs {
				o.Forget(m.Index())
			}
			continue
		}
		return m, opErr(p.op, m.Name(), err)
	}
	if v.Last() == nil && absent {
		return nil, p.notHeld()
	}
	return nil, unserved(&v, p.op)
}

// nextFor is the member p runs on next, not one in skip: p.next's, or
// the scheduler's pick (for p's object, where its handle is known).
func (g *Group) nextFor(p plan, skip memberSet) *member.Member {
	switch {
	case p.next != nil:
		return p.next(skip)
	case len(p.objs) > 0:
		return g.pickFor(p.objs[0], skip)
	}
	return g.pick(skip)
}

// outcome is one attempt's answer on one member.
type outcome struct {
	m     *member.Member
	prep  error // prepareOn's error: fn did not run
	class slot.Class
	fail  bool
	err   error
}

// try resolves p.objs on m into hs and runs fn there, measured.
func (g *Group) try(ctx context.Context, p plan, m *member.Member, hs []pkcs11.ObjectHandle, fn attempt) outcome {
	s := m.Slot()
	if err := g.prepareOn(ctx, p, m, hs); err != nil {
		return outcome{m: m, prep: err}
	}
	start := m.Begin()
	err := fn(ctx, m, s, hs)
	class, fail := g.account(ctx, m, start, err)
	return outcome{m: m, class: class, fail: fail, err: err}
}

// sentWrite is the context of a write from the moment it is sent to a
// member: its call there, and what makes it the group's after (the other
// members' change, a creation's copies). The caller's ctx no longer cuts
// it short, only each member call's own deadline does: abandoned in the
// module, the write could still be made after the caller was told it
// failed, and cut short between members it would fail every member not
// reached yet (DESIGN.md, "Key replication").
func sentWrite(ctx context.Context) context.Context { return context.WithoutCancel(ctx) }

// writeAll changes o on every serving member: first on one, in
// configured order (whose refusal is returned as it is and nothing else
// is touched), then on the others in parallel. A member where the change
// fails is failed (it no longer holds what the group holds; recovery
// catches it up); done is called for each member changed.
func (g *Group) writeAll(ctx context.Context, op string, o *vtable.Object, fn attempt, done func(*member.Member)) error {
	sent := func(ctx context.Context, m *member.Member, s *slot.Slot, hs []pkcs11.ObjectHandle) error {
		return fn(sentWrite(ctx), m, s, hs)
	}
	first, err := g.exec(ctx, plan{op: op, objs: []*vtable.Object{o}, next: g.inOrder, absent: ErrObjectHandle}, sent)
	if err != nil {
		return err
	}
	done(first)
	ctx = sentWrite(ctx) // done on one member: the group's
	var wg sync.WaitGroup
	for _, m := range g.serving() {
		if m == first {
			continue
		}
		wg.Go(func() {
			_, err := g.exec(ctx, plan{op: op, objs: []*vtable.Object{o}, next: only(m), absent: ErrObjectHandle}, fn)
			switch {
			case err == nil:
				done(m)
			case !errors.Is(err, ErrObjectHandle) && !slot.StaleHandle(err):
				// (Not held there, or destroyed under the change by
				// someone else: nothing to change.)
				g.replicationFailed(m, o.Identity(), fmt.Errorf("%s: %w", op, err))
			}
		})
	}
	wg.Wait()
	return nil
}

// usable returns the error for the first of objs that cannot be used.
func usable(op string, objs []*vtable.Object) error {
	for _, o := range objs {
		err := unusable(o)
		if err == nil {
			continue // (errors.As would cost an allocation per call)
		}
		if e := (*Error)(nil); errors.As(err, &e) {
			return wrap(e, op, "", nil)
		}
	}
	return nil
}

// finalErr is err's stop, nil when it has none.
func finalErr(err error) *stop {
	if err == nil {
		return nil // (errors.As would cost an allocation per call)
	}
	var final *stop
	if errors.As(err, &final) {
		return final
	}
	return nil
}

// notHeld is the error when no serving member holds p.objs.
func (p plan) notHeld() error {
	e := p.absent
	if e == nil {
		e = ErrObjectHandle
		if p.objs[0].IsKey() {
			e = ErrKeyHandle
		}
	}
	return wrap(e, p.op, "", errors.New("no live member holds the object"))
}

// prepareOn resolves p.objs on m into hs and gets m ready (p.ready).
func (g *Group) prepareOn(ctx context.Context, p plan, m *member.Member, hs []pkcs11.ObjectHandle) error {
	for i, o := range p.objs {
		h, err := g.resolve(ctx, o, m)
		if err != nil {
			return err
		}
		hs[i] = h
	}
	if p.ready != nil {
		return p.ready(ctx, m)
	}
	return nil
}

// resolveHeld is resolve for a call bound to m: an object m does not hold
// is CKR_KEY_HANDLE_INVALID (a key) or CKR_OBJECT_HANDLE_INVALID, naming m.
func (g *Group) resolveHeld(ctx context.Context, op string, o *vtable.Object, m *member.Member) (pkcs11.ObjectHandle, error) {
	h, err := g.resolve(ctx, o, m)
	switch {
	case err == nil:
		return h, nil
	case errors.Is(err, errAbsent) && o.IsKey():
		return 0, wrap(ErrKeyHandle, op, m.Name(), err)
	case errors.Is(err, errAbsent):
		return 0, wrap(ErrObjectHandle, op, m.Name(), err)
	}
	return 0, opErr(op, m.Name(), err)
}

// inOrder returns the first serving member in configured order not in
// skip: the order writes to every member go in.
func (g *Group) inOrder(skip memberSet) *member.Member {
	for _, m := range g.serving() {
		if !skip.has(m.Index()) {
			return m
		}
	}
	return nil
}

// only returns a plan.next that offers m alone, while it serves.
func only(m *member.Member) func(memberSet) *member.Member {
	return func(skip memberSet) *member.Member {
		if skip.has(m.Index()) || !m.State().Serving() || m.Slot() == nil {
			return nil
		}
		return m
	}
}

// call runs one call on m alone with in-flight and latency accounting,
// and charges its health by the rule: a clear health failure (failing m
// at the threshold or on a timeout), never an ambiguous one, since no
// other member served the same request. A call the caller's context cut
// short is not charged.
func (g *Group) call(ctx context.Context, m *member.Member, fn func() error) (slot.Class, error) {
	class, fail, err := g.measure(ctx, m, fn)
	if fail && member.Charged(err, false) {
		g.failMember(m, err)
	}
	return class, err
}

// Probe asks member name's token for its token information, as a health
// probe, and charges the answer by the rule (member.Charged), the
// member's previous probe standing for the other member that served the
// request: a clear health error fails the member at once; an ambiguous
// one only when its previous probe answered so too, on a make that
// answers a probe so when well (doubtsProbe: SoftHSM answers a
// C_GetTokenInfo with CKR_GENERAL_ERROR while another process logs in),
// and at once on another make. A
// probe the caller's context cut short charges nothing.
func (g *Group) Probe(ctx context.Context, name string) (pkcs11.TokenInfo, error) {
	m, ok := g.Member(name)
	if !ok {
		return pkcs11.TokenInfo{}, wrap(ErrUnknownMember, "Probe", name, nil)
	}
	s := m.Slot()
	if s == nil {
		return pkcs11.TokenInfo{}, wrap(ErrNoMember, "Probe", name, errors.New("member not open"))
	}
	info, err := s.TokenInfo(ctx)
	if g.probeFails(ctx, m, err) {
		err := fmt.Errorf("health probe: %w", err)
		m.ChargeHealth(err)  // (counted as the member's error, as a call's would be)
		g.failMember(m, err) // outside probeMu: failing emits events
	}
	return info, err
}

// probeFails keeps Probe's doubts and reports whether err fails m.
func (g *Group) probeFails(ctx context.Context, m *member.Member, err error) bool {
	g.probeMu.Lock()
	defer g.probeMu.Unlock()
	switch {
	case err == nil:
		delete(g.doubted, m)
	case ctx.Err() != nil:
	case member.Charged(err, g.doubted[m] || !doubtsProbe(m)):
		delete(g.doubted, m)
		return true
	case member.HeldBack(err):
		if g.doubted == nil {
			g.doubted = map[*member.Member]bool{}
		}
		g.doubted[m] = true
	}
	return false
}

// measure is call without the failing: it reports whether the call should
// fail m, for exec's verdict.
func (g *Group) measure(ctx context.Context, m *member.Member, fn func() error) (slot.Class, bool, error) {
	start := m.Begin()
	err := fn()
	class, fail := g.account(ctx, m, start, err)
	return class, fail, err
}

// account ends the accounting of a call on m begun at start (m.Begin) with
// err, and returns its class and whether it should fail m.
func (g *Group) account(ctx context.Context, m *member.Member, start time.Time, err error) (slot.Class, bool) {
	if err != nil && (ctx.Err() != nil || errors.Is(err, slot.ErrOvertaken)) {
		m.End(start, nil) // not the member's fault
		return slot.ClassRequest, false
	}
	out := m.End(start, err)
	class := out.Class
	if (class == slot.ClassLogin || class == slot.ClassRequest) && g.lostLogin(err) {
		// The member forgot our login (token restarted under us): it is
		// unwell, not the request.
		class = slot.ClassHealth
		out.Fail = m.ChargeHealth(err)
	}
	return class, class == slot.ClassHealth && out.Fail
}

// lostLogin reports whether err says a member is not logged in while the
// group is logged in as the user. Logged in as the SO, the answer is the
// request's: the SO may not touch private objects (PKCS#11 v2.40 5.6),
// which a token answers CKR_USER_NOT_LOGGED_IN.
func (g *Group) lostLogin(err error) bool {
	who, in := g.LoggedIn()
	return in && who == pkcs11.CKU_USER && slot.CodeOf(err) == pkcs11.CKR_USER_NOT_LOGGED_IN
}

// singleCall is one single-part call and its arguments, to run on a
// member's slot with the physical handles of the plan's objects. A value,
// not a closure: the call is copied to the heap only when it is hedged
// (raced), so an unhedged call allocates nothing for it.
type singleCall interface {
	call(ctx context.Context, s *slot.Slot, hs []pkcs11.ObjectHandle) ([]byte, error)
}

// hedged runs a single-part call that leaves no state on a member and
// changes no object, with failover, and raced on two members when the
// group hedges and a member is late (hedge.go). c uses the ctx it is
// given: an attempt's, which the caller's end does not cut short.
func hedged[C singleCall](ctx context.Context, g *Group, op string, objs []*vtable.Object, c C) ([]byte, error) {
	if d := g.hedgeDelayFor(); d > 0 {
		return raced(ctx, g, op, objs, c, d)
	}
	var out []byte
	_, err := g.exec(ctx, plan{op: op, objs: objs, again: true}, func(ctx context.Context, _ *member.Member, s *slot.Slot, hs []pkcs11.ObjectHandle) (err error) {
		out, err = c.call(ctx, s, hs)
		return err
	})
	return out, err
}

// raced is hedged with a race: each member's answer is kept apart, and
// the one of the member that served is returned.
func raced[C singleCall](ctx context.Context, g *Group, op string, objs []*vtable.Object, c C, delay time.Duration) ([]byte, error) {
	var (
		mu   sync.Mutex
		outs []memberAnswer
	)
	fn := func(ctx context.Context, m *member.Member, s *slot.Slot, hs []pkcs11.ObjectHandle) error {
		out, err := c.call(ctx, s, hs)
		if err == nil {
			mu.Lock()
			outs = append(outs, memberAnswer{m, out})
			mu.Unlock()
		}
		return err
	}
	p := plan{op: op, objs: objs, again: true}
	p.race = g.newRace(p, fn, delay)
	m, err := g.exec(ctx, p, fn)
	if err != nil {
		return nil, err
	}
	mu.Lock()
	defer mu.Unlock()
	for _, a := range outs {
		if a.m == m {
			return a.out, nil
		}
	}
	return nil, nil // (unreachable: m served, so its answer is here)
}

// memberAnswer is one member's answer to a hedged call.
type memberAnswer struct {
	m   *member.Member
	out []byte
}

// shotCall is the single-part call of operation k (C_Sign …: its Init
// with mech, then the call on data; sig for a verification) with the
// plan's one key, none for a digest.
type shotCall struct {
	k         OpKind
	mech      *pkcs11.Mechanism
	data, sig []byte
}

func (c shotCall) call(ctx context.Context, s *slot.Slot, hs []pkcs11.ObjectHandle) ([]byte, error) {
	var key pkcs11.ObjectHandle
	if len(hs) > 0 {
		key = hs[0]
	}
	return s.Single(ctx, c.k, c.mech, key, c.data, c.sig)
}

type randomCall struct{ n int }

func (c randomCall) call(ctx context.Context, s *slot.Slot, _ []pkcs11.ObjectHandle) ([]byte, error) {
	return s.GenerateRandom(ctx, c.n)
}
