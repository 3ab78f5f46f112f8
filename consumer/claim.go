package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/tenure-dev/tenure/sink"
)

// claim is kgo's AdjustFetchOffsetsFn. kgo calls it once the group has given
// this member new partitions and before it fetches any of them; whatever
// offsets it returns become the fetch positions. So this is where each new
// partition is claimed in Postgres, and where Postgres's next offset replaces
// whatever Kafka has committed.
//
// The epoch is the member's epoch now: the generation (classic) or the member
// epoch (KIP-848) under which these partitions were assigned. It is captured
// once, here, and never refreshed: a KIP-848 epoch can rise later without the
// partition moving, and the lane keeps the token it claimed with.
//
// ctx is cancelled if the group session starts revoking; an error returned
// from here makes kgo abandon the session and rejoin, so no partition is ever
// fetched without a claim behind it.
func (c *Consumer) claim(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	cl := c.cl.Load() // set: kgo calls OnPartitionsAssigned first
	member, epoch := cl.GroupMetadata()
	if member == "" || epoch <= 0 {
		return nil, fmt.Errorf("claiming partitions: not in the group yet (member %q, epoch %d)", member, epoch)
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.ClaimTimeout)
	defer cancel()

	topics := make([]string, 0, len(offsets))
	for t := range offsets {
		topics = append(topics, t)
	}
	counts, err := c.partitionCountsOf(ctx, cl, topics)
	if err != nil {
		return nil, err
	}
	// A topic whose partition count changed is not processed until an
	// operator acknowledges the new count; its partitions get blocked lanes
	// that wait for that.
	blocked := map[string]error{}
	for _, t := range topics {
		var lerr error
		err := c.retry(ctx, "checking partition count", c.log, func() error {
			lerr = c.store.CheckLayout(ctx, c.cfg.Group, t, counts[t])
			if errors.Is(lerr, sink.ErrPartitionsChanged) {
				return nil
			}
			return lerr
		})
		if err != nil {
			return nil, err
		}
		if lerr != nil {
			c.log.Error("topic partitions changed: not processing it", zap.String("topic", t), zap.Error(lerr))
			blocked[t] = lerr
		}
	}

	for topic, parts := range offsets {
		for p, off := range parts {
			start := off.EpochOffset().Offset
			if start < 0 { // no Kafka commit: start of the log
				start = 0
			}
			key := sink.Partition{Group: c.cfg.Group, Topic: topic, Partition: p}
			log := c.log.With(zap.String("topic", topic), zap.Int32("partition", p), zap.String("member", member))
			l := newLane(c, key, member, epoch, counts[topic], log)
			if berr := blocked[topic]; berr != nil {
				// Fetch from where the partition stands, paused; the lane
				// claims once the new count is acknowledged.
				if f, err := c.store.Get(ctx, key); err == nil {
					start = f.NextOffset
				}
				parts[p] = kgo.NewOffset().At(start).WithEpoch(-1)
				l.block(start)
			} else {
				claimed, err := c.claimOne(ctx, cl, l, start)
				switch {
				case errors.Is(err, sink.ErrFenced):
					// A higher token holds the partition: this member is
					// behind the group (it will be revoked), so it must not
					// touch it.
					log.Error("claim rejected: fenced", zap.Error(err), zap.Bool("fenced", true))
					l.fence()
				case err != nil:
					return nil, fmt.Errorf("claiming %s: %w", key, err)
				default:
					// Epoch -1: the position comes from Postgres, not from
					// a Kafka commit, so kgo must not run its data-loss
					// check with a leader epoch that belongs to another
					// offset.
					parts[p] = kgo.NewOffset().At(claimed.NextOffset).WithEpoch(-1)
					l.start()
				}
			}
			c.mu.Lock()
			if old := c.lanes[tp{topic, p}]; old != nil {
				// Assigned again without a revoke in between (the session was
				// abandoned): the old lane's token is stale.
				go old.stopHard()
			}
			c.lanes[tp{topic, p}] = l
			c.mu.Unlock()
		}
	}
	return offsets, nil
}

// claimOne claims l's partition, retrying transient errors within ctx, and
// sets the lane's token and next offset. It handles a restarted group:
//
// Deleting a group, or letting it expire while empty, restarts its epochs at
// 1, so every claim of the new group looks stale next to the stored tokens.
// When a claim is rejected by a token of the same incarnation with a higher
// (or equal, other owner) epoch, claimOne asks the group coordinator whether
// this member's epoch is current and owns the partition. If it is, the stored
// epoch can only come from before a restart: claimOne bumps the group's
// incarnation by compare-and-set and claims again with the new one, which
// fences every token of the old incarnation. A zombie from before the restart
// is not current, so it never bumps, and stays fenced.
func (c *Consumer) claimOne(ctx context.Context, cl *kgo.Client, l *lane, start int64) (sink.Claimed, error) {
	if c.cfg.Hooks.BeforeClaim != nil {
		c.cfg.Hooks.BeforeClaim(ctx, l.key, sink.Token{Epoch: l.epoch})
	}
	for round := 0; ; round++ {
		var inc int64
		if err := c.retry(ctx, "reading incarnation", l.log, func() (err error) {
			inc, err = c.store.Incarnation(ctx, c.cfg.Group)
			return err
		}); err != nil {
			return sink.Claimed{}, err
		}
		token := sink.Token{Incarnation: inc, Epoch: l.epoch}
		var claimed sink.Claimed
		err := c.retry(ctx, "claim", l.log, func() (err error) {
			claimed, err = c.store.Claim(ctx, sink.ClaimRequest{
				Partition: l.key, Token: token, Owner: l.owner,
				StartOffset: start, PartitionCount: l.partitions,
			})
			return err
		})
		if err == nil {
			l.token = token
			l.next = claimed.NextOffset
			l.log = l.log.With(zap.Stringer("token", token))
			l.log.Info("partition claimed", zap.Int64("next_offset", claimed.NextOffset))
			return claimed, nil
		}
		var fe *sink.FencedError
		if !errors.As(err, &fe) || !fe.Found || round >= 3 {
			return sink.Claimed{}, err
		}
		switch {
		case inc < fe.Current.Incarnation:
			continue // someone bumped after we read: read again
		case inc > fe.Current.Incarnation:
			return sink.Claimed{}, err // cannot happen: our token would be higher
		}
		current, verr := c.epochIsCurrent(ctx, cl, l, fe.NextOffset)
		if verr != nil {
			return sink.Claimed{}, fmt.Errorf("%w (checking with the coordinator whether epoch %d is current failed: %v)", err, l.epoch, verr)
		}
		if !current {
			return sink.Claimed{}, err
		}
		reason := fmt.Sprintf("epoch %d of member %s is current for %s but %s (owner %s) is stored: the group's epochs restarted",
			l.epoch, l.owner, l.key, fe.Current, fe.CurrentOwner)
		var now int64
		var bumped bool
		if err := c.retry(ctx, "bumping incarnation", l.log, func() (err error) {
			now, bumped, err = c.store.BumpIncarnation(ctx, c.cfg.Group, inc, l.owner, reason)
			return err
		}); err != nil {
			return sink.Claimed{}, err
		}
		l.log.Warn("group epochs restarted: new incarnation", zap.Int64("from", inc), zap.Int64("to", now),
			zap.Bool("bumped_here", bumped), zap.String("reason", reason))
	}
}

// epochIsCurrent asks the group coordinator whether l's epoch is this
// member's current one and the partition is assigned to it.
//
// Classic: an offset commit carrying the generation and member id is
// accepted only if both are current (else ILLEGAL_GENERATION or
// UNKNOWN_MEMBER_ID); the partition's assignment is fixed per generation, and
// this claim runs in the session that assigned it. The commit stores the
// Postgres offset as Kafka's mirror, which does no harm.
//
// KIP-848: epochs are per member and commits are accepted for older epochs,
// so the group is described instead: the member must exist, be at l's epoch
// or later, and hold the partition now.
func (c *Consumer) epochIsCurrent(ctx context.Context, cl *kgo.Client, l *lane, offset int64) (bool, error) {
	// Both checks need the topic's id: KIP-848 describes assignments by
	// topic id (kfake sends no names), and OffsetCommit v10+ names topics by
	// id.
	td, err := kadm.NewClient(cl).ListTopics(ctx, l.key.Topic)
	if err != nil {
		return false, err
	}
	d, ok := td[l.key.Topic]
	if !ok || d.Err != nil {
		return false, fmt.Errorf("topic %q metadata: %v", l.key.Topic, d.Err)
	}
	if c.cfg.Protocol == NextGen {
		req := kmsg.NewPtrConsumerGroupDescribeRequest()
		req.Groups = []string{c.cfg.Group}
		resp, err := req.RequestWith(ctx, cl)
		if err != nil {
			return false, err
		}
		if len(resp.Groups) != 1 {
			return false, errors.New("malformed consumer group describe response")
		}
		g := resp.Groups[0]
		if err := kerr.ErrorForCode(g.ErrorCode); err != nil {
			return false, err
		}
		for _, m := range g.Members {
			if m.MemberID != l.owner {
				continue
			}
			l.log.Debug("coordinator's view of this member", zap.Int32("member_epoch", m.MemberEpoch))
			if m.MemberEpoch < l.epoch {
				return false, nil
			}
			for _, t := range m.Assignment.TopicPartitions {
				if t.TopicID != d.ID && t.Topic != l.key.Topic {
					continue
				}
				for _, p := range t.Partitions {
					if p == l.key.Partition {
						return true, nil
					}
				}
			}
			return false, nil
		}
		return false, nil
	}
	req := kmsg.NewPtrOffsetCommitRequest()
	req.Group = c.cfg.Group
	req.Generation = l.epoch
	req.MemberID = l.owner
	rt := kmsg.NewOffsetCommitRequestTopic()
	rt.Topic = l.key.Topic
	rt.TopicID = d.ID
	rp := kmsg.NewOffsetCommitRequestTopicPartition()
	rp.Partition = l.key.Partition
	rp.Offset = offset
	rp.LeaderEpoch = -1
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return false, err
	}
	if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
		return false, errors.New("malformed offset commit response")
	}
	switch err := kerr.ErrorForCode(resp.Topics[0].Partitions[0].ErrorCode); {
	case err == nil:
		return true, nil
	case errors.Is(err, kerr.IllegalGeneration), errors.Is(err, kerr.UnknownMemberID),
		errors.Is(err, kerr.StaleMemberEpoch), errors.Is(err, kerr.FencedMemberEpoch):
		return false, nil
	default:
		return false, err
	}
}

func (c *Consumer) partitionCountsOf(ctx context.Context, cl *kgo.Client, topics []string) (map[string]int32, error) {
	adm := kadm.NewClient(cl)
	var out map[string]int32
	err := c.retry(ctx, "metadata", c.log, func() error {
		td, err := adm.ListTopics(ctx, topics...)
		if err != nil {
			return err
		}
		out = make(map[string]int32, len(topics))
		for _, t := range topics {
			d, ok := td[t]
			if !ok || d.Err != nil || len(d.Partitions) == 0 {
				return fmt.Errorf("topic %q has no partitions in metadata (%v)", t, d.Err)
			}
			out[t] = int32(len(d.Partitions))
		}
		return nil
	})
	return out, err
}

// retry runs fn until it succeeds, returns an error matching sink.ErrFenced,
// or ctx ends; between attempts it backs off like a failing batch does.
func (c *Consumer) retry(ctx context.Context, what string, log *zap.Logger, fn func() error) error {
	for attempt := 1; ; attempt++ {
		err := fn()
		if err == nil || errors.Is(err, sink.ErrFenced) {
			return err
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w (last error: %v)", what, ctx.Err(), err)
		}
		d := c.backoff(attempt)
		log.Warn(what+" failed, retrying", zap.Error(err), zap.Int("attempt", attempt), zap.Duration("backoff", d))
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%s: %w (last error: %v)", what, ctx.Err(), err)
		case <-t.C:
		}
	}
}

// backoff is the delay after the given failed attempt (1-based): capped
// exponential.
func (c *Consumer) backoff(attempt int) time.Duration {
	d := c.cfg.RetryBackoff
	for i := 1; i < attempt && d < c.cfg.RetryBackoffMax; i++ {
		d *= 2
	}
	return min(d, c.cfg.RetryBackoffMax)
}
