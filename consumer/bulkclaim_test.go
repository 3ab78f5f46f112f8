package consumer_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/sink"
)

// storeWithConns is a store on the test's schema over a pool of its own
// with conns connections: how many claims run at once follows the pool.
func storeWithConns(t testing.TB, b *bundle, conns int32) *sink.Store {
	t.Helper()
	return b.poolStore(func(cfg *pgxpool.Config) { cfg.MaxConns = conns })
}

// inFlight counts the claims between BeforeClaim and the hook's return,
// and the most seen at once.
type inFlight struct {
	now, most atomic.Int64
}

func (f *inFlight) enter() {
	n := f.now.Add(1)
	for {
		m := f.most.Load()
		if n <= m || f.most.CompareAndSwap(m, n) {
			return
		}
	}
}

func (f *inFlight) leave() { f.now.Add(-1) }

// The claims of one assignment run several at once, at most 8 (at
// start-up every connection of the pool of 32 is free): one at a time, a worker given the
// 334 partitions of a dead one out of 1,000 claimed them for seconds
// after the session timeout while none of them was processed. Each claim
// lingers 100 ms in BeforeClaim, so that claims that can overlap do.
func TestClaimsOfAnAssignmentRunAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, 16)
	b.produce(160, func(i int) string { return fmt.Sprintf("k%d", i) })
	var f inFlight
	var claimed sync.Map // partition -> true, once its claim was accepted
	cfg := b.config(ledger(t, b.schema), zap.NewNop())
	cfg.Store = storeWithConns(t, b, 32)
	cfg.Hooks.BeforeClaim = func(context.Context, sink.Partition, sink.Token) {
		f.enter()
		defer f.leave()
		time.Sleep(100 * time.Millisecond)
	}
	cfg.Hooks.AfterClaim = func(p sink.Partition, _ sink.Token, _ int64, err error) {
		if err == nil {
			claimed.Store(p.Partition, true)
		}
	}
	b.runUntilDone(cfg, 60*time.Second)
	most := f.most.Load()
	t.Logf("at most %d claims at once", most)
	if most < 2 {
		t.Errorf("the claims of the assignment ran one at a time (at most %d at once)", most)
	}
	if most > 8 {
		t.Errorf("%d claims ran at once: more than the bound of 8 for a pool of 32", most)
	}
	n := 0
	claimed.Range(func(any, any) bool { n++; return true })
	if n != 16 {
		t.Errorf("%d of the 16 partitions were claimed", n)
	}
	b.check()
}

// Claims running at once each end in their own partition's state: a
// partition whose fencing row is locked by another program is held as
// stalled and recovers by itself once the lock is gone; one whose stored
// offset lies beyond the log is held for an operator (its claim read the
// log again, beside the others); one a higher token holds is refused and
// left alone; the others are processed meanwhile, and the member keeps
// its session throughout.
func TestConcurrentClaimsEachGetTheirOutcome(t *testing.T) {
	t.Parallel()
	b := setup(t, 8)
	b.produce(160, func(i int) string { return fmt.Sprintf("k%d", i) })
	ctx := context.Background()
	part := func(p int32) sink.Partition { return sink.Partition{Group: b.group, Topic: b.topic, Partition: p} }
	ghost := func(p int32, tok sink.Token, start int64) {
		t.Helper()
		if _, err := b.store.Claim(ctx, sink.ClaimRequest{Partition: part(p), Token: tok, Owner: "ghost", ClaimID: 1, PartitionCount: 8, StartOffset: start}); err != nil {
			t.Fatal(err)
		}
	}
	// 0: a row locked by a session of another program.
	ghost(0, sink.Token{}, 0)
	tx := b.lockFenceRow(ctx, 0)
	defer func() { _ = tx.Rollback(ctx) }()
	// 1: a stored offset far beyond the log's end.
	ghost(1, sink.Token{}, 1_000_000)
	// 2: held by a token above any this group's members will have.
	ghost(2, sink.Token{Epoch: 1 << 30}, 0)

	core, logs := observer.New(zap.InfoLevel)
	cfg := b.config(ledger(t, b.schema), zap.New(core))
	cfg.Store = storeWithConns(t, b, 32)
	cfg.ClaimTimeout = 20 * time.Second
	stop := b.start(cfg)
	b.waitProcessed(60*time.Second, "partitions 3-7 to be processed", func(p int32) bool { return p >= 3 }, 5)
	holdOf := func(p int32, kind sink.HoldKind) sink.Hold {
		t.Helper()
		var h sink.Hold
		waitForCond(t, 30*time.Second, fmt.Sprintf("partition %d to be held (%s)", p, kind), func() bool {
			var err error
			h, err = b.store.OpenHold(ctx, part(p))
			return err == nil && h.Kind == kind
		})
		return h
	}
	if h := holdOf(0, sink.HoldStalled); !strings.Contains(h.Reason, "stayed locked") {
		t.Errorf("partition 0's stall does not say what holds it: %q", h.Reason)
	}
	holdOf(1, sink.HoldAheadOfLog)
	if h := holdOf(2, sink.HoldStalled); !strings.Contains(h.Reason, "rejected") {
		t.Errorf("partition 2's stall does not say its claim was rejected: %q", h.Reason)
	}
	fs, err := b.store.List(ctx, b.group)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fs {
		if f.Partition.Partition == 2 && f.Owner != "ghost" {
			t.Errorf("partition 2 was taken from the higher token: %+v", f)
		}
	}

	// The lock goes: partition 0's lane claims it by itself.
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	b.waitProcessed(30*time.Second, "partition 0 to be processed", func(p int32) bool { return p == 0 }, 1)
	if n := logs.FilterMessage(consumer.MsgPartitionsAssigned).Len(); n != 1 {
		t.Errorf("the member was assigned partitions %d times: a claim made it leave and rejoin", n)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []int32{1, 2} {
		var n int
		if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{b.schema, "ledger"}.Sanitize()+` WHERE partition = $1`, p).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Errorf("partition %d, held, had %d jobs processed", p, n)
		}
	}
}

// A stop while the claims of an assignment are running, several at once:
// the claims in flight end (their lanes are stopped, which cancels them),
// no claim starts after it, the stop waits for every claim, and nothing
// is left behind: no lane in the consumer's map, none running, no
// goroutine still claiming. Not parallel: it reads every goroutine's
// stack, and other tests' claims must not be among them.
func TestStopWhileClaimingLeavesNothing(t *testing.T) {
	b := setup(t, 16)
	b.produce(160, func(i int) string { return fmt.Sprintf("k%d", i) })
	var f inFlight
	var started atomic.Int64
	cfg := b.config(ledger(t, b.schema), zap.NewNop())
	cfg.Store = storeWithConns(t, b, 32)
	cfg.ClaimTimeout = 60 * time.Second
	cfg.Hooks.BeforeClaim = func(ctx context.Context, _ sink.Partition, _ sink.Token) {
		started.Add(1)
		f.enter()
		defer f.leave()
		select {
		case <-ctx.Done(): // the lane was stopped
		case <-time.After(60 * time.Second):
		}
	}
	c, stop := runNew(t, cfg)
	waitForCond(t, 30*time.Second, "8 claims in flight", func() bool { return f.now.Load() == 8 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if n := f.now.Load(); n != 0 {
		t.Errorf("%d claims still in flight after the stop", n)
	}
	if n := started.Load(); n != 8 {
		t.Errorf("%d claims started: a claim started after the stop, or the stop came late", n)
	}
	if ps := c.Partitions(); len(ps) != 0 {
		t.Errorf("lanes left in the stopped consumer: %v", ps)
	}
	if n := c.Stats().Lanes; n != 0 {
		t.Errorf("%d lanes still running", n)
	}
	// The claims' goroutines return once their lanes have started and
	// stopped, a moment after the stop: bounded, not at once.
	var left string
	deadline := time.Now().Add(5 * time.Second)
	for {
		buf := make([]byte, 1<<20)
		stacks := string(buf[:runtime.Stack(buf, true)])
		left = ""
		for _, fn := range []string{"consumer.(*Consumer).claimAll", "consumer.(*Consumer).claimPartition"} {
			if strings.Contains(stacks, fn) {
				left = fn
			}
		}
		if left == "" || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if left != "" {
		t.Errorf("a goroutine is still in %s 5 s after the stop", left)
	}
}

// A claim that panics (here a hook, once) is its partition's trouble: the
// claims run on goroutines of their own, where a panic would end the
// worker, and the lane already made must start like any whose claim
// failed, or a stop would wait for it forever. The partition is held as
// stalled, its lane claims it by itself, and every job is processed.
func TestAPanickingClaimStaysThatPartitionsTrouble(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	b.produce(80, func(i int) string { return fmt.Sprintf("k%d", i) })
	core, logs := observer.New(zap.InfoLevel)
	cfg := b.config(ledger(t, b.schema), zap.New(core))
	cfg.Store = storeWithConns(t, b, 32)
	var panicked atomic.Bool
	cfg.Hooks.BeforeClaim = func(_ context.Context, p sink.Partition, _ sink.Token) {
		if p.Partition == 1 && panicked.CompareAndSwap(false, true) {
			panic("a hook's bug")
		}
	}
	b.runUntilDone(cfg, 60*time.Second)
	if !panicked.Load() {
		t.Fatal("the hook never panicked")
	}
	if logs.FilterMessage("claim panicked").Len() != 1 {
		t.Error("the claim's panic was not logged")
	}
	if logs.FilterMessage(consumer.MsgRecovered).Len() == 0 {
		t.Error("partition 1 was not claimed again by its lane")
	}
	b.check()
}
