package sink_test

import (
	"errors"
	"math"
	"testing"

	"github.com/tenure-dev/tenure/internal/fence"
	"github.com/tenure-dev/tenure/sink"
)

func TestIncarnationOfUnknownGroupIsZero(t *testing.T) {
	t.Parallel()
	e := setup(t)
	inc, err := e.store.Incarnation(e.ctx, "never-reset")
	if err != nil || inc != 0 {
		t.Fatalf("Incarnation of a group without a reset = %d, %v; want 0, nil", inc, err)
	}
}

// BumpIncarnation is a compare-and-set: it moves the group from `from` to
// from+1 only while the group is still at `from`, and otherwise reports the
// current value without changing anything.
func TestBumpIncarnationCompareAndSet(t *testing.T) {
	t.Parallel()
	e := setup(t)
	bump := func(group string, from int64) (int64, bool) {
		t.Helper()
		now, moved, err := e.store.BumpIncarnation(e.ctx, group, from, "member-"+group, "test")
		if err != nil {
			t.Fatalf("BumpIncarnation(%s, from %d): %v", group, from, err)
		}
		return now, moved
	}
	current := func(group string) int64 {
		t.Helper()
		inc, err := e.store.Incarnation(e.ctx, group)
		if err != nil {
			t.Fatal(err)
		}
		return inc
	}

	// The first bump of a group inserts its row at 1.
	if now, moved := bump("g", 0); now != 1 || !moved {
		t.Fatalf("first bump from 0 = %d, %v; want 1, true", now, moved)
	}
	if inc := current("g"); inc != 1 {
		t.Fatalf("Incarnation after the first bump = %d, want 1", inc)
	}
	var by, reason string
	if err := e.pool.QueryRow(e.ctx, `SELECT bumped_by, reason FROM `+e.q()+`.group_incarnations WHERE consumer_group = 'g'`).
		Scan(&by, &reason); err != nil || by != "member-g" || reason != "test" {
		t.Fatalf("group_incarnations row: by %q, reason %q, %v", by, reason, err)
	}

	// A stale `from` (someone bumped already) changes nothing and returns
	// the current value, so the caller can claim with it.
	if now, moved := bump("g", 0); now != 1 || moved {
		t.Fatalf("stale bump from 0 = %d, %v; want 1, false", now, moved)
	}
	// A `from` from the future changes nothing either.
	if now, moved := bump("g", 7); now != 1 || moved {
		t.Fatalf("bump from 7 while at 1 = %d, %v; want 1, false", now, moved)
	}
	if now, moved := bump("g", 1); now != 2 || !moved {
		t.Fatalf("bump from 1 = %d, %v; want 2, true", now, moved)
	}
	if inc := current("g"); inc != 2 {
		t.Fatalf("Incarnation = %d, want 2", inc)
	}

	// Groups are independent.
	if inc := current("other"); inc != 0 {
		t.Fatalf("another group's incarnation moved to %d", inc)
	}
	if now, moved := bump("other", 0); now != 1 || !moved {
		t.Fatalf("first bump of another group = %d, %v", now, moved)
	}
	if inc := current("g"); inc != 2 {
		t.Fatalf("bumping another group moved g to %d", inc)
	}
}

// Many claimants that saw the same incarnation bump at once: exactly one
// moves it, and all of them learn the same new value.
func TestBumpIncarnationConcurrent(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const n = 12
	for from := int64(0); from < 3; from++ {
		nows := make([]int64, n)
		moved := make([]bool, n)
		errs := make([]error, n)
		atOnce(n, func(i int) {
			nows[i], moved[i], errs[i] = e.store.BumpIncarnation(e.ctx, "g", from, "member", "race")
		})
		winners := 0
		for i := range n {
			if errs[i] != nil {
				t.Fatalf("bump %d from %d: %v", i, from, errs[i])
			}
			if nows[i] != from+1 {
				t.Errorf("bump %d from %d returned %d, want %d", i, from, nows[i], from+1)
			}
			if moved[i] {
				winners++
			}
		}
		if winners != 1 {
			t.Fatalf("%d concurrent bumps from %d moved the incarnation %d times, want exactly once", n, from, winners)
		}
	}
	if inc, err := e.store.Incarnation(e.ctx, "g"); err != nil || inc != 3 {
		t.Fatalf("Incarnation after three rounds = %d, %v; want 3", inc, err)
	}
}

// The incarnation leads the token: a claim with a higher incarnation beats
// any epoch of a lower one, however high, and from then on every token of
// the lower incarnation is fenced, claims and commits alike.
func TestClaimHigherIncarnationBeatsAnyEpoch(t *testing.T) {
	t.Parallel()
	for _, oldEpoch := range []int32{1, 82, math.MaxInt32} {
		e := setup(t)
		p := sink.Partition{Group: "g", Topic: "t", Partition: 3}
		next := e.mustClaim(t, p, tok(0, oldEpoch), "zombie", 10)
		e.mustCommit(t, sink.CommitRequest{Partition: p, Token: tok(0, oldEpoch), Owner: "zombie", From: next, To: next + 5})

		// The group restarted: epochs begin again at 1, under incarnation 1.
		inc, moved, err := e.store.BumpIncarnation(e.ctx, p.Group, 0, "fresh", "epochs restarted")
		if err != nil || !moved || inc != 1 {
			t.Fatalf("bump: %d, %v, %v", inc, moved, err)
		}
		if got := e.mustClaim(t, p, tok(inc, 1), "fresh", 0); got != 15 {
			t.Fatalf("the fresh owner resumes at %d, want 15 (the zombie's last commit)", got)
		}

		// The zombie's old token loses, whatever its epoch.
		asFenced(t, e.commit(t, sink.CommitRequest{Partition: p, Token: tok(0, oldEpoch), Owner: "zombie", From: 15, To: 16}))
		if _, err := e.claim(p, tok(0, oldEpoch), "zombie", 0); err == nil {
			t.Fatalf("a claim at 0.%d was accepted after 1.1", oldEpoch)
		} else if fe := asFenced(t, err); fe.Current != tok(1, 1) || fe.CurrentOwner != "fresh" {
			t.Fatalf("rejection names %s by %q, want 1.1 by fresh", fe.Current, fe.CurrentOwner)
		}
		if _, err := e.claim(p, tok(0, math.MaxInt32), "other", 0); err == nil {
			t.Fatalf("a claim at 0.%d was accepted after 1.1", int32(math.MaxInt32))
		}
		e.mustCommit(t, sink.CommitRequest{Partition: p, Token: tok(1, 1), Owner: "fresh", From: 15, To: 20})
		e.checkEffectsExactlyOnce(t, p, 10, 20)
		if f := e.mustGet(t, p); f.Token != tok(1, 1) || f.Owner != "fresh" || f.NextOffset != 20 {
			t.Fatalf("fence row %+v", f)
		}
	}
}

// Register raises the incarnation's high epoch and returns it with the
// incarnation; a bump starts the next incarnation's high epoch at 0.
func TestRegisterHighEpoch(t *testing.T) {
	t.Parallel()
	e := setup(t)
	reg := func(epoch int32) fence.Registration {
		t.Helper()
		r, err := e.store.Register(e.ctx, "g", epoch, "m")
		if err != nil {
			t.Fatalf("Register(%d): %v", epoch, err)
		}
		return r
	}
	for _, c := range []struct {
		epoch int32
		want  fence.Registration
	}{{3, fence.Registration{Incarnation: 0, HighEpoch: 3}}, {1, fence.Registration{Incarnation: 0, HighEpoch: 3}}, {5, fence.Registration{Incarnation: 0, HighEpoch: 5}}, {5, fence.Registration{Incarnation: 0, HighEpoch: 5}}} {
		if got := reg(c.epoch); got != c.want {
			t.Fatalf("Register(%d) = %+v, want %+v", c.epoch, got, c.want)
		}
	}
	if inc, moved, err := e.store.BumpIncarnation(e.ctx, "g", 0, "m", "test"); err != nil || !moved || inc != 1 {
		t.Fatalf("bump: %d %v %v", inc, moved, err)
	}
	if got := reg(2); got != (fence.Registration{Incarnation: 1, HighEpoch: 2}) {
		t.Fatalf("Register(2) after the bump = %+v, want {1 2}", got)
	}
	if got, err := e.store.Register(e.ctx, "other", 1, "m"); err != nil || got != (fence.Registration{Incarnation: 0, HighEpoch: 1}) {
		t.Fatalf("another group's registration = %+v, %v", got, err)
	}
	if _, err := e.store.Register(e.ctx, "g", -1, "m"); err == nil {
		t.Fatal("a negative epoch was registered")
	}

	// Concurrent registrations end at the highest, each seeing at least its own.
	atOnce(16, func(i int) {
		r, err := e.store.Register(e.ctx, "race", int32(10+i), "m")
		if err != nil || r.HighEpoch < int32(10+i) {
			t.Errorf("Register(%d) = %+v, %v", 10+i, r, err)
		}
	})
	if r := func() fence.Registration { r, _ := e.store.Register(e.ctx, "race", 0, "m"); return r }(); r.HighEpoch != 25 {
		t.Fatalf("high epoch after concurrent registrations = %d, want 25", r.HighEpoch)
	}
}

// The second path of a group reset: once the group's incarnation has moved on, a claim
// carrying an older one is rejected even where no fencing row exists, so a
// zombie from before the reset cannot insert one with its high old epoch.
func TestClaimNeedsCurrentIncarnation(t *testing.T) {
	t.Parallel()
	e := setup(t)
	p := sink.Partition{Group: "g", Topic: "t", Partition: 7}
	if _, _, err := e.store.BumpIncarnation(e.ctx, "g", 0, "fresh", "epochs restarted"); err != nil {
		t.Fatal(err)
	}
	_, err := e.store.Claim(e.ctx, sink.ClaimRequest{Partition: p, Token: tok(0, math.MaxInt32), Owner: "zombie", PartitionCount: 12})
	fe := asFenced(t, err)
	if !fe.StaleIncarnation || fe.GroupIncarnation != 1 || fe.Found {
		t.Fatalf("rejection %+v: want a stale incarnation (group at 1), no row", *fe)
	}
	if _, err := e.store.Get(e.ctx, p); err == nil {
		t.Fatal("the rejected claim left a fencing row")
	}
	if len(e.fenceLog(t, p)) != 0 {
		t.Fatal("the rejected claim is in the fence log")
	}
	e.mustClaim(t, p, tok(1, 1), "fresh", 0)
}

// Two claimants at the very same token: the second is a tie and is
// rejected, even with the same member id (another lane); the first may
// retry its claim; commits must carry the claim id that holds the row.
func TestClaimTieAndClaimID(t *testing.T) {
	t.Parallel()
	e := setup(t)
	claim := func(owner string, id int64) error {
		_, err := e.store.Claim(e.ctx, sink.ClaimRequest{Partition: part, Token: tok(0, 5), Owner: owner, ClaimID: id, PartitionCount: 12})
		return err
	}
	if err := claim("m", 1); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		owner string
		id    int64
	}{{"m", 2}, {"other", 1}} {
		fe := asFenced(t, claim(c.owner, c.id))
		if !fe.Tie() || fe.CurrentClaim != 1 {
			t.Fatalf("claim by %s/%d: %+v, want a tie with claim 1", c.owner, c.id, *fe)
		}
	}
	if err := claim("m", 1); err != nil {
		t.Fatalf("a retried claim by the same claimant: %v", err)
	}
	err := e.commit(t, sink.CommitRequest{Partition: part, Token: tok(0, 5), Owner: "m", ClaimID: 2, From: 0, To: 3})
	if fe := asFenced(t, err); errors.Is(err, sink.ErrOffsetMismatch) || fe.CurrentClaim != 1 {
		t.Fatalf("commit by another lane of the same member: %v", err)
	}
	e.mustCommit(t, sink.CommitRequest{Partition: part, Token: tok(0, 5), Owner: "m", ClaimID: 1, From: 0, To: 3})
	if f := e.mustGet(t, part); f.ClaimID != 1 || f.NextOffset != 3 {
		t.Fatalf("fence row %+v", f)
	}
}
