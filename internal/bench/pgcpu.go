package bench

import (
	"context"
	"os"
	"strconv"

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
