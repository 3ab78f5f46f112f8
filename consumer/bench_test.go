package consumer_test

import (
	"context"
	"fmt"
	"testing"
	"time"

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
			})
		}
	}
}
