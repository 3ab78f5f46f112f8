package consumer_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/tenure-dev/tenure/consumer"
)

// A backlog a hundred times the worker's buffer is drained with the lanes'
// buffers within their bounds: fetching pauses, so memory does not grow
// with the backlog. Without the pausing the buffer holds the whole backlog.
func TestBuffersStayBoundedWhateverTheBacklog(t *testing.T) {
	b := setup(t, 4)
	pad := strings.Repeat("x", 1000)
	const jobs = 4000 // about 4 MB
	recs := make([]*kgo.Record, jobs)
	for i := range recs {
		recs[i] = &kgo.Record{Topic: b.topic, Key: fmt.Appendf(nil, "k%d", i), Value: fmt.Appendf(nil, `{"i":%d,"p":"%s"}`, i, pad)}
	}
	// Small record batches, so that one fetch is small too (a broker
	// returns at least one whole batch, whatever the fetch's limit).
	produceAll(t, b, kgo.StickyKeyPartitioner(nil), 8<<10, recs, 30*time.Second)
	cfg, handled := b.slowCounting(3*time.Millisecond, 10, 16<<10, 40<<10)
	c, stop := runNew(t, cfg)
	defer func() { _ = stop() }()

	// The bound: the worker's buffer, plus one fetch that lands before the
	// lanes can pause (FetchMaxBytes is at least 64 KiB), plus a batch.
	const bound = 40<<10 + 64<<10 + 8<<10
	var peak int64
	deadline := time.Now().Add(90 * time.Second)
	for handled.Load() < jobs {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d jobs handled within 90s", handled.Load(), jobs)
		}
		peak = max(peak, c.Stats().BufferedBytes)
		time.Sleep(time.Millisecond)
	}
	t.Logf("peak buffered: %d bytes for a backlog of about %d (bound %d)", peak, jobs*1030, bound)
	if peak > bound {
		t.Fatalf("the lanes buffered %d bytes at most, above the bound of %d: memory grows with the backlog", peak, bound)
	}
	if peak == 0 {
		t.Fatal("nothing was ever buffered: the measurement is broken")
	}
}

// The worker's bound holds whatever the partition count: with a thousand
// lanes and a backlog sixteen times the worker's buffer, the lanes never
// hold more than Config.WorkerBufferBytes plus the poll that crossed it,
// counting the batches taken and waiting for a connection (most of them,
// with a thousand lanes and three transactions at once). Pausing only the
// partitions that received records let every other partition bring a
// fetch more, and a batch out of the buffer was out of the count: the
// lanes held most of the backlog. The peak is the consumer's own
// high-water mark, not a sample.
func TestWorkerBufferBoundsAThousandPartitions(t *testing.T) {
	const parts, perPart = 1000, 8
	b := setup(t, parts)
	pad := strings.Repeat("x", 1000)
	recs := make([]*kgo.Record, 0, parts*perPart)
	for p := range int32(parts) {
		for i := range perPart {
			recs = append(recs, &kgo.Record{Topic: b.topic, Partition: p, Key: fmt.Appendf(nil, "k%d-%d", p, i), Value: fmt.Appendf(nil, `{"i":%d,"p":"%s"}`, i, pad)})
		}
	}
	// Small record batches, several per partition: a fetch returns at
	// least one whole batch, whatever its limit.
	produceAll(t, b, kgo.ManualPartitioner(), 4<<10, recs, 60*time.Second)
	cfg, handled := b.slowCounting(2*time.Millisecond, 4, 64<<10, 512<<10)
	cfg.ClaimTimeout = 2 * time.Minute
	c, stop := runNew(t, cfg)
	defer func() { _ = stop() }()

	deadline := time.Now().Add(3 * time.Minute)
	// Every job handled, and the count back to nothing once the last
	// batch is done with (a count that leaked would pause for good).
	for handled.Load() < int64(len(recs)) || c.Stats().BufferedBytes != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d jobs handled within 3m (lanes %d, %d bytes still counted): a partition paused for the worker was never resumed, or the count leaks",
				handled.Load(), len(recs), c.Stats().Lanes, c.Stats().BufferedBytes)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// One poll is at most one response (one broker) of FetchMaxBytes on
	// the wire, 64 KiB here; its records count their kgo.Record too (a
	// sixth more for these), so twice that covers it.
	const bound = 512<<10 + 2*64<<10
	s := c.Stats()
	t.Logf("peak held: %d bytes over %d partitions, for a backlog of about %d bytes (bound %d)", s.BufferedBytesPeak, parts, len(recs)*1030, bound)
	if s.BufferedBytesPeak > bound {
		t.Fatalf("the lanes held %d bytes at most, above the worker's bound of %d: memory grows with the partition count", s.BufferedBytesPeak, bound)
	}
	if s.BufferedBytesPeak < cfg.WorkerBufferBytes {
		t.Fatalf("the lanes held %d bytes at most, never the worker's buffer of %d: the bound was not tested", s.BufferedBytesPeak, cfg.WorkerBufferBytes)
	}
}

// produceAll produces recs to b's broker through a client of its own, with
// partitioner and record batches of at most batchBytes, uncompressed, and
// fails the test unless every one is acknowledged within timeout.
func produceAll(t *testing.T, b *bundle, partitioner kgo.Partitioner, batchBytes int32, recs []*kgo.Record, timeout time.Duration) {
	t.Helper()
	pcl, err := kgo.NewClient(kgo.SeedBrokers(b.brokers...), kgo.RecordPartitioner(partitioner),
		kgo.ProducerBatchMaxBytes(batchBytes), kgo.ProducerBatchCompression(kgo.NoCompression()))
	if err != nil {
		t.Fatal(err)
	}
	defer pcl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := pcl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// slowCounting is the config of a worker with no log whose handler takes
// d per batch of at most batchMax jobs and counts the jobs it was given
// (handled), its lanes' buffers bounded at partitionBytes each and
// workerBytes in all.
func (b *bundle) slowCounting(d time.Duration, batchMax int, partitionBytes, workerBytes int64) (cfg consumer.Config, handled *atomic.Int64) {
	handled = new(atomic.Int64)
	cfg = b.config(consumer.HandlerFunc(func(_ context.Context, _ consumer.Tx, bt *consumer.Batch) error {
		time.Sleep(d)
		handled.Add(int64(len(bt.Records)))
		return nil
	}), zap.NewNop())
	cfg.BatchMax = batchMax
	cfg.PartitionBufferBytes = partitionBytes
	cfg.WorkerBufferBytes = workerBytes
	return cfg, handled
}
