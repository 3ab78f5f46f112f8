package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tenure-dev/tenure/internal/devbroker"
	"github.com/tenure-dev/tenure/internal/testinfra/pgha"
	"github.com/tenure-dev/tenure/internal/testinfra/testdb"
)

// Failover tests: tenure on a real highly available Postgres, a
// pg_auto_failover formation (internal/testinfra/pgha: a monitor, a primary and a
// standby on loopback), its primary killed outright while ledger workers
// commit, the workers connected through the formation's multi-host URL
// (target_session_attrs=read-write).
//
// The promise under test is the guarantee's precondition: a commit a worker
// saw acknowledged is in the database. A synchronous standby keeps it
// across a failover (TestFailoverSynchronous); an asynchronous one that lags
// loses it, and the workers must notice instead of processing again as if
// nothing had happened (TestFailoverAsynchronousLosesAcknowledgedCommits).

// failoverPartitions is the topic's partition count in the failover tests.
const failoverPartitions = 4

// newFailoverEnv is newEnv on a pg_auto_failover formation: every
// connection, the test's own included, goes through the formation's
// multi-host URL, and the schema is created by `tenure migrate` through it.
func newFailoverEnv(t *testing.T, f *pgha.Formation) *env {
	t.Helper()
	br := startBroker(t, devbroker.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool := testPool(t, ctx, f.URL()) // registered after the formation's cleanup: closed before it
	schema := testdb.NewSchemaName("tenure_ha")
	if r := runCLI(t, 60*time.Second, "", "migrate", "--database-url", f.URL(), "--schema", schema, "up"); r.code != 0 {
		t.Fatalf("tenure migrate through the multi-host URL: %s", r)
	}
	e := &env{t: t, brokers: br.ListenAddrs(), pool: pool, schema: schema, dbURL: f.URL(), cluster: br}
	e.createTopic(failoverPartitions)
	return e
}

// ackedCommit is a commit a worker saw acknowledged: its `batch committed`
// line (logged once COMMIT returned, or once a COMMIT of unknown outcome was
// resolved as committed).
type ackedCommit struct {
	worker    string
	topic     string
	partition int32
	from, to  int64
	claimID   int64
	token     string
	at        time.Time // when the worker logged it (millisecond precision)
}

func (c ackedCommit) String() string {
	return fmt.Sprintf("%s/%d [%d,%d) claim %d token %s by %s at %s", c.topic, c.partition, c.from, c.to, c.claimID, c.token,
		c.worker, c.at.Format("15:04:05.000"))
}

// ackedCommits reads every `batch committed` line the workers logged.
func ackedCommits(t *testing.T, ws []*worker) []ackedCommit {
	t.Helper()
	var out []ackedCommit
	for _, w := range ws {
		for _, m := range w.logs() {
			if m["msg"] != "batch committed" {
				continue
			}
			c := ackedCommit{worker: w.name}
			c.topic, _ = m["topic"].(string)
			p, ok1 := m["partition"].(float64)
			from, ok2 := m["from"].(float64)
			to, ok3 := m["to"].(float64)
			id, ok4 := m["claim_id"].(float64)
			c.token, _ = m["token"].(string)
			ts, _ := m["ts"].(string)
			at, err := time.Parse("2006-01-02T15:04:05.000Z0700", ts)
			if c.topic == "" || !ok1 || !ok2 || !ok3 || !ok4 || err != nil {
				t.Fatalf("%s: a batch committed line without its fields: %v", w.name, m)
			}
			c.partition, c.from, c.to, c.claimID, c.at = int32(p), int64(from), int64(to), int64(id), at
			out = append(out, c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].at.Before(out[j].at) })
	return out
}

// fenceCommit is one commit entry of the fence log, with the time its
// statement ran.
type fenceCommit struct {
	topic     string
	partition int32
	from, to  int64
	claimID   int64
	token     string // incarnation.epoch, as the workers log it
	at        time.Time
}

func loadFenceCommits(t *testing.T, e *env) []fenceCommit {
	t.Helper()
	return queryRows(t, e, func(row pgx.CollectableRow) (c fenceCommit, err error) {
		err = row.Scan(&c.topic, &c.partition, &c.from, &c.to, &c.claimID, &c.token, &c.at)
		return c, err
	}, `SELECT topic, partition, from_offset, to_offset, claim_id, incarnation || '.' || epoch, at FROM "`+e.schema+`".fence_log
		WHERE consumer_group = $1 AND kind = 'commit' ORDER BY id`, e.group)
}

// missingCommits is the acknowledged commits the database does not have: no
// fence log commit of the same claimant, token and range whose statement ran before
// the worker logged the acknowledgement. (A commit made again after a loss,
// same range and claimant, ran later: it is not the one acknowledged.)
func missingCommits(acked []ackedCommit, log []fenceCommit) []ackedCommit {
	type key struct {
		topic     string
		partition int32
		from, to  int64
		claimID   int64
		token     string
	}
	ran := map[key][]time.Time{}
	for _, c := range log {
		k := key{c.topic, c.partition, c.from, c.to, c.claimID, c.token}
		ran[k] = append(ran[k], c.at)
	}
	var out []ackedCommit
	for _, a := range acked {
		found := false
		for _, at := range ran[key{a.topic, a.partition, a.from, a.to, a.claimID, a.token}] {
			// The log line's time is truncated to the millisecond.
			if !at.After(a.at.Add(time.Millisecond)) {
				found = true
				break
			}
		}
		if !found {
			out = append(out, a)
		}
	}
	return out
}

// failoverRun is what happened in one failover scenario.
type failoverRun struct {
	e          *env
	f          *pgha.Formation
	ws         []*worker
	prod       *roundProducer
	killed     *pgha.Node
	promoted   *pgha.Node
	killAt     time.Time
	writableAt time.Time
	acked      []ackedCommit // acknowledged before the kill
	frozenFor  time.Duration // how long replication was frozen before the kill (async)
}

// runFailover starts two ledger workers on the formation, gives them a
// backlog and a steady 200 jobs/s, lets them commit, optionally freezes
// replication for a while (the standby falls behind; only sound with an
// asynchronous standby), kills the primary in the middle of their batches
// and waits until the formation takes writes again. With a synchronous
// standby, one worker runs with --require-sync-standby (and so would not
// start without one); with an asynchronous one, both must warn at start.
func runFailover(t *testing.T, f *pgha.Formation, sync bool, freeze time.Duration) *failoverRun {
	t.Helper()
	e := newFailoverEnv(t, f)
	common := []string{"--handler", "ledger", "--max-attempts", "1", "--fence-log-max-age", "-1s", "--fence-log-max-entries", "-1"}
	if sync {
		common = append(common, "--require-sync-standby")
	}
	// One worker commits every job on its own (the most commits in flight
	// when the primary dies), the other in batches.
	w1 := e.startWorker("H1", append([]string{"--batch-max", "1"}, common...)...)
	w2 := e.startWorker("H2", append([]string{"--batch-max", "20"}, common...)...)
	r := &failoverRun{e: e, f: f, ws: []*worker{w1, w2}}
	for _, w := range r.ws {
		w.waitLog(30*time.Second, map[string]any{"msg": "worker starting"})
		warning := w.findLogPrefix("no synchronous standby:")
		switch {
		case sync && warning != nil:
			t.Errorf("%s warned that the formation has no synchronous standby: %v", w.name, warning)
		case !sync && warning == nil:
			t.Errorf("%s did not warn, at start, that the formation's standby is asynchronous", w.name)
		}
	}
	waitForMembers(t, e, 2)
	// A backlog keeps every lane busy: the kill lands in the middle of
	// transactions, some of them in their COMMIT.
	for i := range 8 {
		e.produce(jobsFor(keys, i*500, 500)...)
	}
	r.prod = e.produceInRounds(600, 20, 100*time.Millisecond) // 200 jobs/s, for at most ~60s
	e.waitForMoreCommits(1000, 60*time.Second, r.ws...)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if freeze > 0 {
		z, err := f.FreezeReplication(ctx)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		e.waitForMoreCommits(300, 30*time.Second, r.ws...)
		if d := freeze - time.Since(start); d > 0 {
			time.Sleep(d)
		}
		r.frozenFor = time.Since(start)
		_ = z // killing the primary ends the stopped WAL sender
	}
	var err error
	r.killed, r.killAt, err = f.KillPrimary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range ackedCommits(t, r.ws) {
		if c.at.Before(r.killAt) {
			r.acked = append(r.acked, c)
		}
	}
	t.Logf("killed the primary %s (pg_autoctl and Postgres) after %d acknowledged commits", r.killed.Name, len(r.acked))
	if r.promoted, err = f.WaitWritable(ctx, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	r.writableAt = time.Now()
	t.Logf("the formation took a write on %s %s after the kill", r.promoted.Name, r.writableAt.Sub(r.killAt).Round(time.Millisecond))
	if r.promoted == r.killed {
		t.Fatalf("the killed node %s took the write", r.killed.Name)
	}
	requireWorkersRunning(t, r.ws...)
	return r
}

// findLogPrefix is the first line w logged whose message starts with
// prefix.
func (w *worker) findLogPrefix(prefix string) map[string]any {
	for _, m := range w.logs() {
		if msg, _ := m["msg"].(string); strings.HasPrefix(msg, prefix) {
			return m
		}
	}
	return nil
}

// firstOnNewPrimary is the first fence log entry (claim or commit) whose
// statement ran after the kill: by then only the new primary was alive.
func (r *failoverRun) firstOnNewPrimary(t *testing.T, kind string) (time.Time, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var at time.Time
	err := r.e.pool.QueryRow(ctx, `SELECT min(at) FROM "`+r.e.schema+`".fence_log WHERE consumer_group = $1 AND at > $2 AND kind = ANY($3)`,
		r.e.group, r.killAt, strings.Split(kind, ",")).Scan(&at)
	return at, err == nil && !at.IsZero()
}

// unknownOutcomes counts the workers' resolved commits of unknown outcome,
// by outcome, and the batches retried after a database failure.
func (r *failoverRun) unknownOutcomes() (map[string]int, int) {
	resolved := map[string]int{}
	retried := 0
	for _, w := range r.ws {
		for _, m := range w.logs() {
			switch m["msg"] {
			case "commit outcome was unknown; resolved from the fencing row":
				resolved[fmt.Sprint(m["outcome"])]++
			case "batch failed on the database, retrying":
				retried++
			}
		}
	}
	return resolved, retried
}

// With a synchronous standby (pg_auto_failover's default: the standby in
// the replication quorum, synchronous_standby_names 'ANY 1 (...)',
// synchronous_commit on) the primary is killed in the middle of the
// workers' batches. The workers reconnect by themselves to the promoted
// standby through the multi-host URL; every commit a worker saw
// acknowledged, before the kill or resolved after it, is in the promoted
// standby's fence log; every job is committed exactly once, nothing is
// dead-lettered (the workers run with --max-attempts 1), and the history
// checker finds nothing wrong.
//
// The mechanism is the synchronous standby: with it switched off
// (TestFailoverAsynchronousLosesAcknowledgedCommits: an asynchronous
// standby, its replication frozen) the same scenario loses acknowledged
// commits, and the check that passes here fails there.
func TestFailoverSynchronous(t *testing.T) {
	f := pgha.Start(t, pgha.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if names, err := f.SyncStandbyNames(ctx); err != nil || names == "" {
		t.Fatalf("the primary's synchronous_standby_names is %q (%v): the standby is not synchronous", names, err)
	}
	r := runFailover(t, f, true, 0)
	e := r.e

	// The workers commit again, on the new primary, by themselves.
	e.waitForMoreCommits(400, 60*time.Second, r.ws...)
	first, ok := r.firstOnNewPrimary(t, "claim,commit")
	firstCommit, okCommit := r.firstOnNewPrimary(t, "commit")
	if !ok || !okCommit {
		t.Fatalf("no claim or commit on the new primary after the kill")
	}
	t.Logf("timings from the kill: formation writable %s, first claim or commit on the new primary %s, first commit %s",
		r.writableAt.Sub(r.killAt).Round(time.Millisecond), first.Sub(r.killAt).Round(time.Millisecond),
		firstCommit.Sub(r.killAt).Round(time.Millisecond))

	rounds := r.prod.stop()
	end := e.highWatermarks()
	e.waitEveryPartitionCommitted(end, 90*time.Second, r.ws...) // no lane stuck, the unknown commits' included
	requireWorkersRunning(t, r.ws...)

	// Every acknowledged commit survived: those before the kill, and those
	// after it (on the new primary, or resolved there).
	log := loadFenceCommits(t, e)
	all := ackedCommits(t, r.ws)
	for _, c := range missingCommits(all, log) {
		t.Errorf("acknowledged commit lost in the failover: %s", c)
	}
	lostBefore := missingCommits(r.acked, log)
	h, violations := verifyRun(t, e, expect{ends: end, ledger: true})
	for _, v := range violations {
		t.Errorf("violation: %s", v)
	}
	var total int64
	for _, hwm := range end {
		total += hwm
	}
	if got := int64(len(h.Writes)); got != total {
		t.Errorf("%d jobs produced, %d ledger rows", total, got)
	}
	if len(h.DeadLetters) != 0 {
		t.Errorf("%d jobs dead-lettered, want none: a failover is not a job's fault; first: %+v", len(h.DeadLetters), h.DeadLetters[0])
	}
	resolved, retried := r.unknownOutcomes()
	t.Logf("%d rounds, %d jobs; acknowledged commits: %d before the kill (%d missing afterwards), %d in all (%d in the fence log); "+
		"%d batches retried after a database failure; commits of unknown outcome resolved: %v; history checker: %d violations",
		rounds, total, len(r.acked), len(lostBefore), len(all), len(log), retried, resolved, len(violations))
	if retried == 0 && len(resolved) == 0 {
		t.Errorf("the kill hit no batch in flight: no database failure was retried and no commit was of unknown outcome")
	}

	// An admin command through the multi-host URL, after the failover.
	if r := runCLI(t, 30*time.Second, "", "admin", "fences", "--database-url", f.URL(), "--schema", e.schema, "--group", e.group); r.code != 0 ||
		!strings.Contains(r.stdout, e.topic) {
		t.Errorf("tenure admin fences through the multi-host URL after the failover: %s", r)
	}
	for _, w := range r.ws {
		w.stop(30 * time.Second)
	}
}

// With an asynchronous standby that lags (its primary's WAL sender stopped
// while the workers go on committing, then the primary killed), the
// promoted standby lacks commits the workers saw acknowledged: this is the
// synchronous test's mechanism switched off, and its check ("every
// acknowledged commit is there") fails, as the first subtest shows.
//
// The database is then behind what the workers acknowledged. Processing on
// from the stored offsets would run those jobs again, silently (work
// outside Postgres redone, exports moving back). The second subtest
// requires that the workers notice: each partition whose acknowledged
// commits are gone is held as `diverged` (an ERROR with "hold":"diverged"),
// `tenure admin assignments` shows it so, and no commit on the new primary
// covers the lost ranges.
// commitsOverLost describes the commits made after killAt that cover a
// lost range (per partition).
func commitsOverLost(t *testing.T, e *env, killAt time.Time, lost map[int32][][2]int64) []string {
	t.Helper()
	var again []string
	for _, c := range loadFenceCommits(t, e) {
		if !c.at.After(killAt) || c.topic != e.topic {
			continue
		}
		for _, lr := range lost[c.partition] {
			if c.from < lr[1] && lr[0] < c.to {
				again = append(again, fmt.Sprintf("%d [%d,%d) over lost [%d,%d)", c.partition, c.from, c.to, lr[0], lr[1]))
				break
			}
		}
	}
	return again
}

func TestFailoverAsynchronousLosesAcknowledgedCommits(t *testing.T) {
	f := pgha.Start(t, pgha.Config{Async: true})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if names, err := f.SyncStandbyNames(ctx); err != nil || names != "" {
		t.Fatalf("the primary's synchronous_standby_names is %q (%v): the standby is not asynchronous", names, err)
	}
	r := runFailover(t, f, false, 3*time.Second)
	e := r.e

	// What the promoted standby has, right after the failover.
	lost := missingCommits(r.acked, loadFenceCommits(t, e))
	lostJobs := map[int32]int64{}
	lostRanges := map[int32][][2]int64{}
	for _, c := range lost {
		lostJobs[c.partition] += c.to - c.from
		lostRanges[c.partition] = append(lostRanges[c.partition], [2]int64{c.from, c.to})
	}
	var lostTotal int64
	for _, n := range lostJobs {
		lostTotal += n
	}
	t.Logf("replication frozen for %s before the kill; %d commits acknowledged before the kill, %d of them (%d jobs) missing on the promoted standby, per partition %v",
		r.frozenFor.Round(time.Millisecond), len(r.acked), len(lost), lostTotal, lostJobs)

	t.Run("acknowledged commits are lost", func(t *testing.T) {
		// The synchronous test's check, expected to fail here.
		if len(lost) == 0 {
			t.Fatalf("no acknowledged commit was lost with an asynchronous standby frozen for %s: the scenario did not switch the mechanism off", r.frozenFor)
		}
		for i, c := range lost {
			if i == 5 {
				t.Logf("... and %d more", len(lost)-5)
				break
			}
			t.Logf("lost: %s", c)
		}
	})

	t.Run("workers hold the diverged partitions", func(t *testing.T) {
		if len(lost) == 0 {
			t.Skip("nothing was lost")
		}
		// Give the workers time to reconnect and look.
		deadline := time.Now().Add(30 * time.Second)
		held := map[int32]bool{}
		for time.Now().Before(deadline) && len(held) < len(lostJobs) {
			for _, w := range r.ws {
				for p := range lostJobs {
					if w.findLog(map[string]any{"hold": "diverged", "topic": e.topic, "partition": p}) != nil {
						held[p] = true
					}
				}
			}
			time.Sleep(200 * time.Millisecond)
		}
		for p := range lostJobs {
			if !held[p] {
				t.Errorf("partition %d lost %d acknowledged jobs in the failover, and no worker logged a hold of kind diverged for it", p, lostJobs[p])
			}
		}
		// Nothing processed again in silence: no commit on the new primary
		// covers a lost range.
		if again := commitsOverLost(t, e, r.killAt, lostRanges); len(again) > 0 {
			t.Errorf("%d commits on the new primary processed lost acknowledged jobs again, silently; first: %s", len(again), again[0])
		}
		// tenure admin assignments shows the hold.
		res := runCLI(t, 30*time.Second, "", "admin", "assignments", "--brokers", strings.Join(e.brokers, ","), "--group", e.group,
			"--database-url", f.URL(), "--schema", e.schema, "--output", "json")
		var rows []struct {
			Partition int32  `json:"partition"`
			State     string `json:"state"`
		}
		if res.code != 0 || json.Unmarshal([]byte(res.stdout), &rows) != nil {
			t.Fatalf("tenure admin assignments through the multi-host URL: %s", res)
		}
		for _, row := range rows {
			if _, ok := lostJobs[row.Partition]; ok && row.State != "diverged" {
				t.Errorf("tenure admin assignments shows partition %d as %q, want diverged", row.Partition, row.State)
			}
		}
	})

	r.prod.stop()
	end := e.highWatermarks()
	_, violations := verifyRun(t, e, expect{ends: end, ledger: true})
	t.Logf("history checker on the promoted standby: %d violations (it cannot see the loss: the database is consistent with itself)", len(violations))
	for _, w := range r.ws {
		w.stop(30 * time.Second)
	}
}
