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

// A claim that cannot take its fencing row (here a lock held by a session
// that is no tenure claimant, so the claim may not end it) is that
// partition's trouble alone. It used to wait out the claim timeout and
// return an error, which made kgo abandon the whole group session and
// rejoin: the partitions claimed after it in the same assignment were never
// claimed, and the member rejoined every claim timeout. Now the partition
// is held as stalled with the reason, the others are processed, the
// session stays, and once the lock is gone the lane claims it by itself.
func TestAStuckClaimStaysThatPartitionsTrouble(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	b.produce(80, func(i int) string { return fmt.Sprintf("k%d", i) })
	ctx := context.Background()
	p0 := sink.Partition{Group: b.group, Topic: b.topic, Partition: 0}
	// A fencing row for partition 0 (an older claim, token 0.0), locked by
	// a session of another program.
	if _, err := b.store.Claim(ctx, sink.ClaimRequest{Partition: p0, Token: sink.Token{}, Owner: "ghost", ClaimID: 1, PartitionCount: 4}); err != nil {
		t.Fatal(err)
	}
	tx := b.lockFenceRow(ctx, 0)
	defer func() { _ = tx.Rollback(ctx) }()

	core, logs := observer.New(zap.InfoLevel)
	cfg := b.config(ledger(t, b.schema), zap.New(core))
	cfg.ClaimTimeout = 6 * time.Second
	stop := b.start(cfg)
	b.waitProcessed(30*time.Second, "partitions 1-3 to be processed", func(p int32) bool { return p != 0 }, 3)
	var held sink.Hold
	waitForCond(t, 20*time.Second, "partition 0 to be held as stalled", func() bool {
		h, err := b.store.OpenHold(ctx, p0)
		held = h
		return err == nil && h.Kind == sink.HoldStalled
	})
	if !strings.Contains(held.Reason, "stayed locked") {
		t.Errorf("the stall's reason does not say what holds the partition: %q", held.Reason)
	}
	// Past the claim timeout: the member kept its session.
	time.Sleep(cfg.ClaimTimeout + 2*time.Second)
	if n := logs.FilterMessage(consumer.MsgPartitionsAssigned).Len(); n != 1 {
		t.Errorf("the member was assigned partitions %d times: a stuck claim made it leave and rejoin", n)
	}

	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	b.waitDone(30 * time.Second)
	if _, err := b.store.OpenHold(ctx, p0); err == nil {
		t.Error("the stall is still recorded after the partition was claimed")
	}
	if logs.FilterMessage(consumer.MsgRecovered).Len() == 0 {
		t.Error("partition 0 was not claimed again by its lane")
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	b.check()
}
