//go:build unix

package export

import (
	"errors"
	"os"
	"syscall"
)

// lockFile takes an exclusive flock on f, held until f is closed or the
// process dies (even by SIGKILL).
func lockFile(f *os.File) error {
	return syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
}

// tryLockFile reports whether f's lock was free (and takes it if so).
func tryLockFile(f *os.File) (bool, error) {
	err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return false, nil
	}
	return err == nil, err
}
