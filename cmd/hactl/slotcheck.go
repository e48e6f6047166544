package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/hagroup/hagroup/pkg/agent/report"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync"
	"github.com/hagroup/hagroup/pkg/sync/state"
	"github.com/miekg/pkcs11"
	"github.com/spf13/cobra"
)

// The verdicts of slot check.
const (
	verdictFull     = "full"     // exit 0: it can hold and exchange every kind of key and the group's state
	verdictPartial  = "partial"  // exit 3: sign-only, or some kinds of key only
	verdictUnusable = "unusable" // exit 1: it cannot be a member
)

// checkResult is slot check's report (--json).
type checkResult struct {
	SchemaVersion int          `json:"schemaVersion"`
	Module        string       `json:"module"`
	Token         tokenJSON    `json:"token"`
	Verdict       string       `json:"verdict"`
	Reasons       []string     `json:"reasons"`
	Mechanisms    []string     `json:"mechanisms"`
	Sessions      sessionsJSON `json:"sessions"`
	PIN           pinJSON      `json:"pin"`
	GroupState    stateJSON    `json:"groupState"`
	CannotHold    []holdLine   `json:"cannotHold"`
	Members       []pairLine   `json:"members"`
}

type sessionsJSON struct {
	Max   uint `json:"max"`   // CK_TOKEN_INFO ulMaxSessionCount (CK_EFFECTIVELY_INFINITE: 0)
	MaxRW uint `json:"maxRw"` // ulMaxRwSessionCount
}

type pinJSON struct {
	MinLen uint `json:"minLen"`
	MaxLen uint `json:"maxLen"`
}

type stateJSON struct {
	Holds   bool   `json:"holds"`
	Form    string `json:"form,omitempty"`    // what carries it on this make
	InPlace bool   `json:"inPlace,omitempty"` // tombstone registers rewritten in place (else created objects)
	Reason  string `json:"reason,omitempty"`
}

// pairLine is what a round trip of a throwaway key proved between the
// token checked and one member of the group, in one direction.
type pairLine struct {
	Member    string   `json:"member"`
	Direction string   `json:"direction"` // "to-token": the member's keys to the token; "from-token"
	Class     string   `json:"class"`
	Ways      []string `json:"ways"`
	Receives  bool     `json:"receives"` // a proven way carries them (or none could be tried)
	Reason    string   `json:"reason,omitempty"`
}

func newSlotCheckCmd(a *app) *cobra.Command {
	var mf memberFlags
	var group string
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Report whether a token can join a group, before it joins",
		Long: `Open a token (logged in as its user) and report what it offers a group: the
mechanisms it lists, its session limits and PIN length rules, whether it can
hold the group's state on it (private objects of the form its make takes:
data objects, or generic secret keys on NSS softokn; tpm2-pkcs11 carries
none: tried and destroyed again), which kinds of key it can wrap and unwrap, and,
with --group, for each current member whether keys of each class travel
between the two, proven by a round trip of a throwaway key in each direction
(never by a mechanism's name). Nothing stays on any token.

Exit 0: a full member. Exit 3: a partial one (it cannot receive some kinds
of key, or any: a sign-only member; or it cannot hold the group's state).
Exit 1: unusable (it cannot be opened or logged into). The reasons are
printed.`,
		Example: `  hactl slot check --module /usr/lib/softhsm/libsofthsm2.so --token-label ha-d --pin-file /etc/hagroup/pin-d
  hactl slot check --module /usr/lib/x86_64-linux-gnu/libsoftokn3.so --token-label nss-a \
      --init-args "configdir='sql:/var/lib/hagroup/nss-a' dbTokenDescription='nss-a'" \
      --pin-file /etc/hagroup/pin-a --group signing --json`,
		Args: noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			mf.name = "checked"
			m, err := mf.member()
			if err != nil {
				return err
			}
			var members []config.Member
			set := config.Defaults()
			if group != "" {
				c, g, err := a.loadGroup(group)
				if err != nil {
					return err
				}
				members, set = g.Members, c.Settings(g)
			}
			res, err := checkToken(cmd.Context(), a, m, set, members)
			if err != nil {
				return err
			}
			if err := a.print(res, func(w io.Writer) error { return printCheck(w, res) }); err != nil {
				return err
			}
			switch res.Verdict {
			case verdictPartial:
				return &problemError{msg: "a partial member: " + strings.Join(res.Reasons, "; "), shown: !a.jsonOut()}
			case verdictUnusable:
				return errors.New("the token cannot be a member: " + strings.Join(res.Reasons, "; "))
			}
			return nil
		}),
	}
	fl := cmd.Flags()
	fl.StringVar(&mf.module, "module", "", "path of the PKCS#11 module that offers the token")
	fl.StringArrayVar(&mf.env, "module-env", nil, "KEY=VALUE set while loading the module (repeatable)")
	fl.StringVar(&mf.initArgs, "init-args", "", "the pReserved string of the module's C_Initialize, which NSS softokn needs (configdir='sql:DIR' …); never a PIN")
	fl.StringVar(&mf.tokenLabel, "token-label", "", "the token's label")
	fl.StringVar(&mf.tokenSerial, "token-serial", "", "the token's serial number")
	fl.StringVar(&mf.uri, "uri", "", "the token as an RFC 7512 pkcs11: URI")
	fl.StringVar(&mf.pinFile, "pin-file", "", "file holding the user PIN (never a PIN on the command line)")
	fl.StringVar(&mf.pinEnv, "pin-env", "", "environment variable holding the user PIN")
	fl.StringVar(&group, "group", "", "also prove, for each member of this group, which keys travel between it and the token")
	fl.Bool("json", false, "print the report as JSON")
	cmd.MarkFlagRequired("module")
	cmd.MarkFlagsOneRequired("token-label", "token-serial", "uri")
	cmd.MarkFlagsMutuallyExclusive("token-label", "token-serial", "uri")
	cmd.MarkFlagsOneRequired("pin-file", "pin-env")
	cmd.MarkFlagsMutuallyExclusive("pin-file", "pin-env")
	return cmd
}

// checkToken builds the report on token m; members are the group's.
func checkToken(ctx context.Context, a *app, m config.Member, set config.Settings, members []config.Member) (checkResult, error) {
	res := checkResult{SchemaVersion: agent.SchemaVersion, Module: m.Module, Reasons: []string{}, Mechanisms: []string{},
		CannotHold: []holdLine{}, Members: []pairLine{}}
	pin, err := m.ReadPIN()
	if err != nil {
		return res, err
	}
	defer pin.Zero()
	s, err := a.openSlot(ctx, report.MemberSpec(m, set, pin))
	if err != nil {
		res.Verdict = verdictUnusable
		res.Reasons = append(res.Reasons, fmt.Sprintf("open and log in: %v", err))
		return res, nil
	}
	defer s.Close()
	t := s.Token()
	res.Token = tokenJSON{t.SlotID, t.Label, t.Serial, t.Manufacturer, t.Model, t.Flags, t.Initialized}
	ti, err := s.TokenInfo(ctx)
	if err != nil {
		return res, fmt.Errorf("token info: %w", err)
	}
	res.Sessions = sessionsJSON{Max: limit(ti.MaxSessionCount), MaxRW: limit(ti.MaxRwSessionCount)}
	res.PIN = pinJSON{MinLen: ti.MinPinLen, MaxLen: ti.MaxPinLen}
	if ti.Flags&pkcs11.CKF_WRITE_PROTECTED != 0 {
		res.Verdict = verdictUnusable
		res.Reasons = append(res.Reasons, "the token is write-protected")
		return res, nil
	}
	mechs, err := s.Mechanisms(ctx)
	if err != nil {
		return res, fmt.Errorf("read mechanisms: %w", err)
	}
	for _, mech := range mechs {
		res.Mechanisms = append(res.Mechanisms, fmt.Sprintf("0x%x", mech))
	}
	res.GroupState = holdsGroupState(ctx, s)
	if !res.GroupState.Holds {
		res.Reasons = append(res.Reasons, "it cannot hold the group's state: "+res.GroupState.Reason)
	}
	holds, err := cannotHold(ctx, "checked", s)
	if err != nil {
		return res, err
	}
	// A kind no current member holds either costs the group nothing: the
	// token is still a full member of it.
	heldByNone := map[string]int{}
	for _, gm := range members {
		lines, theirs := provePairsWith(ctx, a, gm, set, s, mechs)
		res.Members = append(res.Members, lines...)
		for _, h := range theirs {
			heldByNone[h.Kind]++
		}
	}
	for _, h := range holds {
		h.Member = ""
		res.CannotHold = append(res.CannotHold, h)
		if len(members) == 0 || heldByNone[h.Kind] < len(members) {
			res.Reasons = append(res.Reasons, fmt.Sprintf("it cannot hold %ss: %s", h.Kind, h.Reason))
		}
	}
	for _, p := range res.Members {
		if !p.Receives {
			what := "receive " + p.Member + "'s " + p.Class + "s"
			if p.Direction == "from-token" {
				what = "send its " + p.Class + "s to " + p.Member
			}
			res.Reasons = append(res.Reasons, fmt.Sprintf("it cannot %s: %s", what, p.Reason))
		}
	}
	res.Verdict = verdictFull
	if len(res.Reasons) > 0 {
		res.Verdict = verdictPartial
	}
	return res, nil
}

// limit is a token's session limit, 0 for "effectively infinite" or not
// told.
func limit(n uint) uint {
	if n == pkcs11.CK_EFFECTIVELY_INFINITE || n == pkcs11.CK_UNAVAILABLE_INFORMATION {
		return 0
	}
	return n
}

// holdsGroupState tries, in the form the token's make takes, what the
// group's state on a member needs (state.Probe); nothing stays.
func holdsGroupState(ctx context.Context, s *slot.Slot) stateJSON {
	inPlace, err := state.Probe(ctx, s)
	if err != nil {
		return stateJSON{Reason: err.Error()}
	}
	return stateJSON{Holds: true, Form: state.FormName(s), InPlace: inPlace}
}

// provePairsWith proves, in both directions, which ways keys of each class
// travel between group member gm and the token s, and lists the kinds of
// key gm cannot hold itself.
func provePairsWith(ctx context.Context, a *app, gm config.Member, set config.Settings, s *slot.Slot, mechs []uint) ([]pairLine, []holdLine) {
	fail := func(err error) ([]pairLine, []holdLine) {
		return []pairLine{{Member: gm.Name, Direction: "to-token", Class: "key", Ways: []string{}, Reason: err.Error()}}, nil
	}
	pin, err := gm.ReadPIN()
	if err != nil {
		return fail(err)
	}
	defer pin.Zero()
	spec := report.MemberSpec(gm, set, pin)
	ms, err := a.openSlot(ctx, spec)
	if err != nil {
		return fail(err)
	}
	defer ms.Close()
	mm, err := ms.Mechanisms(ctx)
	if err != nil {
		return fail(err)
	}
	theirs, err := cannotHold(ctx, gm.Name, ms)
	if err != nil {
		return fail(err)
	}
	var out []pairLine
	for _, dir := range []struct {
		name     string
		src, dst *slot.Slot
		sm, dm   []uint
	}{{"to-token", ms, s, mm, mechs}, {"from-token", s, ms, mechs, mm}} {
		p, err := sync.ProvePair(ctx, dir.src, dir.dst, dir.sm, dir.dm)
		if err != nil {
			out = append(out, pairLine{Member: gm.Name, Direction: dir.name, Class: "key", Ways: []string{}, Reason: err.Error()})
			continue
		}
		for _, kind := range sync.PairTrials() {
			ways := p.Ways[kind]
			l := pairLine{Member: gm.Name, Direction: dir.name, Class: kind, Ways: []string{},
				Receives: len(ways) > 0 || slices.Contains(p.Untried, kind)}
			for _, w := range ways {
				l.Ways = append(l.Ways, w.String())
			}
			if !l.Receives {
				l.Reason = "no candidate way carries them: " + sync.PairFailures(p, kind)
			}
			out = append(out, l)
		}
	}
	return out, theirs
}

// printCheck prints the report as text.
func printCheck(w io.Writer, res checkResult) error {
	fmt.Fprintf(w, "token %q (%s %s, serial %s) of %s: %s member\n", res.Token.Label, strings.TrimSpace(res.Token.Manufacturer),
		strings.TrimSpace(res.Token.Model), strings.TrimSpace(res.Token.Serial), res.Module, res.Verdict)
	if res.Verdict == verdictUnusable {
		for _, r := range res.Reasons {
			fmt.Fprintf(w, "  - %s\n", r)
		}
		return nil
	}
	fmt.Fprintf(w, "mechanisms: %d offered\n", len(res.Mechanisms))
	fmt.Fprintf(w, "sessions: max %s, read-write %s\n", limitText(res.Sessions.Max), limitText(res.Sessions.MaxRW))
	fmt.Fprintf(w, "PIN length: %d to %d\n", res.PIN.MinLen, res.PIN.MaxLen)
	if res.GroupState.Holds {
		fmt.Fprintf(w, "group state: can hold it, as %s\n", res.GroupState.Form)
	} else {
		fmt.Fprintf(w, "group state: cannot hold it: %s\n", res.GroupState.Reason)
	}
	if len(res.Members) > 0 {
		rows := make([][]string, 0, len(res.Members))
		for _, p := range res.Members {
			rows = append(rows, []string{p.Member, p.Direction, p.Class, yesNo(p.Receives), dash(strings.Join(p.Ways, "; "))})
		}
		if err := renderTable(w, table([]string{"MEMBER", "DIRECTION", "CLASS", "TRAVELS", "PROVEN WAYS"}, rows)); err != nil {
			return err
		}
	}
	for _, r := range res.Reasons {
		fmt.Fprintf(w, "  - %s\n", r)
	}
	return nil
}

func limitText(n uint) string {
	if n == 0 {
		return "unlimited"
	}
	return fmt.Sprint(n)
}
