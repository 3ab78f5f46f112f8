package integration

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/tenure-dev/tenure/internal/history"
)

// The history check every integration test ends with: what Postgres
// recorded (history.Load), checked against what the test produced and what
// the workers logged. A test says what its run must show in an expect;
// the mechanics are here once.

// expect is what a finished run must show. Every check includes G1-G3 and
// exactly-once over the produced jobs (history.Check) and the
// coordinator's side (history.CheckOwnership over the assignments every
// worker of the env logged, none of the fence log's entries unmatched).
type expect struct {
	// partitions are checked up to their high watermark, read now: every
	// offset below it holds one job.
	partitions []int32
	// ends instead gives each checked partition's end, where the test
	// knows it better than the broker can tell now.
	ends map[int32]int64
	// ledger reads the ledger handler's rows instead of the export writes.
	ledger bool
	// deadLetters lets a job's one outcome be a dead letter; without it
	// every job must have been written (an outage is never a job's fault).
	deadLetters bool
	// atEnd: each partition's fencing row must be at the partition's end.
	atEnd bool
	// objects loads the export pointers and publications as well.
	objects bool
}

// verifyRun loads the run's history and returns it with every broken
// promise, for a test that expects some (a mechanism switched off) to
// assert on them; checkRun is the usual form.
func verifyRun(t *testing.T, e *env, x expect) (*history.History, []history.Violation) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h, err := history.Load(ctx, e.pool, e.schema, e.group, x.ledger)
	if err != nil {
		t.Fatal(err)
	}
	if x.objects {
		if err := h.LoadObjectExports(ctx, e.pool, e.schema, e.group); err != nil {
			t.Fatal(err)
		}
	}
	ends := x.ends
	if ends == nil {
		ends = map[int32]int64{}
		for _, p := range x.partitions {
			ends[p] = e.highWatermark(p)
		}
	}
	produced := map[history.TopicPartition][]int64{}
	for p, end := range ends {
		offs := make([]int64, end)
		for i := range offs {
			offs[i] = int64(i)
		}
		produced[history.TopicPartition{Topic: e.topic, Partition: p}] = offs
	}

	vs := h.Check(produced)
	own, unmatched := history.CheckOwnership(h.Log, e.assignments())
	vs = append(vs, own...)
	for _, u := range unmatched {
		vs = append(vs, history.Violation{Rule: "unassigned", Detail: fmt.Sprintf("fence log entry #%d (%s by %q, claim id %d) matches no assignment a worker logged", u.ID, u.Kind, u.Owner, u.ClaimID)})
	}
	if !x.deadLetters && len(h.DeadLetters) > 0 {
		d := h.DeadLetters[0]
		vs = append(vs, history.Violation{Rule: "dead-lettered", Detail: fmt.Sprintf("%d jobs dead-lettered, want none; the first: %s/%d offset %d", len(h.DeadLetters), d.Topic, d.Partition, d.Offset)})
	}

	// history.Check finds what is missing only below the fencing row's next
	// offset: a partition whose lane stopped early looks complete to it.
	// Counting each partition's outcomes against its end closes that gap.
	// A partition an operator reset is left to the log-based check: a
	// reset back runs jobs again, one forward skips them.
	resets := history.ResetPartitions(h.Log)
	outcomes := map[int32]int64{}
	for _, w := range h.Writes {
		if w.Topic == e.topic {
			outcomes[w.Partition]++
		}
	}
	for _, w := range h.DeadLetters {
		if w.Topic == e.topic {
			outcomes[w.Partition]++
		}
	}
	parts := make([]int32, 0, len(ends))
	for p := range ends {
		parts = append(parts, p)
	}
	sort.Slice(parts, func(i, j int) bool { return parts[i] < parts[j] })
	for _, p := range parts {
		end := ends[p]
		if !resets[history.TopicPartition{Topic: e.topic, Partition: p}] && outcomes[p] != end {
			vs = append(vs, history.Violation{Rule: "missing", Detail: fmt.Sprintf("partition %d: %d jobs produced, %d written or dead-lettered", p, end, outcomes[p])})
		}
		if x.atEnd {
			if f := fenceRow(t, e, p); f.next != end {
				vs = append(vs, history.Violation{Rule: "next-offset", Detail: fmt.Sprintf("partition %d: next offset %d, end %d", p, f.next, end)})
			}
		}
	}
	return h, vs
}

// checkRun is verifyRun with every broken promise a test error.
func checkRun(t *testing.T, e *env, x expect) *history.History {
	t.Helper()
	h, vs := verifyRun(t, e, x)
	for _, v := range vs {
		t.Errorf("violation: %s", v)
	}
	return h
}

// checkStopped stops the workers, in the order given, and checks the run
// over partition 0 (checkRun).
func checkStopped(t *testing.T, e *env, ws ...*worker) *history.History {
	t.Helper()
	for _, w := range ws {
		w.stop(30 * time.Second)
	}
	return checkRun(t, e, expect{partitions: []int32{0}})
}

// loadHistory is the run's history unchecked, for a test that checks it
// against other produced offsets than a partition's whole log.
func loadHistory(t *testing.T, e *env) *history.History {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h, err := history.Load(ctx, e.pool, e.schema, e.group, false)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// allPartitions is 0..n-1.
func allPartitions(n int32) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(i)
	}
	return out
}

type fence struct {
	next  int64
	owner string
}

// fenceRow is a partition's fencing row now; next is -1 when it has none.
func fenceRow(t *testing.T, e *env, partition int32) fence {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var f fence
	err := e.pool.QueryRow(ctx, `SELECT next_offset, owner FROM "`+e.schema+`".fences WHERE consumer_group = $1 AND topic = $2 AND partition = $3`,
		e.group, e.topic, partition).Scan(&f.next, &f.owner)
	if err != nil {
		return fence{next: -1}
	}
	return f
}
