package consumer_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/sink"
)

// A handler that waits on a row lock held by someone else (a worker frozen
// mid-transaction, say) is not failing its job: the wait ends as a
// lock_timeout error, which is retried without counting, and the job
// commits once the lock is gone. Without that, the handler timeout would
// dead-letter a good job.
func TestLockWaitsAreNotTheJobsFault(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	ctx := context.Background()
	b.exec(`CREATE TABLE $schema.counters (k text PRIMARY KEY, n int NOT NULL)`)
	b.exec(`INSERT INTO $schema.counters VALUES ('k', 0)`)
	// The "zombie": holds the row lock for a while.
	zombie, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = zombie.Rollback(context.Background()) }() // released on every path: a failure must not hang the pool's Close
	if _, err := zombie.Exec(ctx, `UPDATE "`+b.schema+`".counters SET n = n WHERE k = 'k'`); err != nil {
		t.Fatal(err)
	}
	released := make(chan struct{})
	go func() {
		time.Sleep(4 * time.Second) // longer than isolating one job and its attempts takes
		_ = zombie.Rollback(ctx)
		close(released)
	}()

	b.produce(5, oneKey)
	h := consumer.HandlerFunc(func(ctx context.Context, tx consumer.Tx, batch *consumer.Batch) error {
		_, err := tx.Exec(ctx, `UPDATE "`+b.schema+`".counters SET n = n + $1 WHERE k = 'k'`, len(batch.Records))
		return err
	})
	core, logs := observer.New(zap.WarnLevel)
	cfg := b.config(h, zap.New(core))
	cfg.RetryBackoffMax = 5 * time.Second // a growing backoff would reach seconds within the 4s wait
	cfg.MaxAttempts = 1
	cfg.HandlerTimeout = 400 * time.Millisecond
	b.runUntilDone(cfg, 30*time.Second)
	<-released
	dls, err := b.store.DeadLetters(ctx, sink.DeadLetterFilter{Group: b.group})
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 0 {
		t.Fatalf("a lock wait dead-lettered %d good jobs: %s", len(dls), dls[0].Error)
	}
	var n int
	if err := b.pool.QueryRow(ctx, `SELECT n FROM "`+b.schema+`".counters WHERE k = 'k'`).Scan(&n); err != nil || n != 5 {
		t.Fatalf("counter = %d (%v), want 5: every job exactly once", n, err)
	}
	// Each lock wait is retried after a short fixed delay, not a
	// growing backoff that would keep the partition idle after the lock is
	// free.
	waits := 0
	for _, e := range logs.All() {
		if d, ok := e.ContextMap()["backoff"]; ok && strings.Contains(fmt.Sprint(e.ContextMap()["error"]), "55P03") {
			waits++
			if d != "100ms" && d != 100*time.Millisecond {
				t.Errorf("a lock wait was retried after %v, want 100ms", d)
			}
		}
	}
	if waits < 2 {
		t.Errorf("%d lock waits logged, want several (the lock was held 4s, lock_timeout is 200ms)", waits)
	}
}
