package sink_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tenure-dev/tenure/internal/fence"
	"github.com/tenure-dev/tenure/sink"
)

// commitClaim is a claim, from start offset 10, that TestCommit's cases
// make before their commit.
type commitClaim struct {
	owner string
	token sink.Token
}

var a81, b82 = commitClaim{"a", tok(0, 81)}, commitClaim{"b", tok(0, 82)}

type commitCase struct {
	name   string
	claims []commitClaim // in order; each must be accepted
	// prior commits, accepted, by the claimant named, from the stored offset
	priorTo []int64
	req     sink.CommitRequest
	// outcome
	fenced, mismatch, invalid bool
	wantNext                  int64      // row's next offset afterwards
	wantCurrent               sink.Token // for fenced: the row's token in the error
	wantOwner                 string
}

var commitCases = []commitCase{
	{
		name:     "matching token, owner and from is accepted",
		claims:   []commitClaim{a81},
		req:      sink.CommitRequest{Token: tok(0, 81), Owner: "a", From: 10, To: 15},
		wantNext: 15,
	},
	{
		name:     "a batch of one record",
		claims:   []commitClaim{a81},
		req:      sink.CommitRequest{Token: tok(0, 81), Owner: "a", From: 10, To: 11},
		wantNext: 11,
	},
	{
		name:     "consecutive commit from the previous To",
		claims:   []commitClaim{a81},
		priorTo:  []int64{12, 20},
		req:      sink.CommitRequest{Token: tok(0, 81), Owner: "a", From: 20, To: 25},
		wantNext: 25,
	},
	{
		name:   "lower token after a newer claim is fenced (G3: the new owner wrote nothing)",
		claims: []commitClaim{a81, b82},
		req:    sink.CommitRequest{Token: tok(0, 81), Owner: "a", From: 10, To: 15},
		fenced: true, wantNext: 10, wantCurrent: tok(0, 82), wantOwner: "b",
	},
	{
		name:   "lower token after a newer claim is fenced even by the new owner's id",
		claims: []commitClaim{a81, b82},
		req:    sink.CommitRequest{Token: tok(0, 81), Owner: "b", From: 10, To: 15},
		fenced: true, wantNext: 10, wantCurrent: tok(0, 82), wantOwner: "b",
	},
	{
		name:   "lower incarnation with a higher epoch is fenced",
		claims: []commitClaim{a81, {"b", tok(1, 1)}},
		req:    sink.CommitRequest{Token: tok(0, 900), Owner: "a", From: 10, To: 15},
		fenced: true, wantNext: 10, wantCurrent: tok(1, 1), wantOwner: "b",
	},
	{
		name:   "higher token than the row's is fenced: it was never claimed",
		claims: []commitClaim{a81},
		req:    sink.CommitRequest{Token: tok(0, 82), Owner: "a", From: 10, To: 15},
		fenced: true, wantNext: 10, wantCurrent: tok(0, 81), wantOwner: "a",
	},
	{
		name:   "same token other owner is fenced",
		claims: []commitClaim{a81},
		req:    sink.CommitRequest{Token: tok(0, 81), Owner: "b", From: 10, To: 15},
		fenced: true, wantNext: 10, wantCurrent: tok(0, 81), wantOwner: "a",
	},
	{
		name:   "from ahead of the stored offset is an offset mismatch",
		claims: []commitClaim{a81},
		req:    sink.CommitRequest{Token: tok(0, 81), Owner: "a", From: 12, To: 15},
		fenced: true, mismatch: true, wantNext: 10, wantCurrent: tok(0, 81), wantOwner: "a",
	},
	{
		name:    "a batch committed twice is an offset mismatch the second time",
		claims:  []commitClaim{a81},
		priorTo: []int64{15},
		req:     sink.CommitRequest{Token: tok(0, 81), Owner: "a", From: 10, To: 15},
		fenced:  true, mismatch: true, wantNext: 15, wantCurrent: tok(0, 81), wantOwner: "a",
	},
	{
		name:    "an overlapping batch is an offset mismatch",
		claims:  []commitClaim{a81},
		priorTo: []int64{15},
		req:     sink.CommitRequest{Token: tok(0, 81), Owner: "a", From: 12, To: 20},
		fenced:  true, mismatch: true, wantNext: 15, wantCurrent: tok(0, 81), wantOwner: "a",
	},
	{
		name:    "the old owner's next batch after the new owner committed is fenced",
		claims:  []commitClaim{a81, b82},
		priorTo: []int64{15},
		req:     sink.CommitRequest{Token: tok(0, 81), Owner: "a", From: 15, To: 20},
		fenced:  true, wantNext: 15, wantCurrent: tok(0, 82), wantOwner: "b",
	},
	{
		name:     "To equal to From is invalid",
		claims:   []commitClaim{a81},
		req:      sink.CommitRequest{Token: tok(0, 81), Owner: "a", From: 10, To: 10},
		invalid:  true,
		wantNext: 10,
	},
	{
		name:     "To below From is invalid",
		claims:   []commitClaim{a81},
		req:      sink.CommitRequest{Token: tok(0, 81), Owner: "a", From: 10, To: 9},
		invalid:  true,
		wantNext: 10,
	},
}

// TestCommit runs each commit the way a caller does (begin, handler write,
// Commit, then tx.Commit or tx.Rollback) and checks the row, the handler's
// effects and the error.
func TestCommit(t *testing.T) {
	t.Parallel()
	for _, c := range commitCases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			e.commitCaseBefore(t, c)
			before := e.mustGet(t, part)
			effectsBefore := e.effects(t, part)
			logBefore := e.fenceLog(t, part)

			req := c.req
			req.Partition = part
			err := e.commit(t, req)

			after := e.mustGet(t, part)
			switch {
			case c.invalid:
				if err == nil {
					t.Fatal("accepted")
				}
				if errors.Is(err, sink.ErrFenced) {
					t.Errorf("error %v matches ErrFenced; a non-advancing commit is a bug, not a rejection", err)
				}
			case c.fenced:
				checkCommitRejected(t, c, req, err)
			default:
				if err != nil {
					t.Fatalf("rejected: %v", err)
				}
				if after.CommittedAt == nil {
					t.Error("committed_at not set by an accepted commit")
				} else if before.CommittedAt != nil && after.CommittedAt.Before(*before.CommittedAt) {
					t.Errorf("committed_at went back from %v to %v", *before.CommittedAt, *after.CommittedAt)
				}
			}
			if after.NextOffset != c.wantNext {
				t.Errorf("row next offset = %d, want %d", after.NextOffset, c.wantNext)
			}
			if after.Token != before.Token || after.Owner != before.Owner || after.PartitionCount != before.PartitionCount {
				t.Errorf("a commit changed the row's holder: %+v -> %+v", before, after)
			}
			if err != nil && !equalTimePtr(after.CommittedAt, before.CommittedAt) {
				t.Errorf("a rejected commit changed committed_at: %v -> %v", before.CommittedAt, after.CommittedAt)
			}
			e.checkCommitWrites(t, req, err == nil, effectsBefore, logBefore)
		})
	}
}

// commitCaseBefore makes c's claims and its prior commits, the latter by
// the last claimant.
func (e *env) commitCaseBefore(t *testing.T, c commitCase) {
	t.Helper()
	var last commitClaim
	for _, cl := range c.claims {
		e.mustClaim(t, part, cl.token, cl.owner, 10)
		last = cl
	}
	from := int64(10)
	for _, to := range c.priorTo {
		e.mustCommit(t, sink.CommitRequest{Partition: part, Token: last.token, Owner: last.owner, From: from, To: to})
		from = to
	}
}

// checkCommitRejected checks the rejection of req, c's commit: its detail
// and what its message names.
func checkCommitRejected(t *testing.T, c commitCase, req sink.CommitRequest, err error) {
	t.Helper()
	fe := asFenced(t, err)
	if got := errors.Is(err, sink.ErrOffsetMismatch); got != c.mismatch {
		t.Errorf("errors.Is(err, ErrOffsetMismatch) = %v, want %v (err: %v)", got, c.mismatch, err)
	}
	want := sink.FencedError{Op: "commit", Partition: part, Presented: req.Token, Owner: req.Owner, From: req.From,
		Found: true, Current: c.wantCurrent, CurrentOwner: c.wantOwner, NextOffset: c.wantNext}
	if *fe != want {
		t.Errorf("FencedError = %+v\nwant          %+v", *fe, want)
	}
	msg := err.Error()
	names := []string{req.Token.String(), `"` + req.Owner + `"`, part.String()}
	if c.mismatch {
		names = append(names, "offset "+strconv.FormatInt(req.From, 10), "offset is "+strconv.FormatInt(c.wantNext, 10))
	} else {
		names = append(names, c.wantCurrent.String(), `"`+c.wantOwner+`"`)
	}
	for _, s := range names {
		if !strings.Contains(msg, s) {
			t.Errorf("error %q does not contain %q", msg, s)
		}
	}
}

// checkCommitWrites checks what req left: the handler's writes in the same
// transaction are there if and only if the commit was accepted; the log
// gains exactly one entry for an accepted commit and none for a rejection.
func (e *env) checkCommitWrites(t *testing.T, req sink.CommitRequest, accepted bool, effectsBefore []int64, logBefore []logEntry) {
	t.Helper()
	wantEffects, wantLog := effectsBefore, entries(logBefore)
	if accepted {
		for o := req.From; o < req.To; o++ {
			wantEffects = append(wantEffects, o)
		}
		wantLog = append(wantLog, entry{Kind: "commit", Token: req.Token, Owner: req.Owner, From: req.From, To: req.To})
	}
	slices.Sort(wantEffects)
	if got := e.effects(t, part); !slices.Equal(got, wantEffects) {
		t.Errorf("effects = %v, want %v", got, wantEffects)
	}
	if got := entries(e.fenceLog(t, part)); !slices.Equal(got, wantLog) {
		t.Errorf("fence_log = %+v\nwant       %+v", got, wantLog)
	}
}

func equalTimePtr(a, b *time.Time) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Equal(*b)
}

// G3, the "token 81 arrives after 82 claimed" case: the old owner A paused
// inside its transaction, after its handler wrote. The new owner B claims at
// 82 and writes nothing. A's commit from the offset it claimed is rejected and
// its handler's writes roll back with it, whatever isolation level A's
// transaction uses.
func TestCommitG3OldOwnerRejectedAfterNewClaim(t *testing.T) {
	t.Parallel()
	for _, iso := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable} {
		t.Run(string(iso), func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			from := e.mustClaim(t, part, tok(0, 81), "a", 0)
			reqA := sink.CommitRequest{Partition: part, Token: tok(0, 81), Owner: "a", From: from, To: from + 5}

			tx := e.begin(t, pgx.TxOptions{IsoLevel: iso})
			if err := e.handle(tx, reqA); err != nil { // A's snapshot is taken here, before B's claim
				t.Fatal(err)
			}

			if next := e.mustClaim(t, part, tok(0, 82), "b", 0); next != from {
				t.Fatalf("B's claim: next offset %d, want %d", next, from)
			}

			err := e.store.Commit(e.ctx, tx, reqA)
			if err == nil {
				t.Fatal("A's commit at 0.81 accepted after B claimed at 0.82")
			}
			// Under a snapshot isolation level Postgres refuses the update
			// with a serialization failure; Commit reads the row and reports
			// the same FencedError as the fence itself does under read
			// committed.
			fe := asFenced(t, err)
			if fe.Current != tok(0, 82) || fe.CurrentOwner != "b" || fe.NextOffset != from {
				t.Errorf("FencedError = %+v, want B at 0.82 holding %d", *fe, from)
			}
			if err := tx.Rollback(e.ctx); err != nil {
				t.Fatal(err)
			}
			if got := e.effects(t, part); len(got) != 0 {
				t.Errorf("A's handler writes survived the rejection: %v", got)
			}
			f := e.mustGet(t, part)
			if f.Token != tok(0, 82) || f.Owner != "b" || f.NextOffset != from {
				t.Errorf("row = %+v, want B at 0.82 at %d", f, from)
			}
			// B goes on from where it claimed; its work is the only one.
			e.mustCommit(t, sink.CommitRequest{Partition: part, Token: tok(0, 82), Owner: "b", From: from, To: from + 5})
			e.checkEffectsExactlyOnce(t, part, from, from+5)
			want := []entry{
				{Kind: "claim", Token: tok(0, 81), Owner: "a", From: from, To: from},
				{Kind: "claim", Token: tok(0, 82), Owner: "b", From: from, To: from},
				{Kind: "commit", Token: tok(0, 82), Owner: "b", From: from, To: from + 5},
			}
			if got := entries(e.fenceLog(t, part)); !slices.Equal(got, want) {
				t.Errorf("fence_log = %+v\nwant       %+v", got, want)
			}
		})
	}
}

// G1 and the documented gap: A commits before B's claim lands, so A's commit
// is accepted; B's claim then returns A's To and B resumes after it. Nothing
// is processed twice or skipped, and A's next batch is fenced.
func TestCommitBeforeClaimG1(t *testing.T) {
	t.Parallel()
	e := setup(t)
	from := e.mustClaim(t, part, tok(0, 81), "a", 0)
	e.mustCommit(t, sink.CommitRequest{Partition: part, Token: tok(0, 81), Owner: "a", From: from, To: 5})
	next := e.mustClaim(t, part, tok(0, 82), "b", 0)
	if next != 5 {
		t.Fatalf("B's claim after A's commit: next offset %d, want 5 (A's To)", next)
	}
	asFenced(t, e.commit(t, sink.CommitRequest{Partition: part, Token: tok(0, 81), Owner: "a", From: 5, To: 8}))
	e.mustCommit(t, sink.CommitRequest{Partition: part, Token: tok(0, 82), Owner: "b", From: next, To: 9})
	e.checkEffectsExactlyOnce(t, part, 0, 9)
	want := []entry{
		{Kind: "claim", Token: tok(0, 81), Owner: "a", From: 0, To: 0},
		{Kind: "commit", Token: tok(0, 81), Owner: "a", From: 0, To: 5},
		{Kind: "claim", Token: tok(0, 82), Owner: "b", From: 5, To: 5},
		{Kind: "commit", Token: tok(0, 82), Owner: "b", From: 5, To: 9},
	}
	if got := entries(e.fenceLog(t, part)); !slices.Equal(got, want) {
		t.Errorf("fence_log = %+v\nwant       %+v", got, want)
	}
}

// waitBlockedBy waits until some backend waits on a lock held by pid: the
// proof that a concurrent statement is blocked, without sleeping blind.
func (e *env) waitBlockedBy(t *testing.T, pid uint32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		var n int
		if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_catalog.pg_stat_activity
			WHERE $1::integer = ANY(pg_catalog.pg_blocking_pids(pid))`, int32(pid)).Scan(&n); err != nil {
			t.Fatalf("waiting for a backend blocked by %d: %v", pid, err)
		}
		if n > 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no backend got blocked by %d: %v", pid, ctx.Err())
		case <-tick.C:
		}
	}
}

type claimResult struct {
	c   sink.Claimed
	err error
}

// begin opens a transaction for the test to end; if it does not, the
// cleanup rolls it back (a failure must not hang the pool's Close).
func (e *env) begin(t testing.TB, opts pgx.TxOptions) pgx.Tx {
	t.Helper()
	tx, err := e.pool.BeginTx(e.ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

// openBatch is a batch between its fence statement and its COMMIT: the
// handler's writes and req's Commit ran in a transaction left open, which
// holds the fencing row until the test ends it.
func (e *env) openBatch(t testing.TB, req sink.CommitRequest) pgx.Tx {
	t.Helper()
	tx := e.begin(t, pgx.TxOptions{})
	if err := e.handle(tx, req); err != nil {
		t.Fatal(err)
	}
	if err := e.store.Commit(e.ctx, tx, req); err != nil {
		t.Fatalf("commit %+v: %v", req, err)
	}
	return tx
}

// setupOpenBatch is setup with part claimed by owner "a" with token 0.5
// at start, and a's batch from there to to open with its fence passed
// (openBatch).
func setupOpenBatch(t testing.TB, start, to int64) (e *env, req sink.CommitRequest, tx pgx.Tx) {
	t.Helper()
	e = setup(t)
	from := e.mustClaim(t, part, tok(0, 5), "a", start)
	req = sink.CommitRequest{Partition: part, Token: tok(0, 5), Owner: "a", From: from, To: to}
	return e, req, e.openBatch(t, req)
}

// openLaneBatch is openBatch without the handler's writes, in a session
// named for req's claim as a lane names it (fence.ApplicationName), so that
// a newer claim can tell whose it is.
func (e *env) openLaneBatch(t testing.TB, req sink.CommitRequest) pgx.Tx {
	t.Helper()
	tx := e.begin(t, pgx.TxOptions{})
	if _, err := tx.Exec(e.ctx, "SET LOCAL application_name = '"+fence.ApplicationName(req.ClaimID)+"'"); err != nil {
		t.Fatal(err)
	}
	if err := e.store.Commit(e.ctx, tx, req); err != nil {
		t.Fatalf("commit %+v: %v", req, err)
	}
	return tx
}

// A's Commit has run inside A's open transaction, so the fencing row is
// locked. B's claim must wait for A's transaction to end and then see its
// outcome: A's To if A committed, A's From if A rolled back.
func TestClaimWaitsForOpenCommit(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name     string
		commit   bool
		wantNext int64
		wantLog  []entry
	}{
		{"A commits", true, 15, []entry{
			{Kind: "claim", Token: tok(0, 81), Owner: "a", From: 10, To: 10},
			{Kind: "commit", Token: tok(0, 81), Owner: "a", From: 10, To: 15},
			{Kind: "claim", Token: tok(0, 82), Owner: "b", From: 15, To: 15},
		}},
		{"A rolls back", false, 10, []entry{
			{Kind: "claim", Token: tok(0, 81), Owner: "a", From: 10, To: 10},
			{Kind: "claim", Token: tok(0, 82), Owner: "b", From: 10, To: 10},
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			from := e.mustClaim(t, part, tok(0, 81), "a", 10)
			tx := e.openBatch(t, sink.CommitRequest{Partition: part, Token: tok(0, 81), Owner: "a", From: from, To: 15})

			ctx, cancel := context.WithTimeout(e.ctx, 15*time.Second)
			defer cancel()
			res := make(chan claimResult, 1)
			go func() {
				c, err := e.store.Claim(ctx, sink.ClaimRequest{Partition: part, Token: tok(0, 82), Owner: "b", StartOffset: 0, PartitionCount: 12})
				res <- claimResult{c, err}
			}()
			e.waitBlockedBy(t, tx.Conn().PgConn().PID())
			select { // bounded check that B really is still waiting
			case r := <-res:
				t.Fatalf("B's claim returned %+v, %v while A's transaction is open", r.c, r.err)
			case <-time.After(50 * time.Millisecond):
			}

			end := tx.Rollback
			if c.commit {
				end = tx.Commit
			}
			if err := end(e.ctx); err != nil {
				t.Fatal(err)
			}
			var r claimResult
			select {
			case r = <-res:
			case <-ctx.Done():
				t.Fatalf("B's claim still blocked after A's transaction ended: %v", ctx.Err())
			}
			if r.err != nil {
				t.Fatalf("B's claim: %v", r.err)
			}
			if r.c.NextOffset != c.wantNext {
				t.Errorf("B's claim: next offset %d, want %d", r.c.NextOffset, c.wantNext)
			}
			// A is fenced from now on, whatever it believes.
			asFenced(t, e.commit(t, sink.CommitRequest{Partition: part, Token: tok(0, 81), Owner: "a", From: r.c.NextOffset, To: 20}))
			if c.commit {
				e.checkEffectsExactlyOnce(t, part, 10, 15)
			} else {
				e.checkEffectsExactlyOnce(t, part, 0, 0)
			}
			if got := entries(e.fenceLog(t, part)); !slices.Equal(got, c.wantLog) {
				t.Errorf("fence_log = %+v\nwant       %+v", got, c.wantLog)
			}
		})
	}
}

// The same batch committed twice at once (a retry racing the original): the
// second Commit waits for the first transaction, then re-checks the row and
// finds the offset moved, so the batch's effects land once.
func TestCommitConcurrentDuplicate(t *testing.T) {
	t.Parallel()
	e, req, tx1 := setupOpenBatch(t, 0, 4)

	ctx, cancel := context.WithTimeout(e.ctx, 15*time.Second)
	defer cancel()
	res := make(chan error, 1)
	go func() {
		tx2, err := e.pool.Begin(ctx)
		if err != nil {
			res <- err
			return
		}
		defer func() { _ = tx2.Rollback(context.Background()) }()
		if err := e.handle(tx2, req); err != nil {
			res <- err
			return
		}
		if err := e.store.Commit(ctx, tx2, req); err != nil {
			res <- err
			return
		}
		res <- tx2.Commit(ctx)
	}()
	e.waitBlockedBy(t, tx1.Conn().PgConn().PID())
	if err := tx1.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	var err error
	select {
	case err = <-res:
	case <-ctx.Done():
		t.Fatal("second commit still blocked")
	}
	if !errors.Is(err, sink.ErrOffsetMismatch) || !errors.Is(err, sink.ErrFenced) {
		t.Fatalf("duplicate commit: %v, want ErrOffsetMismatch and ErrFenced", err)
	}
	e.checkEffectsExactlyOnce(t, part, 0, 4)
	if f := e.mustGet(t, part); f.NextOffset != 4 {
		t.Errorf("next offset %d, want 4", f.NextOffset)
	}
}

// Commit accepted, but the caller then rolls back (its handler failed after
// the fence statement): nothing happened, the log says so, and the batch can
// be retried from the same offset.
func TestCommitAcceptedThenRolledBack(t *testing.T) {
	t.Parallel()
	e, req, tx := setupOpenBatch(t, 3, 8)
	if err := tx.Rollback(e.ctx); err != nil {
		t.Fatal(err)
	}
	f := e.mustGet(t, part)
	if f.NextOffset != 3 || f.CommittedAt != nil {
		t.Errorf("row after a rolled-back commit: next %d committed_at %v, want 3 and nil", f.NextOffset, f.CommittedAt)
	}
	if out, err := e.store.Resolve(e.ctx, req, 0); out != fence.NotCommitted || err != nil {
		t.Errorf("Resolve = %v, %v; want not committed", out, err)
	}
	e.mustCommit(t, req)
	e.checkEffectsExactlyOnce(t, part, 3, 8)
	want := []entry{
		{Kind: "claim", Token: tok(0, 5), Owner: "a", From: 3, To: 3},
		{Kind: "commit", Token: tok(0, 5), Owner: "a", From: 3, To: 8},
	}
	if got := entries(e.fenceLog(t, part)); !slices.Equal(got, want) {
		t.Errorf("fence_log = %+v\nwant       %+v", got, want)
	}
}

// A commit for a partition nobody claimed has no row to match.
func TestCommitWithoutRow(t *testing.T) {
	t.Parallel()
	e := setup(t)
	err := e.commit(t, sink.CommitRequest{Partition: part, Token: tok(0, 1), Owner: "a", From: 0, To: 1})
	fe := asFenced(t, err)
	if fe.Found || fe.Op != "commit" {
		t.Errorf("FencedError = %+v, want Op commit, Found false", *fe)
	}
	if errors.Is(err, sink.ErrOffsetMismatch) {
		t.Errorf("%v matches ErrOffsetMismatch", err)
	}
	if !strings.Contains(err.Error(), "no fencing row") {
		t.Errorf("error %q does not say the row is missing", err)
	}
	if got := e.effects(t, part); len(got) != 0 {
		t.Errorf("effects = %v", got)
	}
	if _, err := e.store.Get(e.ctx, part); !errors.Is(err, pgx.ErrNoRows) {
		t.Errorf("Get: %v, want ErrNoRows (a commit must not create the row)", err)
	}
}

// A rejected Commit reads the winner on a second connection. When the pool
// has none to spare (the caller's transaction holds the only one), the
// rejection must still come back, bounded by the context, and still match
// ErrFenced; only the detail is lost.
func TestCommitRejectedOnStarvedPool(t *testing.T) {
	t.Parallel()
	e := setupPool(t, sizedPool(t, 1))
	e.mustClaim(t, part, tok(0, 81), "a", 0)
	e.mustClaim(t, part, tok(0, 82), "b", 0)
	req := sink.CommitRequest{Partition: part, Token: tok(0, 81), Owner: "a", From: 0, To: 3}
	tx := e.begin(t, pgx.TxOptions{})
	if err := e.handle(tx, req); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, time.Second)
	defer cancel()
	began := time.Now()
	err := e.store.Commit(ctx, tx, req)
	if took := time.Since(began); took > 3*time.Second {
		t.Errorf("rejection took %v with a 1s context", took)
	}
	if !errors.Is(err, sink.ErrFenced) {
		t.Fatalf("Commit on a starved pool: %v, want an error matching ErrFenced", err)
	}
	if err := tx.Rollback(e.ctx); err != nil {
		t.Fatal(err)
	}
	if got := e.effects(t, part); len(got) != 0 {
		t.Errorf("effects = %v after a rejection", got)
	}
}
