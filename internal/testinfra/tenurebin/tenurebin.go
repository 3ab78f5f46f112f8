// Package tenurebin builds the tenure binary for the tests that run it as
// a child process, as an operator runs it.
package tenurebin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Build builds cmd/tenure into a new temporary folder. It returns the
// binary's path and a function that removes the folder; on failure, an
// error that carries the compiler's output.
func Build() (bin string, remove func(), err error) {
	dir, err := os.MkdirTemp("", "tenure-bin-")
	if err != nil {
		return "", nil, err
	}
	remove = func() { _ = os.RemoveAll(dir) }
	bin = filepath.Join(dir, "tenure")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/tenure-dev/tenure/cmd/tenure").CombinedOutput()
	if err != nil {
		remove()
		return "", nil, fmt.Errorf("building tenure: %v\n%s", err, out)
	}
	return bin, remove, nil
}

// Run is a TestMain's body for a package whose tests run the binary: it
// builds it into *bin, runs the tests and removes the binary. It returns
// the exit code for os.Exit: m.Run's, or 1 when the build failed (said on
// stderr).
func Run(m *testing.M, bin *string) int {
	b, remove, err := Build()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer remove()
	*bin = b
	return m.Run()
}
