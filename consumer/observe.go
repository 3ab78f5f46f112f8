package consumer

import (
	"errors"
	"slices"
	"strings"

	"go.uber.org/zap"

	"github.com/tenure-dev/tenure/sink"
)

// What a worker tells about itself beyond Stats: the partitions it runs
// lanes for (metrics read their lag), the claim hook, and the log lines of
// ownership events.
//
// Every ownership event of a partition is logged by its lane's logger, so
// one grep for `"topic":"T","partition":P` tells the partition's history on
// a worker: assigned ("claiming partition": member, claim_id, member_epoch,
// start_offset), claimed ("partition claimed", "partition claimed again":
// token, next_offset), fenced ("batch rejected: fenced": token, from, to;
// "claim rejected: fenced": claim_token, held_by, start_offset), reset
// (IncarnationMovedOn: from, to, epoch), stalled ("partition stalled":
// token, next_offset), revoked and lost ("partition revoked", "partition
// lost", once the lane has stopped: token, next_offset), and a graceful
// stop ("partition released: worker stopping"). The member id is the owner
// Postgres records.

// Partitions returns the partitions this worker runs a lane for now (claimed,
// being claimed, recovering or held), sorted by topic and partition.
func (c *Consumer) Partitions() []sink.Partition {
	c.mu.Lock()
	out := make([]sink.Partition, 0, len(c.lanes))
	for _, l := range c.lanes {
		out = append(out, l.key)
	}
	c.mu.Unlock()
	slices.SortFunc(out, func(a, b sink.Partition) int {
		if c := strings.Compare(a.Topic, b.Topic); c != 0 {
			return c
		}
		return int(a.Partition) - int(b.Partition)
	})
	return out
}

// afterClaim calls Hooks.AfterClaim, if set.
func (c *Consumer) afterClaim(p sink.Partition, t sink.Token, next int64, err error) {
	if h := c.cfg.Hooks.AfterClaim; h != nil {
		h(p, t, next, err)
	}
}

// rejectedFields are the log fields of a rejected claim: the token it
// presented and what held the partition.
func rejectedFields(err error) []zap.Field {
	var fe *sink.FencedError
	if !errors.As(err, &fe) {
		return nil
	}
	fields := []zap.Field{zap.Stringer("claim_token", fe.Presented)}
	if fe.Found {
		fields = append(fields, zap.Stringer("held_by_token", fe.Current), zap.String("held_by", fe.CurrentOwner),
			zap.Int64("next_offset", fe.NextOffset))
	}
	return fields
}

// logReleased logs, for each lane, that its partition left this worker, with
// the lane's token and next offset. The lanes must have stopped (stopLanes
// returned): only then may another goroutine read their state.
func logReleased(lanes []*lane, msg string) {
	for _, l := range lanes {
		fields := []zap.Field{zap.Int64("next_offset", l.next)}
		if l.token == (sink.Token{}) {
			// Never claimed: its logger carries no token.
			fields = append(fields, zap.String("token", "none"))
		}
		l.log.Info(msg, fields...)
	}
}
