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

// msgRecovered is logged when a lane claims its partition again.
const msgRecovered = "partition claimed again: processing resumes"

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
	stalled := false // recorded in Postgres
	var last error
	for attempt := 1; ; attempt++ {
		d := min(recoverFirst<<min(attempt-1, 4), recoverMax)
		if !l.sleep(d) {
			return false
		}
		cl := l.c.cl.Load()
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
			l.log.Info(msgRecovered, zap.Int64("next_offset", l.next), zap.Int("attempts", attempt),
				zap.NamedError("cause", cause))
			return true
		}
		if err == nil {
			continue // the coordinator does not say we hold it: wait for kgo to say so
		}
		if !stalled || !sameError(err, last) {
			l.log.Warn("partition stalled: this member holds it but cannot claim it; trying again", zap.Error(err),
				zap.NamedError("cause", cause), zap.Int("attempt", attempt), zap.Int64("next_offset", l.next), zap.Bool("stalled", true))
			l.recordStall(err)
			stalled = true
		}
		last = err
	}
}

// reclaim claims the partition again if the coordinator confirms that this
// member holds it at its current epoch. ok is false with a nil error when
// the coordinator does not confirm it (the partition is on its way to
// someone else).
func (l *lane) reclaim(cl *kgo.Client, epoch int32) (ok bool, err error) {
	ctx, cancel := context.WithTimeout(l.ctx, l.c.cfg.ClaimTimeout)
	defer cancel()
	// Ask first, register and claim only if confirmed: a zombie must not
	// register its epoch over and over while it waits to be told.
	g, err := l.c.confirm(ctx, cl, l.owner, max(epoch, l.epoch), []string{l.key.Topic})
	if err != nil {
		return false, err
	}
	if !g.holds(l.key.Topic, l.key.Partition) {
		return false, nil
	}
	// The partition is still this member's: from here the lane's token
	// is the member's current epoch (a classic generation moves on with
	// every rebalance, even one that left the partition where it was).
	l.epoch = max(epoch, l.epoch)
	acked := l.acked.Load()
	claimed, err := l.c.claimOne(ctx, cl, l, l.next, nil)
	if err != nil {
		if errors.Is(err, sink.ErrFenced) {
			l.c.stats.claimsRejected.Add(1)
		}
		return false, err
	}
	if err := l.checkLog(ctx, cl, claimed, acked); err != nil {
		return false, err
	}
	l.acked.Store(claimed.NextOffset)
	l.seek(claimed.NextOffset)
	return true, nil
}

// checkLog compares what a claim returned with the topic's log now, and
// with acked, the next offset after this lane's last acknowledged commit
// (the database may have lost it: a failover). A mismatch is a hold for an
// operator: the lane records it and waits.
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
		if h, err = l.c.divergenceHold(ctx, l.key, l.owner, claimed.NextOffset, acked, tl.end[l.key.Partition],
			"committed by this worker's lane"); err != nil {
			return err
		}
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
		l.log.Error("partition held: the database is behind what this group had acknowledged (it lost commits); waiting for an operator to run `"+l.ackCommand()+"`",
			zap.String("hold", string(h.Kind)), zap.String("reason", h.Reason), zap.Int64("next_offset", h.NextOffset),
			zap.Int64("acked_offset", h.AckedOffset), zap.Bool("held", true))
	} else {
		l.log.Error("partition held: its stored offsets do not fit the log; waiting for an operator to run `"+l.ackCommand()+"`",
			zap.String("hold", string(h.Kind)), zap.String("reason", h.Reason), zap.Int64("next_offset", h.NextOffset),
			zap.Int64("log_start", h.LogStart), zap.Int64("high_watermark", h.HighWatermark), zap.Bool("held", true))
	}
	return l.awaitOperator(false)
}

var errHoldAcknowledged = errors.New("an operator acknowledged the partition's hold")

// seek asks the poll loop to move the partition's fetch position to next
// (the lane's new next offset) and resume fetching it.
func (l *lane) seek(next int64) {
	l.next = next
	l.dropBuffer()
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
	if l.paused {
		cl.ResumeFetchPartitions(map[string][]int32{l.key.Topic: {l.key.Partition}})
		l.paused = false
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
