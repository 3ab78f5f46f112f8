package bench

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenure-dev/tenure/internal/childproc"
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
	st, err := childproc.ReadStat(b.postmaster)
	if err != nil || st.Comm != "postgres" {
		return pgCPU{}
	}
	total := st.UTime + st.STime + st.CUTime + st.CSTime
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return pgCPU{}
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		c, err := childproc.ReadStat(pid)
		if err != nil || c.PPID != b.postmaster {
			continue
		}
		total += c.UTime + c.STime
	}
	return pgCPU{seconds: float64(total) / childproc.ClockTicks, ok: true}
}

// findPostmaster returns the postmaster's pid, or -1 when the server is not
// a process of this machine.
func findPostmaster(ctx context.Context, pool *pgxpool.Pool) int {
	var backend int
	if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		return -1
	}
	st, err := childproc.ReadStat(backend)
	if err != nil || st.Comm != "postgres" {
		return -1
	}
	parent, err := childproc.ReadStat(st.PPID)
	if err != nil || parent.Comm != "postgres" {
		return -1
	}
	return st.PPID
}

// cpuReading is what the latency runs read beside the worker's and the
// server's CPU: the bench's own (the producer, and the broker when it runs
// in this process) and the whole machine's busy time, so that the report
// can say how much of the machine a rate takes. ok is false where there is
// no /proc.
type cpuReading struct {
	at            time.Time
	self, machine float64 // CPU seconds: this process's own, all cores' busy time
	cores         int
	ok            bool
}

func readCPU() cpuReading {
	r := cpuReading{at: time.Now(), cores: runtime.NumCPU()}
	st, err := childproc.ReadStat(os.Getpid())
	if err != nil {
		return r
	}
	r.self = st.CPU().Seconds() // its own: the workers, its reaped children, are counted apart
	busy, err := machineBusy()
	if err != nil {
		return r
	}
	r.machine, r.ok = busy, true
	return r
}

// machineBusy reads the first line of /proc/stat (proc(5)): every core's
// time in user, nice, system, irq, softirq and steal, in seconds. Idle and
// iowait are not busy.
func machineBusy() (float64, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return parseBusy(line)
}

// parseBusy reads the busy seconds of /proc/stat's "cpu" line.
func parseBusy(line string) (float64, error) {
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	var busy uint64
	for _, i := range []int{1, 2, 3, 6, 7, 8} { // user nice system (idle iowait) irq softirq steal
		v, err := strconv.ParseUint(f[i], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/stat: unexpected first line %q", line)
		}
		busy += v
	}
	return float64(busy) / childproc.ClockTicks, nil
}
