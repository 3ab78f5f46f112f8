package integration

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/internal/testinfra/netfault"
)

// A network that fails without a reset. Each test runs one worker inside a
// network namespace of its own (internal/testinfra/netfault: the worker reaches the
// broker and the database through forwarders inside the namespace, on the
// usual addresses) and drops its packets with nftables: a vanished host or
// a firewall, not a killed process whose kernel resets every connection.

// handoffLimit is how soon, after a worker is cut off from Postgres, another
// member must be committing the partitions it held: with the default
// database timeout and a 6s session timeout, 30s.
const handoffLimit = 30 * time.Second

// A worker cut off from Postgres (both directions, or only the answers)
// keeps heartbeating to Kafka. Before the database watch the coordinator
// left its partitions with it for as long as the cut lasted (90s seen, next
// offsets frozen, a healthy worker idle beside it). Now it gives them up
// after its database timeout, the other worker commits them within
// handoffLimit of the cut, and once the network heals the cut-off worker
// joins again; every job is committed exactly once.
func TestWorkerCutOffFromPostgresGivesItsPartitionsUp(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, protocol string
		kind           netfault.Kind
	}{
		{"both directions, classic", "classic", netfault.PostgresCut},
		{"answers dropped, classic", "classic", netfault.PostgresOneWay},
		{"both directions, KIP-848", "consumer", netfault.PostgresCut},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			testCutOffFromPostgres(t, c.protocol, c.kind)
		})
	}
}

func testCutOffFromPostgres(t *testing.T, protocol string, kind netfault.Kind) {
	e, ns, svc := newNamespacedEnv(t, 6)
	common := []string{"--handler", "ledger", "--protocol", protocol, "--session-timeout", "6s",
		"--fence-log-max-age", "-1s", "--fence-log-max-entries", "-1"}
	cut := e.startWorkerIn(ns, "CUT", common...)
	healthy := e.startWorker("OK", common...)
	waitForMembers(t, e, 2)
	e.produce(jobsFor(keys, 0, 600)...)
	prod := e.produceInRounds(900, 20, 100*time.Millisecond) // 200 jobs/s
	e.waitForMoreCommits(600, 60*time.Second, cut, healthy)
	member := memberOf(t, cut)
	waitFor(t, 30*time.Second, "both workers to hold partitions", func() bool {
		held := e.ownedBy(t, member)
		return len(held) > 0 && len(held) < 6
	})

	held := e.ownedBy(t, member)
	if err := ns.Inject(svc.Faults(kind)...); err != nil {
		t.Fatal(err)
	}
	cutAt := time.Now()
	t.Logf("%s: %s cut off (%s) holding partitions %v", protocol, cut.name, kind, held)
	for _, p := range held { // work on every partition it held, whatever the producer's keys
		e.produceTo(p, jobsFor(keys, 100_000+int(p), 3)...)
	}
	var took time.Duration
	defer func() {
		if t.Failed() {
			e.diagnose(t)
		}
	}()
	waitFor(t, handoffLimit+15*time.Second, "another member to commit every partition the cut-off worker held", func() bool {
		last := time.Duration(0)
		for _, p := range held {
			at, ok := e.firstCommitByOthers(t, p, member, cutAt)
			if !ok {
				return false
			}
			last = max(last, at.Sub(cutAt))
		}
		took = last
		return true
	})
	t.Logf("every partition of the cut-off worker committed by another member %s after the cut", took.Round(time.Millisecond))
	if took > handoffLimit {
		t.Errorf("hand-off took %s after the cut, want at most %s", took.Round(time.Millisecond), handoffLimit)
	}
	cut.waitLog(5*time.Second, map[string]any{"stepped_down": true})
	time.Sleep(3 * time.Second) // the cut lasts beyond the hand-off
	if err := ns.Heal(); err != nil {
		t.Fatal(err)
	}
	cut.waitLog(60*time.Second, map[string]any{"msg": "the database answers again: joining the group"})
	prod.stop()
	end := e.highWatermarks()
	e.waitEveryPartitionCommitted(end, 90*time.Second)
	requireWorkersRunning(t, cut, healthy)
	// It joined as a new member: the group gives it partitions again.
	waitFor(t, 30*time.Second, "the worker that joined again to hold partitions", func() bool {
		m := memberOf(t, cut)
		return m != member && len(e.ownedBy(t, m)) > 0
	})
	_, violations := verifyRun(t, e, expect{ends: end, ledger: true})
	for _, v := range violations {
		t.Errorf("violation: %s", v)
	}
}

// A worker cut off from the brokers but not from Postgres is a live zombie:
// the coordinator evicts it after its session timeout and hands its
// partitions over, while it goes on committing what it had fetched until
// the new owner's claim fences it (the guarantee allows that window, and
// its commits end at the claim). Measured here: how many of its batches
// were fenced and how long after the cut it kept trying; checked: every
// job exactly once, and nothing of it accepted after the new owner's claim.
func TestWorkerCutOffFromKafkaIsFencedByItsSuccessor(t *testing.T) {
	t.Parallel()
	e, ns, svc := newNamespacedEnv(t, 6)
	common := []string{"--handler", "ledger", "--session-timeout", "6s",
		"--fence-log-max-age", "-1s", "--fence-log-max-entries", "-1", "--batch-max", "20"}
	zombie := e.startWorkerIn(ns, "ZOMBIE", common...)
	healthy := e.startWorker("OK", common...)
	waitForMembers(t, e, 2)
	e.produce(jobsFor(keys, 0, 3000)...)
	e.waitForMoreCommits(300, 60*time.Second, zombie, healthy)
	member := memberOf(t, zombie)
	held := e.ownedBy(t, member)
	if len(held) == 0 {
		t.Fatal("the zombie-to-be holds no partition")
	}
	if err := ns.Inject(svc.Faults(netfault.KafkaCut)...); err != nil {
		t.Fatal(err)
	}
	cutAt := time.Now()
	for _, p := range held {
		e.produceTo(p, jobsFor(keys, 100_000+int(p), 3)...)
	}
	waitFor(t, 60*time.Second, "another member to commit every partition the cut-off worker held", func() bool {
		for _, p := range held {
			if _, ok := e.firstCommitByOthers(t, p, member, cutAt); !ok {
				return false
			}
		}
		return true
	})
	time.Sleep(5 * time.Second)
	if err := ns.Heal(); err != nil {
		t.Fatal(err)
	}
	end := e.highWatermarks()
	e.waitEveryPartitionCommitted(end, 90*time.Second)
	fenced, lastTry := 0, time.Time{}
	for _, m := range zombie.logs() {
		if m["fenced"] == true {
			fenced++
		}
		if ts, ok := m["ts"].(string); ok && (m["fenced"] == true || m["msg"] == "batch committed") {
			if at, err := time.Parse("2006-01-02T15:04:05.000Z0700", ts); err == nil && at.After(lastTry) {
				lastTry = at
			}
		}
	}
	committedAfter := e.commitsByAfter(t, member, cutAt)
	t.Logf("cut off from Kafka, the zombie committed %d batches after the cut, had %d rejected (fenced), and last tried %s after the cut",
		committedAfter, fenced, lastTry.Sub(cutAt).Round(time.Millisecond))
	_, violations := verifyRun(t, e, expect{ends: end, ledger: true})
	for _, v := range violations {
		t.Errorf("violation: %s", v)
	}
}

// memberOf is the member id a worker logged when it last claimed a
// partition.
func memberOf(t *testing.T, w *worker) string {
	t.Helper()
	var member string
	waitFor(t, 30*time.Second, w.name+" to claim a partition", func() bool {
		for _, m := range w.logs() {
			if m["msg"] == consumer.MsgClaiming {
				member, _ = m["member"].(string)
			}
		}
		return member != ""
	})
	return member
}

// ownedBy lists the partitions whose fencing row names member as owner.
func (e *env) ownedBy(t *testing.T, member string) []int32 {
	t.Helper()
	return queryRows(t, e, pgx.RowTo[int32], `SELECT partition FROM "`+e.schema+`".fences WHERE consumer_group = $1 AND owner = $2 ORDER BY partition`, e.group, member)
}

// firstCommitByOthers is the time of the first commit of partition p after
// since by an owner other than member (the fence log's commit time).
func (e *env) firstCommitByOthers(t *testing.T, p int32, member string, since time.Time) (time.Time, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var at *time.Time
	if err := e.pool.QueryRow(ctx, `SELECT min(at) FROM "`+e.schema+`".fence_log
		WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND kind = 'commit' AND owner <> $4 AND at > $5`,
		e.group, e.topic, p, member, since).Scan(&at); err != nil {
		t.Fatal(err)
	}
	if at == nil {
		return time.Time{}, false
	}
	return *at, true
}

// commitsByAfter counts the commits member made after since.
func (e *env) commitsByAfter(t *testing.T, member string, since time.Time) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM "`+e.schema+`".fence_log
		WHERE consumer_group = $1 AND kind = 'commit' AND owner = $2 AND at > $3`, e.group, member, since).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// diagnose logs what the database says of the group: fencing rows, open
// holds, and the sessions that wait or block.
func (e *env) diagnose(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, q := range []string{
		`SELECT partition, incarnation, epoch, owner, claim_id, next_offset, log_epoch FROM "` + e.schema + `".fences WHERE consumer_group = '` + e.group + `' ORDER BY partition`,
		`SELECT partition, kind, reason FROM "` + e.schema + `".partition_holds WHERE consumer_group = '` + e.group + `' AND resolved_at IS NULL`,
		`SELECT pid, application_name, state, wait_event_type, wait_event, pg_blocking_pids(pid)::text, left(query, 120) FROM pg_stat_activity
		 WHERE datname = current_database() AND (application_name LIKE 'tenure:%' OR wait_event_type = 'Lock' OR state LIKE 'idle in transaction%')`,
	} {
		rows, err := e.pool.Query(ctx, q)
		if err != nil {
			t.Logf("diagnose: %v", err)
			continue
		}
		for rows.Next() {
			vals, _ := rows.Values()
			t.Logf("diagnose: %v", vals)
		}
		rows.Close()
	}
}
