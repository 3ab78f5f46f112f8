//go:build !linux

package demo

import "syscall"

// sysProcAttr puts a demo worker in its own process group, so that the
// terminal's Ctrl-C goes to the demo, which kills its workers by PID.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
