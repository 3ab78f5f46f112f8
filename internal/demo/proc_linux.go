package demo

import "syscall"

// sysProcAttr puts a demo worker in its own process group (the
// terminal's Ctrl-C goes to the demo, which kills its workers by PID) and
// asks the kernel to SIGKILL it if the demo dies first, even by SIGKILL.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
