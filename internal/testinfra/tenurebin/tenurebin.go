// Package tenurebin builds the tenure binary for the tests that run it as
// a child process, as an operator runs it.
package tenurebin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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
