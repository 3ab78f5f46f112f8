package integration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tenure-dev/tenure/consumer"
)

// keys of the jobs: a handful, so that every key gets many export versions.
var keys = []string{"acme", "globex", "initech", "umbrella", "hooli"}

// The paused-worker scenario, with real processes. Worker A takes a batch and is
// frozen with SIGSTOP after it has the jobs and before it commits. Past the
// session timeout the group gives the partition to B at a higher epoch; B
// claims it, does A's jobs and newer ones. Then A is resumed and goes on to
// commit its old batch: Postgres rejects it, and no key's export moves
// backwards.
func TestPausedWorkerIsFenced(t *testing.T) {
	eachProtocol(t, 1, testPausedWorkerIsFenced)
}

// pauseAWithABatch produces 20 jobs; worker A takes a batch and holds
// before it begins; B joins while A is still alive (so the group keeps the
// partition with A, and the hand-off that follows is caused by A's pause
// alone), holding once at bHold if it is not ""; then A is frozen. Both
// run proto ("": the default). held is A's "holding" line.
func (e *env) pauseAWithABatch(proto, bHold string) (a, b *worker, held map[string]any) {
	e.t.Helper()
	e.produce(jobsFor(keys, 0, 20)...)
	var common []string
	if proto != "" {
		common = []string{"--protocol", proto}
	}
	a = e.startWorker("A", append(slices.Clone(common), "--hold-once", "before-batch")...)
	held = a.waitLog(30*time.Second, map[string]any{"msg": "holding"})
	if bHold != "" {
		common = append(common, "--hold-once", bHold)
	}
	b = e.startWorker("B", common...)
	b.waitLog(30*time.Second, map[string]any{"msg": "worker starting"})
	waitForMembers(e.t, e, 2)
	a.pause()
	return a, b, held
}

func testPausedWorkerIsFenced(t *testing.T, e *env, proto string) {
	a, b, held := e.pauseAWithABatch(proto, "")
	t.Logf("A frozen holding jobs [%v,%v) with token %v", held["from"], held["to"], held["token"])

	claimed := b.waitLog(30*time.Second, map[string]any{"msg": consumer.MsgClaimed})
	if !tokenLess(t, fmt.Sprint(held["token"]), fmt.Sprint(claimed["token"])) {
		t.Fatalf("B claimed with token %v, not above A's %v", claimed["token"], held["token"])
	}
	// B does A's jobs and the newer ones, while A is still frozen.
	waitCommitted(t, e, 0, e.highWatermark(0), "B")
	e.produce(jobsFor(keys, 20, 10)...)
	waitCommitted(t, e, 0, e.highWatermark(0), "B")

	a.resume()
	// A either is rejected or (were the fence broken) commits its stale
	// batch; either way the history below is checked.
	a.waitLogAny(30*time.Second, rejected, batchCommitted)
	if rej := a.findLog(rejected); rej == nil {
		t.Errorf("A's late batch was not rejected")
	} else if s := fmt.Sprint(rej["error"]); !strings.Contains(s, fmt.Sprint(held["token"])) || !strings.Contains(s, fmt.Sprint(claimed["token"])) {
		t.Errorf("A's rejection should name its token %v and the winner %v: %s", held["token"], claimed["token"], s)
	}
	checkStopped(t, e, b, a)
}

// G3: B has claimed the partition but has not written anything yet (it is
// held before its first batch). A's late batch is rejected all the same.
func TestClaimFencesBeforeFirstWrite(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	a, b, held := e.pauseAWithABatch("", "before-batch")

	b.waitLog(30*time.Second, map[string]any{"msg": consumer.MsgClaimed})
	b.waitLog(30*time.Second, map[string]any{"msg": "holding"})
	if n := committedLogCount(t, e); n != 0 {
		t.Fatalf("nothing should be committed yet, found %d commits", n)
	}

	a.resume()
	a.waitLogAny(30*time.Second, rejected, batchCommitted)
	if a.findLog(rejected) == nil {
		t.Errorf("A's late batch was not rejected after B's claim")
	} else {
		t.Logf("A's batch [%v,%v) rejected after B's claim, before B wrote anything", held["from"], held["to"])
	}
	if n := committedLogCount(t, e); n != 0 {
		t.Errorf("A's batch must not have committed: found %d commits", n)
	}

	b.resume() // releases B's hold
	waitCommitted(t, e, 0, e.highWatermark(0), "")
	checkStopped(t, e, b, a)
}

// What the fence does not promise, shown: A's batch arrives after the group
// gave the partition to B but before B claimed it. It is accepted, and B
// resumes after it: nothing is lost or done twice (G1).
func TestCommitBeforeClaimIsAcceptedAndContinued(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	a, b, held := e.pauseAWithABatch("", "before-claim")

	// The coordinator has given B the partition; B has not claimed it.
	b.waitLog(30*time.Second, map[string]any{"msg": "holding", "point": "before-claim"})
	a.resume()
	to := int64(held["to"].(float64))
	waitFor(t, 30*time.Second, "A's late batch to commit", func() bool {
		f := fenceRow(t, e, 0)
		return f.next >= to
	})
	b.resume()
	waitCommitted(t, e, 0, e.highWatermark(0), "")
	h := checkStopped(t, e, b, a)
	// The history shows A's commit and, after it, a claim that starts at
	// A's end: B continued after A.
	var sawA bool
	for _, en := range h.Log {
		if en.Kind == "commit" && en.From == int64(held["from"].(float64)) && en.To == to {
			sawA = true
		}
	}
	if !sawA {
		t.Errorf("A's batch [%v,%d) is not in the fence log: %+v", held["from"], to, h.Log)
	}
}

// The log lines a worker writes when a batch is rejected or committed.
var (
	rejected       = map[string]any{"msg": consumer.MsgBatchFenced, "fenced": true}
	batchCommitted = map[string]any{"msg": "batch committed"}
	abandoned      = map[string]any{"msg": "batch abandoned: lane stopped"}
)

// resumeLost thaws w, frozen with a batch in flight while another worker
// took its partition, waits until that batch ends (rejected, abandoned, or
// one of also) and fails t if it committed instead.
func (w *worker) resumeLost(t *testing.T, also ...map[string]any) {
	t.Helper()
	w.resume()
	w.waitLogAny(30*time.Second, append([]map[string]any{rejected, batchCommitted, abandoned}, also...)...)
	if w.findLog(batchCommitted) != nil {
		t.Errorf("%s's batch committed after it lost the partition", w.name)
	}
}

func committedLogCount(t *testing.T, e *env) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM "`+e.schema+`".fence_log WHERE kind = 'commit' AND consumer_group = $1`, e.group).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitCommitted waits until the partition's stored next offset reaches off.
func waitCommitted(t *testing.T, e *env, partition int32, off int64, _ string) {
	t.Helper()
	waitFor(t, 60*time.Second, fmt.Sprintf("next offset of partition %d to reach %d", partition, off), func() bool {
		return fenceRow(t, e, partition).next >= off
	})
}

func tokenLess(t *testing.T, a, b string) bool {
	t.Helper()
	var ai, ae, bi, be int64
	if _, err := fmt.Sscanf(a, "%d.%d", &ai, &ae); err != nil {
		t.Fatalf("token %q: %v", a, err)
	}
	if _, err := fmt.Sscanf(b, "%d.%d", &bi, &be); err != nil {
		t.Fatalf("token %q: %v", b, err)
	}
	return ai < bi || (ai == bi && ae < be)
}

// A worker frozen in the middle of its transaction holds row locks that the
// new owner needs. Postgres ends the frozen session after the idle-in-
// transaction timeout, B goes on, and when A wakes its commit finds the
// connection gone: it learns from the fencing row that it was fenced, rather
// than guessing.
func TestPausedMidTransaction(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	e.produce(jobsFor(keys, 0, 20)...)

	a := e.startWorker("A", "--hold-once", "before-commit", "--handler-timeout", "1s", "--idle-in-tx-timeout", "2s")
	a.waitLog(30*time.Second, map[string]any{"msg": "holding", "point": "before-commit"})
	b := e.startWorker("B", "--handler-timeout", "1s", "--idle-in-tx-timeout", "2s")
	b.waitLog(30*time.Second, map[string]any{"msg": "worker starting"})
	waitForMembers(t, e, 2)
	a.pause()

	b.waitLog(30*time.Second, map[string]any{"msg": consumer.MsgClaimed})
	waitCommitted(t, e, 0, e.highWatermark(0), "B")

	// Postgres has already ended A's session, so A's commit statement fails
	// on a dead connection (nothing was sent to COMMIT: the outcome is
	// certain) and the batch is retried or abandoned as A learns it lost
	// the partition; a retry meets the fence.
	a.resumeLost(t)
	h := checkStopped(t, e, b, a)
	for _, en := range h.Log {
		if en.Kind == "commit" && strings.HasPrefix(en.Owner, "tenure-A-") {
			t.Errorf("A committed %+v", en)
		}
	}
}
