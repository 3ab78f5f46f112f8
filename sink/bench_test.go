package sink_test

import (
	"testing"

	"github.com/tenure-dev/tenure/sink"
)

// BenchmarkCommit is the fence's per-batch cost as a caller pays it: begin,
// Commit advancing by one offset, tx.Commit. No handler writes.
func BenchmarkCommit(b *testing.B) {
	e := setup(b)
	from := e.mustClaim(b, part, tok(0, 1), "a", 0)
	b.ResetTimer()
	for range b.N {
		tx, err := e.pool.Begin(e.ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := e.store.Commit(e.ctx, tx, sink.CommitRequest{Partition: part, Token: tok(0, 1), Owner: "a", From: from, To: from + 1}); err != nil {
			b.Fatal(err)
		}
		if err := tx.Commit(e.ctx); err != nil {
			b.Fatal(err)
		}
		from++
	}
}

// BenchmarkClaim is the cost of a hand-off: each claim at a new, higher token.
func BenchmarkClaim(b *testing.B) {
	e := setup(b)
	b.ResetTimer()
	for i := range b.N {
		if _, err := e.claim(part, tok(0, int32(i+1)), "a", 0); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCommitRejected is the cost of a rejection: the statement plus the
// read of the winner outside the transaction.
func BenchmarkCommitRejected(b *testing.B) {
	e := setup(b)
	e.mustClaim(b, part, tok(0, 1), "a", 0)
	e.mustClaim(b, part, tok(0, 2), "b", 0)
	b.ResetTimer()
	for range b.N {
		tx, err := e.pool.Begin(e.ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := e.store.Commit(e.ctx, tx, sink.CommitRequest{Partition: part, Token: tok(0, 1), Owner: "a", From: 0, To: 1}); err == nil {
			b.Fatal("accepted")
		}
		if err := tx.Rollback(e.ctx); err != nil {
			b.Fatal(err)
		}
	}
}
