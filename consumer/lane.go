package consumer

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/tenure-dev/tenure/sink"
)

// lostGrace is how long a lane of a lost partition may go on with the batch
// it is running before its context is cancelled. Whatever it does in that
// time is settled by the fence; the grace only saves work that was about to
// be rejected anyway from being cut off half-way in the handler.
const lostGrace = 2 * time.Second

// commitTimeout bounds the fenced commit of a batch. The commit runs on a
// context that a lane stop does not cancel: once the handler is done, the
// fence (not our belief about ownership) decides whether the batch lands.
const commitTimeout = 15 * time.Second

// errStalled ends a lane whose batch kept failing.
var errStalled = errors.New("partition stalled")

// A lane processes one claimed partition: records in offset order, one batch
// at a time, every batch committed through the fence with the lane's token.
//
// The poll loop appends records (push); the lane goroutine takes batches
// (take). A lane ends when it is stopped (revoke, loss, shutdown), or on its
// own when it is fenced or stalls; then it drops its buffer and keeps its
// partition paused until the group assigns the partition again.
type lane struct {
	c     *Consumer
	key   sink.Partition
	token sink.Token
	owner string
	log   *zap.Logger

	next int64 // the stored next offset as this lane knows it; lane goroutine only

	mu     sync.Mutex
	queue  []*kgo.Record
	paused bool // fetching of the partition is paused (backpressure or ended)
	ended  bool // the lane no longer accepts records

	wake     chan struct{} // cap 1: records arrived
	quit     chan struct{} // soft stop: finish the current batch, start no other
	quitOnce sync.Once
	ctx      context.Context // hard stop: cancels the handler
	cancel   context.CancelFunc
	done     chan struct{}
}

func newLane(c *Consumer, key sink.Partition, token sink.Token, owner string, log *zap.Logger) *lane {
	ctx, cancel := context.WithCancel(context.Background())
	return &lane{
		c: c, key: key, token: token, owner: owner, log: log,
		wake: make(chan struct{}, 1), quit: make(chan struct{}),
		ctx: ctx, cancel: cancel, done: make(chan struct{}),
	}
}

func (l *lane) start() { go l.run() }

// fence ends a lane that never started: its claim was rejected.
func (l *lane) fence() {
	l.end()
	close(l.done)
}

func (l *lane) stopSoft() { l.quitOnce.Do(func() { close(l.quit) }) }

func (l *lane) stopHard() {
	l.stopSoft()
	l.cancel()
}

// highWater is the buffered record count at which fetching pauses; it
// resumes below half of it.
func (l *lane) highWater() int { return 4 * l.c.cfg.BatchMax }

func (l *lane) push(recs []*kgo.Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return
	}
	l.queue = append(l.queue, recs...)
	if len(l.queue) >= l.highWater() && !l.paused {
		l.c.cl.Load().PauseFetchPartitions(map[string][]int32{l.key.Topic: {l.key.Partition}})
		l.paused = true
	}
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// end stops accepting records, drops the buffer and pauses the partition so
// that nothing more is fetched for it on this member.
func (l *lane) end() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ended = true
	l.queue = nil
	if !l.paused {
		l.c.cl.Load().PauseFetchPartitions(map[string][]int32{l.key.Topic: {l.key.Partition}})
		l.paused = true
	}
}

// release undoes the pause when the lane is removed: kgo keeps partitions
// paused across rebalances, and a later assignment must fetch again.
func (l *lane) release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ended = true
	l.queue = nil
	if l.paused {
		l.c.cl.Load().ResumeFetchPartitions(map[string][]int32{l.key.Topic: {l.key.Partition}})
		l.paused = false
	}
}

// take waits for records and returns the next batch, or nil when the lane
// must stop.
func (l *lane) take() *Batch {
	for {
		select {
		case <-l.quit:
			return nil
		default:
		}
		l.mu.Lock()
		// Records below the next offset were committed already (a refetch,
		// or a commit we made that kgo's position has not caught up with).
		i := 0
		for i < len(l.queue) && l.queue[i].Offset < l.next {
			i++
		}
		l.queue = l.queue[i:]
		if n := min(len(l.queue), l.c.cfg.BatchMax); n > 0 {
			recs := make([]*kgo.Record, n)
			copy(recs, l.queue[:n])
			l.queue = l.queue[n:]
			if len(l.queue) == 0 {
				l.queue = nil // let the backing array go
			}
			if l.paused && !l.ended && len(l.queue) < l.highWater()/2 {
				l.c.cl.Load().ResumeFetchPartitions(map[string][]int32{l.key.Topic: {l.key.Partition}})
				l.paused = false
			}
			l.mu.Unlock()
			return &Batch{
				Group: l.key.Group, Topic: l.key.Topic, Partition: l.key.Partition,
				Token: l.token, Owner: l.owner,
				From: l.next, To: recs[n-1].Offset + 1, Records: recs,
			}
		}
		l.mu.Unlock()
		select {
		case <-l.wake:
		case <-l.quit:
			return nil
		}
	}
}

func (l *lane) run() {
	defer close(l.done)
	defer l.release()
	l.log.Debug("lane started", zap.Int64("next_offset", l.next))
	for {
		b := l.take()
		if b == nil {
			return
		}
		err := l.process(b)
		switch {
		case err == nil:
			l.next = b.To
		case errors.Is(err, sink.ErrFenced):
			l.log.Warn("batch rejected: fenced; dropping this partition's buffered records until it is assigned again",
				zap.Bool("fenced", true), zap.Int64("from", b.From), zap.Int64("to", b.To), zap.Error(err))
			l.end()
			return
		case errors.Is(err, errStalled):
			l.end()
			return
		default: // stopped while retrying: nothing committed, nothing lost
			l.log.Info("batch abandoned: lane stopped", zap.Int64("from", b.From), zap.Int64("to", b.To), zap.Error(err))
			return
		}
	}
}

// process runs a batch until it commits, is fenced, exhausts its attempts,
// or the lane stops.
func (l *lane) process(b *Batch) error {
	cfg := &l.c.cfg
	for attempt := 1; ; attempt++ {
		err := l.attempt(b)
		if err == nil || errors.Is(err, sink.ErrFenced) {
			if cfg.Hooks.AfterBatch != nil {
				cfg.Hooks.AfterBatch(b, err)
			}
			if err == nil {
				l.log.Debug("batch committed", zap.Int64("from", b.From), zap.Int64("to", b.To), zap.Int("records", len(b.Records)))
			}
			return err
		}
		if l.ctx.Err() != nil {
			return err
		}
		if attempt >= cfg.MaxAttempts {
			l.log.Error("batch failed on every attempt: partition stalled until it is assigned again or the worker restarts; nothing was skipped",
				zap.Int64("from", b.From), zap.Int64("to", b.To), zap.Int("attempts", attempt), zap.Error(err))
			return fmt.Errorf("%w: %v", errStalled, err)
		}
		d := l.c.backoff(attempt)
		l.log.Warn("batch failed, retrying", zap.Int64("from", b.From), zap.Int64("to", b.To),
			zap.Int("attempt", attempt), zap.Duration("backoff", d), zap.Error(err))
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-l.quit:
			t.Stop()
			return err
		}
	}
}

// attempt runs the batch once in one transaction: handler, fence, commit.
func (l *lane) attempt(b *Batch) (err error) {
	cfg := &l.c.cfg
	ctx := l.ctx
	if cfg.Hooks.BeforeBatch != nil {
		cfg.Hooks.BeforeBatch(ctx, b)
	}
	tx, err := l.c.store.Pool().BeginTx(ctx, l.c.txOptions)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = tx.Rollback(rctx) // a failed rollback closes the connection: nothing survives
		}
	}()
	if err := l.handle(ctx, tx, b); err != nil {
		return err
	}
	if cfg.Hooks.BeforeCommit != nil {
		cfg.Hooks.BeforeCommit(ctx, b)
	}
	// From here on, stopping the lane does not cancel: a commit in flight is
	// settled by the fence.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitTimeout)
	defer cancel()
	req := sink.CommitRequest{Partition: l.key, Token: l.token, Owner: l.owner, From: b.From, To: b.To}
	if err := l.c.store.Commit(cctx, tx, req); err != nil {
		return err
	}
	err = tx.Commit(cctx)
	committed = true // either way the transaction is over
	if err == nil {
		return nil
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return fmt.Errorf("commit: %w", err) // the server refused: not committed
	}
	// The connection broke during COMMIT: the outcome is unknown. Ask the
	// fencing row, which only our commit could have moved to b.To.
	return l.resolve(req, err)
}

func (l *lane) resolve(req sink.CommitRequest, commitErr error) error {
	ctx, cancel := context.WithTimeout(context.Background(), l.c.cfg.ClaimTimeout)
	defer cancel()
	var out sink.Outcome
	err := l.c.retry(ctx, "resolving a commit of unknown outcome", l.log, func() error {
		var err error
		out, err = l.c.store.Resolve(ctx, req)
		return err
	})
	l.log.Warn("commit outcome was unknown; resolved from the fencing row",
		zap.Int64("from", req.From), zap.Int64("to", req.To), zap.Stringer("outcome", out), zap.NamedError("commit_error", commitErr))
	switch {
	case err != nil:
		// Still unknown: do not guess. Fencing this lane makes the partition
		// start again from a fresh claim, which reads the stored offset.
		return &sink.FencedError{Op: "commit", Partition: req.Partition, Presented: req.Token, Owner: req.Owner, From: req.From}
	case out == sink.Committed:
		return nil
	case out == sink.NotCommitted:
		return fmt.Errorf("commit: %w", commitErr)
	}
	return err
}

// handle calls the handler, turning a panic into an error: a bad job must
// never take the worker down with it.
func (l *lane) handle(ctx context.Context, tx pgx.Tx, b *Batch) (err error) {
	defer func() {
		if r := recover(); r != nil {
			l.log.Error("handler panicked", zap.Any("panic", r), zap.ByteString("stack", debug.Stack()))
			err = fmt.Errorf("handler panicked: %v", r)
		}
	}()
	if err := l.c.cfg.Handler.Handle(ctx, tx, b); err != nil {
		return fmt.Errorf("handler: %w", err)
	}
	return nil
}
