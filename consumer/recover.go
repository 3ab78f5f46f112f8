package consumer

import (
	"context"
	"errors"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/tenure-dev/tenure/sink"
)

// A lane never gives its partition up on its own: kgo's revoke or loss ends
// it. When its claim or a commit is rejected, or its stored offsets do not
// fit the log, it stops processing and works out, by itself, when it may go
// on. This file is that part of the lane.

// recoverBackoff bounds the wait between two attempts of a recovering lane:
// recovery is a matter of seconds, and the attempts are cheap (one request
// to the coordinator, then a claim only if it confirms).
const (
	recoverFirst = 200 * time.Millisecond
	recoverMax   = 2 * time.Second
	// holdRecheck is how often a held lane looks for an operator's
	// acknowledgement.
	holdRecheck = 2 * time.Second
)

// recover runs after the lane's claim or a commit was rejected (cause). The
// rejection says another claim holds the partition, or the stored offset is
// not the one this lane believed (a commit it did not know of). Either the
// coordinator has given the partition to someone else, and kgo will soon
// revoke it here (ending this lane), or this member still holds it and must
// claim again: a slow COMMIT that landed after all, a claim that ran out of
// rounds, an operator's change to the row. So, until the lane is stopped:
// ask the coordinator whether this member holds the partition now (at the
// member's current epoch); if it does, claim again, which reads the stored
// offset, and fetch from there. While it cannot, the partition is recorded
// as stalled (sink.HoldStalled), for `tenure admin assignments`.
//
// It returns false if the lane was stopped meanwhile.
func (l *lane) recover(cause error) bool {
	l.dropBuffer()
	l.c.stats.stalled.Add(1)
	defer l.c.stats.stalled.Add(-1)
	l.inRecovery.Store(true)
	defer func() {
		// Whatever the row watch saw before this claim, the claim read
		// it since.
		l.rowMoved.Store(false)
		l.inRecovery.Store(false)
	}()
	stalled := false // recorded in Postgres
	var last error
	var cf claimFailedError
	if errors.As(cause, &cf) {
		// A claim that could not be made: the partition is held as
		// stalled from now on, with why, for operators to see.
		l.log.Warn(MsgStalled, zap.Error(cause), zap.Int("attempt", 0), zap.Bool("stalled", true))
		l.recordStall(cause)
		stalled, last = true, cause
	}
	for attempt := 1; ; attempt++ {
		// Jittered, so that the lanes of many partitions stuck alike do
		// not try again in step.
		d := jitter(doubling(recoverFirst, recoverMax, attempt))
		if !l.sleep(d) {
			return false
		}
		if !l.current() {
			return false // a newer lane has the partition, or it was taken away: kgo ends this one
		}
		if databaseAway(last) && !l.c.databaseAnsweredSince(time.Now().Add(-d-probeEvery)) {
			// The database was away at the last attempt and the probe has
			// not reached it since: asking the coordinator again would
			// only load it (every stalled lane of the worker does this).
			continue
		}
		cl := l.cl
		member, epoch := cl.GroupMetadata()
		if member != l.owner {
			continue // this member left or was replaced: kgo ends this lane
		}
		ok, err := l.reclaim(cl, epoch)
		if ok {
			if stalled {
				l.clearStall()
			}
			l.c.stats.recoveries.Add(1)
			l.log.Info(MsgRecovered, zap.Int64("next_offset", l.next), zap.Int("attempts", attempt),
				zap.NamedError("cause", cause))
			return true
		}
		var fe *sink.FencedError
		if errors.As(err, &fe) && fe.Superseded() {
			// A newer lane of this member claimed the partition: this
			// lane's assignment is over, whatever the coordinator says of
			// the member.
			l.log.Info("partition claimed by a newer lane of this member: this lane stops", zap.Error(err))
			return false
		}
		if err == nil {
			continue // the coordinator does not say we hold it: wait for kgo to say so
		}
		if !stalled || !sameError(err, last) {
			l.log.Warn(MsgStalled, zap.Error(err),
				zap.NamedError("cause", cause), zap.Int("attempt", attempt), zap.Int64("next_offset", l.next), zap.Bool("stalled", true))
			l.recordStall(err)
			stalled = true
		}
		last = err
	}
}

// current reports whether this lane is still its partition's lane on this
// worker: a lane replaced by a newer assignment of the partition, or
// released by a revoke, must not claim it again.
func (l *lane) current() bool {
	l.c.mu.Lock()
	defer l.c.mu.Unlock()
	return l.c.lanes[tp{l.key.Topic, l.key.Partition}] == l
}

// reclaim claims the partition again if the coordinator confirms that this
// lane's assignment holds it at the member's current epoch. ok is false
// with a nil error when that is not (yet) confirmed (the partition is on
// its way to someone else, or the group's last rebalance has not yet said
// whether it stays here).
//
// What a confirmation vouches for is the member; the lane must be sure it
// is its own assignment that the member holds. Classic: a heartbeat at
// generation G says the member is in G, nothing about partitions; so the
// lane claims at G only if G's rebalance kept the partition with this lane
// (through, raised by Consumer.assigned). KIP-848: the describe says the
// member holds the partition now, which cannot tell this lane's assignment
// from a newer one of the same member. In both, a newer lane of the same
// member has a higher claim id, and Postgres refuses an older lane's claim
// once the newer one's is stored (sink.FencedError.Superseded), so an old
// lane that loses the race to its successor is stopped by the fence, not by
// timing.
func (l *lane) reclaim(cl *kgo.Client, epoch int32) (ok bool, err error) {
	ctx, cancel := context.WithTimeout(l.ctx, l.c.cfg.ClaimTimeout)
	defer cancel()
	if l.c.cfg.Protocol != NextGen && epoch > l.through.Load() {
		return false, nil
	}
	// Ask first, register and claim only if confirmed: a zombie must not
	// register its epoch over and over while it waits to be told.
	g, err := l.c.confirm(ctx, cl, l.owner, max(epoch, l.epoch), []string{l.key.Topic})
	if err != nil {
		return false, err
	}
	if !g.holds(l.key.Topic, l.key.Partition) {
		return false, nil
	}
	// The partition is still this lane's: from here the lane's token is
	// the member's current epoch (a classic generation moves on with every
	// rebalance, even one that left the partition where it was).
	l.epoch = max(epoch, l.epoch)
	if !l.claimedOnce {
		return l.firstReclaim(ctx, cl)
	}
	// Should the fencing row be gone (a database restored from before the
	// partition's first claim), the claim records the log's start: the
	// database knows of nothing processed, and the divergence check below
	// compares that with what this lane had acknowledged.
	logs, err := l.c.topicLogsOf(ctx, cl, []string{l.key.Topic}, true)
	if err != nil {
		return false, err
	}
	start := max(logs[l.key.Topic].start[l.key.Partition], 0)
	prepared, err := l.c.mayHavePrepared(ctx)
	if err != nil {
		return false, err
	}
	claimed, err := l.c.claimOne(ctx, cl, l, start, nil, prepared)
	if err != nil {
		if errors.Is(err, sink.ErrFenced) {
			l.c.stats.claimsRejected.Add(1)
		}
		return false, err
	}
	acked := l.ackedIn(claimed.LogEpoch)
	if a := l.acked.Load(); claimed.Created && a != nil {
		acked = a.next // the row this lane committed through is gone: any log epoch counts
	}
	if err := l.checkLog(ctx, cl, claimed, acked); err != nil {
		return false, err
	}
	l.setAcked(claimed.NextOffset)
	l.seek(claimed.NextOffset)
	return true, nil
}

// firstReclaim is the claim of a lane whose claim at assignment could not
// be made (Consumer.claimLater): the assignment's own first claim
// (firstClaim), with what the assignment reads read again, so that a
// partition Postgres has never seen starts where it would have (the
// group's committed offset of another client), and the stored offsets are
// checked against the log and the mirror. A hold or a changed partition
// count found here is waited for by the lane (run) with fetching paused.
func (l *lane) firstReclaim(ctx context.Context, cl *kgo.Client) (bool, error) {
	part := tp{l.key.Topic, l.key.Partition}
	a, err := l.c.readAssignment(ctx, cl, l.owner, l.epoch, []string{part.topic})
	if err != nil {
		return false, err
	}
	tl := a.logs[part.topic]
	if l.partitions == 0 {
		l.partitions = tl.partitions
	}
	if l.topicID == [16]byte{} {
		l.topicID = tl.id
	}
	res, err := l.c.firstClaim(ctx, cl, l, a, l.c.startOffset(tl, a.committed, part))
	if err != nil {
		if errors.Is(err, sink.ErrFenced) {
			l.c.stats.claimsRejected.Add(1)
		}
		return false, err
	}
	l.held, l.blocked = res.hold, res.blocked
	if l.held != nil || l.blocked {
		l.seekPaused(res.claimed.NextOffset)
	} else {
		l.seek(res.claimed.NextOffset)
	}
	return true, nil
}

// checkLog compares what a claim returned with the topic's log now, and
// with acked, the next offset after this lane's last acknowledged commit in
// the claim's log epoch, or -1 (the database may have lost it: a failover).
// A mismatch is a hold for an operator: the lane records it and waits.
func (l *lane) checkLog(ctx context.Context, cl *kgo.Client, claimed sink.Claimed, acked int64) error {
	logs, err := l.c.topicLogsOf(ctx, cl, []string{l.key.Topic}, true)
	if err != nil {
		return err
	}
	tl := logs[l.key.Topic]
	if l.topicID == [16]byte{} {
		l.topicID = tl.id
	}
	h := identityHold(l.key, l.owner, claimed, tl)
	if h == nil {
		source := "committed by this worker's lane"
		if claimed.Created {
			source += ", although the database now has no fencing row for the partition (restored from before its first claim?)"
		}
		h = l.c.divergenceHold(l.key, l.owner, claimed.NextOffset, acked, tl.end[l.key.Partition], source)
	}
	if h != nil {
		l.held = h
		if !l.awaitHold() {
			return errStopped
		}
	}
	return nil
}

// awaitHold records l.held (stored offsets that do not fit the log) and
// waits, paused, until an operator has acknowledged it (`tenure admin holds
// acknowledge`); then the lane claims again and fetches from the stored
// offset, which the acknowledgement may have moved. It returns false if the
// lane was stopped meanwhile.
func (l *lane) awaitHold() bool {
	h := l.held
	l.held = nil
	l.dropBuffer()
	if h.Kind == sink.HoldLogTruncated {
		l.c.stats.jobsLost.Add(h.LogStart - h.NextOffset)
	}
	// The hold is recorded before it is logged: the line tells an operator
	// to acknowledge it, and the acknowledgement needs the recorded hold.
	h.From, h.To = -1, -1
	if !l.recordHold(*h) {
		return false
	}
	if h.Kind == sink.HoldDiverged {
		l.log.Error(MsgHeldDiverged+l.ackCommand()+"`",
			zap.String("hold", string(h.Kind)), zap.String("reason", h.Reason), zap.Int64("next_offset", h.NextOffset),
			zap.Int64("acked_offset", h.AckedOffset), zap.Bool("held", true))
	} else {
		l.log.Error(MsgHeldForLog+l.ackCommand()+"`",
			zap.String("hold", string(h.Kind)), zap.String("reason", h.Reason), zap.Int64("next_offset", h.NextOffset),
			zap.Int64("log_start", h.LogStart), zap.Int64("high_watermark", h.HighWatermark), zap.Bool("held", true))
	}
	return l.awaitOperator(false)
}

var errHoldAcknowledged = errors.New("an operator acknowledged the partition's hold")

// checkLogMoved runs once the lane has committed everything it had fetched
// before the log moved under it (push, fetchFailed). It reads the log again
// and judges the lane's next offset against it, as a claim does
// (identityHold), with what the poll loop saw as evidence: a log that went
// back below the lane is ahead-of-log even if it has grown past the lane's
// next offset again by now, since its new jobs sit at reused offsets. A
// hold is recorded and waited for (awaitHold), naming the offsets at stake;
// if the log still fits, fetching starts again at the lane's next offset.
// It returns false if the lane was stopped.
func (l *lane) checkLogMoved() bool {
	l.mu.Lock()
	evidence, why := l.logEvidence, l.logWhy
	l.mu.Unlock()
	ctx, cancel := l.quitContext()
	defer cancel()
	logs, err := l.c.topicLogsOf(ctx, l.cl, []string{l.key.Topic}, true)
	if err != nil {
		return false // stopped: topicLogsOf retries until then
	}
	tl := logs[l.key.Topic]
	p := l.key.Partition
	h := movedLogHold(l.key, l.owner, l.next, l.topicID, tl, evidence)
	if h == nil {
		l.log.Warn("the log moved under the partition's lane, but the stored next offset still fits it: fetching again from there",
			zap.Int64("next_offset", l.next), zap.Int64("log_start", tl.start[p]), zap.Int64("high_watermark", tl.end[p]), zap.String("seen", why))
		l.seek(l.next)
		return true
	}
	h.Reason += "; seen while the partition was being processed: " + why
	l.held = h
	return l.awaitHold()
}

// quitContext returns a context that ends when the lane is stopped, soft or
// hard: for waits that must not outlive the lane.
func (l *lane) quitContext() (context.Context, context.CancelFunc) {
	return l.within(l.ctx)
}

// within returns a context under parent that also ends when the lane is
// stopped, soft or hard.
func (l *lane) within(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(parent)
	stop := context.AfterFunc(l.ctx, cancel)
	go func() {
		defer stop()
		select {
		case <-l.quit:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// seek asks the poll loop to move the partition's fetch position to next
// (the lane's new next offset) and resume fetching it.
func (l *lane) seek(next int64) { l.seekAndPause(next, false) }

// seekPaused is seek for a lane that must not fetch yet (held, or waiting
// for a partition count's acknowledgement): the position moves, fetching
// stays paused until the lane resumes it.
func (l *lane) seekPaused(next int64) { l.seekAndPause(next, true) }

func (l *lane) seekAndPause(next int64, paused bool) {
	l.next = next
	l.dropBuffer()
	l.seekPause.Store(paused)
	l.seekTo.Store(next)
	l.c.wakePoll()
}

// applySeek runs on the poll goroutine (kgo's SetOffsets must not race a
// rebalance): it moves the fetch position, drops what was buffered from the
// old position, and resumes fetching.
func (l *lane) applySeek(cl *kgo.Client) {
	off := l.seekTo.Swap(-1)
	if off < 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended || l.removed {
		return
	}
	cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{l.key.Topic: {l.key.Partition: {Epoch: -1, Offset: off}}})
	l.setQueueLocked(nil, 0)
	// kgo fetches from off from now on (SetOffsets drops what was fetched
	// from the old position): the log is judged afresh from there.
	l.fetchPos = off
	l.logMoved, l.logEvidence, l.logWhy = false, -1, ""
	if !l.seekPause.Load() {
		l.resumeLocked()
	}
}

// dropBuffer drops the buffered records and pauses fetching: what comes
// next is fetched again from the stored offset.
func (l *lane) dropBuffer() {
	l.mu.Lock()
	l.setQueueLocked(nil, 0)
	l.pauseLocked()
	l.mu.Unlock()
}

func (l *lane) recordStall(cause error) {
	ctx, cancel := context.WithTimeout(l.ctx, 5*time.Second)
	defer cancel()
	err := l.c.store.HoldPartition(ctx, sink.Hold{Partition: l.key, Kind: sink.HoldStalled, Reason: cause.Error(), AckedOffset: -1,
		NextOffset: l.next, LogStart: -1, HighWatermark: -1, Owner: l.owner})
	if err != nil {
		l.log.Debug("recording the stall failed", zap.Error(err))
	}
}

func (l *lane) clearStall() {
	ctx, cancel := context.WithTimeout(l.ctx, 5*time.Second)
	defer cancel()
	if err := l.c.store.ClearStall(ctx, l.key); err != nil {
		l.log.Debug("clearing the stall failed", zap.Error(err))
	}
}

func sameError(a, b error) bool {
	return a != nil && b != nil && a.Error() == b.Error()
}
