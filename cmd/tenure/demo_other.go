//go:build !linux

package main

import "syscall"

// demoSysProcAttr puts a demo worker in its own process group, so that the
// terminal's Ctrl-C goes to the demo, which kills its workers by PID.
func demoSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
