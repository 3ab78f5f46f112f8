package consumer_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/tenure-dev/tenure/sink"
)

// The database can come back behind what its workers had
// acknowledged (a failover to a standby that was behind, a restore from a
// backup). Here the "restore" is done by hand: the stored offset is put back
// below what was committed and mirrored to Kafka. The worker must notice
// before it processes the partition again, hold it as diverged, naming both
// offsets, and go on only once an operator accepts the database's state.
func TestDivergedDatabaseIsHeldUntilAccepted(t *testing.T) {
	t.Parallel()
	eachParallel(t, []string{"at the claim", "while the lane runs"}, func(t *testing.T, when string) {
		b := setup(t, 1)
		b.produce(20, oneKey)
		cfg := b.config(ledger(t, b.schema), zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel)))
		c, stop := runNew(t, cfg)
		b.waitDone(60 * time.Second)
		ctx := context.Background()
		adm := kadm.NewClient(b.cl)
		waitForCond(t, 30*time.Second, "the offsets to be mirrored to Kafka", func() bool {
			os, err := adm.FetchOffsets(ctx, b.group)
			if err != nil {
				return false
			}
			o, ok := os.Lookup(b.topic, 0)
			return ok && o.At == 20
		})
		key := sink.Partition{Group: b.group, Topic: b.topic, Partition: 0}
		if when == "at the claim" {
			if err := stop(); err != nil {
				t.Fatal(err)
			}
		}
		// The database loses the commits after offset 12.
		if _, err := b.pool.Exec(ctx, `UPDATE "`+b.schema+`".fences SET next_offset = 12`); err != nil {
			t.Fatal(err)
		}
		b.produce(5, oneKey)
		if when == "at the claim" {
			c, stop = runNew(t, cfg)
		}
		defer stop() //nolint:errcheck
		var h sink.Hold
		waitForCond(t, 30*time.Second, "the partition to be held as diverged", func() bool {
			var err error
			h, err = b.store.OpenHold(ctx, key)
			return err == nil && h.Kind == sink.HoldDiverged
		})
		if h.NextOffset != 12 || h.AckedOffset < 20 {
			t.Errorf("hold %+v: want the database's 12 against an acknowledged 20 or more", h)
		}
		rows := b.ledgerRows()
		time.Sleep(time.Second) // a lane that went on anyway would commit meanwhile
		if n := b.ledgerRows(); n != rows {
			t.Fatalf("the held partition was processed: %d ledger rows, then %d", rows, n)
		}
		if f, _ := b.store.Get(ctx, key); f.NextOffset != 12 {
			t.Fatalf("the stored offset moved while held: %d", f.NextOffset)
		}
		if _, err := b.store.AcknowledgeHold(ctx, key, "ops", -1, -1, [16]byte{}); err != nil {
			t.Fatal(err)
		}
		b.waitDone(30 * time.Second)
		if st := c.Stats(); st.Divergences < 1 {
			t.Errorf("stats: %d divergences", st.Divergences)
		}
	})
}
