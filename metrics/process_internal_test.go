package metrics

import (
	"runtime/debug"
	"testing"
)

func TestBuildVersion(t *testing.T) {
	for _, c := range []struct {
		name              string
		bi                *debug.BuildInfo
		version, revision string
	}{
		{"no build info", nil, "(devel)", "unknown"},
		{"tenure, a checkout", &debug.BuildInfo{Main: debug.Module{Path: modulePath, Version: "v0.0.0-20261203-abcdef"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abcdef0123"}}}, "v0.0.0-20261203-abcdef", "abcdef0123"},
		{"tenure, -buildvcs=false", &debug.BuildInfo{Main: debug.Module{Path: modulePath}}, "(devel)", "unknown"},
		{"a program that imports tenure", &debug.BuildInfo{Main: debug.Module{Path: "example.com/app", Version: "v2.0.0"},
			Deps:     []*debug.Module{{Path: "example.com/other", Version: "v1.0.0"}, {Path: modulePath, Version: "v0.3.1"}},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "app-commit"}}}, "v0.3.1", "unknown"},
		{"a replaced tenure", &debug.BuildInfo{Main: debug.Module{Path: "example.com/app"},
			Deps: []*debug.Module{{Path: modulePath, Version: "v0.3.1", Replace: &debug.Module{Path: "../tenure"}}}}, "(devel)", "unknown"},
	} {
		v, r := buildVersion(c.bi)
		if v != c.version || r != c.revision {
			t.Errorf("%s: %q %q, want %q %q", c.name, v, r, c.version, c.revision)
		}
	}
}
