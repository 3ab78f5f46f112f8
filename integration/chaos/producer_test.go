package chaos

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tenure-dev/tenure/partition"
)

// job is one job the producer wrote and the broker acknowledged.
type job struct {
	Seq       int64
	Key       string
	Fault     string // "", "error" or "panic"
	Marker    bool
	Partition int32
	Offset    int64
}

// jobValue is a job's JSON value. Fault jobs carry the field the workers'
// --inject-faults handler reacts to.
type jobValue struct {
	Seq    int64  `json:"seq"`
	Key    string `json:"key"`
	Marker bool   `json:"marker,omitempty"`
	Fault  string `json:"tenure-fault,omitempty"`
}

// producer writes keyed jobs at a steady rate with an idempotent kgo
// producer (acks=all, retries without limit), and records where each
// acknowledged job landed. It partitions the jobs itself, with
// partition.For (murmur2, what the workers and every tenure tool compute)
// over the partition count it was told (kgo's ManualPartitioner), so that
// the moment it moves to a grown topic's count is the harness's, not
// whenever kgo's metadata refresh comes (add-partitions).
type producer struct {
	cl        *kgo.Client
	topic     string
	nkeys     int
	faultRate float64

	seq atomic.Int64

	mu       sync.Mutex
	n        int32    // the partition count jobs are spread over
	keys     []string // the jobs' keys
	keyOf    []string // keyOf[p]: a key that maps onto partition p
	skip     int32    // a partition the steady jobs leave alone (offsets-reset idle), or -1
	acked    []job
	failed   []string // produce errors (a job that may or may not be in the log)
	inflight sync.WaitGroup

	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}
}

// chaosKeys returns n keys, extended until every partition has at least one.
func chaosKeys(n int, partitions int32) (keys, keyOf []string) {
	keyOf = make([]string, partitions)
	covered := 0
	for i := 0; i < n || covered < int(partitions); i++ {
		if i > 10_000 {
			panic("cannot cover every partition with keys")
		}
		k := fmt.Sprintf("key-%03d", i)
		p := partition.For([]byte(k), partitions)
		if keyOf[p] == "" {
			keyOf[p] = k
			covered++
		}
		keys = append(keys, k)
	}
	return keys, keyOf
}

func newProducer(brokers []string, topic string, partitions int32, nkeys int) (*producer, error) {
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(brokers...),
		kgo.DefaultProduceTopic(topic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()), // record.Partition, set from partition.For
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(5*time.Millisecond),
	)
	if err != nil {
		return nil, err
	}
	keys, keyOf := chaosKeys(nkeys, partitions)
	return &producer{cl: cl, topic: topic, nkeys: nkeys, n: partitions, keys: keys, keyOf: keyOf, skip: -1, faultRate: 0.01,
		stop: make(chan struct{}), done: make(chan struct{})}, nil
}

// count is the partition count the jobs are spread over.
func (p *producer) count() int32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

// grow spreads the jobs over n partitions from now on, once the client's
// metadata has them (it refuses a record for a partition it does not know):
// it refreshes the metadata until partition n-1 has a leader, within
// timeout.
func (p *producer) grow(ctx context.Context, n int32) error {
	for {
		p.cl.ForceMetadataRefresh()
		if leader, _, _ := p.cl.PartitionLeader(p.topic, n-1); leader >= 0 {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the producer's metadata did not show partition %d of %s: %w", n-1, p.topic, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	keys, keyOf := chaosKeys(p.nkeys, n)
	p.mu.Lock()
	p.n, p.keys, p.keyOf = n, keys, keyOf
	p.mu.Unlock()
	return nil
}

// setSkip makes the steady jobs leave partition part alone (-1: none);
// markers and bursts still go to it.
func (p *producer) setSkip(part int32) {
	p.mu.Lock()
	p.skip = part
	p.mu.Unlock()
}

// record is j's record, on the partition partition.For gives its key over
// n partitions.
func (p *producer) record(j job, n int32) *kgo.Record {
	v, _ := json.Marshal(jobValue{Seq: j.Seq, Key: j.Key, Marker: j.Marker, Fault: j.Fault})
	return &kgo.Record{Topic: p.topic, Key: []byte(j.Key), Value: v, Partition: partition.For([]byte(j.Key), n)}
}

func (p *producer) produce(j job, n int32) {
	p.inflight.Add(1)
	p.cl.Produce(context.Background(), p.record(j, n), func(r *kgo.Record, err error) {
		defer p.inflight.Done()
		p.mu.Lock()
		defer p.mu.Unlock()
		if err != nil {
			p.failed = append(p.failed, fmt.Sprintf("seq %d key %s: %v", j.Seq, j.Key, err))
			return
		}
		j.Partition, j.Offset = r.Partition, r.Offset
		p.acked = append(p.acked, j)
	})
}

// run produces rate jobs per second until stopped. Keys and faults come from
// rng (the run's seed).
func (p *producer) run(rate int, rng *rand.Rand) {
	defer close(p.done)
	const tick = 20 * time.Millisecond
	perTick := float64(rate) * tick.Seconds()
	t := time.NewTicker(tick)
	defer t.Stop()
	owed := 0.0
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
		owed += perTick
		p.mu.Lock()
		n, keys, skip := p.n, p.keys, p.skip
		p.mu.Unlock()
		for ; owed >= 1; owed-- {
			key := keys[rng.IntN(len(keys))]
			for skip >= 0 && partition.For([]byte(key), n) == skip {
				key = keys[rng.IntN(len(keys))] // keys cover every partition: another one comes
			}
			j := job{Seq: p.seq.Add(1), Key: key}
			if rng.Float64() < p.faultRate {
				j.Fault = "error"
				if rng.IntN(2) == 0 {
					j.Fault = "panic"
				}
			}
			p.produce(j, n)
		}
	}
}

// mark produces one plain job to every partition and returns their offsets
// once acknowledged: a partition has processed everything up to the mark
// when its stored next offset is past it.
func (p *producer) mark(ctx context.Context) (map[int32]int64, error) {
	p.mu.Lock()
	n, keyOf := p.n, p.keyOf
	p.mu.Unlock()
	recs := make([]*kgo.Record, n)
	jobs := make([]job, n)
	for i := range recs {
		jobs[i] = job{Seq: p.seq.Add(1), Key: keyOf[i], Marker: true}
		recs[i] = p.record(jobs[i], n)
	}
	res := p.cl.ProduceSync(ctx, recs...)
	out := map[int32]int64{}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range res {
		// Results come in completion order, not in the order given.
		i := slices.Index(recs, r.Record)
		if i < 0 {
			return nil, fmt.Errorf("marker result for a record that was not produced")
		}
		if r.Err != nil {
			p.failed = append(p.failed, fmt.Sprintf("marker seq %d: %v", jobs[i].Seq, r.Err))
			continue
		}
		jobs[i].Partition, jobs[i].Offset = r.Record.Partition, r.Record.Offset
		p.acked = append(p.acked, jobs[i])
		out[r.Record.Partition] = r.Record.Offset
	}
	if err := res.FirstErr(); err != nil {
		return nil, err
	}
	for i := int32(0); i < n; i++ {
		if _, ok := out[i]; !ok {
			return nil, fmt.Errorf("marker for partition %d landed elsewhere (key %s): partitioner mismatch", i, keyOf[i])
		}
	}
	return out, nil
}

// burst produces n plain jobs to partition part (keys that map onto it,
// picked with rng) and returns them in offset order once acknowledged: they
// are tracked like every other job (snapshot). A job that failed is
// recorded as a produce error and left out.
func (p *producer) burst(ctx context.Context, part int32, n int, rng *rand.Rand) ([]job, error) {
	p.mu.Lock()
	pn, all := p.n, p.keys
	p.mu.Unlock()
	var keys []string
	for _, k := range all {
		if partition.For([]byte(k), pn) == part {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("no key maps onto partition %d", part)
	}
	recs := make([]*kgo.Record, n)
	jobs := make([]job, n)
	for i := range recs {
		jobs[i] = job{Seq: p.seq.Add(1), Key: keys[rng.IntN(len(keys))]}
		recs[i] = p.record(jobs[i], pn)
	}
	res := p.cl.ProduceSync(ctx, recs...)
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []job
	for _, r := range res {
		i := slices.Index(recs, r.Record) // results come in completion order
		if i < 0 {
			return nil, fmt.Errorf("burst result for a record that was not produced")
		}
		if r.Err != nil {
			p.failed = append(p.failed, fmt.Sprintf("burst seq %d key %s: %v", jobs[i].Seq, jobs[i].Key, r.Err))
			continue
		}
		jobs[i].Partition, jobs[i].Offset = r.Record.Partition, r.Record.Offset
		p.acked = append(p.acked, jobs[i])
		out = append(out, jobs[i])
	}
	slices.SortFunc(out, func(a, b job) int { return cmp.Compare(a.Offset, b.Offset) })
	for _, j := range out {
		if j.Partition != part {
			return out, fmt.Errorf("burst job seq %d (key %s) landed on partition %d, not %d: partitioner mismatch", j.Seq, j.Key, j.Partition, part)
		}
	}
	return out, res.FirstErr()
}

// halt stops the producing loop (idempotent) and waits for it.
func (p *producer) halt() {
	p.stopOnce.Do(func() { close(p.stop) })
	<-p.done
}

// finish stops producing and waits (bounded) until every job is settled.
func (p *producer) finish(timeout time.Duration) error {
	p.halt()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := p.cl.Flush(ctx); err != nil {
		return fmt.Errorf("flushing the producer: %w", err)
	}
	p.inflight.Wait()
	return nil
}

func (p *producer) snapshot() (acked []job, failed []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]job(nil), p.acked...), append([]string(nil), p.failed...)
}

// ackedEnd is, per partition, one past the highest acknowledged offset.
func (p *producer) ackedEnd() map[int32]int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[int32]int64{}
	for _, j := range p.acked {
		if j.Offset+1 > out[j.Partition] {
			out[j.Partition] = j.Offset + 1
		}
	}
	return out
}
