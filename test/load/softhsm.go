package load

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"

	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/miekg/pkcs11"
)

// WriteSoftHSMConf makes a SoftHSM token directory under dir and a
// configuration pointing at it, and returns the configuration's path.
func WriteSoftHSMConf(dir string) (string, error) {
	tokens := filepath.Join(dir, "tokens")
	if err := os.MkdirAll(tokens, 0o700); err != nil {
		return "", fmt.Errorf("token directory: %w", err)
	}
	conf := filepath.Join(dir, "softhsm2.conf")
	body := "directories.tokendir = " + tokens + "\nobjectstore.backend = file\nlog.level = ERROR\nslots.removable = false\n"
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		return "", fmt.Errorf("SoftHSM configuration: %w", err)
	}
	return conf, nil
}

// NewPINs makes a random user PIN and SO PIN and writes them, 0600, to
// dir/user.pin and dir/so.pin (the PIN files hactl, the configuration and
// the load generator read). The PINs never appear on a command line.
func NewPINs(dir string) (user, so secret.PIN, userFile, soFile string, err error) {
	mk := func(name string) (secret.PIN, string, error) {
		b := make([]byte, 8)
		if _, err := rand.Read(b); err != nil {
			return secret.PIN{}, "", err
		}
		v := hex.EncodeToString(b)
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(v+"\n"), 0o600); err != nil {
			return secret.PIN{}, "", fmt.Errorf("PIN file %s: %w", path, err)
		}
		return secret.PINFromString(v), path, nil
	}
	if user, userFile, err = mk("user.pin"); err != nil {
		return
	}
	so, soFile, err = mk("so.pin")
	return
}

// InitTokens initialises one SoftHSM token per label in the token
// directory of softConf, with the given PINs, and returns their serial
// numbers by label. It runs in a child process (`hademo`'s or the test's
// own binary is not used: SoftHSM reads its configuration once per
// process), so call it from a program that can re-exec itself — see
// InitTokensMain.
func InitTokens(ctx context.Context, self string, softConf string, userFile, soFile string, labels []string) error {
	reg := NewRegistry()
	defer reg.StopAll()
	args := append([]string{"-init-tokens", userFile, soFile}, labels...)
	p, err := reg.Start(Spec{Name: "token initialisation", Path: self, Args: args,
		Env: Environ("SOFTHSM2_CONF="+softConf, InitTokensEnv+"=1")})
	if err != nil {
		return err
	}
	if err := p.Wait(ctx); err != nil {
		return fmt.Errorf("initialising tokens %v: %v: %s", labels, err, p.Output())
	}
	return nil
}

// InitTokensEnv marks the child process InitTokens starts.
const InitTokensEnv = "HAGROUP_LOAD_INIT_TOKENS"

// InitTokensMain is what the re-executed child runs: when the environment
// says so, it initialises the tokens named on its command line (after
// "-init-tokens USERPINFILE SOPINFILE") and exits; otherwise it returns.
// Call it first thing in main (or TestMain).
func InitTokensMain() {
	if os.Getenv(InitTokensEnv) == "" {
		return
	}
	os.Unsetenv(InitTokensEnv)
	args := os.Args[1:]
	for len(args) > 0 && args[0] != "-init-tokens" {
		args = args[1:]
	}
	if len(args) < 4 {
		fmt.Fprintln(os.Stderr, "init-tokens: want -init-tokens USERPINFILE SOPINFILE LABEL...")
		os.Exit(2)
	}
	if err := initTokens(args[1], args[2], args[3:]); err != nil {
		fmt.Fprintln(os.Stderr, "init-tokens:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func readPINFile(path string) (secret.PIN, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return secret.PIN{}, err
	}
	n := len(b)
	for n > 0 && (b[n-1] == '\n' || b[n-1] == '\r') {
		n--
	}
	pin := secret.NewPIN(b[:n])
	clear(b)
	return pin, nil
}

// initTokens initialises each label in SoftHSM's next free slot (SoftHSM
// offers a new free slot after every C_Initialize).
func initTokens(userFile, soFile string, labels []string) error {
	user, err := readPINFile(userFile)
	if err != nil {
		return err
	}
	so, err := readPINFile(soFile)
	if err != nil {
		return err
	}
	p := pkcs11.New(SoftHSMModule)
	if p == nil {
		return fmt.Errorf("cannot load %s", SoftHSMModule)
	}
	defer p.Destroy()
	for _, label := range labels {
		if err := initOne(p, label, user, so); err != nil {
			return fmt.Errorf("token %q: %w", label, err)
		}
	}
	return nil
}

func initOne(p *pkcs11.Ctx, label string, user, so secret.PIN) error {
	if err := p.Initialize(); err != nil {
		return err
	}
	defer p.Finalize()
	slots, err := p.GetSlotList(true)
	if err != nil {
		return err
	}
	for _, s := range slots {
		ti, err := p.GetTokenInfo(s)
		if err != nil || ti.Flags&pkcs11.CKF_TOKEN_INITIALIZED != 0 {
			continue
		}
		if err := p.InitToken(s, so.Reveal(), label); err != nil {
			return fmt.Errorf("C_InitToken: %w", err)
		}
		sh, err := p.OpenSession(s, pkcs11.CKF_SERIAL_SESSION|pkcs11.CKF_RW_SESSION)
		if err != nil {
			return err
		}
		defer p.CloseSession(sh)
		if err := p.Login(sh, pkcs11.CKU_SO, so.Reveal()); err != nil {
			return fmt.Errorf("SO login: %w", err)
		}
		if err := p.InitPIN(sh, user.Reveal()); err != nil {
			return fmt.Errorf("C_InitPIN: %w", err)
		}
		return p.Logout(sh)
	}
	return fmt.Errorf("no free slot")
}
