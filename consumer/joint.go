package consumer

// Commits that span partitions (Config.CommitSpan above 1): the ready
// batches of several lanes share one transaction, each in a savepoint of
// its own, and end with one fence statement over all their partitions and
// COMMIT (fence.Store.CommitJoint). docs/fencing.md, "Commits that span
// partitions", says why the guarantee holds for each partition unchanged.

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/tenure-dev/tenure/internal/fence"
	"github.com/tenure-dev/tenure/sink"
)

// jointSavepoint is the savepoint each batch of a joint transaction runs
// in: a batch that fails is rolled back to it, alone.
const jointSavepoint = "tenure_batch"

// jointCommitter runs the worker's joint transactions. A lane whose batch
// is ready queues it (commit) and waits for its outcome. Runners, at most
// Config.CommitTransactions at once, each take a transaction slot
// (laneConns, shared with the claims) and then their share of what is
// queued (take), up to span batches, and go again until they find the
// queue empty. Nothing waits
// for more batches to come: the batches that become ready while the
// runners are busy wait for the next transactions and share them.
//
// The queue is first come, first served, except for a lane's first batch
// since its claim (laneCommit.fresh), which goes ahead of the batches of
// lanes that have committed since theirs: a partition handed over from a
// worker that died has waited a session timeout already, and behind a
// backlog every other lane has a batch waiting (at 1,000 partitions over
// 3 workers, its first commit came about a second after its claim).
type jointCommitter struct {
	c    *Consumer
	span int
	// batches is the handler when it takes several batches in one call
	// (a BatchesHandler), nil otherwise.
	batches BatchesHandler

	mu    sync.Mutex
	queue []*jointEntry
	fresh int // the fresh lanes' batches, at the head of the queue
	// runners is how many runners are under way (at most parallel). A
	// runner leaves only under mu when it finds the queue empty, and
	// commit starts one under mu after queueing when fewer are under way:
	// a queued batch always has a runner to take it.
	runners int
}

// jointEntry is one lane's batch in the joint committer: the work commitTx
// would run in a transaction of its own, and where its outcome goes.
type jointEntry struct {
	l    *lane
	b    *Batch
	ctx  context.Context // the lane's, or its batch span's
	work func(ctx context.Context, tx pgx.Tx) error
	req  sink.CommitRequest
	// handler: work is the Handler's call on b, which a BatchesHandler
	// call may take instead; alone: such a call with b failed, and b runs
	// through work only from now on.
	handler, alone bool
	// taken: a runner has it (under jointCommitter.mu); the lane must wait
	// for its outcome.
	taken bool
	done  chan error // cap 1: exactly one outcome
}

func newJointCommitter(c *Consumer) *jointCommitter {
	if c.cfg.CommitSpan <= 1 || c.cfg.Strict || c.cfg.UnsafeNoFence {
		return nil
	}
	bh, _ := c.cfg.Handler.(BatchesHandler)
	return &jointCommitter{c: c, span: c.cfg.CommitSpan, batches: bh}
}

// commit is commitTx for a joint committer: b's work runs in a joint
// transaction, and the error means what commitTx's does. handler: work is
// the Handler's call on b (lane.attempt).
func (j *jointCommitter) commit(ctx context.Context, l *lane, b *Batch, work func(ctx context.Context, tx pgx.Tx) error, handler bool) error {
	e := &jointEntry{l: l, b: b, ctx: ctx, work: work, handler: handler, done: make(chan error, 1),
		req: sink.CommitRequest{Partition: l.key, Token: l.token, Owner: l.owner, ClaimID: l.claimID, From: b.From, To: b.To, LogEpoch: l.logEpoch}}
	j.mu.Lock()
	j.enqueue(e, l.fresh)
	if j.runners < j.parallel() {
		j.runners++
		go j.run()
	}
	j.mu.Unlock()
	var err error
	select {
	case err = <-e.done:
	case <-ctx.Done():
		j.mu.Lock()
		if !e.taken {
			// Still queued: nothing of it ran. Leave as commitTx does
			// when it cannot get a slot.
			j.dequeue(e)
			j.mu.Unlock()
			return infraError{fmt.Errorf("begin: %w", ctx.Err())}
		}
		j.mu.Unlock()
		// Its transaction is under way: a commit in flight is settled by
		// the fence, and the runner answers once it is (the handler sees
		// ctx cancelled, the commit is bounded by CommitTimeout).
		err = <-e.done
	}
	if err == nil {
		l.fresh = false
	}
	return err
}

// enqueue queues e (under mu): behind the other fresh lanes' batches if
// fresh, at the end otherwise.
func (j *jointCommitter) enqueue(e *jointEntry, fresh bool) {
	if !fresh {
		j.queue = append(j.queue, e)
		return
	}
	j.queue = slices.Insert(j.queue, j.fresh, e)
	j.fresh++
}

// dequeue takes e, still queued, out of the queue (under mu).
func (j *jointCommitter) dequeue(e *jointEntry) {
	if i := slices.Index(j.queue, e); i >= 0 {
		j.queue = slices.Delete(j.queue, i, i+1)
		if i < j.fresh {
			j.fresh--
		}
	}
}

// run takes a transaction slot, then up to span queued batches, and
// commits them, until it finds the queue empty.
func (j *jointCommitter) run() {
	for {
		slots := j.c.txSlots()
		slots <- struct{}{}
		entries := j.take()
		if entries == nil {
			<-slots
			return
		}
		// Each round either ends every batch it ran or runs again without
		// the ones it refused or answered: at most len(entries) rounds.
		n := len(entries)
		for round := 0; len(entries) > 0 && round <= n; round++ {
			entries = j.runTx(entries)
		}
		for _, e := range entries { // never: the loop's bound is not reached
			e.done <- infraError{errors.New("joint commit: too many rounds")}
		}
		<-slots
	}
}

// take takes up to span queued batches; with none queued, the runner
// leaves (nil).
func (j *jointCommitter) take() []*jointEntry {
	j.mu.Lock()
	defer j.mu.Unlock()
	// Its share of what waits, so that every transaction that can run
	// at once has work before any takes several batches: a few waiting
	// batches go in transactions of their own, side by side, as with
	// CommitSpan 1; hundreds share a few.
	par := j.parallel()
	n := min(j.span, (len(j.queue)+par-1)/par)
	if n == 0 {
		j.runners--
		return nil
	}
	entries := make([]*jointEntry, n)
	copy(entries, j.queue)
	for _, e := range entries {
		e.taken = true
	}
	j.queue = append(j.queue[:0:0], j.queue[n:]...)
	j.fresh = max(0, j.fresh-n)
	if len(j.queue) > 0 && j.runners < par {
		j.runners++ // the rest is another runner's share
		go j.run()
	}
	return entries
}

// parallel is how many joint transactions can run at once:
// Config.CommitTransactions, or fewer when the pool has fewer transaction
// slots (laneConns).
func (j *jointCommitter) parallel() int {
	return max(1, min(j.c.cfg.CommitTransactions, cap(j.c.txSlots())))
}

// txResult is what became of one batch's savepoint in a joint transaction.
type txResult int

const (
	// resNone: not run (yet). The zero value, so that a result nobody set
	// is never taken for work done.
	resNone   txResult = iota
	resRan             // its work is in the transaction, waiting for the fence
	resFailed          // rolled back to its savepoint; its outcome was sent
	resLost            // the connection broke under its work; its outcome was made, not sent
	resEnded           // its handler ended the transaction (a *HandlerBugError)
)

// runTx runs entries in one transaction and sends each its outcome, except
// those it returns: batches that must run again in a new transaction
// (another partition in it was refused, or a handler ended it before their
// turn).
func (j *jointCommitter) runTx(entries []*jointEntry) (again []*jointEntry) {
	c := j.c
	lo, hi := entries[0].l.claimID, entries[0].l.claimID
	for _, e := range entries {
		lo, hi = min(lo, e.l.claimID), max(hi, e.l.claimID)
	}
	// The claims of the batches it carries, as one range (claim ids of a
	// process grow one by one): a newer owner of any of the partitions that
	// waits on this transaction's locks recognises it as an older
	// claimant's (fence.Store.EndStaleBlockers), and Resolve finds the
	// session by it.
	appName := fence.JointApplicationName(lo, hi)
	marker := c.txMarker()
	opts := c.txOptions
	opts.BeginQuery += "; SET LOCAL tenure.tx = '" + marker + "'; SET LOCAL application_name = '" + appName + "'"
	fail := func(err error) []*jointEntry {
		for _, e := range entries {
			e.done <- err
		}
		return nil
	}
	// Up to the fence, the transaction's statements run while any of its
	// lanes still waits for it, as a batch's own would (a worker that
	// steps down or stops does not wait out CommitTimeout on a database
	// that does not answer); with a pgx tracer they are the first batch's
	// children, and a lone batch's tree is the one commitTx makes.
	tctx, tcancel := wanted(entries)
	defer tcancel()
	if sp := trace.SpanFromContext(entries[0].ctx); sp.SpanContext().IsValid() {
		tctx = trace.ContextWithSpan(tctx, sp)
	}
	bctx, cancel := context.WithTimeout(tctx, c.cfg.CommitTimeout)
	conn, err := c.store.Pool().Acquire(bctx)
	if err != nil {
		cancel()
		return fail(infraError{fmt.Errorf("begin: %w", err)})
	}
	defer conn.Release() // a connection left in a transaction is closed, not pooled
	tx, err := conn.BeginTx(bctx, opts)
	cancel()
	if err != nil {
		return fail(infraError{fmt.Errorf("begin: %w", err)})
	}
	open := true // the transaction is ours to roll back
	defer func() {
		if open {
			rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = tx.Rollback(rctx) // a failed rollback closes the connection: nothing survives
		}
	}()
	sess := fence.Session{PID: conn.Conn().PgConn().PID(), AppName: appName}
	// The transaction's id, read with the first savepoint: if a handler
	// ends the transaction, pg_xact_status says whether what the batches
	// before it wrote was committed with it.
	var xid string
	results := make([]txResult, len(entries))
	// The batches a BatchesHandler takes in one call go first, in one
	// savepoint; if the call fails they run again below, each alone.
	entries = j.batchesFirst(entries)
	together := 0 // entries[:together] went in one call
	if j.batches != nil {
		n := 0
		for n < len(entries) && entries[n].handler && !entries[n].alone {
			n++
		}
		if n >= 2 {
			together = n
		}
	}
	if together > 0 {
		switch res, err := j.runBatches(tctx, conn, tx, entries[:together], &sess, &xid); res {
		case resRan:
			for i := range together {
				results[i] = resRan
			}
		case resFailed:
			if err != nil { // the transaction could not begin
				return fail(err)
			}
			together = 0 // the call failed: each batch runs alone
		case resLost:
			// The call was the transaction's first work: nothing else
			// is lost with it, and its batches, marked alone, run again
			// in a new transaction.
			return entries
		case resEnded:
			return j.endedInCall(conn, tx, xid, entries, together)
		}
	}
	for i, e := range entries {
		if i < together {
			continue
		}
		res, err := j.runEntry(tctx, conn, tx, e, i == 0 && xid == "", len(entries) == 1, &sess, &xid)
		results[i] = res
		switch res {
		case resRan:
			continue
		case resFailed:
			e.done <- err
			continue
		case resLost:
			// The connection broke under the batch's work: the server
			// rolls the transaction back, the earlier batches' work with
			// it, and they run again.
			e.done <- err
			for k := range i {
				if results[k] == resRan {
					again = append(again, entries[k])
				}
			}
			return append(again, entries[i+1:]...)
		}
		// A handler ended the transaction (err is its lane's
		// *HandlerBugError). What ran before it was committed with it, or
		// rolled back: the database says which, once the transaction is
		// surely over (it may have begun another).
		e.done <- err
		rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = tx.Rollback(rctx)
		rcancel()
		committed := j.endedTxCommitted(conn, xid)
		for k := range i {
			if results[k] != resRan {
				continue
			}
			if committed {
				entries[k].done <- entries[k].sharedBug(e)
			} else {
				again = append(again, entries[k])
			}
		}
		return append(again, entries[i+1:]...)
	}
	var ran []*jointEntry
	for i, e := range entries {
		if results[i] == resRan {
			ran = append(ran, e)
		}
	}
	if len(ran) == 0 {
		return nil
	}
	open = false
	return j.fence(conn, tx, ran, marker, sess)
}

// runEntry runs one batch's work in a savepoint of tx. first: the
// transaction's first batch, which also reads its id (xid) and, through a
// pooler, its server backend's pid (sess). alone: the transaction's only
// batch, which needs no savepoint (its failure rolls back the whole
// transaction, which holds nothing else) and no id (no batch ran before
// it): it costs what a transaction of its own costs.
func (j *jointCommitter) runEntry(ctx context.Context, conn *pgxpool.Conn, tx pgx.Tx, e *jointEntry, first, alone bool, sess *fence.Session, xid *string) (txResult, error) {
	c := j.c
	sctx, cancel := context.WithTimeout(ctx, c.cfg.CommitTimeout)
	defer cancel()
	switch {
	case alone:
		if c.store.Pooled() {
			if err := tx.QueryRow(sctx, `SELECT pg_backend_pid()`).Scan(&sess.PID); err != nil {
				return resFailed, infraError{fmt.Errorf("begin: %w", err)}
			}
		}
	case first:
		if err := j.firstSavepoint(sctx, tx, sess, xid); err != nil {
			return resFailed, err
		}
	default:
		if _, err := tx.Exec(sctx, "SAVEPOINT "+jointSavepoint); err != nil {
			return resFailed, infraError{fmt.Errorf("begin: %w", err)}
		}
	}
	stopWatch := e.l.watchLocks(sess.PID)
	werr := e.work(e.ctx, tx)
	stopWatch()
	if conn.Conn().IsClosed() {
		if werr == nil {
			werr = infraError{errors.New("commit: the connection closed")}
		}
		return resLost, werr
	}
	// A handler whose SQL ran COMMIT or ROLLBACK left the transaction (the
	// connection is idle), or left it and began another (the savepoint is
	// gone: RELEASE and ROLLBACK TO fail with 3B001). Either way nothing
	// more runs in it: the next statement would run in autocommit.
	if conn.Conn().PgConn().TxStatus() == 'I' {
		return resEnded, e.ownBug()
	}
	if alone {
		if werr != nil {
			return resFailed, werr // runTx rolls the transaction back
		}
		return resRan, nil // the fence's marker check catches a new BEGIN
	}
	if werr == nil {
		_, err := tx.Exec(sctx, "RELEASE SAVEPOINT "+jointSavepoint)
		if err == nil {
			return resRan, nil
		}
		if sqlState(err) == codeNoTransaction || sqlState(err) == codeNoSavepoint {
			return resEnded, e.ownBug()
		}
		// The work said it passed, but the transaction cannot go on with
		// it (a handler that swallowed a failed statement leaves it
		// aborted): roll it back alone, like a refused commit of its own.
		werr = infraError{fmt.Errorf("commit: %w", err)}
	}
	if _, err := tx.Exec(sctx, "ROLLBACK TO SAVEPOINT "+jointSavepoint+"; RELEASE SAVEPOINT "+jointSavepoint); err != nil {
		if sqlState(err) == codeNoTransaction || sqlState(err) == codeNoSavepoint {
			return resEnded, e.ownBug()
		}
		// The connection broke, or the server refused to roll back: the
		// transaction is lost for every batch in it. Whatever the others
		// wrote is rolled back with it; they run again.
		return resFailed, werr
	}
	return resFailed, werr
}

// firstSavepoint opens the savepoint of a joint transaction's first work
// and reads the transaction's id (xid) and, through a pooler, its server
// backend's pid (sess), in one round trip.
func (j *jointCommitter) firstSavepoint(ctx context.Context, tx pgx.Tx, sess *fence.Session, xid *string) error {
	b := &pgx.Batch{}
	b.Queue("SAVEPOINT " + jointSavepoint)
	b.Queue(`SELECT pg_current_xact_id()::text, pg_backend_pid()`)
	br := tx.SendBatch(ctx, b)
	_, err := br.Exec()
	var pid uint32
	if err == nil {
		err = br.QueryRow().Scan(xid, &pid)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return infraError{fmt.Errorf("begin: %w", err)}
	}
	if j.c.store.Pooled() {
		// Through a transaction pooler the announced pid is the pooler's:
		// the server backend's is the one to watch and wait on.
		sess.PID = pid
	}
	return nil
}

// batchesFirst orders entries so that those a BatchesHandler call may take
// come first (the others keep their order after them).
func (j *jointCommitter) batchesFirst(entries []*jointEntry) []*jointEntry {
	if j.batches == nil {
		return entries
	}
	out := make([]*jointEntry, 0, len(entries))
	for _, e := range entries {
		if e.handler && !e.alone {
			out = append(out, e)
		}
	}
	for _, e := range entries {
		if !e.handler || e.alone {
			out = append(out, e)
		}
	}
	return out
}

// runBatches runs entries' batches in one BatchesHandler call, in one
// savepoint, as the transaction's first work. resFailed with a nil error:
// the call failed and was rolled back to the savepoint, and each batch is
// marked to run alone; with an error: the transaction could not go on.
// resLost: the call failed and took the transaction with it (its
// connection closed, or the savepoint could not be rolled back); each
// batch is marked to run alone, in a new transaction.
func (j *jointCommitter) runBatches(ctx context.Context, conn *pgxpool.Conn, tx pgx.Tx, entries []*jointEntry, sess *fence.Session, xid *string) (txResult, error) {
	c := j.c
	sctx, cancel := context.WithTimeout(ctx, c.cfg.CommitTimeout)
	defer cancel()
	if err := j.firstSavepoint(sctx, tx, sess, xid); err != nil {
		return resFailed, err
	}
	// The call runs while any of its lanes still wants it: a lane that
	// stops (revoked, the worker stopping) leaves its batch to the fence.
	hctx, hcancel := wanted(entries)
	defer hcancel()
	batches := make([]*Batch, len(entries))
	spans := make([]trace.Span, len(entries))
	for i, e := range entries {
		batches[i] = e.b
		_, spans[i] = c.trace.child(e.ctx, SpanHandler)
		stopWatch := e.l.watchLocks(sess.PID)
		defer stopWatch()
	}
	if spans[0] != nil {
		// The call's statements, with a pgx tracer, are children of the
		// first batch's handler span: one call, one parent.
		hctx = trace.ContextWithSpan(hctx, spans[0])
	}
	if c.cfg.HandlerTimeout > 0 {
		var tcancel context.CancelFunc
		hctx, tcancel = context.WithTimeout(hctx, c.cfg.HandlerTimeout)
		defer tcancel()
	}
	werr := j.callBatches(hctx, tx, batches)
	if werr == nil && errors.Is(hctx.Err(), context.DeadlineExceeded) {
		werr = fmt.Errorf("handler timed out after %s (it returned only after its deadline)", c.cfg.HandlerTimeout)
	}
	for _, sp := range spans {
		endSpan(sp, werr)
	}
	if conn.Conn().IsClosed() {
		// A statement the call was in when its deadline came is cancelled
		// by closing the connection; or the connection broke under it.
		// Either way each batch goes again alone: a call that failed with
		// them must not take them again, or a call too slow for
		// HandlerTimeout would fail the same way on every retry.
		markAlone(entries)
		return resLost, nil
	}
	if conn.Conn().PgConn().TxStatus() == 'I' {
		return resEnded, nil
	}
	if werr == nil {
		_, err := tx.Exec(sctx, "RELEASE SAVEPOINT "+jointSavepoint)
		if err == nil {
			for _, e := range entries {
				if h := c.cfg.Hooks.BeforeCommit; h != nil {
					h(e.ctx, e.b)
				}
			}
			return resRan, nil
		}
		if sqlState(err) == codeNoTransaction || sqlState(err) == codeNoSavepoint {
			return resEnded, nil
		}
	}
	if _, err := tx.Exec(sctx, "ROLLBACK TO SAVEPOINT "+jointSavepoint+"; RELEASE SAVEPOINT "+jointSavepoint); err != nil {
		if sqlState(err) == codeNoTransaction || sqlState(err) == codeNoSavepoint {
			return resEnded, nil
		}
		markAlone(entries) // the transaction cannot go on: again, each alone
		return resLost, nil
	}
	markAlone(entries)
	c.log.Debug("a call with several batches failed: each runs alone", zap.Int("batches", len(entries)), zap.Error(werr))
	return resFailed, nil
}

// wanted is a context that is cancelled once every entry's lane has
// stopped waiting for it (each entry's ctx is done), and its cancel.
func wanted(entries []*jointEntry) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	var waiting atomic.Int32
	waiting.Store(int32(len(entries)))
	stops := make([]func() bool, len(entries))
	for i, e := range entries {
		stops[i] = context.AfterFunc(e.ctx, func() {
			if waiting.Add(-1) == 0 {
				cancel()
			}
		})
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}

// markAlone marks the batches of a failed BatchesHandler call to run alone
// from now on, each through Handle.
func markAlone(entries []*jointEntry) {
	for _, e := range entries {
		e.alone = true
	}
}

// callBatches is the BatchesHandler's call, with the Tx a Handle gets and
// its panics recovered (a panic fails the call like an error).
func (j *jointCommitter) callBatches(ctx context.Context, tx pgx.Tx, batches []*Batch) (err error) {
	htx := newHandlerTx(tx)
	defer htx.close()
	defer func() {
		if r := recover(); r != nil {
			j.c.log.Warn("handler panicked in a call with several batches: each runs alone", zap.Any("panic", r), zap.ByteString("stack", debug.Stack()))
			err = fmt.Errorf("%w: %v", errPanicked, r)
		}
	}()
	return j.batches.HandleBatches(ctx, htx, batches)
}

// endedInCall settles a transaction whose BatchesHandler call ended it
// (COMMIT or ROLLBACK in the handler's SQL): the call's first together
// batches, which cannot be told apart, halt as a Handle that did so would
// if what they wrote may have been committed outside the fence; if the
// database says it was rolled back, they run again, each alone. The
// entries after them run again.
func (j *jointCommitter) endedInCall(conn *pgxpool.Conn, tx pgx.Tx, xid string, entries []*jointEntry, together int) (again []*jointEntry) {
	rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = tx.Rollback(rctx) // the handler may have begun another
	cancel()
	committed := j.endedTxCommitted(conn, xid)
	for _, e := range entries[:together] {
		if committed {
			e.done <- e.ownBug()
			continue
		}
		e.alone = true
		again = append(again, e)
	}
	return append(again, entries[together:]...)
}

// The SQLSTATEs of a savepoint statement whose transaction was ended:
// 25P01 no_active_sql_transaction (the connection is in autocommit) and
// 3B001 invalid_savepoint_specification (a new transaction was begun).
const (
	codeNoTransaction = "25P01"
	codeNoSavepoint   = "3B001"
)

// endedTxCommitted reports whether the joint transaction with id xid, which
// a handler ended, committed; when the database cannot say (xid unknown, no
// answer), it answers true: the batches before it may have committed
// outside the fence and must not run again.
func (j *jointCommitter) endedTxCommitted(conn *pgxpool.Conn, xid string) bool {
	if xid == "" {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var status *string
	if err := conn.QueryRow(ctx, `SELECT pg_xact_status($1::xid8)`, xid).Scan(&status); err != nil || status == nil {
		return true
	}
	return *status != "aborted"
}

// ownBug is the error of a batch whose handler ended the joint transaction.
func (e *jointEntry) ownBug() error {
	b := e.b
	return &HandlerBugError{FirstJob: JobID(b.Records[0]), LastJob: JobID(b.Records[len(b.Records)-1]), From: b.From, To: b.To}
}

// sharedBug is the error of a batch whose work was committed, outside the
// fence, by the handler of other (another partition's batch in the same
// transaction) that ran COMMIT: the partition halts like other's, for the
// same reason (running the batch again would do its effects twice).
func (e *jointEntry) sharedBug(other *jointEntry) error {
	err := e.ownBug().(*HandlerBugError)
	err.EndedBy = other.l.key.String()
	return err
}

// errGoesAgain ends the fence_commit span of a batch whose transaction was
// rolled back because another partition in it was refused.
var errGoesAgain = errors.New("not committed: another partition in the transaction was refused; the batch goes again without it")

// fence ends tx with one fence statement over ran's partitions and COMMIT,
// and sends each its outcome; it returns the batches to run again without
// the partitions that were refused.
func (j *jointCommitter) fence(conn *pgxpool.Conn, tx pgx.Tx, ran []*jointEntry, marker string, sess fence.Session) (again []*jointEntry) {
	c := j.c
	// Not cancelled by the lanes: a commit in flight is settled by the
	// fence, as commitTx's is.
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.CommitTimeout)
	defer cancel()
	reqs := make([]sink.CommitRequest, len(ran))
	// A fence_commit span for each batch, as commitTx makes, ended with
	// its batch's outcome; the statement is the first one's child.
	spans := make([]trace.Span, len(ran))
	for i, e := range ran {
		reqs[i] = e.req
		_, spans[i] = c.trace.child(e.ctx, SpanFenceCommit)
	}
	if spans[0] != nil {
		ctx = trace.ContextWithSpan(ctx, spans[0])
	}
	settled := make([]bool, len(ran))
	defer func() {
		for i, sp := range spans {
			if !settled[i] {
				// Nothing committed; the batch goes again in a new
				// transaction, whose own span will say how it ended.
				endSpan(sp, errGoesAgain)
			}
		}
	}()
	answer := func(i int, err error) {
		endSpan(spans[i], err)
		settled[i] = true
		ran[i].done <- err
	}
	err := c.store.CommitJoint(ctx, tx, reqs, marker)
	var jf *fence.JointFencedError
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		for i := range ran {
			answer(i, nil)
		}
		return nil
	case errors.As(err, &jf):
		// Nothing of the transaction committed. The refused lanes recover
		// as a refused lane of its own transaction does; the others run
		// again in a new one, without them.
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = tx.Rollback(rctx)
		cancel()
		for i, e := range ran {
			if ferr, ok := jf.Fenced[i]; ok {
				err := ferr
				if len(ran) > 1 {
					err = fmt.Errorf("%w (refused in a transaction shared with %d other batches, which go again without it)", ferr, len(ran)-1)
				}
				answer(i, err) // alone, it reads as commitTx's refusal
			} else {
				again = append(again, e)
			}
		}
		return again
	case errors.Is(err, sink.ErrTxEnded):
		// The marker is gone, yet every savepoint was released: a handler
		// ended the transaction and began another. Which one cannot be
		// told; every batch in it halts, as its own would.
		for i, e := range ran {
			answer(i, e.ownBug())
		}
	case errors.As(err, &pgErr):
		for i := range ran {
			answer(i, infraError{err}) // the server refused: nothing committed
		}
	default:
		// The answer was lost (the connection broke, or none came within
		// the commit timeout). The session is dropped, and each lane
		// resolves its own batch against its partition's fencing row,
		// waiting while the joint session is still in its transaction. The
		// transaction is atomic, so the answers agree: all committed, or
		// none (NotCommitted or Fenced).
		_ = conn.Conn().Close(context.Background())
		for i, e := range ran {
			unknownOutcome(spans[i], err)
			answer(i, e.l.resolve(e.req, sess, err))
		}
	}
	rctx, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	_ = tx.Rollback(rctx) // after a dropped session or COMMIT: nothing to do
	cancel2()
	return nil
}
