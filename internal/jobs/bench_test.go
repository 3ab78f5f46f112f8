package jobs_test

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/internal/jobs"
	"github.com/tenure-dev/tenure/internal/testinfra/testdb"
	"github.com/tenure-dev/tenure/sink"
)

// BenchmarkLedger runs the ledger handler on batches of 1,000 jobs (the
// default --batch-max; keys and values as `tenure bench` produces them),
// side by side with its rows encoded by pgx's CopyFrom and by the handler
// itself (binary COPY), each batch in a transaction that is rolled back.
// An op is one batch. ns/op includes the server's time; cpu-ns/op is this
// process's CPU alone (user and system), which is what the encoding
// changes; B/op and allocs/op are this process's too.
//
//	go test ./internal/jobs -run '^$' -bench Ledger -benchmem -count 6
func BenchmarkLedger(b *testing.B) {
	pool := testdb.Pool(b)
	schema := testdb.Schema(b, pool)
	h, err := jobs.New("ledger", schema, "bench")
	if err != nil {
		b.Fatal(err)
	}
	batch := &consumer.Batch{Group: "g", Topic: "bench-0041228e-main", Partition: 7, Token: sink.Token{Incarnation: 1, Epoch: 3}, Owner: "o"}
	for i := range consumer.DefaultBatchMax {
		key := fmt.Appendf(nil, "key-%d", (i*12+7)%10_000)
		batch.Records = append(batch.Records, &kgo.Record{Topic: batch.Topic, Partition: batch.Partition,
			Offset: 1_000_000 + int64(i), Key: key, Value: make([]byte, 100)})
	}
	batch.From, batch.To = batch.Records[0].Offset, batch.Records[len(batch.Records)-1].Offset+1
	errRollback := errors.New("rolled back")
	for _, enc := range []struct {
		name string
		wrap func(pgx.Tx) consumer.Tx
	}{
		{"pgx", func(tx pgx.Tx) consumer.Tx { return txOf{tx} }},
		{"binary", func(tx pgx.Tx) consumer.Tx { return copyTx{txOf{tx}} }},
	} {
		b.Run("encoding="+enc.name, func(b *testing.B) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			conn, err := pool.Acquire(ctx)
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Release()
			b.ReportAllocs()
			cpu := cpuTime()
			b.ResetTimer()
			for b.Loop() {
				err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
					if err := h.Handle(ctx, enc.wrap(tx), batch); err != nil {
						return err
					}
					return errRollback
				})
				if !errors.Is(err, errRollback) {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/op")
		})
	}
}

// cpuTime is this process's CPU time so far (user and system).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
