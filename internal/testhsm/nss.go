package testhsm

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// NSSModule is NSS softokn (Debian libnss3), a second make of software
// token: it needs init arguments naming its database.
const NSSModule = "/usr/lib/x86_64-linux-gnu/libsoftokn3.so"

// NSSSerial is the serial number NSS softokn gives every database token:
// a member on NSS is named by its label (dbTokenDescription).
const NSSSerial = "0000000000000000"

// NSSInitArgs returns the init arguments that open the NSS database in dir
// as a token labelled label (NSS's dbTokenDescription, at most 32 bytes).
func NSSInitArgs(dir, label string) string {
	return fmt.Sprintf("configdir='sql:%s' certPrefix='' keyPrefix='' secmod='secmod.db' flags=optimizeSpace dbTokenDescription='%s'", dir, label)
}

// NSS makes a fresh NSS database whose token is labelled label, with
// UserPIN as its password, and returns it as a Token on NSSModule with its
// init arguments. A process initialises NSS softokn once: a test holds at
// most one in-process NSS token at a time (ServeNSS serves more).
func NSS(t testing.TB, label string) Token {
	t.Helper()
	dir := nssDB(t, label)
	return Token{Name: label, Label: label, Serial: NSSSerial, Module: NSSModule,
		InitArgs: NSSInitArgs(dir, label), UserPIN: UserPIN}
}

// ServeNSS makes a fresh NSS database whose token is labelled name and
// serves it with hagroup's hsmserve (--init-args), as ServeRemote does a
// SoftHSM token: any number of NSS members, each in its own process.
func ServeNSS(t testing.TB, name string) *Served {
	t.Helper()
	bin, err := hsmserveBinary()
	if err != nil {
		t.Fatalf("testhsm.ServeNSS(%s): %v", name, err)
	}
	db := nssDB(t, name)
	s := &Served{
		t:        t,
		remote:   true,
		bin:      bin,
		name:     name,
		label:    name,
		serial:   NSSSerial,
		sock:     filepath.Join(db, "p11.sock"),
		module:   NSSModule,
		initArgs: NSSInitArgs(db, name),
	}
	if len(s.sock) >= 100 {
		t.Fatalf("testhsm.ServeNSS(%s): socket path %s too long for a Unix socket; set a shorter TMPDIR", name, s.sock)
	}
	t.Cleanup(s.shutdown)
	if err := s.start(); err != nil {
		t.Fatalf("testhsm.ServeNSS(%s): %v", name, err)
	}
	return s
}

// nssDB makes an NSS database in a fresh directory, removed when the test
// ends, with UserPIN as its password. certutil reads the password from a
// file of the directory (never its command line), removed at once.
func nssDB(t testing.TB, label string) string {
	t.Helper()
	if label == "" || len(label) > 32 {
		t.Fatalf("testhsm: NSS token label %q must be 1 to 32 bytes", label)
	}
	dir, err := os.MkdirTemp("", "nss-")
	if err != nil {
		t.Fatalf("testhsm: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	pw := filepath.Join(dir, "pw")
	if err := os.WriteFile(pw, []byte(UserPIN+"\n"), 0o600); err != nil {
		t.Fatalf("testhsm: %v", err)
	}
	defer os.Remove(pw)
	ctx, cancel := context.WithTimeout(context.Background(), initDeadline(1))
	defer cancel()
	out, err := exec.CommandContext(ctx, "certutil", "-N", "-d", "sql:"+dir, "-f", pw).CombinedOutput()
	if err != nil {
		t.Fatalf("testhsm: certutil -N for NSS token %s: %v: %s", label, err, out)
	}
	return dir
}
