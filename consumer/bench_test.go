package consumer_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/zap"

	"github.com/tenure-dev/tenure/consumer"
)

// BenchmarkThroughput runs a consumer over b.N jobs on 4 partitions, side by
// side for several batch sizes and handlers, so that one run shows what the
// per-batch fence costs (batch=1 pays a transaction per job) and what a
// real write adds (ledger vs noop). Reported: jobs/s.
//
//	go test ./consumer -run '^$' -bench Throughput -benchtime 20000x
func BenchmarkThroughput(b *testing.B) {
	for _, handler := range []string{"noop", "ledger"} {
		for _, batch := range []int{1, 50, 500} {
			b.Run(fmt.Sprintf("%s/batch=%d", handler, batch), func(b *testing.B) {
				bn := setup(b, 4)
				bn.produce(b.N, func(i int) string { return fmt.Sprintf("k%d", i%101) })
				var h consumer.Handler = consumer.HandlerFunc(func(context.Context, consumer.Tx, *consumer.Batch) error { return nil })
				if handler == "ledger" {
					h = ledger(b, bn.schema)
				}
				cfg := bn.config(h, zap.NewNop())
				cfg.BatchMax = batch
				runTimed(b, bn, cfg)
			})
		}
	}
}

// runTimed runs a worker with cfg through the b.N jobs produced and
// reports jobs/s; only the run, from the worker's start to the last
// commit, is timed.
func runTimed(b *testing.B, bn *bundle, cfg consumer.Config) {
	b.Helper()
	b.ResetTimer()
	start := time.Now()
	stop := bn.start(cfg)
	bn.waitDone(10 * time.Minute)
	elapsed := time.Since(start)
	b.StopTimer()
	if err := stop(); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "jobs/s")
}

// BenchmarkTracing is BenchmarkThroughput's ledger consumer with tracing off
// (Config.TracerProvider nil, the pool untraced) and on (the SDK sampling
// every batch, a batch span processor exporting to nowhere, the pool's
// statements traced by otelpgx), side by side. The records are the same in
// both: produced through kotel's hooks, so each carries its publish span's
// context, which the traced consumer links to. Reported: jobs/s; with
// -benchmem, allocs/op and B/op are per job, the whole process counted.
//
//	go test ./consumer -run '^$' -bench Tracing -benchtime 20000x -benchmem
func BenchmarkTracing(b *testing.B) {
	for _, batch := range []int{1, consumer.DefaultBatchMax} {
		for _, on := range []bool{false, true} {
			b.Run(fmt.Sprintf("batch=%d/tracing=%s", batch, map[bool]string{false: "off", true: "on"}[on]), func(b *testing.B) {
				bn := setup(b, 4)
				tr := bn.traced(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
				tr.produceJobs(b, bn.topic, b.N)
				h := ledger(b, bn.schema)
				cfg := bn.config(h, zap.NewNop())
				if on {
					cfg = tr.config(bn, h, zap.NewNop())
				}
				cfg.BatchMax = batch
				b.ReportAllocs()
				runTimed(b, bn, cfg)
			})
		}
	}
}
