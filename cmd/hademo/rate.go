package main

import (
	"fmt"
	"time"
)

// defaultRate is the load the demo offers, in signatures per second: well
// below what one member serves alone over its socket on a small machine,
// so that losing a member changes who signs, not how much is signed.
const defaultRate = 1500

// loadNote says what sets the signing rate, for the narrative and the
// picture.
func loadNote(rate int) string {
	if rate > 0 {
		return fmt.Sprintf("the load offers a fixed %d signatures/s, less than one member serves alone: "+
			"the total stays flat through the kill, only the split between the members moves", rate)
	}
	return "flat out: the total is what this machine's CPUs allow; the member servers share them, so while one is dead " +
		"the survivor gets its CPU and the total rises: the machine's doing, not HA's"
}

// phaseRates are the signatures per second the load completed before the
// kill, while the victim was out of rotation, and after it was back.
type phaseRates struct{ before, out, after float64 }

func ratesByPhase(r *failoverRun) phaseRates {
	rate := func(from, to time.Time) float64 {
		if !to.After(from) {
			return 0
		}
		ok := 0
		for _, t := range r.result.Ticks {
			if !t.At.Before(from) && t.At.Before(to) {
				ok += t.OK
			}
		}
		return float64(ok) / to.Sub(from).Seconds()
	}
	return phaseRates{before: rate(r.start, r.kill), out: rate(r.dropped, r.back), after: rate(r.back, r.end)}
}

// keptUp reports whether every phase served at least 90% of the offered
// rate (always true flat out, where nothing is offered).
func (p phaseRates) keptUp(rate int) bool {
	if rate <= 0 {
		return true
	}
	floor := 0.9 * float64(rate)
	return p.before >= floor && p.out >= floor && p.after >= floor
}

// line renders the rates for the summary.
func (p phaseRates) line(rate int, victim string) string {
	served := fmt.Sprintf("%.0f/s before the kill, %.0f/s while %s was out, %.0f/s after", p.before, p.out, victim, p.after)
	if rate <= 0 {
		return "flat out (limited by this machine's CPUs): " + served
	}
	s := fmt.Sprintf("offered %d/s; served %s", rate, served)
	if !p.keptUp(rate) {
		s += " (this machine did not keep up with the offered load)"
	}
	return s
}
