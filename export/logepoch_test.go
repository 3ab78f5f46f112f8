package export

import (
	"context"
	"sync"
	"testing"

	"github.com/tenure-dev/tenure/internal/fence"
	"github.com/tenure-dev/tenure/sink"
)

// An operator's acknowledgement can move a partition's next offset down
// under the same token (a log that lost records and reuses their offsets).
// These two tests failed before log epochs: the pointer compared offsets
// across the acknowledgement, and gc assumed the next offset only grows
// under one token.

// holdAndAcknowledge records an ahead-of-log hold (the log ends at end) and
// acknowledges it, as a worker and an operator do; then the owner claims
// again (same claim) and learns the new log epoch.
func (b *bundle) holdAndAcknowledge(t *testing.T, tok sink.Token, owner string, claimID int64, end int64) {
	t.Helper()
	ctx := context.Background()
	p := sink.Partition{Group: b.group, Topic: "jobs", Partition: 0}
	f, err := b.store.Get(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if err := fence.Of(b.store).HoldPartition(ctx, sink.Hold{Partition: p, Kind: sink.HoldAheadOfLog, Reason: "the log lost records", Owner: owner,
		Token: tok, NextOffset: f.NextOffset, LogStart: 0, HighWatermark: end, From: -1, To: -1, AckedOffset: -1}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.AcknowledgeHold(ctx, p, "ops", 0, end, [16]byte{}); err != nil {
		t.Fatal(err)
	}
	c, err := b.store.Claim(ctx, sink.ClaimRequest{Partition: p, Token: tok, Owner: owner, ClaimID: claimID, PartitionCount: 2})
	if err != nil {
		t.Fatal(err)
	}
	if c.NextOffset != end {
		t.Fatalf("after the acknowledgement the claim returns %d, want %d", c.NextOffset, end)
	}
	b.logEpoch = c.LogEpoch
}

// The log loses offsets 3 and 4 (the same topic id), the operator
// acknowledges, and new jobs arrive at 3 and 4. Before, the pointer only
// moved to a higher offset of the same log: the new jobs were recorded as
// superseded and the key kept showing the lost job's document. A later log
// epoch is later whatever its offsets.
func TestExportPublishesReusedOffsetsAfterAnAcknowledgement(t *testing.T) {
	t.Parallel()
	b := setup(t, newMemStore())
	tok := sink.Token{Epoch: 1}
	b.claim(t, tok, "A", 1, 0)
	if err := b.run(t, b.batch(tok, "A", 0, 0, [2]string{"acme", "v0"}, [2]string{"acme", "v1"}, [2]string{"acme", "v2"},
		[2]string{"acme", "lost v3"}, [2]string{"acme", "lost v4"}), 1, true); err != nil {
		t.Fatal(err)
	}
	if p := b.pointer(t, "acme"); p.Offset != 4 {
		t.Fatalf("pointer at %d, want 4", p.Offset)
	}
	b.holdAndAcknowledge(t, tok, "A", 1, 3)
	if err := b.run(t, b.batch(tok, "A", 0, 3, [2]string{"acme", "new v3"}), 1, true); err != nil {
		t.Fatal(err)
	}
	body, p, err := Get(context.Background(), b.pool, b.schema, b.objs, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if p.Offset != 3 || string(body) != "new v3" {
		t.Errorf("acme shows offset %d %q, want the new job at 3 (\"new v3\")", p.Offset, body)
	}
}

// listHook runs fn (once) when gc lists the store: between gc's reading of
// the fencing rows and its deletions, where a worker and an operator act
// concurrently in production.
type listHook struct {
	ObjectStore
	once sync.Once
	fn   func()
}

func (l *listHook) List(ctx context.Context, fn func(ObjectInfo) error) error {
	l.once.Do(l.fn)
	return l.ObjectStore.List(ctx, fn)
}

// gc reads the fencing row (token 0.1, next offset 10); an operator
// acknowledges an ahead-of-log hold (next offset down to 3 under the same
// token); the owner stages job 3 of the new log; gc, by its rule "current
// token, offset below the next offset", deleted it, and the owner's commit
// then published a pointer to a missing object. gc now reads the rows again
// before it deletes, and keeps what a moved log epoch may still publish.
func TestExportGCKeepsWhatAnOwnerStagesAfterAnAcknowledgement(t *testing.T) {
	t.Parallel()
	mem := newMemStore()
	b := setup(t, mem)
	tok := sink.Token{Epoch: 1}
	b.claim(t, tok, "A", 1, 0)
	for off := int64(0); off < 10; off++ {
		if err := b.run(t, b.batch(tok, "A", 0, off, [2]string{"acme", "v"}), 1, true); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	next := b.batch(tok, "A", 0, 3, [2]string{"acme", "new v3"})
	hook := &listHook{ObjectStore: mem, fn: func() {
		b.holdAndAcknowledge(t, tok, "A", 1, 3)
		if err := b.h.Handle(ctx, testTx{tx}, next); err != nil { // staged, not yet committed
			t.Error(err)
		}
	}}
	if _, err := GC(ctx, b.pool, b.schema, hook, GCOptions{}); err != nil {
		t.Fatal(err)
	}
	b.commitStaged(t, tx, next, 1)
	body, p, err := Get(ctx, b.pool, b.schema, mem, "acme")
	if err != nil {
		t.Fatalf("the published object: %v (gc deleted what the owner was about to publish)", err)
	}
	if p.Offset != 3 || string(body) != "new v3" {
		t.Errorf("acme shows offset %d %q", p.Offset, body)
	}
}
