package consumer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/tenure-dev/tenure/sink"
)

// Protocol selects the consumer group protocol.
type Protocol string

const (
	// Classic is the client-driven protocol with the cooperative-sticky
	// balancer. The token is the group generation.
	Classic Protocol = "classic"
	// NextGen is KIP-848's broker-driven protocol (Kafka 4.0+). The token is
	// the member epoch at which the partition was assigned.
	NextGen Protocol = "consumer"
)

// Config configures a Consumer. Zero values mean the documented defaults.
type Config struct {
	// Brokers are the seed brokers, host:port. Required.
	Brokers []string
	// Group is the consumer group. Required. Every replica of a worker uses
	// the same group; the group's assignment decides who owns each partition.
	// It must pass ValidateGroup.
	Group string
	// Topics to consume. Required; each must pass ValidateTopic (Kafka's
	// rules for topic names).
	Topics []string
	// Store is the fencing state in Postgres. Required; its pool also runs the
	// handler's transactions.
	Store *sink.Store
	// Handler processes batches. Required.
	Handler Handler

	// Protocol is Classic (default) or NextGen.
	Protocol Protocol
	// SessionTimeout is the classic protocol's session timeout (default
	// 45s, kgo's). Under NextGen the broker sets it
	// (group.consumer.session.timeout.ms) and this is ignored.
	SessionTimeout time.Duration
	// RebalanceTimeout is the classic protocol's rebalance timeout (default
	// 60s). Revoked partitions get at most half of it to finish their
	// in-flight batch.
	RebalanceTimeout time.Duration

	// BatchMax is the most records handed to one Handle call (default
	// DefaultBatchMax). A lane hands over what it has buffered, up to this:
	// batches are small under light load and grow with a backlog, where
	// each one's fixed cost (a transaction, the fence) is shared by more
	// jobs.
	BatchMax int
	// BatchMaxBytes bounds a batch's size (keys, values and headers; a
	// record larger than it makes a batch of its own). Default 4 MiB.
	BatchMaxBytes int64
	// BatchLinger is how long a lane with fewer than BatchMax records
	// buffered waits for more before handing them over (default 0: at
	// once). A small linger makes fewer, larger batches under moderate
	// load, at that much latency.
	BatchLinger time.Duration
	// CommitSpan is the most lanes whose ready batches share one Postgres
	// transaction (0: DefaultCommitSpan, or 1 with Strict or UnsafeNoFence;
	// 1: each batch its own).
	// Above 1, a lane whose batch is ready hands it to the worker's joint
	// committer; each transaction takes its share of what is waiting (the
	// waiting batches over the transactions that run at once), up to
	// CommitSpan batches, runs each in a savepoint of its own, and ends
	// with one fence statement over all their partitions and COMMIT. The
	// guarantee holds per partition unchanged: if any partition is refused
	// nothing of the transaction commits, and the others go again without
	// it. What it trades: with many partitions each carrying few jobs, one
	// COMMIT and one fence round trip are shared by several lanes, at the
	// price of a SAVEPOINT and a RELEASE per batch (per call for a
	// BatchesHandler; a transaction that takes a single batch skips them);
	// in exchange a batch waits for the handlers of the
	// batches ahead of it in the same transaction (never for more to
	// arrive: nothing lingers past BatchLinger), and a failure of the
	// transaction itself (a lost connection, a handler timeout that closes
	// the connection, a refused partition) costs every batch in it a
	// retry, and a handler that ends the transaction itself (COMMIT in its
	// SQL) halts every partition whose batch it committed outside the
	// fence. A worker runs at most CommitTransactions joint transactions
	// at once, so that batches queue and share them; DefaultCommitSpan
	// says what it measured. Strict and UnsafeNoFence keep one transaction
	// per batch: New refuses CommitSpan above 1 with either.
	CommitSpan int
	// CommitTransactions is how many joint transactions (CommitSpan above
	// 1) a worker runs at once (0: DefaultCommitTransactions), fewer if
	// the pool has fewer connections for batches. Each takes its share of
	// the waiting batches, so fewer share more: 1 puts every batch that
	// waits into the next transaction.
	CommitTransactions int
	// PartitionBufferBytes bounds the records one partition's lane holds
	// ahead of its handler (default 4 MiB, and 4*BatchMax records): fetching
	// the partition pauses there and resumes below half.
	//
	// WorkerBufferBytes bounds the records all lanes together hold, buffered
	// and in the batches being handled, whatever the number of partitions
	// (default DefaultWorkerBufferBytes, 32 MiB): once a poll takes them
	// past it, every partition of the worker pauses until the lanes have
	// drained half. They can exceed it by the poll that crossed it: a
	// response of at most WorkerBufferBytes/128 on the wire from each broker
	// that leads some of the worker's partitions (kgo fetches from each at
	// once; kgo.MaxConcurrentFetches in KgoOpts bounds that count).
	//
	// Fetches are sized from them (a response at most WorkerBufferBytes/128
	// on the wire, a partition's share PartitionBufferBytes/32: compressed
	// bytes, decoded several times larger), so memory stays bounded
	// whatever the backlog and the partition count; docs/operations.md
	// ("Memory") says which bound covers which part of a worker's memory.
	// A record counts its key, value and headers, and 168 bytes for kgo's
	// Record and the pointer to it.
	PartitionBufferBytes, WorkerBufferBytes int64
	// FetchMaxWait is how long the broker may hold a fetch open waiting for
	// records (default 100ms). A partition resumed while a fetch is open is
	// fetched when it returns, so this bounds how long a drained lane can
	// wait for records that are there.
	FetchMaxWait time.Duration
	// MaxAttempts is how many times a job that makes the handler fail is
	// tried before it is dead-lettered (default 5). A failing batch is retried
	// once, then split in halves until the failing job is alone; the other
	// jobs commit. A job whose handler returned a Permanent error or panicked
	// is dead-lettered without more attempts. Failures that are not the
	// job's (tenure's own database work, the batch's connection breaking, a
	// Transient error, a SQL error that says the environment is wrong; see
	// Handler) are retried without limit and never dead-letter anything.
	MaxAttempts int
	// HandlerTimeout bounds one Handle call (default 60s; negative: no
	// bound). A batch that times out fails like any other: it is the job's
	// failure.
	HandlerTimeout time.Duration
	// RetryBackoff is the first retry's delay (default 100ms); it doubles per
	// attempt up to RetryBackoffMax (default 5s).
	RetryBackoff, RetryBackoffMax time.Duration
	// ClaimTimeout bounds the claims made when partitions are assigned
	// (default 30s). Transient database errors are retried within it; past
	// it the group session is abandoned and rejoined, so nothing is ever
	// processed unclaimed.
	ClaimTimeout time.Duration
	// IdleInTxTimeout is set as Postgres's idle_in_transaction_session_timeout
	// on every batch transaction. A worker paused in the middle of a
	// transaction would otherwise hold its row locks, and the new owner would
	// wait for a zombie.
	//
	// It must be longer than HandlerTimeout. Postgres counts it while the
	// session is idle in the transaction, which is while the handler does
	// work other than SQL between its statements; a job within
	// HandlerTimeout must never have its session ended under it (its next
	// statement, or the commit, would fail on a dead connection, over and
	// over). Zero (the default) derives it with DefaultIdleInTxTimeout:
	// HandlerTimeout plus a quarter, at least one second more (75s for the
	// default 60s); with no HandlerTimeout it is disabled. Negative disables
	// it; a positive value that is not longer than HandlerTimeout, or set
	// with no HandlerTimeout, is refused by New.
	//
	// Every batch transaction also sets lock_timeout to half of
	// HandlerTimeout: a handler waiting that long for a row lock is waiting
	// for someone else (often such a zombie), so the wait ends as a database
	// error, retried without counting against the job, instead of as a
	// handler timeout that would dead-letter a good job.
	IdleInTxTimeout time.Duration
	// ShutdownTimeout bounds how long a graceful stop lets in-flight batches
	// finish before abandoning them (default 30s).
	ShutdownTimeout time.Duration
	// CommitTimeout bounds the wait for a batch's fence statement and its
	// COMMIT (default 15s). The commit runs on a context that stopping the
	// lane does not cancel: once the handler is done, the fence (not the
	// worker's belief about ownership) decides whether the batch lands. Past
	// the timeout the outcome is unknown, and the lane finds it out exactly
	// (fence.Store.ResolveSession), waiting while the COMMIT is still running: a
	// short timeout costs nothing but a round trip to ask.
	CommitTimeout time.Duration
	// DatabaseTimeout is how long the database may go without answering
	// (the worker's own probe, every second, or a lane's commit) before this
	// worker gives its partitions up: it leaves the group, so that the
	// coordinator hands them to members that can reach the database, keeps
	// probing, and joins again once the database has answered twice in a
	// row. A worker whose connections hang without a reset (a vanished host,
	// a firewall dropping packets) still heartbeats to Kafka; without this
	// its partitions would wait for as long as the cut lasts. Zero (the
	// default) derives it with DefaultDatabaseTimeout: the session timeout
	// (45s when unset), at least 10s so that a restart or failover, which
	// stops every worker alike, does not empty the group. Negative disables
	// stepping down.
	DatabaseTimeout time.Duration

	// FenceLogRetention bounds the fence log (one entry per accepted claim
	// and commit, so one per batch) of the partitions this worker holds: every
	// FenceLogPruneInterval it runs fence.Store.PruneFenceLog on each, which
	// keeps the claim holding the partition and records the cut. Zero fields
	// take the defaults: MaxAge 7 days, MaxEntries 10,000 per partition. A
	// negative field sets no limit of its kind; both negative keep the whole
	// log (what a history checker that does not read the cut needs).
	FenceLogRetention sink.FenceLogRetention
	// FenceLogPruneInterval is how often the fence log is pruned (default
	// 10m); the first pass runs one interval after Run starts.
	FenceLogPruneInterval time.Duration

	// ClientID is kgo's client id (default "tenure"); it must pass
	// ValidateClientID, since member ids, which Postgres records as owners,
	// are built from it.
	ClientID string
	// Logger receives structured logs (default: none).
	Logger *zap.Logger
	// KgoOpts are extra client options (TLS, SASL, a dialer, fetch and
	// metadata tuning, ...). They are applied after tenure's own, so New
	// refuses, with an error naming the option (ErrReservedKgoOpt), any that
	// would change what tenure sets or relies on: the topics
	// (kgo.ConsumeTopics, ConsumeRegex, ConsumeExcludeTopics,
	// ConsumePartitions), ConsumeResetOffset, ConsumeStartOffset,
	// FetchIsolationLevel, KeepControlRecords, ClientID and SeedBrokers (use
	// the Config fields); one set to the value tenure sets anyway is
	// accepted. Every group option (a kgo.GroupOpt: kgo.ConsumerGroup,
	// the partition callbacks, AdjustFetchOffsetsFn, the autocommit options,
	// Balancers, SessionTimeout, RebalanceTimeout, ...) is refused: tenure
	// runs the group itself (Group, SessionTimeout, RebalanceTimeout,
	// Protocol, Hooks). Static membership (kgo.InstanceID) is refused with
	// ErrStaticMembership. The options are read with kgo's own OptValues
	// and option types, never by reflecting on kgo's internals. A
	// kgo.ConsumePreferringLagFn replaces tenure's fetch order (newly
	// assigned partitions first), which decides only who waits.
	KgoOpts []kgo.Opt
	// Hooks observe a batch's life; nil hooks are skipped.
	Hooks Hooks

	// TracerProvider traces batches with OpenTelemetry; nil (the default)
	// traces nothing, and the batch path then allocates nothing for it.
	// Each attempt at a batch is a span (SpanBatch, the root of a trace of
	// its own) linked to the producer span of every job it carries (read
	// from the records' headers with TracePropagator, as kotel's producer
	// hooks write them), with children for the handler (SpanHandler), the
	// fence statement and COMMIT (SpanFenceCommit) and the dead-lettering
	// (SpanDeadLetter). Its attributes: messaging.destination.name (topic),
	// messaging.destination.partition.id, messaging.consumer.group.name,
	// messaging.batch.message_count, tenure.from, tenure.to, tenure.token,
	// tenure.claim_id, tenure.member, tenure.attempt, tenure.linked_jobs
	// and tenure.outcome (OutcomeCommitted, OutcomeFenced, ...); a fenced
	// batch also has status Error and the EventFenced event.
	//
	// The statements become the spans' children when the Store's pool
	// traces them (a pgx tracer such as otelpgx's in its
	// ConnConfig.Tracer, made from the same provider): every statement of
	// a batch runs with the batch span's context.
	TracerProvider trace.TracerProvider
	// TracePropagator reads the producers' trace context from the records'
	// headers (nil: the global propagator if one is set when New runs, else
	// W3C Trace Context).
	TracePropagator propagation.TextMapPropagator
	// TraceLinksMax bounds the links of a batch span: the first
	// TraceLinksMax jobs of the batch that carry a trace context are linked
	// (default DefaultTraceLinksMax, the OpenTelemetry SDK's default span
	// link limit, which drops any more; negative: every job). Reading a
	// job's context costs about a microsecond, a tenth of what a
	// thousand-job batch spends per job otherwise: raise it together with
	// the SDK's OTEL_SPAN_LINK_COUNT_LIMIT. A job past the bound is found
	// from its publish span by topic, partition and offset (a batch span's
	// tenure.from and tenure.to).
	TraceLinksMax int

	// Strict turns on strict hand-off ("G3-strict", docs/fencing.md): a
	// batch becomes visible only if the group coordinator accepted the
	// batch's offset commit while the batch's assignment was the
	// partition's current one. Each batch's transaction ends with PREPARE
	// TRANSACTION; the lane then commits the batch's offset (metadata
	// naming the batch) at its own assignment's member id and generation,
	// and COMMIT PREPARED only on acceptance (ROLLBACK PREPARED on
	// rejection). The next claim of a partition decides whatever was left
	// prepared, by the group's committed offset. It costs an offset commit
	// and a second Postgres round trip per batch, and needs a server with
	// max_prepared_transactions above 0 (Run refuses to start otherwise).
	// The offset mirror is off: the strict commits are the mirror. With the
	// consumer protocol (KIP-848) it needs StrictCoordinator.
	Strict bool
	// StrictCoordinator declares whose group coordinator a strict worker
	// under the consumer protocol (KIP-848) talks to: StrictCoordinatorKafka
	// (Apache Kafka 4.0 or later) is the only value. kfake's KIP-848 offset
	// commit rule accepts an ended assignment's commit, and the protocol
	// does not tell the two apart, so New refuses Strict with NextGen unless
	// it is declared. Classic needs nothing: both coordinators' classic
	// rules are Kafka's.
	StrictCoordinator string
	// UnsafeStrictCurrentGeneration makes a strict lane commit offsets at
	// the client's current member id and generation instead of its own
	// assignment's: the mistake docs/model/strict.pml shows breaks
	// G3-strict (-DCURGEN). Tests only, to show that their check catches
	// it. Never set it elsewhere.
	UnsafeStrictCurrentGeneration bool

	// UnsafeNoFence commits batches without the fence statement: no token
	// check, no offset compare-and-set, nothing in Postgres tells a stale
	// owner apart. It exists so that `tenure bench` can show what the fence
	// itself costs; the guarantee is gone with it. Never set it elsewhere.
	UnsafeNoFence bool
}

// Hooks are called on a partition's lane. They exist for instrumentation,
// demos and tests (tenure's own tests pause a worker inside BeforeCommit).
// Lanes run at once, and so do the claims of one assignment: a hook may
// run for several partitions at the same time.
type Hooks struct {
	// BeforeClaim runs when a newly assigned partition is about to be
	// claimed with token t.
	BeforeClaim func(ctx context.Context, p sink.Partition, t sink.Token)
	// BeforeBatch runs when a batch is formed, before its transaction begins.
	BeforeBatch func(ctx context.Context, b *Batch)
	// BeforeCommit runs after Handle returned nil, inside the transaction,
	// just before the fenced commit.
	BeforeCommit func(ctx context.Context, b *Batch)
	// AfterBatch runs once a batch's fate is known: err is nil when it
	// committed, matches sink.ErrFenced when it was rejected.
	AfterBatch func(b *Batch, err error)
	// BeforeOffsetCommit, OffsetCommitInFlight and BeforeCommitPrepared
	// (Strict only) run after a batch is prepared (gid names it): before
	// its first offset commit is built; when the first one has been built
	// and logged as sent, before it is written to the coordinator; and
	// after the coordinator accepted it, before COMMIT PREPARED.
	// BeforeResolve runs when a strict claim is about to decide an older
	// lane's prepared batch gid. ctx ends when the lane is stopped hard.
	BeforeOffsetCommit   func(ctx context.Context, b *Batch, gid string)
	OffsetCommitInFlight func(ctx context.Context, b *Batch, gid string)
	BeforeCommitPrepared func(ctx context.Context, b *Batch, gid string)
	BeforeResolve        func(ctx context.Context, p sink.Partition, gid string)
	// AfterClaim runs after each claim statement of partition p with token
	// t: err is nil when Postgres accepted it (next is then the stored next
	// offset the partition goes on from), a *sink.FencedError when the
	// fence rejected it (another round of the claim may follow).
	AfterClaim func(p sink.Partition, t sink.Token, next int64, err error)
}

// ErrStaticMembership is returned for a configuration with a group instance
// id. With static membership a restarted member gets the same generation (or
// member epoch) as the process it replaces, with no rebalance, so the epoch
// cannot tell a zombie from its successor and cannot fence it.
var ErrStaticMembership = errors.New("static group membership (group.instance.id) is not supported: a restarted member reuses its predecessor's epoch, so the epoch cannot fence the old process")

// Batch and buffer defaults. Measured with tenure bench on a 1M-job backlog
// (12 partitions, 2 cores): batches of up to 1000 jobs share a
// transaction's and the fence's fixed cost (fenced and unfenced run at the
// same rate, where 500 left the fence 30% of the cost), and the buffers keep
// peak RSS near 120 MB. At 12 partitions a worker's lanes hold at most
// about 16 MiB (four lanes), below the worker's bound; the worker's bound
// is what holds at hundreds of partitions. Draining a backlog, a worker
// of 334 of 1,000 partitions fills it and peaked at 160-171 MB RSS (62
// MiB live: kgo's record slabs and decoded batches); 16 MiB held it to
// 105 MB, but cost one worker of 12 partitions 40% of its rate (one run:
// 303,228 jobs/s against 496,925), so 32 MiB stays the default
// (docs/operations.md, "Memory").
const (
	DefaultBatchMax             = 1000
	DefaultBatchMaxBytes        = 4 << 20
	DefaultPartitionBufferBytes = 4 << 20
	DefaultWorkerBufferBytes    = 32 << 20
)

// DefaultCommitSpan is Config.CommitSpan's default, except with Strict or
// UnsafeNoFence, where it is 1. At 64, a worker with a few partitions
// still commits each batch in a transaction of its own (a transaction
// takes its share of the waiting batches, and a few share nothing),
// while hundreds of partitions that carry a few jobs each share a few
// transactions. Measured with `tenure bench --dimension-only` over 3
// workers, two rounds each, side by side in one hour: at 12 partitions
// 298,837 jobs/s with 64 against 242,383 with 1 (2.96 and 3.06 CPU s per
// 1M jobs, workers and Postgres); at 1,000 partitions 96,263 against
// 32,082 jobs/s (10.85 and 39.52 CPU s).
const DefaultCommitSpan = 64

// DefaultCommitTransactions is Config.CommitTransactions's default. With
// no bound but the pool's transaction slots (28 of 32 connections) a
// transaction almost always found a slot free and took the one batch
// waiting: at 1,000 partitions over 3 workers, a span of 16 ran at the
// rate of 1 (22,253 and 23,392 jobs/s, one run each). With 4, the batches
// that become ready meanwhile wait for the next transactions and share
// them.
const DefaultCommitTransactions = 4

// The defaults of Config's other fields, exported so that a command line
// or a configuration file can show them without repeating the numbers.
// DefaultSessionTimeout is kgo's own, which Config leaves to kgo.
const (
	DefaultSessionTimeout        = 45 * time.Second
	DefaultRebalanceTimeout      = 60 * time.Second
	DefaultFetchMaxWait          = 100 * time.Millisecond
	DefaultMaxAttempts           = 5
	DefaultHandlerTimeout        = 60 * time.Second
	DefaultRetryBackoff          = 100 * time.Millisecond
	DefaultRetryBackoffMax       = 5 * time.Second
	DefaultClaimTimeout          = 30 * time.Second
	DefaultCommitTimeout         = 15 * time.Second
	DefaultShutdownTimeout       = 30 * time.Second
	DefaultFenceLogPruneInterval = 10 * time.Minute
	DefaultClientID              = "tenure"
)

// DefaultTraceLinksMax is Config.TraceLinksMax's default: the
// OpenTelemetry SDK's default span link count limit.
const DefaultTraceLinksMax = 128

// The fence log's default retention (Config.FenceLogRetention).
const (
	DefaultFenceLogMaxAge     = 7 * 24 * time.Hour
	DefaultFenceLogMaxEntries = 10_000
)

// DefaultIdleInTxTimeout is the IdleInTxTimeout derived from a handler
// timeout: a quarter longer, and at least a second longer, so that a job
// within its time is never ended by Postgres; negative (disabled) when the
// handler has no time bound. It is the one place where the two are related.
func DefaultIdleInTxTimeout(handlerTimeout time.Duration) time.Duration {
	if handlerTimeout <= 0 {
		return -1
	}
	return handlerTimeout + max(handlerTimeout/4, time.Second)
}

func (c *Config) setDefaults() {
	orDefault(&c.Protocol, Classic)
	orDefault(&c.RebalanceTimeout, DefaultRebalanceTimeout)
	orDefault(&c.BatchMax, DefaultBatchMax)
	span := DefaultCommitSpan
	if c.Strict || c.UnsafeNoFence {
		span = 1 // their commit paths take one batch a transaction
	}
	orDefault(&c.CommitSpan, span)
	orDefault(&c.CommitTransactions, DefaultCommitTransactions)
	orDefault(&c.BatchMaxBytes, DefaultBatchMaxBytes)
	orDefault(&c.PartitionBufferBytes, DefaultPartitionBufferBytes)
	orDefault(&c.WorkerBufferBytes, DefaultWorkerBufferBytes)
	orDefault(&c.FetchMaxWait, DefaultFetchMaxWait)
	orDefault(&c.MaxAttempts, DefaultMaxAttempts)
	orDefault(&c.HandlerTimeout, DefaultHandlerTimeout)
	orDefault(&c.RetryBackoff, DefaultRetryBackoff)
	orDefault(&c.RetryBackoffMax, DefaultRetryBackoffMax)
	orDefault(&c.ClaimTimeout, DefaultClaimTimeout)
	orDefault(&c.IdleInTxTimeout, DefaultIdleInTxTimeout(c.HandlerTimeout))
	orDefault(&c.CommitTimeout, DefaultCommitTimeout)
	orDefault(&c.DatabaseTimeout, DefaultDatabaseTimeout(c.SessionTimeout))
	orDefault(&c.ShutdownTimeout, DefaultShutdownTimeout)
	orDefault(&c.FenceLogRetention.MaxAge, DefaultFenceLogMaxAge)
	orDefault(&c.FenceLogRetention.MaxEntries, DefaultFenceLogMaxEntries)
	orDefault(&c.FenceLogPruneInterval, DefaultFenceLogPruneInterval)
	orDefault(&c.ClientID, DefaultClientID)
	orDefault(&c.TraceLinksMax, DefaultTraceLinksMax)
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
}

// orDefault sets *p to def when it holds its type's zero value: the
// Config's rule that 0 (or "") means the default.
func orDefault[T comparable](p *T, def T) {
	var zero T
	if *p == zero {
		*p = def
	}
}

// DefaultDatabaseTimeout is Config.DatabaseTimeout derived from the group's
// session timeout (0: kgo's default, 45s): the time after which the
// coordinator would move a dead member's partitions is also how long a
// member that cannot reach its database keeps them, but never less than
// 10s, longer than a database restart or a failover to a synchronous
// standby usually takes (docs/fencing.md, "A network that drops").
func DefaultDatabaseTimeout(session time.Duration) time.Duration {
	if session <= 0 {
		session = DefaultSessionTimeout
	}
	return max(session, 10*time.Second)
}

func (c *Config) validate() error {
	var errs []string
	if len(c.Brokers) == 0 {
		errs = append(errs, "at least one broker is required")
	}
	for _, b := range c.Brokers {
		if strings.TrimSpace(b) == "" || !strings.Contains(b, ":") {
			errs = append(errs, fmt.Sprintf("broker %q is not host:port", b))
		}
	}
	if strings.TrimSpace(c.Group) == "" {
		errs = append(errs, "a consumer group is required")
	} else if err := ValidateGroup(c.Group); err != nil {
		errs = append(errs, err.Error())
	}
	if len(c.Topics) == 0 {
		errs = append(errs, "at least one topic is required")
	}
	for _, t := range c.Topics {
		if err := ValidateTopic(t); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if err := ValidateClientID(c.ClientID); err != nil {
		errs = append(errs, err.Error())
	}
	if c.Store == nil {
		errs = append(errs, "a sink.Store is required")
	}
	if c.Handler == nil {
		errs = append(errs, "a Handler is required")
	}
	if c.Protocol != Classic && c.Protocol != NextGen {
		errs = append(errs, fmt.Sprintf("protocol %q is not %q or %q", c.Protocol, Classic, NextGen))
	}
	if c.SessionTimeout < 0 || c.RebalanceTimeout < 0 || c.ClaimTimeout < 0 || c.ShutdownTimeout < 0 || c.CommitTimeout < 0 ||
		c.RetryBackoff < 0 || c.RetryBackoffMax < 0 || c.FenceLogPruneInterval < 0 {
		errs = append(errs, "timeouts and backoffs must not be negative")
	}
	if c.IdleInTxTimeout > 0 {
		switch {
		case c.HandlerTimeout <= 0:
			errs = append(errs, fmt.Sprintf("IdleInTxTimeout %s would end the session of a handler that has no time bound (HandlerTimeout is negative): set HandlerTimeout, or leave IdleInTxTimeout zero", c.IdleInTxTimeout))
		case c.IdleInTxTimeout <= c.HandlerTimeout:
			errs = append(errs, fmt.Sprintf("IdleInTxTimeout %s must be longer than HandlerTimeout %s: Postgres would end the session of a job that is still within its time (zero derives it: %s)",
				c.IdleInTxTimeout, c.HandlerTimeout, DefaultIdleInTxTimeout(c.HandlerTimeout)))
		}
	}
	if c.BatchMaxBytes < 0 || c.PartitionBufferBytes < 0 || c.WorkerBufferBytes < 0 {
		errs = append(errs, "BatchMaxBytes, PartitionBufferBytes and WorkerBufferBytes must not be negative")
	}
	if c.BatchLinger < 0 || c.FetchMaxWait < 0 {
		errs = append(errs, "BatchLinger and FetchMaxWait must not be negative")
	}
	if c.BatchMax < 0 {
		errs = append(errs, "BatchMax must be positive")
	}
	if c.MaxAttempts < 0 {
		errs = append(errs, "MaxAttempts must be positive")
	}
	switch {
	case c.CommitTransactions < 0:
		errs = append(errs, fmt.Sprintf("CommitTransactions %d must be positive", c.CommitTransactions))
	case c.CommitSpan < 0:
		errs = append(errs, fmt.Sprintf("CommitSpan %d must be positive (1: each batch in a transaction of its own)", c.CommitSpan))
	case c.CommitSpan > 1 && c.Strict:
		// A strict batch ends in PREPARE TRANSACTION and an offset commit
		// at its own assignment's generation; sharing that across lanes is
		// not built yet.
		errs = append(errs, fmt.Sprintf("CommitSpan %d needs the default commit path: strict hand-off (Strict) commits each batch in a transaction of its own, so leave CommitSpan at 1", c.CommitSpan))
	case c.CommitSpan > 1 && c.UnsafeNoFence:
		errs = append(errs, fmt.Sprintf("CommitSpan %d needs the fence: UnsafeNoFence commits each batch in a transaction of its own, so leave CommitSpan at 1", c.CommitSpan))
	}
	switch {
	case c.Strict && c.UnsafeNoFence:
		errs = append(errs, "Strict and UnsafeNoFence exclude each other")
	case c.Strict && c.Protocol == NextGen && c.StrictCoordinator != StrictCoordinatorKafka:
		errs = append(errs, fmt.Sprintf("strict hand-off with the consumer protocol (KIP-848) needs the coordinator declared as %q (StrictCoordinator, --strict-coordinator): "+
			"only Apache Kafka's offset commit rule rejects an ended assignment's commit (kfake's accepts it, and the protocol cannot tell them apart)", StrictCoordinatorKafka))
	case c.StrictCoordinator != "" && c.StrictCoordinator != StrictCoordinatorKafka:
		errs = append(errs, fmt.Sprintf("StrictCoordinator %q is not %q", c.StrictCoordinator, StrictCoordinatorKafka))
	case c.StrictCoordinator != "" && !c.Strict:
		errs = append(errs, "StrictCoordinator is for Strict")
	case c.UnsafeStrictCurrentGeneration && !c.Strict:
		errs = append(errs, "UnsafeStrictCurrentGeneration is for Strict")
	}
	if len(errs) > 0 {
		return errors.New("consumer config: " + strings.Join(errs, "; "))
	}
	return nil
}
