package sink_test

import (
	"slices"
	"testing"

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
