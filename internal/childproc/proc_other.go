//go:build !linux

package childproc

import (
	"runtime"
	"syscall"
)

// ownGroup: a process group of its own (no Pdeathsig outside Linux).
func ownGroup(a *syscall.SysProcAttr) { a.Setpgid = true }

// readProc: /proc/PID/stat and status are Linux's.
func readProc(int, string) ([]byte, error) { return nil, errNoProc }

// maxrssBytes: macOS reports ru_maxrss in bytes, the BSDs in kilobytes.
func maxrssBytes(maxrss int64) int64 {
	if runtime.GOOS == "darwin" || runtime.GOOS == "ios" {
		return maxrss
	}
	return maxrss << 10
}
