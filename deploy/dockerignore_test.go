package deploy

import (
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"
)

// dockerignored reports whether a path of the build context (slash
// separated, relative to its root) is left out by the patterns, as Docker
// reads them without ! and **: a pattern matches a path or one of its
// parent directories, anchored at the context's root.
func dockerignored(patterns []string, p string) bool {
	for _, pat := range patterns {
		for q := p; q != "." && q != "/"; q = path.Dir(q) {
			if ok, _ := path.Match(pat, q); ok {
				return true
			}
		}
	}
	return false
}

// The build context leaves out the repository's history and the binaries
// built in the work tree (README's `go build -o tenure`: 55 MB), and keeps
// every file `go build ./cmd/tenure` reads.
func TestDockerignore(t *testing.T) {
	b, err := os.ReadFile("../.dockerignore")
	if err != nil {
		t.Fatalf("no .dockerignore at the repository root, the build context of deploy/Dockerfile: %v", err)
	}
	var patterns []string
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasPrefix(line, "!") || strings.Contains(line, "**") {
			t.Fatalf(".dockerignore: %q: this test reads patterns without ! and ** only; teach it, or keep them simple", line)
		}
		patterns = append(patterns, strings.TrimPrefix(path.Clean(line), "/"))
	}
	for _, p := range []string{".git", ".git/objects/pack/x.pack", "tenure", "deploy.test", "cover.out"} {
		if !dockerignored(patterns, p) {
			t.Errorf(".dockerignore keeps %s in the build context", p)
		}
	}
	// What the build reads: go.mod, go.sum (the Dockerfile copies them
	// first) and each package's Go and embedded files, as CGO_ENABLED=0
	// builds it.
	cmd := exec.Command("go", "list", "-deps", "-f", `{{if .Module}}{{if .Module.Main}}{{$d := .Dir}}{{range .GoFiles}}{{$d}}/{{.}}{{"\n"}}{{end}}{{range .EmbedFiles}}{{$d}}/{{.}}{{"\n"}}{{end}}{{end}}{{end}}`, "github.com/tenure-dev/tenure/cmd/tenure")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	files := []string{"go.mod", "go.sum"}
	for _, f := range strings.Fields(string(out)) {
		rel, err := filepath.Rel(root, f)
		if err != nil || strings.HasPrefix(rel, "..") {
			t.Fatalf("%s is outside the module", f)
		}
		files = append(files, filepath.ToSlash(rel))
	}
	if len(files) < 50 {
		t.Fatalf("go list found %d files; expected the command's packages", len(files))
	}
	for _, f := range files {
		if dockerignored(patterns, f) {
			t.Errorf(".dockerignore leaves out %s, which go build ./cmd/tenure reads", f)
		}
	}
}
