package consumer

// The end of a batch's transaction. commitTx (attempt.go) opens the
// transaction and runs the batch's work in it, whatever the mode; how the
// transaction ends is the lane's committer, chosen from the Config once,
// when the lane starts (startCommit), never per batch:
//
//   - fencedCommitter: the fence statement and COMMIT in one round trip
//     (fence.Store.CommitBatch); a lost answer is resolved (lane.resolve);
//   - strictCommitter (Config.Strict, strict.go): the fence statement and
//     PREPARE TRANSACTION, then the batch's offset commit to the group
//     coordinator, then COMMIT or ROLLBACK PREPARED (preparedBatch);
//   - unfencedCommitter (Config.UnsafeNoFence, benchmarks only): a bare
//     COMMIT.

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/tenure-dev/tenure/internal/fence"
	"github.com/tenure-dev/tenure/sink"
)

// A committer ends a batch's open transaction t. It returns whose the
// transaction is afterwards, and what became of the batch: nil if it
// committed; an error matching sink.ErrFenced if it was refused; a
// *HandlerBugError, an infraError, or an error matching errStopped as
// commitTx documents.
type committer interface {
	commit(ctx context.Context, l *lane, t *openTx) (txOwner, error)
}

// txOwner is whose a batch's transaction is once a committer is done with
// it.
type txOwner int

const (
	// laneOwnsTx: the transaction is still open on the lane's connection;
	// commitTx rolls it back.
	laneOwnsTx txOwner = iota
	// laneGaveUpTx: it is no longer the lane's to end: committed, prepared
	// (and then decided), or its session dropped with the outcome resolved
	// elsewhere.
	laneGaveUpTx
)

// newCommitter is the committer Config asks for (validate refuses Strict
// with UnsafeNoFence).
func newCommitter(c *Consumer) committer {
	switch {
	case c.cfg.UnsafeNoFence:
		return unfencedCommitter{}
	case c.cfg.Strict:
		return strictCommitter{}
	}
	return fencedCommitter{}
}

// openTx is a batch's transaction once its work has run, as commitTx hands
// it to the committer.
type openTx struct {
	b      *Batch
	conn   *pgxpool.Conn // the connection, acquired by commitTx
	tx     pgx.Tx
	req    sink.CommitRequest
	marker string        // SET LOCAL tenure.tx, checked by the fence statement
	sess   fence.Session // the server session that runs it
	span   trace.Span    // the fence and commit span (nil: tracing off)
}

// refused reads the answer to a fence statement that ends the transaction
// (fence.Store.CommitBatch, PrepareBatch): ok if the statement was refused
// and the transaction is still the lane's, with the error for the batch;
// false if the outcome is unknown (the connection broke, or no answer
// within the commit timeout).
func (t *openTx) refused(err error) (ok bool, out error) {
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, sink.ErrTxEnded):
		b := t.b
		return true, &HandlerBugError{FirstJob: JobID(b.Records[0]), LastJob: JobID(b.Records[len(b.Records)-1]), From: b.From, To: b.To}
	case errors.Is(err, sink.ErrFenced):
		return true, err
	case errors.As(err, &pgErr):
		return true, infraError{err} // the server refused: nothing committed
	}
	return false, nil
}

// dropSession closes the transaction's connection after an answer was lost:
// the session may still be in its COMMIT (or PREPARE), and the outcome is
// learned from the database, not from it.
func (t *openTx) dropSession() {
	_ = t.conn.Conn().Close(context.Background())
}

// fencedCommitter is the lane's committer by default.
type fencedCommitter struct{}

func (fencedCommitter) commit(ctx context.Context, l *lane, t *openTx) (txOwner, error) {
	err := l.c.store.CommitBatch(ctx, t.tx, t.req, t.marker)
	if err == nil {
		return laneGaveUpTx, nil
	}
	if ok, out := t.refused(err); ok {
		return laneOwnsTx, out
	}
	// The connection broke, or the answer did not come within the commit
	// timeout: the outcome is unknown. The session is dropped (it may still
	// be in its COMMIT), and Resolve finds the outcome out exactly, waiting
	// while that session is still in the transaction.
	t.dropSession()
	unknownOutcome(t.span, err)
	return laneGaveUpTx, l.resolve(t.req, t.sess, err)
}

// unfencedCommitter commits without the fence: benchmarks only (see
// Config.UnsafeNoFence).
type unfencedCommitter struct{}

func (unfencedCommitter) commit(ctx context.Context, _ *lane, t *openTx) (txOwner, error) {
	if err := t.tx.Commit(ctx); err != nil {
		return laneGaveUpTx, infraError{err}
	}
	return laneGaveUpTx, nil
}
