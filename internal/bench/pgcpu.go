package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

// The database's share of a run's cost. A worker's CPU time says little on
// its own when the database does most of the work: the bench reads the
// PostgreSQL server's CPU time too, when the server runs on this machine,
// so that the table shows where the time goes.

// pgCPU is a reading of the server's CPU time; ok is false when it could not
// be read (a remote server, /proc not readable).
type pgCPU struct {
	seconds float64
	ok      bool
}

// postgresCPU reads the CPU time (user + system) the PostgreSQL server has
// used: the postmaster's own, that of its children that have exited (wait(2)
// adds it to the postmaster's cutime and cstime), and that of its live
// children (backends, walwriter, checkpointer, autovacuum workers). The
// postmaster is found as the parent of this pool's backend, and both must
// be processes named postgres: a remote server's backend pid that happens to
// be a local process's is not mistaken for it.
func (b *bench) postgresCPU(ctx context.Context) pgCPU {
	if b.postmaster == 0 {
		b.postmaster = findPostmaster(ctx, b.pool)
	}
	if b.postmaster < 0 {
		return pgCPU{}
	}
	st, err := readStat(b.postmaster)
	if err != nil || st.comm != "postgres" {
		return pgCPU{}
	}
	total := st.utime + st.stime + st.cutime + st.cstime
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return pgCPU{}
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		c, err := readStat(pid)
		if err != nil || c.ppid != b.postmaster {
			continue
		}
		total += c.utime + c.stime
	}
	return pgCPU{seconds: total / 100, ok: true} // USER_HZ
}

// findPostmaster returns the postmaster's pid, or -1 when the server is not
// a process of this machine.
func findPostmaster(ctx context.Context, pool *pgxpool.Pool) int {
	var backend int
	if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		return -1
	}
	st, err := readStat(backend)
	if err != nil || st.comm != "postgres" {
		return -1
	}
	parent, err := readStat(st.ppid)
	if err != nil || parent.comm != "postgres" {
		return -1
	}
	return st.ppid
}

type procStat struct {
	comm                         string
	ppid                         int
	utime, stime, cutime, cstime float64 // clock ticks
}

// readStat parses /proc/PID/stat (proc(5)): the command name is in
// parentheses and may hold spaces, so the fields are counted from the last
// ')'.
func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, err
	}
	s := string(b)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open || end+2 > len(s) {
		return procStat{}, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	f := strings.Fields(s[end+2:]) // from field 3, the state
	if len(f) < 15 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	st := procStat{comm: s[open+1 : end]}
	st.ppid, _ = strconv.Atoi(f[1])
	for i, p := range []*float64{&st.utime, &st.stime, &st.cutime, &st.cstime} {
		*p, _ = strconv.ParseFloat(f[11+i], 64)
	}
	return st, nil
}
