package member

import "github.com/hagroup/hagroup/pkg/slot"

// Charged is the rule that decides whether an answer charges the member
// that gave it; every path that runs on members (the executor, the
// logins, the probe, replication, logout) asks it. A request or login
// error never does: it goes to the caller as the token gave it. A clear
// health error (a device error, a timeout) does at once. An ambiguous one
// (slot.Ambiguous: CKR_GENERAL_ERROR, CKR_FUNCTION_FAILED, a token's
// answer to a request it dislikes as well as to trouble of its own) does
// only when another member served the same request (served); when none
// did, it is the request's fault and the caller gets the token's answer.
func Charged(err error, served bool) bool {
	return slot.ClassOf(err) == slot.ClassHealth && (served || !slot.Ambiguous(err))
}

// HeldBack reports whether Charged holds err back until another member
// serves the same request: worth asking again before anyone is charged.
func HeldBack(err error) bool { return Charged(err, true) && !Charged(err, false) }

// Verdict gathers the health answers of one request on several members and
// charges them by Charged: a clear one at once, a held-back one once
// another member serves the request (Served). A Verdict is used by one
// goroutine; its zero value is ready.
type Verdict struct {
	held []heldAnswer
	last error // the last health error
}

type heldAnswer struct {
	m    *Member
	err  error
	fail bool
}

// Health records m's health error err, fail saying whether it fails m
// (its failure threshold reached, or a timeout), and reports whether the
// caller fails m now: a clear answer that fails it. A held-back one waits
// for Served.
func (v *Verdict) Health(m *Member, err error, fail bool) bool {
	v.last = err
	if !Charged(err, false) {
		v.held = append(v.held, heldAnswer{m, err, fail})
		return false
	}
	return fail
}

// Noted records a health error charged elsewhere (a look-up's, by its own
// call).
func (v *Verdict) Noted(err error) { v.last = err }

// Served charges the held answers, failing through fail the members they
// fail: another member served their request.
func (v *Verdict) Served(fail func(m *Member, err error)) { v.ServedBy(nil, fail) }

// ServedBy is Served when member by served the request: by's own held
// answers charge nothing (asked again, it served; no other member did).
func (v *Verdict) ServedBy(by *Member, fail func(m *Member, err error)) {
	for _, h := range v.held {
		if h.m != by && h.fail && Charged(h.err, true) {
			fail(h.m, h.err)
		}
	}
	v.held = nil
}

// Unserved returns, when no member served, the member whose answer the
// caller gets and that answer: the token's own (the last held one) when
// any member answered and held it back, which charges nobody: wherever a
// token answered, the request is at fault, even if other members were
// down. nil, nil when no answer was held back.
func (v *Verdict) Unserved() (*Member, error) {
	if len(v.held) > 0 {
		h := v.held[len(v.held)-1]
		return h.m, h.err
	}
	return nil, nil
}

// Last returns the last health error recorded, nil when none was.
func (v *Verdict) Last() error { return v.last }
