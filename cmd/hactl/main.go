// Command hactl is the operator CLI of hagroup, modelled on LunaCM's
// hagroup commands: it edits the config file (locked, atomic) and sends
// live commands to haagent over its Unix socket.
//
// Exit codes are stable and documented in exitcode.go.
package main

import (
	"context"
	"fmt"
	"github.com/hagroup/hagroup/pkg/slot"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes one hactl command line and returns its exit code. The
// mapping from errors to exit codes happens here and nowhere else.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	slot.OwnEnvironment() // a hagroup program: members' module_env may be written (pkg/slot)
	a := newApp(stdin, stdout, stderr)
	root := newRootCmd(a)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return ExitOK
	}
	if ctx.Err() != nil {
		// A signal ended the work: whatever error it caused, the cause is
		// the interruption.
		err = fmt.Errorf("%w: %v", errInterrupted, err)
	}
	code := exitCodeOf(err)
	if !shownSummary(err) {
		fmt.Fprintf(stderr, "hactl: %v\n", err)
	}
	if code == ExitUsage && !a.quietUsage {
		fmt.Fprintf(stderr, "Run 'hactl %s --help' for usage.\n", commandPathOf(root, args))
	}
	return code
}
