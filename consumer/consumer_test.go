package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/internal/devbroker"
	"github.com/tenure-dev/tenure/internal/history"
	"github.com/tenure-dev/tenure/internal/jobs"
	"github.com/tenure-dev/tenure/internal/testinfra/kafkatest"
	"github.com/tenure-dev/tenure/internal/testinfra/testdb"
	"github.com/tenure-dev/tenure/sink"
)

// bundle is one test's broker, schema, topic and group.
type bundle struct {
	t       testing.TB
	cluster *kfake.Cluster
	brokers []string
	pool    *pgxpool.Pool
	schema  string
	store   *sink.Store
	topic   string
	group   string
	cl      *kgo.Client
	parts   int32
}

func setup(t testing.TB, partitions int32) *bundle {
	t.Helper()
	c, err := devbroker.Start(devbroker.Config{ConsumerSessionTimeout: 3 * time.Second, ConsumerHeartbeat: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	b := &bundle{t: t, cluster: c, brokers: c.ListenAddrs(), parts: partitions}
	b.pool = testdb.Pool(t)
	b.schema = testdb.Schema(t, b.pool)
	b.store, err = sink.NewStore(b.pool, b.schema)
	if err != nil {
		t.Fatal(err)
	}
	b.topic, b.group = "jobs", "g-"+b.schema
	b.cl, err = kgo.NewClient(kgo.SeedBrokers(b.brokers...), kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.cl.Close)
	kafkatest.CreateTopic(t, b.cl, b.topic, partitions)
	return b
}

func (b *bundle) produce(n int, keyf func(i int) string) {
	b.t.Helper()
	b.produceValues(n, keyf, func(i int) string { return fmt.Sprintf(`{"i":%d}`, i) })
}

func (b *bundle) produceValues(n int, keyf, valuef func(i int) string) {
	b.t.Helper()
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = &kgo.Record{Topic: b.topic, Key: []byte(keyf(i)), Value: []byte(valuef(i))}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := b.cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		b.t.Fatal(err)
	}
}

func (b *bundle) config(h consumer.Handler, log *zap.Logger) consumer.Config {
	return consumer.Config{
		Brokers: b.brokers, Group: b.group, Topics: []string{b.topic},
		Store: b.store, Handler: h, Logger: log,
		SessionTimeout: 3 * time.Second, RebalanceTimeout: 5 * time.Second,
		RetryBackoff: 10 * time.Millisecond, RetryBackoffMax: 50 * time.Millisecond,
		BatchMax: 25,
	}
}

// start runs a consumer until the test ends or stop is called.
func (b *bundle) start(cfg consumer.Config) (stop func() error) {
	b.t.Helper()
	_, stop = runNew(b.t, cfg)
	return stop
}

// runUntilDone runs a worker with cfg until every record produced so far is
// processed (within timeout, see waitDone) and stops it; a worker that does
// not stop cleanly fails the test.
func (b *bundle) runUntilDone(cfg consumer.Config, timeout time.Duration) {
	b.t.Helper()
	stop := b.start(cfg)
	b.waitDone(timeout)
	if err := stop(); err != nil {
		b.t.Fatal(err)
	}
}

func (b *bundle) endOffsets() map[int32]int64 {
	b.t.Helper()
	return kafkatest.EndOffsets(b.t, b.cl, b.topic)
}

// waitProcessed waits until the partitions which selects have all stored
// a next offset at the topic's end as it is now (want of them).
func (b *bundle) waitProcessed(timeout time.Duration, what string, which func(p int32) bool, want int) {
	b.t.Helper()
	end := b.endOffsets()
	waitForCond(b.t, timeout, what, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		fs, err := b.store.List(ctx, b.group)
		if err != nil {
			b.t.Fatal(err)
		}
		done := 0
		for _, f := range fs {
			if which(f.Partition.Partition) && f.NextOffset >= end[f.Partition.Partition] {
				done++
			}
		}
		return done == want
	})
}

// waitDone waits until every partition's stored next offset reaches the
// topic's end.
func (b *bundle) waitDone(timeout time.Duration) {
	b.t.Helper()
	end := b.endOffsets()
	deadline := time.Now().Add(timeout)
	for {
		fs, err := b.store.List(context.Background(), b.group)
		if err != nil {
			b.t.Fatal(err)
		}
		done := 0
		for _, f := range fs {
			if f.NextOffset >= end[f.Partition.Partition] {
				done++
			}
		}
		if done == len(end) {
			return
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("not all partitions done within %s: fences %+v, ends %v", timeout, fs, end)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// check runs the history checker over the ledger: every job exactly once.
func (b *bundle) check() *history.History {
	b.t.Helper()
	h, err := history.Load(context.Background(), b.pool, b.schema, b.group, true)
	if err != nil {
		b.t.Fatal(err)
	}
	produced := map[history.TopicPartition][]int64{}
	for p, end := range b.endOffsets() {
		for o := int64(0); o < end; o++ {
			produced[history.TopicPartition{Topic: b.topic, Partition: p}] = append(produced[history.TopicPartition{Topic: b.topic, Partition: p}], o)
		}
	}
	for _, v := range h.Check(produced) {
		b.t.Errorf("violation: %s", v)
	}
	return h
}

// poolStore is a store on the test's schema over a pool of its own, whose
// configuration tune adjusts before the pool opens.
func (b *bundle) poolStore(tune func(cfg *pgxpool.Config)) *sink.Store {
	b.t.Helper()
	pool := testdb.PoolOn(b.t, context.Background(), testdb.URL(), tune)
	s, err := sink.NewStore(pool, b.schema)
	if err != nil {
		b.t.Fatal(err)
	}
	return s
}

// lockFenceRow locks partition p's fencing row from a session of another
// program (application_name another-program) until the returned
// transaction ends.
func (b *bundle) lockFenceRow(ctx context.Context, p int32) pgx.Tx {
	b.t.Helper()
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		b.t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SET LOCAL application_name = 'another-program'; SELECT 1 FROM `+pgx.Identifier{b.schema}.Sanitize()+
		fmt.Sprintf(`.fences WHERE partition = %d FOR UPDATE`, p)); err != nil {
		_ = tx.Rollback(ctx)
		b.t.Fatal(err)
	}
	return tx
}

// rowsByPartition counts the rows of the schema's table by partition.
func (b *bundle) rowsByPartition(table string) map[int32]int {
	b.t.Helper()
	rows, err := b.pool.Query(context.Background(), `SELECT partition, count(*) FROM "`+b.schema+`".`+table+` GROUP BY partition`)
	if err != nil {
		b.t.Fatal(err)
	}
	defer rows.Close()
	out := map[int32]int{}
	for rows.Next() {
		var p int32
		var n int
		if err := rows.Scan(&p, &n); err != nil {
			b.t.Fatal(err)
		}
		out[p] = n
	}
	return out
}

// observedLogger is a logger whose entries at info and above the test can
// read back; those at echo and above also go to the test's log.
func observedLogger(t testing.TB, echo zapcore.Level) (*zap.Logger, *observer.ObservedLogs) {
	core, logs := observer.New(zap.InfoLevel)
	return zap.New(zapcore.NewTee(core, zaptest.NewLogger(t, zaptest.Level(echo)).Core())), logs
}

// eachParallel runs test in a parallel subtest named after each of cases.
func eachParallel[C ~string](t *testing.T, cases []C, test func(t *testing.T, c C)) {
	t.Helper()
	for _, c := range cases {
		t.Run(string(c), func(t *testing.T) {
			t.Parallel()
			test(t, c)
		})
	}
}

func ledger(t testing.TB, schema string) consumer.Handler {
	h, err := jobs.New("ledger", schema, "test")
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestConsumesEveryPartitionExactlyOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	b.produce(400, func(i int) string { return fmt.Sprintf("k%d", i%37) })
	b.runUntilDone(b.config(ledger(t, b.schema), zaptest.NewLogger(t)), 60*time.Second)
	h := b.check()
	if len(h.Writes) != 400 {
		t.Fatalf("ledger has %d rows, want 400", len(h.Writes))
	}
}

// Offsets live in Postgres: a restarted consumer resumes from the fencing
// row, whatever Kafka has (here: no commits at all).
func TestResumesFromPostgresOffsets(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	b.produce(100, func(i int) string { return fmt.Sprintf("k%d", i) })
	b.runUntilDone(b.config(ledger(t, b.schema), zaptest.NewLogger(t)), 60*time.Second)
	b.produce(50, func(i int) string { return fmt.Sprintf("k%d", i) })
	b.runUntilDone(b.config(ledger(t, b.schema), zaptest.NewLogger(t)), 60*time.Second)
	if h := b.check(); len(h.Writes) != 150 {
		t.Fatalf("ledger has %d rows, want 150", len(h.Writes))
	}
}

// Records of one partition reach the handler in offset order, one batch at a
// time; batches carry From/To that chain.
func TestBatchesAreOrderedAndChained(t *testing.T) {
	t.Parallel()
	b := setup(t, 3)
	b.produce(300, func(i int) string { return fmt.Sprintf("k%d", i%11) })
	var mu sync.Mutex
	last := map[int32]int64{}
	inFlight := map[int32]bool{}
	var bad []string
	h := consumer.HandlerFunc(func(ctx context.Context, tx consumer.Tx, batch *consumer.Batch) error {
		mu.Lock()
		if inFlight[batch.Partition] {
			bad = append(bad, fmt.Sprintf("partition %d: two batches at once", batch.Partition))
		}
		inFlight[batch.Partition] = true
		if batch.From != last[batch.Partition] {
			bad = append(bad, fmt.Sprintf("partition %d: batch from %d, previous ended at %d", batch.Partition, batch.From, last[batch.Partition]))
		}
		prev := batch.From - 1
		for _, r := range batch.Records {
			if r.Offset <= prev || r.Partition != batch.Partition {
				bad = append(bad, fmt.Sprintf("partition %d: record %d/%d out of order", batch.Partition, r.Partition, r.Offset))
			}
			prev = r.Offset
		}
		if batch.To != prev+1 {
			bad = append(bad, fmt.Sprintf("partition %d: To %d, last record %d", batch.Partition, batch.To, prev))
		}
		last[batch.Partition] = batch.To
		mu.Unlock()
		time.Sleep(time.Millisecond) // widen the window for overlapping batches
		mu.Lock()
		inFlight[batch.Partition] = false
		mu.Unlock()
		return nil
	})
	b.runUntilDone(b.config(h, zaptest.NewLogger(t)), 60*time.Second)
	mu.Lock()
	defer mu.Unlock()
	for _, s := range bad {
		t.Error(s)
	}
}

// A failing handler is retried; what finally commits is exactly one run's
// effects. A panicking handler does not take the worker down.
func TestFailingAndPanickingHandlersAreRetried(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	b.produce(60, func(i int) string { return fmt.Sprintf("k%d", i) })
	inner := ledger(t, b.schema)
	var calls atomic.Int64
	h := consumer.HandlerFunc(func(ctx context.Context, tx consumer.Tx, batch *consumer.Batch) error {
		if err := inner.Handle(ctx, tx, batch); err != nil {
			return err
		}
		// Write first, then fail: the rollback must undo the write.
		switch calls.Add(1) {
		case 1:
			return errors.New("transient failure")
		case 2:
			panic("handler bug")
		}
		return nil
	})
	core, logs := observer.New(zap.DebugLevel)
	b.runUntilDone(b.config(h, zap.New(core)), 60*time.Second)
	if h := b.check(); len(h.Writes) != 60 {
		t.Fatalf("ledger has %d rows, want 60", len(h.Writes))
	}
	if logs.FilterMessage("handler panicked").Len() != 1 {
		t.Errorf("the panic was not logged once: %d", logs.FilterMessage("handler panicked").Len())
	}
	if n := logs.FilterMessage("batch failed, retrying").Len(); n != 1 {
		t.Errorf("want one retry after the transient failure logged, got %d", n)
	}
	if n := logs.FilterMessage("batch keeps failing: splitting it to isolate the failing job").Len(); n != 1 {
		t.Errorf("want one split after the panic logged, got %d", n)
	}
	if n := logs.FilterMessage("job dead-lettered").Len(); n != 0 {
		t.Errorf("nothing should be dead-lettered, got %d", n)
	}
}

// Two consumers in one group share the partitions; a third joins and one
// leaves while jobs flow. Every job is committed exactly once and the fence
// log is contiguous and ordered (G1-G3).
func TestRebalancesKeepEveryJobExactlyOnce(t *testing.T) {
	t.Parallel()
	eachParallel(t, []consumer.Protocol{consumer.Classic, consumer.NextGen}, func(t *testing.T, proto consumer.Protocol) {
		b := setup(t, 6)
		inner := ledger(t, b.schema)
		// Slow enough that every member joins while work is going on.
		slow := consumer.HandlerFunc(func(ctx context.Context, tx consumer.Tx, batch *consumer.Batch) error {
			time.Sleep(5 * time.Millisecond)
			return inner.Handle(ctx, tx, batch)
		})
		var committed [3]atomic.Int64 // batches committed per member
		cfg := func(n int) consumer.Config {
			c := b.config(slow, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
			c.BatchMax = 5
			c.Protocol = proto
			c.Hooks.AfterBatch = func(_ *consumer.Batch, err error) {
				if err == nil {
					committed[n].Add(1)
				}
			}
			return c
		}
		// Each member must have taken part before the next change, so
		// that the run has hand-offs whatever the machine's speed.
		took := func(n int) {
			t.Helper()
			deadline := time.Now().Add(60 * time.Second)
			for committed[n].Load() == 0 {
				if time.Now().After(deadline) {
					t.Fatalf("member %d committed nothing within 60s", n+1)
				}
				b.produce(6, func(i int) string { return fmt.Sprintf("k%d", i) })
				time.Sleep(50 * time.Millisecond)
			}
		}
		stop1 := b.start(cfg(0))
		b.produce(300, func(i int) string { return fmt.Sprintf("k%d", i%53) })
		took(0)
		stop2 := b.start(cfg(1))
		b.produce(300, func(i int) string { return fmt.Sprintf("k%d", i%53) })
		took(1)
		if err := stop1(); err != nil {
			t.Fatal(err)
		}
		stop3 := b.start(cfg(2))
		b.produce(300, func(i int) string { return fmt.Sprintf("k%d", i%53) })
		took(2)
		b.waitDone(90 * time.Second)
		for _, s := range []func() error{stop2, stop3} {
			if err := s(); err != nil {
				t.Fatal(err)
			}
		}
		h := b.check()
		var want int64
		for _, end := range b.endOffsets() {
			want += end
		}
		if int64(len(h.Writes)) != want {
			t.Fatalf("ledger has %d rows, want %d (every job in the log)", len(h.Writes), want)
		}
		owners := map[string]bool{}
		for _, e := range h.Log {
			if e.Kind == "commit" {
				owners[e.Owner] = true
			}
		}
		t.Logf("%d commits by %d members", len(h.Log), len(owners))
		if len(owners) < 2 {
			t.Errorf("expected commits from several members, got %v", owners)
		}
	})
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	store, err := sink.NewStore(pool, "tenure")
	if err != nil {
		t.Fatal(err)
	}
	h := consumer.HandlerFunc(func(context.Context, consumer.Tx, *consumer.Batch) error { return nil })
	good := consumer.Config{Brokers: []string{"127.0.0.1:1"}, Group: "g", Topics: []string{"t"}, Store: store, Handler: h}
	for name, tc := range map[string]struct {
		mut  func(*consumer.Config)
		want string
	}{
		"no brokers":  {func(c *consumer.Config) { c.Brokers = nil }, "at least one broker"},
		"bad broker":  {func(c *consumer.Config) { c.Brokers = []string{"localhost"} }, "not host:port"},
		"no group":    {func(c *consumer.Config) { c.Group = " " }, "consumer group is required"},
		"no topics":   {func(c *consumer.Config) { c.Topics = nil }, "at least one topic"},
		"no store":    {func(c *consumer.Config) { c.Store = nil }, "sink.Store is required"},
		"no handler":  {func(c *consumer.Config) { c.Handler = nil }, "Handler is required"},
		"bad proto":   {func(c *consumer.Config) { c.Protocol = "eager" }, "protocol \"eager\""},
		"neg timeout": {func(c *consumer.Config) { c.ClaimTimeout = -1 }, "must not be negative"},
		"static": {func(c *consumer.Config) { c.KgoOpts = []kgo.Opt{kgo.InstanceID("pod-0")} },
			"static group membership"},
		"kgo group": {func(c *consumer.Config) { c.KgoOpts = []kgo.Opt{kgo.ConsumerGroup("x")} },
			"Config.KgoOpts sets a kgo option that tenure owns: kgo.ConsumerGroup (set Config.Group)"},
		// Postgres would end the session of a job still within its time.
		"idle below handler": {func(c *consumer.Config) { c.IdleInTxTimeout = 30 * time.Second },
			"IdleInTxTimeout 30s must be longer than HandlerTimeout 1m0s"},
		"idle equal to handler": {func(c *consumer.Config) { c.IdleInTxTimeout, c.HandlerTimeout = time.Second, time.Second },
			"IdleInTxTimeout 1s must be longer than HandlerTimeout 1s"},
		"negative commit span": {func(c *consumer.Config) { c.CommitSpan = -2 }, "CommitSpan -2 must be positive"},
		"commit span with strict": {func(c *consumer.Config) { c.CommitSpan, c.Strict = 8, true },
			"CommitSpan 8 needs the default commit path: strict hand-off (Strict) commits each batch in a transaction of its own"},
		"commit span without the fence": {func(c *consumer.Config) { c.CommitSpan, c.UnsafeNoFence = 8, true }, "CommitSpan 8 needs the fence"},
		"idle without handler bound": {func(c *consumer.Config) { c.IdleInTxTimeout, c.HandlerTimeout = time.Minute, -1 },
			"has no time bound"},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := good
			tc.mut(&cfg)
			_, err := consumer.New(cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
	if _, err := consumer.New(consumer.Config{Brokers: []string{"127.0.0.1:1"}, Group: "g", Topics: []string{"t"}, Store: store, Handler: h,
		KgoOpts: []kgo.Opt{kgo.InstanceID("x")}}); !errors.Is(err, consumer.ErrStaticMembership) {
		t.Fatalf("static membership: got %v, want ErrStaticMembership", err)
	}
}
