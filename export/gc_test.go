package export

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/tenure-dev/tenure/consumer"
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
	a, bt := sink.Token{Epoch: 1}, sink.Token{Epoch: 2}
	b.claim(t, a, "A", 1, 0)
	for off := int64(0); off < 3; off++ {
		if err := b.run(t, b.batch(a, "A", 0, off, [2]string{"acme", "v" + string(rune('0'+off))}), 1, true); err != nil {
			t.Fatal(err)
		}
	}
	foreign := putForeignObjects(t, fs)
	// A's next batch is staged, its transaction still open.
	pending := b.batch(a, "A", 0, 3, [2]string{"acme", "v3"})
	tx := b.stage(t, pending)
	if got := len(objectNames(t, fs)); got != 6 {
		t.Fatalf("%d objects, want 6 (3 published, 1 staged, 2 foreign)", got)
	}
	gcKeepsWhatMayPublish(t, b, fs)
	// The pending batch commits: the object GC kept becomes visible.
	b.commitStaged(t, tx, pending, 1)
	b.wantExported(t, "acme", "v3", "after the pending batch committed")

	// B claims; A, not knowing, stages its next batch: fenced.
	b.claim(t, bt, "B", 2, 0)
	if err := b.run(t, b.batch(a, "A", 0, 4, [2]string{"acme", "stale"}), 1, true); !errors.Is(err, sink.ErrFenced) {
		t.Fatalf("A after B's claim: %v", err)
	}
	// B's batch is staged, not yet committed, at the same offset.
	next := b.batch(bt, "B", 0, 4, [2]string{"acme", "new"})
	tx2 := b.stage(t, next)
	if rep := b.gc(t, GCOptions{Keep: 0}); len(rep.Deleted) != 2 || rep.MayPublish != 1 {
		t.Fatalf("after B's claim: %+v (want A's staged object and the superseded v2 deleted, B's staged one kept)", rep)
	}
	b.commitStaged(t, tx2, next, 2)
	b.wantExported(t, "acme", "new", "B's export")
	for _, n := range foreign {
		if !slices.Contains(objectNames(t, fs), n) {
			t.Errorf("GC deleted %s, which is not its schema's", n)
		}
	}
	var collected int
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM "`+b.schema+`".export_publications WHERE collected_at IS NOT NULL`).Scan(&collected); err != nil || collected != 3 {
		t.Errorf("%d publications marked collected (%v), want 3", collected, err)
	}
}

// putForeignObjects puts objects that are not this schema's into fs:
// another schema's scope, and a name this sink did not make.
func putForeignObjects(t *testing.T, fs ObjectStore) []string {
	t.Helper()
	other := Name("acme", Position{Topic: "jobs", Partition: 0, Offset: 0}, sink.Token{}, Scope("another_schema", "g"), NewNonce())
	names := []string{other, "objects/readme.txt"}
	for _, n := range names {
		if err := fs.Put(context.Background(), n, bytesReader("x"), 1, sum("x")); err != nil {
			t.Fatal(err)
		}
	}
	return names
}

// gcKeepsWhatMayPublish runs GC with three published versions, one staged
// and two foreign objects: a dry run deletes nothing; keep 0 deletes the
// two superseded versions and keeps the staged one.
func gcKeepsWhatMayPublish(t *testing.T, b *bundle, fs ObjectStore) {
	t.Helper()
	rep := b.gc(t, GCOptions{Keep: 1, DryRun: true})
	if len(rep.Deleted) != 1 || rep.Visible != 1 || rep.Kept != 1 || rep.MayPublish != 1 || rep.Foreign != 2 {
		t.Fatalf("dry run with keep 1: %+v", rep)
	}
	if got := len(objectNames(t, fs)); got != 6 {
		t.Fatalf("a dry run deleted objects: %d left", got)
	}
	rep = b.gc(t, GCOptions{Keep: 0})
	if len(rep.Deleted) != 2 || rep.Visible != 1 || rep.MayPublish != 1 || rep.Foreign != 2 {
		t.Fatalf("keep 0: %+v", rep)
	}
}

func (b *bundle) gc(t *testing.T, opts GCOptions) GCReport {
	t.Helper()
	rep, err := GC(context.Background(), b.pool, b.schema, b.objs, opts)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// stage handles bt in a transaction it leaves open: its objects are
// staged, not published. The test commits it (commitStaged) or the
// cleanup rolls it back.
func (b *bundle) stage(t *testing.T, bt *consumer.Batch) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	if err := b.h.Handle(ctx, testTx{tx}, bt); err != nil {
		t.Fatal(err)
	}
	return tx
}

// commitStaged commits a staged batch through the fence, as claim claimID.
func (b *bundle) commitStaged(t *testing.T, tx pgx.Tx, bt *consumer.Batch, claimID int64) {
	t.Helper()
	ctx := context.Background()
	if err := b.store.Commit(ctx, tx, b.commitRequest(bt, claimID)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// wantExported checks that key's export reads want.
func (b *bundle) wantExported(t *testing.T, key, want, when string) {
	t.Helper()
	if got, _, err := Get(context.Background(), b.pool, b.schema, b.objs, key); err != nil || string(got) != want {
		t.Fatalf("%s: %q, %v", when, got, err)
	}
}
