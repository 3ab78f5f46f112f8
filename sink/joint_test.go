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

// A joint commit (one transaction, one fence statement over several
// partitions) commits nothing of any partition when one of them is
// refused, says which one, and the others commit when run again without
// it.
func TestCommitJoint(t *testing.T) {
	t.Parallel()
	parts := []sink.Partition{{Group: "g", Topic: "t", Partition: 0}, {Group: "g", Topic: "t", Partition: 1}, {Group: "g", Topic: "u", Partition: 2}}
	for _, c := range []struct {
		name  string
		spoil func(t *testing.T, e *env, reqs []sink.CommitRequest) // makes reqs[1] stale
	}{
		{"a newer claim of one partition", func(t *testing.T, e *env, _ []sink.CommitRequest) {
			e.mustClaim(t, parts[1], tok(0, 8), "b", 0)
		}},
		{"one partition's offset moved on", func(t *testing.T, e *env, reqs []sink.CommitRequest) {
			e.mustCommit(t, reqs[1])
		}},
		{"one partition in another log epoch", func(t *testing.T, e *env, reqs []sink.CommitRequest) {
			reqs[1].LogEpoch = 1
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			reqs := make([]sink.CommitRequest, len(parts))
			for i, p := range parts {
				e.mustClaim(t, p, tok(0, 7), "a", 0)
				reqs[i] = sink.CommitRequest{Partition: p, Token: tok(0, 7), Owner: "a", From: 0, To: 5}
			}
			c.spoil(t, e, reqs)
			before := make([]sink.Fence, len(parts))
			for i, p := range parts {
				before[i] = e.mustGet(t, p)
			}

			err := e.commitJoint(t, reqs, "m1")
			var jf *fence.JointFencedError
			if !errors.As(err, &jf) || !errors.Is(err, sink.ErrFenced) {
				t.Fatalf("CommitJoint = %v, want a *JointFencedError matching ErrFenced", err)
			}
			if len(jf.Fenced) != 1 || jf.Fenced[1] == nil {
				t.Fatalf("refused %v, want exactly the second request", jf.Fenced)
			}
			asFenced(t, jf.Fenced[1])
			for i, p := range parts {
				if f := e.mustGet(t, p); f.NextOffset != before[i].NextOffset || f.Token != before[i].Token {
					t.Errorf("%s after the refused joint commit: next %d at %s, want %d at %s", p, f.NextOffset, f.Token, before[i].NextOffset, before[i].Token)
				}
				if i != 1 {
					e.checkEffectsExactlyOnce(t, p, 0, 0)
					if log := e.fenceLog(t, p); len(log) != 1 || log[0].Kind != "claim" {
						t.Errorf("fence log of %s = %+v, want its claim only", p, entries(log))
					}
				}
			}

			// The others again, without the refused one: both commit, in
			// one transaction.
			if err := e.commitJoint(t, []sink.CommitRequest{reqs[0], reqs[2]}, "m2"); err != nil {
				t.Fatalf("CommitJoint of the others: %v", err)
			}
			for _, i := range []int{0, 2} {
				e.checkEffectsExactlyOnce(t, parts[i], 0, 5)
				if f := e.mustGet(t, parts[i]); f.NextOffset != 5 {
					t.Errorf("%s: next offset %d, want 5", parts[i], f.NextOffset)
				}
			}
			var txs, rows int
			if err := e.pool.QueryRow(e.ctx, `SELECT count(DISTINCT xmin::text), count(*) FROM `+e.q()+`.fence_log
				WHERE kind = 'commit' AND owner = 'a' AND (topic, partition) IN (('t', 0), ('u', 2))`).Scan(&txs, &rows); err != nil {
				t.Fatal(err)
			}
			if txs != 1 || rows != 2 {
				t.Errorf("commit rows of the joint commit: %d in %d transactions, want 2 in 1", rows, txs)
			}
		})
	}
}

// commitJoint runs a batch for each of reqs in one transaction marked
// marker, then CommitJoint; the transaction is rolled back if it did not
// commit.
func (e *env) commitJoint(t *testing.T, reqs []sink.CommitRequest, marker string) error {
	t.Helper()
	conn, err := e.pool.Acquire(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	tx, err := conn.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }() // after COMMIT: nothing
	if _, err := tx.Exec(e.ctx, `SET LOCAL tenure.tx = '`+marker+`'`); err != nil {
		t.Fatal(err)
	}
	for _, r := range reqs {
		if err := e.handle(tx, r); err != nil {
			t.Fatal(err)
		}
	}
	return e.store.CommitJoint(e.ctx, tx, reqs, marker)
}

// A newer owner's claim recognises a joint transaction that carries an
// older claimant's batch of its partition by the range of claims it names
// (fence.JointApplicationName), and ends it: the other partition's batch in
// it rolls back with it, and is free to run again.
func TestClaimEndsAJointTransactionOfAnOlderClaimant(t *testing.T) {
	t.Parallel()
	e := setup(t)
	p, q := sink.Partition{Group: "g", Topic: "t", Partition: 0}, sink.Partition{Group: "g", Topic: "t", Partition: 1}
	a := sink.Token{Epoch: 1}
	for i, part := range []sink.Partition{p, q} {
		if _, err := e.store.Claim(e.ctx, sink.ClaimRequest{Partition: part, Token: a, Owner: "A", ClaimID: int64(7 + i), PartitionCount: 2}); err != nil {
			t.Fatal(err)
		}
	}
	// A's joint batch of p (claim 7) and q (claim 8): its fence statements
	// ran, its COMMIT never comes.
	tx := e.begin(t, pgx.TxOptions{})
	if _, err := tx.Exec(e.ctx, "SET LOCAL application_name = '"+fence.JointApplicationName(7, 8)+"'"); err != nil {
		t.Fatal(err)
	}
	for i, part := range []sink.Partition{p, q} {
		if err := e.store.Commit(e.ctx, tx, sink.CommitRequest{Partition: part, Token: a, Owner: "A", ClaimID: int64(7 + i), From: 0, To: 5}); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	c, err := e.store.Claim(ctx, sink.ClaimRequest{Partition: p, Token: sink.Token{Epoch: 2}, Owner: "B", ClaimID: 9, PartitionCount: 2})
	if err != nil {
		t.Fatalf("the claim waited for the joint transaction: %v", err)
	}
	if c.StaleSessionsEnded != 1 || c.NextOffset != 0 {
		t.Errorf("claim %+v: want the joint session ended and its batches rolled back (next offset 0)", c)
	}
	if f := e.mustGet(t, q); f.NextOffset != 0 || f.ClaimID != 8 {
		t.Errorf("%s: %+v, want its batch rolled back with the joint transaction, still claim 8 at 0", q, f)
	}
}
