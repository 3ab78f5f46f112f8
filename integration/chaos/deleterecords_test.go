package chaos

// The delete-records fault, and the harness as the operator who
// acknowledges the log-truncated holds it causes (docs/fencing.md, "The
// log's identity": a log that moves under a running lane is held, not
// followed).
//
// A deletion removes a partition's records from its log start up to a new
// one, chosen in the middle of a burst of jobs produced just before, above
// the partition's stored next offset: jobs the workers had not processed
// yet are deleted. Each of them must end one of two ways, and not both: the
// lane had fetched it before the deletion and processes it (once), or a
// log-truncated hold names it among the jobs lost and an operator
// acknowledges that (the harness does, with `tenure admin holds
// acknowledge --actor chaos`). A deleted job that was neither is a job
// skipped in silence: the failure this fault is here to catch.

import (
	"context"
	"fmt"
	"maps"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/tenure-dev/tenure/internal/history"
	"github.com/tenure-dev/tenure/internal/tick"
	"github.com/tenure-dev/tenure/sink"
)

// Deletion modes, the delete-records fault's Mode.
const (
	// deleteLagging: the worker whose lane holds the partition is frozen
	// (SIGSTOP, 1-2s: well under the session timeout, so nothing is handed
	// off) while the burst is produced and the records deleted; it wakes up
	// with a fetch position below the new log start.
	deleteLagging = "lagging"
	// deleteLive: the same with every worker running: whether the lane had
	// fetched the deleted part of the burst is a race.
	deleteLive = "live"
)

var deleteModes = []string{deleteLagging, deleteLive}

// chaosActor is who the harness acknowledges holds as (the fence log's
// 'reset' entries carry it).
const chaosActor = "chaos"

// offRange is the offsets [from, to).
type offRange struct{ from, to int64 }

// offRanges is a set of offsets: sorted, disjoint, non-adjacent ranges.
type offRanges []offRange

// add returns rs with r in it.
func (rs offRanges) add(r offRange) offRanges {
	if r.to <= r.from {
		return rs
	}
	out := append(slices.Clone(rs), r)
	sort.Slice(out, func(i, j int) bool { return out[i].from < out[j].from })
	merged := out[:0]
	for _, x := range out {
		if n := len(merged); n > 0 && x.from <= merged[n-1].to {
			merged[n-1].to = max(merged[n-1].to, x.to)
			continue
		}
		merged = append(merged, x)
	}
	return merged
}

func (rs offRanges) contains(off int64) bool {
	for _, r := range rs {
		if r.from <= off && off < r.to {
			return true
		}
	}
	return false
}

// outside returns the parts of [from, to) that are not in rs.
func (rs offRanges) outside(from, to int64) []offRange {
	var out []offRange
	for _, r := range rs {
		if r.to <= from || r.from >= to {
			continue
		}
		if r.from > from {
			out = append(out, offRange{from, r.from})
		}
		from = max(from, r.to)
	}
	if from < to {
		out = append(out, offRange{from, to})
	}
	return out
}

// covers reports whether every offset of [from, to) is in rs.
func (rs offRanges) covers(from, to int64) bool { return len(rs.outside(from, to)) == 0 }

// deletion is one DeleteRecords the harness made.
type deletion struct {
	fault     *fault
	partition int32
	from, to  int64 // the offsets removed: the log start before, the log start it set
	next      int64 // the partition's stored next offset, read just before
	at        time.Time
	pending   bool // in flight: the partition's holds are judged once it has returned
}

// truncHold is a log-truncated hold the operator (the harness) saw.
type truncHold struct {
	hold      sink.Hold // as last read
	seen      time.Time
	explained *deletion // the deletion that set the log start it names; nil: not the harness's doing
	acked     time.Time // zero: not acknowledged by the harness
	atEnd     bool      // acknowledged at the end of the faults (acknowledgeLeftovers)
	ackOut    string    // what the CLI said
	attempts  int
	lastErr   string
	noted     bool // its finding at the end of the faults is recorded
}

// truncation is the run's deletions and the operator's record of the
// log-truncated holds.
type truncation struct {
	mu         sync.Mutex
	deletions  []*deletion
	holds      map[int64]*truncHold // by hold id
	violations []string             // holds the harness did not cause
	findings   []string

	store *sink.Store
	opMu  sync.Mutex // one operator pass at a time
	stop  context.CancelFunc
	done  chan struct{}
}

// explain returns the deletion that accounts for a log-truncated hold: the
// offsets it names lost ([NextOffset, LogStart)) were all removed by the
// harness's deletions of the partition; the deletion is the latest that
// removed the last of them. pending is true while a deletion of the
// partition is in flight (the hold may be its own): judge it later.
func (tr *truncation) explain(h sink.Hold) (d *deletion, pending bool) {
	var rs offRanges
	for _, x := range tr.deletions {
		if x.partition != h.Partition.Partition {
			continue
		}
		if x.pending {
			return nil, true
		}
		rs = rs.add(offRange{x.from, x.to})
	}
	if h.NextOffset < 0 || h.LogStart <= h.NextOffset || !rs.covers(h.NextOffset, h.LogStart) {
		return nil, false
	}
	for i := len(tr.deletions) - 1; i >= 0; i-- {
		if x := tr.deletions[i]; x.partition == h.Partition.Partition && x.from < h.LogStart && h.LogStart <= x.to {
			return x, false
		}
	}
	return nil, false
}

// deleteRecords is the delete-records fault: a burst of jobs produced to one
// partition and its log start moved into the middle of the burst
// (DeleteRecords), above the partition's stored next offset. Lagging: the
// worker that holds the partition (its fencing row's owner, a member id,
// matched with the members the workers logged claiming it) is frozen
// throughout; if the harness does not know it, the fault is live instead.
func (w *world) deleteRecords() {
	p := int32(w.rng.IntN(int(w.nparts())))
	mode := deleteModes[w.rng.IntN(len(deleteModes))]
	freeze := w.between(time.Second, 2*time.Second)
	n := 20 + w.rng.IntN(41)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	var frozen *slot
	if mode == deleteLagging {
		w.settle(15 * time.Second)
		owner, _, err := w.fenceOf(ctx, p)
		name := ""
		if err == nil {
			name = w.book.workerOf(owner, p)
		}
		for _, s := range w.slots {
			if name != "" && s.p.name == name && !s.p.exited() {
				frozen = s
			}
		}
		if frozen == nil {
			w.note("delete-records: partition %d's owner (member %q, worker %q, %v) is no running worker: live instead of lagging", p, owner, name, err)
			mode = deleteLive
		}
	}
	w.acting()
	target := fmt.Sprintf("partition %d", p)
	if frozen != nil {
		target += " of " + frozen.p.name
	}
	f := w.begin(kindDeleteRecs, mode, target)
	if frozen != nil {
		if err := frozen.p.pause(); err != nil {
			w.note("delete-records: %v", err)
		}
	}
	if err := w.deleteInBurst(ctx, f, p, n, frozen); err != nil {
		w.note("delete-records %s: %v", target, err)
	}
	w.mark(f)
	if frozen != nil && f.Mode == deleteLagging { // not resumed early (deleteInBurst)
		time.Sleep(time.Until(f.Injected.Add(freeze)))
		frozen.p.resume()
		if d := time.Since(f.Injected); d >= sessionTimeout {
			w.note("delete-records: %s was frozen %s, not under the session timeout %s: its partitions may have been handed off", frozen.p.name, d.Round(time.Millisecond), sessionTimeout)
		}
	}
	w.end(f)
}

// freezeBudget is how long a lagging deletion may keep its worker frozen
// before the deletion: past it, the worker is resumed first (the deletion
// is then live), so that the freeze stays under the session timeout.
const freezeBudget = 2500 * time.Millisecond

// settle waits, at most timeout, until every fault so far has recovered:
// a lagging deletion then freezes the worker that steadily holds its
// partition, and its burst is produced at once (a broker just restarted
// can take seconds to take it, which kept a worker frozen past the session
// timeout).
func (w *world) settle(timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		w.mu.Lock()
		steady := true
		for _, f := range w.faults {
			steady = steady && (!f.Recovered.IsZero() || f.MarkErr != nil)
		}
		w.mu.Unlock()
		if steady {
			return
		}
		w.sleep(100 * time.Millisecond)
	}
}

// deleteInBurst produces n jobs to partition p and deletes the partition's
// records up to the middle of them; frozen is the worker frozen meanwhile
// (lagging), or nil.
func (w *world) deleteInBurst(ctx context.Context, f *fault, p int32, n int, frozen *slot) error {
	lagging := frozen != nil
	_, next, err := w.fenceOf(ctx, p)
	if err != nil {
		return fmt.Errorf("reading the fencing row: %w", err)
	}
	var burst []job
	if lagging {
		// The burst's first job alone, and a moment for the broker to
		// answer with it the fetch the frozen worker may have had waiting
		// (a long poll): that answer, in the frozen process's socket, is
		// the lane's last fetch before the deletion. The rest of the burst
		// is not fetched until the worker wakes up.
		first, err := w.prod.burst(ctx, p, 1, w.rng)
		if err != nil {
			return fmt.Errorf("producing the burst: %w", err)
		}
		burst = first
		n--
		time.Sleep(200 * time.Millisecond)
	}
	rest, err := w.prod.burst(ctx, p, n, w.rng)
	burst = append(burst, rest...)
	if err != nil {
		return fmt.Errorf("producing the burst: %w", err)
	}
	if len(burst) < 2 {
		return fmt.Errorf("the burst has %d jobs", len(burst))
	}
	if took := time.Since(f.Injected); lagging && took > freezeBudget {
		frozen.p.resume()
		w.mu.Lock()
		f.Mode = deleteLive
		w.mu.Unlock()
		w.note("delete-records: producing the burst to partition %d took %s: %s resumed before the deletion, which is live instead of lagging",
			p, took.Round(time.Millisecond), frozen.p.name)
	}
	at := burst[len(burst)/2].Offset
	if at <= next {
		return fmt.Errorf("the burst's middle %d is not above the stored next offset %d: nothing deleted", at, next)
	}
	start, err := w.logStart(ctx, p)
	if err != nil {
		return err
	}
	if start >= at {
		return fmt.Errorf("the log already starts at %d, not below the burst's middle %d: nothing deleted", start, at)
	}
	d := &deletion{fault: f, partition: p, from: start, to: at, next: next, pending: true}
	w.trunc.mu.Lock()
	w.trunc.deletions = append(w.trunc.deletions, d)
	w.trunc.mu.Unlock()

	var offs kadm.Offsets
	offs.AddOffset(topicName, p, at, -1)
	resp, err := w.adm.DeleteRecords(ctx, offs)
	var low int64 = -1
	if err == nil {
		var r kadm.DeleteRecordsResponse
		if r, err = resp.On(topicName, p, nil); err == nil {
			low, err = r.LowWatermark, r.Err
		}
	}
	if err != nil {
		// Whether it deleted anything is what the log says now.
		if now, err2 := w.logStart(ctx, p); err2 == nil && now > start {
			low = now
		}
	}
	w.trunc.mu.Lock()
	defer w.trunc.mu.Unlock()
	d.pending, d.at = false, time.Now()
	if low <= start {
		w.trunc.deletions = slices.DeleteFunc(w.trunc.deletions, func(x *deletion) bool { return x == d })
		return fmt.Errorf("DeleteRecords to %d: %v; the log still starts at %d", at, err, start)
	}
	if low != at {
		w.trunc.findings = append(w.trunc.findings, fmt.Sprintf("delete-records: DeleteRecords of partition %d to offset %d (%v) left the log starting at %d", p, at, err, low))
	}
	d.to = low
	w.t.Logf("delete-records: partition %d: log start %d -> %d (stored next offset %d; burst %d jobs, offsets %d to %d)",
		p, start, low, next, len(burst), burst[0].Offset, burst[len(burst)-1].Offset)
	return nil
}

// fenceOf reads partition p's fencing row: its owner (a member id) and
// stored next offset.
func (w *world) fenceOf(ctx context.Context, p int32) (owner string, next int64, err error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	err = w.pool.QueryRow(ctx, `SELECT owner, next_offset FROM `+schemaName+`.fences WHERE consumer_group = $1 AND topic = $2 AND partition = $3`,
		groupName, topicName, p).Scan(&owner, &next)
	return owner, next, err
}

// logStart reads partition p's log start offset.
func (w *world) logStart(ctx context.Context, p int32) (int64, error) {
	offs, err := w.adm.ListStartOffsets(ctx, topicName)
	if err != nil {
		return 0, fmt.Errorf("listing log start offsets: %w", err)
	}
	o, ok := offs.Lookup(topicName, p)
	if !ok || o.Err != nil {
		return 0, fmt.Errorf("listing partition %d's log start: %v", p, o.Err)
	}
	return o.Offset, nil
}

// deletedRanges are, by partition, the offsets the harness's deletions
// removed.
func (w *world) deletedRanges() map[int32]offRanges {
	w.trunc.mu.Lock()
	defer w.trunc.mu.Unlock()
	out := map[int32]offRanges{}
	for _, d := range w.trunc.deletions {
		out[d.partition] = out[d.partition].add(offRange{d.from, d.to})
	}
	return out
}

// startOperator starts the harness's operator: every 250ms it reads the
// group's open holds, and acknowledges each log-truncated hold that names
// offsets the harness deleted, as an operator would once they have looked
// (`tenure admin holds acknowledge`, the real CLI). A log-truncated hold
// the harness did not cause is a violation, left for whoever reads the
// run (acknowledgeLeftovers lets it go at the end of the faults). It runs
// until the drain has caught up with the log.
func (w *world) startOperator() {
	store, err := sink.NewStore(w.pool, schemaName)
	if err != nil {
		w.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w.trunc.store, w.trunc.stop, w.trunc.done = store, cancel, make(chan struct{})
	w.trunc.holds = map[int64]*truncHold{}
	w.t.Cleanup(w.stopOperator)
	go func() {
		defer close(w.trunc.done)
		tick.Every(ctx, 250*time.Millisecond, func() { w.operate(ctx, false) })
	}()
}

// stopOperator stops the operator and waits for it (idempotent).
func (w *world) stopOperator() {
	if w.trunc.stop == nil {
		return
	}
	w.trunc.stop()
	<-w.trunc.done
}

// operate is one pass of the operator. At the end of the faults (final) it
// acknowledges every open log-truncated hold, each a finding.
func (w *world) operate(ctx context.Context, final bool) bool {
	w.trunc.opMu.Lock()
	defer w.trunc.opMu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	holds, err := w.trunc.store.OpenHolds(rctx, groupName)
	cancel()
	if err != nil {
		return false // Postgres is restarting: at the next pass
	}
	// The CLI acknowledges a partition's oldest hold that waits for an
	// operator: only that one can be acknowledged now.
	oldest := map[int32]sink.Hold{}
	for _, h := range holds {
		if _, ok := oldest[h.Partition.Partition]; !ok && h.Partition.Topic == topicName && h.Kind.NeedsAck() {
			oldest[h.Partition.Partition] = h
		}
	}
	ok := true
	for _, h := range holds {
		if h.Kind != sink.HoldLogTruncated || h.Partition.Topic != topicName {
			continue
		}
		p := h.Partition.Partition
		w.trunc.mu.Lock()
		th := w.trunc.holds[h.ID]
		if th == nil {
			d, pending := w.trunc.explain(h)
			if pending {
				w.trunc.mu.Unlock()
				ok = false
				continue
			}
			th = &truncHold{seen: time.Now(), explained: d}
			w.trunc.holds[h.ID] = th
			if d == nil {
				var dels []string
				for _, x := range w.trunc.deletions {
					if x.partition == p {
						dels = append(dels, fmt.Sprintf("[%d,%d)", x.from, x.to))
					}
				}
				w.trunc.violations = append(w.trunc.violations, fmt.Sprintf(
					"log-truncated hold #%d of partition %d (since %s, by %s) declares offsets %d to %d lost (log start %d, stored next offset %d): not a range the harness deleted (its deletions of the partition: %v); reason: %s",
					h.ID, p, h.Since.Format("15:04:05.000"), h.Owner, h.NextOffset, h.LogStart-1, h.LogStart, h.NextOffset, dels, h.Reason))
				w.t.Logf("operator: log-truncated hold #%d of partition %d names offsets %d to %d, which the harness did not delete: a violation, left open until the end of the faults",
					h.ID, p, h.NextOffset, h.LogStart-1)
			}
		}
		th.hold = h
		w.trunc.mu.Unlock()
		if th.explained == nil && !final {
			continue
		}
		if o := oldest[p]; o.ID != h.ID {
			if final && !th.noted {
				th.noted = true
				w.addTruncFinding("log-truncated hold #%d of partition %d waits behind its %s hold #%d (since %s): left unacknowledged",
					h.ID, p, o.Kind, o.ID, o.Since.Format("15:04:05.000"))
			}
			continue
		}
		if final && !th.noted {
			th.noted = true
			story := "the harness deleted those offsets"
			if th.explained == nil {
				story = "not the harness's doing (a violation)"
			}
			if th.attempts > 0 {
				story += fmt.Sprintf("; %d acknowledgements failed, the last: %s", th.attempts, th.lastErr)
			}
			w.addTruncFinding("log-truncated hold #%d of partition %d (offsets %d to %d, since %s, seen at +%s) was still unacknowledged at the end of the faults (%s): acknowledged then",
				h.ID, p, h.NextOffset, h.LogStart-1, h.Since.Format("15:04:05.000"), th.seen.Sub(w.start).Round(time.Millisecond), story)
		}
		out, err := w.acknowledgeHold(ctx, p)
		w.trunc.mu.Lock()
		th.attempts++
		if err != nil {
			th.lastErr = err.Error()
			ok = false
		} else {
			th.acked, th.atEnd, th.ackOut = time.Now(), final, out
		}
		w.trunc.mu.Unlock()
		if err == nil {
			w.t.Logf("operator: %s", out)
		}
	}
	return ok
}

func (w *world) addTruncFinding(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	w.trunc.mu.Lock()
	w.trunc.findings = append(w.trunc.findings, msg)
	w.trunc.mu.Unlock()
	w.t.Logf("finding: %s", msg)
}

// acknowledgeHold acknowledges partition p's oldest hold with the CLI.
func (w *world) acknowledgeHold(ctx context.Context, p int32) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, tenureBin, "admin", "holds", "acknowledge",
		"--group", groupName, "--topic", topicName, "--partition", strconv.Itoa(int(p)),
		"--brokers", w.brokerAddr, "--database-url", w.dbURL(), "--schema", schemaName, "--actor", chaosActor).CombinedOutput()
	s := strings.TrimSpace(string(out))
	if err != nil {
		return s, fmt.Errorf("tenure admin holds acknowledge: %v: %s", err, s)
	}
	if !strings.Contains(s, "acknowledged the "+string(sink.HoldLogTruncated)+" hold") {
		w.addTruncFinding("operator: acknowledging partition %d's log-truncated hold acknowledged another: %s", p, s)
	}
	return s, nil
}

// acknowledgeLeftovers is the end of the faults for the operator: every
// log-truncated hold still open is a finding and is acknowledged, so that
// the drain can finish.
func (w *world) acknowledgeLeftovers() {
	deadline := time.Now().Add(60 * time.Second)
	for !w.operate(context.Background(), true) {
		if time.Now().After(deadline) {
			w.t.Errorf("the log-truncated holds could not all be acknowledged within 60s of the end of the faults")
			return
		}
		w.sleep(500 * time.Millisecond)
	}
}

// deletedReport is what the deleted jobs came to.
type deletedReport struct {
	deletions, lagging, live, laggingHeld, liveHeld int
	jobs, processed, lost, silent                   int // acknowledged jobs at deleted offsets, and how each ended
	stake, stakeProcessed, stakeLost                int // those at or above the stored next offset read before their deletion
	holds, holdsAtEnd                               int // log-truncated holds acknowledged by the harness, at the end of the faults
	reappeared                                      int
	toHold, toAck                                   []time.Duration
	violations, findings                            []string
	done                                            map[pos]job // the deleted jobs processed before the deletion
	skippedByReset                                  int         // deleted jobs an operator's offsets reset had skipped
}

// checkDeleted checks every acknowledged job at an offset the harness
// deleted: processed exactly once (exported or dead-lettered: its lane had
// fetched it before the deletion), or inside the range a log-truncated hold
// declared lost and the harness acknowledged; never both, never neither
// (skipped in silence). reappeared are the deleted offsets the log read
// back still has (kfake); log is the fence log, whose 'reset' entries by
// the harness must skip exactly what the holds declared lost.
func (w *world) checkDeleted(acked []job, dels map[int32]offRanges, reappeared map[int32][]int64, writes map[pos][]history.Write, dead map[pos]int,
	log []history.Entry, cuts map[int32]int64) deletedReport {
	r := deletedReport{done: map[pos]job{}}
	deletions, holds := w.truncSnapshot(&r)
	held, lost := checkTruncHolds(&r, holds, log)
	countDeletions(&r, deletions, held)
	silent := checkDeletedJobs(&r, acked, dels, deletions, lost, writes, dead, readOpRecord(log, cuts))
	w.reportSilent(&r, silent, deletions)
	w.checkReappeared(&r, reappeared, deletions, dels)
	return r
}

// truncSnapshot copies the operator's record under its lock: the
// deletions, the holds by id, and its violations and findings into r.
func (w *world) truncSnapshot(r *deletedReport) ([]*deletion, []*truncHold) {
	w.trunc.mu.Lock()
	deletions := slices.Clone(w.trunc.deletions)
	var holds []*truncHold
	for _, th := range w.trunc.holds {
		holds = append(holds, th)
	}
	r.violations = append(r.violations, w.trunc.violations...)
	r.findings = append(r.findings, w.trunc.findings...)
	w.trunc.mu.Unlock()
	sort.Slice(holds, func(i, j int) bool { return holds[i].hold.ID < holds[j].hold.ID })
	return deletions, holds
}

// lostBy is a range of offsets an acknowledged log-truncated hold declared
// lost.
type lostBy struct {
	offRange
	th *truncHold
}

// checkTruncHolds counts the acknowledged log-truncated holds and checks
// that each acknowledgement skipped exactly what its hold declared lost.
// It returns the deletions a hold followed, and the lost ranges by
// partition.
func checkTruncHolds(r *deletedReport, holds []*truncHold, log []history.Entry) (map[*deletion]bool, map[int32][]lostBy) {
	held := map[*deletion]bool{}
	lost := map[int32][]lostBy{}
	for _, th := range holds {
		if th.acked.IsZero() {
			continue // replaced by the same finding recorded again, which was acknowledged
		}
		h := th.hold
		p := h.Partition.Partition
		r.holds++
		if th.atEnd {
			r.holdsAtEnd++
		}
		lost[p] = append(lost[p], lostBy{offRange{h.NextOffset, h.LogStart}, th})
		if d := th.explained; d != nil {
			held[d] = true
			r.toHold = append(r.toHold, max(0, h.Since.Sub(d.at)))
		}
		r.toAck = append(r.toAck, th.acked.Sub(h.Since))
		// The acknowledgement must have skipped exactly what the hold
		// declared lost.
		var reset *history.Entry
		for i := range log {
			if e := log[i]; e.Kind == "reset" && e.Owner == chaosActor && e.Partition.Topic == topicName && e.Partition.Partition == p && e.From == h.NextOffset {
				reset = &log[i]
			}
		}
		switch {
		case reset == nil:
			r.findings = append(r.findings, fmt.Sprintf("log-truncated hold #%d of partition %d (offsets %d to %d): the fence log has no reset by %s from %d (the CLI said: %s)",
				h.ID, p, h.NextOffset, h.LogStart-1, chaosActor, h.NextOffset, th.ackOut))
		case reset.To != h.LogStart:
			r.findings = append(r.findings, fmt.Sprintf("log-truncated hold #%d of partition %d declared offsets %d to %d lost, but its acknowledgement moved the next offset from %d to %d (reset #%d; the CLI said: %s)",
				h.ID, p, h.NextOffset, h.LogStart-1, reset.From, reset.To, reset.ID, th.ackOut))
		}
	}
	return held, lost
}

// countDeletions counts the deletions by mode, and those a hold followed.
func countDeletions(r *deletedReport, deletions []*deletion, held map[*deletion]bool) {
	for _, d := range deletions {
		r.deletions++
		if d.fault.Mode == deleteLagging {
			r.lagging++
			if held[d] {
				r.laggingHeld++
			}
		} else {
			r.live++
			if held[d] {
				r.liveHeld++
			}
		}
	}
}

// atStake reports whether the job at p/off was at or above the stored next
// offset read before the (first) deletion that removed it.
func atStake(deletions []*deletion, p int32, off int64) bool {
	for _, d := range deletions {
		if d.partition == p && d.from <= off && off < d.to {
			return off >= d.next
		}
	}
	return false
}

// opRecord is what the operator's record says of each offset
// (offsetsreset_test.go): a job ran once per commit that covered it (twice
// if an offsets reset moved back over it), and not at all if a reset moved
// forward past it first. Below a pruned partition's cut the commits are
// gone: once.
type opRecord struct {
	covered        map[pos]int
	skippedByReset map[int32][]offRange
	cuts           map[int32]int64
}

// readOpRecord reads the commits and the operator's offsets resets of the
// fence log.
func readOpRecord(log []history.Entry, cuts map[int32]int64) opRecord {
	o := opRecord{covered: map[pos]int{}, skippedByReset: map[int32][]offRange{}, cuts: cuts}
	for _, e := range log {
		if e.Partition.Topic != topicName {
			continue
		}
		switch {
		case e.Kind == "commit":
			for off := e.From; off < e.To; off++ {
				o.covered[pos{e.Partition.Partition, off}]++
			}
		case e.Kind == "reset" && e.Owner == resetActor && e.To > e.From:
			o.skippedByReset[e.Partition.Partition] = append(o.skippedByReset[e.Partition.Partition], offRange{e.From, e.To})
		}
	}
	return o
}

// want is how many times the job at ps ran by the record.
func (o opRecord) want(ps pos) int {
	if b, ok := o.cuts[ps.p]; ok && ps.off < b {
		return 1
	}
	return o.covered[ps]
}

// resetSkipped reports whether an operator's offsets reset moved forward
// past ps.
func (o opRecord) resetSkipped(ps pos) bool {
	for _, rg := range o.skippedByReset[ps.p] {
		if rg.from <= ps.off && ps.off < rg.to {
			return true
		}
	}
	return false
}

// silentRun is consecutive deleted jobs of a partition skipped in silence.
type silentRun struct {
	p        int32
	from, to int64 // offsets of the first and the last job
	n        int
}

// checkDeletedJobs judges each acknowledged job at a deleted offset, in
// partition and offset order, and returns the runs skipped in silence.
func checkDeletedJobs(r *deletedReport, acked []job, dels map[int32]offRanges, deletions []*deletion, lost map[int32][]lostBy,
	writes map[pos][]history.Write, dead map[pos]int, rec opRecord) []silentRun {
	var silent []silentRun
	inRun := false // the previous deleted job of the partition was skipped too
	sorted := slices.Clone(acked)
	sort.Slice(sorted, func(i, j int) bool {
		if sorted[i].Partition != sorted[j].Partition {
			return sorted[i].Partition < sorted[j].Partition
		}
		return sorted[i].Offset < sorted[j].Offset
	})
	for _, j := range sorted {
		if !dels[j.Partition].contains(j.Offset) {
			continue
		}
		ps := pos{j.Partition, j.Offset}
		stake := atStake(deletions, j.Partition, j.Offset)
		r.jobs++
		if stake {
			r.stake++
		}
		n := len(writes[ps]) + dead[ps]
		want := rec.want(ps)
		var in *truncHold
		for _, l := range lost[j.Partition] {
			if l.from <= j.Offset && j.Offset < l.to {
				in = l.th
			}
		}
		switch {
		case n == 0 && in != nil:
			r.lost++
			if stake {
				r.stakeLost++
			}
		case n == 0 && want == 0 && rec.resetSkipped(ps):
			// An operator's offsets reset skipped it before the deletion.
			r.skippedByReset++
		case n == 0:
			r.silent++
			if k := len(silent); inRun && silent[k-1].p == j.Partition {
				// Consecutive acknowledged jobs of the partition: one run.
				silent[k-1].to, silent[k-1].n = j.Offset, silent[k-1].n+1
			} else {
				silent = append(silent, silentRun{j.Partition, j.Offset, j.Offset, 1})
			}
			inRun = true
			continue
		case in != nil:
			r.violations = append(r.violations, fmt.Sprintf("job seq %d at %s/%d/%d was processed (%d effects, %d dead letters) and log-truncated hold #%d declared offsets %d to %d lost",
				j.Seq, topicName, j.Partition, j.Offset, len(writes[ps]), dead[ps], in.hold.ID, in.hold.NextOffset, in.hold.LogStart-1))
		case n != max(want, 1):
			r.violations = append(r.violations, fmt.Sprintf("job seq %d at %s/%d/%d, deleted, was processed %d times (%d effects, %d dead letters); %d commits covered it",
				j.Seq, topicName, j.Partition, j.Offset, n, len(writes[ps]), dead[ps], want))
		default:
			r.processed++
			if stake {
				r.stakeProcessed++
			}
			r.done[ps] = j
		}
		inRun = false
	}
	return silent
}

// reportSilent makes each run skipped in silence a violation, naming the
// deletion that removed it.
func (w *world) reportSilent(r *deletedReport, silent []silentRun, deletions []*deletion) {
	for _, s := range silent {
		var by string
		for _, d := range deletions {
			if d.partition == s.p && d.from <= s.from && s.from < d.to {
				by = fmt.Sprintf("DeleteRecords at +%s (%s), log start %d -> %d, stored next offset %d before it",
					d.at.Sub(w.start).Round(time.Millisecond), d.fault.Mode, d.from, d.to, d.next)
				break
			}
		}
		r.violations = append(r.violations, fmt.Sprintf("skipped in silence: %d acknowledged jobs of partition %d at offsets %d to %d, deleted by %s, were neither processed nor declared lost by a log-truncated hold",
			s.n, s.p, s.from, s.to, by))
	}
}

// checkReappeared judges the deleted records the log has again: kfake
// keeps a DeleteRecords log start only in the snapshot of a clean
// shutdown, and rebuilds it from its segments (the first batch left on
// disk) after a SIGKILL. Expected after a broker SIGKILL that followed a
// deletion of the partition; anything else is a finding.
func (w *world) checkReappeared(r *deletedReport, reappeared map[int32][]int64, deletions []*deletion, dels map[int32]offRanges) {
	w.mu.Lock()
	faults := slices.Clone(w.faults)
	w.mu.Unlock()
	for _, p := range slices.Sorted(maps.Keys(reappeared)) {
		offs := reappeared[p]
		if len(offs) == 0 {
			continue
		}
		r.reappeared += len(offs)
		var first time.Time // the partition's first deletion
		for _, d := range deletions {
			if d.partition == p && (first.IsZero() || d.at.Before(first)) {
				first = d.at
			}
		}
		killed := false
		for _, f := range faults {
			killed = killed || (f.Kind == kindBrokerRst && f.Mode == "kill" && f.Injected.After(first))
		}
		msg := fmt.Sprintf("kfake: %d records of partition %d that DeleteRecords had removed are in the log again (offsets %d to %d; deleted: %v); left out of the checks as deleted",
			len(offs), p, offs[0], offs[len(offs)-1], dels[p])
		if killed {
			w.t.Logf("%s: a broker SIGKILL followed the deletion (kfake rebuilds the log start from its segments after a crash)", msg)
			continue
		}
		r.findings = append(r.findings, msg+", and no broker SIGKILL followed the deletion")
	}
}

// summary is the deleted jobs' lines of the run's summary.
func (r deletedReport) summary() string {
	if r.deletions == 0 {
		return "deleted:     no records deleted in this run\n"
	}
	s := fmt.Sprintf("deleted:     %d DeleteRecords (lagging %d, %d held; live %d, %d held): %d acknowledged jobs deleted, %d processed before the deletion, %d reported lost by holds (%d log-truncated holds acknowledged by the harness, %d at the end of the faults), %d skipped by an operator's offsets reset before, %d skipped in silence\n",
		r.deletions, r.lagging, r.laggingHeld, r.live, r.liveHeld, r.jobs, r.processed, r.lost, r.holds, r.holdsAtEnd, r.skippedByReset, r.silent)
	s += fmt.Sprintf("             at or above the stored next offset read before the deletion: %d (%d processed, %d lost); hold after the deletion p50/max %s, acknowledged after the hold p50/max %s",
		r.stake, r.stakeProcessed, r.stakeLost, p50max(r.toHold), p50max(r.toAck))
	if r.reappeared > 0 {
		s += fmt.Sprintf("; %d deleted records back in the log (kfake after a SIGKILL)", r.reappeared)
	}
	return s + "\n"
}

func TestOffRanges(t *testing.T) {
	var rs offRanges
	rs = rs.add(offRange{10, 20}).add(offRange{0, 5}).add(offRange{5, 8}).add(offRange{15, 30}).add(offRange{40, 40})
	if want := (offRanges{{0, 8}, {10, 30}}); !slices.Equal(rs, want) {
		t.Fatalf("ranges %v, want %v", rs, want)
	}
	for off, want := range map[int64]bool{0: true, 7: true, 8: false, 9: false, 10: true, 29: true, 30: false, -1: false} {
		if got := rs.contains(off); got != want {
			t.Errorf("contains(%d) = %v, want %v", off, got, want)
		}
	}
	if got, want := rs.outside(0, 35), []offRange{{8, 10}, {30, 35}}; !slices.Equal(got, want) {
		t.Errorf("outside(0, 35) = %v, want %v", got, want)
	}
	if got, want := rs.outside(-3, 2), []offRange{{-3, 0}}; !slices.Equal(got, want) {
		t.Errorf("outside(-3, 2) = %v, want %v", got, want)
	}
	if got := rs.outside(3, 7); len(got) != 0 {
		t.Errorf("outside(3, 7) = %v, want none", got)
	}
	if got := offRanges(nil).outside(4, 6); !slices.Equal(got, []offRange{{4, 6}}) {
		t.Errorf("no ranges: outside(4, 6) = %v", got)
	}
	if !rs.covers(10, 30) || rs.covers(7, 11) || !rs.covers(5, 5) {
		t.Errorf("covers: wrong")
	}
}

// A log-truncated hold is the harness's doing only if every offset it
// declares lost was deleted by the harness.
func TestExplainHold(t *testing.T) {
	hold := func(p int32, next, start int64) sink.Hold {
		return sink.Hold{Partition: sink.Partition{Group: groupName, Topic: topicName, Partition: p}, Kind: sink.HoldLogTruncated, NextOffset: next, LogStart: start}
	}
	d1 := &deletion{partition: 2, from: 0, to: 100}
	d2 := &deletion{partition: 2, from: 100, to: 150}
	tr := &truncation{deletions: []*deletion{d1, d2}}
	for _, c := range []struct {
		h    sink.Hold
		want *deletion
	}{
		{hold(2, 90, 100), d1},
		{hold(2, 120, 150), d2},
		{hold(2, 90, 150), d2},   // across both
		{hold(2, 140, 160), nil}, // 150 to 159 were not deleted
		{hold(2, 100, 100), nil}, // nothing lost
		{hold(2, -1, 100), nil},  // unknown next offset
		{hold(3, 10, 20), nil},   // another partition
	} {
		if got, pending := tr.explain(c.h); got != c.want || pending {
			t.Errorf("hold [%d,%d) of %d: got %v (pending %v), want %v", c.h.NextOffset, c.h.LogStart, c.h.Partition.Partition, got, pending, c.want)
		}
	}
	tr.deletions = append(tr.deletions, &deletion{partition: 2, from: 150, to: 170, pending: true})
	if _, pending := tr.explain(hold(2, 140, 160)); !pending {
		t.Errorf("a hold of a partition with a deletion in flight must wait")
	}
	if _, pending := tr.explain(hold(3, 10, 20)); pending {
		t.Errorf("a hold of another partition need not wait")
	}
}

// Every deleted job is processed once or declared lost, never both, never
// neither.
func TestCheckDeleted(t *testing.T) {
	start := time.Now()
	w := &world{start: start}
	f := &fault{Kind: kindDeleteRecs, Mode: deleteLagging, Injected: start}
	d := &deletion{fault: f, partition: 1, from: 0, to: 10, next: 5, at: start.Add(time.Second)}
	w.trunc.deletions = []*deletion{d}
	h := sink.Hold{ID: 7, Partition: sink.Partition{Group: groupName, Topic: topicName, Partition: 1}, Kind: sink.HoldLogTruncated,
		NextOffset: 7, LogStart: 10, Since: start.Add(1500 * time.Millisecond)}
	w.trunc.holds = map[int64]*truncHold{7: {hold: h, explained: d, acked: start.Add(2 * time.Second)}}
	var acked []job
	for off := int64(0); off < 12; off++ {
		acked = append(acked, job{Seq: off + 100, Key: "k", Partition: 1, Offset: off})
	}
	writes := map[pos][]history.Write{}
	for _, off := range []int64{0, 1, 2, 3, 3, 4, 5, 8, 10} { // 3 twice, 8 also declared lost
		writes[pos{1, off}] = append(writes[pos{1, off}], history.Write{Key: "k", Topic: topicName, Partition: 1, Offset: off})
	}
	dead := map[pos]int{{1, 11}: 1}
	log := []history.Entry{{ID: 50, Kind: "reset", Partition: h.Partition, Owner: chaosActor, From: 7, To: 10}}
	dels := map[int32]offRanges{1: {{0, 10}}}
	r := w.checkDeleted(acked, dels, nil, writes, dead, log, nil)
	if r.jobs != 10 || r.processed != 5 || r.lost != 2 || r.silent != 1 || r.stake != 5 || r.stakeProcessed != 1 || r.stakeLost != 2 {
		t.Errorf("counts: %+v", r)
	}
	if len(r.done) != 5 || r.holds != 1 || r.laggingHeld != 1 || len(r.findings) != 0 {
		t.Errorf("done %d, holds %d, lagging held %d, findings %v", len(r.done), r.holds, r.laggingHeld, r.findings)
	}
	if len(r.violations) != 3 {
		t.Fatalf("violations %d, want 3 (twice, both, silent):\n%s", len(r.violations), strings.Join(r.violations, "\n"))
	}
	for i, want := range []string{"was processed 2 times", "declared offsets 7 to 9 lost", "skipped in silence: 1 acknowledged jobs of partition 1 at offsets 6 to 6"} {
		if !strings.Contains(r.violations[i], want) {
			t.Errorf("violation %d: %q, want %q in it", i, r.violations[i], want)
		}
	}
}

// An operator's offsets reset over offsets that are deleted later: a job a
// reset moved forward past was never processed, and one a reset moved back
// over was processed once per commit that covered it. Neither is a
// violation of the deleted jobs' check (the soaks reported both as one
// before it read the operator's record).
func TestCheckDeletedAcrossOffsetsResets(t *testing.T) {
	start := time.Now()
	w := &world{start: start}
	f := &fault{Kind: kindDeleteRecs, Mode: deleteLive, Injected: start}
	w.trunc.deletions = []*deletion{{fault: f, partition: 1, from: 0, to: 20, next: 20, at: start.Add(time.Second)}}
	p := sink.Partition{Group: groupName, Topic: topicName, Partition: 1}
	var acked []job
	for off := int64(0); off < 20; off++ {
		acked = append(acked, job{Seq: off, Key: "k", Partition: 1, Offset: off})
	}
	writes := map[pos][]history.Write{}
	add := func(from, to int64) {
		for off := from; off < to; off++ {
			writes[pos{1, off}] = append(writes[pos{1, off}], history.Write{Key: "k", Topic: topicName, Partition: 1, Offset: off})
		}
	}
	add(0, 5)
	add(3, 5) // run again after the reset back from 5 to 3
	add(5, 8)
	add(12, 20)
	log := []history.Entry{
		{ID: 1, Kind: "commit", Partition: p, From: 0, To: 5},
		{ID: 2, Kind: "reset", Partition: p, Owner: resetActor, From: 5, To: 3},
		{ID: 3, Kind: "commit", Partition: p, From: 3, To: 8},
		{ID: 4, Kind: "reset", Partition: p, Owner: resetActor, From: 8, To: 12}, // skips 8 to 11
		{ID: 5, Kind: "commit", Partition: p, From: 12, To: 20},
	}
	r := w.checkDeleted(acked, map[int32]offRanges{1: {{0, 20}}}, nil, writes, nil, log, nil)
	if len(r.violations) != 0 {
		t.Fatalf("violations:\n%s", strings.Join(r.violations, "\n"))
	}
	if r.processed != 16 || r.skippedByReset != 4 || r.silent != 0 {
		t.Errorf("processed %d, skipped by a reset %d, silent %d; want 16, 4, 0", r.processed, r.skippedByReset, r.silent)
	}
	// Once is not enough where two commits covered a job, and a job the
	// reset did not skip is still silent.
	delete(writes, pos{1, 3})
	writes[pos{1, 3}] = writes[pos{1, 4}][:1]
	delete(writes, pos{1, 13})
	r = w.checkDeleted(acked, map[int32]offRanges{1: {{0, 20}}}, nil, writes, nil, log, nil)
	if len(r.violations) != 2 || !strings.Contains(r.violations[0], "processed 1 times") || !strings.Contains(r.violations[1], "skipped in silence") {
		t.Errorf("violations:\n%s", strings.Join(r.violations, "\n"))
	}
}
