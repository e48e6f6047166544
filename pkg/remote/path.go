package remote

import (
	"fmt"
	"path/filepath"
	"strings"
)

// Scheme starts the module path of a served token. The full form is
//
//	hagroup-remote:unix:/absolute/path/of/the.sock
//
// and it stands wherever a PKCS#11 module path does (slot.Spec.Module, a
// member's module in hagroup.toml).
const Scheme = "hagroup-remote:"

// unixPrefix is the one transport of protocol version 1.
const unixPrefix = Scheme + "unix:"

// IsModulePath reports whether path names a served token (starts with
// Scheme), well-formed or not; ParseModulePath says whether it is valid.
func IsModulePath(path string) bool { return strings.HasPrefix(path, Scheme) }

// ModulePath returns the module path of a token served on the Unix socket
// sock (an absolute path).
func ModulePath(sock string) string { return unixPrefix + sock }

// ParseModulePath returns the socket of a served token's module path, or an
// error naming what is wrong with it.
func ParseModulePath(path string) (sock string, err error) {
	if !IsModulePath(path) {
		return "", fmt.Errorf("module path %q does not start with %s", path, Scheme)
	}
	sock, ok := strings.CutPrefix(path, unixPrefix)
	if !ok {
		return "", fmt.Errorf("module path %q: the only transport is unix: (%sunix:/path/of/socket)", path, Scheme)
	}
	switch {
	case sock == "" || !filepath.IsAbs(sock):
		return "", fmt.Errorf("module path %q: socket %q is not an absolute path", path, sock)
	case strings.ContainsRune(sock, 0):
		return "", fmt.Errorf("module path %q: socket path contains a NUL byte", path)
	case len(sock) > maxSocketPath:
		return "", fmt.Errorf("module path %q: socket path is %d bytes; a Unix socket path holds at most %d", path, len(sock), maxSocketPath)
	}
	return sock, nil
}

// maxSocketPath is sizeof(sun_path) - 1 on Linux.
const maxSocketPath = 107
