package childproc

import (
	"fmt"
	"os"
	"syscall"
)

// ownGroup: a process group of its own, and SIGKILL from the kernel if the
// parent dies first, even by SIGKILL (it cannot clean up then).
func ownGroup(a *syscall.SysProcAttr) {
	a.Setpgid = true
	a.Pdeathsig = syscall.SIGKILL
}

// readProc reads /proc/PID/name.
func readProc(pid int, name string) ([]byte, error) {
	return os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, name))
}

// maxrssBytes: Linux reports ru_maxrss in kilobytes.
func maxrssBytes(maxrss int64) int64 { return maxrss << 10 }
