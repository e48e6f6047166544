package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/hagroup/hagroup/pkg/agent/report"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot/dispatch"
	"github.com/hagroup/hagroup/pkg/sync/domainkey"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/spf13/cobra"
)

// domainResult is domain --install's and --replace's report.
type domainResult struct {
	SchemaVersion int      `json:"schemaVersion"`
	Group         string   `json:"group"`
	Members       []string `json:"members"`
	Trusted       bool     `json:"trusted"`
	// Replaced: the old key was destroyed and a new one installed.
	Replaced bool `json:"replaced"`
	// CannotHold lists the kinds of key a member could not hold.
	CannotHold []holdLine `json:"cannotHold,omitempty"`
}

// domainCheck is domain --check's report.
type domainCheck struct {
	SchemaVersion int               `json:"schemaVersion"`
	Group         string            `json:"group"`
	Members       []domainCheckLine `json:"members"`
}

// domainCheckLine is one member's domain key as the audit saw it.
type domainCheckLine struct {
	Member     string   `json:"member"`
	Label      string   `json:"label"`
	Status     string   `json:"status"` // ok, untrusted, weak, missing, none, error
	Trusted    bool     `json:"trusted"`
	CheckValue string   `json:"checkValue,omitempty"`
	Flaws      []string `json:"flaws,omitempty"`
	Error      string   `json:"error,omitempty"`
}

// Statuses of a domainCheckLine.
const (
	domainOK        = "ok"
	domainUntrusted = "untrusted"
	domainWeak      = "weak"
	domainMissing   = "missing"
	// domainNone: the member holds none because its make keeps no
	// wrap-only key (NSS softokn); keys reach it under keys agreed for
	// each copy. Not a problem: the ceremony installs none there.
	domainNone  = "none"
	domainError = "error"
)

// problems counts the members whose domain key is not sound.
func (c domainCheck) problems() int {
	n := 0
	for _, l := range c.Members {
		if l.Status != domainOK && l.Status != domainNone {
			n++
		}
	}
	return n
}

func makeDomainCheckTable(c domainCheck) tableData {
	rows := make([][]string, 0, len(c.Members))
	for _, l := range c.Members {
		detail := strings.Join(l.Flaws, ", ")
		if l.Error != "" {
			detail = l.Error
		}
		trusted := "-"
		if l.Status == domainOK || l.Status == domainUntrusted || l.Status == domainWeak {
			trusted = yesNo(l.Trusted)
		}
		rows = append(rows, []string{l.Member, l.Status, trusted, dash(l.CheckValue), dash(detail)})
	}
	return table([]string{"MEMBER", "DOMAIN KEY", "TRUSTED", "CHECK VALUE", "DETAIL"}, rows)
}

// domainFlags are the options of hactl hagroup domain.
type domainFlags struct {
	group                              string
	soPINEnv, soPINFile                []string
	install, check, replace, untrusted bool
	yes                                bool
}

func newDomainCmd(a *app) *cobra.Command {
	var f domainFlags
	cmd := &cobra.Command{
		Use:   "domain",
		Short: "Install, check or replace a group's domain key on every member (the key ceremony)",
		Long: `Install the group's domain key: an AES-256 key with the same value on every
member, under which private and secret keys are wrapped to replicate them.
The value is generated in memory, installed on every member, its key check
value verified equal everywhere, and forgotten.

The key can wrap and unwrap with CKM_AES_KEY_WRAP_PAD and do nothing else:
CKA_MODIFIABLE, CKA_COPYABLE, CKA_EXTRACTABLE, CKA_ENCRYPT, CKA_DECRYPT,
CKA_SIGN, CKA_VERIFY and CKA_DERIVE false, CKA_SENSITIVE true,
CKA_ALLOWED_MECHANISMS only CKM_AES_KEY_WRAP_PAD, and an unwrap template
forcing CKA_SENSITIVE on every key unwrapped under it. Each attribute is
read back from every member; where a token does not keep one, nothing is
installed and the error names the member and the attribute. A token that
leaves CKA_COPYABLE true (SoftHSM does, on a trusted key) passes only when
the key is not modifiable and the token refuses each copy that would give
up its secret (one that decrypts, is extractable or readable, modifiable,
or allowed another mechanism), which the check tries.

Where the token allows, the key is installed by the Security Officer as a
trusted key, so keys made through the group can be wrapped under it alone;
the SO PIN of each member is prompted for on a terminal, or read from
--so-pin-file / --so-pin-env: FILE or VAR for every member, or
MEMBER=FILE / MEMBER=VAR for one (repeat the flag), so members with
different SO PINs need no terminal. --untrusted skips
the SO step (an operator-made key): keys it replicates cannot be marked
CKA_WRAP_WITH_TRUSTED, so a user on a member can wrap them under a key of
its own; use it only where a token has no SO.

A member whose token cannot keep a wrap-only key (NSS softokn: no SO, and
it copies such a key into one that decrypts), or could not use one (the
opencryptoki soft token: no AES key wrap), holds no domain key, and is
asked for no SO PIN: keys reach it under keys agreed for each copy.

--check audits the key on every member (logged in with each member's PIN
source) and exits 3 when one is untrusted, weak (a user with the user PIN
could make it decrypt what it wraps), missing or unreadable. A member that
holds none because its token cannot keep one is shown as "none", with
what its token does not keep, and is not a problem. The engine makes the same
audit before it replicates under a member's key, and replicates nothing to
or from a member whose key is weak. --replace destroys the key on every
member and installs a new one; nothing is wrapped again, since keys travel
wrapped only while they are replicated.

Every other member must wrap and unwrap with CKM_AES_KEY_WRAP_PAD, and a trusted
install sets the nested CKA_UNWRAP_TEMPLATE; otherwise nothing is installed
and the error names the member. A token reached through p11-kit 0.24's
p11-kit-client.so offers neither: serve it with hsmserve and name it as
module "hagroup-remote:unix:/path/of/socket".

Once the key is in place, each member's token is tried with throwaway
session keys, and every kind of key a member could not hold is warned of
(--json: cannotHold): while such a member serves with another, the group
makes no key of that kind and does not offer the mechanisms that generate
it (SoftHSM 2.6 cannot wrap EdDSA private keys).`,
		Example: `  hactl hagroup domain --group signing --install
  hactl hagroup domain --group signing --install --so-pin-env HSM_SO_PIN
  hactl hagroup domain --group signing --install --so-pin-file hsm-a=/etc/hagroup/so-a --so-pin-file hsm-b=/etc/hagroup/so-b
  hactl hagroup domain --group signing --install --untrusted
  hactl hagroup domain --group signing --check
  hactl hagroup domain --group signing --replace --so-pin-file /etc/hagroup/so-pin --yes`,
		Args: noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			switch {
			case f.check:
				return runDomainCheck(cmd.Context(), a, f)
			case f.install, f.replace:
				return runDomainCeremony(cmd.Context(), a, f)
			}
			return &usageError{"domain: nothing to do (pass --install, --check or --replace)"}
		}),
	}
	cmd.Flags().StringVar(&f.group, "group", "", "the group")
	cmd.Flags().BoolVar(&f.install, "install", false, "generate and install the domain key")
	cmd.Flags().BoolVar(&f.check, "check", false, "audit every member's domain key (exit 3 when one is weak or missing)")
	cmd.Flags().BoolVar(&f.replace, "replace", false, "destroy the domain key on every member and install a new one")
	cmd.Flags().BoolVar(&f.untrusted, "untrusted", false, "install without the SO (no CKA_TRUSTED)")
	cmd.Flags().StringArrayVar(&f.soPINFile, "so-pin-file", nil, "file holding the SO PIN: FILE for every member, or MEMBER=FILE (repeatable)")
	cmd.Flags().StringArrayVar(&f.soPINEnv, "so-pin-env", nil, "environment variable holding the SO PIN: VAR for every member, or MEMBER=VAR (repeatable)")
	cmd.Flags().BoolVar(&f.yes, "yes", false, "do not ask for confirmation (--replace)")
	cmd.Flags().Bool("json", false, "print the result as JSON")
	cmd.MarkFlagRequired("group")
	cmd.MarkFlagsMutuallyExclusive("untrusted", "so-pin-file")
	cmd.MarkFlagsMutuallyExclusive("untrusted", "so-pin-env")
	cmd.MarkFlagsMutuallyExclusive("install", "check", "replace")
	return cmd
}

// soPINSource is where one SO PIN is read from: a file or a variable.
type soPINSource struct{ flag, value string }

// soPINSources maps each member of members to the SO PIN source that
// --so-pin-file / --so-pin-env give it: a MEMBER=VALUE entry for that
// member, else an entry without a member name, which serves every member.
// A member named twice, or two entries for every member, is a usage
// error; members given nothing are absent from the map (prompted for).
func (f domainFlags) soPINSources(members []string) (map[string]soPINSource, error) {
	known := make(map[string]bool, len(members))
	for _, m := range members {
		known[m] = true
	}
	own := map[string]soPINSource{}
	var common *soPINSource
	for _, fl := range []struct {
		name   string
		values []string
	}{{"--so-pin-file", f.soPINFile}, {"--so-pin-env", f.soPINEnv}} {
		for _, v := range fl.values {
			if name, rest, ok := strings.Cut(v, "="); ok && known[name] {
				if _, dup := own[name]; dup {
					return nil, &usageError{fmt.Sprintf("domain: member %q is given two SO PINs", name)}
				}
				own[name] = soPINSource{fl.name, rest}
				continue
			}
			if common != nil {
				return nil, &usageError{fmt.Sprintf("domain: %s %s and %s %s both name an SO PIN for every member (name each as MEMBER=...)", common.flag, common.value, fl.name, v)}
			}
			common = &soPINSource{fl.name, v}
		}
	}
	if common != nil {
		for _, m := range members {
			if _, ok := own[m]; !ok {
				own[m] = *common
			}
		}
	}
	return own, nil
}

// read reads the SO PIN from its file or variable.
func (src soPINSource) read() (secret.PIN, error) {
	if src.flag == "--so-pin-file" {
		b, err := os.ReadFile(src.value)
		if err != nil {
			return secret.PIN{}, fmt.Errorf("--so-pin-file: %w", err)
		}
		defer clear(b)
		return secret.NewPIN([]byte(strings.TrimRight(string(b), "\r\n"))), nil
	}
	v, ok := os.LookupEnv(src.value)
	if !ok || v == "" {
		return secret.PIN{}, fmt.Errorf("--so-pin-env %s: the variable is not set", src.value)
	}
	return secret.PINFromString(v), nil
}

// runDomainCeremony installs (--install) or replaces (--replace) the
// domain key on every member of the group.
func runDomainCeremony(ctx context.Context, a *app, f domainFlags) error {
	cfg, g, err := a.loadGroup(f.group)
	if err != nil {
		return err
	}
	set := cfg.Settings(g)
	memberNames := make([]string, len(g.Members))
	for i, m := range g.Members {
		memberNames[i] = m.Name
	}
	sources, err := f.soPINSources(memberNames)
	if err != nil {
		return err
	}
	p := a.prompter(f.yes)
	if f.replace {
		if err := a.confirm(p, fmt.Sprintf("destroy the domain key of group %q on every member and install a new one", f.group)); err != nil {
			return err
		}
	}
	var targets []domainkey.Target
	var names []string
	defer func() {
		for _, t := range targets {
			t.Slot.Close()
			t.UserPIN.Zero()
			t.SOPIN.Zero()
		}
	}()
	for _, m := range g.Members {
		pin, err := m.ReadPIN()
		if err != nil {
			return report.NameMember(m.Name, err)
		}
		s, err := a.openSlot(ctx, report.MemberSpec(m, set, pin))
		if err != nil {
			pin.Zero()
			return report.NameMember(m.Name, err)
		}
		t := domainkey.Target{Slot: s, UserPIN: pin}
		// A member whose make keeps no wrap-only key gets no domain key, so
		// no SO PIN is asked for it (NSS has no SO). A trial that fails is
		// the ceremony's to report, in its own order.
		flaws, err := domainkey.WrapOnlyFlaws(ctx, s)
		if !f.untrusted && (err != nil || len(flaws) == 0) {
			if src, ok := sources[m.Name]; ok {
				so, err := src.read()
				if err != nil {
					s.Close()
					pin.Zero()
					return report.NameMember(m.Name, err)
				}
				t.SOPIN = so
			} else {
				so, err := p.Password(fmt.Sprintf("SO PIN of member %q (token %s)", m.Name, report.TokenSelector(m)))
				if errors.Is(err, errNoTerminal) {
					s.Close()
					pin.Zero()
					a.quietUsage = true
					return &usageError{fmt.Sprintf("domain: the SO PIN of member %q is needed and there is no terminal to ask on: pass --so-pin-file, --so-pin-env (FILE, VAR or %s=...) or --untrusted", m.Name, m.Name)}
				}
				if err != nil {
					s.Close()
					pin.Zero()
					return err
				}
				t.SOPIN = so
			}
		}
		targets = append(targets, t)
		names = append(names, m.Name)
	}
	ceremony := domainkey.Install
	if f.replace {
		ceremony = domainkey.Replace
	}
	if err := ceremony(ctx, targets, g.Serial); err != nil {
		return fmt.Errorf("group %q: %w%s", f.group, err, p11kitHint(g.Members, err))
	}
	// A member whose make keeps no wrap-only key (NSS) got none: it is
	// said, and not counted among the members that hold it.
	var holders, without []string
	for i, t := range targets {
		d, err := domainkey.Audit(ctx, t.Slot, g.Serial)
		if err == nil && !d.Found {
			without = append(without, names[i])
			continue
		}
		holders = append(holders, names[i])
	}
	res := domainResult{SchemaVersion: agent.SchemaVersion, Group: f.group, Members: holders, Trusted: !f.untrusted, Replaced: f.replace}
	for i, t := range targets {
		holds, err := cannotHold(ctx, names[i], t.Slot)
		if err != nil {
			return fmt.Errorf("group %q: domain key %s, but: %w", f.group, map[bool]string{false: "installed", true: "replaced"}[f.replace], err)
		}
		res.CannotHold = append(res.CannotHold, holds...)
	}
	return a.print(res, func(w io.Writer) error {
		kind := "trusted"
		if f.untrusted {
			kind = "untrusted"
		}
		done := "installed"
		if f.replace {
			done = "replaced"
		}
		if _, err := fmt.Fprintf(w, "group %q: %s domain key %s on %s; key check values match\n", f.group, kind, done, strings.Join(holders, ", ")); err != nil {
			return err
		}
		for _, name := range without {
			if _, err := fmt.Fprintf(a.errOut, "hactl: member %s holds no domain key: its token cannot keep a wrap-only key; keys reach it from the others under keys agreed for each copy\n", name); err != nil {
				return err
			}
		}
		printCannotHold(a.errOut, res.CannotHold)
		if f.untrusted {
			_, err := fmt.Fprintf(a.errOut, "hactl: warning: an untrusted domain key cannot mark group keys CKA_WRAP_WITH_TRUSTED: a user on a member can wrap them under a key of its own; domain --check reports it (exit 3) until it is replaced with a trusted one\n")
			return err
		}
		return nil
	})
}

// runDomainCheck audits every member's domain key at once, one command
// timeout each, prints the whole report and exits 3 when one is not sound.
func runDomainCheck(ctx context.Context, a *app, f domainFlags) error {
	cfg, g, err := a.loadGroup(f.group)
	if err != nil {
		return err
	}
	set := cfg.Settings(g)
	res := domainCheck{SchemaVersion: agent.SchemaVersion, Group: f.group, Members: make([]domainCheckLine, len(g.Members))}
	var wg sync.WaitGroup
	for i, m := range g.Members {
		wg.Go(func() { res.Members[i] = auditMember(ctx, a, m, set, g.Serial) })
	}
	wg.Wait()
	if err := a.print(res, func(w io.Writer) error { return renderTable(w, makeDomainCheckTable(res)) }); err != nil {
		return err
	}
	if n := res.problems(); n > 0 {
		return &problemError{msg: fmt.Sprintf("group %q: the domain key of %d of %d member(s) is untrusted, weak, missing or unreadable (replace it: hactl hagroup domain --group %s --replace)", f.group, n, len(res.Members), f.group)}
	}
	return nil
}

// auditMember opens member m logged in with its PIN source and audits its
// domain key, within the group's command timeout.
func auditMember(ctx context.Context, a *app, m config.Member, set config.Settings, serial string) domainCheckLine {
	l := domainCheckLine{Member: m.Name, Label: domainkey.Label(serial)}
	fail := func(err error) domainCheckLine {
		l.Status, l.Error = domainError, report.NameMember(m.Name, err).Error()
		return l
	}
	ctx, cancel := context.WithTimeout(ctx, dispatch.CommandTimeout(set.CommandTimeout))
	defer cancel()
	pin, err := m.ReadPIN()
	if err != nil {
		return fail(err)
	}
	defer pin.Zero()
	if pin.Empty() {
		// The domain key is a private object: unseen without a login.
		return fail(errors.New("no pin_file or pin_env: the domain key is private and cannot be audited without logging in"))
	}
	s, err := a.openSlot(ctx, report.MemberSpec(m, set, pin))
	if err != nil {
		return fail(err)
	}
	defer s.Close()
	d, err := domainkey.Audit(ctx, s, serial)
	if err != nil {
		return fail(err)
	}
	l.Trusted, l.Flaws = d.Trusted, d.Flaws
	if !d.Found {
		// Missing, unless its make keeps none (the ceremony's own trial).
		flaws, err := domainkey.WrapOnlyFlaws(ctx, s)
		if err != nil {
			return fail(err)
		}
		l.Status, l.Flaws = domainMissing, nil
		if len(flaws) > 0 {
			l.Status, l.Flaws = domainNone, append([]string{"the token cannot keep a wrap-only key"}, flaws...)
		}
		return l
	}
	switch {
	case d.Weak():
		l.Status = domainWeak
	case !d.Trusted:
		// Sound as a key, but the keys it replicates cannot be marked
		// CKA_WRAP_WITH_TRUSTED, so a user on this member can wrap them
		// under a key of its own: the threat model does not hold here.
		l.Status = domainUntrusted
		l.Flaws = append(l.Flaws, "not CKA_TRUSTED: group keys on this member can be wrapped under a user's own key")
	default:
		l.Status = domainOK
	}
	if d.Found {
		l.CheckValue = object.FormatFingerprint(d.CheckValue)
	}
	return l
}

// p11kitHint explains, after a failed ceremony, why members reached through
// p11-kit-client.so cannot take part, and what to use instead: p11-kit's
// RPC (0.24) carries neither CKM_AES_KEY_WRAP_PAD nor nested attributes
// such as the domain key's CKA_UNWRAP_TEMPLATE.
func p11kitHint(members []config.Member, err error) string {
	if !errors.Is(err, domainkey.ErrMechanismUnavailable) {
		return ""
	}
	var names []string
	for _, m := range members {
		if filepath.Base(m.Module) == "p11-kit-client.so" {
			names = append(names, m.Name)
		}
	}
	if len(names) == 0 {
		return ""
	}
	return fmt.Sprintf(" (member %s is reached through p11-kit-client.so, whose RPC carries neither CKM_AES_KEY_WRAP_PAD nor nested attributes such as the domain key's CKA_UNWRAP_TEMPLATE: serve its token with hsmserve and use module = \"hagroup-remote:unix:/path/of/socket\")",
		strings.Join(names, ", "))
}
