package fence

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrTxEnded is returned by CommitBatch when the transaction was no longer
// the batch's when the fence ran: something ended it before (a handler that
// ran COMMIT or ROLLBACK itself). Nothing was fenced or committed by the
// fence statement.
var ErrTxEnded = errors.New("the batch's transaction was ended before the fence")

// Session identifies a batch transaction's database session for ResolveSession:
// the backend's PID, and the application_name the transaction set
// (ApplicationName). While a session with both is there, the transaction
// is not over.
type Session struct {
	PID     uint32
	AppName string
}

// CommitBatch sends the fence statement and COMMIT together, in one round
// trip, and reports whether tx committed. marker is the value the batch's
// BEGIN set as tenure.tx: a transaction without it was ended by its handler
// (ErrTxEnded).
//
// The fence statement fails when it does not pass (fence_check, migration
// 009), so the COMMIT behind it finds the transaction aborted and commits
// nothing. A nil error means committed. A *FencedError (matching ErrFenced)
// or ErrTxEnded means nothing was committed; the caller rolls tx back. A
// *pgconn.PgError means the server refused and nothing was committed.
// Anything else (the connection broke, the context ended) leaves the outcome
// unknown: find it out with ResolveSession.
//
// Worker protocol: package consumer calls it; not API (see the package doc).
func (s *Store) CommitBatch(ctx context.Context, tx pgx.Tx, req CommitRequest, marker string) error {
	p := req.Partition
	return s.fenceAndEnd(ctx, tx, req, "commit", []string{"COMMIT"}, s.pipelinedSQL, p.Group, p.Topic, p.Partition,
		req.Token.Incarnation, req.Token.Epoch, req.Owner, req.From, req.To, req.ClaimID, marker, req.LogEpoch)
}

// fenceAndEnd sends the fence statement (fenceSQL with args) and the
// statements that end the transaction (COMMIT, or a strict lane's SET LOCAL
// ROLE and PREPARE TRANSACTION) in one round trip, and sorts the outcome as
// CommitBatch's comment says (sendFence); verb names the step in errors.
func (s *Store) fenceAndEnd(ctx context.Context, tx pgx.Tx, req CommitRequest, verb string, endSQL []string, fenceSQL string, args ...any) error {
	p := req.Partition
	if req.To <= req.From {
		return fmt.Errorf("sink: commit of %s must advance: from %d to %d", p, req.From, req.To)
	}
	b := &pgx.Batch{}
	b.Queue(fenceSQL, args...)
	for _, q := range endSQL {
		b.Queue(q)
	}
	return sendFence(ctx, tx, b, len(endSQL), func(ctx context.Context) error {
		// Report what won, read on another connection (bounded by fenced).
		return withClaim(s.fenced(ctx, "commit", p, req.Token, req.Owner, req.From), req)
	}, func(err error) error {
		return fmt.Errorf("%s of %s: %w", verb, p, err)
	})
}

// sendFence sends b, a fence statement and then nEnd statements that end
// the transaction, and sorts the outcome as CommitBatch's comment says:
// refused reads why the fence refused (on another connection, past ctx's
// cancellation), and failed wraps any other error. One body for every
// commit path (CommitBatch, a strict lane's prepare, CommitJoint), so that
// none of them can come to read the same outcome differently.
func sendFence(ctx context.Context, tx pgx.Tx, b *pgx.Batch, nEnd int, refused func(context.Context) error, failed func(error) error) error {
	br := tx.SendBatch(ctx, b)
	var n int64
	ferr := br.QueryRow().Scan(&n)
	var eerr error
	for range nEnd {
		if _, err := br.Exec(); err != nil && eerr == nil {
			eerr = err
		}
	}
	closeErr := br.Close()
	var pgErr *pgconn.PgError
	switch {
	case ferr == nil && eerr == nil && closeErr == nil:
		return nil
	case errors.As(ferr, &pgErr) && pgErr.Code == CodeTxEnded:
		return ErrTxEnded
	case errors.As(ferr, &pgErr) && (pgErr.Code == CodeFenced || pgErr.Code == CodeSerializationFailure):
		return refused(context.WithoutCancel(ctx))
	case ferr != nil:
		return failed(ferr)
	case eerr != nil:
		return failed(eerr)
	}
	return failed(closeErr)
}

// ResolveSession finds out exactly whether a commit whose answer was lost (the
// connection broke during COMMIT, or the wait for it timed out) took effect, for a transaction known by its session rather
// than its id (CommitBatch does not learn the id before COMMIT): it waits
// while a session with that PID and application_name is still in the
// transaction (ending it if it sits idle in it: its COMMIT never came),
// then answers from the fence log and the row (resolve).
//
// Worker protocol: package consumer calls it; not API (see the package doc).
func (s *Store) ResolveSession(ctx context.Context, req CommitRequest, sess Session) (Outcome, error) {
	if err := s.awaitSession(ctx, sess); err != nil {
		return 0, err
	}
	return s.resolve(ctx, req, 0)
}

func (s *Store) awaitSession(ctx context.Context, sess Session) error {
	for wait := 20 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		var state *string
		err := s.pool.QueryRow(ctx, `SELECT state FROM pg_stat_activity WHERE pid = $1 AND application_name = $2`,
			int32(sess.PID), sess.AppName).Scan(&state)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return nil // gone, or its transaction is over (SET LOCAL ended with it)
		case err != nil:
			return err
		}
		if state != nil && (*state == "idle in transaction" || *state == "idle in transaction (aborted)") {
			_, _ = s.pool.Exec(ctx, `SELECT pg_terminate_backend($1) FROM pg_stat_activity
				WHERE pid = $1 AND application_name = $2 AND state LIKE 'idle in transaction%'`, int32(sess.PID), sess.AppName)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("the transaction of session %d is still in progress: %w", sess.PID, ctx.Err())
		case <-t.C:
		}
	}
}
