package consumer_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/sink"
)

// A member whose lanes keep every connection of its pool busy must still
// claim the partitions it is given: the claims must not queue behind the
// lanes' transactions. They did (pgxpool serves connections in the order
// they were asked for): with 1,000 partitions over 3 workers, the claims
// after a worker died took 23 s, or outlasted the claim timeout and the
// session was abandoned. Here: 16 partitions, pools of 4 connections,
// batches that hold their connection 300 ms; A's claims of B's partitions,
// when B stops, wait behind A's lanes for about 0.4 s each unless a
// connection is kept for them, and 8 of them outlast a 2 s claim timeout.
func TestClaimsDoNotWaitBehindBusyLanes(t *testing.T) {
	t.Parallel()
	b := setup(t, 16)
	store := func() *sink.Store { return storeWithConns(t, b, 4) }
	inner := ledger(t, b.schema)
	var slow atomic.Bool
	slow.Store(true)
	h := consumer.HandlerFunc(func(ctx context.Context, tx consumer.Tx, batch *consumer.Batch) error {
		if slow.Load() {
			time.Sleep(300 * time.Millisecond) // in the transaction: the connection is held
		}
		return inner.Handle(ctx, tx, batch)
	})
	var committed [2]atomic.Int64
	core, logs := observer.New(zap.InfoLevel)
	cfg := func(n int, log *zap.Logger) consumer.Config {
		c := b.config(h, log)
		c.Store = store()
		c.BatchMax = 1
		c.ClaimTimeout = 2 * time.Second
		c.Hooks.AfterBatch = func(_ *consumer.Batch, err error) {
			if err == nil {
				committed[n].Add(1)
			}
		}
		return c
	}
	// 40 jobs a partition: 160 s of batches at 3 or 4 at a time, far more
	// than the test runs before it speeds the handler up.
	b.produce(16*40, func(i int) string { return fmt.Sprintf("k%d", i) })
	b.start(cfg(0, zap.New(core)))
	busy := func(n int, since int64) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for committed[n].Load() <= since {
			if time.Now().After(deadline) {
				t.Fatalf("member %d committed nothing within 60s", n+1)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	busy(0, 0)
	stopB := b.start(cfg(1, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))))
	busy(1, 0)
	busy(0, committed[0].Load()+3) // A's lanes busy on the partitions it kept
	from := logs.Len()
	if err := stopB(); err != nil {
		t.Fatal(err)
	}
	// A is given B's partitions back and claims them with its lanes busy.
	deadline := time.Now().Add(60 * time.Second)
	for {
		claimed := 0
		for _, e := range logs.All()[from:] {
			if e.Message == consumer.MsgClaimed {
				claimed++
			}
		}
		if claimed >= 8 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("A claimed %d partitions within 60s of B's stop, want 8", claimed)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, e := range logs.All()[from:] {
		if e.Message == consumer.MsgClaimFailed {
			t.Errorf("A's claim of partition %v failed while its lanes were busy: %v", e.ContextMap()["partition"], e.ContextMap()["error"])
		}
	}
	slow.Store(false)
	b.waitDone(90 * time.Second)
	b.check()
}
