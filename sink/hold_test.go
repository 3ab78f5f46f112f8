package sink_test

import (
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
	e := setup(t)
	p := sink.Partition{Group: "g", Topic: "t", Partition: 0}
	tk := sink.Token{Epoch: 1}
	from := e.mustClaim(t, p, tk, "a", 0)
	e.mustCommit(t, sink.CommitRequest{Partition: p, Token: tk, Owner: "a", From: from, To: 38})
	if err := e.store.HoldPartition(e.ctx, sink.Hold{Partition: p, Kind: sink.HoldAheadOfLog, Reason: "the stored next offset 38 is above the log's end 36",
		NextOffset: 38, LogStart: 0, HighWatermark: 36, From: -1, To: -1, Owner: "a", Token: tk}); err != nil {
		t.Fatal(err)
	}
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
	from = e.mustClaim(t, p, tk, "a", 0)
	e.mustCommit(t, sink.CommitRequest{Partition: p, Token: tk, Owner: "a", From: from, To: 38})
	if err := e.store.HoldPartition(e.ctx, sink.Hold{Partition: p, Kind: sink.HoldAheadOfLog, Reason: "ahead",
		NextOffset: 38, LogStart: 0, HighWatermark: 36, From: -1, To: -1, Owner: "a", Token: tk}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.AcknowledgeHold(e.ctx, p, "ops", 0, 30, [16]byte{}); err != nil {
		t.Fatal(err)
	}
	if got := e.mustGet(t, p).NextOffset; got != 30 {
		t.Errorf("next offset %d, want 30 (the log is shorter now)", got)
	}
}
