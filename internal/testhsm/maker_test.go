package testhsm

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The token maker takes its PINs from its standard input only, and
// refuses to make a token when a PIN is where other processes can read it
// (its environment or command line): a rig that put one there would fail
// here, not leak quietly.
func TestMakerKeepsPINsOutOfSight(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conf, err := writeConf(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Run("stdin", func(t *testing.T) {
		serials, err := InitTokens(ctx, conf, []string{"mk-a", "mk-b"}, UserPIN, SOPIN)
		if err != nil || serials["mk-a"] == "" || serials["mk-b"] == "" || serials["mk-a"] == serials["mk-b"] {
			t.Fatalf("InitTokens = %v, %v; want two tokens with serial numbers of their own", serials, err)
		}
	})
	t.Run("environment", func(t *testing.T) {
		cmd, err := makerCommand(ctx, SoftHSMModule, []string{"mk-c"}, SOPIN, UserPIN, nil)
		if err != nil {
			t.Fatal(err)
		}
		cmd.Env = withEnv(withEnv(cmd.Env, "SOFTHSM2_CONF", conf), "SOME_VARIABLE", "x"+UserPIN)
		_, err = makeTokens(cmd, []string{"mk-c"})
		if err == nil || !strings.Contains(err.Error(), "a PIN is in /proc/self/environ") {
			t.Fatalf("maker with the user PIN in its environment: %v; want it refused", err)
		}
		if strings.Contains(err.Error(), UserPIN) {
			t.Fatal("the maker's error shows the PIN")
		}
		if ents, _ := os.ReadDir(filepath.Join(filepath.Dir(conf), "tokens")); len(ents) != 2 {
			t.Fatalf("token directory holds %d tokens after the refusal, want the 2 made before", len(ents))
		}
	})
}
