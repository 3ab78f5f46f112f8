package consumer_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/internal/fence"
	"github.com/tenure-dev/tenure/partition"
	"github.com/tenure-dev/tenure/sink"
)

// jointConfig is b's config with commits that span up to span partitions,
// on a pool of conns connections (3: 2 transaction slots, laneConns): with
// more lanes than slots, batches queue while the slots are busy, and each
// transaction takes several.
func (b *bundle) jointConfig(h consumer.Handler, log *zap.Logger, span int, conns int32) consumer.Config {
	b.t.Helper()
	cfg := b.config(h, log)
	cfg.Store = storeWithConns(b.t, b, conns)
	cfg.CommitSpan = span
	return cfg
}

// sharedCommits reads, from the fence log, how many transactions committed
// batches of more than one partition, and the most partitions one carried.
func (b *bundle) sharedCommits() (shared, most int) {
	b.t.Helper()
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE n > 1), coalesce(max(n), 0)
		FROM (SELECT count(DISTINCT partition) AS n FROM "`+b.schema+`".fence_log
		      WHERE kind = 'commit' AND consumer_group = $1 GROUP BY xmin::text) t`, b.group).Scan(&shared, &most); err != nil {
		b.t.Fatal(err)
	}
	return shared, most
}

// With CommitSpan above 1, every job of every partition commits exactly
// once (the history checker), and transactions carry the batches of
// several partitions: the fence log's commit rows of one transaction share
// its id (xmin). Both ways: the ledger as a BatchesHandler (one COPY for a
// transaction's batches), and behind a plain Handler (one call each).
func TestCommitSpanCommitsEveryJobOnceInSharedTransactions(t *testing.T) {
	t.Parallel()
	eachParallel(t, []string{"one call for several batches", "a call per batch"}, func(t *testing.T, calls string) {
		b := setup(t, 12)
		b.produce(1200, func(i int) string { return fmt.Sprintf("k%d", i%97) })
		log, logs := observedLogger(t, zap.WarnLevel)
		inner := ledger(t, b.schema).(consumer.BatchesHandler)
		h := &countingBatches{BatchesHandler: inner}
		var handler consumer.Handler = h
		if calls == "a call per batch" {
			handler = consumer.HandlerFunc(inner.Handle)
		}
		b.runUntilDone(b.jointConfig(handler, log, 8, 3), 60*time.Second)
		if h := b.check(); len(h.Writes) != 1200 {
			t.Fatalf("ledger has %d rows, want 1200", len(h.Writes))
		}
		shared, most := b.sharedCommits()
		t.Logf("%d transactions carried several partitions, at most %d; %d calls took several batches", shared, most, h.several.Load())
		if shared == 0 || most > 8 {
			t.Errorf("%d transactions carried several partitions, at most %d: want some, and none above the span 8", shared, most)
		}
		if calls == "one call for several batches" && h.several.Load() == 0 {
			t.Error("no HandleBatches call took several batches")
		}
		if n := logs.FilterLevelExact(zap.ErrorLevel).Len(); n != 0 {
			t.Errorf("%d errors logged", n)
		}
	})
}

// countingBatches counts the HandleBatches calls that took several batches.
type countingBatches struct {
	consumer.BatchesHandler
	several atomic.Int64
}

func (h *countingBatches) HandleBatches(ctx context.Context, tx consumer.Tx, batches []*consumer.Batch) error {
	if len(batches) > 1 {
		h.several.Add(1)
	}
	return h.BatchesHandler.HandleBatches(ctx, tx, batches)
}

// oneByOne makes a Handler a BatchesHandler whose call handles its
// batches with Handle one after another: it fails wherever Handle fails.
type oneByOne struct{ consumer.Handler }

func (h oneByOne) HandleBatches(ctx context.Context, tx consumer.Tx, batches []*consumer.Batch) error {
	for _, b := range batches {
		if err := h.Handle(ctx, tx, b); err != nil {
			return err
		}
	}
	return nil
}

// A poison job in one partition fails in its own savepoint: its lane
// alone retries, splits and dead-letters it, while the batches that shared
// its transactions commit, and every other partition finishes.
//
// With a BatchesHandler, a call that holds the poison job fails whole and
// each of its batches runs again alone: only the poison job's lane sees
// the failure.
func TestCommitSpanPoisonJobDoesNotHoldOthersBack(t *testing.T) {
	t.Parallel()
	eachParallel(t, []string{"a call per batch", "one call for several batches"}, func(t *testing.T, calls string) {
		testJointPoison(t, calls == "one call for several batches")
	})
}

func testJointPoison(t *testing.T, together bool) {
	b := setup(t, 6)
	poison := map[int]string{50: "fail", 120: "panic"}
	b.produceValues(600, func(i int) string { return fmt.Sprintf("k%d", i%31) }, poisonValues(poison))
	h, _ := poisonHandler(t, b.schema)
	calls := &countingBatches{BatchesHandler: oneByOne{h}}
	if together {
		h = calls
	}
	core, logs := observer.New(zap.DebugLevel)
	cfg := b.jointConfig(h, zap.New(core), 6, 3)
	cfg.MaxAttempts = 3
	defer func() {
		if t.Failed() {
			for _, e := range logs.FilterLevelExact(zap.WarnLevel).All() {
				t.Logf("%s %s %v", e.Level, e.Message, e.ContextMap())
			}
		}
	}()
	b.runUntilDone(cfg, 60*time.Second)
	if hist := b.check(); len(hist.Writes) != 598 {
		t.Errorf("ledger has %d rows, want 598 (600 jobs, 2 dead)", len(hist.Writes))
	}
	dls, err := b.store.DeadLetters(context.Background(), sink.DeadLetterFilter{Group: b.group})
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 2 {
		t.Errorf("%d dead letters, want 2", len(dls))
	}
	for _, d := range dls {
		if !strings.Contains(string(d.Value), "kind") {
			t.Errorf("dead-lettered a good job: %s", d.Value)
		}
	}
	if shared, _ := b.sharedCommits(); shared == 0 {
		t.Error("no transaction carried several partitions")
	}
	if together && calls.several.Load() == 0 {
		t.Error("no HandleBatches call took several batches")
	}
	if n := logs.FilterMessageSnippet("each runs alone").Len(); together && n == 0 {
		t.Error("no call with a poison job failed and ran its batches alone: the fallback was not tested")
	}
	// Only the poison jobs' lanes saw a failure: the batches that shared
	// their transactions were not retried, split or blamed.
	bad := map[string]bool{}
	for i := range poison {
		bad[fmt.Sprint(partition.For([]byte(fmt.Sprintf("k%d", i%31)), 6))] = true
	}
	for _, e := range logs.All() {
		switch e.Message {
		case "batch failed, retrying", "batch keeps failing: splitting it to isolate the failing job", "job failed, retrying":
			if p := fmt.Sprint(e.ContextMap()["partition"]); !bad[p] {
				t.Errorf("partition %s, which has no poison job, logged %q: %v", p, e.Message, e.ContextMap())
			}
		}
	}
}

// A zombie lane (its partition claimed behind its back) whose batch shares
// a transaction with good ones: the fence refuses the transaction, nothing
// of it commits, the zombie's lane is told it is fenced, and the good
// batches commit in the next transaction without it.
//
// One transaction slot (a pool of 2): partition 1's batch holds it, its
// handler waiting on gate, while every other lane's batch queues behind
// it; once the gate opens, the next transaction takes them all.
func TestCommitSpanZombieBatchIsRefusedAndTheOthersCommit(t *testing.T) {
	t.Parallel()
	const parts = 8
	b := setup(t, parts)
	inner := ledger(t, b.schema)
	gate := make(chan struct{})
	var gated atomic.Bool
	h := consumer.HandlerFunc(func(ctx context.Context, tx consumer.Tx, batch *consumer.Batch) error {
		if batch.Partition == 1 && gated.CompareAndSwap(true, false) {
			select {
			case <-gate:
			case <-ctx.Done():
			}
		}
		return inner.Handle(ctx, tx, batch)
	})
	log, logs := observedLogger(t, zap.ErrorLevel)
	cfg := b.jointConfig(h, log, parts, 2)
	var taken atomic.Int64
	cfg.Hooks.BeforeBatch = func(context.Context, *consumer.Batch) { taken.Add(1) }
	c, stop := runNew(t, cfg)
	defer stop()           //nolint:errcheck
	keys := keysFor(parts) // keys[p] lands on partition p
	b.produce(parts, func(i int) string { return keys[i] })
	b.waitDone(60 * time.Second)

	// Someone with a higher token claims partition 0 in Postgres.
	zombie := b.key(0)
	f, _ := b.usurp(0)
	before := b.rowsByPartition("ledger")
	gated.Store(true)
	b.produce(1, func(int) string { return keys[1] })
	waitForCond(t, 10*time.Second, "partition 1's batch to hold the slot", func() bool { return !gated.Load() })
	start := taken.Load()
	others := []int{0, 2, 3, 4, 5, 6, 7}
	b.produce(len(others), func(i int) string { return keys[others[i]] })
	waitForCond(t, 10*time.Second, "the other lanes' batches to queue", func() bool { return taken.Load() >= start+parts-1 })
	time.Sleep(100 * time.Millisecond) // from the hook to the queue
	close(gate)

	waitForCond(t, 30*time.Second, "the zombie's batch to be fenced", func() bool { return c.Stats().BatchesFenced >= 1 })
	waitForCond(t, 60*time.Second, "the good partitions to finish", func() bool {
		fs, err := b.store.List(context.Background(), b.group)
		if err != nil {
			return false
		}
		end := b.endOffsets()
		for _, f := range fs {
			if f.Partition != zombie && f.NextOffset < end[f.Partition.Partition] {
				return false
			}
		}
		return true
	})
	after := b.rowsByPartition("ledger")
	if after[0] != before[0] {
		t.Errorf("partition 0's ledger rows went from %d to %d after it was claimed by another: the zombie's batch committed", before[0], after[0])
	}
	if row, _ := b.store.Get(context.Background(), zombie); row.Owner != "usurper" || row.NextOffset != f.NextOffset {
		t.Errorf("the zombie's fencing row moved: %+v", row)
	}
	for p := int32(1); p < parts; p++ {
		if want := before[p] + 1; after[p] != want {
			t.Errorf("partition %d has %d ledger rows, want %d", p, after[p], want)
		}
	}
	want := fmt.Sprintf("refused in a transaction shared with %d other batches", parts-2)
	shared := logs.Filter(func(e observer.LoggedEntry) bool {
		return e.Message == consumer.MsgBatchFenced && strings.Contains(fmt.Sprint(e.ContextMap()["error"]), want)
	})
	if shared.Len() != 1 {
		t.Errorf("the zombie's refusal was not logged once with %q: %v", want, logs.FilterMessage(consumer.MsgBatchFenced).All())
	}
}

// keysFor returns a key for each of n partitions: keys[p] lands on p.
func keysFor(n int32) []string {
	keys := make([]string, n)
	found := int32(0)
	for i := 0; found < n && i < 100000; i++ {
		k := fmt.Sprintf("k%d", i)
		if p := partition.For([]byte(k), n); keys[p] == "" {
			keys[p] = k
			found++
		}
	}
	return keys
}

// A handler that ends a joint transaction itself (COMMIT or ROLLBACK in its
// SQL) halts its own partition, and nothing runs after it in that
// transaction: the batches queued behind it commit in the next one. The
// batches that ran before it in the same transaction: after a ROLLBACK
// their work is gone and they run again; after a COMMIT it was committed
// outside the fence, and their partitions halt too (running them again
// would do their effects twice), each hold naming the partition whose
// handler did it.
func TestCommitSpanHandlerThatEndsTheTransaction(t *testing.T) {
	t.Parallel()
	eachParallel(t, []string{"COMMIT", "ROLLBACK"}, func(t *testing.T, stmt string) {
		testJointHandlerEndsTx(t, stmt)
	})
}

func testJointHandlerEndsTx(t *testing.T, stmt string) {
	const parts = 6
	b := setup(t, parts)
	inner := ledger(t, b.schema)
	slot := newHeldSlot(b, parts)
	h := consumer.HandlerFunc(func(ctx context.Context, tx consumer.Tx, batch *consumer.Batch) error {
		slot.wait(ctx, batch)
		if err := inner.Handle(ctx, tx, batch); err != nil {
			return err
		}
		return endOnBug(ctx, tx, stmt, batch)
	})
	c, stop, logs, before := slot.run(h)
	defer stop() //nolint:errcheck

	// Partition 3's batch holds the one slot; 0 and 2 queue, then 1 (the
	// bug), then 4 and 5.
	slot.hold()
	slot.queue([]int{0, 2}, `{"i":1}`)
	slot.queue([]int{1}, "bug")
	slot.queue([]int{4, 5}, `{"i":2}`)
	slot.release()

	ranBefore := map[int32]bool{0: true, 2: true}
	wantHalted := 1
	if stmt == "COMMIT" {
		wantHalted = 3
	}
	waitForCond(t, 30*time.Second, "the halts", func() bool { return c.Stats().LanesHalted == int64(wantHalted) })
	end := b.endOffsets()
	waitForCond(t, 30*time.Second, "the other partitions to finish", func() bool {
		for p := int32(0); p < parts; p++ {
			f, err := b.store.Get(context.Background(), sink.Partition{Group: b.group, Topic: b.topic, Partition: p})
			halted := p == 1 || (stmt == "COMMIT" && ranBefore[p])
			if err != nil || (!halted && f.NextOffset < end[p]) {
				return false
			}
		}
		return true
	})
	after := b.rowsByPartition("ledger")
	for p := int32(0); p < parts; p++ {
		hold, held, f := b.holdAndFence(p)
		switch {
		case p == 1:
			if !held || hold.Kind != sink.HoldHandlerBug || strings.Contains(hold.Reason, "shared") || f.NextOffset != 1 {
				t.Errorf("partition 1 (the bug): hold %+v (%v), next offset %d; want its own handler-bug hold at 1", hold, held, f.NextOffset)
			}
		case stmt == "COMMIT" && ranBefore[p]:
			want := "handler bug in partition " + b.group + "/" + b.topic + "/1"
			if !held || hold.Kind != sink.HoldHandlerBug || !strings.Contains(hold.Reason, want) || f.NextOffset != 1 || after[p] != before[p]+1 {
				t.Errorf("partition %d (ran before the COMMIT): hold %+v (%v), next offset %d, %d rows; want a hold naming %q at 1, its row committed outside the fence",
					p, hold, held, f.NextOffset, after[p]-before[p], want)
			}
		default:
			if held || f.NextOffset != 2 || after[p] != before[p]+1 {
				t.Errorf("partition %d: hold %+v (%v), next offset %d, %d new rows; want it committed once at 2", p, hold, held, f.NextOffset, after[p]-before[p])
			}
		}
	}
	if n := logs.FilterMessageSnippet("handler bug").Len(); n != wantHalted {
		t.Errorf("%d handler bugs logged, want %d", n, wantHalted)
	}
}

// A BatchesHandler call that ends the transaction itself: the batches of
// the call cannot be told apart, so after a COMMIT (their writes committed
// outside the fence) every partition of the call halts, and after a
// ROLLBACK (nothing committed) each runs again alone and commits once.
func TestCommitSpanBatchesCallThatEndsTheTransaction(t *testing.T) {
	t.Parallel()
	eachParallel(t, []string{"COMMIT", "ROLLBACK"}, func(t *testing.T, stmt string) {
		const parts = 4
		b := setup(t, parts)
		inner := ledger(t, b.schema).(consumer.BatchesHandler)
		slot := newHeldSlot(b, parts)
		var calls atomic.Int64
		h := &batchesFunc{
			handle: func(ctx context.Context, tx consumer.Tx, batch *consumer.Batch) error {
				slot.wait(ctx, batch)
				return inner.Handle(ctx, tx, batch)
			},
			batches: func(ctx context.Context, tx consumer.Tx, batches []*consumer.Batch) error {
				calls.Add(1)
				if err := inner.HandleBatches(ctx, tx, batches); err != nil {
					return err
				}
				return endOnBug(ctx, tx, stmt, batches...)
			},
		}
		c, stop, logs, before := slot.run(h)
		defer stop() //nolint:errcheck

		// Partition 3's batch holds the one slot; 0, 1 (the bug) and 2
		// queue behind it and go in one call.
		slot.hold()
		slot.queue([]int{0, 2}, `{"i":1}`)
		slot.queue([]int{1}, "bug")
		callsBefore := calls.Load()
		slot.release()

		if stmt == "COMMIT" {
			waitForCond(t, 30*time.Second, "the halts", func() bool { return c.Stats().LanesHalted == 3 })
		} else {
			b.waitDone(30 * time.Second)
		}
		if calls.Load() == callsBefore {
			t.Fatal("the queued batches were not given to HandleBatches together: the test did not test it")
		}
		after := b.rowsByPartition("ledger")
		for p := int32(0); p < parts; p++ {
			hold, held, f := b.holdAndFence(p)
			switch {
			case stmt == "COMMIT" && p < 3:
				if !held || hold.Kind != sink.HoldHandlerBug || f.NextOffset != 1 || after[p] != before[p]+1 {
					t.Errorf("partition %d (in the call that ran COMMIT): hold %+v (%v), next offset %d, %d new rows; want a handler-bug hold at 1, its row committed outside the fence",
						p, hold, held, f.NextOffset, after[p]-before[p])
				}
			default:
				if held || f.NextOffset != 2 || after[p] != before[p]+1 {
					t.Errorf("partition %d: hold %+v (%v), next offset %d, %d new rows; want it committed once at 2", p, hold, held, f.NextOffset, after[p]-before[p])
				}
			}
		}
		wantBugs := 0
		if stmt == "COMMIT" {
			wantBugs = 3
		}
		if n := logs.FilterMessageSnippet("handler bug").Len(); n != wantBugs {
			t.Errorf("%d handler bugs logged, want %d", n, wantBugs)
		}
	})
}

// batchesFunc is a BatchesHandler of two functions.
type batchesFunc struct {
	handle  func(ctx context.Context, tx consumer.Tx, b *consumer.Batch) error
	batches func(ctx context.Context, tx consumer.Tx, batches []*consumer.Batch) error
}

func (h *batchesFunc) Handle(ctx context.Context, tx consumer.Tx, b *consumer.Batch) error {
	return h.handle(ctx, tx, b)
}

func (h *batchesFunc) HandleBatches(ctx context.Context, tx consumer.Tx, batches []*consumer.Batch) error {
	return h.batches(ctx, tx, batches)
}

// heldSlot runs a joint committer whose one transaction slot partition 3's
// next batch holds (its handler waits in wait) while the batches of other
// partitions queue behind it: once released, the next transaction takes
// them all.
type heldSlot struct {
	b     *bundle
	keys  []string // keys[p] lands on partition p
	gate  chan struct{}
	gated atomic.Bool
	taken atomic.Int64
}

func newHeldSlot(b *bundle, parts int32) *heldSlot {
	return &heldSlot{b: b, keys: keysFor(parts), gate: make(chan struct{})}
}

// wait is the test handler's first step: partition 3's batch, once held,
// waits for the release.
func (s *heldSlot) wait(ctx context.Context, batch *consumer.Batch) {
	if batch.Partition == 3 && s.gated.CompareAndSwap(true, false) {
		select {
		case <-s.gate:
		case <-ctx.Done():
		}
	}
}

// run runs h with commits that span every partition on one transaction
// slot, counting the batches taken, and waits until a job on each
// partition is done; before is the ledger's rows by partition then.
func (s *heldSlot) run(h consumer.Handler) (c *consumer.Consumer, stop func() error, logs *observer.ObservedLogs, before map[int32]int) {
	log, logs := observedLogger(s.b.t, zap.ErrorLevel+1)
	cfg := s.b.jointConfig(h, log, int(s.b.parts), 2)
	cfg.Hooks.BeforeBatch = func(context.Context, *consumer.Batch) { s.taken.Add(1) }
	c, stop = runNew(s.b.t, cfg)
	s.b.produce(int(s.b.parts), func(i int) string { return s.keys[i] })
	s.b.waitDone(60 * time.Second)
	return c, stop, logs, s.b.rowsByPartition("ledger")
}

// endOnBug runs stmt (COMMIT or ROLLBACK: a handler's bug) in tx when one
// of batches starts with the job "bug".
func endOnBug(ctx context.Context, tx consumer.Tx, stmt string, batches ...*consumer.Batch) error {
	for _, b := range batches {
		if string(b.Records[0].Value) == "bug" {
			_, err := tx.Exec(ctx, stmt)
			return err
		}
	}
	return nil
}

// holdAndFence reads partition p's open hold, if any, and its fencing row.
func (b *bundle) holdAndFence(p int32) (hold sink.Hold, held bool, f sink.Fence) {
	b.t.Helper()
	key := sink.Partition{Group: b.group, Topic: b.topic, Partition: p}
	hold, held, err := fence.Of(b.store).OpenHoldNeedingAck(context.Background(), key)
	if err != nil {
		b.t.Fatal(err)
	}
	if f, err = b.store.Get(context.Background(), key); err != nil {
		b.t.Fatal(err)
	}
	return hold, held, f
}

// hold makes partition 3's next batch hold the slot.
func (s *heldSlot) hold() {
	s.gated.Store(true)
	s.b.produce(1, func(int) string { return s.keys[3] })
	waitForCond(s.b.t, 10*time.Second, "partition 3's batch to hold the slot", func() bool { return !s.gated.Load() })
}

// queue produces value to each of the partitions ps and waits until their
// batches are queued.
func (s *heldSlot) queue(ps []int, value string) {
	n := s.taken.Load()
	s.b.produceValues(len(ps), func(i int) string { return s.keys[ps[i]] }, func(int) string { return value })
	waitForCond(s.b.t, 10*time.Second, "the batches to queue", func() bool { return s.taken.Load() >= n+int64(len(ps)) })
	time.Sleep(100 * time.Millisecond) // from the hook to the queue
}

func (s *heldSlot) release() { close(s.gate) }
