// Command haagent is hagroup's management agent: it runs the engine for
// every configured group (health probes, auto-recovery, synchronisation
// checks), writes the HA event log, exports Prometheus metrics and serves
// hactl on a Unix socket.
//
//	haagent [--config PATH] [--socket PATH] [--log-level debug|info|warn|error]
//	haagent --version
//
// SIGHUP reloads the configuration (a bad one is refused and the running
// one kept); SIGTERM and SIGINT drain requests and exit 0.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"github.com/hagroup/hagroup/pkg/slot"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/hagroup/hagroup/internal/version"
	"github.com/hagroup/hagroup/pkg/agent/daemon"
	"github.com/hagroup/hagroup/pkg/config"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run parses flags, starts the daemon and blocks until a stop signal.
// Exit codes: 0 clean stop, 1 failure, 2 bad flags.
func run(args []string, stdout, stderr io.Writer) int {
	slot.OwnEnvironment() // a hagroup program: members' module_env may be written (pkg/slot)
	fs := flag.NewFlagSet("haagent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgFlag := fs.String("config", "", "configuration file (default $HAGROUP_CONF, else "+config.DefaultPath+")")
	socket := fs.String("socket", "", "socket to serve on (default: the config's agent.socket)")
	level := fs.String("log-level", "info", "log level: debug, info, warn or error")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "haagent: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if *showVersion {
		fmt.Fprintln(stdout, "haagent", version.String())
		return 0
	}
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(*level)); err != nil {
		fmt.Fprintf(stderr, "haagent: --log-level %q: want debug, info, warn or error\n", *level)
		return 2
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lv}))

	d, err := daemon.New(daemon.Options{
		ConfigPath: config.ResolvePath(*cfgFlag),
		Socket:     *socket,
		Version:    version.String(),
		Logger:     logger,
		Open:       daemon.OpenGroup,
	})
	if err != nil {
		logger.Error("cannot start", "error", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				res, err := d.Reload(ctx)
				if err != nil {
					logger.Error("SIGHUP reload refused", "error", err)
					continue
				}
				logger.Info("SIGHUP reload done", "changes", len(res.Changes))
			}
		}
	}()
	if err := d.Run(ctx); err != nil {
		if errors.Is(err, context.Canceled) {
			return 0
		}
		logger.Error("haagent failed", "error", err)
		return 1
	}
	logger.Info("haagent stopped")
	return 0
}
