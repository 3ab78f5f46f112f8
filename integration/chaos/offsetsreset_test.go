package chaos

// The offsets-reset fault: the harness as an operator who moves a running
// group's stored offset with `tenure admin offsets reset --execute`
// (docs/fencing.md, "Moving a group's offsets"), on one partition, back
// (its jobs run again) or forward (jobs skipped), while it has traffic
// (busy) or none (idle). The history checker takes a partition's 'reset'
// fence log entries as the operator's record (internal/history re-bases
// the partition there: repeated jobs may have one effect per commit that
// covered them, jobs a reset skipped may have none); checkResets holds the
// fence log to exactly the resets the harness made, and checkJobs counts a
// job's dead letters against the commits that covered it.
//
// Idle is the case a lane can miss: a lane with nothing to commit learns
// of a reset only when it next has a job or an assignment, and with no
// traffic that may be never. So an idle reset holds the partition's
// traffic back after the reset (the producer leaves it alone) until the
// partition has moved, or B and a little more have passed: that wait is
// quiet time for the liveness check, which reports a lane that does not
// move within B as a wedge.

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tenure-dev/tenure/internal/history"
	"github.com/tenure-dev/tenure/sink"
)

const kindOffsetsReset = "offsets-reset"

// Modes of offsets-reset: traffic (busy or idle) and direction.
const (
	resetBusyBack    = "busy-back"
	resetBusyForward = "busy-forward"
	resetIdleBack    = "idle-back"
	resetIdleForward = "idle-forward"
)

var offsetResetModes = []string{resetBusyBack, resetBusyForward, resetIdleBack, resetIdleForward}

// resetActor is who the harness moves offsets as (the 'reset' entries'
// owner); acknowledged holds are chaosActor's.
const resetActor = "chaos-reset"

// offsetReset is one reset the harness executed, as the CLI reported it.
type offsetReset struct {
	fault     *fault
	partition int32
	from, to  int64 // the stored next offset the reset found, and where it moved it
	entryID   int64 // its fence log entry
	idle      bool
	moved     time.Duration // idle: from the reset to the partition's next offset moving past `to`; -1: not within the wait
}

// offsetsReset is the offsets-reset fault.
func (w *world) offsetsReset() {
	mode := offsetResetModes[w.rng.IntN(len(offsetResetModes))]
	k := int64(10 + w.rng.IntN(31)) // jobs repeated, or skipped
	w.settle(15 * time.Second)
	w.markerWG.Wait() // no marker of an earlier fault may land on an idle partition
	claimed := w.claimedPartitions()
	if len(claimed) == 0 {
		w.note("offsets-reset: no partition has a fencing row")
		return
	}
	p := claimed[w.rng.IntN(len(claimed))]
	idle := strings.HasPrefix(mode, "idle")
	forward := strings.HasSuffix(mode, "forward")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	if idle {
		w.prod.setSkip(p)
		if !w.awaitDrained(ctx, p, 15*time.Second) {
			w.prod.setSkip(-1)
			idle = false
			mode = strings.Replace(mode, "idle", "busy", 1)
			w.note("offsets-reset: partition %d did not drain within 15s with its traffic held back: busy instead of idle", p)
		}
	}
	w.acting()
	// A lane is behind only for a moment: to move it forward, the worker
	// that holds the partition is frozen (under the session timeout, so
	// nothing is handed off) while a burst is produced and the offset
	// moved into the middle of it.
	var frozen *slot
	if forward {
		frozen = w.frozenOwner(ctx, p)
	}
	target := fmt.Sprintf("partition %d", p)
	if frozen != nil {
		target += " of " + frozen.p.name
	}
	f := w.begin(kindOffsetsReset, mode, target)
	args := w.resetArgs(ctx, p, k, forward, frozen, target)
	var r *offsetReset
	var out string
	if args != nil {
		var err error
		r, out, err = w.resetOffset(ctx, p, args...)
		if err != nil {
			w.note("offsets-reset %s (%s): %v", target, strings.Join(args, " "), err)
		}
	}
	if frozen != nil {
		frozen.p.resume()
		if d := time.Since(f.Injected); d >= sessionTimeout {
			w.note("offsets-reset: %s was frozen %s, not under the session timeout %s: its partitions may have been handed off", frozen.p.name, d.Round(time.Millisecond), sessionTimeout)
		}
	}
	w.end(f)
	if r != nil {
		r.fault, r.idle = f, idle
		w.mu.Lock()
		w.offResets = append(w.offResets, r)
		w.mu.Unlock()
		w.t.Logf("offsets-reset: partition %d moved from %d to %d (reset #%d, %s): %s", p, r.from, r.to, r.entryID, mode, out)
	}
	if idle {
		w.idleTail(ctx, p, r, f)
	}
	w.mark(f)
}

// claimedPartitions are the partitions with a fencing row (the CLI refuses
// a partition without one).
func (w *world) claimedPartitions() []int32 {
	w.mu.Lock()
	defer w.mu.Unlock()
	var claimed []int32
	for p := range w.nparts() {
		if _, ok := w.next[p]; ok {
			claimed = append(claimed, p) // the CLI refuses a partition with no fencing row
		}
	}
	return claimed
}

// frozenOwner is the running worker whose member owns partition p's
// fencing row, or nil.
func (w *world) frozenOwner(ctx context.Context, p int32) *slot {
	var frozen *slot
	owner, _, err := w.fenceOf(ctx, p)
	if name := w.book.workerOf(owner, p); err == nil && name != "" {
		for _, s := range w.slots {
			if s.p.name == name && !s.p.exited() {
				frozen = s
			}
		}
	}
	return frozen
}

// resetArgs are the CLI's arguments for the reset of partition p: forward,
// into the middle of a burst of 2k jobs produced with frozen (if any)
// paused; back, k jobs but no further than the log start. nil: no reset.
func (w *world) resetArgs(ctx context.Context, p int32, k int64, forward bool, frozen *slot, target string) []string {
	var args []string
	if forward {
		if frozen != nil {
			if err := frozen.p.pause(); err != nil {
				w.note("offsets-reset: %v", err)
			}
		}
		burst, err := w.prod.burst(ctx, p, int(2*k), w.rng)
		if err != nil || len(burst) < 2 {
			w.note("offsets-reset %s: producing the burst: %v (%d jobs)", target, err, len(burst))
		}
		if len(burst) > 0 {
			args = []string{"--to-offset", strconv.FormatInt(burst[len(burst)/2].Offset, 10)}
		}
	} else {
		args = []string{"--shift-by", strconv.FormatInt(-k, 10)}
		if start, err := w.logStart(ctx, p); err == nil {
			if _, next, err := w.fenceOf(ctx, p); err == nil && next-k < start {
				args = []string{"--to-offset", strconv.FormatInt(start, 10)} // no further back than the log
			}
		}
	}
	return args
}

// idleTail is an idle reset's quiet tail: no traffic to the partition
// until it moves, or B and a sample have passed (the liveness check has
// judged it); r (if any) records how long it took to move.
func (w *world) idleTail(ctx context.Context, p int32, r *offsetReset, f *fault) {
	moved := time.Duration(-1)
	if r != nil && r.from != r.to {
		at, ok := w.quietTail(func() bool {
			_, next, err := w.fenceOf(ctx, p)
			return err == nil && next > r.to
		})
		if ok {
			moved = at.Sub(f.Ended)
		}
	}
	w.mu.Lock()
	if r != nil {
		r.moved = moved
	}
	w.mu.Unlock()
	w.prod.setSkip(-1)
}

// awaitDrained waits until partition p's stored next offset has been the
// log's end for a second (its lane has nothing to do), within timeout.
func (w *world) awaitDrained(ctx context.Context, p int32, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	var since time.Time
	for time.Now().Before(deadline) {
		end, err := w.endOffset(ctx, p)
		w.mu.Lock()
		next, ok := w.next[p]
		w.mu.Unlock()
		switch {
		case err != nil || !ok || next != end:
			since = time.Time{}
		case since.IsZero():
			since = time.Now()
		case time.Since(since) >= time.Second:
			return true
		}
		w.sleep(100 * time.Millisecond)
	}
	return false
}

// endOffset is partition p's log end.
func (w *world) endOffset(ctx context.Context, p int32) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	offs, err := w.adm.ListEndOffsets(ctx, topicName)
	if err != nil {
		return 0, err
	}
	o, ok := offs.Lookup(topicName, p)
	if !ok || o.Err != nil {
		return 0, fmt.Errorf("partition %d's end: %v", p, o.Err)
	}
	return o.Offset, nil
}

// resetOffset runs `tenure admin offsets reset --execute` on partition p
// with the target args, as resetActor, and returns what it did.
func (w *world) resetOffset(ctx context.Context, p int32, args ...string) (*offsetReset, string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := append([]string{"admin", "offsets", "reset", "--brokers", w.brokerAddr, "--database-url", w.dbURL(), "--schema", schemaName,
		"--group", groupName, "--topic", topicName, "--partition", strconv.Itoa(int(p)), "--execute", "--actor", resetActor, "--output", "json"}, args...)
	out, err := exec.CommandContext(ctx, tenureBin, cmd...).Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return nil, "", fmt.Errorf("tenure admin offsets reset: %v: %s", err, strings.TrimSpace(string(ee.Stderr)))
		}
		return nil, "", fmt.Errorf("tenure admin offsets reset: %v", err)
	}
	var rep struct {
		Partitions []struct {
			Partition  int32 `json:"partition"`
			NextOffset int64 `json:"next_offset"`
			NewOffset  int64 `json:"new_offset"`
			Executed   bool  `json:"executed"`
			EntryID    int64 `json:"reset_entry_id"`
		} `json:"partitions"`
	}
	if err := json.Unmarshal(out, &rep); err != nil || len(rep.Partitions) != 1 || !rep.Partitions[0].Executed || rep.Partitions[0].Partition != p {
		return nil, "", fmt.Errorf("tenure admin offsets reset said %s (%v)", strings.TrimSpace(string(out)), err)
	}
	r := rep.Partitions[0]
	desc := fmt.Sprintf("repeats %d jobs", r.NextOffset-r.NewOffset)
	if r.NewOffset > r.NextOffset {
		desc = fmt.Sprintf("skips %d jobs", r.NewOffset-r.NextOffset)
	}
	return &offsetReset{partition: p, from: r.NextOffset, to: r.NewOffset, entryID: r.EntryID, moved: -1}, desc, nil
}

// resetReport is what the resets came to, for the summary.
type resetReport struct {
	n                 int
	byMode            map[string]int
	skipped, repeated int64
	idleMoved         []time.Duration
	idleStuck         int
	violations        []string
}

// checkResetLog holds the fence log's 'reset' entries to the run's record:
// each of resetActor's is one of the harness's offsets resets, at the
// partition, offsets and entry id the CLI reported, and each of those is
// in the log; the acknowledgements of holds (chaosActor's) are checkDeleted's;
// a reset by anyone else was made by nobody in the run.
func checkResetLog(log []history.Entry, resets []*offsetReset) resetReport {
	r := resetReport{byMode: map[string]int{}}
	byID := map[int64]*offsetReset{}
	for _, x := range resets {
		byID[x.entryID] = x
		r.n++
		r.byMode[x.fault.Mode]++
		if x.to > x.from {
			r.skipped += x.to - x.from
		} else {
			r.repeated += x.from - x.to
		}
		if x.idle && x.from != x.to {
			if x.moved >= 0 {
				r.idleMoved = append(r.idleMoved, x.moved)
			} else {
				r.idleStuck++
			}
		}
	}
	seen := map[int64]bool{}
	for _, e := range log {
		if e.Kind != "reset" || e.Partition.Topic != topicName {
			continue
		}
		switch e.Owner {
		case chaosActor:
			continue
		case resetActor:
			x := byID[e.ID]
			switch {
			case x == nil:
				r.violations = append(r.violations, fmt.Sprintf("reset #%d of partition %d (%d to %d) by %s is not one the harness made", e.ID, e.Partition.Partition, e.From, e.To, e.Owner))
			case x.partition != e.Partition.Partition || x.from != e.From || x.to != e.To:
				r.violations = append(r.violations, fmt.Sprintf("reset #%d moved partition %d from %d to %d, but the CLI reported partition %d from %d to %d",
					e.ID, e.Partition.Partition, e.From, e.To, x.partition, x.from, x.to))
			}
			seen[e.ID] = true
		default:
			r.violations = append(r.violations, fmt.Sprintf("reset #%d of partition %d (%d to %d) by %q: nobody in the run made it", e.ID, e.Partition.Partition, e.From, e.To, e.Owner))
		}
	}
	for _, x := range resets {
		if !seen[x.entryID] {
			r.violations = append(r.violations, fmt.Sprintf("the offsets reset of partition %d from %d to %d (entry #%d, %s) is not in the fence log", x.partition, x.from, x.to, x.entryID, x.fault.Mode))
		}
	}
	return r
}

// summary is the resets' line; skipped counts the jobs below their
// partition's next offset that no commit covered (checkJobs).
func (r resetReport) summary(skipped int) string {
	if r.n == 0 {
		return "offsets:     no offsets reset in this run\n"
	}
	var modes []string
	for _, m := range offsetResetModes {
		modes = append(modes, fmt.Sprintf("%s %d", m, r.byMode[m]))
	}
	return fmt.Sprintf("offsets:     %d resets by %s (%s): %d jobs skipped, %d repeated, as the reset entries say (%d jobs below the next offset no commit covered); "+
		"an idle lane moved again after p50/max %s, not within B: %d\n",
		r.n, resetActor, strings.Join(modes, ", "), r.skipped, r.repeated, skipped, p50max(slices.Clone(r.idleMoved)), r.idleStuck)
}

// The fence log's resets must be exactly the harness's: each of
// resetActor's matches one it made, each it made is there, and nobody
// else moved an offset (the holds' acknowledgements are checkDeleted's).
func TestCheckResetLog(t *testing.T) {
	part := func(p int32) sink.Partition { return sink.Partition{Group: groupName, Topic: topicName, Partition: p} }
	f := &fault{Kind: kindOffsetsReset, Mode: resetIdleBack}
	made := []*offsetReset{
		{fault: f, partition: 1, from: 50, to: 30, entryID: 10, idle: true, moved: 2 * time.Second},
		{fault: &fault{Kind: kindOffsetsReset, Mode: resetBusyForward}, partition: 2, from: 40, to: 70, entryID: 11, moved: -1},
	}
	log := []history.Entry{
		{ID: 10, Kind: "reset", Partition: part(1), Owner: resetActor, From: 50, To: 30},
		{ID: 11, Kind: "reset", Partition: part(2), Owner: resetActor, From: 40, To: 70},
		{ID: 12, Kind: "reset", Partition: part(3), Owner: chaosActor, From: 5, To: 9},
		{ID: 13, Kind: "commit", Partition: part(1), Owner: "m", From: 30, To: 50},
	}
	r := checkResetLog(log, made)
	if len(r.violations) != 0 || r.n != 2 || r.skipped != 30 || r.repeated != 20 || len(r.idleMoved) != 1 || r.idleStuck != 0 {
		t.Fatalf("clean log: %+v", r)
	}
	bad := []history.Entry{
		{ID: 10, Kind: "reset", Partition: part(1), Owner: resetActor, From: 50, To: 31}, // not what the CLI said
		{ID: 14, Kind: "reset", Partition: part(4), Owner: resetActor, From: 1, To: 2},   // not one the harness made
		{ID: 15, Kind: "reset", Partition: part(5), Owner: "someone", From: 1, To: 2},    // nobody in the run
	} // and #11 is missing
	r = checkResetLog(bad, made)
	if len(r.violations) != 4 {
		t.Fatalf("violations %d, want 4:\n%s", len(r.violations), strings.Join(r.violations, "\n"))
	}
	for i, want := range []string{"but the CLI reported partition 1 from 50 to 30", "is not one the harness made", "nobody in the run made it", "(entry #11, busy-forward) is not in the fence log"} {
		if !strings.Contains(r.violations[i], want) {
			t.Errorf("violation %d: %q, want %q in it", i, r.violations[i], want)
		}
	}
}

// A batch rejected because an offsets reset moved its partition back may
// be cut again and committed, with the same claim and token, after the
// reset; that commit is no contradiction of the rejection. One that came
// before the rejection, or with no reset back over it, is.
func TestRerunAfterReset(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 12, 52, 1, 455e6, time.UTC)
	part := sink.Partition{Group: groupName, Topic: topicName, Partition: 1}
	tok := sink.Token{Epoch: 3}
	reset := history.Entry{ID: 10, Kind: "reset", Partition: part, Owner: resetActor, From: 939, To: 926}
	again := history.Entry{ID: 20, Kind: "commit", Partition: part, Token: tok, Owner: "m", From: 939, To: 940}
	c := &runCheck{h: &history.History{Log: []history.Entry{reset, again}}}
	rej := batchEvent{Partition: 1, Token: tok.String(), Member: "m", From: 939, To: 940, At: t0}
	at := map[int64]time.Time{10: t0.Add(-5 * time.Millisecond), 20: t0.Add(300 * time.Millisecond)}
	if !c.rerun(again, rej, at) {
		t.Error("the range committed again after the reset counts against the rejection")
	}
	at[20] = t0.Add(time.Millisecond) // committed as the rejection was logged: the rejected batch itself
	if c.rerun(again, rej, at) {
		t.Error("a commit at the rejection's time is excused")
	}
	at[20] = t0.Add(300 * time.Millisecond)
	c.h.Log = []history.Entry{again} // no reset back over it
	if c.rerun(again, rej, at) {
		t.Error("a commit with no reset before it is excused")
	}
	fwd := history.Entry{ID: 10, Kind: "reset", Partition: part, Owner: resetActor, From: 930, To: 950}
	c.h.Log = []history.Entry{fwd, again} // a reset forward does not run anything again
	if c.rerun(again, rej, at) {
		t.Error("a reset forward excuses a commit")
	}
}
