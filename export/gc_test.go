package export

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/tenure-dev/tenure/sink"
)

func objectNames(t *testing.T, st ObjectStore) []string {
	t.Helper()
	var out []string
	if err := st.List(context.Background(), func(o ObjectInfo) error {
		out = append(out, o.Name)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

// GC against the fencing state, step by step: superseded versions of the
// current token go (beyond Keep), the current owner's staged-but-unpublished
// work at or above the next offset stays (and is then published), a fenced
// owner's staged objects go, and names that are not this schema's are never
// touched.
func TestExportGC(t *testing.T) {
	t.Parallel()
	fs, err := NewFileStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	b := setup(t, fs)
	ctx := context.Background()
	a, bt := sink.Token{Epoch: 1}, sink.Token{Epoch: 2}
	b.claim(t, a, "A", 1, 0)
	for off := int64(0); off < 3; off++ {
		if err := b.run(t, b.batch(a, "A", 0, off, [2]string{"acme", "v" + string(rune('0'+off))}), 1, true); err != nil {
			t.Fatal(err)
		}
	}
	// Objects that are not this schema's: another schema's scope, and a
	// name this sink did not make.
	other := Name("acme", Position{Topic: "jobs", Partition: 0, Offset: 0}, sink.Token{}, Scope("another_schema", "g"), NewNonce())
	for _, n := range []string{other, "objects/readme.txt"} {
		if err := fs.Put(ctx, n, bytesReader("x"), 1, sum("x")); err != nil {
			t.Fatal(err)
		}
	}
	// A's next batch is staged, its transaction still open.
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	pending := b.batch(a, "A", 0, 3, [2]string{"acme", "v3"})
	if err := b.h.Handle(ctx, testTx{tx}, pending); err != nil {
		t.Fatal(err)
	}
	if got := len(objectNames(t, fs)); got != 6 {
		t.Fatalf("%d objects, want 6 (3 published, 1 staged, 2 foreign)", got)
	}

	rep, err := GC(ctx, b.pool, b.schema, fs, GCOptions{Keep: 1, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Deleted) != 1 || rep.Visible != 1 || rep.Kept != 1 || rep.MayPublish != 1 || rep.Foreign != 2 {
		t.Fatalf("dry run with keep 1: %+v", rep)
	}
	if got := len(objectNames(t, fs)); got != 6 {
		t.Fatalf("a dry run deleted objects: %d left", got)
	}
	rep, err = GC(ctx, b.pool, b.schema, fs, GCOptions{Keep: 0})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Deleted) != 2 || rep.Visible != 1 || rep.MayPublish != 1 || rep.Foreign != 2 {
		t.Fatalf("keep 0: %+v", rep)
	}
	// The pending batch commits: the object GC kept becomes visible.
	if err := b.store.Commit(ctx, tx, sink.CommitRequest{Partition: sink.Partition{Group: "g", Topic: "jobs"}, Token: a, Owner: "A", ClaimID: 1, From: 3, To: 4}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got, _, err := Get(ctx, b.pool, b.schema, fs, "acme"); err != nil || string(got) != "v3" {
		t.Fatalf("after the pending batch committed: %q, %v", got, err)
	}

	// B claims; A, not knowing, stages its next batch: fenced.
	b.claim(t, bt, "B", 2, 0)
	if err := b.run(t, b.batch(a, "A", 0, 4, [2]string{"acme", "stale"}), 1, true); !errors.Is(err, sink.ErrFenced) {
		t.Fatalf("A after B's claim: %v", err)
	}
	// B's batch is staged, not yet committed, at the same offset.
	tx2, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx2.Rollback(ctx)
	if err := b.h.Handle(ctx, testTx{tx2}, b.batch(bt, "B", 0, 4, [2]string{"acme", "new"})); err != nil {
		t.Fatal(err)
	}
	rep, err = GC(ctx, b.pool, b.schema, fs, GCOptions{Keep: 0})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Deleted) != 2 || rep.MayPublish != 1 {
		t.Fatalf("after B's claim: %+v (want A's staged object and the superseded v2 deleted, B's staged one kept)", rep)
	}
	if err := b.store.Commit(ctx, tx2, sink.CommitRequest{Partition: sink.Partition{Group: "g", Topic: "jobs"}, Token: bt, Owner: "B", ClaimID: 2, From: 4, To: 5}); err != nil {
		t.Fatal(err)
	}
	if err := tx2.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got, _, err := Get(ctx, b.pool, b.schema, fs, "acme"); err != nil || string(got) != "new" {
		t.Fatalf("B's export: %q, %v", got, err)
	}
	for _, n := range []string{other, "objects/readme.txt"} {
		if !slices.Contains(objectNames(t, fs), n) {
			t.Errorf("GC deleted %s, which is not its schema's", n)
		}
	}
	var collected int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM "`+b.schema+`".export_publications WHERE collected_at IS NOT NULL`).Scan(&collected); err != nil || collected != 3 {
		t.Errorf("%d publications marked collected (%v), want 3", collected, err)
	}

}
