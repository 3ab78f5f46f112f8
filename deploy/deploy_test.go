// Package deploy holds the deployment files. No container engine runs in CI,
// so this test checks them against the binary instead: every TENURE_*
// variable a manifest sets must be a flag of the command it is given to,
// fencing-relevant settings must be sane, and the Dockerfile must build the
// real command.
package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// container is one container of the manifest: its args and env names.
type container struct {
	args []string
	env  []string
}

// containers reads the containers of a manifest with a deliberately small
// parser: the manifest's shape is fixed by this repository.
func containers(t *testing.T, path string) []container {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []container
	argsRE := regexp.MustCompile(`^\s+args: \[(.*)\]$`)
	envRE := regexp.MustCompile(`^\s+- name: (TENURE_[A-Z_]+)$`)
	for _, line := range strings.Split(string(b), "\n") {
		if m := argsRE.FindStringSubmatch(line); m != nil {
			var args []string
			for _, a := range strings.Split(m[1], ",") {
				args = append(args, strings.Trim(strings.TrimSpace(a), `"`))
			}
			out = append(out, container{args: args})
			continue
		}
		if m := envRE.FindStringSubmatch(line); m != nil && len(out) > 0 {
			out[len(out)-1].env = append(out[len(out)-1].env, m[1])
		}
	}
	return out
}

func TestManifestVariablesAreFlags(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "tenure")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/tenure-dev/tenure/cmd/tenure").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	cs := containers(t, "kubernetes/worker.yaml")
	if len(cs) < 2 {
		t.Fatalf("found %d containers with args in the manifest, want the worker and the migration", len(cs))
	}
	for _, c := range cs {
		if len(c.env) == 0 {
			t.Errorf("container %v sets no TENURE_* variable", c.args)
		}
		help, _ := exec.Command(bin, append([]string{c.args[0]}, "--help")...).CombinedOutput()
		for _, v := range c.env {
			if !strings.Contains(string(help), "["+v+"]") {
				t.Errorf("`tenure %s` has no flag for %s (its --help:\n%s)", c.args[0], v, help)
			}
		}
	}
}

func TestManifestFencingSettings(t *testing.T) {
	b, err := os.ReadFile("kubernetes/worker.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	if strings.Contains(strings.ToLower(s), "instance") && strings.Contains(s, "TENURE_INSTANCE") {
		t.Error("static membership must not be configured")
	}
	m := regexp.MustCompile(`terminationGracePeriodSeconds: (\d+)`).FindStringSubmatch(s)
	if m == nil {
		t.Fatal("the worker needs terminationGracePeriodSeconds")
	}
	// The worker lets in-flight batches finish for up to 30s, then leaves
	// the group (up to 10s): the pod must not be killed before.
	if n, _ := strconv.Atoi(m[1]); n < 45 {
		t.Errorf("terminationGracePeriodSeconds %d is shorter than a graceful stop", n)
	}
}

func TestDockerfileBuildsTheCommand(t *testing.T) {
	b, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, want := range []string{"./cmd/tenure", "FROM golang:1.26", "ENTRYPOINT", "nonroot"} {
		if !strings.Contains(s, want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
	gomod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	goVer := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindStringSubmatch(string(gomod))
	if goVer == nil || !strings.Contains(s, "golang:"+goVer[1]) {
		t.Errorf("the build image's Go version must match go.mod's (%v)", goVer)
	}
}
