// Package version says which build of hagroup is running: the one answer
// every binary prints for --version, reports in metrics and logs.
package version

import (
	"runtime/debug"
	"sync"
)

// stamped is set by the Makefile with
// -ldflags '-X github.com/hagroup/hagroup/internal/version.stamped=…'
// (git describe of the tree built). Empty in a plain `go build`.
var stamped string

var (
	once   sync.Once
	cached string
)

// String returns the build's version: the Makefile's stamp, else the
// module version `go install …@v1.2.3` records, else the VCS revision
// `go build` records in a checkout ("git-<12 hex>[-dirty]"), else
// "unknown". It never returns an empty string.
func String() string {
	once.Do(func() {
		bi, _ := debug.ReadBuildInfo()
		cached = resolve(stamped, bi)
	})
	return cached
}

// resolve is String's rule on explicit inputs, so tests can drive it.
func resolve(stamp string, bi *debug.BuildInfo) string {
	if stamp != "" {
		return stamp
	}
	if bi == nil {
		return "unknown"
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev string
	var dirty bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return "unknown"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	v := "git-" + rev
	if dirty {
		v += "-dirty"
	}
	return v
}
