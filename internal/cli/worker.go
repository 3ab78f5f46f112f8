package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/export"
	"github.com/tenure-dev/tenure/internal/fence"
	"github.com/tenure-dev/tenure/internal/jobs"
	"github.com/tenure-dev/tenure/internal/otelsetup"
	"github.com/tenure-dev/tenure/metrics"
	"github.com/tenure-dev/tenure/sink"
)

var workerSpec = spec{name: "worker", short: "run one worker replica"}

// workerCmd is `tenure worker`: one replica of a group's workers. Its
// steps: check the flags (check); build the consumer's configuration and
// let consumer.New check it, before anything connects (configure); open
// the database, migrating the schema if it is behind (database); check
// the topics exist; serve --http-addr; run until a signal stops it.
type workerCmd struct {
	base
	kafka kafkaFlags
	logs  logFlags

	group, topic, dbURL, handler, schema, protocol, name              string
	exportStore, jobIDHeader, httpAddr, metricsAddr, hold, cpuProfile string
	stageLogFile                                                      string

	session, rebalance, batchLinger, idleTx, handlerTimeout time.Duration
	dbTimeout, shutdown, logAge                             time.Duration
	batchMax, maxAttempts, logEntries, dbMaxConns, span     int
	spanTxs                                                 int
	batchMaxBytes, partitionBuffer, workerBuffer            int64

	injectFaults, noMigrate, createSchema, unsafeNoFence, requireSync bool

	// strict hand-off (G3-strict)
	strict, strictCurGen bool
	strictCoordinator    string
	preparedRole         string

	// addr is where /healthz, /readyz and /metrics are served ("": not).
	addr string
	f    *flagSet
}

func (w *workerCmd) define(f *flagSet) {
	w.f = f
	w.kafka.define(f, brokersUsage, required)
	f.String(&w.group, "group", "", "consumer group shared by the replicas", arg("G"), required)
	f.String(&w.topic, "topic", "", "topics to consume, comma separated", arg("T[,T2]"), required)
	f.String(&w.dbURL, "database-url", "", "PostgreSQL URL (libpq PG* variables fill in what it leaves out)", arg("URL"), required)
	f.String(&w.handler, "handler", "", "built-in handler: "+strings.Join(jobs.Names(), ", "), arg(strings.Join(jobs.Names(), "|")), required)
	f.String(&w.schema, "schema", sink.DefaultSchema, "Postgres schema of tenure's tables", arg("S"))
	f.String(&w.name, "name", defaultWorkerName(), "this replica's name, recorded with what it writes")
	f.String(&w.protocol, "protocol", string(consumer.Classic), "group protocol: classic (cooperative-sticky) or consumer (KIP-848)", arg("classic|consumer"))
	f.Duration(&w.session, "session-timeout", consumer.DefaultSessionTimeout, "classic protocol session timeout (KIP-848: set on the broker)")
	f.Duration(&w.rebalance, "rebalance-timeout", consumer.DefaultRebalanceTimeout, "classic protocol rebalance timeout; revoked partitions get half of it to finish their batch")
	f.Int(&w.batchMax, "batch-max", consumer.DefaultBatchMax, "most jobs per transaction; a lane takes what it has buffered, up to this, so batches grow with the backlog")
	f.Bytes(&w.batchMaxBytes, "batch-max-bytes", consumer.DefaultBatchMaxBytes, "most bytes (keys, values, headers) per transaction; a larger job makes a batch of its own")
	f.Int(&w.span, "commit-span", consumer.DefaultCommitSpan, "the most partitions whose ready batches share one Postgres transaction and one fence statement (1: each batch its own; more shares a COMMIT and a fence round trip among partitions that carry few jobs each, and a failed transaction costs each batch in it a retry; a few waiting batches still go side by side; 1 with --strict, which takes no other)", arg("N"))
	f.Int(&w.spanTxs, "commit-transactions", consumer.DefaultCommitTransactions, "with --commit-span above 1, how many transactions the worker runs at once; each takes its share of the waiting batches, so fewer share more (1: every waiting batch goes into the next)", arg("N"))
	f.Duration(&w.batchLinger, "batch-linger", 0, "how long a lane with less than a full batch waits for more (0: at once; a few ms makes fewer, larger batches at moderate load, at that much latency)")
	f.Bytes(&w.partitionBuffer, "partition-buffer-bytes", consumer.DefaultPartitionBufferBytes, "the records one partition holds ahead of its handler: fetching it pauses there")
	f.Bytes(&w.workerBuffer, "worker-buffer-bytes", consumer.DefaultWorkerBufferBytes, "the records all partitions together hold, buffered and in the batches being handled: past it, every partition's fetching pauses; it bounds the worker's memory whatever the backlog and the partition count, and sizes the fetches (a 128th of it per response; docs/operations.md, \"Memory\")")
	f.Int(&w.maxAttempts, "max-attempts", consumer.DefaultMaxAttempts, "attempts of a failing job before it is dead-lettered")
	f.Duration(&w.handlerTimeout, "handler-timeout", consumer.DefaultHandlerTimeout, "bound on one handler call (a batch); a job that keeps timing out is dead-lettered")
	f.Duration(&w.idleTx, "idle-in-tx-timeout", 0, "Postgres idle_in_transaction_session_timeout for batch transactions: how long a worker frozen mid-transaction can hold row locks; it must be longer than --handler-timeout (default: --handler-timeout plus a quarter, at least 1s more)")
	f.Duration(&w.shutdown, "shutdown-timeout", consumer.DefaultShutdownTimeout, "graceful stop: how long in-flight batches may finish before their handlers are cancelled; a stop takes at most this plus 18s (a commit in flight, then leaving the group), so give containers a grace period above that")
	f.Duration(&w.dbTimeout, "database-timeout", 0, "how long the database may not answer before this worker gives its partitions up (leaves the group) until it answers again; 0 derives it: the session timeout, at least 10s; negative never gives them up")
	f.Bool(&w.noMigrate, "no-migrate", false, "do not apply pending migrations at start (fail if any are missing)")
	f.Bool(&w.createSchema, "create-schema", false, "create --schema (and migrate it) if the database does not have it; without it a worker whose schema does not exist refuses to start, naming the schemas that hold tenure tables (a mistyped --schema must not start a new, empty one)")
	f.Bool(&w.strict, "strict", false, "strict hand-off (G3-strict, docs/fencing.md): a batch becomes visible only if the group coordinator accepted its offset commit while its assignment was the partition's current one (PREPARE TRANSACTION, offset commit, COMMIT PREPARED); needs max_prepared_transactions above 0, costs an offset commit and a round trip per batch")
	f.String(&w.strictCoordinator, "strict-coordinator", "", "with --strict and --protocol consumer (KIP-848): declare the group coordinator's offset commit rule; only \"kafka\" (Apache Kafka 4.0 or later) is sound (kfake's is not, and the protocol cannot tell them apart)", arg("kafka"))
	f.String(&w.preparedRole, "prepared-role", "", "the role every worker's login role shares (the schema's worker role, migrate --print-roles) that strict batches are prepared and finished as, so that any worker may finish another's; default: the role granted on the schema's tables that this login role is a member of, if exactly one, else the login role", arg("ROLE"))
	f.Bool(&w.strictCurGen, "unsafe-strict-current-generation", false, "tests only: strict lanes commit offsets at the client's current generation instead of their own assignment's (unsafe: shows that the tests catch it)", testOnly)
	f.Bool(&w.requireSync, "require-sync-standby", false, "refuse to start unless the database acknowledges commits only once a synchronous standby has them (see docs/fencing.md, \"Running on highly available Postgres\")")
	f.Int(&w.dbMaxConns, "db-max-conns", 32, "the most database connections this worker opens: one per partition whose batch runs, plus a few; 1 in 8 (1 to 4) is kept from the batches for claims")
	f.Duration(&w.logAge, "fence-log-max-age", consumer.DefaultFenceLogMaxAge, "prune fence log entries older than this from the partitions this worker holds (0: the default; negative: no age limit)")
	f.Int(&w.logEntries, "fence-log-max-entries", consumer.DefaultFenceLogMaxEntries, "keep at most this many fence log entries per partition (0: the default; negative: no count limit; both negative keep the whole log)")
	f.String(&w.exportStore, "export-store", "", "export handler: publish to this object store (file:///path or s3://bucket/prefix?endpoint=URL&region=R) through staged immutable objects and a fenced pointer, instead of the exports table; see docs/export.md", arg("URL"))
	f.String(&w.jobIDHeader, "job-id-header", "", "export handler with --export-store: skip a job whose key and value of this header (a producer-supplied job id) were already processed, recording the skip", arg("H"))
	f.String(&w.httpAddr, "http-addr", "", "serve /healthz (alive, not wedged), /readyz (joined the group, database reachable, schema current) and /metrics (Prometheus) on this address, e.g. 0.0.0.0:8080", arg("ADDR"))
	f.String(&w.metricsAddr, "metrics-addr", "", "deprecated name of --http-addr (logged as a warning)", arg("ADDR"))
	w.logs.define(f, "json", "info")
	f.String(&w.hold, "hold-once", "", "demos and tests: the point (before-claim, before-batch or before-commit; before-claim:P for partition P only) at which to log \"holding\" once and wait for SIGCONT", arg("POINT"), testOnly)
	f.Bool(&w.injectFaults, "inject-faults", false, "tests and chaos runs: a job whose value contains \"tenure-fault\":\"error\" fails, \"panic\" panics, \"slow\" outlives the handler timeout", testOnly)
	f.Bool(&w.unsafeNoFence, "unsafe-no-fence", false, "benchmarks only (tenure bench): commit batches WITHOUT the fence; the guarantee is gone", testOnly)
	f.String(&w.cpuProfile, "cpu-profile", "", "benchmarks (tenure bench): write a CPU profile of the worker's whole run to FILE when it stops (go tool pprof; %p in FILE is the process id)", arg("FILE"), testOnly)
	f.String(&w.stageLogFile, "stage-log", "", "benchmarks (tenure bench): write the times of each fetch and committed batch (fetched, formed, handled, committed) to FILE when the worker stops, for the latency breakdown", arg("FILE"), testOnly)
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

// check refuses, before anything connects, what consumer.New does not
// check or words by the configuration's field rather than the flag: names,
// durations a broker or Postgres would refuse later, over and over, sizes
// and counts that must be given (not 0), and flags that go together. A 0
// the command line takes means what it means in consumer.Config, the
// default (or the value derived from other fields); a flag's default is
// Config's, from consumer's Default constants.
func (w *workerCmd) check([]string) error {
	if err := validGroup("group", w.group); err != nil {
		return err
	}
	if err := validTopics("topic", splitList(w.topic)); err != nil {
		return err
	}
	if err := consumer.ValidateClientID(w.name); err != nil {
		return usagef("--name: %v", strings.Replace(err.Error(), "client id", "worker name", 1))
	}
	if err := sink.ValidateSchema(w.schema); err != nil {
		return err
	}
	if err := w.checkSizes(); err != nil {
		return err
	}
	if err := checkDurations(w.session, w.rebalance, w.handlerTimeout, w.idleTx); err != nil {
		return err
	}
	if w.dbTimeout > maxSession {
		return usagef("--database-timeout %s is out of range: it must be at most %s (0 derives it: %s)", w.dbTimeout, maxSession, consumer.DefaultDatabaseTimeout(w.session))
	}
	if w.shutdown <= 0 || w.shutdown > maxSession {
		return usagef("--shutdown-timeout %s is out of range: it must be positive and at most %s", w.shutdown, maxSession)
	}
	w.addr = w.httpAddr
	if w.metricsAddr != "" {
		if w.addr != "" && w.addr != w.metricsAddr {
			return usagef("--metrics-addr is the deprecated name of --http-addr: give one")
		}
		w.addr = w.metricsAddr
	}
	if w.createSchema && w.noMigrate {
		return usagef("--create-schema creates and migrates the schema, --no-migrate forbids migrating it: give one")
	}
	if w.exportStore != "" && w.handler != "export" {
		return usagef("--export-store is for --handler export, not %s", w.handler)
	}
	if w.jobIDHeader != "" && w.exportStore == "" {
		return usagef("--job-id-header needs --export-store")
	}
	if (w.strict || w.unsafeNoFence) && (w.f == nil || !w.f.given("commit-span")) {
		w.span = 1 // as consumer.Config has it: their commit paths take one batch a transaction
	}
	switch {
	case w.strict && w.unsafeNoFence:
		return usagef("--strict and --unsafe-no-fence exclude each other")
	case w.span < 1 || w.span > 1000:
		return usagef("--commit-span %d is not between 1 and 1000", w.span)
	case w.spanTxs < 1 || w.spanTxs > 64:
		return usagef("--commit-transactions %d is not between 1 and 64", w.spanTxs)
	case w.span > 1 && w.strict:
		return usagef("--commit-span %d is not for --strict: a strict batch is prepared and its offset committed in a transaction of its own", w.span)
	case w.span > 1 && w.unsafeNoFence:
		return usagef("--commit-span %d needs the fence: leave it at 1 with --unsafe-no-fence", w.span)
	case w.strictCoordinator != "" && !w.strict:
		return usagef("--strict-coordinator is for --strict")
	case w.strictCurGen && !w.strict:
		return usagef("--unsafe-strict-current-generation is for --strict")
	case w.strict && w.protocol == string(consumer.NextGen) && w.strictCoordinator != consumer.StrictCoordinatorKafka:
		return usagef("--strict with --protocol consumer needs --strict-coordinator kafka: strict hand-off under KIP-848 holds only on Apache Kafka's offset commit rule (4.0 or later), which the protocol cannot tell from kfake's, which accepts an ended assignment's commit")
	case w.strictCoordinator != "" && w.strictCoordinator != consumer.StrictCoordinatorKafka:
		return usagef("--strict-coordinator %q is not kafka", w.strictCoordinator)
	}
	return nil
}

// checkSizes checks the counts and sizes; 0 is refused where the flag's
// default is not 0 (Config would read it as that default, which the flag
// already shows).
func (w *workerCmd) checkSizes() error {
	switch {
	case w.dbMaxConns < 2 || w.dbMaxConns > 10000:
		return usagef("--db-max-conns %d is not between 2 and 10000", w.dbMaxConns)
	case w.batchMax < 1 || w.batchMax > maxBatch:
		return usagef("--batch-max must be from 1 to %d", maxBatch)
	case w.batchMaxBytes < 1<<10 || w.partitionBuffer < 64<<10 || w.workerBuffer < w.partitionBuffer:
		return usagef("--batch-max-bytes must be at least 1KiB, --partition-buffer-bytes at least 64KiB, and --worker-buffer-bytes at least --partition-buffer-bytes")
	case w.batchLinger < 0 || w.batchLinger > time.Minute:
		return usagef("--batch-linger %s is out of range: from 0 to 1m", w.batchLinger)
	case w.maxAttempts < 1:
		return usagef("--max-attempts must be at least 1")
	}
	return nil
}

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
		// consumer.New refuses it too; this says it by the flags' names.
		return usagef("--idle-in-tx-timeout %s must be longer than --handler-timeout %s: Postgres would end the session of a job that is still within its time (leave it unset to derive it: %s)",
			idleTx, handler, consumer.DefaultIdleInTxTimeout(handler))
	case idleTx == 0 && consumer.DefaultIdleInTxTimeout(handler) > maxTxTimeout:
		return usagef("--handler-timeout %s leaves no room for the idle-in-transaction timeout, which must be longer and at most %s", handler, maxTxTimeout)
	}
	return nil
}

func (w *workerCmd) run(ctx context.Context) error {
	log, err := w.logs.logger(w.env)
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()
	log = log.With(zap.String("worker", w.name))
	cfg, m, reg, err := w.configure(ctx, log)
	if err != nil {
		return err
	}
	if w.stageLogFile != "" {
		sl := newStageLog()
		cfg.Hooks = sl.hooks(cfg.Hooks)
		cfg.KgoOpts = append(cfg.KgoOpts, kgo.WithHooks(sl))
		defer func() {
			if err := sl.write(w.stageLogFile); err != nil {
				log.Error("--stage-log: writing failed", zap.Error(err))
			}
		}()
	}
	// Tracing, from the OTEL_* environment; off unless it asks for it.
	tr, err := otelsetup.Setup(ctx, "tenure-worker", w.name, func(err error) {
		log.Warn("tracing: OpenTelemetry SDK error (spans may be lost; jobs are not affected)", zap.Error(err))
	})
	if err != nil {
		return usageError{msg: err.Error()}
	}
	defer func() { _ = tr.Close() }()
	if tr.On() {
		cfg.TracerProvider, cfg.TracePropagator = tr.Provider, tr.Propagator
		log.Info("tracing batches with OpenTelemetry", zap.String("otlp_endpoint", tr.Endpoint))
	}
	if w.metricsAddr != "" {
		log.Warn("--metrics-addr (TENURE_METRICS_ADDR) is deprecated: use --http-addr (TENURE_HTTP_ADDR), which serves /readyz too")
	}
	pool, store, err := w.database(ctx, log, tr.PgxTracer())
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := w.topicsExist(ctx); err != nil {
		return err
	}
	cfg.Store = store
	// Instrumented only now: the collector reads the lag through the store.
	c, err := consumer.New(m.Instrument(cfg))
	if err != nil {
		return err
	}
	m.Attach(c)
	if w.addr != "" {
		hp, err := healthPool(w.dbURL)
		if err != nil {
			return err
		}
		defer hp.Close()
		h := &health{c: c, m: m, db: hp, schema: w.schema, wedged: wedgedAfter(w.handlerTimeout),
			stopped: func() bool { return ctx.Err() != nil }, log: log}
		if err := serveHTTP(w.addr, reg, h); err != nil {
			return err
		}
	}
	if w.strictCurGen {
		log.Warn("--unsafe-strict-current-generation: strict lanes commit offsets at the client's current generation; G3-strict does not hold; for tests only")
	}
	if w.unsafeNoFence {
		log.Warn("--unsafe-no-fence: batches commit WITHOUT the fence; a stale owner's writes land; for benchmarks only")
	}
	topics := splitList(w.topic)
	fields := []zap.Field{zap.Strings("topics", topics), zap.String("group", w.group),
		zap.String("handler", w.handler), zap.String("protocol", w.protocol), zap.Int("pid", os.Getpid()),
		zap.String("export_store", w.exportStore)}
	if w.strict {
		fields = append(fields, zap.Bool("strict", true), zap.String("strict_coordinator", w.strictCoordinator))
	}
	log.Info("worker starting", fields...)
	go func() {
		<-ctx.Done()
		if sig := stopSignal(ctx); sig != "" {
			log.Info("stopping gracefully (a second signal stops at once)", zap.String("signal", sig))
		}
	}()
	go watchWaiting(ctx, c, store, w.group, topics, waitBounds{protocol: w.protocol, session: w.session, rebalance: w.rebalance}, log)
	if w.cpuProfile != "" {
		stop, err := startCPUProfile(w.cpuProfile)
		if err != nil {
			return err
		}
		defer stop()
	}
	return c.Run(ctx)
}

// startCPUProfile profiles the process's CPU into file until stop is
// called: tenure bench's answer to "where does the time go". A %p in file
// is the process id, so that several workers given the same flags each
// write their own.
func startCPUProfile(file string) (stop func(), err error) {
	f, err := os.Create(strings.ReplaceAll(file, "%p", strconv.Itoa(os.Getpid())))
	if err != nil {
		return nil, fmt.Errorf("--cpu-profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("--cpu-profile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}, nil
}

// configure builds the consumer's configuration, all but its store, and
// has consumer.New check it before anything connects: what New refuses is
// bad usage, in New's own words. The metrics collector and registry come
// with it (kgo's hooks are among the options).
func (w *workerCmd) configure(ctx context.Context, log *zap.Logger) (consumer.Config, *metrics.Collector, *prometheus.Registry, error) {
	var opts jobs.Options
	if w.exportStore != "" {
		st, err := export.Open(ctx, w.exportStore)
		if err != nil {
			return consumer.Config{}, nil, nil, usageError{msg: err.Error()}
		}
		opts.ExportStore, opts.JobIDHeader = st, w.jobIDHeader
		w.exportStore = st.String()
	}
	h, err := jobs.NewWith(w.handler, w.schema, w.name, opts)
	if err != nil {
		return consumer.Config{}, nil, nil, usageError{msg: err.Error()}
	}
	if w.injectFaults {
		h = jobs.InjectFaults(h)
	}
	hooks, err := holdHooks(w.hold)
	if err != nil {
		return consumer.Config{}, nil, nil, err
	}
	// TLS and SASL, checked before anything connects.
	kafkaOpts, err := w.kafka.kgoOpts(func(msg string) { log.Warn(msg) })
	if err != nil {
		return consumer.Config{}, nil, nil, err
	}
	m := metrics.New(metrics.Options{})
	reg := prometheus.NewRegistry()
	if w.addr != "" {
		reg.MustRegister(m, metrics.BuildInfo())
		// kgo's own metrics: connections and connection errors per broker
		// (TLS and SASL failures show there), bytes, buffered records.
		kafkaOpts = append(kafkaOpts, kgo.WithHooks(metrics.KafkaHooks(reg)))
	}
	cfg := consumer.Config{
		Brokers: w.kafka.list(), Group: w.group, Topics: splitList(w.topic),
		Handler:              h,
		Protocol:             consumer.Protocol(w.protocol),
		SessionTimeout:       w.session,
		RebalanceTimeout:     w.rebalance,
		BatchMax:             w.batchMax,
		BatchMaxBytes:        w.batchMaxBytes,
		BatchLinger:          w.batchLinger,
		CommitSpan:           w.span,
		CommitTransactions:   w.spanTxs,
		PartitionBufferBytes: w.partitionBuffer,
		WorkerBufferBytes:    w.workerBuffer,
		MaxAttempts:          w.maxAttempts,
		HandlerTimeout:       w.handlerTimeout,
		IdleInTxTimeout:      w.idleTx,
		ShutdownTimeout:      w.shutdown,
		DatabaseTimeout:      w.dbTimeout,
		FenceLogRetention:    sink.FenceLogRetention{MaxAge: w.logAge, MaxEntries: w.logEntries},
		ClientID:             "tenure-" + w.name,
		KgoOpts:              kafkaOpts,
		Logger:               log,
		Hooks:                hooks(log),
		UnsafeNoFence:        w.unsafeNoFence,

		Strict:                        w.strict,
		StrictCoordinator:             w.strictCoordinator,
		UnsafeStrictCurrentGeneration: w.strictCurGen,
	}
	// New does no I/O and only keeps the store, so a stand-in lets it
	// check the configuration now; the real store needs the database.
	check := cfg
	check.Store = new(sink.Store)
	if _, err := consumer.New(check); err != nil {
		if errors.Is(err, consumer.ErrReservedKgoOpt) {
			return consumer.Config{}, nil, nil, err
		}
		return consumer.Config{}, nil, nil, usageError{msg: err.Error()}
	}
	return cfg, m, reg, nil
}

// database opens the pool, brings the schema up to date unless
// --no-migrate, and says how the database acknowledges commits
// (--require-sync-standby refuses to start without a synchronous standby).
func (w *workerCmd) database(ctx context.Context, log *zap.Logger, tracer pgx.QueryTracer) (*pgxpool.Pool, *sink.Store, error) {
	// Every lane holds a connection while its batch runs: size the pool
	// for the partitions a worker may hold, and open a few up front (a
	// lazy pool adds tens of milliseconds at start and after a hand-off).
	pool, err := openDB(ctx, w.dbURL, poolSize{max: int32(w.dbMaxConns), min: int32(min(w.dbMaxConns, 4)), tracer: tracer})
	if err != nil {
		return nil, nil, err
	}
	store, err := w.schemaReady(ctx, pool, log)
	if err == nil {
		var pooled bool
		if pooled, err = pooler(ctx, pool); pooled {
			store.SetPooled(true)
			log.Info("the database URL leads through a connection pooler: transaction pooling mode (docs/pgbouncer.md)")
		}
	}
	if err == nil && w.preparedRole != "" {
		store.SetPreparedRole(w.preparedRole)
	}
	if err == nil && w.strict {
		err = sink.CheckPreparedTransactions(ctx, pool)
	}
	if err == nil && w.strict {
		err = fence.Of(store).CheckStrictRole(ctx)
	}
	if err == nil {
		err = w.checkReplication(ctx, pool, log)
	}
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return pool, store, nil
}

// migrateDirect refuses a migration through a connection pooler
// (errMigrateThroughPooler).
func (w *workerCmd) migrateDirect(ctx context.Context, pool *pgxpool.Pool) error {
	pooled, err := pooler(ctx, pool)
	if err == nil && pooled {
		err = fmt.Errorf("schema %q needs migrating, but %w", w.schema, errMigrateThroughPooler)
	}
	return err
}

// schemaReady migrates the schema if it is behind. A current schema is not
// migrated: a worker with a least-privilege role (tenure migrate
// --print-roles) may not run DDL, not even CREATE SCHEMA IF NOT EXISTS. A
// schema the database does not have is created only with --create-schema:
// a mistyped --schema would otherwise start a new, empty schema, and the
// group from its Kafka offsets as if it were new.
func (w *workerCmd) schemaReady(ctx context.Context, pool *pgxpool.Pool, log *zap.Logger) (*sink.Store, error) {
	exists, err := schemaExists(ctx, pool, w.schema)
	switch {
	case err != nil:
		return nil, fmt.Errorf("looking up schema %q: %s", w.schema, pgxCauseOf(err))
	case !exists && w.noMigrate:
		return nil, missingSchema(ctx, pool, w.schema)
	case !exists && !w.createSchema:
		return nil, missingSchema(ctx, pool, w.schema, "pass --create-schema")
	case !exists:
		if err := w.migrateDirect(ctx, pool); err != nil {
			return nil, err
		}
		log.Info("creating schema (--create-schema)", zap.String("schema", w.schema))
	}
	switch behind := sink.CheckSchema(ctx, pool, w.schema); {
	case behind == nil:
	case w.noMigrate:
		return nil, behind
	default:
		if err := w.migrateDirect(ctx, pool); err != nil {
			return nil, err
		}
		applied, err := sink.Migrate(ctx, pool, w.schema)
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &pgErr) && pgErr.Code == sink.CodeInsufficientPrivilege:
			return nil, fmt.Errorf("%v; this worker's database role may not migrate it (%s): run `tenure migrate up --schema %s` as the schema's owner", behind, pgErr.Message, w.schema)
		case err != nil:
			return nil, fmt.Errorf("migrating schema %q: %w", w.schema, err)
		case len(applied) > 0:
			log.Info("migrations applied", zap.Ints("versions", applied), zap.String("schema", w.schema))
		}
	}
	return sink.NewStore(pool, w.schema)
}

// checkReplication logs whether commits wait for a synchronous standby, and
// refuses to start without one with --require-sync-standby.
func (w *workerCmd) checkReplication(ctx context.Context, pool *pgxpool.Pool, log *zap.Logger) error {
	repl, err := sink.ReplicationOf(ctx, pool)
	switch {
	case err != nil:
		log.Warn("cannot tell how the database acknowledges commits", zap.Error(err))
		if w.requireSync {
			return fmt.Errorf("--require-sync-standby: cannot tell whether the database has a synchronous standby: %v", err)
		}
	case !repl.Synchronous():
		if w.requireSync {
			return fmt.Errorf("--require-sync-standby: %s", repl.Describe())
		}
		log.Warn("no synchronous standby: "+repl.Describe(), zap.String("synchronous_standby_names", repl.SynchronousStandbyNames),
			zap.String("synchronous_commit", repl.SynchronousCommit), zap.Int("standbys", repl.Standbys), zap.Int("sync_standbys", repl.SyncStandbys))
	default:
		log.Info("replication: "+repl.Describe(), zap.Int("sync_standbys", repl.SyncStandbys))
	}
	return nil
}

// topicsExist says which topic does not exist, and how to create it.
func (w *workerCmd) topicsExist(ctx context.Context) error {
	cl, err := w.kafka.client(w.kafka.list())
	if err != nil {
		return err
	}
	defer cl.Close()
	_, err = checkTopics(ctx, cl, w.kafka.list(), splitList(w.topic))
	return err
}

func defaultWorkerName() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		h = "worker"
	}
	return fmt.Sprintf("%s-%d", h, os.Getpid())
}
