package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/internal/history"
)

// `tenure admin offsets reset` moves a group's stored offsets through the
// fence (sink.Store.ResetOffset): one transaction per partition, a new log
// epoch, a 'reset' entry in the fence log by the actor. These tests run it
// against real worker processes with the ledger handler (one row per job
// run, no unique constraint, so that a job run twice shows twice) and check
// the result with the history checker.

// resetOutput is `admin offsets reset --output json`.
type resetOutput struct {
	Group      string `json:"consumer_group"`
	DryRun     bool   `json:"dry_run"`
	Actor      string `json:"actor"`
	Partitions []struct {
		Partition  int32 `json:"partition"`
		NextOffset int64 `json:"next_offset"`
		NewOffset  int64 `json:"new_offset"`
		LogStart   int64 `json:"log_start"`
		LogEnd     int64 `json:"log_end"`
		Skipped    *span `json:"skipped"`
		Repeated   *span `json:"repeated"`
		Executed   bool  `json:"executed"`
		EntryID    int64 `json:"reset_entry_id"`
		LogEpoch   int64 `json:"log_epoch"`
	} `json:"partitions"`
	Skipped  int64 `json:"skipped_jobs"`
	Repeated int64 `json:"repeated_jobs"`
}

type span struct {
	First int64 `json:"first"`
	Last  int64 `json:"last"`
	Count int64 `json:"count"`
}

const resetActor = "ops@example"

// resetArgs is `admin offsets reset` on the env's group and topic.
func (e *env) resetArgs(args ...string) []string {
	return append([]string{"admin", "offsets", "reset", "--brokers", strings.Join(e.brokers, ","), "--database-url", e.dbURL,
		"--schema", e.schema, "--group", e.group, "--topic", e.topic, "--actor", resetActor}, args...)
}

// resetJSON runs a reset with --output json, which must succeed.
func resetJSON(t *testing.T, e *env, args ...string) resetOutput {
	t.Helper()
	r := runCLI(t, 60*time.Second, "", e.resetArgs(append(args, "--output", "json")...)...)
	if r.code != 0 {
		t.Fatalf("admin offsets reset %v: %s", args, r)
	}
	var out resetOutput
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatalf("admin offsets reset %v: %v\n%s", args, err, r)
	}
	t.Logf("reset %v: %s", args, strings.Join(strings.Fields(r.stdout), " "))
	return out
}

// ledgerCounts counts the ledger rows of each offset of a partition: how
// many times each job ran.
func ledgerCounts(t *testing.T, e *env, p int32) map[int64]int {
	t.Helper()
	return queryMap[int64, int](t, e, `SELECT job_offset, count(*) FROM "`+e.schema+`".ledger WHERE topic = $1 AND partition = $2 GROUP BY job_offset`, e.topic, p)
}

// expectRuns applies what a printed reset says to the number of runs each
// job should have: one more for each repeated offset, none for a skipped
// one.
func expectRuns(want map[int32]map[int64]int, out resetOutput) {
	for _, p := range out.Partitions {
		if want[p.Partition] == nil {
			want[p.Partition] = map[int64]int{}
		}
		if s := p.Repeated; s != nil {
			for o := s.First; o <= s.Last; o++ {
				want[p.Partition][o]++
			}
		}
		if s := p.Skipped; s != nil {
			for o := s.First; o <= s.Last; o++ {
				want[p.Partition][o] = -1 // never runs (no later reset goes back over it here)
			}
		}
	}
}

// checkRuns compares the ledger with want (offsets of [0, end) not in want
// run once; -1: never).
func checkRuns(t *testing.T, e *env, p int32, end int64, want map[int64]int) {
	t.Helper()
	got := ledgerCounts(t, e, p)
	bad := 0
	for o := int64(0); o < end; o++ {
		w := 1 + want[o]
		if want[o] < 0 {
			w = 0
		}
		if got[o] != w {
			bad++
			if bad <= 10 {
				t.Errorf("partition %d offset %d ran %d times, the printed resets say %d", p, o, got[o], w)
			}
		}
	}
	for o := range got {
		if o >= end {
			t.Errorf("partition %d offset %d (beyond the end %d) ran", p, o, end)
		}
	}
}

// checkResetHistory runs the history checker over the ledger, with the
// reset entries, and checks that the fence log's resets are exactly the
// ones printed.
func checkResetHistory(t *testing.T, e *env, end map[int32]int64, printed ...resetOutput) *history.History {
	t.Helper()
	h := checkRun(t, e, expect{ends: end, ledger: true})
	type move struct {
		p        int32
		from, to int64
	}
	var want, got []move
	for _, out := range printed {
		for _, p := range out.Partitions {
			if p.NewOffset != p.NextOffset {
				want = append(want, move{p.Partition, p.NextOffset, p.NewOffset})
			}
		}
	}
	for _, en := range h.Log {
		if en.Kind == "reset" {
			if en.Owner != resetActor {
				t.Errorf("reset #%d recorded by %q, want %q", en.ID, en.Owner, resetActor)
			}
			got = append(got, move{en.Partition.Partition, en.From, en.To})
		}
	}
	if len(got) != len(want) {
		t.Fatalf("fence log resets %v, printed %v", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Errorf("fence log reset %d is %+v, printed %+v", i, got[i], want[i])
		}
	}
	return h
}

// logEpoch reads a partition's log epoch.
func logEpoch(t *testing.T, e *env, p int32) int64 {
	t.Helper()
	var n int64
	if err := e.pool.QueryRow(context.Background(), `SELECT log_epoch FROM "`+e.schema+`".fences WHERE consumer_group = $1 AND topic = $2 AND partition = $3`,
		e.group, e.topic, p).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// (a) A worker holds a batch before its commit while the offsets are
// reset: released, its commit is rejected, and its lane claims again and
// goes on from the new offset by itself. First the reset moves the offset
// back and forth to where it was (20 -> 10 -> 20): the held batch [20,40)
// still starts at the stored offset, and only the log epoch rejects it.
// Then a shift back (40 -> 35) under another held batch: jobs 35-39 run
// again.
func TestOffsetsResetRejectsTheBatchInFlight(t *testing.T) {
	eachProtocol(t, 1, testOffsetsResetRejectsTheBatchInFlight)
}

func testOffsetsResetRejectsTheBatchInFlight(t *testing.T, e *env, proto string) {
	ledger := []string{"--handler", "ledger", "--protocol", proto, "--fence-log-max-age", "-1s", "--fence-log-max-entries", "-1"}
	e.produce(jobsFor(keys, 0, 20)...)
	w1 := e.startWorker("W1", ledger...)
	waitCommitted(t, e, 0, 20, "")
	w1.stop(30 * time.Second)

	e.produce(jobsFor(keys, 20, 20)...)
	w2 := e.startWorker("W2", append(ledger, "--hold-once", "before-commit")...)
	held := w2.waitLog(30*time.Second, map[string]any{"msg": "holding", "point": "before-commit"})
	if held["from"] != float64(20) || held["to"] != float64(40) {
		t.Fatalf("W2 holds [%v,%v), want [20,40)", held["from"], held["to"])
	}
	back := resetJSON(t, e, "--partition", "0", "--to-offset", "10", "--execute")
	forth := resetJSON(t, e, "--partition", "0", "--to-offset", "20", "--execute")
	if p := back.Partitions[0]; p.NextOffset != 20 || p.NewOffset != 10 || p.Repeated == nil || *p.Repeated != (span{10, 19, 10}) || p.LogEpoch != 1 || p.EntryID == 0 {
		t.Fatalf("reset to 10: %+v", back)
	}
	if p := forth.Partitions[0]; p.NextOffset != 10 || p.NewOffset != 20 || p.Skipped == nil || *p.Skipped != (span{10, 19, 10}) || p.LogEpoch != 2 {
		t.Fatalf("reset to 20: %+v", forth)
	}
	w2.resume() // SIGCONT releases the hold
	fenced := w2.waitLog(30*time.Second, rejected)
	if !strings.Contains(fenced["error"].(string), "new log epoch") {
		t.Errorf("the held batch was rejected, but not for the new log epoch: %v", fenced["error"])
	}
	if fenced["from"] != float64(20) || fenced["to"] != float64(40) {
		t.Errorf("the rejected batch is [%v,%v), want [20,40)", fenced["from"], fenced["to"])
	}
	rec := w2.waitLog(30*time.Second, map[string]any{"msg": consumer.MsgRecovered})
	if rec["next_offset"] != float64(20) {
		t.Errorf("the lane recovered at %v, want 20", rec["next_offset"])
	}
	waitCommitted(t, e, 0, 40, "")
	w2.stop(30 * time.Second)

	e.produce(jobsFor(keys, 40, 10)...)
	w3 := e.startWorker("W3", append(ledger, "--hold-once", "before-commit")...)
	held = w3.waitLog(30*time.Second, map[string]any{"msg": "holding", "point": "before-commit"})
	if held["from"] != float64(40) {
		t.Fatalf("W3 holds [%v,%v), want from 40", held["from"], held["to"])
	}
	shift := resetJSON(t, e, "--partition", "0", "--shift-by", "-5", "--execute")
	if p := shift.Partitions[0]; p.NextOffset != 40 || p.NewOffset != 35 || shift.Repeated != 5 {
		t.Fatalf("shift by -5: %+v", shift)
	}
	w3.resume()
	w3.waitLog(30*time.Second, rejected)
	rec = w3.waitLog(30*time.Second, map[string]any{"msg": consumer.MsgRecovered})
	if rec["next_offset"] != float64(35) {
		t.Errorf("the lane recovered at %v, want 35", rec["next_offset"])
	}
	waitCommitted(t, e, 0, 50, "")
	w3.stop(30 * time.Second)
	if w3.findLog(map[string]any{"msg": consumer.MsgStalled}) != nil {
		t.Errorf("the lane stalled instead of claiming again at once")
	}

	want := map[int32]map[int64]int{}
	for _, out := range []resetOutput{back, forth, shift} {
		expectRuns(want, out)
	}
	// 10 -> 20 skipped what 20 -> 10 would have repeated: 10-19 ran once.
	for o := int64(10); o < 20; o++ {
		delete(want[0], o)
	}
	checkRuns(t, e, 0, 50, want[0])
	checkResetHistory(t, e, map[int32]int64{0: 50}, back, forth, shift)
}

// (b) Moving offsets back (--to-earliest on every partition, --shift-by -N)
// repeats exactly the jobs printed, moving them forward (--to-offset,
// --to-latest) skips exactly those, and every other job runs once; the
// history checker, with the reset entries, finds nothing wrong. The
// workers run during the first two resets. A lane that has caught up does
// not learn of a reset until its next job (it has nothing to commit): the
// repeats start when a new job arrives.
func TestOffsetsResetRepeatsAndSkipsExactlyThePrintedRanges(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	ledger := []string{"--handler", "ledger", "--fence-log-max-age", "-1s", "--fence-log-max-entries", "-1"}
	e.produceTo(0, jobsFor(keys, 0, 30)...)
	e.produceTo(1, jobsFor(keys, 100, 30)...)
	w := e.startWorker("W", ledger...)
	waitCommitted(t, e, 0, 30, "")
	waitCommitted(t, e, 1, 30, "")

	earliest := resetJSON(t, e, "--all-partitions", "--to-earliest", "--execute")
	if earliest.Repeated != 60 || earliest.Skipped != 0 || len(earliest.Partitions) != 2 {
		t.Fatalf("--to-earliest: %+v", earliest)
	}
	// Caught up, the lanes have nothing to commit and so nothing to be
	// rejected: they go on from the new offsets once a job arrives.
	time.Sleep(2 * time.Second)
	if n := ledgerCounts(t, e, 0)[0]; n != 1 {
		t.Logf("partition 0's job 0 already ran again before a new job arrived (%d runs)", n)
	} else {
		t.Logf("as expected, an idle lane had not noticed the reset after 2s")
	}
	e.produceTo(0, jobsFor(keys, 30, 1)...)
	e.produceTo(1, jobsFor(keys, 130, 1)...)
	waitCommitted(t, e, 0, 31, "")
	waitCommitted(t, e, 1, 31, "")

	shift := resetJSON(t, e, "--partition", "0", "--shift-by", "-5", "--execute")
	if p := shift.Partitions[0]; p.NextOffset != 31 || p.NewOffset != 26 {
		t.Fatalf("--shift-by -5: %+v", shift)
	}
	e.produceTo(0, jobsFor(keys, 31, 1)...)
	waitCommitted(t, e, 0, 32, "")
	w.stop(30 * time.Second)

	e.produceTo(0, jobsFor(keys, 32, 20)...)  // 32-51
	e.produceTo(1, jobsFor(keys, 131, 20)...) // 31-50
	to := resetJSON(t, e, "--partition", "0", "--to-offset", "40", "--execute")
	if p := to.Partitions[0]; p.Skipped == nil || *p.Skipped != (span{32, 39, 8}) {
		t.Fatalf("--to-offset 40: %+v", to)
	}
	latest := resetJSON(t, e, "--partition", "1", "--to-latest", "--execute")
	if p := latest.Partitions[0]; p.NewOffset != 51 || p.Skipped == nil || *p.Skipped != (span{31, 50, 20}) {
		t.Fatalf("--to-latest: %+v", latest)
	}
	e.produceTo(0, jobsFor(keys, 52, 5)...)  // 52-56
	e.produceTo(1, jobsFor(keys, 151, 5)...) // 51-55
	w = e.startWorker("W2", ledger...)
	waitCommitted(t, e, 0, 57, "")
	waitCommitted(t, e, 1, 56, "")
	w.stop(30 * time.Second)

	want := map[int32]map[int64]int{}
	printed := []resetOutput{earliest, shift, to, latest}
	for _, out := range printed {
		expectRuns(want, out)
	}
	checkRuns(t, e, 0, 57, want[0])
	checkRuns(t, e, 1, 56, want[1])
	h := checkResetHistory(t, e, map[int32]int64{0: 57, 1: 56}, printed...)
	if logEpoch(t, e, 0) != 3 || logEpoch(t, e, 1) != 2 {
		t.Errorf("log epochs %d and %d, want 3 and 2", logEpoch(t, e, 0), logEpoch(t, e, 1))
	}
	// Every commit after a reset follows a claim after it (the checker's
	// rule): the lanes claimed again.
	if n := len(history.ResetPartitions(h.Log)); n != 2 {
		t.Errorf("%d partitions with resets, want 2", n)
	}
}

// (c) A dry run (the default) shows the plan and changes nothing:
// neither the offset, nor the log epoch, nor the fence log. --to-datetime
// plans the first job at or after the time.
func TestOffsetsResetDryRunChangesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	e.produce(jobsFor(keys, 0, 5)...)
	time.Sleep(50 * time.Millisecond)
	at := time.Now()
	time.Sleep(50 * time.Millisecond)
	e.produce(jobsFor(keys, 5, 5)...)
	e.ledgerCaughtUp(10).stop(30 * time.Second)
	before := fenceRow(t, e, 0)
	entries := committedLogCount(t, e)

	r := runCLI(t, 60*time.Second, "", e.resetArgs("--partition", "0", "--to-datetime", at.UTC().Format(time.RFC3339Nano))...)
	if r.code != 0 || !strings.Contains(r.stdout, "plan (dry run: nothing was changed)") ||
		!strings.Contains(r.stdout, "PARTITION  NEXT_OFFSET  NEW_OFFSET  LOG_START  LOG_END  JOBS") ||
		!strings.Contains(r.stdout, "repeats 5 (offsets 5 to 9)") || !strings.Contains(r.stdout, "run again with --execute") {
		t.Fatalf("dry run --to-datetime: %s", r)
	}
	t.Logf("dry run:\n%s", r.stdout)
	out := resetJSON(t, e, "--partition", "0", "--to-earliest", "--dry-run")
	if !out.DryRun || out.Partitions[0].Executed || out.Partitions[0].NewOffset != 0 || out.Repeated != 10 {
		t.Fatalf("dry run --to-earliest: %+v", out)
	}
	if after := fenceRow(t, e, 0); after != before || logEpoch(t, e, 0) != 0 || committedLogCount(t, e) != entries {
		t.Fatalf("a dry run changed something: row %+v -> %+v, log epoch %d", before, after, logEpoch(t, e, 0))
	}
	var resets int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM "`+e.schema+`".fence_log WHERE kind = 'reset'`).Scan(&resets); err != nil || resets != 0 {
		t.Fatalf("a dry run logged %d resets (%v)", resets, err)
	}
}

// (d) Refusals, one sentence each, and nothing changed: a target outside
// the log, a shift past it, a partition no worker has claimed, a partition
// the topic does not have, a topic that does not exist.
func TestOffsetsResetRefusals(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	e.produceTo(0, jobsFor(keys, 0, 10)...)
	e.ledgerCaughtUp(10).stop(30 * time.Second)
	before := fenceRow(t, e, 0)

	wantFailure(t, runCLI(t, 60*time.Second, "", e.resetArgs("--partition", "0", "--to-offset", "11", "--execute")...),
		1, "partition 0: offset 11 is outside the log, which holds offsets 0 to 9 (a next offset may be from 0 to 10)", "nothing was changed")
	wantFailure(t, runCLI(t, 60*time.Second, "", e.resetArgs("--partition", "0", "--shift-by", "-11", "--execute")...),
		1, "offset -1 (10 -11) is outside the log")
	// A group no worker has run for (a worker claims every partition it is
	// assigned, empty or not), which the brokers do not know either: a name
	// the schema has never seen, and where a new group starts.
	fresh := replaceArg(e.resetArgs("--partition", "0", "--partition", "1", "--to-earliest", "--execute"), e.group, e.group+"-new")
	wantFailure(t, runCLI(t, 60*time.Second, "", fresh...),
		1, fmt.Sprintf("no group %q in schema %s nor on the brokers; groups the schema has: %s", e.group+"-new", e.schema, e.group),
		"nothing was changed", "kafka-consumer-groups --reset-offsets")
	wantFailure(t, runCLI(t, 60*time.Second, "", e.resetArgs("--partition", "5", "--to-earliest")...),
		2, "topic "+e.topic+" has 2 partitions: there is no partition 5")
	wantFailure(t, runCLI(t, 60*time.Second, "", replaceArg(e.resetArgs("--partition", "0", "--to-earliest"), e.topic, e.topic+"-missing")...), 1,
		fmt.Sprintf("no topic %q for group %q in schema %s nor on the brokers; its topics there: %s\n", e.topic+"-missing", e.group, e.schema, e.topic))
	if after := fenceRow(t, e, 0); after != before || logEpoch(t, e, 0) != 0 {
		t.Fatalf("a refused reset changed the row: %+v -> %+v", before, after)
	}
}

func replaceArg(args []string, old, new string) []string {
	out := append([]string(nil), args...)
	for i, a := range out {
		if a == old {
			out[i] = new
		}
	}
	return out
}

// A reset back over a dead-lettered job: the plan says so, and the job,
// which fails again, is dead-lettered again in the new log epoch and the
// partition goes on. (With one letter per job the second could not be
// written: the lane looped on claim-and-retry at the job, 19 cycles in 8s.)
func TestOffsetsResetOverDeadLetters(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	e.produce(jobsFailingAt(5, 2)...)
	w := e.ledgerCaughtUp(5, "--inject-faults", "--max-attempts", "1")
	r := runCLI(t, 60*time.Second, "", e.resetArgs("--partition", "0", "--to-earliest")...)
	if r.code != 0 || !strings.Contains(r.stdout, "note: partition 0: 1 of the repeated jobs are in the dead-letter table") {
		t.Fatalf("the plan does not point out the dead letter: %s", r)
	}
	out := resetJSON(t, e, "--partition", "0", "--to-earliest", "--execute")
	if out.Partitions[0].NewOffset != 0 {
		t.Fatalf("%+v", out)
	}
	e.produce(jobsFor(keys, 5, 1)...) // wakes the idle lane
	waitCommitted(t, e, 0, 6, "")
	var letters int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM "`+e.schema+`".dead_letters WHERE consumer_group = $1 AND job_offset = 2`, e.group).Scan(&letters); err != nil {
		t.Fatal(err)
	}
	if letters != 2 {
		t.Errorf("job 2 has %d dead letters, want 2 (one per log epoch)", letters)
	}
	if n := w.countLogs(map[string]any{"msg": consumer.MsgBatchFenced}); n > 1 {
		t.Errorf("%d batches rejected: the lane looped on the job it could not park", n)
	}
	w.stop(30 * time.Second)
}
