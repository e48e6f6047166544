package version

import (
	"runtime/debug"
	"testing"
)

func TestResolve(t *testing.T) {
	rev := []debug.BuildSetting{{Key: "vcs.revision", Value: "b08e88b0123456789abcdef0123456789abcdef0"}}
	tests := []struct {
		name  string
		stamp string
		bi    *debug.BuildInfo
		want  string
	}{
		{"stamp wins", "1.2.0-3-gabcdef0", &debug.BuildInfo{Main: debug.Module{Version: "v1.1.0"}}, "1.2.0-3-gabcdef0"},
		{"module version from go install", "", &debug.BuildInfo{Main: debug.Module{Version: "v1.1.0"}}, "v1.1.0"},
		{"checkout build", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: rev}, "git-b08e88b01234"},
		{"dirty checkout", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"},
			Settings: append(rev, debug.BuildSetting{Key: "vcs.modified", Value: "true"})}, "git-b08e88b01234-dirty"},
		{"nothing recorded", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "unknown"},
		{"no build info", "", nil, "unknown"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := resolve(tt.stamp, tt.bi); got != tt.want {
				t.Errorf("resolve(%q, …) = %q, want %q", tt.stamp, got, tt.want)
			}
		})
	}
}
