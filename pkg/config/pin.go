package config

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"

	"github.com/hagroup/hagroup/pkg/secret"
)

// maxPINFile bounds what ReadPIN reads: a PIN is short, so a bigger file is
// not a PIN file.
const maxPINFile = 4096

// HasPIN reports whether the member names a PIN source (pin_file or
// pin_env).
func (m Member) HasPIN() bool { return m.PINFile != "" || m.PINEnv != "" }

// ReadPIN returns the member's user PIN from its source:
//
//   - pin_file: the file's content with one trailing newline ("\n" or
//     "\r\n") removed. The file must be a regular file (symbolic links are
//     followed) that other users can neither read nor write (mode o-rw):
//     group-readable is allowed, so a service group can share it.
//   - pin_env: the value of that environment variable, which must be set.
//
// A source that is unreadable, refused or empty is an error naming the
// member and the source, never an empty PIN. A member with neither source
// gets the empty PIN and no error (the caller then logs in without a PIN or
// prompts). Errors never contain the PIN.
func (m Member) ReadPIN() (secret.PIN, error) {
	switch {
	case m.PINFile != "" && m.PINEnv != "":
		return secret.PIN{}, fmt.Errorf("member %q: both pin_file and pin_env are set", m.Name)
	case m.PINFile != "":
		pin, err := readPINFile(m.PINFile)
		if err != nil {
			return secret.PIN{}, fmt.Errorf("member %q: pin_file %s: %w", m.Name, m.PINFile, err)
		}
		return pin, nil
	case m.PINEnv != "":
		v, ok := os.LookupEnv(m.PINEnv)
		switch {
		case !ok:
			return secret.PIN{}, fmt.Errorf("member %q: pin_env %s: variable is not set", m.Name, m.PINEnv)
		case v == "":
			return secret.PIN{}, fmt.Errorf("member %q: pin_env %s: variable is empty", m.Name, m.PINEnv)
		}
		return secret.PINFromString(v), nil
	}
	return secret.PIN{}, nil
}

func readPINFile(path string) (secret.PIN, error) {
	// O_NONBLOCK: opening a FIFO must not wait for a writer; the check
	// below refuses it.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return secret.PIN{}, unwrapPath(err)
	}
	defer f.Close()
	// Check the file actually opened, not the name, which may have been
	// replaced in between.
	st, err := f.Stat()
	if err != nil {
		return secret.PIN{}, unwrapPath(err)
	}
	switch mode := st.Mode(); {
	case !mode.IsRegular():
		return secret.PIN{}, fmt.Errorf("not a regular file but %s", fileKind(mode))
	case mode.Perm()&0o006 != 0:
		return secret.PIN{}, fmt.Errorf("mode %04o lets other users read or write it: run chmod o-rwx", mode.Perm())
	}
	buf := make([]byte, maxPINFile+1)
	defer clear(buf)
	n, err := io.ReadFull(f, buf)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return secret.PIN{}, unwrapPath(err)
	}
	if n > maxPINFile {
		return secret.PIN{}, fmt.Errorf("larger than %d bytes: not a PIN file", maxPINFile)
	}
	b := buf[:n]
	switch {
	case len(b) >= 2 && b[len(b)-2] == '\r' && b[len(b)-1] == '\n':
		b = b[:len(b)-2]
	case len(b) >= 1 && b[len(b)-1] == '\n':
		b = b[:len(b)-1]
	}
	if len(b) == 0 {
		return secret.PIN{}, errors.New("file is empty")
	}
	return secret.NewPIN(b), nil
}

// unwrapPath drops the *fs.PathError wrapper, whose path the caller's
// message already names.
func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s: %w", pe.Op, pe.Err)
	}
	return err
}

// fileKind names the type of a file that is not a regular one.
func fileKind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	}
	return "a " + m.Type().String() + " file"
}
