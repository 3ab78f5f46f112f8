package chaos

// The formation-backed chaos run (-chaos.postgres formation): the run's
// PostgreSQL is a pg_auto_failover formation (internal/testinfra/pgha: a monitor, a
// primary and a synchronous standby, with pgha.TestTimeouts), every worker
// and the harness connect through its multi-host URL
// (target_session_attrs=read-write), and the deck's pg-restart becomes
// pg-failover: the primary killed outright (its keeper and every Postgres
// process, SIGKILL), the standby promoted, the killed node started again
// and back as a synchronous standby before the next fault, so that every
// failover is to a standby that has every acknowledged commit. The checks
// stay the same (0 violations, every job exactly once); on top, a
// synchronous failover must not make any worker hold a partition as
// diverged (the database behind the offsets mirrored to Kafka).

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tenure-dev/tenure/internal/childproc"
	"github.com/tenure-dev/tenure/internal/testinfra/pgha"
	"github.com/tenure-dev/tenure/sink"
)

// The run's PostgreSQL (-chaos.postgres).
const (
	postgresSingle    = "single"
	postgresFormation = "formation"
)

// failoverSpacing is the least time from the end of a pg-failover (the
// formation healthy again, its standby synchronous) to the next kill of a
// primary: a failover and the killed node's rejoin take tens of seconds,
// and the standby must have been streaming for a while.
const failoverSpacing = 20 * time.Second

// haRun is the formation and what each pg-failover did.
type haRun struct {
	f *pgha.Formation

	mu          sync.Mutex
	failovers   []*failover
	lastHealthy time.Time
	diverged    []string // worker log lines holding a partition as diverged
	claimsAfter int      // claims logged after the first kill: each compares the database with Kafka's mirror
}

// failover is one pg-failover, step by step.
type failover struct {
	fault       *fault
	from, to    string // the node killed, the node promoted
	postmaster  int    // the killed primary's postmaster PID
	killed      time.Time
	writable    time.Time // the multi-host URL took a write again
	restarted   time.Time // the killed node's keeper started again
	healthy     time.Time // primary and secondary, synchronous_standby_names set
	firstCommit time.Time // the first commit in the fence log after the kill
	syncAfter   string    // sink.ReplicationOf on the new primary once healthy
}

// deck is the run's deck. With a formation it deals pg-failover twice where
// the deck deals pg-restart (pg_ctl stop and start of the one server): in a
// formation each node's keeper owns its Postgres and restarts it by itself,
// and the crash pg-restart stands for is the primary's kill, which here also
// takes the keeper and so fails over. Twice, to count more of them.
//
// -chaos.kinds deals only the kinds it lists, as often as the full deck
// does.
func (w *world) deck() []string {
	var out []string
	for _, k := range deck {
		if k == kindPGRestart && w.ha != nil {
			k = kindPGFailover
			out = append(out, k) // twice (below)
		}
		out = append(out, k)
	}
	if len(w.cfg.kinds) > 0 {
		out = slices.DeleteFunc(out, func(k string) bool { return !slices.Contains(w.cfg.kinds, k) })
	}
	return out
}

// dbURL is the URL of the run's PostgreSQL: the throwaway server's, or the
// formation's multi-host URL.
func (w *world) dbURL() string {
	if w.ha != nil {
		return w.ha.f.URL()
	}
	return w.pg.URL()
}

// startFormation starts the formation; pgha removes it when the test ends.
// The run fails, rather than skips, without pg_auto_failover: it was asked
// for.
func (w *world) startFormation() {
	t := w.t
	if err := pgha.Available(); err != nil {
		t.Fatalf("-chaos.postgres formation: %v", err)
	}
	to := pgha.TestTimeouts()
	start := time.Now()
	f := pgha.Start(t, pgha.Config{Timeouts: &to, StartTimeout: 4 * time.Minute})
	w.ha = &haRun{f: f, lastHealthy: time.Now()}
	t.Logf("pg_auto_failover formation up in %s; the run connects with %s", time.Since(start).Round(time.Millisecond), f.URL())
}

// await runs fn while supervising the processes, as sleep does.
func (w *world) await(fn func() error) error {
	done := make(chan error, 1)
	go func() { done <- fn() }()
	for {
		select {
		case err := <-done:
			return err
		case <-time.After(100 * time.Millisecond):
			w.supervise()
		}
	}
}

// failoverPostgres kills the formation's primary (its keeper, postmaster and
// every backend, SIGKILL), waits until the multi-host URL takes a write on
// the other node, starts the killed node again and waits until it is back as
// a synchronous standby. The workers are left alone: they must find the
// new primary themselves.
func (w *world) failoverPostgres() {
	t, ha := w.t, w.ha
	ha.mu.Lock()
	wait := time.Until(ha.lastHealthy.Add(failoverSpacing))
	ha.mu.Unlock()
	if wait > 0 {
		w.sleep(wait)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	old, err := ha.f.Primary(ctx)
	if err != nil {
		t.Fatalf("pg-failover: %v", err)
	}
	fo := &failover{from: old.Name, postmaster: postmasterPID(old.Dir)}
	f := w.begin(kindPGFailover, "", old.Name)
	fo.fault = f
	if fo.killed, err = ha.f.KillNode(old); err != nil {
		t.Fatalf("pg-failover: killing primary %s: %v", old.Name, err)
	}
	w.mark(f)
	// KillNode waited for every process it signalled; check the postmaster
	// ourselves.
	if fo.postmaster <= 0 {
		t.Fatalf("pg-failover: %s's postmaster PID could not be read before the kill", old.Name)
	}
	if alive(fo.postmaster) {
		t.Fatalf("pg-failover: %s's postmaster (pid %d) is still alive after the kill", old.Name, fo.postmaster)
	}
	var promoted *pgha.Node
	if err := w.await(func() (err error) {
		promoted, err = ha.f.WaitWritable(ctx, 2*time.Minute)
		return err
	}); err != nil {
		t.Fatalf("pg-failover: after killing %s: %v", old.Name, err)
	}
	fo.writable = time.Now()
	if promoted == old {
		t.Fatalf("pg-failover: the killed node %s took a write", old.Name)
	}
	fo.to = promoted.Name
	w.mu.Lock()
	f.Target = old.Name + "->" + promoted.Name
	w.mu.Unlock()

	if err := ha.f.Restart(old); err != nil {
		t.Fatalf("pg-failover: starting %s again: %v", old.Name, err)
	}
	fo.restarted = time.Now()
	if err := w.await(func() error { return w.waitSynchronous(ctx, promoted) }); err != nil {
		t.Fatalf("pg-failover: %s did not come back as a synchronous standby of %s: %v\n%s", old.Name, promoted.Name, err, w.formationState())
	}
	fo.healthy = time.Now()
	rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
	if r, err := sink.ReplicationOf(rctx, w.pool); err == nil {
		fo.syncAfter = r.Describe()
		if !r.Synchronous() {
			w.note("pg-failover %s->%s: the new primary is not synchronous once healthy: %s", old.Name, promoted.Name, r.Describe())
		}
	}
	rcancel()
	ha.mu.Lock()
	ha.failovers = append(ha.failovers, fo)
	ha.lastHealthy = fo.healthy
	ha.mu.Unlock()
	w.end(f)
	t.Logf("pg-failover: killed primary %s (postmaster %d gone); %s writable %s after the kill; %s restarted, synchronous standby again %s after the kill",
		old.Name, fo.postmaster, promoted.Name, fo.writable.Sub(fo.killed).Round(time.Millisecond), old.Name,
		fo.healthy.Sub(fo.killed).Round(time.Millisecond))
}

// waitSynchronous waits until the monitor sees primary and a secondary and
// primary runs with a synchronous_standby_names, so that the next failover
// loses nothing acknowledged either.
func (w *world) waitSynchronous(ctx context.Context, primary *pgha.Node) error {
	f := w.ha.f
	if err := f.WaitHealthy(ctx); err != nil {
		return err
	}
	for {
		p, err := f.Primary(ctx)
		if err == nil && p != primary {
			return fmt.Errorf("the primary is %s, not %s", p.Name, primary.Name)
		}
		names, err := f.SyncStandbyNames(ctx)
		if err == nil && strings.TrimSpace(names) != "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("synchronous_standby_names still empty: %w", ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (w *world) formationState() string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := w.ha.f.State(ctx)
	if err != nil {
		return err.Error()
	}
	return s
}

// postmasterPID reads the first line of dir/postmaster.pid (0 if it cannot).
func postmasterPID(dir string) int {
	data, err := os.ReadFile(filepath.Join(dir, "postmaster.pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(data), "\n", 2)[0]))
	return pid
}

// alive says whether pid is a live process (not gone, not a zombie).
func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	st, err := childproc.ReadStat(pid)
	if err != nil {
		return false
	}
	return st.State != 'Z' && st.State != 'X'
}

// checkFailovers runs after the drain, before the checks: it finds each
// failover's first commit on the new primary in the fence log, and every
// partition a worker held as diverged (a finding: a synchronous standby has
// every acknowledged commit, so the database cannot be behind Kafka's mirror).
func (w *world) checkFailovers() {
	if w.ha == nil {
		return
	}
	ha := w.ha
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ha.mu.Lock()
	fos := append([]*failover(nil), ha.failovers...)
	ha.mu.Unlock()
	for _, fo := range fos {
		var first *time.Time
		err := w.pool.QueryRow(ctx, `SELECT min(at) FROM `+schemaName+`.fence_log WHERE consumer_group = $1 AND kind = 'commit' AND at > $2`,
			groupName, fo.killed).Scan(&first)
		if err != nil {
			w.t.Errorf("reading the first commit after the kill of %s: %v", fo.from, err)
			continue
		}
		if first != nil {
			ha.mu.Lock()
			fo.firstCommit = *first
			ha.mu.Unlock()
		}
	}
	var diverged []string
	var claimsAfter int
	var firstKill time.Time
	if len(fos) > 0 {
		firstKill = fos[0].killed
	}
	logs, _ := filepath.Glob(filepath.Join(w.logDir, "w*.log"))
	for _, l := range logs {
		fh, err := os.Open(l)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		sc.Buffer(make([]byte, 0, 1<<16), 1<<22)
		for sc.Scan() {
			line := sc.Text()
			if strings.Contains(line, `"hold":"diverged"`) {
				diverged = append(diverged, filepath.Base(l)+": "+line)
			}
			if !firstKill.IsZero() && strings.Contains(line, `"msg":"`+msgClaimed+`"`) {
				var m struct{ TS string }
				if json.Unmarshal([]byte(line), &m) == nil {
					if at, err := time.Parse("2006-01-02T15:04:05.000Z0700", m.TS); err == nil && at.After(firstKill) {
						claimsAfter++
					}
				}
			}
		}
		fh.Close()
	}
	var held int
	if err := w.pool.QueryRow(ctx, `SELECT count(*) FROM `+schemaName+`.partition_holds WHERE consumer_group = $1 AND kind = 'diverged'`, groupName).Scan(&held); err != nil {
		w.t.Errorf("reading the partition holds: %v", err)
	}
	ha.mu.Lock()
	ha.diverged = diverged
	ha.claimsAfter = claimsAfter
	ha.mu.Unlock()
	if len(diverged) > 0 || held > 0 {
		w.note("divergence detection fired on a synchronous failover: %d worker log lines hold a partition as diverged, %d diverged holds recorded; first: %s",
			len(diverged), held, strings.Join(diverged[:min(3, len(diverged))], "\n    "))
	}
}

// failoverSummary is the summary's lines about the formation: each
// failover's nodes and times, from the kill.
func (w *world) failoverSummary() string {
	if w.ha == nil {
		return ""
	}
	ha := w.ha
	ha.mu.Lock()
	defer ha.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "postgres:    pg_auto_failover formation (monitor, primary, synchronous standby; pgha.TestTimeouts), multi-host URL (replay with -chaos.postgres formation)\n")
	fmt.Fprintf(&b, "  %d pg-failovers completed; %d claims after the first one, each checking the database against the offsets mirrored to Kafka: %d held as diverged\n",
		len(ha.failovers), ha.claimsAfter, len(ha.diverged))
	if len(ha.failovers) == 0 {
		return b.String()
	}
	fmt.Fprintf(&b, "  %-10s %-15s %10s %13s %13s %13s\n", "at", "killed->promoted", "writable", "first commit", "recovered", "sync standby")
	var writable, commit []time.Duration
	for _, fo := range ha.failovers {
		since := func(at time.Time) string {
			if at.IsZero() {
				return "-"
			}
			return at.Sub(fo.killed).Round(10 * time.Millisecond).String()
		}
		w.mu.Lock()
		rec := fo.fault.Recovered
		w.mu.Unlock()
		fmt.Fprintf(&b, "  +%-9s %-15s %10s %13s %13s %13s\n", fo.killed.Sub(w.start).Round(time.Second), fo.from+"->"+fo.to,
			since(fo.writable), since(fo.firstCommit), since(rec), since(fo.healthy))
		writable = append(writable, fo.writable.Sub(fo.killed))
		if !fo.firstCommit.IsZero() {
			commit = append(commit, fo.firstCommit.Sub(fo.killed))
		}
	}
	fmt.Fprintf(&b, "  kill to writable p50/max %s; kill to first commit on the new primary p50/max %s (fence log)\n", p50max(writable), p50max(commit))
	return b.String()
}
