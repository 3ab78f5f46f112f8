package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/sink"
)

// When another owner claims the partition behind this worker's back, the
// worker's next batch is rejected, its effects roll back, and the worker
// stops processing the partition (paused, buffer dropped) instead of trying
// batch after batch.
func TestFencedLaneStopsAndStaysPaused(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	b.produce(20, func(i int) string { return "k" })
	core, logs := observer.New(zap.DebugLevel)
	cfg := b.config(ledger(t, b.schema), zap.New(core))
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx) }()
	defer func() {
		cancel()
		select {
		case <-errc:
		case <-time.After(60 * time.Second):
			t.Error("consumer did not stop")
		}
	}()
	b.waitDone(60 * time.Second)

	// Someone with a higher token claims the partition in Postgres.
	key := sink.Partition{Group: b.group, Topic: b.topic, Partition: 0}
	f, err := b.store.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Claim(context.Background(), sink.ClaimRequest{Partition: key,
		Token: sink.Token{Incarnation: f.Token.Incarnation, Epoch: f.Token.Epoch + 10}, Owner: "usurper", PartitionCount: 1}); err != nil {
		t.Fatal(err)
	}
	b.produce(30, func(i int) string { return "k" })
	waitForCond(t, 30*time.Second, "the batch to be fenced", func() bool { return c.Stats().BatchesFenced >= 1 })
	waitForCond(t, 10*time.Second, "the partition to be paused", func() bool {
		return len(c.Client().PauseFetchPartitions(nil)[b.topic]) == 1
	})
	b.produce(30, func(i int) string { return "k" })
	// Nothing more is attempted for the partition: one rejection, no commit
	// after it, the ledger still at the first 20 jobs.
	time.Sleep(500 * time.Millisecond) // give a wrongly running lane the chance to try again
	if n := c.Stats().BatchesFenced; n != 1 {
		t.Errorf("%d batches fenced, want exactly 1", n)
	}
	if n := logs.FilterMessage("batch rejected: fenced; dropping this partition's buffered records until it is assigned again").Len(); n != 1 {
		t.Errorf("%d rejections logged, want 1", n)
	}
	var rows int
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM "`+b.schema+`".ledger`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 20 {
		t.Errorf("ledger has %d rows, want 20 (the rejected batch rolled back)", rows)
	}
	row, _ := b.store.Get(context.Background(), key)
	if row.Owner != "usurper" || row.NextOffset != 20 {
		t.Errorf("fencing row moved: %+v", row)
	}
	if err := ctx.Err(); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}

func waitForCond(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal(fmt.Sprintf("timed out after %s waiting for %s", timeout, what))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
