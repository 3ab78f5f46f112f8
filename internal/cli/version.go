package cli

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

var versionSpec = spec{name: "version", short: "print the version: the module version, and the commit built from when known", maxArgs: 0}

// versionCmd is `tenure version`, the same as `tenure --version`.
type versionCmd struct{ base }

func (*versionCmd) define(*flagSet)      {}
func (*versionCmd) check([]string) error { return nil }

func (c *versionCmd) run(context.Context) error {
	_, err := fmt.Fprintln(c.stdout, versionText())
	return err
}

// versionText says which tenure this is: the module version (a release's
// tag; a pseudo-version derived from the commit when built in a checkout;
// "(devel)" when the build recorded neither, as with -buildvcs=false), and
// the commit it was built from, with its time and whether the tree had
// changes, when the build recorded them.
func versionText() string {
	bi, _ := debug.ReadBuildInfo()
	return formatVersion(bi)
}

func formatVersion(bi *debug.BuildInfo) string {
	version := "(devel)"
	var rev, at, modified string
	if bi != nil {
		if v := bi.Main.Version; v != "" {
			version = v
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.time":
				at = s.Value
			case "vcs.modified":
				modified = s.Value
			}
		}
	}
	lines := []string{"tenure " + version}
	if rev != "" {
		lines = append(lines, "revision  "+rev)
	}
	if at != "" {
		lines = append(lines, "time      "+at)
	}
	if modified != "" {
		lines = append(lines, "modified  "+modified)
	}
	lines = append(lines, "go        "+runtime.Version()+" "+runtime.GOOS+"/"+runtime.GOARCH)
	return strings.Join(lines, "\n")
}
