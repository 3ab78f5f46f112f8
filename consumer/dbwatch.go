package consumer

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
)

// A worker whose database connections hang (a host that vanished, a
// firewall dropping packets: nothing resets them) still heartbeats to
// Kafka. The coordinator sees a live member and moves nothing, so its
// partitions would sit idle for as long as the cut lasts, beside members
// that could process them. A killed process never shows this: its kernel
// resets every connection at once.
//
// So the worker watches its database itself: a probe (SELECT 1 on a
// connection of its own, every probeEvery, each bounded by probeTimeout)
// and every batch a lane commits say that the database answers. Once it
// has not answered for Config.DatabaseTimeout, the worker steps down: it
// stops its lanes, leaves the group (the coordinator hands its partitions
// to the other members at once; whatever it had in flight is settled by the
// fence: the new owners' claims fence it), and keeps probing. It joins the
// group again, as a new member, once the database has answered
// rejoinAfter probes in a row. A database down for everyone makes every
// worker step down once, and they all join again when it answers: no
// flapping while it is down, one group again when it is back.
//
// DatabaseTimeout is at least as long as a failover or a restart usually
// takes (10s), so that those, which stop every worker alike, do not empty
// the group; and no longer than the group's session timeout otherwise, the
// time after which the coordinator would move the partitions of a member
// that died.

const (
	probeEvery   = time.Second
	probeTimeout = 2 * time.Second
	rejoinAfter  = 2
)

// dbWatch is what the probe knows. lastOK is read by anyone; the rest is
// the probe goroutine's.
type dbWatch struct {
	lastOK atomic.Int64 // unix nanoseconds of the last round trip the database answered
	okRun  atomic.Int32 // probes answered in a row
	down   atomic.Bool  // stepped down: out of the group until the database answers

	mu       sync.Mutex
	stepDown context.CancelFunc // ends the current group session (nil between sessions)
	answered chan struct{}      // closed when okRun reaches rejoinAfter while down
	conn     *pgx.Conn
}

// noteDatabase records that the database answered (a lane's commit).
func (c *Consumer) noteDatabase() {
	c.db.lastOK.Store(time.Now().UnixNano())
}

func (c *Consumer) setStepDown(f context.CancelFunc) {
	c.db.mu.Lock()
	c.db.stepDown = f
	c.db.mu.Unlock()
}

// probeDatabase runs the probe until ctx ends.
func (c *Consumer) probeDatabase(ctx context.Context) {
	c.noteDatabase() // a worker that starts gets a full DatabaseTimeout
	t := time.NewTicker(probeEvery)
	defer t.Stop()
	defer func() {
		if c.db.conn != nil {
			cctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = c.db.conn.Close(cctx)
			cancel()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ok := c.probeOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if ok {
			c.noteDatabase()
			if n := c.db.okRun.Add(1); n >= rejoinAfter && c.db.down.Load() {
				c.db.mu.Lock()
				if c.db.answered != nil {
					close(c.db.answered)
					c.db.answered = nil
				}
				c.db.mu.Unlock()
			}
			continue
		}
		c.db.okRun.Store(0)
		silent := time.Since(time.Unix(0, c.db.lastOK.Load()))
		if c.cfg.DatabaseTimeout < 0 || silent < c.cfg.DatabaseTimeout || c.db.down.Load() {
			continue
		}
		c.db.mu.Lock()
		stepDown := c.db.stepDown
		if stepDown != nil {
			c.db.down.Store(true)
			c.db.answered = make(chan struct{})
		}
		c.db.mu.Unlock()
		if stepDown != nil {
			c.stats.stepDowns.Add(1)
			c.log.Error("the database has not answered for "+silent.Round(time.Second).String()+
				": giving this worker's partitions up (leaving the group) until it answers again",
				zap.Duration("database_timeout", c.cfg.DatabaseTimeout), zap.Bool("stepped_down", true))
			stepDown()
		}
	}
}

// probeOnce runs SELECT 1 on the probe's own connection (opened as the
// store's pool opens its connections), within probeTimeout, connection
// included. A failed probe drops the connection: the next one dials again.
func (c *Consumer) probeOnce(ctx context.Context) bool {
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	if c.db.conn == nil || c.db.conn.IsClosed() {
		conn, err := pgx.ConnectConfig(pctx, c.store.Pool().Config().ConnConfig)
		if err != nil {
			c.log.Debug("database probe: connecting failed", zap.Error(err))
			return false
		}
		c.db.conn = conn
	}
	if _, err := c.db.conn.Exec(pctx, "SELECT 1"); err != nil {
		c.log.Debug("database probe failed", zap.Error(err))
		cctx, ccancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		_ = c.db.conn.Close(cctx) // a connection whose answer may be pending is not reused
		ccancel()
		c.db.conn = nil
		return false
	}
	return true
}

// awaitDatabase waits, stepped down, until the database has answered
// rejoinAfter probes in a row; false if ctx ended first.
func (c *Consumer) awaitDatabase(ctx context.Context) bool {
	c.db.mu.Lock()
	answered := c.db.answered
	c.db.mu.Unlock()
	if answered != nil {
		select {
		case <-ctx.Done():
			return false
		case <-answered:
		}
	}
	c.db.down.Store(false)
	c.log.Warn(MsgRejoining, zap.Bool("stepped_down", false))
	return true
}

// stepDownSession ends a group session whose worker cannot reach its
// database: the lanes are released and cancelled at once (their commits in
// flight are settled by the fence: the next owners' claims fence them), the
// member leaves the group so that the coordinator hands its partitions over
// now rather than after a session timeout, and the client is closed, all
// within leaveTimeout. The lanes finish stopping in the background (a
// commit stuck on a dead connection ends at its CommitTimeout).
func (c *Consumer) stepDownSession(cl *kgo.Client) {
	c.mu.Lock()
	lanes := make([]*lane, 0, len(c.lanes))
	for k, l := range c.lanes {
		lanes = append(lanes, l)
		delete(c.lanes, k)
	}
	c.mu.Unlock()
	for _, l := range lanes {
		l.release()
		l.stopHard()
	}
	go func() {
		for _, l := range lanes {
			<-l.done
		}
		logReleased(lanes, "partition released: the worker stepped down (its database does not answer)")
	}()
	ctx, cancel := context.WithTimeout(context.Background(), leaveTimeout)
	defer cancel()
	if err := cl.LeaveGroupContext(ctx); err != nil {
		c.log.Warn("leaving the group after stepping down", zap.Error(err))
	}
	closed := make(chan struct{})
	go func() { cl.Close(); close(closed) }()
	select {
	case <-closed:
	case <-ctx.Done():
		c.log.Warn("kafka client did not close in time after stepping down; going on without waiting for it")
	}
	c.cl.CompareAndSwap(cl, nil) // Client() is nil while the worker is out of the group
	c.log.Warn(MsgSteppedDown, zap.Int("partitions_released", len(lanes)))
}
