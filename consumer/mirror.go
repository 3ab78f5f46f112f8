package consumer

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/tenure-dev/tenure/internal/tick"
	"github.com/tenure-dev/tenure/sink"
)

// Postgres is the source of truth for progress; Kafka's committed offsets are
// its mirror. The mirror serves lag tools, keeps a group with live workers
// from expiring (an empty group without committed offsets is swept), and is
// the record of progress outside the database that tells when the database
// has gone back: after a failover to a standby that was behind, or a
// restore, Postgres can be behind offsets its workers had acknowledged. A
// database cannot witness its own loss; the mirror can.
//
// Every mirrorEvery, the offsets committed in Postgres that Kafka has not
// accepted yet are committed to Kafka for the partitions this member holds,
// with its group epoch (a commit of a member that lost the partition is
// refused). The mirror is a state, not a hope: an offset counts as mirrored
// only once Kafka accepted it for its partition (the response's
// per-partition error code), and anything not accepted is sent again at the
// next tick. The mirror only ever trails Postgres: it carries offsets
// Postgres has acknowledged. So a claim that finds Postgres's next offset
// below the group's committed offset knows the database lost commits: the
// partition is held as diverged (divergenceHold) until an operator accepts
// the database's state. Losses younger than the mirror's lag (up to
// mirrorEvery while Kafka accepts its commits) go unseen: a synchronous
// standby is what prevents them.
//
// Each mirrored offset carries, in the commit's metadata, tenure's mark and
// the log epoch it belongs to (mirrorMetadata): offsets compare only within
// one log epoch (an operator's acknowledgement starts a new one, and the
// offsets before it say nothing about a loss after it), and an offset
// committed by another client (a group moving to tenure from plain Kafka
// offsets) is told apart from one tenure acknowledged.
const mirrorEvery = time.Second

// mirrorMetaPrefix starts the metadata of every offset the mirror commits;
// the log epoch follows it.
const mirrorMetaPrefix = "tenure/log-epoch="

func mirrorMetadata(logEpoch int64) string {
	return mirrorMetaPrefix + strconv.FormatInt(logEpoch, 10)
}

// mirroredBy reads a committed offset's metadata: ok if tenure's mirror
// wrote it, with the log epoch of the offset.
func mirroredBy(metadata string) (logEpoch int64, ok bool) {
	v, found := strings.CutPrefix(metadata, mirrorMetaPrefix)
	if !found {
		return 0, false
	}
	// A strict lane's commit names its batch after the log epoch
	// (strictMetadata).
	v, _, _ = strings.Cut(v, " ")
	e, err := strconv.ParseInt(v, 10, 64)
	return e, err == nil
}

// mirrorOffsets runs the mirror until ctx ends.
func (c *Consumer) mirrorOffsets(ctx context.Context, cl *kgo.Client) {
	inflight := make(chan struct{}, 1)
	tick.Every(ctx, mirrorEvery, func() {
		select {
		case inflight <- struct{}{}: // one mirror commit at a time
		default:
			return
		}
		c.commitMirror(ctx, cl, c.snapshotLanes(), func() { <-inflight }, false)
	})
}

// commitMirror commits the acknowledged offsets of lanes that Kafka has not
// accepted yet, and records each partition Kafka accepts (lane.mirrored).
// done runs when the commit is over. sync waits for it.
func (c *Consumer) commitMirror(ctx context.Context, cl *kgo.Client, lanes []*lane, done func(), sync bool) {
	offsets := map[string]map[int32]kgo.EpochOffset{}
	meta := map[string]map[int32]string{}
	sent := map[tp]*lane{}
	for _, l := range lanes {
		a := l.acked.Load()
		if a == nil || a.next <= 0 || a.next == l.mirrored.Load() {
			continue
		}
		if offsets[l.key.Topic] == nil {
			offsets[l.key.Topic] = map[int32]kgo.EpochOffset{}
			meta[l.key.Topic] = map[int32]string{}
		}
		offsets[l.key.Topic][l.key.Partition] = kgo.EpochOffset{Epoch: -1, Offset: a.next}
		meta[l.key.Topic][l.key.Partition] = mirrorMetadata(a.logEpoch)
		sent[tp{l.key.Topic, l.key.Partition}] = l
	}
	if len(offsets) == 0 {
		done()
		return
	}
	// kgo builds the request (member id, epoch, topic ids); the metadata of
	// each partition is set on it before it is sent.
	cctx := kgo.PreCommitFnContext(ctx, func(req *kmsg.OffsetCommitRequest) error {
		for i := range req.Topics {
			t := &req.Topics[i]
			for j := range t.Partitions {
				if m, ok := meta[t.Topic][t.Partitions[j].Partition]; ok {
					t.Partitions[j].Metadata = kmsg.StringPtr(m)
				}
			}
		}
		return nil
	})
	onDone := func(_ *kgo.Client, req *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		defer done()
		if err != nil {
			c.log.Debug("mirroring offsets to Kafka failed; next time", zap.Error(err))
			return
		}
		byID := map[[16]byte]string{}
		for _, t := range req.Topics {
			byID[t.TopicID] = t.Topic
		}
		for _, t := range resp.Topics {
			name := t.Topic
			if name == "" {
				name = byID[t.TopicID] // v10+ answers by topic id
			}
			for _, p := range t.Partitions {
				l := sent[tp{name, p.Partition}]
				if l == nil {
					continue
				}
				if perr := kerr.ErrorForCode(p.ErrorCode); perr != nil {
					c.log.Debug("Kafka did not accept a mirrored offset; next time", zap.String("topic", name),
						zap.Int32("partition", p.Partition), zap.Error(perr))
					continue
				}
				l.mirrored.Store(offsets[name][p.Partition].Offset)
			}
		}
	}
	if sync {
		cl.CommitOffsetsSync(cctx, offsets, onDone)
		return
	}
	cl.CommitOffsets(cctx, offsets, onDone)
}

// committedOffset is a group's committed offset for one partition, as the
// claim reads it: the offset, and whether tenure's mirror wrote it, in
// which log epoch.
type committedOffset struct {
	offset   int64
	tenure   bool
	logEpoch int64
}

// committedOffsets reads the group's committed offsets with their metadata
// (kgo's own fetch, which the claim is given, drops the metadata). A
// partition without one is missing from the map.
func (c *Consumer) committedOffsets(ctx context.Context, cl *kgo.Client) (map[tp]committedOffset, error) {
	var resps kadm.OffsetResponses
	err := c.retry(ctx, "reading the group's committed offsets", c.log, func() (err error) {
		resps, err = kadm.NewClient(cl).FetchOffsets(ctx, c.cfg.Group)
		if err == nil {
			err = resps.Error()
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	out := map[tp]committedOffset{}
	resps.Each(func(r kadm.OffsetResponse) {
		if r.At < 0 {
			return
		}
		co := committedOffset{offset: r.At}
		co.logEpoch, co.tenure = mirroredBy(r.Metadata)
		out[tp{r.Topic, r.Partition}] = co
	})
	return out, nil
}

// divergenceHold returns the hold for a partition whose stored next offset
// (next) is below acked, an offset this group had acknowledged before in
// the same log epoch (mirrored to Kafka, or committed by this very lane),
// or nil. hwm is the log's end: an acknowledged offset beyond it says the
// log changed (a hold of its own), not the database. An operator's
// acceptance of a divergence starts a new log epoch, so the offsets it
// accepted are never compared again, and later losses are.
func (c *Consumer) divergenceHold(key sink.Partition, owner string, next, acked, hwm int64, source string) *sink.Hold {
	if acked <= next || acked > hwm {
		return nil
	}
	c.stats.divergences.Add(1)
	return &sink.Hold{Partition: key, Kind: sink.HoldDiverged, Owner: owner, NextOffset: next, LogStart: -1, HighWatermark: hwm,
		From: -1, To: -1, AckedOffset: acked,
		Reason: fmt.Sprintf("the database's next offset %d is below %d, the offset this group had acknowledged (%s): the database lost "+
			"commits it had acknowledged (a failover to a standby that was behind, a restore); jobs %d to %d would be processed again "+
			"without a word, and their effects outside Postgres redone; acknowledging accepts the database's state and processes them again",
			next, acked, source, next, acked-1)}
}

// mirrorFinal mirrors the stopped lanes' last offsets synchronously, within
// ctx, before a stopping member leaves the group: lag tools then see where
// it stopped.
func (c *Consumer) mirrorFinal(ctx context.Context, cl *kgo.Client, lanes []*lane) {
	c.commitMirror(ctx, cl, lanes, func() {}, true)
}
