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
			// The partitions this worker already runs are held too: the
			// new layout applies to the whole topic.
			c.holdTopic(t, counts[t])
		}
	}

	// One confirmation for the whole assignment; claimOne asks again only if
	// a claim is rejected.
	g, err := c.readGrant(ctx, cl, member, epoch, topics)
	if err != nil {
		return nil, err
	}
	for topic, parts := range offsets {
		for p, off := range parts {
			start := off.EpochOffset().Offset
			if start < 0 { // no Kafka commit: start of the log
				start = 0
			}
			c.mu.Lock()
			if old := c.lanes[tp{topic, p}]; old != nil {
				// Assigned again without a revoke in between (the session was
				// abandoned): the old lane's token is stale. It is released
				// before the new lane exists, so that it can no longer pause
				// or resume the partition under the new lane.
				delete(c.lanes, tp{topic, p})
				old.release()
				go old.stopHard()
			}
			c.mu.Unlock()
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
				claimed, err := c.claimOne(ctx, cl, l, start, g)
				switch {
				case errors.Is(err, sink.ErrFenced):
					// A higher token holds the partition: this member is
					// behind the group (it will be revoked), so it must not
					// touch it.
					c.stats.claimsRejected.Add(1)
					log.Error("claim rejected: fenced", zap.Error(err), zap.Bool("fenced", true))
					l.fence()
				case err != nil:
					log.Warn("claim failed: abandoning the group session to rejoin", zap.Error(err))
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
			c.lanes[tp{topic, p}] = l
			c.mu.Unlock()
		}
	}
	return offsets, nil
}

// claimOne claims l's partition, retrying transient errors within ctx, and
// sets the lane's token and next offset.
//
// The token is (incarnation, epoch), and the order of the steps is what
// makes it safe:
//
//  1. read the group's incarnation from Postgres;
//  2. have the group coordinator confirm that l's epoch is this member's
//     current one and that it holds the partition (a zombie is refused here);
//  3. claim with (incarnation read in 1, epoch).
//
// Deleting a group, or letting it expire while empty, restarts its epochs at
// 1, so the first claims after a reset are rejected by the old, higher
// tokens. A rejection by the same incarnation with an epoch at or above ours,
// although the coordinator confirmed ours after we read the incarnation, can
// only mean the epochs restarted: claimOne bumps the incarnation by
// compare-and-set and starts over, which fences every token of the old
// incarnation.
//
// Why step 1 comes before step 2: a worker paused between confirming and
// claiming may wake after a reset and a bump. Had it read the incarnation
// after the pause, it would pair its old, high epoch with the new
// incarnation and beat the legitimate post-reset owner. Read before the
// confirmation, its incarnation is the old one and its claim loses.
func (c *Consumer) claimOne(ctx context.Context, cl *kgo.Client, l *lane, start int64, g *grant) (sink.Claimed, error) {
	if c.cfg.Hooks.BeforeClaim != nil {
		c.cfg.Hooks.BeforeClaim(ctx, l.key, sink.Token{Epoch: l.epoch})
	}
	for round := 0; ; round++ {
		if g == nil || round > 0 {
			var err error
			if g, err = c.readGrant(ctx, cl, l.owner, l.epoch, []string{l.key.Topic}); err != nil {
				return sink.Claimed{}, err
			}
		}
		if !g.holds(l.key.Topic, l.key.Partition) {
			return sink.Claimed{}, fmt.Errorf("%w: the group coordinator does not confirm that member %s holds %s at epoch %d",
				sink.ErrFenced, l.owner, l.key, l.epoch)
		}
		token := sink.Token{Incarnation: g.inc, Epoch: l.epoch}
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
			l.log = l.baseLog.With(zap.Stringer("token", token))
			c.stats.claims.Add(1)
			l.log.Info("partition claimed", zap.Int64("next_offset", claimed.NextOffset))
			return claimed, nil
		}
		var fe *sink.FencedError
		if !errors.As(err, &fe) || !fe.Found || round >= 3 {
			return sink.Claimed{}, err
		}
		switch {
		case g.inc < fe.Current.Incarnation:
			continue // bumped after we read it: read, confirm and claim again
		case g.inc > fe.Current.Incarnation:
			return sink.Claimed{}, err // cannot happen: our token would be higher
		}
		reason := fmt.Sprintf("epoch %d of member %s is current for %s but %s (owner %s) is stored: the group's epochs restarted",
			l.epoch, l.owner, l.key, fe.Current, fe.CurrentOwner)
		var now int64
		var bumped bool
		if err := c.retry(ctx, "bumping incarnation", l.log, func() (err error) {
			now, bumped, err = c.store.BumpIncarnation(ctx, c.cfg.Group, g.inc, l.owner, reason)
			return err
		}); err != nil {
			return sink.Claimed{}, err
		}
		if bumped {
			c.stats.resets.Add(1)
		}
		l.log.Warn("group epochs restarted: new incarnation", zap.Int64("from", g.inc), zap.Int64("to", now),
			zap.Bool("bumped_here", bumped), zap.String("reason", reason))
	}
}

// grant is what the coordinator confirmed about this member, after the
// incarnation inc was read.
type grant struct {
	inc     int64
	current bool                      // the member's epoch is current
	parts   map[string]map[int32]bool // KIP-848: partitions the coordinator says the member holds; nil: all
}

func (g *grant) holds(topic string, p int32) bool {
	if !g.current {
		return false
	}
	return g.parts == nil || g.parts[topic][p]
}

// readGrant reads the group's incarnation, then asks the coordinator whether
// epoch is member's current epoch (see claimOne for why in this order).
//
// Classic: a heartbeat carrying the generation and member id is accepted
// only if both are current (else ILLEGAL_GENERATION or UNKNOWN_MEMBER_ID;
// REBALANCE_IN_PROGRESS also means the generation matched); a classic
// member's partitions are fixed per generation, and the claim runs in the
// session that assigned them.
//
// KIP-848: epochs are per member, so the group is described instead: the
// member must exist at epoch or later, and the partition must be in its
// current assignment.
func (c *Consumer) readGrant(ctx context.Context, cl *kgo.Client, member string, epoch int32, topics []string) (*grant, error) {
	g := &grant{}
	if err := c.retry(ctx, "reading incarnation", c.log, func() (err error) {
		g.inc, err = c.store.Incarnation(ctx, c.cfg.Group)
		return err
	}); err != nil {
		return nil, err
	}
	err := c.retry(ctx, "confirming the epoch with the group coordinator", c.log, func() error {
		var err error
		if c.cfg.Protocol == NextGen {
			g.current, g.parts, err = c.describeMember(ctx, cl, member, epoch, topics)
		} else {
			g.current, err = c.heartbeat(ctx, cl, member, epoch)
		}
		return err
	})
	return g, err
}

func (c *Consumer) heartbeat(ctx context.Context, cl *kgo.Client, member string, epoch int32) (bool, error) {
	req := kmsg.NewPtrHeartbeatRequest()
	req.Group = c.cfg.Group
	req.Generation = epoch
	req.MemberID = member
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return false, err
	}
	switch err := kerr.ErrorForCode(resp.ErrorCode); {
	case err == nil, errors.Is(err, kerr.RebalanceInProgress):
		return true, nil
	case errors.Is(err, kerr.IllegalGeneration), errors.Is(err, kerr.UnknownMemberID), errors.Is(err, kerr.FencedInstanceID):
		return false, nil
	default:
		return false, err
	}
}

func (c *Consumer) describeMember(ctx context.Context, cl *kgo.Client, member string, epoch int32, topics []string) (bool, map[string]map[int32]bool, error) {
	// kfake describes assignments by topic id only; map ids to names.
	td, err := kadm.NewClient(cl).ListTopics(ctx, topics...)
	if err != nil {
		return false, nil, err
	}
	names := map[[16]byte]string{}
	for _, d := range td {
		if d.Err == nil {
			names[d.ID] = d.Topic
		}
	}
	req := kmsg.NewPtrConsumerGroupDescribeRequest()
	req.Groups = []string{c.cfg.Group}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return false, nil, err
	}
	if len(resp.Groups) != 1 {
		return false, nil, errors.New("malformed consumer group describe response")
	}
	if err := kerr.ErrorForCode(resp.Groups[0].ErrorCode); err != nil {
		if errors.Is(err, kerr.GroupIDNotFound) {
			return false, nil, nil
		}
		return false, nil, err
	}
	for _, m := range resp.Groups[0].Members {
		if m.MemberID != member {
			continue
		}
		if m.MemberEpoch < epoch {
			return false, nil, nil
		}
		parts := map[string]map[int32]bool{}
		for _, t := range m.Assignment.TopicPartitions {
			name := t.Topic
			if n, ok := names[t.TopicID]; ok {
				name = n
			}
			if parts[name] == nil {
				parts[name] = map[int32]bool{}
			}
			for _, p := range t.Partitions {
				parts[name][p] = true
			}
		}
		return true, parts, nil
	}
	return false, nil, nil
}

// partitionCountsOf asks the cluster for the topics' partition counts with
// a metadata request of its own: kgo's cached metadata can be minutes old,
// and a stale count would let new partitions through the layout check.
func (c *Consumer) partitionCountsOf(ctx context.Context, cl *kgo.Client, topics []string) (map[string]int32, error) {
	var out map[string]int32
	err := c.retry(ctx, "metadata", c.log, func() (err error) {
		out, err = partitionCounts(ctx, cl, topics)
		return err
	})
	return out, err
}

func partitionCounts(ctx context.Context, cl *kgo.Client, topics []string) (map[string]int32, error) {
	req := kmsg.NewPtrMetadataRequest()
	for _, t := range topics {
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(t)
		req.Topics = append(req.Topics, rt)
	}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, err
	}
	out := make(map[string]int32, len(topics))
	for _, t := range resp.Topics {
		if t.Topic == nil {
			continue
		}
		if err := kerr.ErrorForCode(t.ErrorCode); err != nil {
			return nil, fmt.Errorf("topic %q: %w", *t.Topic, err)
		}
		out[*t.Topic] = int32(len(t.Partitions))
	}
	for _, t := range topics {
		if out[t] <= 0 {
			return nil, fmt.Errorf("topic %q has no partitions in metadata", t)
		}
	}
	return out, nil
}

// watchLayouts checks every layoutWatch that the topics' partition counts
// are still the ones the group recorded. Assignments check it too, but a
// worker whose assignment does not change would otherwise go on processing
// a topic whose keys now map elsewhere. On a change, every lane of the topic
// finishes its batch and waits for the operator's acknowledgement.
func (c *Consumer) watchLayouts(ctx context.Context, cl *kgo.Client) {
	t := time.NewTicker(layoutWatch)
	defer t.Stop()
	warned := map[string]int32{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		counts, err := partitionCounts(ctx, cl, c.cfg.Topics)
		if err != nil {
			c.log.Debug("partition count check skipped", zap.Error(err))
			continue
		}
		for topic, n := range counts {
			err := c.store.CheckLayout(ctx, c.cfg.Group, topic, n)
			if !errors.Is(err, sink.ErrPartitionsChanged) {
				continue
			}
			if warned[topic] != n {
				warned[topic] = n
				c.log.Error("topic partitions changed: not processing it", zap.String("topic", topic), zap.Error(err))
				// kgo refreshes metadata every few minutes; a classic
				// group's leader assigns the new partitions only once it
				// sees them.
				cl.ForceMetadataRefresh()
			}
			c.holdTopic(topic, n)
		}
	}
}

// holdTopic makes every lane of topic wait for the acknowledgement of n
// partitions.
func (c *Consumer) holdTopic(topic string, n int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, l := range c.lanes {
		if k.topic == topic {
			l.holdForLayout(n)
		}
	}
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
