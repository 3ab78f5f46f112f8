package childproc

import (
	"errors"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Usage is what a process has used.
type Usage struct {
	CPU     time.Duration // user + system
	PeakRSS int64         // bytes: the most resident memory it had at once
}

// Usage reads the child's CPU time and peak resident memory: from /proc
// while it runs (utime + stime, VmHWM), from wait(2)'s rusage once it has
// exited.
func (p *Proc) Usage() (Usage, error) {
	if p.Exited() {
		return rusage(p.cmd.ProcessState.SysUsage())
	}
	var u Usage
	st, err := ReadStat(p.pid)
	if err == nil {
		u.CPU = st.CPU()
	}
	if status, serr := readProc(p.pid, "status"); serr == nil {
		for _, line := range strings.Split(string(status), "\n") {
			if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				u.PeakRSS = kb << 10
			}
		}
	}
	if u.PeakRSS == 0 {
		// It exited between the check and the reads (a zombie's status has
		// no VmHWM), or there is no /proc: wait(2)'s figures once it is
		// reaped, if that is soon.
		select {
		case <-p.done:
			return rusage(p.cmd.ProcessState.SysUsage())
		case <-time.After(5 * time.Second):
		}
		if err != nil {
			return u, err
		}
	}
	return u, nil
}

// rusage converts wait(2)'s rusage.
func rusage(sys any) (Usage, error) {
	ru, ok := sys.(*syscall.Rusage)
	if !ok {
		return Usage{}, errors.New("childproc: no rusage for the process")
	}
	return Usage{CPU: time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), PeakRSS: maxrssBytes(ru.Maxrss)}, nil
}
