package consumer_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/tenure-dev/tenure/consumer"
)

// A BatchesHandler call that outlives HandlerTimeout fails like any other
// failed call: it is rolled back and each of its batches runs again alone,
// through Handle, so every job still commits exactly once. Three ways to
// time out: returning at the deadline, being stuck in a statement when it
// comes (the timeout breaks the connection, and the transaction with it),
// and ignoring the context altogether.
func TestCommitSpanBatchesCallThatTimesOut(t *testing.T) {
	t.Parallel()
	const timeout = 400 * time.Millisecond
	stuck := map[string]func(ctx context.Context, tx consumer.Tx) error{
		"returns at its deadline": func(ctx context.Context, _ consumer.Tx) error {
			<-ctx.Done()
			return ctx.Err()
		},
		"in a statement at its deadline": func(ctx context.Context, tx consumer.Tx) error {
			_, err := tx.Exec(ctx, `SELECT pg_sleep(30)`)
			return err
		},
		"ignores its context": func(context.Context, consumer.Tx) error {
			time.Sleep(timeout + 200*time.Millisecond)
			return nil
		},
	}
	for name, hang := range stuck {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 6)
			b.produce(600, func(i int) string { return fmt.Sprintf("k%d", i%31) })
			inner := ledger(t, b.schema).(consumer.BatchesHandler)
			var calls atomic.Int64
			var mu sync.Mutex
			seen := map[string]bool{} // the batches calls took
			again := 0                // batches a call took after one had failed with them
			h := &batchesFunc{
				handle: inner.Handle,
				batches: func(ctx context.Context, tx consumer.Tx, batches []*consumer.Batch) error {
					calls.Add(1)
					mu.Lock()
					for _, b := range batches {
						k := fmt.Sprintf("%d@%d", b.Partition, b.From)
						if seen[k] {
							again++
						}
						seen[k] = true
					}
					mu.Unlock()
					if err := inner.HandleBatches(ctx, tx, batches); err != nil {
						return err
					}
					return hang(ctx, tx)
				},
			}
			log, logs := observedLogger(t, zap.WarnLevel)
			cfg := b.jointConfig(h, log, 6, 3)
			cfg.HandlerTimeout = timeout
			stop := b.start(cfg)
			b.waitDone(60 * time.Second)
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			if calls.Load() == 0 {
				t.Fatal("no HandleBatches call: the test did not test it")
			}
			mu.Lock()
			if again != 0 {
				t.Errorf("%d batches went into another call after their call timed out: want each to run alone", again)
			}
			mu.Unlock()
			if h := b.check(); len(h.Writes) != 600 {
				t.Fatalf("ledger has %d rows, want 600", len(h.Writes))
			}
			if n := logs.FilterMessageSnippet("dead-letter").Len(); n != 0 {
				t.Errorf("%d dead-letter messages: a timed-out call must not cost a job", n)
			}
			t.Logf("%d calls with several batches, all timed out", calls.Load())
		})
	}
}
