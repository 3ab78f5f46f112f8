package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/tenure-dev/tenure/internal/fence"
	"github.com/tenure-dev/tenure/sink"
)

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
	topicID [16]byte    // the topic's id when the partition was assigned (zero: unknown)
	log     *zap.Logger // with the token once claimed
	baseLog *zap.Logger // log without the token; never replaced, so other goroutines may use it

	laneCommit   // what the lane commits with, and how
	laneRecovery // what the lane must sort out before it processes more
	laneBuffer   // the records the poll loop hands the lane

	quit     chan struct{} // soft stop: finish the current batch, start no other
	quitOnce sync.Once
	ctx      context.Context // hard stop: cancels the handler
	cancel   context.CancelFunc
	done     chan struct{}
}

// laneCommit is what a lane commits with (its claim) and how (its
// committer): attempt.go, commit.go, strict.go.
type laneCommit struct {
	// Set by the claim, then read by the lane goroutine only.
	claimedOnce bool // a claim of this lane was accepted
	// fresh: accepted since the lane's last commit; the joint committer
	// puts its first batch ahead (jointCommitter), which clears it.
	fresh    bool
	token    sink.Token
	logEpoch int64 // the partition's log epoch at the claim (sink.Claimed.LogEpoch)
	next     int64 // the stored next offset as this lane knows it

	// Fixed when the lane starts (startCommit), read by the lane goroutine.
	committer committer     // fenced, strict or unfenced
	pool      *pgxpool.Pool // the store's: batch transactions run on its connections
	pooled    bool          // the pool leads through a transaction pooler (sink.Store.SetPooled)
	appName   string        // the batch transactions' application_name (fence.ApplicationName)

	// acked is the next offset after the lane's last acknowledged commit (or
	// its claim), with the log epoch it belongs to; mirrored, the offset
	// Kafka last accepted from the mirror for it (mirror.go).
	acked    atomic.Pointer[ackState]
	mirrored atomic.Int64
}

// laneRecovery is what a lane must sort out before it processes (more):
// a hold, a changed partition count, a rejected claim, a moved fencing
// row, and the fetch position it must seek to afterwards (recover.go).
type laneRecovery struct {
	blocked    bool         // claimed, then waiting for a partition count acknowledgement
	held       *sink.Hold   // claimed, then waiting for an operator to acknowledge this hold
	recovering error        // the claim was rejected: find out why and claim again (recover)
	layoutHold atomic.Int32 // a new partition count to wait for, set by the layout watcher; 0: none
	// rowMoved: the row watch saw the partition's fencing row changed by
	// someone else (rowwatch.go); inRecovery: the lane is claiming again.
	rowMoved   atomic.Bool
	inRecovery atomic.Bool
	// seekTo is the offset the poll loop must move the partition's fetch
	// position to (kgo's SetOffsets), -1 for none: after a lane claims again
	// (recover, an acknowledged hold) its next offset is Postgres's, not
	// where kgo had fetched to.
	seekTo    atomic.Int64
	seekPause atomic.Bool // the seek keeps fetching paused (seekPaused)
}

// laneBuffer is the lane's buffer and the partition's fetch state
// (buffer.go): the poll loop pushes, the lane takes; under mu.
type laneBuffer struct {
	mu         sync.Mutex
	queue      []*kgo.Record
	queueBytes int64 // the buffered records' size (recordSize)
	// taken is the size of the batch the lane took last and is not done
	// with: still in the worker's count (Consumer.buffered) until batchDone.
	taken  int64
	paused bool // fetching of the partition is paused (backpressure or ended)
	// pausedForWorker: paused because the worker's buffers as a whole were
	// full (Config.WorkerBufferBytes); resumed by Consumer.resumeDrained.
	pausedForWorker bool
	ended           bool // the lane no longer accepts records
	removed         bool // the lane left the consumer's map: it must not touch the partition's fetch state
	// unfed: no record has come for the lane yet; its partition goes first
	// in fetch requests until one does (fetchorder.go).
	unfed bool
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

	wake chan struct{} // cap 1: records arrived
}

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
		quit: make(chan struct{}), ctx: ctx, cancel: cancel, done: make(chan struct{}),
		laneBuffer: laneBuffer{wake: make(chan struct{}, 1), logEvidence: -1},
	}
	l.through.Store(epoch)
	l.seekTo.Store(-1)
	l.unfed = true
	c.unfed.add(l)
	return l
}

// startCommit fixes how the lane commits, once, as it starts: its
// committer from the Config, and what every batch transaction needs of
// the store and the claim.
func (l *lane) startCommit() {
	l.committer = newCommitter(l.c)
	l.pool = l.c.store.Pool()
	l.pooled = l.c.store.Pooled()
	l.appName = fence.ApplicationName(l.claimID)
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

func (l *lane) run() {
	l.c.stats.lanes.Add(1)
	// done closes last: whoever waits for it (a stop) then reads a count
	// without this lane. The other order let Run return while
	// Stats().Lanes still counted a lane that had ended.
	defer close(l.done)
	defer l.c.stats.lanes.Add(-1)
	l.startCommit()
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
			if !l.stopping() && l.rowMoved.Load() {
				if !l.recover(errRowMoved) {
					return
				}
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
		l.batchDone()
		l.next = next
		switch {
		case err == nil:
		case errors.Is(err, sink.ErrFenced):
			l.log.Warn(MsgBatchFenced, zap.Bool("fenced", true), zap.Int64("from", b.From), zap.Int64("to", b.To), zap.Error(err))
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
	what := "handler bug: it ended the batch's transaction itself (COMMIT or ROLLBACK in its SQL), so the fence could not cover what it wrote; "
	if bug != nil && bug.EndedBy != "" {
		what = "handler bug in partition " + bug.EndedBy + ": its handler ran COMMIT in a transaction this batch shared with it (Config.CommitSpan), so what this batch wrote was committed outside the fence; "
	}
	l.log.Error(what+
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
