package config

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

const testPIN = "4711-s3cr3t"

func writePIN(t *testing.T, content string, mode os.FileMode) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "pin")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestReadPINFile(t *testing.T) {
	t.Parallel()
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tests := []struct {
		name    string
		path    string
		want    string // the PIN, when no error
		wantErr string // the whole message, with FILE for the path
	}{
		{name: "newline trimmed", path: writePIN(t, testPIN+"\n", 0o600), want: testPIN},
		{name: "CRLF trimmed", path: writePIN(t, testPIN+"\r\n", 0o600), want: testPIN},
		{name: "only one newline trimmed", path: writePIN(t, testPIN+"\n\n", 0o600), want: testPIN + "\n"},
		{name: "no newline", path: writePIN(t, testPIN, 0o400), want: testPIN},
		{name: "inner spaces kept", path: writePIN(t, " a b \n", 0o600), want: " a b "},
		{name: "group-readable allowed", path: writePIN(t, testPIN, 0o640), want: testPIN},
		{
			name:    "world-readable refused",
			path:    writePIN(t, testPIN, 0o644),
			wantErr: `member "hsm-a": pin_file FILE: mode 0644 lets other users read or write it: run chmod o-rwx`,
		},
		{
			name:    "world-writable refused",
			path:    writePIN(t, testPIN, 0o602),
			wantErr: `member "hsm-a": pin_file FILE: mode 0602 lets other users read or write it: run chmod o-rwx`,
		},
		{
			name:    "missing",
			path:    filepath.Join(dir, "none"),
			wantErr: `member "hsm-a": pin_file FILE: open: no such file or directory`,
		},
		{
			name:    "directory",
			path:    dir,
			wantErr: `member "hsm-a": pin_file FILE: not a regular file but a directory`,
		},
		{
			name:    "fifo refused without waiting for a writer",
			path:    fifo,
			wantErr: `member "hsm-a": pin_file FILE: not a regular file but a named pipe`,
		},
		{
			name:    "empty",
			path:    writePIN(t, "", 0o600),
			wantErr: `member "hsm-a": pin_file FILE: file is empty`,
		},
		{
			name:    "just a newline",
			path:    writePIN(t, "\n", 0o600),
			wantErr: `member "hsm-a": pin_file FILE: file is empty`,
		},
		{
			name:    "too large",
			path:    writePIN(t, strings.Repeat(testPIN, 1000), 0o600),
			wantErr: `member "hsm-a": pin_file FILE: larger than 4096 bytes: not a PIN file`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m := Member{Name: "hsm-a", PINFile: tt.path}
			if !m.HasPIN() {
				t.Error("HasPIN = false with pin_file set")
			}
			pin, err := m.ReadPIN()
			if tt.wantErr != "" {
				want := strings.ReplaceAll(tt.wantErr, "FILE", tt.path)
				if err == nil || err.Error() != want {
					t.Fatalf("ReadPIN error = %v\nwant %s", err, want)
				}
				if !pin.Empty() {
					t.Error("an error came with a non-empty PIN")
				}
				if strings.Contains(err.Error(), "s3cr3t") {
					t.Errorf("error shows the PIN: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if pin.Reveal() != tt.want {
				t.Errorf("PIN = %q, want %q", pin.Reveal(), tt.want)
			}
		})
	}
}

// A PIN file the reader may not open: as root the kernel would let us, so
// the read runs in a child process with an unprivileged user ID.
func TestReadPINFileUnreadable(t *testing.T) {
	t.Parallel()
	path := writePIN(t, testPIN, 0o600)
	if os.Geteuid() != 0 {
		if err := os.Chmod(path, 0o000); err != nil {
			t.Fatal(err)
		}
		_, err := Member{Name: "hsm-a", PINFile: path}.ReadPIN()
		if want := `member "hsm-a": pin_file ` + path + `: open: permission denied`; err == nil || err.Error() != want {
			t.Fatalf("ReadPIN = %v, want %s", err, want)
		}
		if !errors.Is(err, fs.ErrPermission) {
			t.Errorf("error does not match fs.ErrPermission: %v", err)
		}
		return
	}
	// Copy the test binary where user nobody may run it.
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "config.test")
	data, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	for d := filepath.Dir(bin); d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// The PIN file's directory must be searchable for the open to reach
	// the file's own permission check.
	if err := os.Chmod(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), bin)
	cmd.Env = append(os.Environ(), childEnv+"=readpin", childPath+"="+path, childName+"=hsm-a")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Skipf("cannot run a child as user nobody here: %v: %s", err, stderr.String())
	}
	if want := `member "hsm-a": pin_file ` + path + `: open: permission denied`; string(out) != want {
		t.Fatalf("unprivileged ReadPIN = %q, want %q", out, want)
	}
}

func TestReadPINEnv(t *testing.T) {
	// Not parallel: sets the environment.
	t.Setenv("HAGROUP_TEST_PIN", testPIN)
	t.Setenv("HAGROUP_TEST_EMPTY", "")
	tests := []struct {
		name, env, want, wantErr string
	}{
		{name: "set", env: "HAGROUP_TEST_PIN", want: testPIN},
		{name: "unset", env: "HAGROUP_TEST_UNSET", wantErr: `member "hsm-b": pin_env HAGROUP_TEST_UNSET: variable is not set`},
		{name: "empty", env: "HAGROUP_TEST_EMPTY", wantErr: `member "hsm-b": pin_env HAGROUP_TEST_EMPTY: variable is empty`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pin, err := Member{Name: "hsm-b", PINEnv: tt.env}.ReadPIN()
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr || !pin.Empty() {
					t.Fatalf("ReadPIN = %v, %v; want error %s", pin, err, tt.wantErr)
				}
				return
			}
			if err != nil || pin.Reveal() != tt.want {
				t.Fatalf("ReadPIN = %v, %v", pin, err)
			}
		})
	}
	m := Member{Name: "none"}
	if m.HasPIN() {
		t.Error("HasPIN = true without a source")
	}
	if pin, err := m.ReadPIN(); err != nil || !pin.Empty() {
		t.Errorf("no source: %v, %v; want the empty PIN and no error", pin, err)
	}
	if _, err := (Member{Name: "x", PINFile: "/p", PINEnv: "E"}).ReadPIN(); err == nil {
		t.Error("both sources accepted")
	}
}
