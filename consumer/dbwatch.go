package consumer

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/tenure-dev/tenure/internal/tick"
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
	probeEvery = time.Second
	// probeTimeout bounds a probe's SELECT 1 on an open connection: its
	// answer, not its dial (see probeOnce).
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

// databaseAnsweredSince reports whether the database answered (a probe, a
// commit) at or after t.
func (c *Consumer) databaseAnsweredSince(t time.Time) bool {
	return c.db.lastOK.Load() >= t.UnixNano()
}

func (c *Consumer) setStepDown(f context.CancelFunc) {
	c.db.mu.Lock()
	c.db.stepDown = f
	c.db.mu.Unlock()
}

// probeDatabase runs the database watch until ctx ends: the probes on a
// goroutine of their own, and the judgement (step down?) here, every
// probeEvery. They are apart because a probe may take long to dial (below)
// and the judgement must not wait for it: a database that has not answered
// for DatabaseTimeout has not answered, whatever the probe is doing.
func (c *Consumer) probeDatabase(ctx context.Context) {
	c.noteDatabase() // a worker that starts gets a full DatabaseTimeout
	probed := make(chan struct{})
	go func() {
		defer close(probed)
		c.runProbes(ctx)
	}()
	defer func() { <-probed }()
	tick.Every(ctx, probeEvery, c.judgeDatabase)
}

// judgeDatabase steps the worker down when the database has not answered
// for DatabaseTimeout and it is not down already.
func (c *Consumer) judgeDatabase() {
	silent := time.Since(time.Unix(0, c.db.lastOK.Load()))
	if c.cfg.DatabaseTimeout < 0 || silent < c.cfg.DatabaseTimeout || c.db.down.Load() {
		return
	}
	c.db.mu.Lock()
	stepDown := c.db.stepDown
	if stepDown != nil {
		c.db.down.Store(true)
		c.db.okRun.Store(0)
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

// runProbes probes the database every probeEvery (one probe at a time)
// until ctx ends, and notes each answer.
func (c *Consumer) runProbes(ctx context.Context) {
	defer func() {
		if c.db.conn != nil {
			cctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = c.db.conn.Close(cctx)
			cancel()
		}
	}()
	tick.Every(ctx, probeEvery, func() {
		ok := c.probeOnce(ctx)
		if ctx.Err() != nil {
			return // the probe was cut short: no answer either way
		}
		if !ok {
			c.db.okRun.Store(0)
			return
		}
		c.noteDatabase()
		if n := c.db.okRun.Add(1); n >= rejoinAfter && c.db.down.Load() {
			c.db.mu.Lock()
			if c.db.answered != nil {
				close(c.db.answered)
				c.db.answered = nil
			}
			c.db.mu.Unlock()
		}
	})
}

// probeOnce reports whether the database answered one round trip: SELECT 1
// on the probe's own connection (opened as the store's pool opens its
// connections) within probeTimeout.
//
// The dial is not part of that budget. A multi-host URL (db1,db2, what a
// formation's clients use) tries its hosts in turn, each for up to
// connect_timeout: after a failover whose old primary's host is gone
// (packets dropped), every new connection spends connect_timeout on it
// before it reaches the new primary, as the pool's own connections do.
// A probe that counted the dial would never get past it, and a worker that
// stepped down would never join again. So the dial gets the time the
// pool's dial gets: connect_timeout for every host (dialBudget).
//
// Any completed round trip is an answer: a server that refuses the
// connection (too many connections, a role's connection limit, a login it
// rejects, a server starting up) or the statement has answered, which is
// what the watch asks. The worker's own pool may well work meanwhile (its
// connections are open), and stepping down would not help: the server
// refuses everyone alike. A failed probe drops the connection (one whose
// answer may be pending is not reused): the next one dials again.
func (c *Consumer) probeOnce(ctx context.Context) bool {
	if c.db.conn == nil || c.db.conn.IsClosed() {
		cfg := c.store.Pool().Config().ConnConfig
		dctx, cancel := context.WithTimeout(ctx, dialBudget(cfg, c.cfg.DatabaseTimeout))
		conn, err := pgx.ConnectConfig(dctx, cfg)
		cancel()
		if err != nil {
			c.log.Debug("database probe: connecting failed", zap.Error(err))
			return serverAnswered(err)
		}
		c.db.conn = conn
	}
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	if _, err := c.db.conn.Exec(pctx, "SELECT 1"); err != nil {
		c.log.Debug("database probe failed", zap.Error(err))
		cctx, ccancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		_ = c.db.conn.Close(cctx)
		ccancel()
		c.db.conn = nil
		return serverAnswered(err)
	}
	return true
}

// dialBudget is how long the probe may take to open its connection: at
// least as long as pgx takes to try every host of cfg with its
// connect_timeout (a host that resolves to several addresses, or a
// preferred host tried again last, costs one more), and never less than
// the database timeout (the judgement does not wait for the dial anyway).
func dialBudget(cfg *pgx.ConnConfig, databaseTimeout time.Duration) time.Duration {
	d := max(databaseTimeout, probeTimeout)
	if cfg.ConnectTimeout > 0 {
		// Fallbacks also hold a host's other TLS modes, which pgx tries
		// within the same host's timeout: count hosts, not fallbacks.
		hosts := map[string]bool{cfg.Host + ":" + strconv.Itoa(int(cfg.Port)): true}
		for _, f := range cfg.Fallbacks {
			hosts[f.Host+":"+strconv.Itoa(int(f.Port))] = true
		}
		d = max(d, time.Duration(1+len(hosts))*cfg.ConnectTimeout+probeTimeout)
	}
	return d
}

// serverAnswered reports whether err came from the server itself (a
// PostgreSQL error response): the network path works.
func serverAnswered(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr)
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
	lanes := c.endSession(cl)
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
