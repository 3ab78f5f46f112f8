package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kprom"
	"go.uber.org/zap"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/export"
	"github.com/tenure-dev/tenure/internal/jobs"
	"github.com/tenure-dev/tenure/metrics"
	"github.com/tenure-dev/tenure/sink"
)

func init() {
	register(command{name: "worker", summary: "run one worker replica", run: runWorker})
}

func runWorker(ctx context.Context, e *env, args []string) error {
	f := newFlagSet(e, "worker", "--brokers HOST:PORT[,..] --group G --topic T[,T2] --database-url URL --handler export|ledger|noop\n"+
		"    [--schema S] [--name NAME] [--protocol classic|consumer] [--session-timeout D] [--rebalance-timeout D]\n"+
		"    [--batch-max N] [--batch-max-bytes SIZE] [--batch-linger D] [--partition-buffer-bytes SIZE] [--worker-buffer-bytes SIZE] [--max-attempts N] [--handler-timeout D] [--idle-in-tx-timeout D] [--shutdown-timeout D] [--database-timeout D] [--no-migrate] [--require-sync-standby] [--db-max-conns N]\n"+
		"    [--fence-log-max-age D] [--fence-log-max-entries N] [--export-store URL [--job-id-header H]]\n"+
		"    [--http-addr ADDR] [--log-format json|console] [--log-level L] [--hold-once POINT] [--inject-faults] [--unsafe-no-fence] [--metrics-addr ADDR (deprecated)]")
	kafka := addKafkaFlags(f, "Kafka seed brokers, comma separated")
	brokers := kafka.brokers
	group := f.String("group", "", "consumer group shared by the replicas")
	topic := f.String("topic", "", "topics to consume, comma separated")
	dbURL := f.String("database-url", "", "PostgreSQL URL (libpq PG* variables fill in what it leaves out)")
	handler := f.String("handler", "", "built-in handler: "+strings.Join(jobs.Names(), ", "))
	schema := f.String("schema", sink.DefaultSchema, "Postgres schema of tenure's tables")
	protocol := f.String("protocol", "classic", "group protocol: classic (cooperative-sticky) or consumer (KIP-848)")
	session := f.Duration("session-timeout", 45*time.Second, "classic protocol session timeout (KIP-848: set on the broker)")
	rebalance := f.Duration("rebalance-timeout", 60*time.Second, "classic protocol rebalance timeout; revoked partitions get half of it to finish their batch")
	batchMax := f.Int("batch-max", consumer.DefaultBatchMax, "most jobs per transaction; a lane takes what it has buffered, up to this, so batches grow with the backlog")
	batchMaxBytes := f.Bytes("batch-max-bytes", consumer.DefaultBatchMaxBytes, "most bytes (keys, values, headers) per transaction; a larger job makes a batch of its own")
	batchLinger := f.Duration("batch-linger", 0, "how long a lane with less than a full batch waits for more (0: at once; a few ms makes fewer, larger batches at moderate load, at that much latency)")
	partitionBuffer := f.Bytes("partition-buffer-bytes", consumer.DefaultPartitionBufferBytes, "the records one partition holds ahead of its handler: fetching it pauses there")
	workerBuffer := f.Bytes("worker-buffer-bytes", consumer.DefaultWorkerBufferBytes, "the records all partitions together hold ahead of their handlers: past it, fetching pauses; with --partition-buffer-bytes it bounds the worker's memory whatever the backlog")
	idleTx := f.Duration("idle-in-tx-timeout", 0, "Postgres idle_in_transaction_session_timeout for batch transactions: how long a worker frozen mid-transaction can hold row locks; it must be longer than --handler-timeout (default: --handler-timeout plus a quarter, at least 1s more)")
	maxAttempts := f.Int("max-attempts", 5, "attempts of a failing job before it is dead-lettered")
	logAge := f.Duration("fence-log-max-age", consumer.DefaultFenceLogMaxAge, "prune fence log entries older than this from the partitions this worker holds (0: no age limit)")
	logEntries := f.Int("fence-log-max-entries", consumer.DefaultFenceLogMaxEntries, "keep at most this many fence log entries per partition (0: no count limit; both 0 keep the whole log)")
	handlerTimeout := f.Duration("handler-timeout", 60*time.Second, "bound on one handler call (a batch); a job that keeps timing out is dead-lettered")
	dbTimeout := f.Duration("database-timeout", 0, "how long the database may not answer before this worker gives its partitions up (leaves the group) until it answers again; 0 derives it: the session timeout, at least 10s; negative never gives them up")
	shutdown := f.Duration("shutdown-timeout", 30*time.Second, "graceful stop: how long in-flight batches may finish before their handlers are cancelled; a stop takes at most this plus 18s (a commit in flight, then leaving the group), so give containers a grace period above that")
	injectFaults := f.Bool("inject-faults", false, "tests and chaos runs: a job whose value contains \"tenure-fault\":\"error\" fails, \"panic\" panics, \"slow\" outlives the handler timeout")
	noMigrate := f.Bool("no-migrate", false, "do not apply pending migrations at start (fail if any are missing)")
	dbMaxConns := f.Int("db-max-conns", 32, "the most database connections this worker opens: one per partition whose batch runs, plus a few")
	unsafeNoFence := f.Bool("unsafe-no-fence", false, "benchmarks only (tenure bench): commit batches WITHOUT the fence; the guarantee is gone")
	requireSync := f.Bool("require-sync-standby", false, "refuse to start unless the database acknowledges commits only once a synchronous standby has them (see docs/fencing.md, \"Running on highly available Postgres\")")
	name := f.String("name", defaultWorkerName(), "this replica's name, recorded with what it writes")
	hold := f.String("hold-once", "", "demos and tests: the `point` (before-claim, before-batch or before-commit; before-claim:P for partition P only) at which to log \"holding\" once and wait for SIGCONT")
	exportStore := f.String("export-store", "", "export handler: publish to this object store (file:///path or s3://bucket/prefix?endpoint=URL&region=R) through staged immutable objects and a fenced pointer, instead of the exports table; see docs/export.md")
	jobIDHeader := f.String("job-id-header", "", "export handler with --export-store: skip a job whose key and value of this header (a producer-supplied job id) were already processed, recording the skip")
	httpAddr := f.String("http-addr", "", "serve /healthz (alive, not wedged), /readyz (joined the group, database reachable, schema current) and /metrics (Prometheus) on this address, e.g. 0.0.0.0:8080")
	metricsAddr := f.String("metrics-addr", "", "deprecated name of --http-addr (logged as a warning)")
	logger := logFlags(f)
	if err := f.parse(args, 0); err != nil {
		return err
	}
	if err := required("brokers", *brokers, "group", *group, "topic", *topic, "database-url", *dbURL, "handler", *handler); err != nil {
		return err
	}
	if err := validGroup("group", *group); err != nil {
		return err
	}
	if err := validTopics("topic", splitList(*topic)); err != nil {
		return err
	}
	if err := consumer.ValidateClientID(*name); err != nil {
		return usagef("--name: %v", strings.Replace(err.Error(), "client id", "worker name", 1))
	}
	if *protocol != string(consumer.Classic) && *protocol != string(consumer.NextGen) {
		return usagef("--protocol %q is not classic or consumer", *protocol)
	}
	if *dbMaxConns < 2 || *dbMaxConns > 10000 {
		return usagef("--db-max-conns %d is not between 2 and 10000", *dbMaxConns)
	}
	if *batchMax < 1 || *batchMax > maxBatch {
		return usagef("--batch-max must be from 1 to %d", maxBatch)
	}
	if *batchMaxBytes < 1<<10 || *partitionBuffer < 64<<10 || *workerBuffer < *partitionBuffer {
		return usagef("--batch-max-bytes must be at least 1KiB, --partition-buffer-bytes at least 64KiB, and --worker-buffer-bytes at least --partition-buffer-bytes")
	}
	if *batchLinger < 0 || *batchLinger > time.Minute {
		return usagef("--batch-linger %s is out of range: from 0 to 1m", *batchLinger)
	}
	if *maxAttempts < 1 {
		return usagef("--max-attempts must be at least 1")
	}
	if err := checkDurations(*session, *rebalance, *handlerTimeout, *idleTx); err != nil {
		return err
	}
	if *dbTimeout > maxSession {
		return usagef("--database-timeout %s is out of range: it must be at most %s (0 derives it: %s)", *dbTimeout, maxSession, consumer.DefaultDatabaseTimeout(*session))
	}
	if *shutdown <= 0 || *shutdown > maxSession {
		return usagef("--shutdown-timeout %s is out of range: it must be positive and at most %s", *shutdown, maxSession)
	}
	if *logAge < 0 || *logEntries < 0 {
		return usagef("--fence-log-max-age and --fence-log-max-entries must not be negative (0 means no limit)")
	}
	if err := sink.ValidateSchema(*schema); err != nil {
		return usageError{msg: err.Error()}
	}
	addr := *httpAddr
	if *metricsAddr != "" {
		if addr != "" && addr != *metricsAddr {
			return usagef("--metrics-addr is the deprecated name of --http-addr: give one")
		}
		addr = *metricsAddr
	}
	if *exportStore != "" && *handler != "export" {
		return usagef("--export-store is for --handler export, not %s", *handler)
	}
	if *jobIDHeader != "" && *exportStore == "" {
		return usagef("--job-id-header needs --export-store")
	}
	var opts jobs.Options
	if *exportStore != "" {
		st, err := export.Open(ctx, *exportStore)
		if err != nil {
			return usageError{msg: err.Error()}
		}
		opts.ExportStore, opts.JobIDHeader = st, *jobIDHeader
	}
	h, err := jobs.NewWith(*handler, *schema, *name, opts)
	if err != nil {
		return usageError{msg: err.Error()}
	}
	if *injectFaults {
		h = jobs.InjectFaults(h)
	}
	hooks, err := holdHooks(*hold)
	if err != nil {
		return err
	}
	log, err := logger()
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()
	log = log.With(zap.String("worker", *name))
	if *metricsAddr != "" {
		log.Warn("--metrics-addr (TENURE_METRICS_ADDR) is deprecated: use --http-addr (TENURE_HTTP_ADDR), which serves /readyz too")
	}
	// TLS and SASL, checked before anything connects.
	kafkaOpts, err := kafka.kgoOpts(func(msg string) { log.Warn(msg) })
	if err != nil {
		return err
	}

	// Every lane holds a connection while its batch runs: size the pool
	// for the partitions a worker may hold, and open a few up front (a
	// lazy pool adds tens of milliseconds at start and after a hand-off).
	pool, err := openDB(ctx, *dbURL, poolSize{max: int32(*dbMaxConns), min: int32(min(*dbMaxConns, 4))})
	if err != nil {
		return err
	}
	defer pool.Close()
	// A current schema is not migrated: a worker with a least-privilege
	// role (tenure migrate --print-roles) may not run DDL, not even
	// CREATE SCHEMA IF NOT EXISTS.
	if behind := sink.CheckSchema(ctx, pool, *schema); behind == nil || *noMigrate {
		if behind != nil {
			return behind
		}
	} else if applied, err := sink.Migrate(ctx, pool, *schema); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == sink.CodeInsufficientPrivilege {
			return fmt.Errorf("%v; this worker's database role may not migrate it (%s): run `tenure migrate up --schema %s` as the schema's owner", behind, pgErr.Message, *schema)
		}
		return fmt.Errorf("migrating schema %q: %w", *schema, err)
	} else if len(applied) > 0 {
		log.Info("migrations applied", zap.Ints("versions", applied), zap.String("schema", *schema))
	}
	store, err := sink.NewStore(pool, *schema)
	if err != nil {
		return err
	}
	if repl, err := sink.ReplicationOf(ctx, pool); err != nil {
		log.Warn("cannot tell how the database acknowledges commits", zap.Error(err))
		if *requireSync {
			return fmt.Errorf("--require-sync-standby: cannot tell whether the database has a synchronous standby: %v", err)
		}
	} else if !repl.Synchronous() {
		if *requireSync {
			return fmt.Errorf("--require-sync-standby: %s", repl.Describe())
		}
		log.Warn("no synchronous standby: "+repl.Describe(), zap.String("synchronous_standby_names", repl.SynchronousStandbyNames),
			zap.String("synchronous_commit", repl.SynchronousCommit), zap.Int("standbys", repl.Standbys), zap.Int("sync_standbys", repl.SyncStandbys))
	} else {
		log.Info("replication: "+repl.Describe(), zap.Int("sync_standbys", repl.SyncStandbys))
	}

	brokerList, topics := splitList(*brokers), splitList(*topic)
	cl, err := kafka.client(brokerList)
	if err != nil {
		return err
	}
	_, err = checkTopics(ctx, cl, brokerList, topics)
	cl.Close()
	if err != nil {
		return err
	}

	m := metrics.New(metrics.Options{})
	reg := prometheus.NewRegistry()
	if addr != "" {
		reg.MustRegister(m)
		// kgo's own metrics: connections and connection errors per broker
		// (TLS and SASL failures show there), bytes, buffered records.
		kafkaOpts = append(kafkaOpts, kgo.WithHooks(kprom.NewMetrics("tenure_kafka", kprom.Registry(reg))))
	}
	c, err := consumer.New(m.Instrument(consumer.Config{
		Brokers: brokerList, Group: *group, Topics: topics,
		Store: store, Handler: h,
		Protocol:             consumer.Protocol(*protocol),
		SessionTimeout:       *session,
		RebalanceTimeout:     *rebalance,
		BatchMax:             *batchMax,
		BatchMaxBytes:        *batchMaxBytes,
		BatchLinger:          *batchLinger,
		PartitionBufferBytes: *partitionBuffer,
		WorkerBufferBytes:    *workerBuffer,
		MaxAttempts:          *maxAttempts,
		HandlerTimeout:       *handlerTimeout,
		IdleInTxTimeout:      *idleTx,
		ShutdownTimeout:      *shutdown,
		DatabaseTimeout:      *dbTimeout,
		// 0 on the command line is "no limit"; in Config it is "the default".
		FenceLogRetention: sink.FenceLogRetention{MaxAge: noLimit(*logAge), MaxEntries: noLimit(*logEntries)},
		ClientID:          "tenure-" + *name,
		KgoOpts:           kafkaOpts,
		Logger:            log,
		Hooks:             hooks(log),
		UnsafeNoFence:     *unsafeNoFence,
	}))
	if err != nil {
		return err
	}
	m.Attach(c)
	if addr != "" {
		hp, err := healthPool(*dbURL)
		if err != nil {
			return err
		}
		defer hp.Close()
		h := &health{c: c, m: m, db: hp, schema: *schema, wedged: wedgedAfter(*handlerTimeout),
			stopped: func() bool { return ctx.Err() != nil }, log: log}
		if err := serveHTTP(addr, reg, h); err != nil {
			return err
		}
	}
	if *unsafeNoFence {
		log.Warn("--unsafe-no-fence: batches commit WITHOUT the fence; a stale owner's writes land; for benchmarks only")
	}
	log.Info("worker starting", zap.Strings("topics", topics), zap.String("group", *group),
		zap.String("handler", *handler), zap.String("protocol", *protocol), zap.Int("pid", os.Getpid()),
		zap.String("export_store", exportStoreName(opts.ExportStore)))
	go func() {
		<-ctx.Done()
		if sig := stopSignal(ctx); sig != "" {
			log.Info("stopping gracefully (a second signal stops at once)", zap.String("signal", sig))
		}
	}()
	go watchWaiting(ctx, c, store, *group, topics, waitBounds{protocol: *protocol, session: *session, rebalance: *rebalance}, log)
	return c.Run(ctx)
}

// noLimit turns a flag's 0 ("no limit") into Config's negative.
func noLimit[T int | time.Duration](v T) T {
	if v == 0 {
		return -1
	}
	return v
}

// maxBatch bounds --batch-max: a lane buffers four batches.
const maxBatch = 100_000

// Bounds of the worker's durations. Kafka's brokers accept group session
// timeouts from group.min.session.timeout.ms to group.max.session.timeout.ms
// (6s and 30m by default; tenure's development broker goes down to 500ms);
// below a second kgo could not heartbeat often enough. Postgres takes
// lock_timeout (half the handler timeout) and
// idle_in_transaction_session_timeout in milliseconds up to 2^31-1 (24.8
// days): a day is the bound here.
const (
	minSession, maxSession = time.Second, 30 * time.Minute
	maxTxTimeout           = 24 * time.Hour
)

// checkDurations refuses, before anything starts, durations a broker or
// Postgres would refuse later, over and over.
func checkDurations(session, rebalance, handler, idleTx time.Duration) error {
	switch {
	case session < minSession || session > maxSession:
		return usagef("--session-timeout %s is out of range: it must be from %s to %s (Kafka's default bounds are 6s and 30m)", session, minSession, maxSession)
	case rebalance < minSession || rebalance > maxSession:
		return usagef("--rebalance-timeout %s is out of range: it must be from %s to %s", rebalance, minSession, maxSession)
	case handler <= 0 || handler > maxTxTimeout:
		return usagef("--handler-timeout %s is out of range: it must be positive and at most %s", handler, maxTxTimeout)
	case idleTx < 0 || idleTx > maxTxTimeout:
		return usagef("--idle-in-tx-timeout %s is out of range: it must be from 0 (which derives it from --handler-timeout: %s) to %s",
			idleTx, consumer.DefaultIdleInTxTimeout(handler), maxTxTimeout)
	case idleTx != 0 && idleTx <= handler:
		// Postgres would end the session of a job still within its time.
		return usagef("--idle-in-tx-timeout %s must be longer than --handler-timeout %s: Postgres would end the session of a job that is still within its time (leave it unset to derive it: %s)",
			idleTx, handler, consumer.DefaultIdleInTxTimeout(handler))
	case idleTx == 0 && consumer.DefaultIdleInTxTimeout(handler) > maxTxTimeout:
		return usagef("--handler-timeout %s leaves no room for the idle-in-transaction timeout, which must be longer and at most %s", handler, maxTxTimeout)
	}
	return nil
}

func defaultWorkerName() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		h = "worker"
	}
	return fmt.Sprintf("%s-%d", h, os.Getpid())
}

// holdHooks implements --hold-once: the first time the lane reaches the
// named point it logs "holding" and blocks until the process receives
// SIGCONT. A demo or test sends SIGSTOP once it sees "holding" (the worker
// is now frozen exactly inside the window between reading jobs and
// committing them), and later SIGCONT, which both resumes the process and
// releases the hold. Nothing else changes: what happens next is what would
// happen to any worker paused at that point.
//
// before-claim holds after the coordinator confirmed the epoch and just
// before the claim statement: the window a zombie of a reset group would
// be frozen in. before-claim:P holds there for partition P only.
func holdHooks(point string) (func(*zap.Logger) consumer.Hooks, error) {
	onlyPartition := int32(-1)
	if rest, ok := strings.CutPrefix(point, "before-claim:"); ok {
		n, err := strconv.ParseInt(rest, 10, 32)
		if err != nil || n < 0 {
			return nil, usagef("--hold-once %q: the partition after before-claim: is not a partition number", point)
		}
		point, onlyPartition = "before-claim", int32(n)
	}
	switch point {
	case "":
		return func(*zap.Logger) consumer.Hooks { return consumer.Hooks{} }, nil
	case "before-claim", "before-batch", "before-commit":
	default:
		return nil, usagef("--hold-once %q is not before-claim, before-claim:PARTITION, before-batch or before-commit", point)
	}
	return func(log *zap.Logger) consumer.Hooks {
		var once sync.Once
		hold := func(ctx context.Context, fields ...zap.Field) {
			once.Do(func() {
				cont := make(chan os.Signal, 1)
				signal.Notify(cont, syscall.SIGCONT)
				defer signal.Stop(cont)
				log.Info("holding", append(fields, zap.String("point", point), zap.Int("pid", os.Getpid()))...)
				select {
				case <-cont:
					log.Info("released", zap.String("point", point))
				case <-ctx.Done():
				}
			})
		}
		batchFields := func(b *consumer.Batch) []zap.Field {
			return []zap.Field{zap.String("topic", b.Topic), zap.Int32("partition", b.Partition),
				zap.Stringer("token", b.Token), zap.Int64("from", b.From), zap.Int64("to", b.To)}
		}
		var h consumer.Hooks
		switch point {
		case "before-claim":
			h.BeforeClaim = func(ctx context.Context, p sink.Partition, t sink.Token) {
				if onlyPartition >= 0 && p.Partition != onlyPartition {
					return
				}
				hold(ctx, zap.String("topic", p.Topic), zap.Int32("partition", p.Partition), zap.Stringer("token", t))
			}
		case "before-batch":
			h.BeforeBatch = func(ctx context.Context, b *consumer.Batch) { hold(ctx, batchFields(b)...) }
		case "before-commit":
			h.BeforeCommit = func(ctx context.Context, b *consumer.Batch) { hold(ctx, batchFields(b)...) }
		}
		return h
	}, nil
}

func exportStoreName(s export.ObjectStore) string {
	if s == nil {
		return ""
	}
	return s.String()
}
