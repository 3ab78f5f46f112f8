package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/sink"
)

// deadLetters returns b's dead letters by job value.
func (b *bundle) deadLetters() map[string]sink.DeadLetter {
	b.t.Helper()
	dls, err := b.store.DeadLetters(context.Background(), sink.DeadLetterFilter{Group: b.group})
	if err != nil {
		b.t.Fatal(err)
	}
	out := map[string]sink.DeadLetter{}
	for _, d := range dls {
		out[string(d.Value)] = d
	}
	return out
}

// dumpedLogger is a logger whose every entry the test can read back, and
// which writes them all to the test's log if the test fails.
func dumpedLogger(t *testing.T) (*zap.Logger, *observer.ObservedLogs) {
	core, logs := observer.New(zap.DebugLevel)
	dumpLogsOnFailure(t, logs)
	return zap.New(core), logs
}

func dumpLogsOnFailure(t *testing.T, logs *observer.ObservedLogs) {
	t.Cleanup(func() {
		if t.Failed() {
			for _, e := range logs.All() {
				t.Logf("%s %s %v", e.Level, e.Message, e.ContextMap())
			}
		}
	})
}

// The handler's errors are the job's, whatever their Go type: a truncated
// JSON payload (io.ErrUnexpectedEOF) and a dead HTTP host (*net.OpError)
// used to pass for a database outage and were retried forever, wedging the
// partition and every good job batched with them. Permanent always wins:
// Permanent(io.ErrUnexpectedEOF) is dead-lettered at once.
func TestHandlerErrorsAreTheJobsWhateverTheirType(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	values := map[int]string{
		3:  `{"kind":"truncated"`, // json.Decoder: io.ErrUnexpectedEOF
		9:  `{"kind":"permanent-eof"}`,
		14: `{"kind":"dead-host"}`,
	}
	value := func(i int) string {
		if v, ok := values[i]; ok {
			return v
		}
		return fmt.Sprintf(`{"i":%d}`, i)
	}
	b.produceValues(20, oneKey, value)
	inner := ledger(t, b.schema)
	h := consumer.HandlerFunc(func(ctx context.Context, tx consumer.Tx, batch *consumer.Batch) error {
		for _, r := range batch.Records {
			var v map[string]any
			if err := json.NewDecoder(strings.NewReader(string(r.Value))).Decode(&v); err != nil {
				return fmt.Errorf("%s: decoding: %w", consumer.JobID(r), err)
			}
			switch v["kind"] {
			case "permanent-eof":
				return consumer.Permanent(fmt.Errorf("%s: %w", consumer.JobID(r), io.ErrUnexpectedEOF))
			case "dead-host":
				return fmt.Errorf("calling the exporter: %w", &net.OpError{Op: "dial", Net: "tcp",
					Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}, Err: syscall.ECONNREFUSED})
			}
		}
		return inner.Handle(ctx, tx, batch)
	})
	log, _ := dumpedLogger(t)
	cfg := b.config(h, log)
	cfg.MaxAttempts = 2
	b.runUntilDone(cfg, 30*time.Second)
	dls := b.deadLetters()
	for i, want := range map[int]int{3: 2, 9: 1, 14: 2} {
		d, ok := dls[value(i)]
		if !ok {
			t.Errorf("job %d (%s) was not dead-lettered", i, value(i))
			continue
		}
		if d.Attempts != want {
			t.Errorf("job %d (%s): %d attempts, want %d", i, value(i), d.Attempts, want)
		}
	}
	if len(dls) != 3 {
		t.Errorf("%d dead letters, want 3", len(dls))
	}
	if h := b.check(); len(h.Writes) != 17 {
		t.Errorf("ledger has %d rows, want 17", len(h.Writes))
	}
}

// Transient says the destination is down: the batch is retried with backoff,
// never split, never counted against its jobs, never dead-lettered; it is
// counted and logged.
func TestTransientIsRetriedAndNeverDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	b.produce(10, oneKey)
	h, sizes := failFirst(t, b, 8, func(context.Context, consumer.Tx) error { // four times MaxAttempts
		return consumer.Transient(errors.New("exporter unavailable (503)"))
	})
	log, logs := dumpedLogger(t)
	cfg := b.config(h, log)
	cfg.MaxAttempts = 2
	c, stop := runNew(t, cfg)
	b.waitDone(30 * time.Second)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if dls := b.deadLetters(); len(dls) != 0 {
		t.Errorf("%d jobs dead-lettered after Transient errors", len(dls))
	}
	if h := b.check(); len(h.Writes) != 10 {
		t.Errorf("ledger has %d rows, want 10", len(h.Writes))
	}
	st := c.Stats()
	if st.HandlerTransient != 8 || st.HandlerFailures != 0 {
		t.Errorf("stats: %d transient, %d counted failures; want 8 and 0", st.HandlerTransient, st.HandlerFailures)
	}
	if sizes := sizes(); len(sizes) != 1 {
		t.Errorf("the batch was split (sizes %v): Transient must retry it whole", sizes)
	}
	if n := logs.FilterMessageSnippet("(Transient, or a lock conflict)").Len(); n != 8 {
		t.Errorf("%d Transient failures logged, want 8", n)
	}
}

// The handler's own SQL errors whose SQLSTATE says the environment is wrong
// (here 42P01: `tenure migrate down` under a live worker dropped the table)
// say nothing about the job: the partition stalls, loudly, and nothing is
// dead-lettered; once the table is back, every job commits.
func TestHandlerSQLEnvironmentErrorsStallAndRecover(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	ctx := context.Background()
	table := pgx.Identifier{b.schema, "exports_out"}.Sanitize()
	b.produce(10, oneKey)
	h := consumer.HandlerFunc(func(ctx context.Context, tx consumer.Tx, batch *consumer.Batch) error {
		for _, r := range batch.Records {
			if _, err := tx.Exec(ctx, `INSERT INTO `+table+` (job) VALUES ($1)`, consumer.JobID(r)); err != nil {
				return err
			}
		}
		return nil
	})
	log, logs := dumpedLogger(t)
	cfg := b.config(h, log)
	cfg.MaxAttempts = 2
	c, stop := runNew(t, cfg)
	waitForCond(t, 30*time.Second, "the partition to stall on the missing table", func() bool { return c.Stats().HandlerEnvironment >= 6 })
	if dls := b.deadLetters(); len(dls) != 0 {
		for _, d := range dls {
			t.Errorf("dead-lettered for a missing table: offset %d: %s", d.Offset, d.Error)
		}
	}
	if f, err := b.store.Get(ctx, sink.Partition{Group: b.group, Topic: b.topic}); err != nil || f.NextOffset != 0 {
		t.Errorf("the partition moved while its handler's table was missing: %+v, %v", f, err)
	}
	if st := c.Stats(); st.HandlerFailures != 0 {
		t.Errorf("%d failures counted against jobs for a missing table", st.HandlerFailures)
	}
	stalled := logs.FilterMessageSnippet("the partition stalls").All()
	if len(stalled) == 0 || stalled[0].Level != zap.ErrorLevel || stalled[0].ContextMap()["sqlstate"] != "42P01" {
		t.Errorf("the stall was not logged as an error with its SQLSTATE: %v", stalled)
	}
	if _, err := b.pool.Exec(ctx, `CREATE TABLE `+table+` (job text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	b.waitDone(30 * time.Second)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n); err != nil || n != 10 {
		t.Errorf("%d rows (%v), want 10", n, err)
	}
	if dls := b.deadLetters(); len(dls) != 0 {
		t.Errorf("%d dead letters, want none", len(dls))
	}
}

// A data error of the handler's SQL (23505, a unique violation) is the
// job's: it is isolated and dead-lettered, and the other jobs commit.
func TestHandlerSQLDataErrorsAreTheJobs(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	ctx := context.Background()
	table := pgx.Identifier{b.schema, "invoices"}.Sanitize()
	if _, err := b.pool.Exec(ctx, `CREATE TABLE `+table+` (number text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `INSERT INTO `+table+` VALUES ('n7')`); err != nil {
		t.Fatal(err)
	}
	b.produceValues(12, oneKey, func(i int) string { return fmt.Sprintf("n%d", i) })
	h := consumer.HandlerFunc(func(ctx context.Context, tx consumer.Tx, batch *consumer.Batch) error {
		for _, r := range batch.Records {
			if _, err := tx.Exec(ctx, `INSERT INTO `+table+` VALUES ($1)`, string(r.Value)); err != nil {
				return err
			}
		}
		return nil
	})
	cfg := b.config(h, zap.NewNop())
	cfg.MaxAttempts = 2
	b.runUntilDone(cfg, 30*time.Second)
	dls := b.deadLetters()
	if d, ok := dls["n7"]; !ok || len(dls) != 1 || !strings.Contains(d.Error, "23505") {
		t.Errorf("dead letters %v, want the duplicate n7 alone, for 23505", dls)
	}
	var n int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n); err != nil || n != 12 {
		t.Errorf("%d invoices (%v), want 12 (11 jobs and the one that was there)", n, err)
	}
}

// failFirst is the ledger on b's schema behind a handler whose first n
// calls return fail's error instead; sizes returns the sizes of the
// batches it was called with.
func failFirst(t testing.TB, b *bundle, n int, fail func(ctx context.Context, tx consumer.Tx) error) (h consumer.Handler, sizes func() map[int]bool) {
	t.Helper()
	inner := ledger(t, b.schema)
	var mu sync.Mutex
	calls, seen := 0, map[int]bool{}
	h = consumer.HandlerFunc(func(ctx context.Context, tx consumer.Tx, batch *consumer.Batch) error {
		mu.Lock()
		calls++
		c := calls
		seen[len(batch.Records)] = true
		mu.Unlock()
		if c <= n {
			return fail(ctx, tx)
		}
		return inner.Handle(ctx, tx, batch)
	})
	return h, func() map[int]bool {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(seen)
	}
}

// runNew makes a consumer of cfg and runs it until the test ends or stop
// is called.
func runNew(t testing.TB, cfg consumer.Config) (c *consumer.Consumer, stop func() error) {
	t.Helper()
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c, runConsumer(t, c)
}

// runConsumer runs c until the test ends or stop is called.
func runConsumer(t testing.TB, c *consumer.Consumer) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx) }()
	var once sync.Once
	var runErr error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case runErr = <-errc:
			case <-time.After(60 * time.Second):
				runErr = errors.New("consumer did not stop within 60s")
			}
		})
		return runErr
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}
