package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// completionConfig is a configuration with two groups whose members share
// a name, as an operator's file would.
const completionConfigTOML = `
[[group]]
label = "signing"
  [[group.member]]
  name = "hsm-a"
  [[group.member]]
  name = "hsm-b"

[[group]]
label = "backup"
  [[group.member]]
  name = "hsm-a"
  [[group.member]]
  name = "hsm-z"
`

func writeCompletionConfig(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "hagroup.toml")
	if err := os.WriteFile(p, []byte(completionConfigTOML), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// complete runs `hactl __complete ARGS…` (what every shell script calls)
// and returns the candidates, without descriptions.
func complete(t *testing.T, args ...string) []string {
	t.Helper()
	var out, errOut bytes.Buffer
	if code := run(context.Background(), append([]string{"__complete"}, args...), strings.NewReader(""), &out, &errOut); code != 0 {
		t.Fatalf("hactl __complete %q: exit %d: %s", args, code, errOut.String())
	}
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		if strings.HasPrefix(line, ":") { // the directive
			continue
		}
		got = append(got, strings.SplitN(line, "\t", 2)[0])
	}
	return got
}

func TestCompleteFlagValues(t *testing.T) {
	cfg := writeCompletionConfig(t)
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{"group labels", []string{"--config", cfg, "hagroup", "listgroups", "--group", ""}, []string{"signing", "backup"}},
		{"group labels by prefix", []string{"--config", cfg, "hagroup", "synchronize", "--group", "si"}, []string{"signing"}},
		{"members of the --group given", []string{"--config", cfg, "hagroup", "removemember", "--group", "backup", "--member", ""}, []string{"hsm-a", "hsm-z"}},
		{"members of every group, once each", []string{"--config", cfg, "hagroup", "recover", "--member", ""}, []string{"hsm-a", "hsm-b", "hsm-z"}},
		{"recovery modes", []string{"--config", cfg, "hagroup", "recoverymode", "--mode", ""}, []string{"activeBasic", "activeEnhanced"}},
		{"deletegroup names an existing group", []string{"--config", cfg, "hagroup", "deletegroup", "--label", ""}, []string{"signing", "backup"}},
		{"creategroup names a new group", []string{"--config", cfg, "hagroup", "creategroup", "--label", ""}, nil},
		{"no configuration, no candidates", []string{"--config", filepath.Join(t.TempDir(), "absent.toml"), "hagroup", "listgroups", "--group", ""}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := complete(t, tt.args...); !slices.Equal(got, tt.want) {
				t.Errorf("hactl __complete %q = %q, want %q", tt.args, got, tt.want)
			}
		})
	}
}

// TestEveryGroupAndMemberFlagCompletes walks the command tree: a command
// added with a --group or --member flag completes it too.
func TestEveryGroupAndMemberFlagCompletes(t *testing.T) {
	root := newRootCmd(newApp(strings.NewReader(""), &bytes.Buffer{}, &bytes.Buffer{}))
	n := 0
	walkCommands(root, func(c *cobra.Command) {
		for _, name := range []string{"group", "member", "mode"} {
			if c.LocalFlags().Lookup(name) == nil {
				continue
			}
			n++
			if _, ok := c.GetFlagCompletionFunc(name); !ok {
				t.Errorf("%s --%s has no value completion", c.CommandPath(), name)
			}
		}
	})
	if n < 10 {
		t.Errorf("found %d --group/--member/--mode flags, want at least 10: did the walk miss commands?", n)
	}
}

// bashComplete sources the generated bash script (after bash-completion's
// functions when withBashCompletion) and presses TAB at the end of line,
// as bash does: it returns COMPREPLY, one per line, and stderr.
func bashComplete(t *testing.T, withBashCompletion bool, line string) (reply, stderr string) {
	t.Helper()
	bin := buildBinaries(t)
	var script, errOut bytes.Buffer
	if code := run(context.Background(), []string{"completion", "bash"}, strings.NewReader(""), &script, &errOut); code != 0 {
		t.Fatalf("hactl completion bash: exit %d: %s", code, errOut.String())
	}
	scriptPath := filepath.Join(t.TempDir(), "hactl.bash")
	if err := os.WriteFile(scriptPath, script.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	prelude := ""
	if withBashCompletion {
		prelude = "source /usr/share/bash-completion/bash_completion\n"
	}
	prog := prelude + `source "$SCRIPT"
read -ra COMP_WORDS <<<"$LINE"
[[ $LINE == *" " ]] && COMP_WORDS+=("")
COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
COMP_LINE=$LINE
COMP_POINT=${#LINE}
__start_hactl
printf '%s\n' "${COMPREPLY[@]}"
`
	cmd := exec.CommandContext(t.Context(), "bash", "--norc", "--noprofile", "-c", prog)
	cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "SCRIPT="+scriptPath, "LINE="+line)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("bash: %v\n%s", err, errb.String())
	}
	return strings.TrimSpace(out.String()), errb.String()
}

func TestBashCompletion(t *testing.T) {
	if _, err := os.Stat("/usr/share/bash-completion/bash_completion"); err != nil {
		t.Skip("the bash-completion package is not installed (scripts/deps.sh installs it)")
	}
	cfg := writeCompletionConfig(t)
	tests := []struct{ line, want string }{
		{"hactl --config " + cfg + " hagroup removemember --group signing --member ", "hsm-a\nhsm-b"},
		{"hactl --config " + cfg + " hagroup listgroups --group b", "backup"},
		{"hactl --config " + cfg + " hagroup recoverymode --mode activeE", "activeEnhanced"},
		{"hactl hagroup synchro", "synchronize"},
	}
	for _, tt := range tests {
		reply, stderr := bashComplete(t, true, tt.line)
		if reply != tt.want {
			t.Errorf("TAB after %q: COMPREPLY %q, want %q (stderr %q)", tt.line, reply, tt.want, stderr)
		}
	}
}

// TestBashCompletionSaysWhatIsMissing: without bash-completion the script
// names the package instead of failing on a missing function.
func TestBashCompletionSaysWhatIsMissing(t *testing.T) {
	reply, stderr := bashComplete(t, false, "hactl hagroup synchro")
	if reply != "" {
		t.Errorf("COMPREPLY %q without bash-completion, want none", reply)
	}
	if !strings.Contains(stderr, "hactl: completion needs the bash-completion package (apt install bash-completion)") {
		t.Errorf("stderr %q does not name the bash-completion package", stderr)
	}
	if strings.Contains(stderr, "command not found") {
		t.Errorf("stderr %q still fails on a missing function", stderr)
	}
}
