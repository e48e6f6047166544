// Package testhsm gives tests real SoftHSM tokens on throwaway token
// directories, and real remote tokens that a test can kill, stop and
// restart: served by `p11-kit server` (Serve) or by hagroup's own hsmserve
// (ServeRemote, whose transport also carries CKM_AES_KEY_WRAP_PAD and
// CKA_UNWRAP_TEMPLATE, so keys can be replicated to it).
//
// SoftHSM reads its token directory once per process, at C_Initialize, so
// the tokens of the in-process pool are made up front by Main (called from
// TestMain) and handed out by Take. Served tokens live in their own token
// directory, read by their own server process, so Serve can make them at any
// time.
//
// The PINs below are fixed because the tokens are throwaway; they are never
// printed by this package.
package testhsm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
)

// Paths of the PKCS#11 modules the harness uses.
const (
	SoftHSMModule = "/usr/lib/softhsm/libsofthsm2.so"
	P11KitClient  = "/usr/lib/x86_64-linux-gnu/pkcs11/p11-kit-client.so"
)

// PINs of every token the harness makes.
const (
	UserPIN = "test-user-1234"
	SOPIN   = "test-so-5678"
)

// Token describes one initialised token a test may use.
type Token struct {
	Name      string            // a member name for the token, unique in the process
	Label     string            // CKA token label
	Serial    string            // token serial number
	Module    string            // PKCS#11 module that offers the token
	ModuleEnv map[string]string // environment the module needs (served tokens)
	InitArgs  string            // C_Initialize's pReserved the module needs (NSS softokn in process)
	UserPIN   string
	SOPIN     string
}

// pool is the process's in-process token pool. It is package state because
// the token directory it describes is process state too: SOFTHSM2_CONF is
// read once per process by SoftHSM, which never adds a token made by
// another process to its slots, so the pool cannot grow once tests run.
// Instead a token a finished test released is initialised afresh (recycle)
// when the unused ones run out, as with go test -count=N.
var pool struct {
	mu       sync.Mutex
	ready    bool
	tokens   []Token // made by Main, or recycled; tokens[next:] are unused
	next     int
	released []Token // given back by finished tests, not yet recycled
	held     int     // taken and not yet released
	made     int     // tokens ever made: numbers the next one
}

// Main creates a temporary SoftHSM token directory holding ntokens
// initialised tokens for Take (labels tok-00, tok-01, …; PINs UserPIN and
// SOPIN) and one more per reserved label, which Take never hands out (an
// Example has no *testing.T and names its tokens by label), points
// SOFTHSM2_CONF at it, runs the tests, removes the directory and returns
// the exit code for os.Exit.
func Main(m *testing.M, ntokens int, reserved ...string) int {
	MakerMain()           // a child re-executed to make tokens ends here
	slot.OwnEnvironment() // a test binary: members' module_env may be written (pkg/slot)
	dir, err := os.MkdirTemp("", "testhsm-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "testhsm: %v\n", err)
		return 1
	}
	defer os.RemoveAll(dir)

	conf, err := writeConf(dir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "testhsm: %v\n", err)
		return 1
	}
	labels := make([]string, ntokens)
	for i := range labels {
		labels[i] = fmt.Sprintf("tok-%02d", i)
	}
	all := append(slices.Clone(labels), reserved...)
	ctx, cancel := context.WithTimeout(context.Background(), initDeadline(len(all)))
	serials, err := initTokens(ctx, conf, all)
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "testhsm: %v\n", err)
		return 1
	}
	if err := os.Setenv("SOFTHSM2_CONF", conf); err != nil {
		fmt.Fprintf(os.Stderr, "testhsm: %v\n", err)
		return 1
	}

	pool.mu.Lock()
	pool.tokens = pool.tokens[:0]
	for i, l := range labels {
		pool.tokens = append(pool.tokens, Token{
			Name:    fmt.Sprintf("hsm-%02d", i),
			Label:   l,
			Serial:  serials[l],
			Module:  SoftHSMModule,
			UserPIN: UserPIN,
			SOPIN:   SOPIN,
		})
	}
	pool.next = 0
	pool.released = nil
	pool.held = 0
	pool.made = ntokens
	pool.ready = true
	pool.mu.Unlock()

	code := m.Run()
	removeBuilt()

	pool.mu.Lock()
	pool.ready = false
	pool.mu.Unlock()
	return code
}

// Take returns n tokens from the pool that no other running test holds,
// each fresh: no objects, the harness's PINs, a label and member name no
// earlier test saw (a recycled token keeps its serial number: SoftHSM
// keeps it through C_InitToken). They go back to the pool when the test (or subtest) t
// ends, after the cleanups registered after Take. It fails the test when
// Main was not called or no token can be had.
func Take(t testing.TB, n int) []Token {
	t.Helper()
	pool.mu.Lock()
	defer pool.mu.Unlock()
	if !pool.ready {
		t.Fatalf("testhsm.Take: no token pool; call testhsm.Main from TestMain")
	}
	var inUse []Token // released tokens that could not be recycled now
	for len(pool.tokens)-pool.next < n && len(pool.released) > 0 {
		tok := pool.released[0]
		pool.released = pool.released[1:]
		fresh, err := recycle(tok, pool.made)
		if err != nil {
			// Still open somewhere (a test that leaked a session):
			// left as it is, to be tried again by a later Take.
			inUse = append(inUse, tok)
			t.Logf("testhsm.Take: token %s not recycled: %v", tok.Label, err)
			continue
		}
		pool.made++
		pool.tokens = append(pool.tokens, fresh)
	}
	pool.released = append(pool.released, inUse...)
	if pool.next+n > len(pool.tokens) {
		t.Fatalf("testhsm.Take(%d): only %d tokens free (%d held by running tests, %d released but still in use); raise the count given to testhsm.Main",
			n, len(pool.tokens)-pool.next, pool.held, len(inUse))
	}
	out := make([]Token, n)
	copy(out, pool.tokens[pool.next:pool.next+n])
	pool.next += n
	pool.held += n
	t.Cleanup(func() { release(out) })
	return out
}

// release gives tokens back to the pool.
func release(toks []Token) {
	pool.mu.Lock()
	defer pool.mu.Unlock()
	if pool.ready {
		pool.held -= len(toks)
		pool.released = append(pool.released, toks...)
	}
}

// recycle initialises the pool token tok afresh as the pool's token number
// i: C_InitToken in this process (the module's state must follow; another
// process's pkcs11-tool would leave it stale), which SoftHSM refuses while
// a session of this process is open on the token.
func recycle(tok Token, i int) (Token, error) {
	ctx, cancel := context.WithTimeout(context.Background(), initDeadline(1))
	defer cancel()
	label := fmt.Sprintf("tok-%02d", i)
	serial, err := slot.InitToken(ctx, SoftHSMModule, tok.Serial, label,
		secret.PINFromString(SOPIN), secret.PINFromString(UserPIN))
	if err != nil {
		return Token{}, err
	}
	tok.Name = fmt.Sprintf("hsm-%02d", i)
	tok.Label = label
	tok.Serial = serial
	tok.UserPIN = UserPIN
	tok.SOPIN = SOPIN
	return tok, nil
}

// initDeadline bounds the initialisation of n tokens (a C_Initialize,
// C_InitToken and C_InitPIN each); the bound is generous for loaded CI machines.
func initDeadline(n int) time.Duration {
	return time.Duration(30+n) * time.Second
}

// writeConf writes a SoftHSM configuration whose token directory is
// dir/tokens and returns its path.
func writeConf(dir string) (string, error) {
	tokens := filepath.Join(dir, "tokens")
	if err := os.MkdirAll(tokens, 0o700); err != nil {
		return "", fmt.Errorf("make token directory: %w", err)
	}
	conf := filepath.Join(dir, "softhsm2.conf")
	body := "directories.tokendir = " + tokens + "\n" +
		"objectstore.backend = file\n" +
		"log.level = ERROR\n" +
		"slots.removable = false\n"
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		return "", fmt.Errorf("write %s: %w", conf, err)
	}
	return conf, nil
}

// initTokens initialises one token per label in the token directory of conf
// with the harness's PINs and returns the serial number of each label.
func initTokens(ctx context.Context, conf string, labels []string) (map[string]string, error) {
	return InitTokens(ctx, conf, labels, UserPIN, SOPIN)
}

// InitTokens initialises one SoftHSM token per label in the token
// directory of the SoftHSM configuration conf, with the given PINs, and
// returns the serial number of each label. The token maker (MakerMain, a
// child process of this test binary) makes them, reading the PINs from
// its standard input: no PIN is ever in a command line or an environment.
func InitTokens(ctx context.Context, conf string, labels []string, userPIN, soPIN string) (map[string]string, error) {
	cmd, err := makerCommand(ctx, SoftHSMModule, labels, soPIN, userPIN, nil)
	if err != nil {
		return nil, err
	}
	cmd.Env = withEnv(cmd.Env, "SOFTHSM2_CONF", conf)
	return makeTokens(cmd, labels)
}

// withEnv returns env with key set to value, replacing any earlier value.
func withEnv(env []string, key, value string) []string {
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if !strings.HasPrefix(kv, key+"=") {
			out = append(out, kv)
		}
	}
	return append(out, key+"="+value)
}
