package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/internal/devbroker"
	"github.com/tenure-dev/tenure/internal/testinfra/testdb"
	"github.com/tenure-dev/tenure/metrics"
	"github.com/tenure-dev/tenure/sink"
)

// gather returns the registry's metrics by name.
func gather(t *testing.T, reg *prometheus.Registry) map[string]*dto.MetricFamily {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}

// value is the value of the series of family name whose labels are
// labels ("topic=jobs", "partition=0", ...); -1 if there is none.
func value(fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	mf := fams[name]
	if mf == nil {
		return -1
	}
next:
	for _, m := range mf.Metric {
		have := map[string]string{}
		for _, lp := range m.Label {
			have[lp.GetName()] = lp.GetValue()
		}
		for _, l := range labels {
			k, v, _ := strings.Cut(l, "=")
			if have[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
	}
	return -1
}

// A real consumer on kfake and Postgres: the per-partition counters, the
// histograms and the lag say what it did.
// topicWithJobs starts a broker with a topic of two partitions holding
// jobs records over seven keys, and a client on it.
func topicWithJobs(t *testing.T, ctx context.Context, topic string, jobs int) (*kfake.Cluster, *kgo.Client) {
	t.Helper()
	br, err := devbroker.Start(devbroker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(br.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(br.ListenAddrs()...), kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 2, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	recs := make([]*kgo.Record, jobs)
	for i := range recs {
		recs[i] = &kgo.Record{Topic: topic, Key: []byte(fmt.Sprintf("k%d", i%7)), Value: []byte("v")}
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	return br, cl
}

// waitGathered gathers reg until cond holds, for at most 30s.
func waitGathered(t *testing.T, reg *prometheus.Registry, what string, cond func(map[string]*dto.MetricFamily) bool) map[string]*dto.MetricFamily {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		f := gather(t, reg)
		if cond(f) {
			return f
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The collector on a running consumer: while its handler is held, then
// once every job is committed.
func TestCollectorOnAConsumer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const topic, jobs = "jobs", 60
	br, _ := topicWithJobs(t, ctx, topic, jobs)
	pool := testdb.Pool(t)
	schema := testdb.Schema(t, pool)
	store, err := sink.NewStore(pool, schema)
	if err != nil {
		t.Fatal(err)
	}
	// The lag is read while the handler cannot go on: 60 jobs behind.
	gate := make(chan struct{})
	release := sync.OnceFunc(func() { close(gate) })
	defer release()
	m := metrics.New(metrics.Options{})
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	c, err := consumer.New(m.Instrument(consumer.Config{
		Brokers: br.ListenAddrs(), Group: "g-" + schema, Topics: []string{topic}, Store: store, BatchMax: 10,
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx consumer.Tx, b *consumer.Batch) error {
			select {
			case <-gate:
			case <-ctx.Done():
				return ctx.Err()
			}
			time.Sleep(2 * time.Millisecond)
			return nil
		}),
	}))
	if err != nil {
		t.Fatal(err)
	}
	m.Attach(c)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	t.Run("WhileHandling", func(t *testing.T) {
		f := waitGathered(t, reg, "a running handler and the lag of both partitions", func(f map[string]*dto.MetricFamily) bool {
			return value(f, "tenure_handler_oldest_running_seconds") > 0 &&
				value(f, "tenure_partition_lag", "partition=0")+value(f, "tenure_partition_lag", "partition=1") == jobs
		})
		if v := value(f, "tenure_claims_total", "topic=jobs", "partition=0"); v != 1 {
			t.Errorf("claims_total{partition=0} = %v, want 1", v)
		}
		if v := value(f, "tenure_batches_fenced_total", "topic=jobs", "partition=1"); v != 0 {
			t.Errorf("batches_fenced_total{partition=1} = %v, want a series at 0", v)
		}
		if v := value(f, "tenure_lanes"); v != 2 {
			t.Errorf("lanes = %v, want 2", v)
		}
	})
	t.Run("AfterCommit", func(t *testing.T) {
		release()
		f := waitGathered(t, reg, "every job committed and no lag", func(f map[string]*dto.MetricFamily) bool {
			return value(f, "tenure_records_committed_total", "partition=0")+value(f, "tenure_records_committed_total", "partition=1") == jobs &&
				value(f, "tenure_partition_lag", "partition=0") == 0 && value(f, "tenure_partition_lag", "partition=1") == 0
		})
		batches := value(f, "tenure_batches_committed_total", "partition=0") + value(f, "tenure_batches_committed_total", "partition=1")
		if batches < jobs/10 {
			t.Errorf("%v batches for %d jobs at 10 per batch", batches, jobs)
		}
		if v := value(f, "tenure_handler_duration_seconds", "outcome=ok"); v != batches {
			t.Errorf("handler_duration_seconds{ok} has %v samples, want one per batch (%v)", v, batches)
		}
		if v := value(f, "tenure_commit_duration_seconds", "outcome=committed"); v != batches {
			t.Errorf("commit_duration_seconds{committed} has %v samples, want %v", v, batches)
		}
		if v := value(f, "tenure_end_to_end_latency_seconds"); v != jobs {
			t.Errorf("end_to_end_latency_seconds has %v samples, want %d", v, jobs)
		}
		if v := value(f, "tenure_handler_oldest_running_seconds"); v != 0 {
			t.Errorf("handler_oldest_running_seconds = %v with nothing running", v)
		}
		if v := value(f, "tenure_partition_lag_read_errors_total"); v != 0 {
			t.Errorf("partition_lag_read_errors_total = %v", v)
		}
	})
}

// The hooks' arithmetic, without a broker: a fenced batch is counted and
// its commit timed as fenced; a dead letter's commit (no BeforeCommit) is
// counted but not timed; a failing and a panicking handler are timed with
// their outcome; a rejected claim counts as fenced; the caller's own hooks
// still run.
func TestCollectorHooks(t *testing.T) {
	var seen []string
	m := metrics.New(metrics.Options{})
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	cfg := m.Instrument(consumer.Config{
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx consumer.Tx, b *consumer.Batch) error {
			switch b.From {
			case 1:
				return errors.New("bad job")
			case 2:
				panic("worse job")
			}
			return nil
		}),
		Hooks: consumer.Hooks{
			AfterBatch: func(b *consumer.Batch, err error) { seen = append(seen, "after-batch") },
			AfterClaim: func(p sink.Partition, _ sink.Token, _ int64, err error) { seen = append(seen, "after-claim") },
		},
	})
	p := sink.Partition{Group: "g", Topic: "t", Partition: 3}
	cfg.Hooks.AfterClaim(p, sink.Token{Epoch: 1}, 0, nil)
	cfg.Hooks.AfterClaim(p, sink.Token{Epoch: 1}, -1, &sink.FencedError{Op: "claim"})
	ok := &consumer.Batch{Group: "g", Topic: "t", Partition: 3, From: 0, To: 2, Records: []*kgo.Record{{Timestamp: time.Now()}, {Timestamp: time.Now()}}}
	_ = cfg.Handler.Handle(context.Background(), nil, ok)
	cfg.Hooks.BeforeCommit(context.Background(), ok)
	cfg.Hooks.AfterBatch(ok, nil)
	fenced := &consumer.Batch{Group: "g", Topic: "t", Partition: 3, From: 2, To: 3, Records: []*kgo.Record{{}}}
	cfg.Hooks.BeforeCommit(context.Background(), fenced)
	cfg.Hooks.AfterBatch(fenced, sink.ErrFenced)
	dead := &consumer.Batch{Group: "g", Topic: "t", Partition: 3, From: 1, To: 2, Records: []*kgo.Record{{}}}
	if err := cfg.Handler.Handle(context.Background(), nil, dead); err == nil {
		t.Fatal("the wrapped handler lost the error")
	}
	cfg.Hooks.AfterBatch(dead, nil)
	func() {
		defer func() {
			if recover() == nil {
				t.Error("the wrapped handler swallowed the panic")
			}
		}()
		_ = cfg.Handler.Handle(context.Background(), nil, &consumer.Batch{From: 2})
	}()

	f := gather(t, reg)
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"tenure_claims_total", []string{"topic=t", "partition=3"}, 1},
		{"tenure_claims_fenced_total", []string{"partition=3"}, 1},
		{"tenure_batches_committed_total", []string{"partition=3"}, 2},
		{"tenure_records_committed_total", []string{"partition=3"}, 3},
		{"tenure_batches_fenced_total", []string{"partition=3"}, 1},
		{"tenure_commit_duration_seconds", []string{"outcome=committed"}, 1},
		{"tenure_commit_duration_seconds", []string{"outcome=fenced"}, 1},
		{"tenure_handler_duration_seconds", []string{"outcome=ok"}, 1},
		{"tenure_handler_duration_seconds", []string{"outcome=error"}, 1},
		{"tenure_handler_duration_seconds", []string{"outcome=panic"}, 1},
		{"tenure_end_to_end_latency_seconds", nil, 2},
	} {
		if got := value(f, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if strings.Join(seen, ",") != "after-claim,after-claim,after-batch,after-batch,after-batch" {
		t.Errorf("the config's own hooks ran as %v", seen)
	}
	// Not attached: no Stats metrics, and nothing fails.
	if _, ok := f["tenure_lanes"]; ok {
		t.Error("tenure_lanes without a consumer attached")
	}
	problems, err := testutil.CollectAndLint(m)
	if err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", err, problems)
	}
}

// Instrument keeps a consumer.BatchesHandler one (a wrapper that hid it
// would cost every transaction that spans partitions a call per batch),
// times its call once, and leaves a plain Handler plain.
func TestInstrumentKeepsBatchesHandlers(t *testing.T) {
	m := metrics.New(metrics.Options{})
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	var got int
	cfg := m.Instrument(consumer.Config{Handler: batchesHandler{func(bs []*consumer.Batch) { got = len(bs) }}})
	bh, ok := cfg.Handler.(consumer.BatchesHandler)
	if !ok {
		t.Fatalf("Instrument made a BatchesHandler a %T, which is not one", cfg.Handler)
	}
	if err := bh.HandleBatches(context.Background(), nil, []*consumer.Batch{{}, {}, {}}); err != nil || got != 3 {
		t.Fatalf("HandleBatches = %v, the handler got %d batches; want nil, 3", err, got)
	}
	if n := testutil.CollectAndCount(m, "tenure_handler_duration_seconds"); n != 1 {
		t.Errorf("%d handler duration series after one call, want 1", n)
	}
	plain := m.Instrument(consumer.Config{Handler: consumer.HandlerFunc(func(context.Context, consumer.Tx, *consumer.Batch) error { return nil })})
	if _, ok := plain.Handler.(consumer.BatchesHandler); ok {
		t.Error("Instrument made a plain Handler a BatchesHandler")
	}
}

type batchesHandler struct{ got func([]*consumer.Batch) }

func (h batchesHandler) Handle(ctx context.Context, tx consumer.Tx, b *consumer.Batch) error {
	return h.HandleBatches(ctx, tx, []*consumer.Batch{b})
}

func (h batchesHandler) HandleBatches(_ context.Context, _ consumer.Tx, bs []*consumer.Batch) error {
	h.got(bs)
	return nil
}
