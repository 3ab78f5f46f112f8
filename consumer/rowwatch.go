package consumer

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/tenure-dev/tenure/internal/tick"
	"github.com/tenure-dev/tenure/sink"
)

// An operator can move a partition's stored offset while a lane holds it
// (`tenure admin offsets reset`, sink.Store.ResetOffset): the reset starts
// a new log epoch, so a busy lane's next commit is fenced and the lane
// claims again and goes on from the new offset. An idle lane commits
// nothing, so it never noticed: no job ran again until new traffic came or
// the partition moved to another member, which is not what an operator
// expects of a reset (Kafka's own tool takes effect when the consumers next
// start). So every worker reads the fencing rows of its lanes every
// rowWatchEvery and tells a lane whose row another hand changed (another
// claim id, another log epoch) to claim again, busy or idle. It is one
// SELECT, so it works through a transaction pooler (LISTEN/NOTIFY does
// not pass PgBouncer in transaction pooling).
const rowWatchEvery = 2 * time.Second

// errRowMoved: the lane's fencing row was changed by someone else (an
// operator's reset, another claim): the lane claims again (recover).
var errRowMoved = errors.New("the partition's fencing row was changed by someone else (an offset reset, another claim)")

// watchRows runs the row watch until ctx ends.
func (c *Consumer) watchRows(ctx context.Context) {
	tick.Every(ctx, rowWatchEvery, func() { c.checkRows(ctx) })
}

// checkRows compares the fencing row of each running lane with what the
// lane last saw of it, and nudges the lanes whose row moved under them.
func (c *Consumer) checkRows(ctx context.Context) {
	c.mu.Lock()
	lanes := make([]*lane, 0, len(c.lanes))
	for _, l := range c.lanes {
		// A lane that has not claimed yet, or is recovering, reads the
		// row itself as it claims.
		if l.acked.Load() != nil && !l.inRecovery.Load() {
			lanes = append(lanes, l)
		}
	}
	c.mu.Unlock()
	if len(lanes) == 0 {
		return
	}
	parts := make([]sink.Partition, len(lanes))
	for i, l := range lanes {
		parts[i] = l.key
	}
	rctx, cancel := context.WithTimeout(ctx, rowWatchEvery)
	rows, err := c.store.FenceRows(rctx, c.cfg.Group, parts)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			c.log.Debug("reading the lanes' fencing rows failed; next time", zap.Error(err))
		}
		return
	}
	for _, l := range lanes {
		row, ok := rows[l.key]
		a := l.acked.Load()
		if !ok || l.inRecovery.Load() || (row.ClaimID == l.claimID && row.LogEpoch == a.logEpoch) {
			continue
		}
		l.nudge(row)
	}
}

// nudge tells the lane that its fencing row moved under it (row, as read):
// it claims again once its current batch is over, or at once if idle.
func (l *lane) nudge(row sink.Fence) {
	if l.rowMoved.Swap(true) {
		return
	}
	// baseLog, not log: nudge runs on the row watch's goroutine, and the
	// lane's own goroutine replaces l.log (with the new token) as it claims.
	l.baseLog.Info("the partition's fencing row changed under the lane: claiming it again",
		zap.Int64("row_claim_id", row.ClaimID), zap.Int64("row_log_epoch", row.LogEpoch), zap.Int64("row_next_offset", row.NextOffset))
	l.wakeUp()
}
