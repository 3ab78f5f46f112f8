package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/sink"
)

// When another claim holds the partition behind this worker's back, the
// worker's next batch is rejected and rolls back, and the lane stops
// processing (paused, buffer dropped). The coordinator still gives this
// member the partition, so the lane tries to claim it again, in vain while
// the other claim holds, and says so: a stalled hold with the reason. Once
// that claim is gone (here an operator removes the bogus row), the lane
// claims again by itself, within seconds, and goes on from the stored offset.
// (Removing the row instead would be a database that lost its record of the
// partition: TestRowLostUnderARunningLaneIsHeldAsDiverged.)
func TestFencedLaneStallsThenRecovers(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	b.produce(20, oneKey)
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
	key := b.key(0)
	f, _ := b.usurp(0)
	b.produce(30, oneKey)
	waitForCond(t, 30*time.Second, "the batch to be fenced", func() bool { return c.Stats().BatchesFenced >= 1 })
	waitForCond(t, 10*time.Second, "the partition to be paused", func() bool {
		return len(c.Client().PauseFetchPartitions(nil)[b.topic]) == 1
	})
	waitForCond(t, 30*time.Second, "the stall to be recorded", func() bool {
		h, err := b.store.OpenHold(context.Background(), key)
		return err == nil && h.Kind == sink.HoldStalled && strings.Contains(h.Reason, "usurper")
	})
	if n := c.Stats().BatchesFenced; n != 1 {
		t.Errorf("%d batches fenced, want exactly 1 (the lane claims, it does not try batches)", n)
	}
	if n := logs.FilterMessage("batch rejected: fenced; dropping this partition's buffered records and checking whether this member still holds it").Len(); n != 1 {
		t.Errorf("%d rejections logged, want 1", n)
	}
	if n := b.ledgerRows(); n != 20 {
		t.Errorf("ledger has %d rows, want 20 (the rejected batch rolled back)", n)
	}
	if row, _ := b.store.Get(context.Background(), key); row.Owner != "usurper" || row.NextOffset != 20 {
		t.Errorf("fencing row moved: %+v", row)
	}

	// The bogus claim goes (the row is put back as it was); the lane claims
	// again and finishes the jobs.
	if _, err := b.pool.Exec(context.Background(), `UPDATE "`+b.schema+`".fences SET incarnation = $1, epoch = $2, owner = $3, claim_id = $4`,
		f.Token.Incarnation, f.Token.Epoch, f.Owner, f.ClaimID); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	b.waitDone(30 * time.Second)
	t.Logf("recovered %s after the bogus claim was removed", time.Since(start).Round(time.Millisecond))
	if n := b.ledgerRows(); n != 50 {
		t.Errorf("ledger has %d rows, want 50", n)
	}
	if st := c.Stats(); st.Recoveries != 1 || st.Stalled != 0 {
		t.Errorf("stats: %d recoveries, %d stalled; want 1 and 0", st.Recoveries, st.Stalled)
	}
	if _, err := b.store.OpenHold(context.Background(), key); !errors.Is(err, pgx.ErrNoRows) {
		t.Errorf("the stall is still recorded after the recovery: %v", err)
	}
	if err := ctx.Err(); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}

// An operator moves the stored offset past jobs the lane has buffered (or
// any commit the lane did not know of lands): its next commit meets an
// offset mismatch. The member still holds the partition, so the lane claims
// again at once, reads the stored offset and goes on from there, instead of
// waiting for a rebalance that may never come.
func TestLaneRecoversFromAnOffsetMismatch(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	b.produce(10, oneKey)
	c, stop := runNew(t, b.config(ledger(t, b.schema), zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))))
	defer stop() //nolint:errcheck
	b.waitDone(60 * time.Second)
	if _, err := b.pool.Exec(context.Background(), `UPDATE "`+b.schema+`".fences SET next_offset = next_offset + 5`); err != nil {
		t.Fatal(err)
	}
	b.produce(20, oneKey) // offsets 10-29; 10-14 skipped by the operator
	b.waitDone(30 * time.Second)
	if n := b.ledgerRows(); n != 25 {
		t.Errorf("ledger has %d rows, want 25 (30 jobs, 5 skipped by the operator)", n)
	}
	if st := c.Stats(); st.Recoveries != 1 || st.BatchesFenced != 1 {
		t.Errorf("stats: %d recoveries, %d batches fenced; want 1 and 1", st.Recoveries, st.BatchesFenced)
	}
}

// usurp claims partition p in Postgres behind its lane's back, for owner
// "usurper" with a token ten epochs above the stored one, and returns the
// fencing row as it was and the usurper's token.
func (b *bundle) usurp(p int32) (was sink.Fence, usurper sink.Token) {
	b.t.Helper()
	key := b.key(p)
	was, err := b.store.Get(context.Background(), key)
	if err != nil {
		b.t.Fatal(err)
	}
	usurper = sink.Token{Incarnation: was.Token.Incarnation, Epoch: was.Token.Epoch + 10}
	if _, err := b.store.Claim(context.Background(), sink.ClaimRequest{Partition: key, Token: usurper, Owner: "usurper", PartitionCount: b.parts}); err != nil {
		b.t.Fatal(err)
	}
	return was, usurper
}

func (b *bundle) ledgerRows() int {
	b.t.Helper()
	var rows int
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM "`+b.schema+`".ledger`).Scan(&rows); err != nil {
		b.t.Fatal(err)
	}
	return rows
}

func waitForCond(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal(fmt.Sprintf("timed out after %s waiting for %s", timeout, what))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
