package install

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hagroup/hagroup/pkg/config"
)

const (
	pkg      = "hagroup"
	repoRoot = "../.."
	// debDeadline bounds building the .deb: the binaries come from the
	// build cache; nfpm is compiled once per machine (a few minutes then).
	debDeadline = 10 * time.Minute
	// stepDeadline bounds every other command.
	stepDeadline = 2 * time.Minute
)

// The files the package installs, where the README and the man pages say.
var installed = []string{
	"/usr/bin/hactl",
	"/usr/bin/haagent",
	"/usr/bin/hsmserve",
	"/usr/lib/x86_64-linux-gnu/pkcs11/libhapkcs11.so",
	"/usr/lib/x86_64-linux-gnu/pkcs11/hapkcs11-helper",
	"/usr/share/man/man1/hactl.1.gz",
	"/usr/share/man/man1/hactl-hagroup-synchronize.1.gz",
	"/usr/share/man/man3/libhapkcs11.3.gz",
	"/usr/share/man/man5/hagroup.toml.5.gz",
	"/usr/share/man/man8/haagent.8.gz",
	"/usr/share/man/man8/hsmserve.8.gz",
	"/usr/share/bash-completion/completions/hactl",
	"/usr/share/zsh/vendor-completions/_hactl",
	"/usr/share/fish/vendor_completions.d/hactl.fish",
	"/usr/lib/systemd/system/haagent.service",
	"/usr/lib/sysusers.d/hagroup.conf",
	"/usr/share/doc/hagroup/examples/hagroup.toml",
	"/usr/share/doc/hagroup/copyright",
	"/etc/hagroup/hagroup.toml",
}

// The directories the agent writes, which purge removes.
var agentDirs = []string{"/var/lib/hagroup", "/var/log/hagroup"}

// sh runs a command with a deadline and returns its combined output;
// failing the test names the command and shows the output.
func sh(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := try(t, stepDeadline, name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

func try(t *testing.T, d time.Duration, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	return string(out), err
}

// dpkg runs dpkg ARGS…, waiting (up to stepDeadline) while another
// process, such as apt on this shared machine, holds dpkg's lock: dpkg
// itself fails at once then.
func dpkg(t *testing.T, args ...string) {
	t.Helper()
	deadline := time.Now().Add(stepDeadline)
	for {
		out, err := try(t, stepDeadline, "dpkg", args...)
		if err == nil {
			return
		}
		if !strings.Contains(out, "lock was locked by another process") || time.Now().After(deadline) {
			t.Fatalf("dpkg %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		time.Sleep(500 * time.Millisecond) // polling an external lock, bounded by the deadline
	}
}

// status is dpkg's view of the package: "install ok installed",
// "deinstall ok config-files", or "" when dpkg knows nothing of it.
func status(t *testing.T) string {
	out, err := try(t, stepDeadline, "dpkg-query", "-W", "-f=${Status}", pkg)
	if err != nil || strings.HasSuffix(out, "not-installed") {
		return ""
	}
	return strings.TrimSpace(out)
}

// skipUnlessThisMachineIsFree skips when the test cannot run or would
// disturb an installation already here.
func skipUnlessThisMachineIsFree(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: dpkg -i installs into /usr and /etc")
	}
	for _, tool := range []string{"dpkg", "dpkg-query", "make"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not found: not a Debian machine", tool)
		}
	}
	if s := status(t); s != "" {
		t.Skipf("package %s is on this machine (%s): the test would replace it", pkg, s)
	}
	for _, p := range append(slicesConcat(installed, agentDirs), "/etc/hagroup") {
		if _, err := os.Lstat(p); err == nil {
			t.Skipf("%s exists (a make install?): the test would overwrite or remove it", p)
		}
	}
}

func slicesConcat(a, b []string) []string { return append(append([]string(nil), a...), b...) }

// buildDeb runs `make deb` into a temporary directory and returns the .deb.
func buildDeb(t *testing.T) string {
	dist := t.TempDir()
	if out, err := try(t, debDeadline, "make", "-C", repoRoot, "--no-print-directory", "deb", "DIST="+dist); err != nil {
		t.Fatalf("make deb: %v\n%s", err, out)
	}
	debs, _ := filepath.Glob(filepath.Join(dist, pkg+"_*.deb"))
	if len(debs) != 1 {
		t.Fatalf("make deb made %q, want one %s_*.deb", debs, pkg)
	}
	return debs[0]
}

// TestDebInstallRemovePurge installs the .deb as an operator would, checks
// the binaries report the tree's version and every file is where the
// documentation says, then removes and purges it and checks nothing is left.
func TestDebInstallRemovePurge(t *testing.T) {
	skipUnlessThisMachineIsFree(t)
	_, err := user.Lookup("hagroup")
	userExisted := err == nil
	deb := buildDeb(t)
	t.Cleanup(func() {
		if status(t) != "" {
			dpkg(t, "--purge", pkg)
		}
		if !userExisted {
			try(t, stepDeadline, "userdel", "hagroup")
			try(t, stepDeadline, "groupdel", "hagroup")
		}
		// None of these existed before (skipUnlessThisMachineIsFree).
		for _, d := range append(agentDirs, "/run/hagroup", "/etc/hagroup") {
			os.RemoveAll(d)
		}
	})

	dpkg(t, "-i", deb)
	if s := status(t); s != "install ok installed" {
		t.Fatalf("after dpkg -i, status %q", s)
	}
	checkVersions(t)
	checkFiles(t)
	checkConfig(t)
	checkAgentDirs(t)
	checkUnit(t)
	checkModuleLoads(t)
	pins := checkOperatorSession(t)
	owned := strings.Fields(sh(t, "dpkg-query", "-L", pkg))
	// What a running agent leaves behind, for purge to remove (the
	// operator session's agent wrote some already).
	for _, d := range agentDirs {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "written-by-agent"), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	dpkg(t, "-r", pkg)
	if s := status(t); s != "deinstall ok config-files" {
		t.Errorf("after dpkg -r, status %q, want the conffile kept", s)
	}
	for _, p := range installed {
		_, err := os.Lstat(p)
		if keep := p == "/etc/hagroup/hagroup.toml"; keep != (err == nil) {
			t.Errorf("after dpkg -r, %s: exists %v, want %v", p, err == nil, keep)
		}
	}

	dpkg(t, "--purge", pkg)
	if s := status(t); s != "" {
		t.Errorf("after dpkg --purge, status %q, want none", s)
	}
	// The operator's PIN files stay, and so /etc/hagroup with them: only them.
	if _, err := os.Stat("/etc/hagroup"); pins == nil && err == nil {
		t.Errorf("after dpkg --purge, /etc/hagroup is still there")
	}
	if pins != nil {
		if left := files(t, "/etc/hagroup"); !slices.Equal(left, pins) {
			t.Errorf("after dpkg --purge, /etc/hagroup holds %q, want only the operator's PIN files %q", left, pins)
		}
	}
	for _, p := range append(owned, slicesConcat(agentDirs, []string{"/run/hagroup"})...) {
		fi, err := os.Lstat(p)
		if err == nil && !(fi.IsDir() && isShared(p)) && !strings.HasPrefix(p, "/etc/hagroup") {
			t.Errorf("after dpkg --purge, %s is still there", p)
		}
	}
}

// isShared reports whether a directory the package lists belongs to the
// system too (/usr/bin, /usr/share/man/man1, …) and may stay: any with
// hagroup in its path is the package's own.
func isShared(dir string) bool { return !strings.Contains(dir, "hagroup") }

// checkVersions: every binary prints the version the Makefile stamped.
func checkVersions(t *testing.T) {
	want := strings.TrimSpace(sh(t, filepath.Join(repoRoot, "packaging", "version.sh")))
	if want == "" || strings.Contains(want, "dev") || strings.Contains(want, "unknown") {
		t.Fatalf("packaging/version.sh printed %q, not a version", want)
	}
	for bin, line := range map[string]string{
		"/usr/bin/haagent":  "haagent " + want,
		"/usr/bin/hsmserve": "hsmserve " + want,
		"/usr/bin/hactl":    "hactl version " + want,
	} {
		if got := strings.TrimSpace(sh(t, bin, "--version")); got != line {
			t.Errorf("%s --version printed %q, want %q", bin, got, line)
		}
	}
}

func checkFiles(t *testing.T) {
	for _, p := range installed {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("installed file: %v", err)
		}
	}
	for page, th := range map[string]string{
		"/usr/share/man/man8/haagent.8.gz":      ".TH HAAGENT 8",
		"/usr/share/man/man5/hagroup.toml.5.gz": ".TH HAGROUP.TOML 5",
		"/usr/share/man/man3/libhapkcs11.3.gz":  ".TH LIBHAPKCS11 3",
	} {
		if got := gunzip(t, page); !strings.HasPrefix(got, th) {
			t.Errorf("%s starts %.40q, want %q", page, got, th)
		}
	}
	bash, _ := os.ReadFile("/usr/share/bash-completion/completions/hactl")
	if !bytes.Contains(bash, []byte("__start_hactl")) {
		t.Errorf("the bash completion file is not hactl's script")
	}
	if _, err := user.Lookup("hagroup"); err != nil {
		t.Errorf("the agent's user: %v", err)
	}
	conffiles := sh(t, "dpkg-query", "-W", "-f=${Conffiles}", pkg)
	if !strings.Contains(conffiles, "/etc/hagroup/hagroup.toml") {
		t.Errorf("conffiles %q lack /etc/hagroup/hagroup.toml", conffiles)
	}
}

func gunzip(t *testing.T, path string) string {
	f, err := os.Open(path)
	if err != nil {
		t.Error(err)
		return ""
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Errorf("%s: %v", path, err)
		return ""
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		t.Errorf("%s: %v", path, err)
	}
	return string(b)
}

// checkConfig: the packaged configuration is valid, and readable by the
// agent's group but nobody else.
func checkConfig(t *testing.T) {
	const p = "/etc/hagroup/hagroup.toml"
	if _, err := config.Load(p); err != nil {
		t.Errorf("the packaged configuration does not load: %v", err)
	}
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o640 {
		t.Errorf("%s mode %v, want 0640", p, fi.Mode().Perm())
	}
	g, err := user.LookupGroup("hagroup")
	if err != nil {
		t.Fatalf("the agent's group: %v", err)
	}
	if gid := ownerGID(fi); gid != g.Gid {
		t.Errorf("%s group %s, want hagroup (%s)", p, gid, g.Gid)
	}
}

// checkAgentDirs: the state directory and the HA log's directory are the
// agent's and set-group-ID, so a file an application running as root
// makes there (a tombstone lock, the log without an agent) gets the group
// hagroup and the agent can still open it.
func checkAgentDirs(t *testing.T) {
	g, err := user.LookupGroup("hagroup")
	if err != nil {
		t.Fatalf("the agent's group: %v", err)
	}
	for _, d := range agentDirs {
		fi, err := os.Stat(d)
		if err != nil {
			t.Errorf("after dpkg -i: %v", err)
			continue
		}
		if want := os.ModeDir | os.ModeSetgid | 0o770; fi.Mode() != want {
			t.Errorf("%s mode %v, want %v", d, fi.Mode(), want)
		}
		if gid := ownerGID(fi); gid != g.Gid {
			t.Errorf("%s group %s, want hagroup (%s)", d, gid, g.Gid)
		}
		// What root makes there is the agent's group's.
		f := filepath.Join(d, "made-by-root")
		if err := os.WriteFile(f, nil, 0o660); err != nil {
			t.Fatal(err)
		}
		if fi, err := os.Stat(f); err != nil || ownerGID(fi) != g.Gid {
			t.Errorf("a file root makes in %s does not get the group hagroup (%v)", d, err)
		}
		os.Remove(f)
	}
}

// checkUnit: the unit runs the packaged binary, points at its man page, and
// systemd finds nothing wrong with it.
func checkUnit(t *testing.T) {
	const unit = "/usr/lib/systemd/system/haagent.service"
	b, err := os.ReadFile(unit)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"\nExecStart=/usr/bin/haagent --config /etc/hagroup/hagroup.toml", "\nDocumentation=man:haagent(8)", "\nUser=hagroup\n"} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("%s lacks %q", unit, strings.TrimSpace(want))
		}
	}
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Log("systemd-analyze not found: the unit is not verified")
		return
	}
	if out, err := try(t, stepDeadline, "systemd-analyze", "verify", unit); err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("systemd-analyze verify %s: %v\n%s", unit, err, out)
	}
}

// checkModuleLoads: a PKCS#11 application loads the installed module, with
// the packaged configuration, and C_GetInfo names it.
func checkModuleLoads(t *testing.T) {
	if _, err := exec.LookPath("pkcs11-tool"); err != nil {
		t.Log("pkcs11-tool not found (scripts/deps.sh installs opensc): the module is not loaded")
		return
	}
	// It exits 1 after the info: the packaged configuration has no group,
	// so there is no slot yet.
	out, _ := try(t, stepDeadline, "pkcs11-tool", "--module", "/usr/lib/x86_64-linux-gnu/pkcs11/libhapkcs11.so", "--show-info")
	if !strings.Contains(out, "Cryptoki version 2.40") || !strings.Contains(out, "Manufacturer     hagroup") ||
		!strings.Contains(out, "No slots.") {
		t.Errorf("pkcs11-tool --show-info on the installed module:\n%s", out)
	}
}
