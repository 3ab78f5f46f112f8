package sink_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tenure-dev/tenure/sink"
)

// claimStep is a claim, optionally followed by a commit by the same
// claimant from the offset it was given up to commitTo.
type claimStep struct {
	owner    string
	token    sink.Token
	start    int64
	count    int32 // 0: 12
	commitTo int64 // 0: no commit
	claim    int64 // the claimant's claim id (0: none)
}

// claimCase is a claim presented after the claims before it.
type claimCase struct {
	name   string
	before []claimStep // each must be accepted
	claim  claimStep
	fenced bool
	// For an accepted claim: what it returns. For a rejected one:
	// NextOffset in the error. Either way the row ends as wantToken,
	// wantOwner, wantNext, wantCount.
	wantNext  int64
	wantCount int32 // 0: 12
	wantToken sink.Token
	wantOwner string
	wantClaim int64 // the row's claim id
}

var claimCases = []claimCase{
	{name: "first claim creates the row from StartOffset and PartitionCount",
		claim:    claimStep{owner: "a", token: tok(0, 5), start: 100},
		wantNext: 100, wantToken: tok(0, 5), wantOwner: "a"},
	{name: "first claim at offset 0",
		claim:    claimStep{owner: "a", token: tok(0, 1), start: 0, count: 1},
		wantNext: 0, wantCount: 1, wantToken: tok(0, 1), wantOwner: "a"},
	{name: "same token same owner re-claims and gets the stored offset, not StartOffset",
		before: []claimStep{{owner: "a", token: tok(0, 5), start: 100, commitTo: 110}}, claim: claimStep{owner: "a", token: tok(0, 5), start: 7},
		wantNext: 110, wantToken: tok(0, 5), wantOwner: "a"},
	{name: "same token other owner is rejected",
		before: []claimStep{{owner: "a", token: tok(0, 5), start: 100, commitTo: 104}}, claim: claimStep{owner: "b", token: tok(0, 5), start: 0},
		fenced: true, wantNext: 104, wantToken: tok(0, 5), wantOwner: "a"},
	{name: "lower epoch is rejected",
		before: []claimStep{{owner: "a", token: tok(0, 82), start: 100}}, claim: claimStep{owner: "b", token: tok(0, 81), start: 0},
		fenced: true, wantNext: 100, wantToken: tok(0, 82), wantOwner: "a"},
	{name: "lower epoch by the same owner is rejected",
		before: []claimStep{{owner: "a", token: tok(0, 82), start: 100}}, claim: claimStep{owner: "a", token: tok(0, 81), start: 0},
		fenced: true, wantNext: 100, wantToken: tok(0, 82), wantOwner: "a"},
	{name: "lower incarnation with a higher epoch is rejected",
		before: []claimStep{{owner: "a", token: tok(1, 2), start: 100}}, claim: claimStep{owner: "b", token: tok(0, 900), start: 0},
		fenced: true, wantNext: 100, wantToken: tok(1, 2), wantOwner: "a"},
	{name: "higher incarnation with a lower epoch is accepted: incarnation leads",
		before: []claimStep{{owner: "a", token: tok(0, 900), start: 100, commitTo: 130}}, claim: claimStep{owner: "b", token: tok(1, 1), start: 0},
		wantNext: 130, wantToken: tok(1, 1), wantOwner: "b"},
	{name: "higher token is accepted and the next offset is preserved",
		before: []claimStep{{owner: "a", token: tok(0, 81), start: 100, commitTo: 150}}, claim: claimStep{owner: "b", token: tok(0, 82), start: 0},
		wantNext: 150, wantToken: tok(0, 82), wantOwner: "b"},
	{name: "higher token by the same owner is accepted",
		before: []claimStep{{owner: "a", token: tok(0, 81), start: 100, commitTo: 101}}, claim: claimStep{owner: "a", token: tok(0, 90), start: 0},
		wantNext: 101, wantToken: tok(0, 90), wantOwner: "a"},
	{name: "hand-back to the first owner at a still higher token",
		before: []claimStep{{owner: "a", token: tok(0, 1), start: 0, commitTo: 3}, {owner: "b", token: tok(0, 2), commitTo: 8}}, claim: claimStep{owner: "a", token: tok(0, 3), start: 0},
		wantNext: 8, wantToken: tok(0, 3), wantOwner: "a"},
	{name: "the zombie of a hand-off stays fenced at its old token",
		before: []claimStep{{owner: "a", token: tok(0, 1), start: 0, commitTo: 3}, {owner: "b", token: tok(0, 2)}}, claim: claimStep{owner: "a", token: tok(0, 1), start: 0},
		fenced: true, wantNext: 3, wantToken: tok(0, 2), wantOwner: "b"},
	// A member given the partition again while its previous lane is
	// still stopping: the old lane, recovering at the member's newer
	// epoch, must not take the partition back from the new one.
	{name: "an older lane of the owner is rejected whatever its token: a newer lane holds the row",
		before: []claimStep{{owner: "a", token: tok(0, 5), start: 0, claim: 9, commitTo: 4}}, claim: claimStep{owner: "a", token: tok(1, 7), start: 0, claim: 5},
		fenced: true, wantNext: 4, wantToken: tok(0, 5), wantOwner: "a", wantClaim: 9},
	{name: "a newer lane of the owner at a higher token is accepted",
		before: []claimStep{{owner: "a", token: tok(0, 5), start: 0, claim: 5, commitTo: 4}}, claim: claimStep{owner: "a", token: tok(0, 7), start: 0, claim: 9},
		wantNext: 4, wantToken: tok(0, 7), wantOwner: "a", wantClaim: 9},
	{name: "a newer lane of the owner at the same token is a tie",
		before: []claimStep{{owner: "a", token: tok(0, 5), start: 0, claim: 5}}, claim: claimStep{owner: "a", token: tok(0, 5), start: 0, claim: 9},
		fenced: true, wantNext: 0, wantToken: tok(0, 5), wantOwner: "a", wantClaim: 5},
	{name: "another owner's lower claim id does not matter",
		before: []claimStep{{owner: "a", token: tok(0, 5), start: 0, claim: 9}}, claim: claimStep{owner: "b", token: tok(0, 6), start: 0, claim: 2},
		wantNext: 0, wantToken: tok(0, 6), wantOwner: "b", wantClaim: 2},
	{name: "the partition count recorded first is returned to a claim with another count",
		before: []claimStep{{owner: "a", token: tok(0, 1), start: 0}}, claim: claimStep{owner: "b", token: tok(0, 2), start: 0, count: 24},
		wantNext: 0, wantToken: tok(0, 2), wantOwner: "b"},
	{name: "the recorded partition count survives a re-claim with a smaller count",
		before: []claimStep{{owner: "a", token: tok(0, 1), start: 0}}, claim: claimStep{owner: "a", token: tok(0, 1), start: 0, count: 3},
		wantNext: 0, wantToken: tok(0, 1), wantOwner: "a"},
}

func TestClaim(t *testing.T) {
	t.Parallel()
	for _, c := range claimCases {
		if c.wantCount == 0 {
			c.wantCount = 12
		}
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			for _, s := range c.before {
				got, err := e.claimStep(s)
				if err != nil {
					t.Fatalf("setup claim %+v: %v", s, err)
				}
				if s.commitTo > 0 {
					e.mustCommit(t, sink.CommitRequest{Partition: part, Token: s.token, Owner: s.owner, ClaimID: s.claim, From: got.NextOffset, To: s.commitTo})
				}
			}
			logBefore := e.fenceLog(t, part)
			got, err := e.claimStep(c.claim)
			if c.fenced {
				checkClaimRejected(t, c, got, err)
			} else {
				if err != nil {
					t.Fatalf("claim rejected: %v", err)
				}
				if want := (sink.Claimed{NextOffset: c.wantNext, PartitionCount: c.wantCount, Created: len(c.before) == 0}); got != want {
					t.Errorf("Claim = %+v, want %+v", got, want)
				}
			}
			e.checkClaimRow(t, c, logBefore)
		})
	}
}

// claimStep presents s's claim of part, at the group's incarnation.
func (e *env) claimStep(s claimStep) (sink.Claimed, error) {
	if s.count == 0 {
		s.count = 12
	}
	e.raiseIncarnation(part.Group, s.token.Incarnation)
	return e.store.Claim(e.ctx, sink.ClaimRequest{Partition: part, Token: s.token, Owner: s.owner, ClaimID: s.claim, StartOffset: s.start, PartitionCount: s.count})
}

// checkClaimRejected checks the rejection of c's claim: its detail, its
// message, and that it returned nothing.
func checkClaimRejected(t *testing.T, c claimCase, got sink.Claimed, err error) {
	t.Helper()
	fe := asFenced(t, err)
	if errors.Is(err, sink.ErrOffsetMismatch) {
		t.Errorf("a rejected claim matches ErrOffsetMismatch: %v", err)
	}
	want := sink.FencedError{Op: "claim", Partition: part, Presented: c.claim.token, Owner: c.claim.owner, From: -1,
		ClaimID: c.claim.claim, Found: true, Current: c.wantToken, CurrentOwner: c.wantOwner, CurrentClaim: c.wantClaim, NextOffset: c.wantNext}
	if c.wantToken.Incarnation > c.claim.token.Incarnation {
		want.StaleIncarnation, want.GroupIncarnation = true, c.wantToken.Incarnation
	}
	if c.claim.token.Incarnation > c.wantToken.Incarnation {
		// the claim raised the group's incarnation (raiseIncarnation)
		want.StaleIncarnation, want.GroupIncarnation = false, 0
	}
	if got, wantSup := fe.Superseded(), c.claim.owner == c.wantOwner && c.wantClaim > c.claim.claim; got != wantSup {
		t.Errorf("Superseded() = %v, want %v", got, wantSup)
	}
	if *fe != want {
		t.Errorf("FencedError = %+v\nwant          %+v", *fe, want)
	}
	msg := err.Error()
	for _, s := range []string{c.claim.token.String(), c.wantToken.String(), `"` + c.claim.owner + `"`, `"` + c.wantOwner + `"`, part.String(), "claim"} {
		if !strings.Contains(msg, s) {
			t.Errorf("error %q does not name %s", msg, s)
		}
	}
	if got != (sink.Claimed{}) {
		t.Errorf("rejected claim returned %+v", got)
	}
}

// checkClaimRow checks the row after c's claim, and fence_log: an accepted
// claim adds exactly one entry to logBefore, a rejected one none.
func (e *env) checkClaimRow(t *testing.T, c claimCase, logBefore []logEntry) {
	t.Helper()
	f := e.mustGet(t, part)
	if f.Partition != part || f.Token != c.wantToken || f.Owner != c.wantOwner || f.NextOffset != c.wantNext || f.PartitionCount != c.wantCount {
		t.Errorf("row = {%s %s %q next %d count %d}, want {%s %s %q next %d count %d}",
			f.Partition, f.Token, f.Owner, f.NextOffset, f.PartitionCount,
			part, c.wantToken, c.wantOwner, c.wantNext, c.wantCount)
	}
	wantLog := entries(logBefore)
	if !c.fenced {
		wantLog = append(wantLog, entry{Kind: "claim", Token: c.claim.token, Owner: c.claim.owner, From: c.wantNext, To: c.wantNext})
	}
	if got := entries(e.fenceLog(t, part)); !slices.Equal(got, wantLog) {
		t.Errorf("fence_log = %+v\nwant       %+v", got, wantLog)
	}
}

// Rows are per (group, topic, partition): a high token on one does not
// fence another. (The incarnation is the group's: claims of other
// partitions carry the current one.)
func TestClaimPartitionsAreIndependent(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.mustClaim(t, part, tok(5, 900), "a", 10)
	for _, p := range []sink.Partition{
		{Group: part.Group, Topic: part.Topic, Partition: part.Partition + 1},
		{Group: part.Group, Topic: "other-topic", Partition: part.Partition},
		{Group: "other-group", Topic: part.Topic, Partition: part.Partition},
	} {
		inc := int64(5)
		if p.Group != part.Group {
			inc = 0
		}
		if next := e.mustClaim(t, p, tok(inc, 1), "b", 20); next != 20 {
			t.Errorf("first claim of %s: next offset %d, want 20", p, next)
		}
	}
	if f := e.mustGet(t, part); f.Token != tok(5, 900) || f.Owner != "a" || f.NextOffset != 10 {
		t.Errorf("row of %s changed: %+v", part, f)
	}
	fs, err := e.store.List(e.ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(fs) != 4 {
		t.Errorf("List(\"\") = %d rows, want 4", len(fs))
	}
	fs, err = e.store.List(e.ctx, "other-group")
	if err != nil {
		t.Fatal(err)
	}
	if len(fs) != 1 || fs[0].Group != "other-group" || fs[0].Owner != "b" {
		t.Errorf("List(other-group) = %+v", fs)
	}
}

// Bad requests are refused before the database and leave no row behind.
func TestClaimInvalidRequest(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, c := range []struct {
		name string
		req  sink.ClaimRequest
	}{
		{"no owner", sink.ClaimRequest{Partition: part, Token: tok(0, 1), StartOffset: 0, PartitionCount: 1}},
		{"negative start offset", sink.ClaimRequest{Partition: part, Token: tok(0, 1), Owner: "a", StartOffset: -1, PartitionCount: 1}},
		{"zero partition count", sink.ClaimRequest{Partition: part, Token: tok(0, 1), Owner: "a", StartOffset: 0, PartitionCount: 0}},
		{"negative partition count", sink.ClaimRequest{Partition: part, Token: tok(0, 1), Owner: "a", StartOffset: 0, PartitionCount: -3}},
	} {
		_, err := e.store.Claim(e.ctx, c.req)
		if err == nil {
			t.Errorf("%s: accepted", c.name)
			continue
		}
		if errors.Is(err, sink.ErrFenced) {
			t.Errorf("%s: error %v matches ErrFenced; it is a bad request, not a rejection", c.name, err)
		}
	}
	if _, err := e.store.Get(e.ctx, part); !errors.Is(err, pgx.ErrNoRows) {
		t.Errorf("Get after invalid claims: %v, want pgx.ErrNoRows", err)
	}
	if l := e.fenceLog(t, part); len(l) != 0 {
		t.Errorf("fence_log after invalid claims: %+v", l)
	}
}

// Many claimants race for a partition that has no row yet: the insert path
// of the claim must pick one winner per token, and the highest token ends up
// holding the row.
func TestClaimConcurrentFirstClaims(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const n = 8
	errs := make(chan error, n)
	for i := range n {
		go func() {
			_, err := e.store.Claim(e.ctx, sink.ClaimRequest{Partition: part, Token: tok(0, int32(1+i%4)),
				Owner: string(rune('a' + i)), StartOffset: 42, PartitionCount: 3})
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil && !errors.Is(err, sink.ErrFenced) {
			t.Errorf("claim failed with an error other than ErrFenced: %v", err)
		}
	}
	f := e.mustGet(t, part)
	if f.Token != tok(0, 4) || f.NextOffset != 42 || f.PartitionCount != 3 {
		t.Errorf("row = %+v, want token 0.4, next 42, count 3", f)
	}
	// Tokens in the log never go down, and an equal token never changes hands.
	log := e.fenceLog(t, part)
	if len(log) == 0 {
		t.Fatal("no claim logged")
	}
	for i := 1; i < len(log); i++ {
		if log[i].Token.Less(log[i-1].Token) || (log[i].Token == log[i-1].Token && log[i].Owner != log[i-1].Owner) {
			t.Errorf("claim %+v accepted after %+v", log[i], log[i-1])
		}
	}
	if last := log[len(log)-1]; last.Token != f.Token || last.Owner != f.Owner {
		t.Errorf("last logged claim %+v is not the row's holder %s %q", last, f.Token, f.Owner)
	}
}

// An owner whose session stopped between its fence statement and its
// COMMIT (frozen, or cut off by a network that drops its packets) holds the
// partition's fencing row until Postgres's idle-in-transaction timeout. A
// new owner's claim, confirmed at a higher token, does not wait for it: it
// ends that session (its transaction rolls back; its COMMIT, if it ever
// came, would be fenced). Before, the claim waited out its own timeout and
// the hand-off took as long as the idle timeout.
func TestClaimEndsAnOlderClaimantHoldingTheRow(t *testing.T) {
	t.Parallel()
	e := setup(t)
	p := part
	a, b := sink.Token{Epoch: 1}, sink.Token{Epoch: 2}
	if _, err := e.store.Claim(e.ctx, sink.ClaimRequest{Partition: p, Token: a, Owner: "A", ClaimID: 7, PartitionCount: 1}); err != nil {
		t.Fatal(err)
	}
	// A's batch: the fence statement ran, its COMMIT never comes.
	e.openLaneBatch(t, sink.CommitRequest{Partition: p, Token: a, Owner: "A", ClaimID: 7, From: 0, To: 5})
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	start := time.Now()
	c, err := e.store.Claim(ctx, sink.ClaimRequest{Partition: p, Token: b, Owner: "B", ClaimID: 9, PartitionCount: 1})
	if err != nil {
		t.Fatalf("the claim waited for the older claimant's session: %v", err)
	}
	if c.StaleSessionsEnded != 1 || c.NextOffset != 0 {
		t.Errorf("claim %+v: want the older claimant's session ended and its batch rolled back (next offset 0)", c)
	}
	t.Logf("claimed %s after the older claimant's session was ended", time.Since(start).Round(time.Millisecond))
	// A zombie (lower token) waiting on the new owner's row never ends it.
	tx2 := e.openLaneBatch(t, sink.CommitRequest{Partition: p, Token: b, Owner: "B", ClaimID: 9, From: 0, To: 3})
	zctx, zcancel := context.WithTimeout(e.ctx, 1500*time.Millisecond)
	defer zcancel()
	if _, err := e.store.Claim(zctx, sink.ClaimRequest{Partition: p, Token: a, Owner: "A", ClaimID: 7, PartitionCount: 1}); err == nil {
		t.Fatal("the zombie's claim was accepted")
	}
	if err := tx2.Commit(e.ctx); err != nil {
		t.Fatalf("the new owner's transaction was ended by a zombie's claim: %v", err)
	}
}

// A claim that the claim statement will refuse must not end the session
// that blocks it. The case: a member's older lane (claim id 10), recovering
// at a higher epoch than its newer lane (claim id 11) claimed with, waits
// on the row while the newer lane commits. The claim is refused as
// superseded once the lock is free; ending the newer lane's session first
// would only have cost it its commit.
func TestClaimRefusedLaterEndsNoSession(t *testing.T) {
	t.Parallel()
	e := setup(t)
	p := part
	newer := sink.ClaimRequest{Partition: p, Token: sink.Token{Epoch: 6}, Owner: "M", ClaimID: 11, PartitionCount: 1}
	if _, err := e.store.Claim(e.ctx, newer); err != nil {
		t.Fatal(err)
	}
	// The newer lane's batch: its fence statement ran, its COMMIT follows.
	tx := e.openLaneBatch(t, sink.CommitRequest{Partition: p, Token: newer.Token, Owner: "M", ClaimID: 11, From: 0, To: 5})
	older := sink.ClaimRequest{Partition: p, Token: sink.Token{Epoch: 7}, Owner: "M", ClaimID: 10, PartitionCount: 1}
	done := make(chan claimResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
		defer cancel()
		c, err := e.store.Claim(ctx, older)
		done <- claimResult{c, err}
	}()
	// Several rounds of the claim's watch (every 250ms).
	time.Sleep(1500 * time.Millisecond)
	if err := tx.Commit(e.ctx); err != nil {
		t.Fatalf("the newer lane's commit failed: its session was ended by a claim that is refused anyway: %v", err)
	}
	r := <-done
	var fe *sink.FencedError
	if !errors.As(r.err, &fe) || !fe.Superseded() {
		t.Fatalf("the older lane's claim: %+v, %v; want it refused as superseded", r.c, r.err)
	}
	if r.c.StaleSessionsEnded != 0 {
		t.Errorf("sessions ended: %d", r.c.StaleSessionsEnded)
	}
	f, err := e.store.Get(e.ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if f.ClaimID != 11 || f.NextOffset != 5 {
		t.Errorf("row %+v: want the newer lane's claim 11 at next offset 5", f)
	}
}
