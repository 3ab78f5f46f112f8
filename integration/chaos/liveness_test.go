package chaos

// The liveness check (DESIGN.md, "Liveness: safe is not enough"). The
// history check says that nothing visible broke a promise; this one says
// that nothing stopped: every partition with jobs waiting makes progress,
// or is held with a reason the run expected.
//
// The bound B. Once nothing is being done to the system, a partition with
// jobs waiting must move within
//
//	B = session timeout + claim timeout + margin
//
// read from the worker command line the harness builds (boundOf): the
// coordinator notices a member gone after a session timeout; the claim of
// the partition's new assignment is bounded by the claim timeout (past it
// the partition is held as stalled and its lane claims again by itself: a
// claim that never succeeds is the wedge this bound is there to catch, not
// a reason to wait longer); and the margin is a rebalance timeout (kfake waits that long for
// a member that died in the middle of a rebalance) plus the longest retry
// backoff of a lane (consumer.Config.RetryBackoffMax, 5s: a lane retrying
// a database error waits up to that between attempts). With the run's
// flags: 3s + 30s + (10s + 5s) = 48s.
//
// What is sampled. Every second (liveSampleEvery), per partition of the
// topic: its log's end (the high watermark), its stored next offset (the
// fencing row; a partition with no row yet starts at 0) and its open holds.
// A partition is waiting when its next offset is below the log's end. A
// stall is a maximal stretch of samples in which it is waiting at the same
// next offset; a stall ends when the offset moves (either way: an offsets
// reset back is a move) or the partition stops waiting.
//
// Quiet time. While the harness acts on the system (a fault, from the
// moment its function starts, preparatory restarts included, to the end of
// its fault; then its recovery allowance: for a network cut, as long again
// as the cut lasted, since TCP's retransmissions back off that far; none
// for the others, whose recovery B covers) partitions may stop for
// reasons the run made. Every other moment is quiet: the gaps between
// faults once the previous fault's allowance has passed, a fault's own
// quiet tail (offsets-reset idle waits there, traffic held back, for the
// lane to notice the reset), and everything after the fault schedule,
// the drain included. A stall's clock runs only in quiet time, and not
// while the partition is held with a reason the run expected: a
// log-truncated hold that names offsets the harness deleted (until the
// harness acknowledges it), an ahead-of-log hold after a broker SIGKILL
// (kfake lost records; never acknowledged here). A stall whose clock
// passes B is a wedge: a violation, reported at once with the partition,
// its stall, the state consumer.Describe gives for it (the coordinator's
// member and epoch, the fencing row, the lag, tenure's state and reason:
// what `tenure admin assignments` prints) and the last lines the workers
// logged about it. The clock adds up the quiet stretches of a stall
// rather than asking for one quiet window longer than B: the gaps between
// faults are seconds, and a partition left unowned for minutes (kgo's
// metadata refresh comes every 5 minutes) would otherwise only be caught
// if it lasted to the end of the schedule.
//
// Workers too: a worker that stepped down (its database did not answer)
// and has not joined the group again after B of quiet time is a wedge
// (the database answers again: a worker out of the group for good is a
// replica lost in silence).
//
// The drain at the end must catch up with the log within B of the start
// of the last quiet window (the end of the last fault's allowance, or the
// drain's start if that is later), a sample's length more so that the
// check can report first; past it the run fails as STUCK.
//
// The summary gives the bound, the quiet time, the wedges (must be 0), and
// per fault kind the longest stall (the longest time a waiting partition's
// next offset did not move, however much of it was quiet) attributed to the
// fault injected last before the stall began (or within a sample after:
// the stall's start is known to a sample), with its quiet part.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/internal/tick"
	"github.com/tenure-dev/tenure/sink"
)

// liveSampleEvery is how often the liveness check samples the partitions.
const liveSampleEvery = time.Second

// Defaults of the worker that the harness does not pass as flags: tenure
// worker has no flag for the claim timeout (consumer.Config.ClaimTimeout,
// default 30s) or the retry backoff (RetryBackoffMax, default 5s).
const (
	workerClaimTimeout    = 30 * time.Second
	workerRetryBackoffMax = 5 * time.Second
	workerSessionDefault  = 45 * time.Second // --session-timeout's default
	workerRebalanceDef    = 60 * time.Second // --rebalance-timeout's default
)

// liveBound is B and what it is made of.
type liveBound struct {
	session, claim, rebalance, backoff time.Duration
}

func (b liveBound) margin() time.Duration { return b.rebalance + b.backoff }

// total is B.
func (b liveBound) total() time.Duration { return b.session + b.claim + b.margin() }

func (b liveBound) String() string {
	return fmt.Sprintf("%s = session timeout %s + claim timeout %s + margin %s (rebalance timeout %s + retry backoff max %s)",
		b.total(), b.session, b.claim, b.margin(), b.rebalance, b.backoff)
}

// boundOf derives B from a worker's command line: its --session-timeout,
// --rebalance-timeout and --claim-timeout (the defaults where absent).
func boundOf(args []string) (liveBound, error) {
	b := liveBound{session: workerSessionDefault, claim: workerClaimTimeout, rebalance: workerRebalanceDef, backoff: workerRetryBackoffMax}
	for i := 0; i < len(args); i++ {
		name, val, inline := strings.Cut(args[i], "=")
		var dst *time.Duration
		switch name {
		case "--session-timeout":
			dst = &b.session
		case "--rebalance-timeout":
			dst = &b.rebalance
		case "--claim-timeout":
			dst = &b.claim
		default:
			continue
		}
		if !inline {
			if i+1 == len(args) {
				return b, fmt.Errorf("%s without a value", name)
			}
			i++
			val = args[i]
		}
		d, err := time.ParseDuration(val)
		if err != nil {
			return b, fmt.Errorf("%s %q: %v", name, val, err)
		}
		*dst = d
	}
	return b, nil
}

// span is the harness acting on the system: one fault's function, from
// its start (a restart that prepares the fault included) to the end of the
// faults it injected (or its return, if it injected none).
type span struct {
	kind   string
	from   time.Time
	closed time.Time // the function returned; zero while it runs
	faults []*fault
}

// end is when the span stopped disturbing the system, and its recovery
// allowance; ok is false while it still does. Called with w.mu held.
func (sp *span) end() (at time.Time, allow time.Duration, ok bool) {
	if len(sp.faults) > 0 {
		for _, f := range sp.faults {
			if f.Ended.IsZero() {
				return time.Time{}, 0, false
			}
			if f.Ended.After(at) {
				at = f.Ended
			}
			allow = max(allow, recoveryAllowance(f))
		}
		return at, allow, true
	}
	return sp.closed, 0, !sp.closed.IsZero()
}

// recoveryAllowance is how long after its end a fault may still keep
// partitions from moving beyond B: after a network cut, TCP's
// retransmission interval has backed off about as long as the cut lasted
// (netfault's Heal), so a connection may take that long to carry data
// again. Every other fault's recovery is what B covers.
func recoveryAllowance(f *fault) time.Duration {
	if f.Net != nil {
		return f.Ended.Sub(f.Injected)
	}
	return 0
}

// interval is [from, to); a zero to is open-ended.
type interval struct{ from, to time.Time }

// openSpan records that the harness starts acting (a fault's function).
func (w *world) openSpan(kind string) *span {
	sp := &span{kind: kind, from: time.Now()}
	w.mu.Lock()
	w.live.spans = append(w.live.spans, sp)
	w.live.cur = sp
	w.mu.Unlock()
	return sp
}

// acting moves the start of the current span to now: a fault's function
// that first waits (for the previous faults to recover, for a partition to
// drain) calls it once it starts to act, so that the wait is quiet time.
func (w *world) acting() {
	w.mu.Lock()
	if w.live.cur != nil && len(w.live.cur.faults) == 0 {
		w.live.cur.from = time.Now()
	}
	w.mu.Unlock()
}

// quietTail waits, once a fault has ended, until done() says that what it
// is about has recovered, or until B and two samples of quiet time have
// passed since the tail began (the liveness check has then reported a
// wedge, if there is one); at most 3 minutes in all. It returns when done()
// said so, and whether it did. The wait is the fault's quiet tail: nothing
// else is injected meanwhile.
func (w *world) quietTail(done func() bool) (time.Time, bool) {
	start := time.Now()
	limit := w.live.bound.total() + 2*liveSampleEvery
	for time.Since(start) < 3*time.Minute {
		if done() {
			return time.Now(), true
		}
		w.mu.Lock()
		quiet := quietBetween(w.disturbed(), start, time.Now())
		w.mu.Unlock()
		if quiet > limit {
			return time.Time{}, false
		}
		w.sleep(100 * time.Millisecond)
	}
	return time.Time{}, false
}

func (w *world) closeSpan(sp *span) {
	w.mu.Lock()
	sp.closed = time.Now()
	if w.live.cur == sp {
		w.live.cur = nil
	}
	w.mu.Unlock()
}

// addFault records f, injected now, in the run and in the current span.
func (w *world) addFault(f *fault) {
	w.mu.Lock()
	w.faults = append(w.faults, f)
	if w.live.cur != nil {
		w.live.cur.faults = append(w.live.cur.faults, f)
	}
	w.mu.Unlock()
}

// disturbed are the times the harness was acting, allowances included,
// sorted by start. Called with w.mu held.
func (w *world) disturbed() []interval {
	var out []interval
	for _, sp := range w.live.spans {
		end, allow, ok := sp.end()
		iv := interval{from: sp.from}
		if ok {
			iv.to = end.Add(allow)
		}
		out = append(out, iv)
	}
	return out
}

// quietBetween is how much of [a, b) no disturbance covers.
func quietBetween(ds []interval, a, b time.Time) time.Duration {
	if !b.After(a) {
		return 0
	}
	quiet := b.Sub(a)
	covered := a // [a, covered) is accounted for
	for _, d := range ds {
		from, to := d.from, d.to
		if to.IsZero() || to.After(b) {
			to = b
		}
		if from.Before(covered) {
			from = covered
		}
		if !to.After(from) {
			continue
		}
		quiet -= to.Sub(from)
		covered = to
	}
	return quiet
}

// quietSince is when the current quiet window began: the end of the last
// disturbance (allowance included), or zero while one lasts. Called with
// w.mu held.
func (w *world) quietSince(now time.Time) time.Time {
	var last time.Time
	for _, d := range w.disturbed() {
		if d.to.IsZero() || d.to.After(now) {
			return time.Time{}
		}
		if d.to.After(last) {
			last = d.to
		}
	}
	return last
}

// stall is a waiting partition whose next offset has not moved.
type stall struct {
	p             int32
	next          int64     // where it is stuck (-1: no fencing row)
	hwm           int64     // the log's end at the last sample
	since, lastAt time.Time // first and last sample that saw it
	quiet         time.Duration
	excused       string // the last expected hold seen
	wedged        bool
}

func (s *stall) length() time.Duration { return s.lastAt.Sub(s.since) }

// wedge is a violation of the liveness check, with its evidence.
type wedge struct {
	p      int32  // -1 for a worker
	worker string // a worker out of the group
	at     time.Time
	what   string
	state  string
	lines  []string
}

// liveness is the check's state (w.mu guards spans and cur; the rest is
// the sampler's until it stops).
type liveness struct {
	bound   liveBound
	spans   []*span
	cur     *span
	samples int
	failed  int // samples that could not read the log's end or the fencing rows
	stalls  map[int32]*stall
	done    []stall  // ended stalls
	wedges  []wedge  // (w.mu)
	workerW []string // workers reported as out of the group
	start   time.Time
	end     time.Time // the sampler stopped
	// scheduleEnd is the end of the fault schedule (w.mu)
	scheduleEnd time.Time
	stop        context.CancelFunc
	stopped     chan struct{}

	drainTook, drainBound time.Duration // the drain's catching up, and its bound
}

// startLiveness starts the sampler; stopLiveness ends it.
func (w *world) startLiveness() {
	ctx, cancel := context.WithCancel(context.Background())
	w.live.stalls, w.live.start, w.live.stop, w.live.stopped = map[int32]*stall{}, time.Now(), cancel, make(chan struct{})
	w.t.Cleanup(w.stopLiveness)
	go func() {
		defer close(w.live.stopped)
		tick.Every(ctx, liveSampleEvery, func() { w.sampleLiveness(ctx) })
	}()
}

// stopLiveness stops the sampler and ends the stalls still open
// (idempotent).
func (w *world) stopLiveness() {
	if w.live.stop == nil {
		return
	}
	w.live.stop()
	<-w.live.stopped
	for _, s := range w.live.stalls {
		w.live.keep(s)
	}
	w.live.stalls = map[int32]*stall{}
	w.mu.Lock()
	if w.live.end.IsZero() {
		w.live.end = time.Now()
	}
	w.mu.Unlock()
}

// keep records an ended stall (one seen by a single sample has no length).
func (l *liveness) keep(s *stall) {
	if s.length() > 0 {
		l.done = append(l.done, *s)
	}
}

// liveSample is one reading of every partition.
type liveSample struct {
	hwm   map[int32]int64
	next  map[int32]int64 // partitions with a fencing row
	holds map[int32][]sink.Hold
}

func (w *world) readLiveSample(ctx context.Context) (liveSample, error) {
	s := liveSample{hwm: map[int32]int64{}, holds: map[int32][]sink.Hold{}}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	offs, err := w.adm.ListEndOffsets(rctx, topicName)
	if err != nil {
		return s, fmt.Errorf("listing the log's ends: %w", err)
	}
	offs.Each(func(o kadm.ListedOffset) {
		if o.Err == nil && o.Topic == topicName {
			s.hwm[o.Partition] = o.Offset
		}
	})
	if s.next, err = w.fences(rctx); err != nil {
		return s, fmt.Errorf("reading the fencing rows: %w", err)
	}
	if hs, err := w.trunc.store.OpenHolds(rctx, groupName); err == nil {
		for _, h := range hs {
			if h.Partition.Topic == topicName {
				s.holds[h.Partition.Partition] = append(s.holds[h.Partition.Partition], h)
			}
		}
	} else {
		return s, fmt.Errorf("reading the holds: %w", err)
	}
	return s, nil
}

// sampleLiveness takes one sample and moves every partition's stall on.
func (w *world) sampleLiveness(ctx context.Context) {
	sample, err := w.readLiveSample(ctx)
	now := time.Now()
	l := &w.live
	l.samples++
	if err != nil {
		l.failed++ // a server restarting: the stalls carry on to the next sample
		return
	}
	w.mu.Lock()
	ds := w.disturbed()
	faults := slices.Clone(w.faults)
	w.mu.Unlock()
	bound := l.bound.total()
	for p, hwm := range sample.hwm {
		next, ok := sample.next[p]
		if !ok {
			next = -1
		}
		waiting := (next < 0 && hwm > 0) || (next >= 0 && next < hwm)
		s := l.stalls[p]
		if s != nil && (!waiting || s.next != next) {
			s.lastAt = now // it ended by this sample: its length is an upper bound, within a sample
			l.keep(s)
			delete(l.stalls, p)
			s = nil
		}
		if !waiting {
			continue
		}
		if s == nil {
			l.stalls[p] = &stall{p: p, next: next, hwm: hwm, since: now, lastAt: now}
			continue
		}
		excuse := w.expectedHold(sample.holds[p], faults)
		if excuse == "" {
			s.quiet += quietBetween(ds, s.lastAt, now)
		} else {
			s.excused = excuse
		}
		s.lastAt, s.hwm = now, hwm
		if s.quiet > bound && !s.wedged {
			s.wedged = true
			w.reportWedge(ctx, s, sample.holds[p])
		}
	}
	w.checkWorkersInGroup(ctx, ds, now, bound)
}

// expectedHold returns why a partition's open holds are ones the run
// expected, or "" if it has none of those.
func (w *world) expectedHold(hs []sink.Hold, faults []*fault) string {
	for _, h := range hs {
		switch h.Kind {
		case sink.HoldLogTruncated:
			w.trunc.mu.Lock()
			d, pending := w.trunc.explain(h)
			w.trunc.mu.Unlock()
			if d != nil || pending {
				return fmt.Sprintf("log-truncated hold #%d: the harness's DeleteRecords, until it acknowledges it", h.ID)
			}
		case sink.HoldAheadOfLog:
			if h.HighWatermark >= 0 && h.HighWatermark < h.NextOffset && brokerKillBefore(faults, h.Since, time.Minute) != nil {
				return fmt.Sprintf("ahead-of-log hold #%d after a broker SIGKILL (kfake lost records it had served)", h.ID)
			}
		}
	}
	return ""
}

// reportWedge records a wedged partition with the state the group and
// Postgres give for it now and the last lines the workers logged about it.
func (w *world) reportWedge(ctx context.Context, s *stall, holds []sink.Hold) {
	next := fmt.Sprint(s.next)
	if s.next < 0 {
		next = "none (no fencing row)"
	}
	w.mu.Lock()
	var last string
	if f := latestFault(w.faults, s.since.Add(liveSampleEvery)); f != nil {
		last = fmt.Sprintf("; the last fault before it: %s", f)
	}
	w.mu.Unlock()
	what := fmt.Sprintf("partition %d waiting (next offset %s, the log ends at %d) has not moved for %s since %s, %s of it quiet, more than B = %s%s",
		s.p, next, s.hwm, s.length().Round(time.Millisecond), s.since.Format("15:04:05.000"), s.quiet.Round(time.Millisecond), w.live.bound.total(), last)
	for _, h := range holds {
		what += fmt.Sprintf("; open hold #%d %s since %s: %s", h.ID, h.Kind, h.Since.Format("15:04:05.000"), h.Reason)
	}
	state, worker := w.describePartition(ctx, s.p)
	lines := w.book.linesAbout(s.p, worker, 12)
	if worker == "" {
		// Nobody holds it: what each worker believes it holds, and what
		// the workers said about the topic as a whole.
		var names []string
		for _, p := range w.runningWorkers() {
			names = append(names, p.name)
		}
		lines = append(lines, w.book.assignedLines(names)...)
		lines = append(lines, w.book.topicLinesTail(8)...)
	}
	if len(lines) == 0 {
		lines = []string{"(none)"}
	}
	wd := wedge{p: s.p, at: time.Now(), what: what, state: state, lines: lines}
	w.mu.Lock()
	w.live.wedges = append(w.live.wedges, wd)
	w.mu.Unlock()
	w.t.Logf("WEDGE: %s", wd)
}

func (wd wedge) String() string {
	return fmt.Sprintf("%s\n    state: %s\n    last lines:\n      %s", wd.what, wd.state, strings.Join(wd.lines, "\n      "))
}

// describePartition is what consumer.Describe (tenure admin assignments)
// says of partition p now, and the worker process the coordinator gives it
// to (or, failing that, the fencing row's owner's).
func (w *world) describePartition(ctx context.Context, p int32) (state, worker string) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rows, err := consumer.Describe(ctx, w.admin, w.trunc.store, groupName, []string{topicName})
	if err != nil {
		return fmt.Sprintf("consumer.Describe: %v", err), ""
	}
	for _, r := range rows {
		if r.Topic != topicName || r.Partition != p {
			continue
		}
		worker = strings.TrimPrefix(r.ClientID, "tenure-")
		if worker == "" && r.FenceOwner != "" {
			worker = w.book.workerOf(r.FenceOwner, p)
		}
		since := ""
		if r.Since != nil {
			since = fmt.Sprintf(" since %s", r.Since.Local().Format("15:04:05.000"))
		}
		return fmt.Sprintf("member %s (client %s) epoch %s; fencing row token %s owner %s next %s; high watermark %s, lag %s; state %s%s%s",
			orDash(r.MemberID), orDash(r.ClientID), ptrString(r.Epoch), orDash(r.FenceEpoch), orDash(r.FenceOwner), ptrString(r.NextOffset),
			ptrString(r.HighWatermark), ptrString(r.Lag), r.State, since, reasonSuffix(r.Reason)), worker
	}
	return "consumer.Describe has no row for it", ""
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func ptrString[T any](p *T) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprint(*p)
}

func reasonSuffix(r string) string {
	if r == "" {
		return ""
	}
	return ": " + r
}

// checkWorkersInGroup reports a running worker that stepped down and has
// not joined the group again after B of quiet time.
func (w *world) checkWorkersInGroup(ctx context.Context, ds []interval, now time.Time, bound time.Duration) {
	out := w.book.outOfGroup()
	for _, p := range w.runningWorkers() {
		sd, ok := out[p.name]
		if !ok || p.exited() || slices.Contains(w.live.workerW, p.name+sd.At.String()) {
			continue
		}
		quiet := quietBetween(ds, sd.At, now)
		if quiet <= bound {
			continue
		}
		w.live.workerW = append(w.live.workerW, p.name+sd.At.String())
		state := "not a member of the group"
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if dg, err := w.adm.DescribeGroups(ctx, groupName); err == nil {
			for _, g := range dg {
				for _, m := range g.Members {
					if m.ClientID == "tenure-"+p.name {
						state = fmt.Sprintf("member %s of the group (state %s)", m.MemberID, g.State)
					}
				}
			}
		} else {
			state = fmt.Sprintf("describing the group: %v", err)
		}
		cancel()
		var lines []string
		for _, l := range p.lastLines(15) {
			lines = append(lines, p.name+": "+l)
		}
		wd := wedge{p: -1, worker: p.name, at: now, state: state, lines: compactLines(lines),
			what: fmt.Sprintf("worker %s stepped down at %s (its database did not answer) and has not joined the group again: %s since, %s of it quiet, more than B = %s",
				p.name, sd.At.Format("15:04:05.000"), now.Sub(sd.At).Round(time.Millisecond), quiet.Round(time.Millisecond), bound)}
		w.mu.Lock()
		w.live.wedges = append(w.live.wedges, wd)
		w.mu.Unlock()
		w.t.Logf("WEDGE: %s", wd)
	}
}

// runningWorkers are the worker processes that have not exited.
func (w *world) runningWorkers() []*proc {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []*proc
	for _, p := range w.all {
		if !strings.HasPrefix(p.name, "broker") && !p.exited() {
			out = append(out, p)
		}
	}
	return out
}

// drainDeadline is when the drain must have caught up: B after the last
// quiet window began (or after from, if later), and a sample more so that
// the liveness check reports a wedge first.
func (w *world) drainDeadline(from time.Time) time.Time {
	w.mu.Lock()
	q := w.quietSince(from)
	w.mu.Unlock()
	if q.Before(from) {
		q = from
	}
	return q.Add(w.live.bound.total() + 2*liveSampleEvery)
}

// liveReport is the liveness check's part of the summary.
type liveReport struct {
	bound                 liveBound
	samples, failed       int
	quietIn, quietAfter   time.Duration
	wedges                []wedge
	longest, longestQuiet map[string]time.Duration // per table row ("none": before any fault)
	count                 map[string]int           // stalls of at least 2s, per row
	drainTook, drainBound time.Duration
}

// liveReport attributes the stalls to faults: each to the fault injected
// last before it began, or within a sample after.
func (w *world) liveReport(faults []*fault) liveReport {
	w.mu.Lock()
	defer w.mu.Unlock()
	r := liveReport{bound: w.live.bound, samples: w.live.samples, failed: w.live.failed, wedges: slices.Clone(w.live.wedges),
		longest: map[string]time.Duration{}, longestQuiet: map[string]time.Duration{}, count: map[string]int{},
		drainTook: w.live.drainTook, drainBound: w.live.drainBound}
	ds := w.disturbed()
	r.quietIn = quietBetween(ds, w.live.start, w.live.scheduleEnd)
	r.quietAfter = quietBetween(ds, w.live.scheduleEnd, w.live.end)
	for _, s := range w.live.done {
		row := "none"
		if f := latestFault(faults, s.since.Add(liveSampleEvery)); f != nil {
			row = f.row()
		}
		r.longest[row] = max(r.longest[row], s.length())
		r.longestQuiet[row] = max(r.longestQuiet[row], s.quiet)
		if s.length() >= 2*time.Second {
			r.count[row]++
		}
	}
	return r
}

func (r liveReport) summary(rows []string) string {
	var b strings.Builder
	nw := 0
	for _, wd := range r.wedges {
		if wd.p < 0 {
			nw++
		}
	}
	fmt.Fprintf(&b, "liveness:    B %s, from the worker flags; %d samples, %s apart (%d unread: a server down); quiet time %s during the faults, %s after them; "+
		"wedges %d (partitions %d, workers out of the group %d): must be 0; drain caught up in %s (bound %s)\n",
		r.bound, r.samples, liveSampleEvery, r.failed, r.quietIn.Round(time.Second), r.quietAfter.Round(time.Second),
		len(r.wedges), len(r.wedges)-nw, nw, r.drainTook.Round(10*time.Millisecond), r.drainBound.Round(time.Second))
	fmt.Fprintf(&b, "  stalls: the longest time a waiting partition's next offset did not move, by the fault injected last before it began; its quiet part counts towards B\n")
	kw := kindWidth(rows)
	fmt.Fprintf(&b, "  %-*s %12s %14s %12s\n", kw, "kind", "stalls >= 2s", "longest stall", "quiet part")
	for _, k := range append([]string{"none"}, rows...) {
		if k == "none" && r.longest[k] == 0 {
			continue
		}
		fmt.Fprintf(&b, "  %-*s %12d %14s %12s\n", kw, k, r.count[k], durOrDash(r.longest[k]), durOrDash(r.longestQuiet[k]))
	}
	return b.String()
}

func durOrDash(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return d.Round(10 * time.Millisecond).String()
}

// B comes from the flags the harness passes, defaults where it passes none.
func TestBoundOf(t *testing.T) {
	b, err := boundOf([]string{"worker", "--session-timeout", "3s", "--rebalance-timeout=10s", "--name", "w1.0"})
	if err != nil {
		t.Fatal(err)
	}
	if b.session != 3*time.Second || b.rebalance != 10*time.Second || b.claim != workerClaimTimeout || b.total() != 48*time.Second {
		t.Errorf("bound %s", b)
	}
	if b, _ := boundOf([]string{"--claim-timeout", "5s"}); b.claim != 5*time.Second || b.session != workerSessionDefault {
		t.Errorf("bound %s", b)
	}
	for _, bad := range [][]string{{"--session-timeout"}, {"--session-timeout", "soon"}} {
		if _, err := boundOf(bad); err == nil {
			t.Errorf("boundOf(%q) accepted", bad)
		}
	}
}

// Quiet time is what no disturbance covers; an open one covers the rest.
func TestQuietBetween(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	ds := []interval{{at(10), at(20)}, {at(15), at(25)}, {at(40), at(45)}, {at(60), time.Time{}}}
	for _, c := range []struct {
		a, b int
		want time.Duration
	}{
		{0, 10, 10 * time.Second},
		{0, 30, 15 * time.Second}, // 10-25 covered
		{12, 22, 0},
		{22, 50, 20 * time.Second}, // 25-40 and 45-50
		{50, 70, 10 * time.Second}, // open from 60
		{70, 80, 0},
		{30, 30, 0},
	} {
		if got := quietBetween(ds, at(c.a), at(c.b)); got != c.want {
			t.Errorf("quiet [%d,%d) = %s, want %s", c.a, c.b, got, c.want)
		}
	}
}

// A span disturbs until its faults end (a network cut's as long again),
// or until its function returns if it injected none.
func TestSpanEnd(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)
	sp := &span{from: t0}
	if _, _, ok := sp.end(); ok {
		t.Fatal("a running span with no fault has ended")
	}
	f := &fault{Kind: kindPartPG, Injected: t0.Add(time.Second), Net: &netCut{}}
	sp.faults = append(sp.faults, f)
	if _, _, ok := sp.end(); ok {
		t.Fatal("a span whose fault has not ended has ended")
	}
	f.Ended = t0.Add(9 * time.Second)
	sp.closed = t0.Add(30 * time.Second) // its function went on waiting, quietly
	if end, allow, ok := sp.end(); !ok || !end.Equal(f.Ended) || allow != 8*time.Second {
		t.Errorf("end %v, allowance %s, %v", end, allow, ok)
	}
	plain := &span{from: t0, closed: t0.Add(2 * time.Second)}
	if end, allow, ok := plain.end(); !ok || !end.Equal(plain.closed) || allow != 0 {
		t.Errorf("plain span: end %v, allowance %s, %v", end, allow, ok)
	}
}
