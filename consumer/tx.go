package consumer

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Tx is the batch's transaction as a Handler sees it. It runs statements
// and opens savepoints, and nothing more: the lane ends the transaction,
// after the fence, so Tx has no Commit, Rollback or Conn. Its first three
// methods are those of sqlc's DBTX, so sqlc-generated queries take a Tx
// as they are.
//
// A Tx must not be used after Handle returns (its methods then fail with
// ErrTxDone) nor from two goroutines at once (pgx connections are not safe
// for concurrent use).
type Tx interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error)
	// SendBatch sends b in one round trip. Callbacks queued on b
	// (QueuedQuery.Query and friends) receive rows whose Conn is nil, like
	// Query's.
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	// Begin opens a savepoint: a nested transaction whose Commit releases
	// the savepoint and whose Rollback rolls back to it, leaving the batch's
	// transaction going.
	Begin(ctx context.Context) (Savepoint, error)
}

// BinaryCopier is a Tx that also takes COPY rows the handler has encoded
// itself: CopyFromBinary runs COPY table (columns) FROM STDIN BINARY in the
// batch's transaction with data as the stream, PostgreSQL's binary COPY
// format from its header to its trailer, and returns the rows copied.
// Tx.CopyFrom encodes each value through pgx's type map (a plan looked up
// per value); a handler that writes many rows of known column types can
// encode them once, with no per-value lookups and no per-row allocations.
// The Tx a lane gives a Handler implements it, and so do its savepoints;
// a test's own Tx need not, so check for it:
//
//	if bc, ok := tx.(consumer.BinaryCopier); ok { ... }
type BinaryCopier interface {
	CopyFromBinary(ctx context.Context, table pgx.Identifier, columns []string, data io.Reader) (int64, error)
}

// Savepoint is a nested transaction inside a batch's transaction, opened by
// Tx.Begin. Commit releases it (its effects stay part of the batch's
// transaction, committed or not with it); Rollback undoes what ran since
// Begin. Ending a savepoint never ends the batch's transaction.
type Savepoint interface {
	Tx
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

// ErrTxDone is returned by a Tx used after its Handle call returned: the
// lane has ended (or is about to end) the transaction, and a statement now
// would run outside the fence, or in the next batch's transaction.
var ErrTxDone = errors.New("consumer: the batch's transaction was used after Handle returned")

// handlerTx is the Tx given to a Handler: the lane's pgx.Tx without the
// methods that end it or reach its connection.
type handlerTx struct {
	tx   pgx.Tx
	done *atomic.Bool // shared by a batch's Tx and all its savepoints
}

func newHandlerTx(tx pgx.Tx) *handlerTx { return &handlerTx{tx: tx, done: new(atomic.Bool)} }

// close makes every later use of the Tx and its savepoints fail.
func (t *handlerTx) close() { t.done.Store(true) }

func (t *handlerTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.done.Load() {
		return pgconn.CommandTag{}, ErrTxDone
	}
	return t.tx.Exec(ctx, sql, args...)
}

func (t *handlerTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.done.Load() {
		return nil, ErrTxDone
	}
	rows, err := t.tx.Query(ctx, sql, args...)
	return hideConn(rows), err
}

func (t *handlerTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.done.Load() {
		return errRow{ErrTxDone}
	}
	// pgx's Row has Scan only: nothing to hide.
	return t.tx.QueryRow(ctx, sql, args...)
}

func (t *handlerTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if t.done.Load() {
		return 0, ErrTxDone
	}
	return t.tx.CopyFrom(ctx, table, columns, src)
}

// CopyFromBinary sends data on the transaction's connection, as pgx's own
// CopyFrom does after encoding (the same COPY statement), and tells the
// connection's tracer, if it traces COPY, as CopyFrom would.
func (t *handlerTx) CopyFromBinary(ctx context.Context, table pgx.Identifier, columns []string, data io.Reader) (int64, error) {
	if t.done.Load() {
		return 0, ErrTxDone
	}
	conn := t.tx.Conn()
	tracer, _ := conn.Config().Tracer.(pgx.CopyFromTracer)
	if tracer != nil {
		ctx = tracer.TraceCopyFromStart(ctx, conn, pgx.TraceCopyFromStartData{TableName: table, ColumnNames: columns})
	}
	var sql strings.Builder
	sql.WriteString("COPY ")
	sql.WriteString(table.Sanitize())
	sql.WriteString(" (")
	for i, c := range columns {
		if i > 0 {
			sql.WriteString(", ")
		}
		sql.WriteString(pgx.Identifier{c}.Sanitize())
	}
	sql.WriteString(") FROM STDIN BINARY")
	tag, err := conn.PgConn().CopyFrom(ctx, data, sql.String())
	if tracer != nil {
		tracer.TraceCopyFromEnd(ctx, conn, pgx.TraceCopyFromEndData{CommandTag: tag, Err: err})
	}
	return tag.RowsAffected(), err
}

func (t *handlerTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.done.Load() {
		return pgx.FailedBatchResults(b, ErrTxDone)
	}
	for _, q := range b.QueuedQueries {
		if fn := q.Fn; fn != nil {
			q.Fn = func(br pgx.BatchResults) error { return fn(batchResults{br}) }
		}
	}
	return batchResults{t.tx.SendBatch(ctx, b)}
}

func (t *handlerTx) Begin(ctx context.Context) (Savepoint, error) {
	if t.done.Load() {
		return nil, ErrTxDone
	}
	sp, err := t.tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &savepoint{handlerTx{tx: sp, done: t.done}}, nil
}

// savepoint is a handlerTx on pgx's nested transaction, whose Commit and
// Rollback are RELEASE SAVEPOINT and ROLLBACK TO SAVEPOINT.
type savepoint struct{ handlerTx }

func (s *savepoint) Commit(ctx context.Context) error {
	if s.done.Load() {
		return ErrTxDone
	}
	return s.tx.Commit(ctx)
}

func (s *savepoint) Rollback(ctx context.Context) error {
	if s.done.Load() {
		return ErrTxDone
	}
	return s.tx.Rollback(ctx)
}

// rows hides pgx.Rows.Conn (pgx documents that it may be nil).
type rows struct{ pgx.Rows }

func (rows) Conn() *pgx.Conn { return nil }

func hideConn(r pgx.Rows) pgx.Rows {
	if r == nil {
		return nil
	}
	return rows{r}
}

// batchResults hides the connection behind the rows of a batch, and the
// transaction Batch.BeginTx would begin (pgx refuses that inside a
// transaction anyway).
type batchResults struct{ pgx.BatchResults }

func (r batchResults) Query() (pgx.Rows, error) {
	rs, err := r.BatchResults.Query()
	return hideConn(rs), err
}

func (r batchResults) Tx() pgx.Tx { return nil }

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }
