package install

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestMakeInstallUninstall stages `make install` in a DESTDIR with the
// default PREFIX, checks the layout a Debian admin expects of /usr/local,
// then `make uninstall` and checks that only the operator's configuration
// is left.
func TestMakeInstallUninstall(t *testing.T) {
	dest := t.TempDir()
	run := func(target string) {
		t.Helper()
		if out, err := try(t, debDeadline, "make", "-C", repoRoot, "--no-print-directory", target, "DESTDIR="+dest); err != nil {
			t.Fatalf("make %s: %v\n%s", target, err, out)
		}
	}
	run("install")
	want := []string{
		"/etc/hagroup/hagroup.toml",
		"/usr/local/bin/haagent",
		"/usr/local/bin/hactl",
		"/usr/local/bin/hsmserve",
		"/usr/local/lib/sysusers.d/hagroup.conf",
		"/usr/local/lib/systemd/system/haagent.service",
		"/usr/local/lib/x86_64-linux-gnu/pkcs11/hapkcs11-helper",
		"/usr/local/lib/x86_64-linux-gnu/pkcs11/libhapkcs11.so",
		"/usr/local/share/bash-completion/completions/hactl",
		"/usr/local/share/doc/hagroup/MANIFEST",
		"/usr/local/share/doc/hagroup/README.md",
		"/usr/local/share/doc/hagroup/examples/hagroup.toml",
		"/usr/local/share/fish/vendor_completions.d/hactl.fish",
		"/usr/local/share/man/man1/hactl.1.gz",
		"/usr/local/share/man/man3/libhapkcs11.3.gz",
		"/usr/local/share/man/man5/hagroup.toml.5.gz",
		"/usr/local/share/man/man8/haagent.8.gz",
		"/usr/local/share/man/man8/hsmserve.8.gz",
		"/usr/local/share/zsh/site-functions/_hactl",
	}
	got := files(t, dest)
	for _, p := range want {
		if !slices.Contains(got, p) {
			t.Errorf("make install did not install %s", p)
		}
	}
	unit, err := os.ReadFile(filepath.Join(dest, "/usr/local/lib/systemd/system/haagent.service"))
	if err != nil || !strings.Contains(string(unit), "\nExecStart=/usr/local/bin/haagent ") {
		t.Errorf("the installed unit does not run /usr/local/bin/haagent (%v)", err)
	}
	conf := filepath.Join(dest, "/etc/hagroup/hagroup.toml")
	if err := os.WriteFile(conf, []byte("# the operator's\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	run("install")
	if b, _ := os.ReadFile(conf); string(b) != "# the operator's\n" {
		t.Errorf("a second make install replaced the operator's configuration: %q", b)
	}

	run("uninstall")
	if left := files(t, dest); !slices.Equal(left, []string{"/etc/hagroup/hagroup.toml"}) {
		t.Errorf("after make uninstall, left %q, want only the configuration", left)
	}
	if _, err := os.Stat(filepath.Join(dest, "/usr/local/share/doc/hagroup")); err == nil {
		t.Errorf("make uninstall left /usr/local/share/doc/hagroup")
	}
}

// files lists the regular files under root, as absolute paths inside it.
func files(t *testing.T, root string) []string {
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			out = append(out, strings.TrimPrefix(p, root))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}
