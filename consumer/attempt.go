package consumer

// A lane's attempt and commit path: a batch runs in one transaction
// (handler, fence, COMMIT), its failures are classified by whose they are,
// a failing batch is retried and split down to the job, a job that keeps
// failing is dead-lettered in the fenced transaction that moves past it, and
// a COMMIT whose answer was lost is resolved exactly.

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/tenure-dev/tenure/internal/fence"
	"github.com/tenure-dev/tenure/sink"
)

// lockRetry is the delay before a batch that waited in vain for a row lock
// is tried again.
const lockRetry = 100 * time.Millisecond

// process commits recs, which start at from, and returns the next offset
// after what it committed: every job's effects commit exactly once, or the
// job is dead-lettered in the transaction that moves past it. It returns an
// error only when the lane is fenced or stopped.
//
// What a failure costs depends on whose it is (see Handler and
// classifyHandlerError). A job's failure is counted: the batch is retried
// once (a passing hiccup should not cost a split), then halved; the halves
// run in order, each retried and halved in turn, so the good jobs commit and
// the bad one ends alone. A lone job gets MaxAttempts attempts, or none more
// if its failure is permanent, and is then dead-lettered. A failure that is
// not the job's (tenure's own database work, the batch's connection
// breaking, a Transient error, a SQL error that says the environment is
// wrong) is retried whole, with backoff, until it passes or the lane stops:
// it never splits a batch and never dead-letters anything.
func (l *lane) process(recs []*kgo.Record, from int64) (int64, error) {
	cfg := &l.c.cfg
	b := l.batch(recs, from)
	handlerFailures, stalls := 0, 0
	for attempt := 1; ; attempt++ {
		if attempt > 1 {
			l.c.stats.retries.Add(1)
		}
		ctx, span := l.startBatch(b, attempt)
		err := l.attempt(ctx, b)
		switch {
		case err == nil:
			span.end(OutcomeCommitted, nil)
			l.afterBatch(b, nil)
			return b.To, nil
		case errors.Is(err, sink.ErrFenced):
			span.end(OutcomeFenced, err)
			l.afterBatch(b, err)
			return from, err
		case errors.Is(err, ErrHandlerEndedTx):
			span.end(OutcomeHalted, err)
			return from, err // never again: the lane halts the partition
		case l.stopping():
			span.end(OutcomeStopped, err)
			return from, fmt.Errorf("%w: %v", errStopped, err)
		}
		class := failInfra // whatever is not the handler's is tenure's own database work
		var he *handlerError
		if errors.As(err, &he) {
			class = he.class
		}
		if class != failJob && class != failPermanent {
			span.end(OutcomeRetried, err)
			stalls++
			d := l.c.retryDelay(stalls, err)
			if sqlState(err) == sink.CodeLockNotAvailable {
				// A lock wait: lock_timeout already bounded it, and the
				// lock watch ends an older owner's session; try again at
				// once rather than after a growing backoff.
				d = lockRetry
			}
			fields := []zap.Field{zap.Int64("from", b.From), zap.Int64("to", b.To), zap.Int("attempt", stalls),
				zap.Duration("backoff", d), zap.Stringer("failure", class), zap.Error(err)}
			switch class {
			case failTransient:
				l.c.stats.handlerTransient.Add(1)
				l.log.Warn("handler failed for a reason outside its jobs (Transient, or a lock conflict): retrying the batch, not counting it against its jobs", fields...)
			case failEnvironment:
				l.c.stats.handlerEnvironment.Add(1)
				l.log.Error("the database refused the handler's SQL for a reason that is not the job's (missing table or column, permission, read-only or stopping server): the partition stalls until that is fixed; nothing is dead-lettered",
					append(fields, zap.String("sqlstate", sqlState(err)))...)
			default:
				l.log.Warn("batch failed on the database, retrying", fields...)
			}
			if !l.sleep(d) {
				return from, errStopped
			}
			continue
		}
		if !l.databaseAnswers() {
			// The handler failed while the database is away: not the job's
			// fault, whatever the error says.
			span.end(OutcomeRetried, err)
			stalls++
			if !l.sleep(min(l.c.backoff(stalls), reconnectBackoffMax)) {
				return from, errStopped
			}
			continue
		}
		handlerFailures++
		l.c.stats.handlerFailures.Add(1)
		final := class == failPermanent
		if len(recs) > 1 {
			if handlerFailures < 2 && !final {
				span.end(OutcomeRetried, err)
				d := l.c.backoff(handlerFailures)
				l.log.Warn("batch failed, retrying", zap.Int64("from", b.From), zap.Int64("to", b.To),
					zap.Int("attempt", handlerFailures), zap.Duration("backoff", d), zap.Error(err))
				if !l.sleep(d) {
					return from, errStopped
				}
				continue
			}
			span.end(OutcomeSplit, err)
			mid := len(recs) / 2
			l.log.Warn("batch keeps failing: splitting it to isolate the failing job", zap.Int64("from", b.From), zap.Int64("to", b.To),
				zap.Int("records", len(recs)), zap.Error(err))
			next, err := l.process(recs[:mid], from)
			if err != nil {
				return next, err
			}
			return l.process(recs[mid:], next)
		}
		if handlerFailures < cfg.MaxAttempts && !final {
			span.end(OutcomeRetried, err)
			d := l.c.backoff(handlerFailures)
			l.log.Warn("job failed, retrying", zap.String("job", JobID(recs[0])),
				zap.Int("attempt", handlerFailures), zap.Duration("backoff", d), zap.Error(err))
			if !l.sleep(d) {
				return from, errStopped
			}
			continue
		}
		return l.deadLetter(ctx, span, b, err, handlerFailures)
	}
}

// handlerError is a failed Handle call, classified while its transaction
// was still open: whether the batch's connection survived is part of the
// verdict.
type handlerError struct {
	err   error
	class failure
}

func (e *handlerError) Unwrap() error { return e.err }
func (e *handlerError) Error() string { return e.err.Error() }

// sqlState is the SQLSTATE in err's chain, or "".
func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// databaseAnswers checks, after a handler failure, that the database can run
// a statement, so that an outage (a hung connection looks like a handler
// timeout) is never blamed on the job.
func (l *lane) databaseAnswers() bool {
	ctx, cancel := context.WithTimeout(l.ctx, 5*time.Second)
	defer cancel()
	_, err := l.c.store.Pool().Exec(ctx, "SELECT 1")
	if err != nil {
		l.log.Warn("database does not answer after a handler failure; not counting it against the job", zap.Error(err))
	}
	return err == nil
}

func (l *lane) afterBatch(b *Batch, err error) {
	l.c.noteDatabase() // committed or refused: either way the database answered
	if err == nil {
		l.setAcked(b.To)
		l.c.stats.batches.Add(1)
		l.c.stats.records.Add(int64(len(b.Records)))
	} else {
		l.c.stats.batchesFenced.Add(1)
	}
	if h := l.c.cfg.Hooks.AfterBatch; h != nil {
		h(b, err)
	}
	if err == nil {
		l.log.Debug("batch committed", zap.Int64("from", b.From), zap.Int64("to", b.To), zap.Int("records", len(b.Records)))
	}
}

// deadLetter parks b's single job in the dead-letter table in the fenced
// transaction that moves the partition past it. Database failures are
// retried like any commit. It ends span, the batch span of the job's last
// attempt (ctx is its context), with what became of the job.
func (l *lane) deadLetter(ctx context.Context, span batchSpan, b *Batch, cause error, attempts int) (next int64, err error) {
	span.deadLettered(attempts)
	ctx, ds := l.c.trace.child(ctx, SpanDeadLetter)
	defer func() {
		endSpan(ds, err)
		switch {
		case err == nil:
			span.end(OutcomeDeadLettered, cause)
		case errors.Is(err, sink.ErrFenced):
			span.end(OutcomeFenced, err)
		default:
			span.end(OutcomeStopped, err)
		}
	}()
	r := b.Records[0]
	headers := make([]sink.Header, len(r.Headers))
	for i, h := range r.Headers {
		headers[i] = sink.Header{Key: h.Key, Value: h.Value}
	}
	d := sink.DeadLetter{Partition: l.key, Offset: r.Offset, Key: r.Key, Value: r.Value, Headers: headers,
		Error: cause.Error(), Attempts: attempts, Token: l.token, Owner: l.owner}
	for attempt := 1; ; attempt++ {
		err := l.commitTx(ctx, b, func(ctx context.Context, tx pgx.Tx) error {
			return l.c.store.AddDeadLetter(ctx, tx, d)
		})
		switch {
		case err == nil:
			l.c.stats.deadLetters.Add(1)
			l.log.Error("job dead-lettered", zap.String("job", JobID(r)), zap.Int("attempts", attempts),
				zap.Bool("dead_letter", true), zap.NamedError("cause", cause))
			l.afterBatch(b, nil)
			return b.To, nil
		case errors.Is(err, sink.ErrFenced):
			l.afterBatch(b, err)
			return b.From, err
		case l.stopping():
			return b.From, fmt.Errorf("%w: %v", errStopped, err)
		}
		dl := l.c.retryDelay(attempt, err)
		l.log.Warn("dead-lettering failed, retrying", zap.String("job", JobID(r)), zap.Duration("backoff", dl), zap.Error(err))
		if !l.sleep(dl) {
			return b.From, errStopped
		}
	}
}

// attempt runs the batch once in one transaction: handler, fence, commit.
// ctx is the lane's context, or the batch span's (startBatch).
func (l *lane) attempt(ctx context.Context, b *Batch) error {
	if h := l.c.cfg.Hooks.BeforeBatch; h != nil {
		h(ctx, b)
	}
	work := func(ctx context.Context, tx pgx.Tx) error {
		hctx, cancel := ctx, context.CancelFunc(func() {})
		if l.c.cfg.HandlerTimeout > 0 {
			hctx, cancel = context.WithTimeout(ctx, l.c.cfg.HandlerTimeout)
		}
		defer cancel()
		hctx, hspan := l.c.trace.child(hctx, SpanHandler)
		err := l.handle(hctx, tx, b)
		// Our own timeout, not a stop of the lane.
		timedOut := errors.Is(hctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil
		if err != nil {
			err = &handlerError{err, classifyHandlerError(err, tx.Conn().IsClosed(), timedOut)}
			endSpan(hspan, err)
			return err
		}
		if timedOut {
			// A handler that ignored its context: what it did is rolled back
			// like any timed-out batch, rather than raced against Postgres's
			// idle-in-transaction timeout.
			err := &handlerError{fmt.Errorf("handler timed out after %s (it returned only after its deadline)", l.c.cfg.HandlerTimeout), failJob}
			endSpan(hspan, err)
			return err
		}
		endSpan(hspan, nil)
		if h := l.c.cfg.Hooks.BeforeCommit; h != nil {
			h(ctx, b)
		}
		return nil
	}
	if j := l.c.joint; j != nil {
		return j.commit(ctx, l, b, work, true)
	}
	return l.commitTx(ctx, b, work)
}

// laneConns is how many of a pool of size conns the lanes' transactions
// may hold at once: all but a reserve, so that the protocol's own
// statements find a connection free.
//
// Why: pgxpool hands connections out in the order they were asked for (a
// FIFO semaphore). A worker with more partitions than connections has
// lanes waiting for one all the time, and a claim asked for after them
// waits behind every one of them. Measured with 1,000 partitions over 3
// workers and 32 connections each: once a worker was killed, each of the
// 167 claims a survivor made waited behind some 300 lanes, 0.14 s a claim,
// 23 s for the lot; in another run the claims outlasted ClaimTimeout (30 s),
// the session was abandoned and all 500 partitions were claimed again. With
// the lanes held to the slots, a claim (and a recovery, the offset mirror,
// the fence log's pruning, a commit's resolution) waits at most for one
// of the reserved connections. A lane holds its slot for one transaction,
// from before it acquires the connection until the connection is back.
func laneConns(conns int32) int {
	reserve := min(4, max(1, conns/8)) // 1 for up to 15 connections, 4 from 32
	return int(max(1, conns-reserve))
}

// commitTx runs work in a transaction and has the lane's committer end it
// from b.From to b.To (commit.go: through the fence, strict, or unfenced).
// Errors of the transaction machinery come back marked as infrastructure
// errors; work's own errors come back as they are.
//
// The transaction is opened with a marker (SET LOCAL tenure.tx, a value
// unique to this batch), checked just before the fence in the same
// transaction. A handler whose SQL ended the transaction (COMMIT or
// ROLLBACK) loses the marker: its statements since then ran in autocommit,
// and so would the fence, whose rejection would roll nothing back. The
// check reports that as a *HandlerBugError instead of committing anything.
// Nothing of the handler's can run between the check and the fence: its Tx
// refuses work once Handle has returned.
//
// ctx is the lane's context, or a span's under it: every statement of the
// transaction runs with it, so that a pgx tracer makes them its children.
//
// With Config.CommitSpan above 1 the work runs in a transaction shared with
// other lanes' batches instead (joint.go), with the same outcomes.
func (l *lane) commitTx(ctx context.Context, b *Batch, work func(ctx context.Context, tx pgx.Tx) error) (err error) {
	if l.c.joint != nil {
		return l.c.joint.commit(ctx, l, b, work, false)
	}
	marker := l.c.txMarker()
	opts := l.c.txOptions
	// The claim id in application_name lets a newer owner that waits on
	// this transaction's row locks recognise it as an older claimant's
	// (fence.Store.EndStaleBlockers), and lets Resolve find the session.
	opts.BeginQuery += "; SET LOCAL tenure.tx = '" + marker + "'; SET LOCAL application_name = '" + l.appName + "'"
	// A slot first (laneConns), then a connection.
	slots := l.c.txSlots()
	select {
	case slots <- struct{}{}:
		defer func() { <-slots }()
	case <-ctx.Done():
		return infraError{fmt.Errorf("begin: %w", ctx.Err())}
	}
	// The connection is acquired here, not by the transaction, because the
	// COMMIT travels with the fence (fence.Store.CommitBatch) rather than
	// through tx.Commit: the connection goes back to the pool afterwards.
	conn, err := l.pool.Acquire(ctx)
	if err != nil {
		return infraError{fmt.Errorf("begin: %w", err)}
	}
	defer conn.Release() // a connection left in a transaction is closed, not pooled
	tx, err := conn.BeginTx(ctx, opts)
	if err != nil {
		return infraError{fmt.Errorf("begin: %w", err)}
	}
	t := &openTx{b: b, conn: conn, tx: tx, marker: marker, sess: fence.Session{PID: conn.Conn().PgConn().PID(), AppName: l.appName}}
	owner := laneOwnsTx
	defer func() {
		if owner == laneOwnsTx {
			rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = tx.Rollback(rctx) // a failed rollback closes the connection: nothing survives
		}
	}()
	if l.pooled {
		// Through a transaction pooler the announced pid is the pooler's:
		// ask the server backend that runs this transaction.
		if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&t.sess.PID); err != nil {
			return infraError{fmt.Errorf("begin: %w", err)}
		}
	}
	stopWatch := l.watchLocks(t.sess.PID)
	err = work(ctx, tx)
	stopWatch()
	if err != nil {
		return err
	}
	// From here on, stopping the lane does not cancel: a commit in flight is
	// settled by the fence.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.c.cfg.CommitTimeout)
	defer cancel()
	// One span for the fence statement and COMMIT: one round trip. It ends
	// once the outcome is known (resolved, if the answer was lost).
	cctx, t.span = l.c.trace.child(cctx, SpanFenceCommit)
	defer func() { endSpan(t.span, err) }()
	t.req = sink.CommitRequest{Partition: l.key, Token: l.token, Owner: l.owner, ClaimID: l.claimID, From: b.From, To: b.To, LogEpoch: l.logEpoch}
	owner, err = l.committer.commit(cctx, l, t)
	return err
}

func (l *lane) resolve(req sink.CommitRequest, sess fence.Session, commitErr error) error {
	// Ask until the database answers or the lane is stopped: giving up
	// would leave the lane not knowing its own next offset. A stopped lane
	// may leave it unknown, because the next claim of the partition reads
	// the stored offset, whatever happened.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-l.quit:
			cancel()
		case <-ctx.Done():
		}
	}()
	var out fence.Outcome
	err := l.c.retry(ctx, "resolving a commit of unknown outcome", l.log, func() error {
		var err error
		out, err = l.c.store.ResolveSession(ctx, req, sess)
		return err
	})
	if err != nil && !errors.Is(err, sink.ErrFenced) {
		l.log.Warn("commit outcome still unknown when the lane stopped; the next claim reads the stored offset",
			zap.Int64("from", req.From), zap.Int64("to", req.To), zap.NamedError("commit_error", commitErr), zap.Error(err))
		return fmt.Errorf("%w: commit outcome unknown: %v", errStopped, commitErr)
	}
	l.log.Warn("commit outcome was unknown; resolved from the fencing row",
		zap.Int64("from", req.From), zap.Int64("to", req.To), zap.Stringer("outcome", out), zap.NamedError("commit_error", commitErr))
	switch out {
	case fence.Committed:
		return nil
	case fence.NotCommitted:
		return infraError{fmt.Errorf("commit: %w", commitErr)}
	}
	return err
}

var errPanicked = errors.New("handler panicked")

// handle calls the handler, turning a panic into an error: a bad job must
// never take the worker down with it.
func (l *lane) handle(ctx context.Context, tx pgx.Tx, b *Batch) (err error) {
	htx := newHandlerTx(tx)
	// From here on the handler's Tx (and anything it kept of it) refuses
	// work: what runs next on the connection is tenure's.
	defer htx.close()
	defer func() {
		if r := recover(); r != nil {
			l.log.Error("handler panicked", zap.Any("panic", r), zap.ByteString("stack", debug.Stack()))
			err = fmt.Errorf("%w: %v", errPanicked, r)
		}
	}()
	if err := l.c.cfg.Handler.Handle(ctx, htx, b); err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil && l.ctx.Err() == nil {
			return fmt.Errorf("handler timed out after %s: %w", l.c.cfg.HandlerTimeout, err)
		}
		return fmt.Errorf("handler: %w", err)
	}
	return nil
}
