package testhsm

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"

	"github.com/miekg/pkcs11"
)

// The token maker: tokens are initialised (C_InitToken, C_InitPIN) by the
// test binary itself, re-executed as a child process — SoftHSM reads its
// configuration once per process, and an opencryptoki token must be made
// inside its namespace — and never by a tool that takes PINs from its
// command line or environment: the child reads them from its standard
// input, a pipe, and refuses to run if either is in its argv or
// environment.

// makerEnv marks the re-executed child and carries its job (JSON: the
// module and the labels; no PIN).
const makerEnv = "HAGROUP_TESTHSM_MAKE_TOKENS"

// makerJob is what the child is asked to do.
type makerJob struct {
	Module string   `json:"module"`
	Labels []string `json:"labels"`
}

// MakerMain is the token maker's child: when the environment marks this
// process as one, it makes the tokens and exits; otherwise it returns at
// once. Main calls it; a TestMain that does not use Main and makes tokens
// (InitTokens) calls it first thing.
func MakerMain() {
	job := os.Getenv(makerEnv)
	if job == "" {
		return
	}
	if err := runMaker(job, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "testhsm token maker:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// runMaker makes the tokens of job, reading the SO PIN and the user PIN
// (one line each) from in, and writes "label serial" lines to out.
func runMaker(job string, in io.Reader, out io.Writer) error {
	var j makerJob
	if err := json.Unmarshal([]byte(job), &j); err != nil {
		return fmt.Errorf("job %s: %w", makerEnv, err)
	}
	r := bufio.NewReader(in)
	so, err := readLine(r)
	if err != nil {
		return fmt.Errorf("read the SO PIN from standard input: %w", err)
	}
	user, err := readLine(r)
	if err != nil {
		return fmt.Errorf("read the user PIN from standard input: %w", err)
	}
	if err := pinsOutOfSight(so, user); err != nil {
		return err
	}
	p := pkcs11.New(j.Module)
	if p == nil {
		return fmt.Errorf("cannot load %s", j.Module)
	}
	defer p.Destroy()
	if err := p.Initialize(); err != nil {
		return fmt.Errorf("C_Initialize %s: %w", j.Module, err)
	}
	defer p.Finalize()
	for _, l := range j.Labels {
		serial, err := makeToken(p, l, so, user)
		if err != nil {
			return fmt.Errorf("token %q of %s: %w", l, j.Module, err)
		}
		fmt.Fprintf(out, "%s %s\n", l, serial)
	}
	return nil
}

func readLine(r *bufio.Reader) (string, error) {
	s, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	return strings.TrimRight(s, "\r\n"), nil
}

// pinsOutOfSight checks that neither PIN is in this process's command line
// or environment, which other processes of the user (and, for the command
// line, every user) can read.
func pinsOutOfSight(pins ...string) error {
	for _, f := range []string{"/proc/self/cmdline", "/proc/self/environ"} {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		for _, pin := range pins {
			if pin != "" && bytes.Contains(b, []byte(pin)) {
				return fmt.Errorf("a PIN is in %s: refusing to make tokens", f)
			}
		}
	}
	return nil
}

// makeToken initialises the module's first token that is not initialised
// yet (SoftHSM adds a new one after each C_InitToken) as label, sets
// the user PIN, and returns the token's serial number.
func makeToken(p *pkcs11.Ctx, label, so, user string) (string, error) {
	slots, err := p.GetSlotList(true)
	if err != nil {
		return "", fmt.Errorf("C_GetSlotList: %w", err)
	}
	for _, s := range slots {
		ti, err := p.GetTokenInfo(s)
		if err != nil || ti.Flags&pkcs11.CKF_TOKEN_INITIALIZED != 0 {
			continue
		}
		if err := p.InitToken(s, so, label); err != nil {
			return "", fmt.Errorf("C_InitToken: %w", err)
		}
		sh, err := p.OpenSession(s, pkcs11.CKF_SERIAL_SESSION|pkcs11.CKF_RW_SESSION)
		if err != nil {
			return "", fmt.Errorf("C_OpenSession: %w", err)
		}
		defer p.CloseSession(sh)
		if err := p.Login(sh, pkcs11.CKU_SO, so); err != nil {
			return "", fmt.Errorf("C_Login as SO: %w", err)
		}
		if err := p.InitPIN(sh, user); err != nil {
			return "", fmt.Errorf("C_InitPIN: %w", err)
		}
		if err := p.Logout(sh); err != nil {
			return "", fmt.Errorf("C_Logout: %w", err)
		}
		ti, err = p.GetTokenInfo(s)
		if err != nil {
			return "", fmt.Errorf("C_GetTokenInfo: %w", err)
		}
		return strings.TrimSpace(ti.SerialNumber), nil
	}
	return "", errors.New("no token left to initialise")
}

// makerCommand returns the command that re-executes this test binary as
// the token maker for module and labels, with the PINs on its standard
// input. wrap, when set, turns the maker's argv into the command to run
// (ServeOCK runs it inside opencryptoki's namespace).
func makerCommand(ctx context.Context, module string, labels []string, soPIN, userPIN string, wrap func(argv []string) *exec.Cmd) (*exec.Cmd, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find the test binary to make tokens with: %w", err)
	}
	job, err := json.Marshal(makerJob{Module: module, Labels: labels})
	if err != nil {
		return nil, err
	}
	argv := []string{self, "-test.run=^$"}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	if wrap != nil {
		cmd = wrap(argv)
	}
	cmd.Env = withEnv(os.Environ(), makerEnv, string(job))
	cmd.Stdin = strings.NewReader(soPIN + "\n" + userPIN + "\n")
	return cmd, nil
}

// makeTokens runs the token maker for module and labels (SoftHSM's
// SOFTHSM2_CONF in env, when set) and returns each label's serial number.
func makeTokens(cmd *exec.Cmd, labels []string) (map[string]string, error) {
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("make tokens %v: %v: %s", labels, err, bytes.TrimSpace(stderr.Bytes()))
	}
	serials := map[string]string{}
	for line := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
		if l, s, ok := strings.Cut(line, " "); ok {
			serials[l] = s
		}
	}
	for _, l := range labels {
		if serials[l] == "" {
			return nil, fmt.Errorf("make tokens %v: no serial number for %q in the maker's answer %q", labels, l, out)
		}
	}
	return serials, nil
}
