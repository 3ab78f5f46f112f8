package sink_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tenure-dev/tenure/internal/fence"
	"github.com/tenure-dev/tenure/sink"
)

// Resolve answers "did my commit take effect?" exactly: from the fence log,
// then the row.
func TestResolve(t *testing.T) {
	t.Parallel()
	req := sink.CommitRequest{Partition: part, Token: tok(0, 81), Owner: "a", From: 10, To: 15}
	for _, c := range []struct {
		name     string
		after    func(t *testing.T, e *env) // runs after A claimed at 0.81 from 10
		want     fence.Outcome
		mismatch bool // the Fenced error also matches ErrOffsetMismatch
		found    bool // the Fenced error found a row
	}{
		{"after a committed commit", func(t *testing.T, e *env) { e.mustCommit(t, req) }, fence.Committed, false, false},
		{"before the commit: the row is at From", func(t *testing.T, e *env) {}, fence.NotCommitted, false, false},
		{"the commit rolled back", func(t *testing.T, e *env) {
			tx, err := e.pool.Begin(e.ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(context.Background()) }() // released on every path: a failure must not hang the pool's Close
			if err := e.store.Commit(e.ctx, tx, req); err != nil {
				t.Fatal(err)
			}
			if err := tx.Rollback(e.ctx); err != nil {
				t.Fatal(err)
			}
		}, fence.NotCommitted, false, false},
		{"another owner claimed before the commit", func(t *testing.T, e *env) {
			e.mustClaim(t, part, tok(0, 82), "b", 0)
		}, fence.Fenced, false, true},
		// Superseded since, but it did commit: retrying it would apply the
		// batch twice (were the fence not there) or stall on a mismatch.
		{"another owner claimed after the commit", func(t *testing.T, e *env) {
			e.mustCommit(t, req)
			e.mustClaim(t, part, tok(0, 82), "b", 0)
		}, fence.Committed, false, false},
		{"same token, other owner", func(t *testing.T, e *env) {
			if _, err := e.pool.Exec(e.ctx, `UPDATE `+e.q()+`.fences SET owner = 'b'`); err != nil {
				t.Fatal(err)
			}
		}, fence.Fenced, false, true},
		{"the row moved past To", func(t *testing.T, e *env) {
			e.mustCommit(t, req)
			e.mustCommit(t, sink.CommitRequest{Partition: part, Token: req.Token, Owner: req.Owner, From: req.To, To: 20})
		}, fence.Committed, false, false},
		{"the row moved past From without this commit", func(t *testing.T, e *env) {
			e.mustCommit(t, sink.CommitRequest{Partition: part, Token: req.Token, Owner: req.Owner, From: req.From, To: 12})
		}, fence.Fenced, true, true},
		{"the row was deleted", func(t *testing.T, e *env) {
			if _, err := e.pool.Exec(e.ctx, `DELETE FROM `+e.q()+`.fences`); err != nil {
				t.Fatal(err)
			}
		}, fence.Fenced, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			e.mustClaim(t, part, req.Token, req.Owner, req.From)
			c.after(t, e)
			got, err := e.store.Resolve(e.ctx, req, 0)
			if got != c.want {
				t.Errorf("Resolve = %v, want %v (err %v)", got, c.want, err)
			}
			if c.want != fence.Fenced {
				if err != nil {
					t.Errorf("Resolve error: %v", err)
				}
				return
			}
			fe := asFenced(t, err)
			if fe.Found != c.found {
				t.Errorf("FencedError.Found = %v, want %v", fe.Found, c.found)
			}
			if fe.Op != "commit" || fe.Presented != req.Token || fe.Owner != req.Owner || fe.From != req.From {
				t.Errorf("FencedError = %+v does not describe the request %+v", *fe, req)
			}
			if errors.Is(err, sink.ErrOffsetMismatch) != c.mismatch {
				t.Errorf("errors.Is(%v, ErrOffsetMismatch) = %v, want %v", err, !c.mismatch, c.mismatch)
			}
		})
	}
}

func TestOutcomeString(t *testing.T) {
	for o, want := range map[fence.Outcome]string{
		fence.Committed: "committed", fence.NotCommitted: "not committed", fence.Fenced: "fenced", 0: "unknown", 99: "unknown",
	} {
		if got := o.String(); got != want {
			t.Errorf("Outcome(%d).String() = %q, want %q", int(o), got, want)
		}
	}
}

// While the transaction is still in progress, Resolve does not answer: a
// COMMIT that is slow (here a deferred trigger sleeps in it) is waited for,
// and then reported as committed; the old rule (read the row at once) would
// have said "not committed", and the retry would have stalled on an offset
// mismatch once the slow COMMIT landed.
func TestResolveWaitsForACommitInProgress(t *testing.T) {
	t.Parallel()
	e := setup(t)
	req := sink.CommitRequest{Partition: part, Token: tok(0, 7), Owner: "a", ClaimID: 3, From: 0, To: 5}
	e.mustClaim(t, part, req.Token, req.Owner, 0)
	if _, err := e.pool.Exec(e.ctx, `UPDATE `+e.q()+`.fences SET claim_id = 3`); err != nil {
		t.Fatal(err)
	}
	slow := e.q() + ".slow"
	if _, err := e.pool.Exec(e.ctx, `CREATE TABLE `+slow+` (x int);
		CREATE FUNCTION `+e.q()+`.sleep_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(1.5); RETURN NULL; END $$;
		CREATE CONSTRAINT TRIGGER sleep_at_commit AFTER INSERT ON `+slow+` DEFERRABLE INITIALLY DEFERRED
			FOR EACH ROW EXECUTE FUNCTION `+e.q()+`.sleep_at_commit()`); err != nil {
		t.Fatal(err)
	}
	tx, err := e.pool.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Released on every path, so that a failure reads as one instead of the
	// pool's Close waiting for this transaction: rolled back if the COMMIT
	// below never started, waited for if it did.
	commitDone := make(chan struct{})
	started := false
	defer func() {
		if started {
			<-commitDone
			return
		}
		_ = tx.Rollback(context.Background())
	}()
	if _, err := tx.Exec(e.ctx, `INSERT INTO `+slow+` VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	xid, err := e.store.CommitTracked(e.ctx, tx, req)
	if err != nil || xid <= 0 {
		t.Fatalf("CommitTracked: xid %d, %v", xid, err)
	}
	committed := make(chan error, 1)
	started = true
	go func() { committed <- tx.Commit(e.ctx); close(commitDone) }() // sleeps 1.5s in COMMIT
	time.Sleep(300 * time.Millisecond)                               // the COMMIT is running
	start := time.Now()
	out, err := e.store.Resolve(e.ctx, req, xid)
	if out != fence.Committed || err != nil {
		t.Fatalf("Resolve = %v, %v; want committed", out, err)
	}
	if err := <-committed; err != nil {
		t.Fatalf("the slow COMMIT failed: %v", err)
	}
	if waited := time.Since(start); waited < 500*time.Millisecond {
		t.Errorf("Resolve answered after %s, before the COMMIT could have ended", waited)
	}
}

// A transaction whose COMMIT never came (its session sits idle in it) is
// ended by Resolve, and then reported as not committed.
func TestResolveEndsATransactionWhoseCommitNeverCame(t *testing.T) {
	t.Parallel()
	e := setup(t)
	req := sink.CommitRequest{Partition: part, Token: tok(0, 7), Owner: "a", From: 0, To: 5}
	e.mustClaim(t, part, req.Token, req.Owner, 0)
	tx, err := e.pool.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(e.ctx) //nolint:errcheck // the session is terminated
	xid, err := e.store.CommitTracked(e.ctx, tx, req)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	out, err := e.store.Resolve(ctx, req, xid)
	if out != fence.NotCommitted || err != nil {
		t.Fatalf("Resolve = %v, %v; want not committed", out, err)
	}
	if err := tx.Commit(e.ctx); err == nil {
		t.Fatal("the ended transaction still committed")
	}
	if f := e.mustGet(t, part); f.NextOffset != 0 {
		t.Fatalf("next offset %d, want 0", f.NextOffset)
	}
}
