package sink_test

import (
	"errors"
	"testing"

	"github.com/tenure-dev/tenure/sink"
)

// Resolve answers "did my commit take effect?" from the row alone.
func TestResolve(t *testing.T) {
	t.Parallel()
	req := sink.CommitRequest{Partition: part, Token: tok(0, 81), Owner: "a", From: 10, To: 15}
	for _, c := range []struct {
		name     string
		after    func(t *testing.T, e *env) // runs after A claimed at 0.81 from 10
		want     sink.Outcome
		mismatch bool // the Fenced error also matches ErrOffsetMismatch
		found    bool // the Fenced error found a row
	}{
		{"after a committed commit", func(t *testing.T, e *env) { e.mustCommit(t, req) }, sink.Committed, false, false},
		{"before the commit: the row is at From", func(t *testing.T, e *env) {}, sink.NotCommitted, false, false},
		{"the commit rolled back", func(t *testing.T, e *env) {
			tx, err := e.pool.Begin(e.ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := e.store.Commit(e.ctx, tx, req); err != nil {
				t.Fatal(err)
			}
			if err := tx.Rollback(e.ctx); err != nil {
				t.Fatal(err)
			}
		}, sink.NotCommitted, false, false},
		{"another owner claimed before the commit", func(t *testing.T, e *env) {
			e.mustClaim(t, part, tok(0, 82), "b", 0)
		}, sink.Fenced, false, true},
		{"another owner claimed after the commit", func(t *testing.T, e *env) {
			e.mustCommit(t, req)
			e.mustClaim(t, part, tok(0, 82), "b", 0)
		}, sink.Fenced, false, true},
		{"same token, other owner", func(t *testing.T, e *env) {
			if _, err := e.pool.Exec(e.ctx, `UPDATE `+e.q()+`.fences SET owner = 'b'`); err != nil {
				t.Fatal(err)
			}
		}, sink.Fenced, false, true},
		{"the row moved past To", func(t *testing.T, e *env) {
			e.mustCommit(t, req)
			e.mustCommit(t, sink.CommitRequest{Partition: part, Token: req.Token, Owner: req.Owner, From: req.To, To: 20})
		}, sink.Fenced, true, true},
		{"the row was deleted", func(t *testing.T, e *env) {
			if _, err := e.pool.Exec(e.ctx, `DELETE FROM `+e.q()+`.fences`); err != nil {
				t.Fatal(err)
			}
		}, sink.Fenced, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			e.mustClaim(t, part, req.Token, req.Owner, req.From)
			c.after(t, e)
			got, err := e.store.Resolve(e.ctx, req)
			if got != c.want {
				t.Errorf("Resolve = %v, want %v (err %v)", got, c.want, err)
			}
			if c.want != sink.Fenced {
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
	for o, want := range map[sink.Outcome]string{
		sink.Committed: "committed", sink.NotCommitted: "not committed", sink.Fenced: "fenced", 0: "unknown", 99: "unknown",
	} {
		if got := o.String(); got != want {
			t.Errorf("Outcome(%d).String() = %q, want %q", int(o), got, want)
		}
	}
}
