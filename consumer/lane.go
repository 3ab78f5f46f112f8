package consumer

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/tenure-dev/tenure/sink"
)

// lockRetry is the delay before a batch that waited in vain for a row lock
// is tried again.
const lockRetry = 100 * time.Millisecond

// lostGrace is how long a lane of a lost partition may go on with the batch
// it is running before its context is cancelled. Whatever it does in that
// time is settled by the fence; the grace only saves work that was about to
// be rejected anyway from being cut off half-way in the handler.
const lostGrace = 2 * time.Second

// layoutRecheck is how often a lane blocked by a partition count change
// looks for the operator's acknowledgement; layoutWatch is how often a
// worker compares its topics' partition counts with the recorded ones.
const (
	layoutRecheck = 2 * time.Second
	layoutWatch   = 5 * time.Second
)

// errStopped ends a batch whose lane was stopped: nothing committed, nothing
// lost; the next owner starts from the stored offset.
var errStopped = errors.New("lane stopped")

// A lane processes one claimed partition: records in offset order, one batch
// at a time, every batch committed through the fence with the lane's token.
//
// The poll loop appends records (push); the lane goroutine takes batches
// (take). A lane ends when it is stopped (revoke, loss, shutdown), or on its
// own when it is fenced; then it drops its buffer and keeps its partition
// paused until the group assigns the partition again.
type lane struct {
	c *Consumer
	// cl is the client of the group session the lane belongs to: a worker
	// that steps down and rejoins has a new client, and a lane still
	// stopping must never pause or move the new session's partitions.
	cl         *kgo.Client
	key        sink.Partition
	owner      string
	epoch      int32 // the member epoch the partition was assigned at
	partitions int32 // the topic's partition count at assignment
	// claimID identifies this lane's claim in Postgres: a claim at the very
	// token stored by another lane (even one of the same member) is a tie,
	// and commits must carry it. Claim ids grow with every lane a Consumer
	// starts (Consumer.newClaimID): Postgres refuses a claim by an older
	// lane of the member that holds the row.
	claimID int64
	// through is the newest generation at which the group's rebalances kept
	// the partition with this lane (classic protocol: set at assignment,
	// raised by every rebalance that leaves the partition here). Recovery
	// claims only at an epoch the lane's own assignment is known to hold.
	through atomic.Int32

	// Set by the claim, then read by the lane goroutine only.
	token    sink.Token
	logEpoch int64 // the partition's log epoch at the claim (sink.Claimed.LogEpoch)
	next     int64 // the stored next offset as this lane knows it
	log      *zap.Logger
	baseLog  *zap.Logger // log without the token

	topicID    [16]byte     // the topic's id when the partition was assigned (zero: unknown)
	blocked    bool         // claimed, then waiting for a partition count acknowledgement
	held       *sink.Hold   // claimed, then waiting for an operator to acknowledge this hold
	recovering error        // the claim was rejected: find out why and claim again (recover)
	layoutHold atomic.Int32 // a new partition count to wait for, set by the layout watcher; 0: none
	// seekTo is the offset the poll loop must move the partition's fetch
	// position to (kgo's SetOffsets), -1 for none: after a lane claims again
	// (recover, an acknowledged hold) its next offset is Postgres's, not
	// where kgo had fetched to.
	seekTo atomic.Int64
	// acked is the next offset after the lane's last acknowledged commit (or
	// its claim), with the log epoch it belongs to; mirrored, the offset
	// Kafka last accepted from the mirror for it (mirror.go).
	acked    atomic.Pointer[ackState]
	mirrored atomic.Int64

	mu         sync.Mutex
	queue      []*kgo.Record
	queueBytes int64 // the buffered records' size (recordSize)
	paused     bool  // fetching of the partition is paused (backpressure or ended)
	// pausedForWorker: paused because the worker's buffers as a whole were
	// full (Config.WorkerBufferBytes); resumed by Consumer.resumeDrained.
	pausedForWorker bool
	ended           bool // the lane no longer accepts records
	removed         bool // the lane left the consumer's map: it must not touch the partition's fetch state
	// fetchPos is where kgo's fetch position for the partition is expected
	// to be: the claimed or sought offset, then one past the last record
	// pushed. Records that do not continue from it mean the log moved under
	// the lane (logMoved).
	fetchPos int64
	// logMoved: the poll loop saw the log move under the lane (records that
	// do not continue from fetchPos, OFFSET_OUT_OF_RANGE, data loss); no
	// more records are taken until the lane has checked the log
	// (checkLogMoved) and moved its fetch position (applySeek).
	// logEvidence is the lowest offset at which the log was seen to end
	// below fetchPos, -1 if none.
	logMoved    bool
	logEvidence int64
	logWhy      string

	wake     chan struct{} // cap 1: records arrived
	quit     chan struct{} // soft stop: finish the current batch, start no other
	quitOnce sync.Once
	ctx      context.Context // hard stop: cancels the handler
	cancel   context.CancelFunc
	done     chan struct{}
}

// msgBatchFenced is logged when the fence rejects a batch.
const msgBatchFenced = "batch rejected: fenced; dropping this partition's buffered records and checking whether this member still holds it"

// ackState is an offset acknowledged in Postgres and the log epoch it
// belongs to: offsets compare only within one log epoch.
type ackState struct {
	next, logEpoch int64
}

func newLane(c *Consumer, cl *kgo.Client, key sink.Partition, owner string, epoch, partitions int32, log *zap.Logger) *lane {
	ctx, cancel := context.WithCancel(context.Background())
	claimID := c.newClaimID()
	log = log.With(zap.Int64("claim_id", claimID))
	l := &lane{
		c: c, cl: cl, key: key, owner: owner, epoch: epoch, partitions: partitions, claimID: claimID, log: log, baseLog: log,
		wake: make(chan struct{}, 1), quit: make(chan struct{}),
		ctx: ctx, cancel: cancel, done: make(chan struct{}),
		logEvidence: -1,
	}
	l.through.Store(epoch)
	l.seekTo.Store(-1)
	return l
}

// setAcked records next as acknowledged in the lane's log epoch.
func (l *lane) setAcked(next int64) {
	l.acked.Store(&ackState{next: next, logEpoch: l.logEpoch})
}

// ackedIn returns the lane's acknowledged next offset if it belongs to log
// epoch e, else -1.
func (l *lane) ackedIn(e int64) int64 {
	if a := l.acked.Load(); a != nil && a.logEpoch == e {
		return a.next
	}
	return -1
}

func (l *lane) start() { go l.run() }

// block starts a claimed lane that may not process yet: its topic's
// partition count changed. Fetching stays paused until an operator
// acknowledges the count.
func (l *lane) block() {
	l.blocked = true
	l.pauseFetch()
	go l.run()
}

// startHeld starts a claimed lane whose stored offsets do not fit the log
// (sink.Hold): it records the hold and waits, paused, for an operator.
func (l *lane) startHeld(h *sink.Hold) {
	l.held = h
	l.pauseFetch()
	go l.run()
}

// startRecovering starts a lane whose claim was rejected: paused, it finds
// out whether this member still holds the partition and claims again.
func (l *lane) startRecovering(cause error) {
	l.recovering = cause
	l.pauseFetch()
	go l.run()
}

func (l *lane) pauseFetch() {
	l.mu.Lock()
	l.pauseLocked()
	l.mu.Unlock()
}

// holdForLayout makes the lane stop after its current batch and wait until
// the topic's new partition count n is acknowledged.
func (l *lane) holdForLayout(n int32) {
	l.layoutHold.Store(n)
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

func (l *lane) stopSoft() { l.quitOnce.Do(func() { close(l.quit) }) }

func (l *lane) stopHard() {
	l.stopSoft()
	l.cancel()
}

func (l *lane) stopping() bool {
	select {
	case <-l.quit:
		return true
	default:
		return l.ctx.Err() != nil
	}
}

// sleep waits d, or less if the lane is stopped; it reports whether the
// full time passed.
func (l *lane) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-l.quit:
		return false
	}
}

// full reports whether the lane's buffer has reached its bounds
// (Config.PartitionBufferBytes, and a record count that keeps the buffer's
// slice in proportion): fetching the partition pauses there, and resumes
// below half (drained), so that a resumed partition still has work
// buffered while its next fetch is on the way.
func (l *lane) full() bool {
	return l.queueBytes >= l.c.cfg.PartitionBufferBytes || len(l.queue) >= 4*l.c.cfg.BatchMax
}

func (l *lane) drained() bool {
	return l.queueBytes < l.c.cfg.PartitionBufferBytes/2 && len(l.queue) < 2*l.c.cfg.BatchMax
}

// recordSize is what a buffered record costs: its key, value and headers,
// and the record itself.
func recordSize(r *kgo.Record) int64 {
	n := int64(len(r.Key) + len(r.Value) + 96)
	for _, h := range r.Headers {
		n += int64(len(h.Key) + len(h.Value) + 32)
	}
	return n
}

// setQueueLocked replaces the buffer, keeping the lane's and the worker's
// byte counts right.
func (l *lane) setQueueLocked(q []*kgo.Record, bytes int64) {
	l.c.buffered.Add(bytes - l.queueBytes)
	l.queue, l.queueBytes = q, bytes
}

func (l *lane) pauseLocked() {
	if !l.paused && !l.removed {
		l.cl.PauseFetchPartitions(map[string][]int32{l.key.Topic: {l.key.Partition}})
		l.paused = true
	}
}

// push appends the records of one fetch of the partition; logStart is the
// log's start as that fetch reported it (-1: not reported).
//
// The broker serves a fetch from the position kgo asks for, so the records
// must continue from the lane's fetch position. Records below it mean kgo
// moved the position down without the lane (its data-loss reset does: the
// log went back below the lane). A gap above it is a log's ordinary shape
// (transaction markers, aborted or compacted records) only while the log
// still starts at or below the position; a log that starts above it lost
// records before they were fetched. Either way nothing more is taken from
// the partition until the lane has checked the log (checkLogMoved): a job
// is never skipped, nor one at a reused offset dropped, in silence.
func (l *lane) push(recs []*kgo.Record, logStart int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended || l.logMoved {
		return
	}
	switch first := recs[0].Offset; {
	case first < l.fetchPos:
		l.logMovedLocked(first, fmt.Sprintf("records from offset %d arrived while the fetch position was %d: the log went back below it", first, l.fetchPos))
		return
	case first > l.fetchPos && logStart > l.fetchPos:
		l.logMovedLocked(-1, fmt.Sprintf("the log starts at %d, above the fetch position %d: records were deleted before they were fetched", logStart, l.fetchPos))
		return
	}
	l.fetchPos = recs[len(recs)-1].Offset + 1
	var n int64
	for _, r := range recs {
		n += recordSize(r)
	}
	l.setQueueLocked(append(l.queue, recs...), l.queueBytes+n)
	if l.full() {
		l.pauseLocked()
	} else if l.c.buffered.Load() >= l.c.cfg.WorkerBufferBytes {
		// The worker as a whole holds enough: this partition waits until
		// the lanes have drained half of it (Consumer.resumeDrained).
		l.pauseLocked()
		l.pausedForWorker = true
	}
	l.wakeUp()
}

func (l *lane) wakeUp() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// fetchFailed is told of a fetch of the partition that failed with
// OFFSET_OUT_OF_RANGE or a data loss kgo detected (fp: that fetch's
// partition, with the log's start and end as the broker reported them).
// kgo does not move the position past a log that changed (the consumer
// runs with kgo.NoResetOffset), and says so here instead: the lane checks
// the log once it has committed what it had fetched before.
func (l *lane) fetchFailed(fp kgo.FetchPartition) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return
	}
	evidence := int64(-1)
	var dl *kgo.ErrDataLoss
	switch {
	case errors.As(fp.Err, &dl):
		evidence = dl.ResetTo
	case fp.HighWatermark >= 0 && fp.HighWatermark < l.fetchPos:
		evidence = fp.HighWatermark
	}
	l.logMovedLocked(evidence, fmt.Sprintf("fetching from offset %d failed: %v (log start %d, high watermark %d)",
		l.fetchPos, fp.Err, fp.LogStartOffset, fp.HighWatermark))
}

// logMovedLocked stops the lane's intake after the log moved under it:
// fetching pauses, what is buffered (records that do continue the
// lane's position) is still processed, and then the lane checks the log.
// evidence is an offset the log was seen to end at below the lane, or -1.
func (l *lane) logMovedLocked(evidence int64, why string) {
	if !l.logMoved {
		l.logWhy = why
	}
	l.logMoved = true
	if evidence >= 0 && (l.logEvidence < 0 || evidence < l.logEvidence) {
		l.logEvidence = evidence
	}
	l.pauseLocked()
	l.wakeUp()
}

// logMovedPending reports whether the lane must check the log before it
// takes anything more.
func (l *lane) logMovedPending() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.logMoved
}

// end stops accepting records, drops the buffer and pauses the partition so
// that nothing more is fetched for it on this member.
func (l *lane) end() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ended = true
	l.setQueueLocked(nil, 0)
	l.pauseLocked()
}

// release is called when the lane leaves the consumer's map (revoke, loss,
// shutdown, or a new claim of the same partition). It undoes the lane's
// pause, since kgo keeps partitions paused across rebalances and a later
// assignment must fetch again, and stops the lane from touching the
// partition's fetch state from then on. A fenced lane stays in the map, and
// its partition paused, until then.
func (l *lane) release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ended = true
	l.setQueueLocked(nil, 0)
	if l.paused && !l.removed {
		l.cl.ResumeFetchPartitions(map[string][]int32{l.key.Topic: {l.key.Partition}})
	}
	l.paused = false
	l.removed = true
}

// take waits for records and returns the next batch, or nil when the lane
// must stop.
func (l *lane) take() *Batch {
	lingered := false
	var lingerUntil time.Time
	for {
		if l.stopping() || l.layoutHold.Load() != 0 {
			return nil
		}
		l.mu.Lock()
		if l.logMoved && len(l.queue) == 0 {
			// Everything fetched before the log moved is committed: the
			// lane checks the log now (run, checkLogMoved).
			l.mu.Unlock()
			return nil
		}
		// Records below the next offset were committed already (a batch
		// requeued after part of it committed).
		i := 0
		var skipped int64
		for i < len(l.queue) && l.queue[i].Offset < l.next {
			skipped += recordSize(l.queue[i])
			i++
		}
		if i > 0 {
			l.setQueueLocked(l.queue[i:], l.queueBytes-skipped)
		}
		// A batch closes on BatchMax records or BatchMaxBytes bytes (one
		// record at least), or, when fewer are buffered, once BatchLinger
		// has passed since the lane started waiting for them.
		n, size := 0, int64(0)
		for n < len(l.queue) && n < l.c.cfg.BatchMax {
			rs := recordSize(l.queue[n])
			if n > 0 && size+rs > l.c.cfg.BatchMaxBytes {
				break
			}
			size += rs
			n++
		}
		full := n == l.c.cfg.BatchMax || (n < len(l.queue))
		if n > 0 && (full || lingered || l.c.cfg.BatchLinger <= 0) {
			recs := make([]*kgo.Record, n)
			copy(recs, l.queue[:n])
			rest := l.queue[n:]
			if len(rest) == 0 {
				rest = nil // let the backing array go
			}
			l.setQueueLocked(rest, l.queueBytes-size)
			if l.paused && !l.ended && !l.removed && l.drained() && !l.heldForWorker() {
				l.cl.ResumeFetchPartitions(map[string][]int32{l.key.Topic: {l.key.Partition}})
				l.paused, l.pausedForWorker = false, false
			}
			l.mu.Unlock()
			l.c.resumeDrained()
			return l.batch(recs, l.next)
		}
		l.mu.Unlock()
		var linger <-chan time.Time
		var t *time.Timer
		if n > 0 {
			if lingerUntil.IsZero() {
				lingerUntil = time.Now().Add(l.c.cfg.BatchLinger)
			}
			t = time.NewTimer(time.Until(lingerUntil))
			linger = t.C
		}
		select {
		case <-l.wake:
		case <-linger:
			lingered = true
		case <-l.quit:
			if t != nil {
				t.Stop()
			}
			return nil
		}
		if t != nil {
			t.Stop()
		}
	}
}

func (l *lane) batch(recs []*kgo.Record, from int64) *Batch {
	return &Batch{
		Group: l.key.Group, Topic: l.key.Topic, Partition: l.key.Partition,
		Token: l.token, Owner: l.owner,
		From: from, To: recs[len(recs)-1].Offset + 1, Records: recs,
	}
}

func (l *lane) run() {
	l.c.stats.lanes.Add(1)
	defer l.c.stats.lanes.Add(-1)
	defer close(l.done)
	if l.recovering != nil && !l.recover(l.recovering) {
		return
	}
	if l.held != nil && !l.awaitHold() {
		return
	}
	if l.blocked && !l.awaitLayout() {
		return
	}
	// A partition held for an operator (a handler bug, offsets that do not
	// fit the log), here or on another worker, stays held until the hold is
	// acknowledged.
	if !l.awaitOperator(true) {
		return
	}
	for {
		if n := l.layoutHold.Swap(0); n != 0 {
			// The topic's partition count changed under this lane: keep the
			// buffer, stop fetching, and claim again once acknowledged.
			l.partitions = n
			l.mu.Lock()
			l.pauseLocked()
			l.mu.Unlock()
			if !l.awaitLayout() {
				return
			}
		}
		b := l.take()
		if b == nil {
			if l.layoutHold.Load() != 0 {
				continue
			}
			if !l.stopping() && l.logMovedPending() {
				if !l.checkLogMoved() {
					return
				}
				continue
			}
			return
		}
		next, err := l.process(b.Records, b.From)
		l.next = next
		switch {
		case err == nil:
		case errors.Is(err, sink.ErrFenced):
			l.log.Warn(msgBatchFenced, zap.Bool("fenced", true), zap.Int64("from", b.From), zap.Int64("to", b.To), zap.Error(err))
			if !l.recover(err) {
				return
			}
		case errors.Is(err, ErrHandlerEndedTx):
			// Keep what was not committed, fetch nothing more, and wait.
			l.requeue(b.Records)
			if !l.halt(err) {
				return
			}
		default: // stopped: nothing of the unfinished part committed, nothing lost
			l.log.Info("batch abandoned: lane stopped", zap.Int64("from", next), zap.Int64("to", b.To), zap.Error(err))
			return
		}
	}
}

// requeue puts records taken for a batch back at the front of the buffer
// and pauses fetching; take drops what was committed meanwhile.
func (l *lane) requeue(recs []*kgo.Record) {
	var n int64
	for _, r := range recs {
		n += recordSize(r)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return
	}
	l.setQueueLocked(append(append(make([]*kgo.Record, 0, len(recs)+len(l.queue)), recs...), l.queue...), l.queueBytes+n)
	l.pauseLocked()
}

// heldForWorker reports whether the worker's buffers as a whole are still
// too full for a partition paused for that reason to resume.
func (l *lane) heldForWorker() bool {
	return l.pausedForWorker && l.c.buffered.Load() >= l.c.cfg.WorkerBufferBytes/2
}

// halt stops the partition after its handler ended its own transaction
// (cause is a *HandlerBugError): the batch's effects may be committed
// outside the fence, and running the handler again would do it again. The
// halt is recorded in Postgres as a hold (sink.HoldHandlerBug), so that no
// worker the partition moves to processes it either, and the lane waits for
// an operator to acknowledge it. It reports whether the lane may go on
// (false: it was stopped meanwhile).
func (l *lane) halt(cause error) bool {
	l.c.stats.handlerBugs.Add(1)
	h := sink.Hold{Partition: l.key, Kind: sink.HoldHandlerBug, Reason: cause.Error(), Owner: l.owner, Token: l.token, AckedOffset: -1,
		NextOffset: l.next, LogStart: -1, HighWatermark: -1, From: -1, To: -1}
	var bug *HandlerBugError
	if errors.As(cause, &bug) {
		h.From, h.To, h.FirstJob, h.LastJob = bug.From, bug.To, bug.FirstJob, bug.LastJob
	}
	l.log.Error("handler bug: it ended the batch's transaction itself (COMMIT or ROLLBACK in its SQL), so the fence could not cover what it wrote; "+
		"the partition is halted: nothing more is committed for it, on any worker, until an operator fixes the handler and runs "+
		"`"+l.ackCommand()+"`",
		zap.String("job", h.FirstJob), zap.String("last_job", h.LastJob), zap.Int64("from", h.From), zap.Int64("to", h.To),
		zap.Bool("halted", true), zap.Error(cause))
	if !l.recordHold(h) {
		return false
	}
	return l.awaitOperator(false)
}

// ackCommand is the command an operator runs to acknowledge the partition's
// hold.
func (l *lane) ackCommand() string {
	return "tenure admin holds acknowledge --group " + l.key.Group + " --topic " + l.key.Topic + " --partition " + fmt.Sprint(l.key.Partition)
}

// recordHold writes h to Postgres, trying until it is written or the lane
// is stopped (false). Not recorded yet, the hold still stands: this lane
// holds the partition, and the next owner's lane finds the hold once the
// database answers.
func (l *lane) recordHold(h sink.Hold) bool {
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(l.ctx, 5*time.Second)
		err := l.c.store.HoldPartition(ctx, h)
		cancel()
		if err == nil {
			return true
		}
		d := l.c.retryDelay(attempt, err)
		l.log.Warn("recording the partition's hold failed, retrying", zap.Duration("backoff", d), zap.Error(err))
		if !l.sleep(d) {
			return false
		}
	}
}

// awaitOperator waits while the partition has an open hold that needs an
// operator (a handler bug, offsets that do not fit the log); at a lane's
// start (starting) it first looks whether there is one, recorded by this
// worker or another. Once the hold is acknowledged, the lane claims again
// (the acknowledgement may have moved the stored offset) and fetches from
// the stored offset. It reports whether the lane may go on. A database that
// does not answer is asked again: a held partition must not run on the
// assumption that it is not.
func (l *lane) awaitOperator(starting bool) bool {
	counted, said := false, !starting
	defer func() {
		if counted {
			l.c.stats.lanesHalted.Add(-1)
		}
	}()
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(l.ctx, 5*time.Second)
		h, held, err := l.c.store.OpenHoldNeedingAck(ctx, l.key)
		cancel()
		wait := holdRecheck
		switch {
		case err != nil:
			wait = l.c.retryDelay(attempt, err)
			l.log.Warn("reading whether the partition is held failed, retrying", zap.Duration("backoff", wait), zap.Error(err))
		case !held:
			if !counted && starting {
				return true
			}
			l.log.Warn("hold acknowledged by an operator: claiming the partition again, processing goes on from the stored offset")
			counted = false
			l.c.stats.lanesHalted.Add(-1)
			// The acknowledgement may have moved the offset (into another
			// log epoch): what this lane had acknowledged is no reference
			// any more (ackedIn compares within the claim's log epoch).
			return l.recover(errHoldAcknowledged)
		default:
			attempt = 0
			if !counted {
				counted = true
				l.c.stats.lanesHalted.Add(1)
				l.dropBuffer()
			}
			if !said {
				said = true
				l.log.Error("partition is held: not processing it until an operator acknowledges the hold with `"+l.ackCommand()+"`",
					zap.String("hold", string(h.Kind)), zap.String("reason", h.Reason), zap.String("job", h.FirstJob),
					zap.Time("since", h.Since), zap.String("held_by", h.Owner), zap.Bool("held", true))
			}
		}
		if !l.sleep(wait) {
			return false
		}
	}
}

// awaitLayout waits, while the partition stays assigned, for an operator to
// acknowledge the topic's new partition count. The lane keeps its claim: if
// someone took the partition meanwhile, its next commit is fenced.
func (l *lane) awaitLayout() bool {
	for {
		err := l.c.store.CheckLayout(l.ctx, l.key.Group, l.key.Topic, l.partitions)
		if err == nil {
			break
		}
		if !errors.Is(err, sink.ErrPartitionsChanged) {
			l.log.Warn("checking partition count failed", zap.Error(err))
		}
		if !l.sleep(layoutRecheck) {
			return false
		}
	}
	// A hold for this same count, set while we waited, is answered too.
	l.layoutHold.CompareAndSwap(l.partitions, 0)
	l.log.Info("partition count acknowledged: processing resumes")
	l.resumeFetch()
	return true
}

func (l *lane) resumeFetch() {
	l.mu.Lock()
	if l.paused && !l.ended && !l.removed {
		l.cl.ResumeFetchPartitions(map[string][]int32{l.key.Topic: {l.key.Partition}})
		l.paused = false
	}
	l.mu.Unlock()
}

// process commits recs, which start at from, and returns the next offset
// after what it committed: every job's effects commit exactly once, or the
// job is dead-lettered in the transaction that moves past it. It returns an
// error only when the lane is fenced or stopped.
//
// What a failure costs depends on whose it is (see Handler and
// classifyHandlerError). A job's failure is counted: the batch is retried
// once (a passing hiccup should not cost a split), then halved; the halves
// run in order, each retried and halved in turn, so the good jobs commit and
// the bad one ends alone. A lone job gets MaxAttempts attempts, or none more
// if its failure is permanent, and is then dead-lettered. A failure that is
// not the job's (tenure's own database work, the batch's connection
// breaking, a Transient error, a SQL error that says the environment is
// wrong) is retried whole, with backoff, until it passes or the lane stops:
// it never splits a batch and never dead-letters anything.
func (l *lane) process(recs []*kgo.Record, from int64) (int64, error) {
	cfg := &l.c.cfg
	b := l.batch(recs, from)
	handlerFailures, stalls := 0, 0
	for attempt := 1; ; attempt++ {
		if attempt > 1 {
			l.c.stats.retries.Add(1)
		}
		err := l.attempt(b)
		switch {
		case err == nil:
			l.afterBatch(b, nil)
			return b.To, nil
		case errors.Is(err, sink.ErrFenced):
			l.afterBatch(b, err)
			return from, err
		case errors.Is(err, ErrHandlerEndedTx):
			return from, err // never again: the lane halts the partition
		case l.stopping():
			return from, fmt.Errorf("%w: %v", errStopped, err)
		}
		class := failInfra // whatever is not the handler's is tenure's own database work
		var he *handlerError
		if errors.As(err, &he) {
			class = he.class
		}
		if class != failJob && class != failPermanent {
			stalls++
			d := l.c.retryDelay(stalls, err)
			if sqlState(err) == "55P03" {
				// A lock wait: lock_timeout already bounded it, and the
				// lock watch ends an older owner's session; try again at
				// once rather than after a growing backoff.
				d = lockRetry
			}
			fields := []zap.Field{zap.Int64("from", b.From), zap.Int64("to", b.To), zap.Int("attempt", stalls),
				zap.Duration("backoff", d), zap.Stringer("failure", class), zap.Error(err)}
			switch class {
			case failTransient:
				l.c.stats.handlerTransient.Add(1)
				l.log.Warn("handler failed for a reason outside its jobs (Transient, or a lock conflict): retrying the batch, not counting it against its jobs", fields...)
			case failEnvironment:
				l.c.stats.handlerEnvironment.Add(1)
				l.log.Error("the database refused the handler's SQL for a reason that is not the job's (missing table or column, permission, read-only or stopping server): the partition stalls until that is fixed; nothing is dead-lettered",
					append(fields, zap.String("sqlstate", sqlState(err)))...)
			default:
				l.log.Warn("batch failed on the database, retrying", fields...)
			}
			if !l.sleep(d) {
				return from, errStopped
			}
			continue
		}
		if !l.databaseAnswers() {
			// The handler failed while the database is away: not the job's
			// fault, whatever the error says.
			stalls++
			if !l.sleep(min(l.c.backoff(stalls), reconnectBackoffMax)) {
				return from, errStopped
			}
			continue
		}
		handlerFailures++
		l.c.stats.handlerFailures.Add(1)
		final := class == failPermanent
		if len(recs) > 1 {
			if handlerFailures < 2 && !final {
				d := l.c.backoff(handlerFailures)
				l.log.Warn("batch failed, retrying", zap.Int64("from", b.From), zap.Int64("to", b.To),
					zap.Int("attempt", handlerFailures), zap.Duration("backoff", d), zap.Error(err))
				if !l.sleep(d) {
					return from, errStopped
				}
				continue
			}
			mid := len(recs) / 2
			l.log.Warn("batch keeps failing: splitting it to isolate the failing job", zap.Int64("from", b.From), zap.Int64("to", b.To),
				zap.Int("records", len(recs)), zap.Error(err))
			next, err := l.process(recs[:mid], from)
			if err != nil {
				return next, err
			}
			return l.process(recs[mid:], next)
		}
		if handlerFailures < cfg.MaxAttempts && !final {
			d := l.c.backoff(handlerFailures)
			l.log.Warn("job failed, retrying", zap.String("job", JobID(recs[0])),
				zap.Int("attempt", handlerFailures), zap.Duration("backoff", d), zap.Error(err))
			if !l.sleep(d) {
				return from, errStopped
			}
			continue
		}
		return l.deadLetter(b, err, handlerFailures)
	}
}

// handlerError is a failed Handle call, classified while its transaction
// was still open: whether the batch's connection survived is part of the
// verdict.
type handlerError struct {
	err   error
	class failure
}

func (e *handlerError) Error() string { return e.err.Error() }
func (e *handlerError) Unwrap() error { return e.err }

// sqlState is the SQLSTATE in err's chain, or "".
func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// databaseAnswers checks, after a handler failure, that the database can run
// a statement, so that an outage (a hung connection looks like a handler
// timeout) is never blamed on the job.
func (l *lane) databaseAnswers() bool {
	ctx, cancel := context.WithTimeout(l.ctx, 5*time.Second)
	defer cancel()
	_, err := l.c.store.Pool().Exec(ctx, "SELECT 1")
	if err != nil {
		l.log.Warn("database does not answer after a handler failure; not counting it against the job", zap.Error(err))
	}
	return err == nil
}

func (l *lane) afterBatch(b *Batch, err error) {
	l.c.noteDatabase() // committed or refused: either way the database answered
	if err == nil {
		l.setAcked(b.To)
		l.c.stats.batches.Add(1)
		l.c.stats.records.Add(int64(len(b.Records)))
	} else {
		l.c.stats.batchesFenced.Add(1)
	}
	if h := l.c.cfg.Hooks.AfterBatch; h != nil {
		h(b, err)
	}
	if err == nil {
		l.log.Debug("batch committed", zap.Int64("from", b.From), zap.Int64("to", b.To), zap.Int("records", len(b.Records)))
	}
}

// deadLetter parks b's single job in the dead-letter table in the fenced
// transaction that moves the partition past it. Database failures are
// retried like any commit.
func (l *lane) deadLetter(b *Batch, cause error, attempts int) (int64, error) {
	r := b.Records[0]
	headers := make([]sink.Header, len(r.Headers))
	for i, h := range r.Headers {
		headers[i] = sink.Header{Key: h.Key, Value: h.Value}
	}
	d := sink.DeadLetter{Partition: l.key, Offset: r.Offset, Key: r.Key, Value: r.Value, Headers: headers,
		Error: cause.Error(), Attempts: attempts, Token: l.token, Owner: l.owner}
	for attempt := 1; ; attempt++ {
		err := l.commitTx(b, func(ctx context.Context, tx pgx.Tx) error {
			return l.c.store.AddDeadLetter(ctx, tx, d)
		})
		switch {
		case err == nil:
			l.c.stats.deadLetters.Add(1)
			l.log.Error("job dead-lettered", zap.String("job", JobID(r)), zap.Int("attempts", attempts),
				zap.Bool("dead_letter", true), zap.NamedError("cause", cause))
			l.afterBatch(b, nil)
			return b.To, nil
		case errors.Is(err, sink.ErrFenced):
			l.afterBatch(b, err)
			return b.From, err
		case l.stopping():
			return b.From, fmt.Errorf("%w: %v", errStopped, err)
		}
		dl := l.c.retryDelay(attempt, err)
		l.log.Warn("dead-lettering failed, retrying", zap.String("job", JobID(r)), zap.Duration("backoff", dl), zap.Error(err))
		if !l.sleep(dl) {
			return b.From, errStopped
		}
	}
}

// attempt runs the batch once in one transaction: handler, fence, commit.
func (l *lane) attempt(b *Batch) error {
	if h := l.c.cfg.Hooks.BeforeBatch; h != nil {
		h(l.ctx, b)
	}
	return l.commitTx(b, func(ctx context.Context, tx pgx.Tx) error {
		hctx, cancel := ctx, context.CancelFunc(func() {})
		if l.c.cfg.HandlerTimeout > 0 {
			hctx, cancel = context.WithTimeout(ctx, l.c.cfg.HandlerTimeout)
		}
		defer cancel()
		err := l.handle(hctx, tx, b)
		// Our own timeout, not a stop of the lane.
		timedOut := errors.Is(hctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil
		if err != nil {
			return &handlerError{err, classifyHandlerError(err, tx.Conn().IsClosed(), timedOut)}
		}
		if timedOut {
			// A handler that ignored its context: what it did is rolled back
			// like any timed-out batch, rather than raced against Postgres's
			// idle-in-transaction timeout.
			return &handlerError{fmt.Errorf("handler timed out after %s (it returned only after its deadline)", l.c.cfg.HandlerTimeout), failJob}
		}
		if h := l.c.cfg.Hooks.BeforeCommit; h != nil {
			h(ctx, b)
		}
		return nil
	})
}

// commitTx runs work in a transaction and commits it through the fence from
// b.From to b.To. Errors of the transaction machinery come back marked as
// infrastructure errors; work's own errors come back as they are.
//
// The transaction is opened with a marker (SET LOCAL tenure.tx, a value
// unique to this batch), checked just before the fence in the same
// transaction. A handler whose SQL ended the transaction (COMMIT or
// ROLLBACK) loses the marker: its statements since then ran in autocommit,
// and so would the fence, whose rejection would roll nothing back. The
// check reports that as a *HandlerBugError instead of committing anything.
// Nothing of the handler's can run between the check and the fence: its Tx
// refuses work once Handle has returned.
func (l *lane) commitTx(b *Batch, work func(ctx context.Context, tx pgx.Tx) error) error {
	ctx := l.ctx
	marker := l.c.txMarker()
	opts := l.c.txOptions
	// The claim id in application_name lets a newer owner that waits on
	// this transaction's row locks recognise it as an older claimant's
	// (sink.Store.EndStaleBlockers), and lets Resolve find the session.
	appName := sink.ApplicationName(l.claimID)
	opts.BeginQuery += "; SET LOCAL tenure.tx = '" + marker + "'; SET LOCAL application_name = '" + appName + "'"
	// The connection is acquired here, not by the transaction, because the
	// COMMIT travels with the fence (sink.Store.CommitBatch) rather than
	// through tx.Commit: the connection goes back to the pool afterwards.
	conn, err := l.c.store.Pool().Acquire(ctx)
	if err != nil {
		return infraError{fmt.Errorf("begin: %w", err)}
	}
	defer conn.Release() // a connection left in a transaction is closed, not pooled
	tx, err := conn.BeginTx(ctx, opts)
	if err != nil {
		return infraError{fmt.Errorf("begin: %w", err)}
	}
	sess := sink.Session{PID: conn.Conn().PgConn().PID(), AppName: appName}
	done := false
	defer func() {
		if !done {
			rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = tx.Rollback(rctx) // a failed rollback closes the connection: nothing survives
		}
	}()
	stopWatch := l.watchLocks(sess.PID)
	err = work(ctx, tx)
	stopWatch()
	if err != nil {
		return err
	}
	// From here on, stopping the lane does not cancel: a commit in flight is
	// settled by the fence.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.c.cfg.CommitTimeout)
	defer cancel()
	req := sink.CommitRequest{Partition: l.key, Token: l.token, Owner: l.owner, ClaimID: l.claimID, From: b.From, To: b.To, LogEpoch: l.logEpoch}
	if l.c.cfg.UnsafeNoFence { // benchmarks only: see Config.UnsafeNoFence
		done = true
		if err := tx.Commit(cctx); err != nil {
			return infraError{err}
		}
		return nil
	}
	err = l.c.store.CommitBatch(cctx, tx, req, marker)
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		done = true
		return nil
	case errors.Is(err, sink.ErrTxEnded):
		return &HandlerBugError{FirstJob: JobID(b.Records[0]), LastJob: JobID(b.Records[len(b.Records)-1]), From: b.From, To: b.To}
	case errors.Is(err, sink.ErrFenced):
		return err
	case errors.As(err, &pgErr):
		return infraError{err} // the server refused: nothing committed
	}
	// The connection broke, or the answer did not come within the commit
	// timeout: the outcome is unknown. The session is dropped (it may still
	// be in its COMMIT), and Resolve finds the outcome out exactly, waiting
	// while that session is still in the transaction.
	done = true
	_ = conn.Conn().Close(context.Background())
	return l.resolve(req, sess, err)
}

func (l *lane) resolve(req sink.CommitRequest, sess sink.Session, commitErr error) error {
	// Ask until the database answers or the lane is stopped: giving up
	// would leave the lane not knowing its own next offset. A stopped lane
	// may leave it unknown, because the next claim of the partition reads
	// the stored offset, whatever happened.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-l.quit:
			cancel()
		case <-ctx.Done():
		}
	}()
	var out sink.Outcome
	err := l.c.retry(ctx, "resolving a commit of unknown outcome", l.log, func() error {
		var err error
		out, err = l.c.store.ResolveSession(ctx, req, sess)
		return err
	})
	if err != nil && !errors.Is(err, sink.ErrFenced) {
		l.log.Warn("commit outcome still unknown when the lane stopped; the next claim reads the stored offset",
			zap.Int64("from", req.From), zap.Int64("to", req.To), zap.NamedError("commit_error", commitErr), zap.Error(err))
		return fmt.Errorf("%w: commit outcome unknown: %v", errStopped, commitErr)
	}
	l.log.Warn("commit outcome was unknown; resolved from the fencing row",
		zap.Int64("from", req.From), zap.Int64("to", req.To), zap.Stringer("outcome", out), zap.NamedError("commit_error", commitErr))
	switch out {
	case sink.Committed:
		return nil
	case sink.NotCommitted:
		return infraError{fmt.Errorf("commit: %w", commitErr)}
	}
	return err
}

var errPanicked = errors.New("handler panicked")

// handle calls the handler, turning a panic into an error: a bad job must
// never take the worker down with it.
func (l *lane) handle(ctx context.Context, tx pgx.Tx, b *Batch) (err error) {
	htx := newHandlerTx(tx)
	// From here on the handler's Tx (and anything it kept of it) refuses
	// work: what runs next on the connection is tenure's.
	defer htx.close()
	defer func() {
		if r := recover(); r != nil {
			l.log.Error("handler panicked", zap.Any("panic", r), zap.ByteString("stack", debug.Stack()))
			err = fmt.Errorf("%w: %v", errPanicked, r)
		}
	}()
	if err := l.c.cfg.Handler.Handle(ctx, htx, b); err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil && l.ctx.Err() == nil {
			return fmt.Errorf("handler timed out after %s: %w", l.c.cfg.HandlerTimeout, err)
		}
		return fmt.Errorf("handler: %w", err)
	}
	return nil
}
