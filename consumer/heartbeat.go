package consumer

import (
	"context"
	"os"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/tenure-dev/tenure/sink"
)

// Heartbeats: every running member writes its row of the workers table
// (fence.Store.Heartbeat) every heartbeatEvery, so that Describe can tell a
// member that stopped (SIGKILL, a frozen VM) from one whose partitions are
// merely idle, long before the coordinator's session timeout says so.
// Variables, so that tests can shorten them.
var (
	heartbeatEvery = 2 * time.Second
	// workersPruneEvery and workersKept: how often a worker deletes the
	// group's rows not seen for workersKept (rows of members that died).
	workersPruneEvery = time.Minute
	workersKept       = 24 * time.Hour
)

// forgetTimeout bounds deleting the row when the heartbeat stops: a
// database that does not answer must not hold up a stopping worker (the
// row then ages into silence, and is pruned a day later).
const forgetTimeout = time.Second

// startHeartbeat starts writing this member's heartbeat row for the member id
// cl has in the group, and returns the function that stops it and deletes
// the row (a worker that stops gracefully is gone, not silent). session
// defers the stop before the client's shutdown, so that the row is kept
// while the lanes finish their last batches and the member leaves.
func (c *Consumer) startHeartbeat(cl *kgo.Client) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.writeHeartbeats(ctx, cl)
	}()
	return func() {
		cancel()
		<-done
	}
}

func (c *Consumer) writeHeartbeats(ctx context.Context, cl *kgo.Client) {
	host, _ := os.Hostname()
	w := sink.Worker{Group: c.cfg.Group, ClientID: c.cfg.ClientID, Host: host, PID: int32(os.Getpid())}
	written := "" // the member id of the row this loop wrote
	forget := func() {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), forgetTimeout)
		defer cancel()
		if _, err := c.store.ForgetWorker(fctx, c.cfg.Group, written); err != nil {
			c.log.Debug("deleting this member's heartbeat row failed: it reads as silent until pruned", zap.String("member", written), zap.Error(err))
		}
		written = ""
	}
	defer func() {
		if written != "" {
			forget()
		}
	}()
	failing := false
	var pruned time.Time
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		// A member fenced out of a classic group joins again under another
		// id: the old id's row would read as a silent member.
		member, gen := cl.GroupMetadata()
		if written != "" && member != written {
			forget()
		}
		if member != "" {
			w.MemberID = member
			// The generation (classic) or member epoch (KIP-848): what
			// Describe shows for a classic group the coordinator describes
			// without one (every member joined it fresh).
			w.Epoch = nil
			if gen > 0 {
				w.Epoch = &gen
			}
			bctx, cancel := context.WithTimeout(ctx, heartbeatEvery)
			err := c.store.Heartbeat(bctx, w)
			cancel()
			written = member // even a failed statement may have landed
			switch {
			case err != nil && ctx.Err() == nil && !failing:
				failing = true
				c.log.Warn("writing this member's heartbeat failed; admin assignments will read its partitions as owner-silent if it goes on",
					zap.String("member", member), zap.Error(err))
			case err == nil && failing:
				failing = false
				c.log.Info("heartbeat written again", zap.String("member", member))
			}
		}
		if time.Since(pruned) >= workersPruneEvery {
			pruned = time.Now()
			pctx, cancel := context.WithTimeout(ctx, heartbeatEvery)
			if n, err := c.store.PruneWorkers(pctx, c.cfg.Group, workersKept); err == nil && n > 0 {
				c.log.Debug("deleted heartbeat rows of members not seen for a day", zap.Int64("rows", n))
			}
			cancel()
		}
		// Until the member has joined, look for its id often: a member
		// that dies within a beat of joining must have left a row.
		next := heartbeatEvery
		if written == "" {
			next = min(heartbeatEvery, joinPoll)
		}
		t.Reset(next)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// joinPoll is how often the heartbeat loop looks for the member id before
// the member has joined.
const joinPoll = 100 * time.Millisecond
