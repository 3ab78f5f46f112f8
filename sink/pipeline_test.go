package sink_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tenure-dev/tenure/internal/fence"
	"github.com/tenure-dev/tenure/sink"
)

// CommitBatch sends the fence with COMMIT: when the fence passes, the batch
// is committed; when it does not (another claim, or the handler ended the
// transaction itself), nothing of the transaction is, although COMMIT was
// already on its way.
func TestCommitBatch(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		before func(t *testing.T, e *env)            // after the claim, before the batch
		inTx   string                                // SQL the "handler" runs in the batch
		check  func(t *testing.T, e *env, err error) // the outcome
	}{
		{"committed", nil, "", func(t *testing.T, e *env, err error) {
			if err != nil {
				t.Fatalf("CommitBatch: %v", err)
			}
		}},
		{"fenced by a newer claim", func(t *testing.T, e *env) { e.mustClaim(t, part, tok(0, 8), "b", 0) }, "",
			func(t *testing.T, e *env, err error) {
				if fe := asFenced(t, err); fe.CurrentOwner != "b" {
					t.Fatalf("rejection %+v, want the winner b", *fe)
				}
			}},
		{"the handler committed the transaction itself", nil, "COMMIT", func(t *testing.T, e *env, err error) {
			if !errors.Is(err, sink.ErrTxEnded) {
				t.Fatalf("CommitBatch = %v, want ErrTxEnded", err)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			e.mustClaim(t, part, tok(0, 7), "a", 0)
			if c.before != nil {
				c.before(t, e)
			}
			if _, err := e.pool.Exec(e.ctx, `CREATE TABLE `+e.q()+`.effects_cb (x int)`); err != nil {
				t.Fatal(err)
			}
			tx := e.begin(t, pgx.TxOptions{})
			if _, err := tx.Exec(e.ctx, `SET LOCAL tenure.tx = 'm1'; INSERT INTO `+e.q()+`.effects_cb VALUES (1)`); err != nil {
				t.Fatal(err)
			}
			if c.inTx != "" {
				if _, err := tx.Exec(e.ctx, c.inTx); err != nil {
					t.Fatal(err)
				}
			}
			err := e.store.CommitBatch(e.ctx, tx, sink.CommitRequest{Partition: part, Token: tok(0, 7), Owner: "a", From: 0, To: 5}, "m1")
			if err != nil {
				_ = tx.Rollback(context.Background())
			}
			c.check(t, e, err)
			var n int
			if err := e.pool.QueryRow(e.ctx, `SELECT count(*) FROM `+e.q()+`.effects_cb`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			f := e.mustGet(t, part)
			switch c.name {
			case "committed":
				if n != 1 || f.NextOffset != 5 {
					t.Fatalf("committed: %d effects, next offset %d; want 1 and 5", n, f.NextOffset)
				}
			case "fenced by a newer claim":
				if n != 0 || f.NextOffset != 0 {
					t.Fatalf("fenced: %d effects, next offset %d; want 0 and 0 (nothing committed)", n, f.NextOffset)
				}
			default:
				// The handler's own COMMIT committed its effect, outside
				// the fence; the fence moved nothing.
				if f.NextOffset != 0 {
					t.Fatalf("the fence moved the offset to %d after the handler ended the transaction", f.NextOffset)
				}
			}
		})
	}
}

// ResolveSession waits while the batch's session is still in the
// transaction and ends it if it sits idle there (its COMMIT never came).
func TestResolveSessionEndsAnIdleTransaction(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.mustClaim(t, part, tok(0, 7), "a", 0)
	tx := e.begin(t, pgx.TxOptions{})
	app := fence.ApplicationName(42)
	if _, err := tx.Exec(e.ctx, `SET LOCAL application_name = '`+app+`'`); err != nil {
		t.Fatal(err)
	}
	req := sink.CommitRequest{Partition: part, Token: tok(0, 7), Owner: "a", From: 0, To: 5}
	if _, err := e.store.CommitTracked(e.ctx, tx, req); err != nil { // the fence ran; COMMIT never comes
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	out, err := e.store.ResolveSession(ctx, req, fence.Session{PID: tx.Conn().PgConn().PID(), AppName: app})
	if out != fence.NotCommitted || err != nil {
		t.Fatalf("ResolveSession = %v, %v; want not committed", out, err)
	}
	if err := tx.Commit(e.ctx); err == nil {
		t.Fatal("the ended transaction still committed")
	}
}
