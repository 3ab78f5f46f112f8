package sink_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tenure-dev/tenure/internal/history"
	"github.com/tenure-dev/tenure/sink"
)

// An operator's reset goes through the fence: it moves the stored offset,
// starts a new log epoch and records a 'reset' entry by the operator with
// the holder's token and claim id. A batch begun before it is rejected, both
// when its range starts at the old offset and when it happens to start at
// the new one; the holder claims again (same claim) and goes on from the new
// offset, and the history checker accepts the result.
func TestResetOffsetGoesThroughTheFence(t *testing.T) {
	t.Parallel()
	e := setup(t)
	p := part
	tk := tok(0, 3)
	claim := sink.ClaimRequest{Partition: p, Token: tk, Owner: "a", ClaimID: 7, PartitionCount: 1}
	c, err := e.store.Claim(e.ctx, claim)
	if err != nil {
		t.Fatal(err)
	}
	e.mustCommit(t, sink.CommitRequest{Partition: p, Token: tk, Owner: "a", ClaimID: 7, From: c.NextOffset, To: 20})

	r, err := e.store.ResetOffset(e.ctx, sink.ResetRequest{Partition: p, To: 5, LogStart: 0, LogEnd: 30, By: "ops@example"})
	if err != nil {
		t.Fatal(err)
	}
	if !r.Moved() || r.From != 20 || r.To != 5 || r.LogEpoch != 1 || r.Token != tk || r.Holder != "a" || r.ClaimID != 7 || r.At.IsZero() {
		t.Fatalf("reset: %+v", r)
	}
	f := e.mustGet(t, p)
	if f.NextOffset != 5 || f.LogEpoch != 1 || f.Token != tk || f.Owner != "a" || f.ClaimID != 7 {
		t.Fatalf("fencing row after the reset: %+v", f)
	}
	log := e.fenceLog(t, p)
	last := log[len(log)-1]
	if last.ID != r.EntryID || last.entry() != (entry{Kind: "reset", Token: tk, Owner: "ops@example", From: 20, To: 5}) {
		t.Fatalf("last fence log entry %+v, want the reset #%d", last, r.EntryID)
	}

	// The holder's batch in flight, from the old offset: rejected.
	err = e.commit(t, sink.CommitRequest{Partition: p, Token: tk, Owner: "a", ClaimID: 7, From: 20, To: 25, LogEpoch: 0})
	if !errors.Is(err, sink.ErrOffsetMismatch) {
		t.Fatalf("a batch from the old offset: %v, want an offset mismatch", err)
	}
	// A batch of the old log epoch that happens to start at the new offset:
	// rejected by the log epoch alone.
	err = e.commit(t, sink.CommitRequest{Partition: p, Token: tk, Owner: "a", ClaimID: 7, From: 5, To: 8, LogEpoch: 0})
	if !errors.Is(err, sink.ErrOffsetMismatch) || !strings.Contains(err.Error(), "offset reset") {
		t.Fatalf("a batch of the old log epoch from the new offset: %v, want a rejection naming the new log epoch", err)
	}
	// The lane claims again (same claim), learns the epoch and goes on.
	c, err = e.store.Claim(e.ctx, claim)
	if err != nil || c.NextOffset != 5 || c.LogEpoch != 1 {
		t.Fatalf("claim again: %+v %v", c, err)
	}
	e.mustCommit(t, sink.CommitRequest{Partition: p, Token: tk, Owner: "a", ClaimID: 7, From: 5, To: 22, LogEpoch: 1})

	// A shift forward, from wherever the offset is when it runs.
	r, err = e.store.ResetOffset(e.ctx, sink.ResetRequest{Partition: p, To: 3, Shift: true, LogStart: 0, LogEnd: 30, By: "ops@example"})
	if err != nil || r.From != 22 || r.To != 25 || r.LogEpoch != 2 {
		t.Fatalf("shift by 3: %+v %v", r, err)
	}
	if c, err = e.store.Claim(e.ctx, claim); err != nil || c.NextOffset != 25 || c.LogEpoch != 2 {
		t.Fatalf("claim again: %+v %v", c, err)
	}
	e.mustCommit(t, sink.CommitRequest{Partition: p, Token: tk, Owner: "a", ClaimID: 7, From: 25, To: 30, LogEpoch: 2})

	// Offsets 5-19 ran twice, 22-24 never: exactly what the resets say.
	got := map[int64]int{}
	for _, o := range e.effects(t, p) {
		got[o]++
	}
	for o := int64(0); o < 30; o++ {
		want := 1
		switch {
		case o >= 5 && o < 20:
			want = 2
		case o >= 22 && o < 25:
			want = 0
		}
		if got[o] != want {
			t.Errorf("offset %d has %d effects, want %d", o, got[o], want)
		}
	}
	var hlog []history.Entry
	for _, l := range e.fenceLog(t, p) {
		hlog = append(hlog, history.Entry{ID: l.ID, Kind: l.Kind, Partition: p, Token: l.Token, Owner: l.Owner, From: l.From, To: l.To})
	}
	if vs := history.CheckLog(hlog, []sink.Fence{e.mustGet(t, p)}); len(vs) != 0 {
		t.Fatalf("the checker refuses the resets' history: %v", vs)
	}
}

// What a reset refuses changes nothing: a partition with no fencing row, a
// target outside the log (absolute or shifted), a row of another log of
// the same topic name. A target equal to the stored offset moves nothing
// and records nothing.
func TestResetOffsetRefusals(t *testing.T) {
	t.Parallel()
	e := setup(t)
	p := part
	tk := tok(0, 1)
	id := [16]byte{1, 2, 3}
	if _, err := e.store.Claim(e.ctx, sink.ClaimRequest{Partition: p, Token: tk, Owner: "a", PartitionCount: 1, StartOffset: 10, TopicID: id}); err != nil {
		t.Fatal(err)
	}
	before := len(e.fenceLog(t, p))

	_, err := e.store.ResetOffset(e.ctx, sink.ResetRequest{Partition: sink.Partition{Group: "g", Topic: "t", Partition: 1}, To: 0, LogEnd: 5, By: "ops"})
	if !errors.Is(err, sink.ErrNoFencingRow) {
		t.Errorf("a partition without a fencing row: %v", err)
	}
	for _, req := range []sink.ResetRequest{
		{Partition: p, To: 31, LogStart: 5, LogEnd: 30, By: "ops"},
		{Partition: p, To: 4, LogStart: 5, LogEnd: 30, By: "ops"},
		{Partition: p, To: -6, Shift: true, LogStart: 5, LogEnd: 30, By: "ops"},
		{Partition: p, To: 21, Shift: true, LogStart: 5, LogEnd: 30, By: "ops"},
	} {
		_, err := e.store.ResetOffset(e.ctx, req)
		var oe *sink.ResetOutOfLogError
		if !errors.As(err, &oe) || oe.From != 10 || !strings.Contains(err.Error(), "outside the log of g/t/0, which holds offsets 5 to 29") {
			t.Errorf("%+v: %v, want a refusal naming the log", req, err)
		}
	}
	_, err = e.store.ResetOffset(e.ctx, sink.ResetRequest{Partition: p, To: 12, LogStart: 0, LogEnd: 30, TopicID: [16]byte{9}, By: "ops"})
	var ol *sink.ResetOtherLogError
	if !errors.As(err, &ol) || ol.Stored != id {
		t.Errorf("another log of the topic: %v", err)
	}
	r, err := e.store.ResetOffset(e.ctx, sink.ResetRequest{Partition: p, To: 10, LogStart: 0, LogEnd: 30, TopicID: id, By: "ops"})
	if err != nil || r.Moved() || r.From != 10 || r.To != 10 || r.LogEpoch != 0 {
		t.Errorf("a reset to the stored offset: %+v %v, want nothing moved", r, err)
	}
	if f := e.mustGet(t, p); f.NextOffset != 10 || f.LogEpoch != 0 {
		t.Errorf("a refused reset changed the row: %+v", f)
	}
	if n := len(e.fenceLog(t, p)); n != before {
		t.Errorf("a refused reset left %d fence log entries", n-before)
	}
	if _, err := e.store.ResetOffset(e.ctx, sink.ResetRequest{Partition: p, To: 12, LogEnd: 30}); err == nil {
		t.Error("a reset without an operator was accepted")
	}
}

// A reset waits for a commit that holds the fencing row's lock and moves
// the offset from where that commit left it; a row locked for longer than
// the reset's lock timeout (a worker frozen inside its commit) is an error,
// not a hang.
func TestResetOffsetSerialisesWithCommits(t *testing.T) {
	t.Parallel()
	e := setup(t)
	p := part
	tk := tok(0, 1)
	from := e.mustClaim(t, p, tk, "a", 0)
	tx, err := e.pool.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(e.ctx) }()
	if err := e.store.Commit(e.ctx, tx, sink.CommitRequest{Partition: p, Token: tk, Owner: "a", From: from, To: 8}); err != nil {
		t.Fatal(err)
	}
	done := make(chan sink.Reset, 1)
	fail := make(chan error, 1)
	go func() {
		r, err := e.store.ResetOffset(e.ctx, sink.ResetRequest{Partition: p, To: 2, LogEnd: 20, By: "ops"})
		if err != nil {
			fail <- err
			return
		}
		done <- r
	}()
	select {
	case r := <-done:
		t.Fatalf("the reset did not wait for the commit holding the row: %+v", r)
	case err := <-fail:
		t.Fatal(err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := tx.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.From != 8 || r.To != 2 {
			t.Fatalf("reset after the commit: %+v, want from 8 to 2", r)
		}
	case err := <-fail:
		t.Fatal(err)
	case <-time.After(10 * time.Second):
		t.Fatal("the reset did not finish after the commit")
	}

	// A row locked for good.
	tx, err = e.pool.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(e.ctx) }()
	if _, err := tx.Exec(e.ctx, `SELECT 1 FROM `+e.q()+`.fences WHERE consumer_group = 'g' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = e.store.ResetOffset(e.ctx, sink.ResetRequest{Partition: p, To: 5, LogEnd: 20, By: "ops"})
	if err == nil || !strings.Contains(err.Error(), "stayed locked") || time.Since(start) > 15*time.Second {
		t.Fatalf("a reset of a row locked for good: %v after %s", err, time.Since(start))
	}
}

// FenceLogAt says what the fence log knows of one job: the commits that
// covered it (twice after a reset back over it), the resets that passed
// over it, and the first claim; DeadLetterAt and DeadLettersIn find the
// dead letters of a job and of a range.
func TestFenceLogAtAndDeadLetters(t *testing.T) {
	t.Parallel()
	e := setup(t)
	p := part
	tk := tok(0, 2)
	from := e.mustClaim(t, p, tk, "a", 3)
	e.mustCommit(t, sink.CommitRequest{Partition: p, Token: tk, Owner: "a", From: from, To: 10})
	r, err := e.store.ResetOffset(e.ctx, sink.ResetRequest{Partition: p, To: 6, LogEnd: 30, By: "ops"})
	if err != nil {
		t.Fatal(err)
	}
	e.mustClaim(t, p, tk, "a", 0)
	e.mustCommit(t, sink.CommitRequest{Partition: p, Token: tk, Owner: "a", From: 6, To: 12, LogEpoch: 1})
	skip, err := e.store.ResetOffset(e.ctx, sink.ResetRequest{Partition: p, To: 20, LogEnd: 30, By: "ops2"})
	if err != nil {
		t.Fatal(err)
	}

	jl, err := e.store.FenceLogAt(e.ctx, p, 7)
	if err != nil {
		t.Fatal(err)
	}
	if len(jl.Commits) != 2 || jl.Commits[0].From != 3 || jl.Commits[1].From != 6 || len(jl.Resets) != 1 || jl.Resets[0].ID != r.EntryID ||
		jl.FirstClaim == nil || jl.FirstClaim.From != 3 || jl.Cut != nil {
		t.Fatalf("offset 7: %+v", jl)
	}
	jl, err = e.store.FenceLogAt(e.ctx, p, 15)
	if err != nil || len(jl.Commits) != 0 || len(jl.Resets) != 1 || jl.Resets[0].ID != skip.EntryID || jl.Resets[0].Owner != "ops2" {
		t.Fatalf("offset 15: %+v %v", jl, err)
	}
	jl, err = e.store.FenceLogAt(e.ctx, p, 1)
	if err != nil || len(jl.Commits) != 0 || len(jl.Resets) != 0 || jl.FirstClaim == nil {
		t.Fatalf("offset 1: %+v %v", jl, err)
	}

	if _, err := e.store.DeadLetterAt(e.ctx, p, 4); !errors.Is(err, sink.ErrNoDeadLetter) {
		t.Fatalf("no dead letter: %v", err)
	}
	tx, err := e.pool.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.store.AddDeadLetter(e.ctx, tx, sink.DeadLetter{Partition: p, Offset: 4, Key: []byte("k"), Error: "bad", Attempts: 1, Token: tk, Owner: "a"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	if d, err := e.store.DeadLetterAt(e.ctx, p, 4); err != nil || d.Offset != 4 || d.Error != "bad" {
		t.Fatalf("dead letter at 4: %+v %v", d, err)
	}
	for _, c := range []struct {
		from, to, want int64
	}{{0, 4, 0}, {4, 5, 1}, {0, 10, 1}, {5, 10, 0}} {
		if n, err := e.store.DeadLettersIn(e.ctx, p, c.from, c.to); err != nil || n != c.want {
			t.Errorf("dead letters in [%d,%d): %d %v, want %d", c.from, c.to, n, err, c.want)
		}
	}
}
