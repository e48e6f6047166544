package module

import (
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
)

var forkBenchSeconds = flag.Int("forkbench", 0, "run TestForkBench, each figure for this many seconds (make bench: 5)")

// TestForkBench measures signing in processes forked from one that
// initialised the module (through their helpers) against processes that
// run the engine themselves, ECDSA P-256 and RSA-2048, 1 and 4 processes,
// on three in-process SoftHSM members, and beside them the anchor for a
// PKCS#11 call over a socket: the same processes on p11-kit-client.so, a
// `p11-kit server` signing on the first member's token (its CPU counted),
// and on that token straight through libsofthsm2.so (what the socket
// adds to); it prints the figures for docs/BENCHMARKS.md and fails only
// when a signature fails.
func TestForkBench(t *testing.T) {
	if *forkBenchSeconds <= 0 {
		t.Skip("a benchmark: go test -run TestForkBench -forkbench 5 ./test/module")
	}
	r := forkBenchRig(t)
	prog := cprog(t, "forkbench")
	p11kit, serverPID := r.p11KitServer(r.members[0].Label)
	for _, mech := range []string{"ecdsa", "rsa"} {
		for _, procs := range []int{1, 4} {
			for _, mode := range []string{"inprocess", "helper", "softhsm", "p11kit"} {
				label := map[string]string{"ecdsa": "bench-ec", "rsa": "bench-rsa"}[mech]
				env, module, slot := withoutPIN(r.env), r.lib, virtualSlot
				switch mode {
				case "softhsm":
					module, slot = testhsm.SoftHSMModule, "label="+r.members[0].Label
				case "p11kit":
					env = append(env, "P11_KIT_SERVER_ADDRESS="+p11kit, fmt.Sprintf("HAP_BENCH_SERVER_PID=%d", serverPID))
					module, slot = testhsm.P11KitClient, "label="+r.members[0].Label
				}
				out, err := runEnv(t, 3*time.Minute, env, r.dir, prog, mode, module, slot, r.pinFile,
					label, mech, fmt.Sprint(procs), fmt.Sprint(*forkBenchSeconds))
				if err != nil {
					t.Fatalf("forkbench %s %s %d: %v\n%s", mode, mech, procs, err, out)
				}
				fmt.Print("forkbench ", strings.TrimSpace(out), "\n")
			}
		}
	}
}

// TestForkMix (with -forkbench=ROUNDS) measures the same as TestForkBench's
// helper and in-process figures, the two sides interleaved in 100 ms
// slices in one run (c/forkmix.c), so that a shared machine's drift falls
// on both alike: ECDSA P-256 and RSA-2048, 1 and 4 processes a side. It
// prints the medians of the rounds' ratios for docs/BENCHMARKS.md and
// fails only when a signature fails.
func TestForkMix(t *testing.T) {
	if *forkBenchSeconds <= 0 {
		t.Skip("a benchmark: go test -run TestForkMix -forkbench 20 ./test/module (20 rounds of 4 slices)")
	}
	r := forkBenchRig(t)
	prog := cprog(t, "forkmix")
	for _, mech := range []string{"ecdsa", "rsa"} {
		for _, procs := range []int{1, 4} {
			label := map[string]string{"ecdsa": "bench-ec", "rsa": "bench-rsa"}[mech]
			out, err := runEnv(t, 5*time.Minute, withoutPIN(r.env), r.dir, prog, r.lib, virtualSlot, r.pinFile,
				label, mech, fmt.Sprint(procs), fmt.Sprint(*forkBenchSeconds))
			if err != nil {
				t.Fatalf("forkmix %s %d: %v\n%s", mech, procs, err, out)
			}
			fmt.Print("forkmix ", strings.TrimSpace(out), "\n")
		}
	}
}

// forkBenchRig is the rig of TestForkBench and TestForkMix, with their keys:
// bench-ec (P-256) and bench-rsa (RSA-2048).
func forkBenchRig(t *testing.T) *rig {
	r := newRig(t, rigOpts{})
	r.keypair("bench-ec", "0b01")
	r.tool("--slot", virtualSlot, "--login", "--pin", "env:HA_PIN", "--keypairgen",
		"--key-type", "rsa:2048", "--label", "bench-rsa", "--id", "0b02")
	return r
}

// p11KitServer serves the rig's token labelled label with `p11-kit server`
// until the test ends; it returns the server's address and pid.
func (r *rig) p11KitServer(label string) (string, int) {
	r.t.Helper()
	sock := filepath.Join(r.dir, "p11kit.sock")
	cmd := exec.Command("p11-kit", "server", "-f", "-n", sock, "--provider", testhsm.SoftHSMModule, "pkcs11:token="+label)
	cmd.Env = withoutPIN(r.env)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		r.t.Fatalf("p11-kit server: %v", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	r.t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.Dial("unix", sock)
		if err == nil {
			c.Close()
			return "unix:path=" + sock, cmd.Process.Pid
		}
		select {
		case <-done:
			r.t.Fatalf("p11-kit server ended: %s", out.String())
		default:
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("p11-kit server did not answer on %s within 30 s: %v\n%s", sock, err, out.String())
		}
		time.Sleep(20 * time.Millisecond) // polling a socket: nothing to wait on
	}
}

// TestNginxBench (with -forkbench) measures nginx's fresh TLS handshakes
// per second with the key through the group — 4 workers forked from the
// master (each through its helper), and nginx in one process
// (master_process off: the engine in process) — and with the key straight
// on a member's SoftHSM token in one process, where SoftHSM works (its
// forked workers do not: docs/BENCHMARKS.md).
func TestNginxBench(t *testing.T) {
	if *forkBenchSeconds <= 0 {
		t.Skip("a benchmark: go test -run TestNginxBench ./test/module -forkbench=5")
	}
	r := newRig(t, rigOpts{})
	cert, uri := r.tlsKey()
	member := strings.Replace(uri, "token="+groupLabel, "token="+r.members[0].Label, 1)
	for _, c := range []struct {
		name, module, uri, processes string
	}{
		{"group, 4 forked workers", r.lib, uri, "master_process on;\nworker_processes 4;"},
		{"group, one process", r.lib, uri, "master_process off;"},
		{"softhsm, one process", testhsm.SoftHSMModule, member, "master_process off;"},
	} {
		port := freePort(t)
		conf := strings.Replace(fmt.Sprintf(nginxConf, r.dir, port, cert, c.uri), "master_process on;\nworker_processes 4;", c.processes, 1)
		path := r.write("nginx-bench.conf", conf)
		cmd := r.startServerModule(c.module, "/usr/sbin/nginx", "-p", r.dir, "-e", filepath.Join(r.dir, "nginx-error.log"), "-c", path)
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		waitListening(t, addr, cmd, filepath.Join(r.dir, "nginx-error.log"))
		n := 400 * *forkBenchSeconds
		start := time.Now()
		failed, errs := handshakes(t, addr, cert, n, 8, nil)
		took := time.Since(start)
		if failed != 0 {
			log, _ := os.ReadFile(filepath.Join(r.dir, "nginx-error.log"))
			hlog, _ := os.ReadFile(r.logFile)
			t.Fatalf("%s: %d of %d handshakes failed: %v\nnginx-error.log ends:\n%s\nthe module's log ends:\n%s", c.name, failed, n, errs, tail(log, 5), tail(hlog, 40))
		}
		fmt.Printf("nginxbench %s: %d handshakes in %v, %.0f/s\n", c.name, n, took.Round(time.Millisecond), float64(n)/took.Seconds())
		stopGroup(cmd)
	}
}
