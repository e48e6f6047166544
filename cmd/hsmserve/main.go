// Command hsmserve serves the tokens of a PKCS#11 module to hagroup over a
// Unix socket, so that a group member can live in another process: one that
// can be killed, stopped or restarted on its own, or that runs under
// another account on the HSM's host side. A member names it by the module
// path hagroup-remote:unix:<socket>.
//
//	hsmserve --module /usr/lib/softhsm/libsofthsm2.so --socket /run/hsm-a.sock [--token-label ha-a]
//	hsmserve --module /usr/lib/x86_64-linux-gnu/libsoftokn3.so --socket /run/nss-a.sock \
//	    --init-args "configdir='sql:/var/lib/nss-a' certPrefix='' keyPrefix='' secmod='secmod.db'"
//
// --init-args is the pReserved string of the module's C_Initialize
// (p11-kit's x-init-reserved), which NSS softokn needs; it is on the
// command line, so it never holds a PIN (internal/initargs refuses one).
//
// It runs in the foreground; SIGTERM or SIGINT stop it (exit 0). The
// socket is created with mode 0600 in a directory only its owner may
// write, and only the server's own uid and root may connect (checked with
// SO_PEERCRED). PINs pass through, never logged.
//
// Each connection is served by a process of its own, this executable run
// again with the hidden flag --serve-fd: it loads the module, receives
// its connection over file descriptor 3, initialises the module for that
// client alone, and exits when the connection closes. So one client's
// login, logout and sessions never touch another's, as with `p11-kit
// server`. One such process is started ahead of its connection, so that
// a client does not wait for a process start.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/hagroup/hagroup/internal/initargs"
	"github.com/hagroup/hagroup/internal/p11raw"
	"github.com/hagroup/hagroup/internal/version"
	"github.com/hagroup/hagroup/pkg/remote"
	"github.com/miekg/pkcs11"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	fs := flag.NewFlagSet("hsmserve", flag.ContinueOnError)
	module := fs.String("module", "", "absolute path of the PKCS#11 module to serve (required)")
	sock := fs.String("socket", "", "absolute path of the Unix socket to listen on (required)")
	label := fs.String("token-label", "", "serve only the slot whose token has this label")
	initArgs := fs.String("init-args", "", "the pReserved string of the module's C_Initialize (NSS softokn: configdir='sql:DIR' …); never a PIN")
	serveFD := fs.Bool("serve-fd", false, "internal: serve the one connection handed over file descriptor 3")
	showVersion := fs.Bool("version", false, "print the version and exit")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: hsmserve --module PATH --socket PATH [--token-label LABEL] [--init-args ARGS]\n       hsmserve --version\n")
		fs.VisitAll(func(f *flag.Flag) {
			if f.Name != "serve-fd" {
				fmt.Fprintf(fs.Output(), "  --%s\n    \t%s\n", f.Name, f.Usage)
			}
		})
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	switch {
	case *showVersion:
		fmt.Println("hsmserve", version.String())
		return 0
	case fs.NArg() > 0:
		fmt.Fprintf(os.Stderr, "hsmserve: unexpected argument %q\n", fs.Arg(0))
		return 2
	case *module == "" || !filepath.IsAbs(*module):
		fmt.Fprintln(os.Stderr, "hsmserve: --module must be the absolute path of a PKCS#11 module")
		return 2
	case initargs.Check(*initArgs) != nil:
		fmt.Fprintf(os.Stderr, "hsmserve: --init-args: %v\n", initargs.Check(*initArgs))
		return 2
	case *serveFD:
		return serveOne(*module, *label, *initArgs, *sock)
	case *sock == "" || !filepath.IsAbs(*sock):
		fmt.Fprintln(os.Stderr, "hsmserve: --socket must be an absolute path")
		return 2
	}
	if _, err := remote.ParseModulePath(remote.ModulePath(*sock)); err != nil {
		fmt.Fprintf(os.Stderr, "hsmserve: --socket: %v\n", err)
		return 2
	}

	if err := preflight(*module, *initArgs); err != nil {
		fmt.Fprintf(os.Stderr, "hsmserve: %v\n", err)
		return 1
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "hsmserve: find this executable to serve connections: %v\n", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	l, err := remote.Listen(*sock)
	if err != nil {
		fmt.Fprintf(os.Stderr, "hsmserve: %v\n", err)
		return 1
	}
	defer os.Remove(*sock)
	srv := &remote.Server{
		Module:     *module,
		InitArgs:   *initArgs,
		TokenLabel: *label,
		Refused:    func(err error) { fmt.Fprintf(os.Stderr, "hsmserve: %v\n", err) },
		Child: func() *exec.Cmd {
			return exec.Command(self, "--serve-fd", "--module", *module, "--token-label", *label, "--init-args", *initArgs, "--socket", *sock)
		},
	}
	what := "every token"
	if *label != "" {
		what = fmt.Sprintf("token %q", *label)
	}
	fmt.Fprintf(os.Stderr, "hsmserve: serving %s of %s as module path %s\n", what, *module, remote.ModulePath(*sock))
	if err := srv.Serve(ctx, l); err != nil {
		fmt.Fprintf(os.Stderr, "hsmserve: %v\n", err)
		return 1
	}
	return 0
}

// controlFD is the descriptor a connection's process is handed its
// connection on (exec.Cmd.ExtraFiles[0]).
const controlFD = 3

// serveOne serves the connection handed over controlFD until it closes
// or SIGTERM; sock is the server's socket, beside which its processes keep
// a store lock (remote.Server.StoreLock).
func serveOne(module, label, initArgs, sock string) int {
	f := os.NewFile(controlFD, "control")
	fc, err := net.FileConn(f)
	f.Close()
	ctl, ok := fc.(*net.UnixConn)
	if err != nil || !ok {
		fmt.Fprintf(os.Stderr, "hsmserve: --serve-fd: descriptor %d is no Unix socket: %v\n", controlFD, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	srv := &remote.Server{
		Module:     module,
		InitArgs:   initArgs,
		TokenLabel: label,
		Refused:    func(err error) { fmt.Fprintf(os.Stderr, "hsmserve[%d]: %v\n", os.Getpid(), err) },
	}
	if sock != "" {
		srv.StoreLock = remote.StoreLockPath(sock)
	}
	if err := srv.ServeHanded(ctx, ctl); err != nil {
		fmt.Fprintf(os.Stderr, "hsmserve[%d]: %v\n", os.Getpid(), err)
		return 1
	}
	return 0
}

// preflight initialises the module once and finalizes it, so that a module
// that cannot start (a wrong path, missing or wrong init arguments) is
// reported when hsmserve starts, not to each client as a closed
// connection.
func preflight(module, initArgs string) error {
	mc := pkcs11.New(module)
	if mc == nil {
		return fmt.Errorf("load PKCS#11 module %s: no such file, dlopen failed or no C_GetFunctionList", module)
	}
	defer mc.Destroy()
	err := p11raw.Initialize(mc, initArgs)
	switch {
	case err == nil:
		return mc.Finalize()
	case initArgs == "" && errors.Is(err, pkcs11.Error(pkcs11.CKR_ARGUMENTS_BAD)):
		return fmt.Errorf("initialise PKCS#11 module %s: %w: init arguments may be missing: this module may need --init-args "+
			"(NSS softokn needs configdir='sql:DIR' certPrefix='' keyPrefix='' secmod='secmod.db')", module, err)
	}
	return fmt.Errorf("initialise PKCS#11 module %s: %w", module, err)
}
