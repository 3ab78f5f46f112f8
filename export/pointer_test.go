package export

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/internal/history"
	"github.com/tenure-dev/tenure/internal/testinfra/testdb"
	"github.com/tenure-dev/tenure/sink"
)

// testTx is a pgx.Tx as a consumer.Tx (the lane's own wrapper is not
// exported), so that a test can run a Handler inside a transaction it
// commits itself, with or without the fence.
type testTx struct{ pgx.Tx }

func (t testTx) Begin(ctx context.Context) (consumer.Savepoint, error) {
	sp, err := t.Tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return testSavepoint{testTx{sp}}, nil
}

type testSavepoint struct{ testTx }

func (s testSavepoint) Commit(ctx context.Context) error   { return s.Tx.Commit(ctx) }
func (s testSavepoint) Rollback(ctx context.Context) error { return s.Tx.Rollback(ctx) }

type bundle struct {
	pool   *pgxpool.Pool
	schema string
	store  *sink.Store
	objs   ObjectStore
	h      *Handler
	group  string
	// logEpoch is the log epoch run's commits carry (sink.Claimed.LogEpoch).
	logEpoch int64
}

func setup(t *testing.T, objs ObjectStore) *bundle {
	t.Helper()
	pool := testdb.Pool(t)
	schema := testdb.Schema(t, pool)
	st, err := sink.NewStore(pool, schema)
	if err != nil {
		t.Fatal(err)
	}
	h, err := NewHandler(Config{Store: objs, Schema: schema, Worker: "test"})
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{pool: pool, schema: schema, store: st, objs: objs, h: h, group: "g"}
}

// batch makes a batch of jobs (key, value) at offsets from..., under token.
func (b *bundle) batch(token sink.Token, owner string, partition int32, from int64, jobs ...[2]string) *consumer.Batch {
	bt := &consumer.Batch{Group: b.group, Topic: "jobs", Partition: partition, Token: token, Owner: owner, From: from, To: from + int64(len(jobs))}
	for i, j := range jobs {
		bt.Records = append(bt.Records, &kgo.Record{Topic: "jobs", Partition: partition, Offset: from + int64(i), Key: []byte(j[0]), Value: []byte(j[1])})
	}
	return bt
}

func (b *bundle) claim(t *testing.T, token sink.Token, owner string, claimID int64, partition int32) int64 {
	t.Helper()
	c, err := b.store.Claim(context.Background(), sink.ClaimRequest{Partition: sink.Partition{Group: b.group, Topic: "jobs", Partition: partition},
		Token: token, Owner: owner, ClaimID: claimID, PartitionCount: 2})
	if err != nil {
		t.Fatal(err)
	}
	return c.NextOffset
}

// run handles bt in a transaction and, when fenced, commits it through the
// fence as a lane does; without the fence it just commits.
func (b *bundle) run(t *testing.T, bt *consumer.Batch, claimID int64, fenced bool) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := b.h.Handle(ctx, testTx{tx}, bt); err != nil {
		return err
	}
	if fenced {
		if err := b.store.Commit(ctx, tx, b.commitRequest(bt, claimID)); err != nil {
			return err
		}
	}
	return tx.Commit(ctx)
}

// commitRequest is bt's fence statement, as claim claimID.
func (b *bundle) commitRequest(bt *consumer.Batch, claimID int64) sink.CommitRequest {
	return sink.CommitRequest{Partition: sink.Partition{Group: bt.Group, Topic: bt.Topic, Partition: bt.Partition},
		Token: bt.Token, Owner: bt.Owner, ClaimID: claimID, From: bt.From, To: bt.To, LogEpoch: b.logEpoch}
}

func (b *bundle) pointer(t *testing.T, key string) Pointer {
	t.Helper()
	p, err := Lookup(context.Background(), b.pool, b.schema, key)
	if err != nil {
		t.Fatalf("pointer of %q: %v", key, err)
	}
	return p
}

// setupSuperseded is a bundle on a memory store in which A claimed
// partition 0 with token a (1.0, claim 1) and B then with bt (2.0, claim 2).
func setupSuperseded(t *testing.T) (b *bundle, a, bt sink.Token) {
	t.Helper()
	b = setup(t, newMemStore())
	a, bt = sink.Token{Epoch: 1}, sink.Token{Epoch: 2}
	b.claim(t, a, "A", 1, 0)
	b.claim(t, bt, "B", 2, 0)
	return b, a, bt
}

// violations checks the history against the jobs produced to partition 0
// of topic jobs at offsets.
func (b *bundle) violations(t *testing.T, offsets ...int64) []history.Violation {
	t.Helper()
	return b.history(t).Check(map[history.TopicPartition][]int64{{Topic: "jobs", Partition: 0}: offsets})
}

func (b *bundle) history(t *testing.T) *history.History {
	t.Helper()
	ctx := context.Background()
	h, err := history.Load(ctx, b.pool, b.schema, b.group, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.LoadObjectExports(ctx, b.pool, b.schema, b.group); err != nil {
		t.Fatal(err)
	}
	return h
}

// The pointer moves only forward, whatever the order in which writers
// arrive: here without the fence (the position check alone), a later job's
// transaction commits first, and an earlier one after it; then two writers
// race on the row lock in both orders.
func TestExportPointerOnlyForward(t *testing.T) {
	t.Parallel()
	b := setup(t, newMemStore())
	tok := sink.Token{Incarnation: 0, Epoch: 1}
	ctx := context.Background()

	if err := b.run(t, b.batch(tok, "B", 0, 20, [2]string{"acme", "v20"}), 0, false); err != nil {
		t.Fatal(err)
	}
	if err := b.run(t, b.batch(tok, "A", 0, 10, [2]string{"acme", "v10"}), 0, false); err != nil {
		t.Fatal(err)
	}
	if p := b.pointer(t, "acme"); p.Offset != 20 || p.Version != 1 {
		t.Fatalf("after a late writer of offset 10: pointer at offset %d version %d, want offset 20 version 1", p.Offset, p.Version)
	}
	if got, _, err := Get(ctx, b.pool, b.schema, b.objs, "acme"); err != nil || string(got) != "v20" {
		t.Fatalf("Get: %q, %v; want v20", got, err)
	}
	var outcome string
	if err := b.pool.QueryRow(ctx, `SELECT outcome FROM "`+b.schema+`".export_publications WHERE job_offset = 10`).Scan(&outcome); err != nil || outcome != "superseded" {
		t.Fatalf("the late writer's publication: %q, %v; want superseded", outcome, err)
	}

	// Two open transactions on one key: the first to write holds the row;
	// the other waits and then re-checks against what committed.
	for _, order := range []string{"later first", "earlier first"} {
		key := "race-" + order
		offs := [2]int64{40, 30} // first writer, second writer
		if order == "earlier first" {
			offs = [2]int64{30, 40}
		}
		tx1, err := b.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// Released on every path: a failure must read as a failure, not as
		// the pool's Close waiting for this transaction until the timeout.
		t.Cleanup(func() { _ = tx1.Rollback(context.Background()) })
		if err := b.h.Handle(ctx, testTx{tx1}, b.batch(tok, "W1", 0, offs[0], [2]string{key, "first"})); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			tx2, err := b.pool.Begin(ctx)
			if err != nil {
				done <- err
				return
			}
			defer tx2.Rollback(ctx)
			if err := b.h.Handle(ctx, testTx{tx2}, b.batch(tok, "W2", 0, offs[1], [2]string{key, "second"})); err != nil {
				done <- err
				return
			}
			done <- tx2.Commit(ctx)
		}()
		select {
		case err := <-done:
			t.Fatalf("%s: the second writer did not wait for the first's row lock (%v)", order, err)
		case <-time.After(300 * time.Millisecond):
		}
		if err := tx1.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if p := b.pointer(t, key); p.Offset != 40 {
			t.Errorf("%s: pointer at offset %d, want 40", order, p.Offset)
		}
	}
	h := b.history(t)
	if vs := history.CheckPointers(h.Publications, h.Pointers); len(vs) > 0 {
		t.Errorf("pointer history: %v", vs)
	}
}

// A batch with several jobs of one key stages only the last (the others
// could never be seen: the pointer moves at commit), records all, and moves
// the pointer once.
func TestExportCoalescesWithinBatch(t *testing.T) {
	t.Parallel()
	b := setup(t, newMemStore())
	tok := sink.Token{Epoch: 1}
	b.claim(t, tok, "A", 1, 0)
	if err := b.run(t, b.batch(tok, "A", 0, 0, [2]string{"acme", "0"}, [2]string{"globex", "1"}, [2]string{"acme", "2"}, [2]string{"acme", "3"}), 1, true); err != nil {
		t.Fatal(err)
	}
	if p := b.pointer(t, "acme"); p.Offset != 3 || p.Version != 1 {
		t.Errorf("acme: offset %d version %d, want 3 and 1", p.Offset, p.Version)
	}
	if n := len(b.objs.(*memStore).objs); n != 2 {
		t.Errorf("%d objects staged, want 2 (one per key)", n)
	}
	for _, v := range b.violations(t, 0, 1, 2, 3) {
		t.Errorf("violation: %s", v)
	}
}

// The stale owner's transaction, with its pointer moves, is rejected by the
// fence as a whole: its objects are staged and never published, and the
// history checker, fed the records, finds G1-G3 and the pointers intact.
// Were the publication made outside the fenced transaction, the checker
// would report it (see TestExportPublishOutsideFenceIsCaught).
func TestExportStaleOwnerNeverPublishes(t *testing.T) {
	t.Parallel()
	b, a, bt := setupSuperseded(t) // G3: B's claim alone fences A
	err := b.run(t, b.batch(a, "A", 0, 0, [2]string{"acme", "stale"}), 1, true)
	if !errors.Is(err, sink.ErrFenced) {
		t.Fatalf("A's commit after B's claim: %v, want ErrFenced", err)
	}
	if n := len(b.objs.(*memStore).objs); n != 1 {
		t.Fatalf("A's object should be staged (1 object), found %d", n)
	}
	if _, err := Lookup(context.Background(), b.pool, b.schema, "acme"); !errors.Is(err, ErrNoExport) {
		t.Fatalf("A's object was published: %v", err)
	}
	if err := b.run(t, b.batch(bt, "B", 0, 0, [2]string{"acme", "new"}), 2, true); err != nil {
		t.Fatal(err)
	}
	for _, v := range b.violations(t, 0) {
		t.Errorf("violation: %s", v)
	}
}

// The checker catches a publication made outside the fenced transaction: a
// stale owner whose publication lands although its commit is refused.
func TestExportPublishOutsideFenceIsCaught(t *testing.T) {
	t.Parallel()
	b, a, bt := setupSuperseded(t)
	if err := b.run(t, b.batch(bt, "B", 0, 0, [2]string{"acme", "new"}), 2, true); err != nil {
		t.Fatal(err)
	}
	// A publishes in a transaction of its own, then its fenced commit fails.
	if err := b.run(t, b.batch(a, "A", 0, 0, [2]string{"acme", "stale"}), 1, false); err != nil {
		t.Fatal(err)
	}
	vs := b.violations(t, 0)
	if len(vs) == 0 {
		t.Fatal("the checker found nothing wrong with a publication outside the fence")
	}
	t.Logf("caught: %v", vs)
}

func TestExportCheckPointersCatchesRegression(t *testing.T) {
	t.Parallel()
	pubs := []history.Publication{
		{ID: 1, Key: "k", Topic: "t", Offset: 5, Object: "o1", Outcome: "moved", Version: 1},
		{ID: 2, Key: "k", Topic: "t", Offset: 3, Object: "o2", Outcome: "moved", Version: 2},
	}
	if vs := history.CheckPointers(pubs, []history.ExportPointer{{Key: "k", Object: "o2", Topic: "t", Offset: 3, Version: 2}}); len(vs) != 1 {
		t.Errorf("want one regression, got %v", vs)
	}
	obs := []history.Observation{{Key: "k", Version: 2, Topic: "t", Offset: 5}, {Key: "k", Version: 1, Topic: "t", Offset: 3}, {Key: "k", Mismatch: "bad bytes"}}
	if vs := history.CheckObservations(obs); len(vs) != 4 {
		t.Errorf("want 4 violations (version, offset, bytes... ), got %d: %v", len(vs), vs)
	}

}
