package consumer

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/tenure-dev/tenure/sink"
)

// Postgres is the source of truth for progress; Kafka's committed offsets are
// its mirror. The mirror serves lag tools, keeps a group with live workers
// from expiring (an empty group without committed offsets is swept), and is
// the record of progress outside the database that tells when the database
// has gone back (issue 15): after a failover to a standby that was behind,
// or a restore, Postgres can be behind offsets its workers had acknowledged.
// A database cannot witness its own loss; the mirror can.
//
// Every mirrorEvery, the offsets committed in Postgres since the last mirror
// are committed to Kafka for the partitions this member holds, with its
// group epoch (a commit of a member that lost the partition is refused).
// The mirror only ever trails Postgres: it carries offsets Postgres has
// acknowledged. So a claim that finds Postgres's next offset below the
// group's committed offset knows the database lost commits: the partition
// is held as diverged (divergenceHold) until an operator accepts the
// database's state. Losses younger than the mirror's lag (up to
// mirrorEvery) go unseen: a synchronous standby is what prevents them.
const mirrorEvery = time.Second

// mirrorOffsets runs the mirror until ctx ends.
func (c *Consumer) mirrorOffsets(ctx context.Context, cl *kgo.Client) {
	t := time.NewTicker(mirrorEvery)
	defer t.Stop()
	inflight := make(chan struct{}, 1)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.mu.Lock()
		offsets := map[string]map[int32]kgo.EpochOffset{}
		var lanes []*lane
		for _, l := range c.lanes {
			acked := l.acked.Load()
			if acked <= 0 || acked == l.mirrored {
				continue
			}
			if offsets[l.key.Topic] == nil {
				offsets[l.key.Topic] = map[int32]kgo.EpochOffset{}
			}
			offsets[l.key.Topic][l.key.Partition] = kgo.EpochOffset{Epoch: -1, Offset: acked}
			l.mirrored = acked
			lanes = append(lanes, l)
		}
		c.mu.Unlock()
		if len(offsets) == 0 {
			continue
		}
		select {
		case inflight <- struct{}{}: // one mirror commit at a time
		default:
			for _, l := range lanes {
				l.mirrored = 0 // try again next time
			}
			continue
		}
		cl.CommitOffsets(ctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
			<-inflight
			if err != nil {
				c.log.Debug("mirroring offsets to Kafka failed; next time", zap.Error(err))
			}
		})
	}
}

// divergenceHold returns the hold for a partition whose stored next offset
// (claimed) is below acked, an offset this group had acknowledged before
// (mirrored to Kafka, or committed by this very lane), or nil. hwm is the
// log's end: an acknowledged offset beyond it says the log changed (a
// hold of its own), not the database. An operator's earlier acceptance
// (sink.Store.AcceptedDivergence) covers offsets up to what it accepted.
func (c *Consumer) divergenceHold(ctx context.Context, key sink.Partition, owner string, next, acked, hwm int64, source string) (*sink.Hold, error) {
	if acked <= next || acked > hwm {
		return nil, nil
	}
	accepted, err := c.store.AcceptedDivergence(ctx, key)
	if err != nil {
		return nil, err
	}
	if acked <= accepted {
		return nil, nil
	}
	c.stats.divergences.Add(1)
	return &sink.Hold{Partition: key, Kind: sink.HoldDiverged, Owner: owner, NextOffset: next, LogStart: -1, HighWatermark: hwm,
		From: -1, To: -1, AckedOffset: acked,
		Reason: fmt.Sprintf("the database's next offset %d is below %d, the offset this group had acknowledged (%s): the database lost "+
			"commits it had acknowledged (a failover to a standby that was behind, a restore); jobs %d to %d would be processed again "+
			"without a word, and their effects outside Postgres redone; acknowledging accepts the database's state and processes them again",
			next, acked, source, next, acked-1)}, nil
}

// mirrorFinal mirrors the stopped lanes' last offsets synchronously, within
// ctx, before a stopping member leaves the group: lag tools then see where
// it stopped.
func (c *Consumer) mirrorFinal(ctx context.Context, cl *kgo.Client, lanes []*lane) {
	offsets := map[string]map[int32]kgo.EpochOffset{}
	for _, l := range lanes {
		if acked := l.acked.Load(); acked > 0 {
			if offsets[l.key.Topic] == nil {
				offsets[l.key.Topic] = map[int32]kgo.EpochOffset{}
			}
			offsets[l.key.Topic][l.key.Partition] = kgo.EpochOffset{Epoch: -1, Offset: acked}
		}
	}
	if len(offsets) == 0 {
		return
	}
	cl.CommitOffsetsSync(ctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, _ *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			c.log.Debug("mirroring the final offsets to Kafka failed", zap.Error(err))
		}
	})
}
