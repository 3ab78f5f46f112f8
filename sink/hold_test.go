package sink_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/tenure-dev/tenure/sink"
)

// A log that lost processed records and then grew again: the broker lost
// offsets 36 and 37 (the stored next offset is 38, the worker found the log
// ending at 36), and by the time an operator acknowledges, new jobs fill
// offsets 36 to 59. They were never processed: the acknowledgement moves
// the offset down to 36, not to min(38, 60), which would skip 36 and 37.
func TestAcknowledgeAheadOfLogAfterTheLogGrewAgain(t *testing.T) {
	t.Parallel()
	e, p, tk := setupCommitted(t, 38)
	e.mustHold(t, aheadOfLog(p, tk, 38, 36))
	h, err := e.store.AcknowledgeHold(e.ctx, p, "ops", 0, 60, [16]byte{})
	if err != nil {
		t.Fatal(err)
	}
	if got := e.mustGet(t, p).NextOffset; got != 36 {
		t.Errorf("next offset %d after the acknowledgement, want 36 (the log's end when the worker held it): jobs appended since would be skipped", got)
	}
	if !strings.Contains(h.Resolution, "from 38 to 36") {
		t.Errorf("resolution %q", h.Resolution)
	}

	// A log that is shorter still when acknowledged: down to its end now.
	p.Partition = 1
	e.claimAndCommit(t, p, tk, 38)
	e.mustHold(t, aheadOfLog(p, tk, 38, 36))
	if _, err := e.store.AcknowledgeHold(e.ctx, p, "ops", 0, 30, [16]byte{}); err != nil {
		t.Fatal(err)
	}
	if got := e.mustGet(t, p).NextOffset; got != 30 {
		t.Errorf("next offset %d, want 30 (the log is shorter now)", got)
	}
}

// A hold that waits for an operator never hides another one: a handler bug
// found first, then a log truncated under the partition, are both open and
// need one acknowledgement each. (Before log epochs, recording the second
// deleted the first: the handler bug disappeared unresolved.)
func TestHoldsOfDifferentKindsStayOpenTogether(t *testing.T) {
	t.Parallel()
	e, p, tk := setupCommitted(t, 10)
	bug := sink.Hold{Partition: p, Kind: sink.HoldHandlerBug, Reason: "the handler committed", NextOffset: 10, LogStart: -1, HighWatermark: -1,
		From: 10, To: 12, FirstJob: "t/0/10", LastJob: "t/0/11", Owner: "a", Token: tk, AckedOffset: -1}
	trunc := sink.Hold{Partition: p, Kind: sink.HoldLogTruncated, Reason: "the log starts at 15", NextOffset: 10, LogStart: 15, HighWatermark: 20,
		From: -1, To: -1, Owner: "a", Token: tk, AckedOffset: -1}
	stall := sink.Hold{Partition: p, Kind: sink.HoldStalled, Reason: "recovering", NextOffset: 10, LogStart: -1, HighWatermark: -1, From: -1, To: -1, Owner: "a", AckedOffset: -1}
	for _, h := range []sink.Hold{bug, trunc, trunc, stall} { // the same finding twice replaces itself; a stall never hides a hold
		e.mustHold(t, h)
	}
	open, err := e.store.OpenHolds(e.ctx, "g")
	if err != nil {
		t.Fatal(err)
	}
	var kinds []sink.HoldKind
	for _, h := range open {
		kinds = append(kinds, h.Kind)
	}
	if len(kinds) != 2 || kinds[0] != sink.HoldHandlerBug || kinds[1] != sink.HoldLogTruncated {
		t.Fatalf("open holds %v, want [handler-bug log-truncated]", kinds)
	}
	// One acknowledgement each, oldest first.
	h, err := e.store.AcknowledgeHold(e.ctx, p, "ops", 15, 20, [16]byte{})
	if err != nil || h.Kind != sink.HoldHandlerBug {
		t.Fatalf("first acknowledgement: %v %+v", err, h)
	}
	if h, held, err := e.store.OpenHoldNeedingAck(e.ctx, p); err != nil || !held || h.Kind != sink.HoldLogTruncated {
		t.Fatalf("after the first acknowledgement: held %v %+v %v, want the log-truncated hold still open", held, h, err)
	}
	if e.mustGet(t, p).NextOffset != 10 {
		t.Fatal("the handler bug's acknowledgement moved the offset")
	}
	if h, err = e.store.AcknowledgeHold(e.ctx, p, "ops", 15, 20, [16]byte{}); err != nil || h.Kind != sink.HoldLogTruncated {
		t.Fatalf("second acknowledgement: %v %+v", err, h)
	}
	if f := e.mustGet(t, p); f.NextOffset != 15 {
		t.Errorf("next offset %d after the log-truncated acknowledgement, want 15", f.NextOffset)
	}
	if _, held, _ := e.store.OpenHoldNeedingAck(e.ctx, p); held {
		t.Error("a hold is still open after both acknowledgements")
	}
}

// An acknowledgement that moves the offsets starts a new log epoch, and a
// batch begun before it cannot commit after it, even one whose starting
// offset happens to be the new next offset: offsets of two log epochs do
// not compare.
func TestAcknowledgementStartsANewLogEpoch(t *testing.T) {
	t.Parallel()
	e, p, tk := setupCommitted(t, 40)
	if e.mustGet(t, p).LogEpoch != 0 {
		t.Fatal("a new row is not at log epoch 0")
	}
	// The log lost offsets 36 to 39 and reuses them.
	e.mustHold(t, aheadOfLog(p, tk, 40, 36))
	if _, err := e.store.AcknowledgeHold(e.ctx, p, "ops", 0, 36, [16]byte{}); err != nil {
		t.Fatal(err)
	}
	f := e.mustGet(t, p)
	if f.NextOffset != 36 || f.LogEpoch != 1 {
		t.Fatalf("after the acknowledgement: next %d log epoch %d, want 36 and 1", f.NextOffset, f.LogEpoch)
	}
	// A batch of the old log epoch from 36 (it had read the row before the
	// acknowledgement) is rejected as a new log epoch, not accepted because
	// its offset fits.
	err := e.commit(t, sink.CommitRequest{Partition: p, Token: tk, Owner: "a", From: 36, To: 38, LogEpoch: 0})
	if !errors.Is(err, sink.ErrOffsetMismatch) || !strings.Contains(err.Error(), "new log epoch") {
		t.Fatalf("a commit of the old log epoch: %v, want a rejection naming the new log epoch", err)
	}
	// The lane claims again (same claim), learns the log epoch and commits.
	c, err := e.store.Claim(e.ctx, sink.ClaimRequest{Partition: p, Token: tk, Owner: "a", PartitionCount: 1})
	if err != nil || c.LogEpoch != 1 || c.NextOffset != 36 || c.Created {
		t.Fatalf("claim again: %+v %v", c, err)
	}
	e.mustCommit(t, sink.CommitRequest{Partition: p, Token: tk, Owner: "a", From: 36, To: 38, LogEpoch: 1})
	// A handler bug's acknowledgement moves nothing and keeps the epoch.
	e.mustHold(t, sink.Hold{Partition: p, Kind: sink.HoldHandlerBug, Reason: "bug", NextOffset: 38, LogStart: -1,
		HighWatermark: -1, From: 38, To: 39, Owner: "a", Token: tk, AckedOffset: -1})
	if _, err := e.store.AcknowledgeHold(e.ctx, p, "ops", 0, 60, [16]byte{}); err != nil {
		t.Fatal(err)
	}
	if f := e.mustGet(t, p); f.LogEpoch != 1 || f.NextOffset != 38 {
		t.Errorf("after a handler bug's acknowledgement: %+v", f)
	}
}

// aheadOfLog is the hold a worker records when p's stored next offset is
// above hw, the end of its log.
func aheadOfLog(p sink.Partition, tk sink.Token, next, hw int64) sink.Hold {
	return sink.Hold{Partition: p, Kind: sink.HoldAheadOfLog, Reason: fmt.Sprintf("the stored next offset %d is above the log's end %d", next, hw),
		NextOffset: next, LogStart: 0, HighWatermark: hw, From: -1, To: -1, Owner: "a", Token: tk, AckedOffset: -1}
}

func (e *env) mustHold(t testing.TB, h sink.Hold) {
	t.Helper()
	if err := e.store.HoldPartition(e.ctx, h); err != nil {
		t.Fatalf("hold %+v: %v", h, err)
	}
}
