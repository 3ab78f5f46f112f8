package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/tenure-dev/tenure/sink"
)

// claim is kgo's AdjustFetchOffsetsFn. kgo calls it once the group has given
// this member new partitions and before it fetches any of them; whatever
// offsets it returns become the fetch positions. So this is where each new
// partition is claimed in Postgres, and where Postgres's next offset replaces
// whatever Kafka has committed.
//
// The token is the member's epoch now: the generation (classic) or the member
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
	token := sink.Token{Epoch: epoch}
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
	for topic, parts := range offsets {
		for p, off := range parts {
			start := off.EpochOffset().Offset
			if start < 0 { // no Kafka commit: start of the log
				start = 0
			}
			key := sink.Partition{Group: c.cfg.Group, Topic: topic, Partition: p}
			log := c.log.With(zap.String("topic", topic), zap.Int32("partition", p),
				zap.Stringer("token", token), zap.String("member", member))
			if c.cfg.Hooks.BeforeClaim != nil {
				c.cfg.Hooks.BeforeClaim(ctx, key, token)
			}
			var claimed sink.Claimed
			err := c.retry(ctx, "claim", log, func() error {
				var err error
				claimed, err = c.store.Claim(ctx, sink.ClaimRequest{
					Partition: key, Token: token, Owner: member,
					StartOffset: start, PartitionCount: counts[topic],
				})
				return err
			})
			l := newLane(c, key, token, member, log)
			switch {
			case errors.Is(err, sink.ErrFenced):
				// A higher token holds the partition: this member is behind
				// the group (it will be revoked), so it must not touch it.
				log.Error("claim rejected: fenced", zap.Error(err), zap.Bool("fenced", true))
				l.fence()
			case err != nil:
				return nil, fmt.Errorf("claiming %s: %w", key, err)
			default:
				if claimed.PartitionCount != counts[topic] {
					log.Warn("topic partition count differs from the one recorded at first claim: keys may have moved between partitions",
						zap.Int32("recorded", claimed.PartitionCount), zap.Int32("now", counts[topic]))
				}
				log.Info("partition claimed", zap.Int64("next_offset", claimed.NextOffset))
				l.next = claimed.NextOffset
				// Epoch -1: the position comes from Postgres, not from a
				// Kafka commit, so kgo must not run its data-loss check on
				// it with a leader epoch that belongs to another offset.
				parts[p] = kgo.NewOffset().At(claimed.NextOffset).WithEpoch(-1)
				l.start()
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
