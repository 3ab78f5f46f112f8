package sink_test

import (
	"slices"
	"testing"
	"time"

	"github.com/tenure-dev/tenure/sink"
)

// Every accepted claim and commit is in fence_log exactly once, in order,
// with its kind, token, owner and range; rejected ones are not.
func TestFenceLogRecordsAcceptedOnly(t *testing.T) {
	t.Parallel()
	e := setup(t)
	other := sink.Partition{Group: part.Group, Topic: part.Topic, Partition: 1}
	type op struct {
		claim    bool
		p        sink.Partition
		token    sink.Token
		owner    string
		from, to int64 // commit; for a claim, from is StartOffset
		accept   bool
	}
	ops := []op{
		{claim: true, p: part, token: tok(0, 3), owner: "a", from: 100, accept: true},
		{claim: true, p: part, token: tok(0, 2), owner: "b", accept: false},         // lower token
		{claim: true, p: part, token: tok(0, 3), owner: "b", accept: false},         // same token, other owner
		{claim: true, p: part, token: tok(0, 3), owner: "a", from: 7, accept: true}, // retried claim
		{p: part, token: tok(0, 3), owner: "a", from: 100, to: 104, accept: true},
		{p: part, token: tok(0, 3), owner: "a", from: 100, to: 104, accept: false}, // offset mismatch
		{p: part, token: tok(0, 3), owner: "b", from: 104, to: 106, accept: false}, // other owner
		{claim: true, p: other, token: tok(0, 1), owner: "z", from: 0, accept: true},
		{p: other, token: tok(0, 1), owner: "z", from: 0, to: 1, accept: true},
		{claim: true, p: part, token: tok(0, 4), owner: "b", accept: true},
		{p: part, token: tok(0, 3), owner: "a", from: 104, to: 106, accept: false}, // fenced by b's claim
		{p: part, token: tok(0, 4), owner: "b", from: 104, to: 110, accept: true},
		{claim: true, p: part, token: tok(1, 1), owner: "c", accept: true},
		{claim: true, p: part, token: tok(0, 99), owner: "b", accept: false}, // lower incarnation
		{p: part, token: tok(0, 4), owner: "b", from: 110, to: 111, accept: false},
		{p: part, token: tok(1, 1), owner: "c", from: 110, to: 111, accept: true},
	}
	var want []entry
	next := map[sink.Partition]int64{}
	for i, o := range ops {
		var err error
		if o.claim {
			var c sink.Claimed
			c, err = e.claim(o.p, o.token, o.owner, o.from)
			if err == nil {
				want = append(want, entry{Kind: "claim", Token: o.token, Owner: o.owner, From: c.NextOffset, To: c.NextOffset})
				next[o.p] = c.NextOffset
			}
		} else {
			err = e.commit(t, sink.CommitRequest{Partition: o.p, Token: o.token, Owner: o.owner, From: o.from, To: o.to})
			if err == nil {
				want = append(want, entry{Kind: "commit", Token: o.token, Owner: o.owner, From: o.from, To: o.to})
				next[o.p] = o.to
			}
		}
		if (err == nil) != o.accept {
			t.Fatalf("op %d %+v: err = %v, want accepted = %v", i, o, err, o.accept)
		}
		if err != nil {
			asFenced(t, err)
		}
	}
	var wantPart []entry
	for _, w := range want {
		if w.Owner == "z" { // the other partition
			continue
		}
		wantPart = append(wantPart, w)
	}
	if got := entries(e.fenceLog(t, part)); !slices.Equal(got, wantPart) {
		t.Errorf("fence_log of %s:\n got %+v\nwant %+v", part, got, wantPart)
	}
	wantOther := []entry{
		{Kind: "claim", Token: tok(0, 1), Owner: "z", From: 0, To: 0},
		{Kind: "commit", Token: tok(0, 1), Owner: "z", From: 0, To: 1},
	}
	if got := entries(e.fenceLog(t, other)); !slices.Equal(got, wantOther) {
		t.Errorf("fence_log of %s:\n got %+v\nwant %+v", other, got, wantOther)
	}
	// The log and the state agree.
	for p, n := range next {
		if f := e.mustGet(t, p); f.NextOffset != n {
			t.Errorf("%s: row next offset %d, log says %d", p, f.NextOffset, n)
		}
	}
	var total int
	if err := e.pool.QueryRow(e.ctx, `SELECT count(*) FROM `+e.q()+`.fence_log`).Scan(&total); err != nil {
		t.Fatal(err)
	}
	if total != len(want) {
		t.Errorf("fence_log has %d rows, want %d", total, len(want))
	}
	e.checkEffectsExactlyOnce(t, part, 100, 111)
}

// Pruning trims the front of a partition's fence log and leaves a history
// that can still be checked: the claim that held the partition at the cut,
// then every later entry in order, with the cut recorded (where the log
// resumes, the highest token removed). The latest claim is never removed.
func TestPruneFenceLogKeepsTheHolderAndTheTail(t *testing.T) {
	t.Parallel()
	e := setup(t)
	other := sink.Partition{Group: part.Group, Topic: part.Topic, Partition: 1}
	next := int64(0)
	run := func(tk sink.Token, owner string, commits int) {
		next = e.mustClaim(t, part, tk, owner, next)
		for range commits {
			e.mustCommit(t, sink.CommitRequest{Partition: part, Token: tk, Owner: owner, From: next, To: next + 1})
			next++
		}
	}
	run(tok(0, 1), "a", 10) // ids 1-11
	run(tok(0, 2), "b", 10) // 12-22
	run(tok(0, 3), "c", 4)  // 23-27
	e.mustClaim(t, other, tok(0, 1), "z", 0)
	for i := range int64(3) {
		e.mustCommit(t, sink.CommitRequest{Partition: other, Token: tok(0, 1), Owner: "z", From: i, To: i + 1})
	}
	full := e.fenceLog(t, part)
	if len(full) != 27 {
		t.Fatalf("%d entries, want 27", len(full))
	}

	if n, err := e.store.PruneFenceLog(e.ctx, part, sink.FenceLogRetention{}); n != 0 || err != nil {
		t.Fatalf("no retention pruned %d, %v", n, err)
	}
	keep8 := sink.FenceLogRetention{MaxEntries: 8}
	n, err := e.store.PruneFenceLog(e.ctx, part, keep8)
	if err != nil || n != 18 {
		t.Fatalf("pruned %d, %v; want 18", n, err)
	}
	got := e.fenceLog(t, part)
	want := append([]logEntry{full[11]}, full[19:]...) // b's claim, then the newest 8
	if !slices.Equal(got, want) {
		t.Fatalf("left:\n got %+v\nwant %+v", got, want)
	}
	cuts, err := e.store.FenceLogCuts(e.ctx, part.Group)
	if err != nil || len(cuts) != 1 {
		t.Fatalf("cuts %+v, %v", cuts, err)
	}
	c := cuts[0]
	if c.Partition != part || c.ThroughID != full[18].ID || c.KeptClaimID != full[11].ID || c.NextOffset != full[18].To ||
		c.MaxToken != tok(0, 2) || c.Pruned != 18 {
		t.Errorf("cut %+v", c)
	}
	checkPruned(t, got, c, e.mustGet(t, part).NextOffset)

	// Again with nothing new: nothing to do.
	if n, err := e.store.PruneFenceLog(e.ctx, part, keep8); n != 0 || err != nil {
		t.Fatalf("second pass pruned %d, %v", n, err)
	}
	// c commits on; the claim that holds at the new cut is c's, and b's goes.
	for range 5 {
		e.mustCommit(t, sink.CommitRequest{Partition: part, Token: tok(0, 3), Owner: "c", From: next, To: next + 1})
		next++
	}
	all := e.fenceLog(t, part)
	if n, err := e.store.PruneFenceLog(e.ctx, part, keep8); err != nil || n != 5 {
		t.Fatalf("third pass pruned %d, %v; want 5 (b's claim and 4 commits)", n, err)
	}
	got = e.fenceLog(t, part)
	if got[0].Kind != "claim" || got[0].Owner != "c" || len(got) != 9 || got[1].ID != all[len(all)-8].ID {
		t.Fatalf("left %+v", got)
	}
	cuts, _ = e.store.FenceLogCuts(e.ctx, part.Group)
	if cuts[0].MaxToken != tok(0, 3) || cuts[0].Pruned != 23 || cuts[0].KeptClaimID != got[0].ID {
		t.Errorf("cut %+v", cuts[0])
	}
	checkPruned(t, got, cuts[0], next)

	// By age: entries older than MaxAge go, the claim stays; the other
	// partition (no older entries) is untouched.
	if _, err := e.pool.Exec(e.ctx, `UPDATE `+e.q()+`.fence_log SET at = at - interval '2 hours' WHERE partition = 1`); err != nil {
		t.Fatal(err)
	}
	removed, parts, err := e.store.PruneFenceLogs(e.ctx, part.Group, sink.FenceLogRetention{MaxAge: time.Hour})
	if err != nil || removed != 3 || parts != 1 {
		t.Fatalf("PruneFenceLogs by age: %d entries of %d partitions, %v; want 3 of 1", removed, parts, err)
	}
	if left := entries(e.fenceLog(t, other)); !slices.Equal(left, []entry{{Kind: "claim", Token: tok(0, 1), Owner: "z"}}) {
		t.Errorf("left of %s: %+v", other, left)
	}
	cuts, _ = e.store.FenceLogCuts(e.ctx, "")
	if len(cuts) != 2 || cuts[1].Partition != other || cuts[1].NextOffset != 3 {
		t.Errorf("cuts %+v", cuts)
	}
	checkPruned(t, e.fenceLog(t, other), cuts[1], 3)
	if n := len(e.fenceLog(t, part)); n != 9 {
		t.Errorf("pruning by age touched %s: %d entries left, want 9", part, n)
	}
}

// checkPruned reads a pruned log the way the history checker must: the
// entries at or below the cut are only the kept claim (the holder); the rest
// starts at the cut's next offset, carries no token below the cut's highest,
// chains without gap or overlap up to the fencing row's next offset, and
// every commit is the holder's.
func checkPruned(t *testing.T, log []logEntry, c sink.FenceLogCut, final int64) {
	t.Helper()
	var holder *logEntry
	next, floor := c.NextOffset, c.MaxToken
	for i, l := range log {
		if l.ID <= c.ThroughID {
			if l.ID != c.KeptClaimID || l.Kind != "claim" {
				t.Errorf("entry #%d at or below the cut is not the kept claim", l.ID)
			}
			holder = &log[i]
			continue
		}
		if l.Token.Less(floor) {
			t.Errorf("entry #%d has token %s below the cut's %s", l.ID, l.Token, floor)
		}
		if l.From != next {
			t.Errorf("entry #%d starts at %d, the log had reached %d", l.ID, l.From, next)
		}
		switch l.Kind {
		case "claim":
			holder = &log[i]
			floor = l.Token
		case "commit":
			if holder == nil || holder.Token != l.Token || holder.Owner != l.Owner {
				t.Errorf("commit #%d by %s/%s is not the holder's (%+v)", l.ID, l.Owner, l.Token, holder)
			}
		}
		next = l.To
	}
	if next != final {
		t.Errorf("the pruned log ends at %d, the fencing row says %d", next, final)
	}
}
