//go:build !linux

package bench

import "syscall"

// sysProcAttr puts a measured process in its own process group, so that
// the terminal's Ctrl-C goes to the bench, which stops it by PID.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
