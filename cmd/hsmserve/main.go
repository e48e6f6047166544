// Command hsmserve serves the tokens of a PKCS#11 module to hagroup over a
// Unix socket, so that a group member can live in another process: one that
// can be killed, stopped or restarted on its own, or that runs under
// another account on the HSM's host side. A member names it by the module
// path hagroup-remote:unix:<socket>.
//
//	hsmserve --module /usr/lib/softhsm/libsofthsm2.so --socket /run/hsm-a.sock [--token-label ha-a]
//
// It runs in the foreground; SIGTERM or SIGINT stop it (exit 0). The
// socket is created with mode 0600 and only the server's own uid and root
// may connect (checked with SO_PEERCRED). PINs pass through, never logged.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/hagroup/hagroup/internal/version"
	"github.com/hagroup/hagroup/pkg/remote"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	fs := flag.NewFlagSet("hsmserve", flag.ContinueOnError)
	module := fs.String("module", "", "absolute path of the PKCS#11 module to serve (required)")
	sock := fs.String("socket", "", "absolute path of the Unix socket to listen on (required)")
	label := fs.String("token-label", "", "serve only the slot whose token has this label")
	showVersion := fs.Bool("version", false, "print the version and exit")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: hsmserve --module PATH --socket PATH [--token-label LABEL]\n       hsmserve --version\n")
		fs.PrintDefaults()
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
	case *sock == "" || !filepath.IsAbs(*sock):
		fmt.Fprintln(os.Stderr, "hsmserve: --socket must be an absolute path")
		return 2
	}
	if _, err := remote.ParseModulePath(remote.ModulePath(*sock)); err != nil {
		fmt.Fprintf(os.Stderr, "hsmserve: --socket: %v\n", err)
		return 2
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
		TokenLabel: *label,
		Refused:    func(err error) { fmt.Fprintf(os.Stderr, "hsmserve: %v\n", err) },
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
