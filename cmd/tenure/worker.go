package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/internal/jobs"
	"github.com/tenure-dev/tenure/sink"
)

func init() {
	register(command{name: "worker", summary: "run one worker replica", run: runWorker})
}

func runWorker(ctx context.Context, e *env, args []string) error {
	f := newFlagSet(e, "worker", "--brokers HOST:PORT[,..] --group G --topic T[,T2] --database-url URL --handler NAME [flags]")
	brokers := f.String("brokers", "", "Kafka seed brokers, comma separated")
	group := f.String("group", "", "consumer group shared by the replicas")
	topic := f.String("topic", "", "topics to consume, comma separated")
	dbURL := f.String("database-url", "", "PostgreSQL URL (libpq PG* variables fill in what it leaves out)")
	handler := f.String("handler", "", "built-in handler: "+strings.Join(jobs.Names(), ", "))
	schema := f.String("schema", sink.DefaultSchema, "Postgres schema of tenure's tables")
	protocol := f.String("protocol", "classic", "group protocol: classic (cooperative-sticky) or consumer (KIP-848)")
	session := f.Duration("session-timeout", 45*time.Second, "classic protocol session timeout (KIP-848: set on the broker)")
	rebalance := f.Duration("rebalance-timeout", 60*time.Second, "classic protocol rebalance timeout; revoked partitions get half of it to finish their batch")
	batchMax := f.Int("batch-max", 500, "most jobs per transaction")
	idleTx := f.Duration("idle-in-tx-timeout", 30*time.Second, "Postgres idle_in_transaction_session_timeout for batch transactions: how long a worker frozen mid-transaction can hold row locks (keep it below --handler-timeout)")
	maxAttempts := f.Int("max-attempts", 5, "attempts of a failing job before it is dead-lettered")
	handlerTimeout := f.Duration("handler-timeout", 60*time.Second, "bound on one handler call (a batch); a job that keeps timing out is dead-lettered")
	injectFaults := f.Bool("inject-faults", false, "tests and chaos runs: a job whose value contains \"tenure-fault\":\"error\" fails, \"panic\" panics, \"slow\" outlives the handler timeout")
	noMigrate := f.Bool("no-migrate", false, "do not apply pending migrations at start (fail if any are missing)")
	name := f.String("name", defaultWorkerName(), "this replica's name, recorded with what it writes")
	hold := f.String("hold-once", "", "demos and tests: the `point` (before-claim, before-batch or before-commit) at which to log \"holding\" once and wait for SIGCONT")
	metricsAddr := f.String("metrics-addr", "", "serve /metrics (Prometheus text) and /healthz on this address, e.g. 127.0.0.1:9100")
	logger := logFlags(f)
	if err := f.parse(args, 0); err != nil {
		return err
	}
	if err := required("brokers", *brokers, "group", *group, "topic", *topic, "database-url", *dbURL, "handler", *handler); err != nil {
		return err
	}
	if *protocol != string(consumer.Classic) && *protocol != string(consumer.NextGen) {
		return usagef("--protocol %q is not classic or consumer", *protocol)
	}
	if *batchMax < 1 {
		return usagef("--batch-max must be at least 1")
	}
	if *maxAttempts < 1 {
		return usagef("--max-attempts must be at least 1")
	}
	if *handlerTimeout <= 0 || *session <= 0 || *rebalance <= 0 || *idleTx < 0 {
		return usagef("--handler-timeout, --session-timeout and --rebalance-timeout must be positive, --idle-in-tx-timeout not negative")
	}
	if err := sink.ValidateSchema(*schema); err != nil {
		return usageError{err.Error()}
	}
	h, err := jobs.New(*handler, *schema, *name)
	if err != nil {
		return usageError{err.Error()}
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

	pool, err := openDB(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if *noMigrate {
		if err := sink.CheckSchema(ctx, pool, *schema); err != nil {
			return err
		}
	} else if applied, err := sink.Migrate(ctx, pool, *schema); err != nil {
		return fmt.Errorf("migrating schema %q: %w", *schema, err)
	} else if len(applied) > 0 {
		log.Info("migrations applied", zap.Ints("versions", applied), zap.String("schema", *schema))
	}
	store, err := sink.NewStore(pool, *schema)
	if err != nil {
		return err
	}

	brokerList, topics := splitList(*brokers), splitList(*topic)
	cl, err := kafkaClient(brokerList)
	if err != nil {
		return err
	}
	_, err = checkTopics(ctx, cl, brokerList, topics)
	cl.Close()
	if err != nil {
		return err
	}

	c, err := consumer.New(consumer.Config{
		Brokers: brokerList, Group: *group, Topics: topics,
		Store: store, Handler: h,
		Protocol:         consumer.Protocol(*protocol),
		SessionTimeout:   *session,
		RebalanceTimeout: *rebalance,
		BatchMax:         *batchMax,
		MaxAttempts:      *maxAttempts,
		HandlerTimeout:   *handlerTimeout,
		IdleInTxTimeout:  *idleTx,
		ClientID:         "tenure-" + *name,
		Logger:           log,
		Hooks:            hooks(log),
	})
	if err != nil {
		return err
	}
	if *metricsAddr != "" {
		if err := serveMetrics(ctx, *metricsAddr, c, log); err != nil {
			return err
		}
	}
	log.Info("worker starting", zap.Strings("topics", topics), zap.String("group", *group),
		zap.String("handler", *handler), zap.String("protocol", *protocol), zap.Int("pid", os.Getpid()))
	return c.Run(ctx)
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
func holdHooks(point string) (func(*zap.Logger) consumer.Hooks, error) {
	switch point {
	case "":
		return func(*zap.Logger) consumer.Hooks { return consumer.Hooks{} }, nil
	case "before-claim", "before-batch", "before-commit":
	default:
		return nil, usagef("--hold-once %q is not before-claim, before-batch or before-commit", point)
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
