package bench

import "syscall"

// sysProcAttr puts a measured process in its own process group (the
// terminal's Ctrl-C goes to the bench, which stops it by PID) and asks
// the kernel to SIGKILL it if the bench dies first, even by SIGKILL.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
