package childproc

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ClockTicks is USER_HZ, the unit of Stat's times: 100 on every Linux ABI
// (sysconf(_SC_CLK_TCK) is fixed by the kernel's ABI, not its HZ).
const ClockTicks = 100

// Stat is what the project reads of /proc/PID/stat (proc(5)).
type Stat struct {
	PID   int
	Comm  string // the command name, without its parentheses
	State byte   // 'R', 'S', 'D', 'T' (stopped), 't', 'Z', 'X' ...
	PPID  int
	// CPU time in clock ticks (ClockTicks a second): the process's own,
	// user and system, and that of its reaped children (wait(2) adds them).
	UTime, STime, CUTime, CSTime uint64
}

// CPU is the process's own CPU time, user and system.
func (s Stat) CPU() time.Duration {
	return time.Duration(s.UTime+s.STime) * time.Second / ClockTicks
}

// ParseStat parses the text of /proc/PID/stat. The command name is in
// parentheses and may itself hold spaces and parentheses ("1 (a) b) S 0
// ..."), so the fields after it are counted from the last ')'.
func ParseStat(data []byte) (Stat, error) {
	s := string(data)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return Stat{}, fmt.Errorf("childproc: unexpected /proc stat format %q", s)
	}
	var st Stat
	pid, err := strconv.Atoi(strings.TrimSpace(s[:open]))
	if err != nil {
		return Stat{}, fmt.Errorf("childproc: unexpected /proc stat pid in %q", s)
	}
	st.PID, st.Comm = pid, s[open+1:end]
	f := strings.Fields(s[end+1:]) // from field 3, the state
	if len(f) < 15 || len(f[0]) != 1 {
		return Stat{}, fmt.Errorf("childproc: unexpected /proc stat format %q", s)
	}
	st.State = f[0][0]
	if st.PPID, err = strconv.Atoi(f[1]); err != nil {
		return Stat{}, fmt.Errorf("childproc: unexpected /proc stat ppid in %q", s)
	}
	for i, p := range []*uint64{&st.UTime, &st.STime, &st.CUTime, &st.CSTime} {
		// cutime and cstime are signed in proc(5) (long); never negative
		// in practice.
		v, err := strconv.ParseInt(f[11+i], 10, 64)
		if err != nil || v < 0 {
			return Stat{}, fmt.Errorf("childproc: unexpected /proc stat times in %q", s)
		}
		*p = uint64(v)
	}
	return st, nil
}

// ReadStat reads and parses /proc/PID/stat. Where there is no /proc it
// fails with an error wrapping errors.ErrUnsupported.
func ReadStat(pid int) (Stat, error) {
	data, err := readProc(pid, "stat")
	if err != nil {
		return Stat{}, err
	}
	st, err := ParseStat(data)
	if err != nil {
		return Stat{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return st, nil
}

var errNoProc = fmt.Errorf("childproc: no /proc on this system: %w", errors.ErrUnsupported)
