package consumer_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/internal/fence"
	"github.com/tenure-dev/tenure/internal/history"
	"github.com/tenure-dev/tenure/sink"
)

// The paths around the claim where a partition could move on without anyone
// being told: a log that changes under a running lane, a database restored
// from before a partition's first claim, a mirror commit Kafka refused, the
// offsets an operator's acknowledgement leaves behind. Each test here failed
// on the code before log epochs (migration 013) and the lane's log checks.

// heldAs waits for the partition's open hold of kind.
func (b *bundle) heldAs(key sink.Partition, kind sink.HoldKind, timeout time.Duration) sink.Hold {
	b.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		holds, err := b.store.OpenHolds(context.Background(), key.Group)
		if err != nil {
			b.t.Fatal(err)
		}
		for _, o := range holds {
			if o.Partition == key && o.Kind == kind {
				return o
			}
		}
		if time.Now().After(deadline) {
			f, _ := b.store.Get(context.Background(), key)
			b.t.Fatalf("partition not held as %s within %s (open holds %+v, row %s at %d)", kind, timeout, holds, f.Partition, f.NextOffset)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// mirrored returns the group's committed offset in Kafka for partition 0,
// with its metadata.
func (b *bundle) mirrored() (int64, string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	os, err := kadm.NewClient(b.cl).FetchOffsets(ctx, b.group)
	if err != nil {
		return -1, ""
	}
	o, ok := os.Lookup(b.topic, 0)
	if !ok {
		return -1, ""
	}
	return o.At, o.Metadata
}

func (b *bundle) waitMirrored(at int64, metadata string) {
	b.t.Helper()
	waitForCond(b.t.(*testing.T), 30*time.Second, fmt.Sprintf("Kafka's committed offset to be %d (%s)", at, metadata), func() bool {
		o, m := b.mirrored()
		return o == at && (metadata == "" || m == metadata)
	})
}

// runMirrored runs a consumer of cfg until every job is processed and
// Kafka's committed offset is at (with metadata, unless "").
func (b *bundle) runMirrored(t *testing.T, cfg consumer.Config, at int64, metadata string) (stop func() error) {
	t.Helper()
	_, stop = runNew(t, cfg)
	b.waitDone(60 * time.Second)
	b.waitMirrored(at, metadata)
	return stop
}

// ranAndStopped is a one-partition group whose n jobs a consumer of its
// config (returned) processed and mirrored, in log epoch 0, and stopped.
func ranAndStopped(t *testing.T, n int) (*bundle, consumer.Config) {
	t.Helper()
	b := setup(t, 1)
	b.produce(n, oneKey)
	cfg := b.quietLedger(t)
	if err := b.runMirrored(t, cfg, int64(n), "tenure/log-epoch=0")(); err != nil {
		t.Fatal(err)
	}
	return b, cfg
}

// quietLedger is a config of the ledger handler that logs errors only.
func (b *bundle) quietLedger(t *testing.T) consumer.Config {
	return b.config(ledger(t, b.schema), zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel)))
}

// key is partition p of b's group and topic.
func (b *bundle) key(p int32) sink.Partition {
	return sink.Partition{Group: b.group, Topic: b.topic, Partition: p}
}

// oneKey keys every job alike: one partition, in order.
func oneKey(int) string { return "k" }

func (b *bundle) exec(sql string, args ...any) {
	b.t.Helper()
	if _, err := b.pool.Exec(context.Background(), strings.ReplaceAll(sql, "$schema", `"`+b.schema+`"`), args...); err != nil {
		b.t.Fatal(err)
	}
}

// A lane falls behind (a slow handler, fetching paused at its buffer
// bound); DeleteRecords moves the log's start past its fetch position while
// it runs. Before, kgo answered OFFSET_OUT_OF_RANGE by resuming at the new
// start, and the lane's next batch committed from its stored offset to past
// the gap: the deleted jobs were skipped with no hold and JobsLost 0. Now the
// lane commits what it had fetched, then holds the partition as
// log-truncated, naming the jobs lost, and goes on from the log's start
// once acknowledged.
func TestLogTruncatedUnderALaggingLaneIsHeld(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	// One record batch per job, of incompressible 2 KB values: a fetch
	// (16 KiB per partition) returns a few of them, so the lane's buffer
	// bound pauses fetching well before the end of the log.
	for i := range 100 {
		pad := make([]byte, 1000)
		_, _ = rand.Read(pad)
		b.produceValues(1, oneKey, func(int) string { return fmt.Sprintf(`{"i":%d,"pad":"%x"}`, i, pad) })
	}
	inner := ledger(t, b.schema)
	slow := consumer.HandlerFunc(func(ctx context.Context, tx consumer.Tx, batch *consumer.Batch) error {
		time.Sleep(150 * time.Millisecond)
		return inner.Handle(ctx, tx, batch)
	})
	cfg := b.config(slow, zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)))
	cfg.BatchMax = 5
	cfg.PartitionBufferBytes = 64 << 10
	c, _ := runNew(t, cfg)
	key := b.key(0)
	ctx := context.Background()
	waitForCond(t, 30*time.Second, "the lane to be under way", func() bool {
		f, err := b.store.Get(ctx, key)
		return err == nil && f.NextOffset >= 5
	})
	var o kadm.Offsets
	o.Add(kadm.Offset{Topic: b.topic, Partition: 0, At: 70})
	if _, err := kadm.NewClient(b.cl).DeleteRecords(ctx, o); err != nil {
		t.Fatal(err)
	}
	h := b.heldAs(key, sink.HoldLogTruncated, 30*time.Second)
	f, err := b.store.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("held at next offset %d: %s", h.NextOffset, h.Reason)
	if h.LogStart != 70 || h.NextOffset != f.NextOffset || h.NextOffset >= 70 {
		t.Fatalf("hold %+v against row %+v: want the stored next offset below the log start 70", h, f)
	}
	want := fmt.Sprintf("%d jobs (offsets %d to 69) were deleted", 70-h.NextOffset, h.NextOffset)
	if !strings.Contains(h.Reason, want) {
		t.Errorf("the hold does not name the jobs lost (%q): %s", want, h.Reason)
	}
	if n := b.ledgerRows(); int64(n) != h.NextOffset {
		t.Fatalf("%d jobs committed, want exactly those below the stored next offset %d: a commit crossed the gap", n, h.NextOffset)
	}
	if got := c.Stats().JobsLost; got != 70-h.NextOffset {
		t.Errorf("JobsLost = %d, want %d", got, 70-h.NextOffset)
	}
	if _, err := b.store.AcknowledgeHold(ctx, key, "ops", 70, 100, [16]byte{}); err != nil {
		t.Fatal(err)
	}
	b.waitDone(60 * time.Second)
	if n := b.ledgerRows(); int64(n) != h.NextOffset+30 {
		t.Errorf("%d jobs committed, want %d (those before the hold and the 30 after the log's start)", n, h.NextOffset+30)
	}
	hist, err := history.Load(ctx, b.pool, b.schema, b.group, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range history.CheckLog(hist.Log, hist.Fences) {
		t.Errorf("violation: %s", v)
	}
}

// The group ran and Kafka's mirror reached 20; the database comes back from
// a backup taken before the partition's first claim: no fencing row, no
// fence log, none of the jobs' effects. Before, the next claim started at
// the mirrored offset (a missing row read as "never processed here"): the
// effects of jobs 0-19 were lost without a word. Now the mirror, written by
// tenure, says the partition was processed here, and the claim holds it as
// diverged; acknowledged, it processes the jobs again from the log's start.
func TestRestoreFromBeforeTheFirstClaimIsHeld(t *testing.T) {
	t.Parallel()
	eachParallel(t, []string{"at the claim", "while the lane runs"}, func(t *testing.T, when string) {
		b := setup(t, 1)
		b.produce(20, oneKey)
		cfg := b.quietLedger(t)
		stop := b.runMirrored(t, cfg, 20, "tenure/log-epoch=0")
		if when == "at the claim" {
			if err := stop(); err != nil {
				t.Fatal(err)
			}
		}
		b.exec(`DELETE FROM $schema.fences; DELETE FROM $schema.fence_log; DELETE FROM $schema.ledger`)
		b.produce(5, oneKey)
		if when == "at the claim" {
			runNew(t, cfg)
		}
		key := b.key(0)
		h := b.heldAs(key, sink.HoldDiverged, 30*time.Second)
		if h.NextOffset != 0 || h.AckedOffset != 20 {
			t.Errorf("hold %+v: want the database's 0 (nothing processed) against the acknowledged 20", h)
		}
		time.Sleep(time.Second) // a lane that went on anyway would commit meanwhile
		if n := b.ledgerRows(); n != 0 {
			t.Fatalf("the held partition was processed: %d ledger rows", n)
		}
		if _, err := b.store.AcknowledgeHold(context.Background(), key, "ops", 0, 25, [16]byte{}); err != nil {
			t.Fatal(err)
		}
		b.waitDone(30 * time.Second)
		if n := b.ledgerRows(); n != 25 {
			t.Errorf("%d ledger rows after the acknowledgement, want 25 (every job once)", n)
		}
	})
}

// A group moving to tenure from plain Kafka offsets: the offset another
// client committed is where a partition Postgres has never seen starts, as
// before; only offsets tenure's mirror committed mean the database should
// have known the partition.
func TestKafkaOffsetsOfAnotherClientAreAdopted(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	b.produce(20, oneKey)
	var o kadm.Offsets
	o.Add(kadm.Offset{Topic: b.topic, Partition: 0, At: 12, LeaderEpoch: -1, Metadata: "some other consumer"})
	if _, err := kadm.NewClient(b.cl).CommitOffsets(context.Background(), b.group, o); err != nil {
		t.Fatal(err)
	}
	runNew(t, b.quietLedger(t))
	b.waitDone(60 * time.Second)
	if n := b.ledgerRows(); n != 8 {
		t.Errorf("%d jobs processed, want 8 (from the group's committed 12)", n)
	}
	if holds, _ := b.store.OpenHolds(context.Background(), b.group); len(holds) != 0 {
		t.Errorf("held: %+v", holds)
	}
}

// Kafka refuses one mirror commit at the partition level (REBALANCE_IN_
// PROGRESS here). Before, the mirror had marked the offset as sent before
// Kafka answered and read only the request's error: Kafka stayed behind
// Postgres until another batch committed, and a loss of the jobs in between
// went unseen. Now an offset counts as mirrored only once Kafka accepted it,
// and it is sent again.
func TestMirrorIsSentAgainUntilKafkaAcceptsIt(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	b.produce(10, oneKey)
	b.runMirrored(t, b.quietLedger(t), 10, "")

	var refused atomic.Int32
	b.cluster.ControlKey(int16(kmsg.OffsetCommit), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		b.cluster.KeepControl()
		req := kr.(*kmsg.OffsetCommitRequest)
		if refused.Load() > 0 || len(req.Topics) != 1 || len(req.Topics[0].Partitions) != 1 || req.Topics[0].Partitions[0].Offset != 15 {
			return nil, nil, false
		}
		refused.Add(1)
		return refuseCommit(req, kerr.RebalanceInProgress), nil, true
	})
	b.produce(5, oneKey)
	b.waitDone(30 * time.Second)
	waitForCond(t, 30*time.Second, "Kafka to refuse the mirror's commit of 15", func() bool { return refused.Load() == 1 })
	b.waitMirrored(15, "")
}

// An operator acknowledges an ahead-of-log hold: the stored offset goes down
// (40 to 36) while Kafka's mirror still says 40. Before, the next claim
// compared the two, found the database "behind what the group had
// acknowledged" and held the partition as diverged, a false positive. The
// acknowledgement started a new log epoch, and offsets of two log epochs are
// not compared.
func TestNoDivergenceAfterAnAheadOfLogAcknowledgement(t *testing.T) {
	t.Parallel()
	b, cfg := ranAndStopped(t, 40)
	key := b.key(0)
	ctx := context.Background()
	f, err := b.store.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	// As a worker records it when it finds the log ending at 36.
	if err := fence.Of(b.store).HoldPartition(ctx, sink.Hold{Partition: key, Kind: sink.HoldAheadOfLog, Reason: "the log ends at 36", Owner: f.Owner,
		Token: f.Token, NextOffset: 40, LogStart: 0, HighWatermark: 36, From: -1, To: -1, AckedOffset: -1}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.AcknowledgeHold(ctx, key, "ops", 0, 40, [16]byte{}); err != nil {
		t.Fatal(err)
	}
	b.produce(10, oneKey)
	c, _ := runNew(t, cfg)
	b.waitDone(30 * time.Second)
	if holds, _ := b.store.OpenHolds(ctx, b.group); len(holds) != 0 {
		t.Fatalf("held after the acknowledgement: %+v", holds)
	}
	if st := c.Stats(); st.Divergences != 0 {
		t.Errorf("%d divergences counted", st.Divergences)
	}
	b.waitMirrored(50, "tenure/log-epoch=1")
}

// An operator accepts a divergence (the database at 12, acknowledged 20);
// the jobs run again and the mirror is back at 20. Then the database loses
// commits a second time, back to 15. Before, the acceptance covered every
// offset up to 20 in the partition's whole history, and this second loss
// went unseen. The acceptance started a new log epoch: the mirror's 20 of
// that epoch is compared again.
func TestSecondLossAfterAnAcceptedDivergenceIsHeld(t *testing.T) {
	t.Parallel()
	b, cfg := ranAndStopped(t, 20)
	start := func() func() error {
		_, stop := runNew(t, cfg)
		return stop
	}
	key := b.key(0)
	ctx := context.Background()
	b.exec(`UPDATE $schema.fences SET next_offset = 12`)
	stop := start()
	if h := b.heldAs(key, sink.HoldDiverged, 30*time.Second); h.NextOffset != 12 || h.AckedOffset != 20 {
		t.Fatalf("first loss: hold %+v", h)
	}
	if _, err := b.store.AcknowledgeHold(ctx, key, "ops", -1, -1, [16]byte{}); err != nil {
		t.Fatal(err)
	}
	b.waitDone(30 * time.Second)
	b.waitMirrored(20, "tenure/log-epoch=1")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	b.exec(`UPDATE $schema.fences SET next_offset = 15`)
	start()
	if h := b.heldAs(key, sink.HoldDiverged, 30*time.Second); h.NextOffset != 15 || h.AckedOffset != 20 {
		t.Fatalf("second loss: hold %+v", h)
	}
}
