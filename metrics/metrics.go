// Package metrics exposes a tenure worker as Prometheus collectors: what it
// committed and what the fence rejected per partition, how long handlers
// and commits take, how far behind each of its partitions is, and the
// counters of consumer.Stats. `tenure worker --http-addr` serves exactly
// these at /metrics; a library user registers the same Collector on a
// registry of their own:
//
//	m := metrics.New(metrics.Options{})
//	c, err := consumer.New(m.Instrument(cfg)) // wraps the handler, chains the hooks
//	if err != nil { ... }
//	m.Attach(c)
//	registry.MustRegister(m)
//
// One Collector observes one Consumer. The metrics, all prefixed tenure_:
//
// Per partition (labels topic, partition), counted from the hooks and
// created at 0 when the partition is first claimed here:
//
//	batches_committed_total   batches committed through the fence
//	records_committed_total   jobs committed (dead letters included)
//	batches_fenced_total      batches the fence rejected (a stale owner's writes rolled back)
//	claims_total              claims Postgres accepted
//	claims_fenced_total       claim statements the fence rejected (another round may follow)
//	partition_lag             high watermark minus the next offset stored in Postgres, for the
//	                          partitions this worker runs a lane for; read when scraped
//
// Per partition of the worker's group (labels consumer_group, topic,
// partition, state), from the worker's group watch (consumer.Stuck: every
// worker describes its whole group every 10 s), only for the partitions
// that have jobs waiting and are in a state other than ok; none in normal
// operation:
//
//	partition_stuck_seconds   how long the partition has been in that state
//	                          (unowned, owner-silent, not-progressing, stalled,
//	                          claim-pending, a hold...)
//	partition_stuck_jobs      the jobs waiting (its lag)
//
// Every worker of a group exports the same series, so that a dead
// worker's partitions are reported by the others: aggregate with max by
// (consumer_group, topic, partition, state).
//
// Histograms:
//
//	handler_duration_seconds{outcome="ok|error|panic"}   one handler call (Handle, or HandleBatches for several batches)
//	commit_duration_seconds{outcome="committed|fenced"}  the fence statement and COMMIT of a batch
//	end_to_end_latency_seconds                            a job's record timestamp to its commit
//
// Gauges and counters read from consumer.Stats when scraped: lanes,
// lanes_halted, lanes_stalled, claims_rejected_total (claims given up,
// including those the coordinator did not confirm), dead_letters_total,
// handler_failures_total, handler_transient_total,
// handler_environment_errors_total, handler_bugs_total,
// batch_retries_total, incarnation_bumps_total, lane_recoveries_total,
// jobs_lost_total, divergences_total, stale_sessions_ended_total,
// fence_log_pruned_total, worker_step_downs_total, worker_stepped_down,
// group_watch_errors_total; and handler_oldest_running_seconds, the age of
// the oldest Handle call still running (a handler that ignores its context
// grows it past HandlerTimeout), partition_lag_read_errors_total.
//
// Besides a Collector, `tenure worker --http-addr` serves BuildInfo
// (tenure_build_info{version, revision, go_version} 1) and, through
// KafkaHooks, the Kafka client's own metrics (tenure_kafka_*).
package metrics

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/sink"
)

// Options configure a Collector. Zero values mean the documented defaults.
type Options struct {
	// ConstLabels are added to every metric (e.g. the worker's name when
	// several consumers share a registry).
	ConstLabels prometheus.Labels
	// LagTimeout bounds reading the partitions' lag when scraped: the high
	// watermarks from the brokers and the next offsets from Postgres
	// (default 2s). Past it the lag series are left out of the scrape and
	// partition_lag_read_errors_total counts it.
	LagTimeout time.Duration
	// HandlerBuckets, CommitBuckets and EndToEndBuckets are the histograms'
	// buckets in seconds (defaults: HandlerBuckets and CommitBuckets from
	// 1ms to 60s, EndToEndBuckets from 10ms to 1h).
	HandlerBuckets, CommitBuckets, EndToEndBuckets []float64
}

// Default buckets.
var (
	DefaultHandlerBuckets  = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}
	DefaultCommitBuckets   = DefaultHandlerBuckets
	DefaultEndToEndBuckets = []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}
)

// Collector is a consumer's metrics; it implements prometheus.Collector.
type Collector struct {
	opts Options

	batches, records, batchesFenced, claims, claimsFenced *prometheus.CounterVec
	handlerDuration, commitDuration                       *prometheus.HistogramVec
	endToEnd                                              prometheus.Histogram
	lagErrors                                             prometheus.Counter

	lagDesc, oldestDesc      *prometheus.Desc
	stuckDesc, stuckJobsDesc *prometheus.Desc
	stats                    []statDesc

	mu       sync.Mutex
	c        *consumer.Consumer
	store    *sink.Store
	group    string
	commits  map[sink.Partition]pendingCommit // BeforeCommit seen, AfterBatch not yet
	handling map[*handling]struct{}           // Handle calls running now
}

type pendingCommit struct {
	b     *consumer.Batch
	start time.Time
}

type handling struct{ start time.Time }

// statDesc is a metric read from consumer.Stats.
type statDesc struct {
	desc  *prometheus.Desc
	typ   prometheus.ValueType
	value func(consumer.Stats) int64
}

var (
	partitionLabels = []string{"topic", "partition"}
	stuckLabels     = []string{"consumer_group", "topic", "partition", "state"}
)

// New makes a Collector. Instrument the consumer's Config with it, then
// Attach the consumer.
func New(opts Options) *Collector {
	if opts.LagTimeout <= 0 {
		opts.LagTimeout = 2 * time.Second
	}
	if opts.HandlerBuckets == nil {
		opts.HandlerBuckets = DefaultHandlerBuckets
	}
	if opts.CommitBuckets == nil {
		opts.CommitBuckets = DefaultCommitBuckets
	}
	if opts.EndToEndBuckets == nil {
		opts.EndToEndBuckets = DefaultEndToEndBuckets
	}
	cl := opts.ConstLabels
	counter := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tenure_" + name, Help: help, ConstLabels: cl}, partitionLabels)
	}
	m := &Collector{
		opts:          opts,
		batches:       counter("batches_committed_total", "Batches committed through the fence, by partition."),
		records:       counter("records_committed_total", "Jobs committed through the fence (dead letters included), by partition."),
		batchesFenced: counter("batches_fenced_total", "Batches rejected by the fence (a stale owner's writes rolled back), by partition."),
		claims:        counter("claims_total", "Claims accepted by Postgres, by partition."),
		claimsFenced:  counter("claims_fenced_total", "Claim statements rejected by the fence (another claim holds the partition; another round may follow), by partition."),
		handlerDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "tenure_handler_duration_seconds",
			Help: "Duration of one handler call (Handle, or HandleBatches for several batches), by outcome (ok, error, panic).", ConstLabels: cl, Buckets: opts.HandlerBuckets}, []string{"outcome"}),
		commitDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "tenure_commit_duration_seconds",
			Help: "Duration of a batch's fence statement and COMMIT, by outcome (committed, fenced).", ConstLabels: cl, Buckets: opts.CommitBuckets}, []string{"outcome"}),
		endToEnd: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "tenure_end_to_end_latency_seconds",
			Help: "From a job's record timestamp to the commit of its batch (dead letters included).", ConstLabels: cl, Buckets: opts.EndToEndBuckets}),
		lagErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "tenure_partition_lag_read_errors_total",
			Help: "Scrapes whose partition lag could not be read (brokers or Postgres did not answer within the lag timeout).", ConstLabels: cl}),
		lagDesc: prometheus.NewDesc("tenure_partition_lag", "High watermark minus the next offset stored in Postgres, for the partitions this worker runs a lane for.",
			partitionLabels, cl),
		oldestDesc: prometheus.NewDesc("tenure_handler_oldest_running_seconds", "Age of the oldest Handle call still running (0 when none runs).", nil, cl),
		stuckDesc: prometheus.NewDesc("tenure_partition_stuck_seconds",
			"How long a partition of the worker's group with jobs waiting has been in a state other than ok (unowned, owner-silent, not-progressing, stalled, a hold...), "+
				"from the worker's group watch (every 10s); only such partitions have a series. Every worker reports the whole group: use max by (consumer_group, topic, partition, state).",
			stuckLabels, cl),
		stuckJobsDesc: prometheus.NewDesc("tenure_partition_stuck_jobs",
			"Jobs waiting on a partition of tenure_partition_stuck_seconds (its lag).", stuckLabels, cl),
		commits:  map[sink.Partition]pendingCommit{},
		handling: map[*handling]struct{}{},
	}
	stat := func(name, help string, typ prometheus.ValueType, v func(consumer.Stats) int64) {
		m.stats = append(m.stats, statDesc{prometheus.NewDesc("tenure_"+name, help, nil, cl), typ, v})
	}
	counterStat := func(name, help string, v func(consumer.Stats) int64) { stat(name, help, prometheus.CounterValue, v) }
	gaugeStat := func(name, help string, v func(consumer.Stats) int64) { stat(name, help, prometheus.GaugeValue, v) }
	gaugeStat("lanes", "Partitions this worker is processing now.", func(s consumer.Stats) int64 { return s.Lanes })
	gaugeStat("lanes_halted", "Partitions this worker holds but does not process until an operator acknowledges their hold (a handler bug, offsets that do not fit the log).", func(s consumer.Stats) int64 { return s.LanesHalted })
	gaugeStat("buffered_bytes", "Bytes of records the lanes hold, ahead of their handlers and in the batches being handled (bounded by --worker-buffer-bytes plus one poll).", func(s consumer.Stats) int64 { return s.BufferedBytes })
	gaugeStat("lanes_stalled", "Partitions whose claim or commit was rejected although this member holds them; recovering by themselves.", func(s consumer.Stats) int64 { return s.Stalled })
	counterStat("claims_rejected_total", "Claims given up: refused by the fence or not confirmed by the coordinator.", func(s consumer.Stats) int64 { return s.ClaimsRejected })
	counterStat("claims_failed_total", "Claims that could not be made (the database, a lock the claim cannot end, a prepared batch it may not finish): the partition is held as stalled and its lane claims it again by itself.", func(s consumer.Stats) int64 { return s.ClaimsFailed })
	counterStat("dead_letters_total", "Jobs parked in the dead-letter table.", func(s consumer.Stats) int64 { return s.DeadLetters })
	counterStat("handler_failures_total", "Handler errors, panics and timeouts counted against jobs.", func(s consumer.Stats) int64 { return s.HandlerFailures })
	counterStat("handler_transient_total", "Handler failures retried without counting against jobs (consumer.Transient, lock timeouts, deadlocks).", func(s consumer.Stats) int64 { return s.HandlerTransient })
	counterStat("handler_environment_errors_total", "Handler SQL errors that say the environment is wrong (missing table or column, permission, read-only server): the partition stalls.", func(s consumer.Stats) int64 { return s.HandlerEnvironment })
	counterStat("handler_bugs_total", "Batches whose handler ended its own transaction (COMMIT or ROLLBACK in its SQL); each halts its partition.", func(s consumer.Stats) int64 { return s.HandlerBugs })
	counterStat("batch_retries_total", "Batch attempts after a failure.", func(s consumer.Stats) int64 { return s.Retries })
	counterStat("incarnation_bumps_total", "Incarnation bumps made by this worker: group resets detected (and ties settled).", func(s consumer.Stats) int64 { return s.Resets })
	counterStat("lane_recoveries_total", "Partitions claimed again by their lane after a rejection, without a rebalance.", func(s consumer.Stats) int64 { return s.Recoveries })
	counterStat("jobs_lost_total", "Jobs deleted from the log (retention, DeleteRecords) before they were processed, found below the log start.", func(s consumer.Stats) int64 { return s.JobsLost })
	counterStat("divergences_total", "Partitions found with a stored offset below one this group had acknowledged (the database lost commits); each is held.", func(s consumer.Stats) int64 { return s.Divergences })
	counterStat("stale_sessions_ended_total", "Sessions of an older owner of a partition (frozen in its transaction) that held locks a batch waited for, ended by this worker.", func(s consumer.Stats) int64 { return s.StaleSessionsEnded })
	counterStat("fence_log_pruned_total", "Fence log entries pruned by this worker.", func(s consumer.Stats) int64 { return s.FenceLogPruned })
	counterStat("worker_step_downs_total", "Times this worker gave its partitions up (left the group) because its database did not answer for the database timeout.", func(s consumer.Stats) int64 { return s.StepDowns })
	gaugeStat("worker_stepped_down", "1 while this worker is out of the group because its database does not answer; it joins again once it does.", func(s consumer.Stats) int64 { return s.SteppedDown })
	counterStat("group_watch_errors_total", "Group watches (the worker's description of its whole group every 10s, behind partition_stuck_seconds) that failed.", func(s consumer.Stats) int64 { return s.GroupWatchErrors })
	return m
}

// Instrument returns cfg with its Handler wrapped (durations, running
// calls) and Hooks chained with the Collector's (cfg's own hooks still
// run, first). It also records cfg.Store and cfg.Group, where the lag's
// next offsets are read.
func (m *Collector) Instrument(cfg consumer.Config) consumer.Config {
	m.mu.Lock()
	m.store, m.group = cfg.Store, cfg.Group
	m.mu.Unlock()
	if cfg.Handler != nil {
		th := timedHandler{m: m, h: cfg.Handler}
		if bh, ok := cfg.Handler.(consumer.BatchesHandler); ok {
			cfg.Handler = &timedBatches{th, bh}
		} else {
			cfg.Handler = &th
		}
	}
	h := cfg.Hooks
	cfg.Hooks.BeforeCommit = func(ctx context.Context, b *consumer.Batch) {
		if h.BeforeCommit != nil {
			h.BeforeCommit(ctx, b)
		}
		m.beforeCommit(b)
	}
	cfg.Hooks.AfterBatch = func(b *consumer.Batch, err error) {
		if h.AfterBatch != nil {
			h.AfterBatch(b, err)
		}
		m.afterBatch(b, err)
	}
	cfg.Hooks.AfterClaim = func(p sink.Partition, t sink.Token, next int64, err error) {
		if h.AfterClaim != nil {
			h.AfterClaim(p, t, next, err)
		}
		m.afterClaim(p, err)
	}
	return cfg
}

// Attach tells the Collector which Consumer to read Stats, partitions and
// the Kafka client from. Until it is attached, only the hooks' metrics
// are collected.
func (m *Collector) Attach(c *consumer.Consumer) {
	m.mu.Lock()
	m.c = c
	m.mu.Unlock()
}

func labels(topic string, partition int32) []string {
	return []string{topic, strconv.FormatInt(int64(partition), 10)}
}

func (m *Collector) afterClaim(p sink.Partition, err error) {
	l := labels(p.Topic, p.Partition)
	if err != nil {
		m.claimsFenced.WithLabelValues(l...).Inc()
		return
	}
	m.claims.WithLabelValues(l...).Inc()
	// Every per-partition series exists from the partition's first claim,
	// so that rates and alerts see a 0 rather than nothing.
	for _, v := range []*prometheus.CounterVec{m.batches, m.records, m.batchesFenced, m.claimsFenced} {
		v.WithLabelValues(l...)
	}
}

func key(b *consumer.Batch) sink.Partition {
	return sink.Partition{Group: b.Group, Topic: b.Topic, Partition: b.Partition}
}

// beforeCommit runs on the lane, after Handle returned nil, just before the
// fence statement.
func (m *Collector) beforeCommit(b *consumer.Batch) {
	m.mu.Lock()
	m.commits[key(b)] = pendingCommit{b: b, start: time.Now()}
	m.mu.Unlock()
}

// afterBatch runs on the lane once the batch's fate is known. A dead
// letter's commit had no BeforeCommit: it counts, but is not timed.
func (m *Collector) afterBatch(b *consumer.Batch, err error) {
	now := time.Now()
	k := key(b)
	m.mu.Lock()
	pc, timed := m.commits[k]
	delete(m.commits, k)
	m.mu.Unlock()
	timed = timed && pc.b == b
	l := labels(b.Topic, b.Partition)
	if err != nil {
		m.batchesFenced.WithLabelValues(l...).Inc()
		if timed {
			m.commitDuration.WithLabelValues("fenced").Observe(now.Sub(pc.start).Seconds())
		}
		return
	}
	m.batches.WithLabelValues(l...).Inc()
	m.records.WithLabelValues(l...).Add(float64(len(b.Records)))
	if timed {
		m.commitDuration.WithLabelValues("committed").Observe(now.Sub(pc.start).Seconds())
	}
	for _, r := range b.Records {
		if !r.Timestamp.IsZero() {
			// A producer's clock ahead of ours would make it negative.
			m.endToEnd.Observe(max(now.Sub(r.Timestamp).Seconds(), 0))
		}
	}
}

// OldestHandler is the age of the oldest Handle call running now (0 when
// none runs). A handler that ignores its context keeps its lane, and so
// its partition, stuck: `tenure worker` reports itself not live when this
// passes the handler timeout by a margin.
func (m *Collector) OldestHandler() time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	var oldest time.Duration
	now := time.Now()
	for h := range m.handling {
		oldest = max(oldest, now.Sub(h.start))
	}
	return oldest
}

// timedHandler times each Handle call and records it as running meanwhile.
type timedHandler struct {
	m *Collector
	h consumer.Handler
}

func (t *timedHandler) Handle(ctx context.Context, tx consumer.Tx, b *consumer.Batch) error {
	return t.m.timed(func() error { return t.h.Handle(ctx, tx, b) })
}

// timedBatches is timedHandler for a consumer.BatchesHandler: a call with
// several batches is timed as one call, and stays one.
type timedBatches struct {
	timedHandler
	bh consumer.BatchesHandler
}

func (t *timedBatches) HandleBatches(ctx context.Context, tx consumer.Tx, batches []*consumer.Batch) error {
	return t.m.timed(func() error { return t.bh.HandleBatches(ctx, tx, batches) })
}

// timed runs call, recording it as running meanwhile and its duration by
// outcome.
func (m *Collector) timed(call func() error) (err error) {
	h := &handling{start: time.Now()}
	m.mu.Lock()
	m.handling[h] = struct{}{}
	m.mu.Unlock()
	returned := false
	defer func() {
		m.mu.Lock()
		delete(m.handling, h)
		m.mu.Unlock()
		outcome := "ok"
		switch {
		case !returned:
			outcome = "panic" // not recovered here: the lane does that
		case err != nil:
			outcome = "error"
		}
		m.handlerDuration.WithLabelValues(outcome).Observe(time.Since(h.start).Seconds())
	}()
	err = call()
	returned = true
	return err
}

// Describe implements prometheus.Collector.
func (m *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
	ch <- m.lagDesc
	ch <- m.oldestDesc
	ch <- m.stuckDesc
	ch <- m.stuckJobsDesc
	for _, s := range m.stats {
		ch <- s.desc
	}
}

func (m *Collector) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.batches, m.records, m.batchesFenced, m.claims, m.claimsFenced,
		m.handlerDuration, m.commitDuration, m.endToEnd, m.lagErrors}
}

// Collect implements prometheus.Collector. It reads the lag of the
// partitions this worker runs a lane for: their high watermarks from the
// brokers and their next offsets from Postgres, within Options.LagTimeout.
func (m *Collector) Collect(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	c, store, group := m.c, m.store, m.group
	m.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(m.oldestDesc, prometheus.GaugeValue, m.OldestHandler().Seconds())
	if c != nil {
		s := c.Stats()
		for _, d := range m.stats {
			ch <- prometheus.MustNewConstMetric(d.desc, d.typ, float64(d.value(s)))
		}
		if store != nil {
			m.collectLag(ch, c, store, group)
		}
		for _, p := range c.Stuck() {
			l := []string{p.Group, p.Topic, strconv.FormatInt(int64(p.Partition), 10), string(p.State)}
			ch <- prometheus.MustNewConstMetric(m.stuckDesc, prometheus.GaugeValue, p.For.Seconds(), l...)
			ch <- prometheus.MustNewConstMetric(m.stuckJobsDesc, prometheus.GaugeValue, float64(*p.Lag), l...)
		}
	}
	for _, col := range m.collectors() {
		col.Collect(ch)
	}
}

func (m *Collector) collectLag(ch chan<- prometheus.Metric, c *consumer.Consumer, store *sink.Store, group string) {
	parts := c.Partitions()
	cl := c.Client()
	if len(parts) == 0 || cl == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), m.opts.LagTimeout)
	defer cancel()
	var topics []string
	seen := map[string]bool{}
	for _, p := range parts {
		if !seen[p.Topic] {
			seen[p.Topic] = true
			topics = append(topics, p.Topic)
		}
	}
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topics...)
	if err != nil {
		m.lagErrors.Inc()
		return
	}
	fences, err := store.List(ctx, group)
	if err != nil {
		m.lagErrors.Inc()
		return
	}
	next := make(map[sink.Partition]int64, len(fences))
	for _, f := range fences {
		next[f.Partition] = f.NextOffset
	}
	for _, p := range parts {
		n, ok := next[p]
		end, found := ends.Lookup(p.Topic, p.Partition)
		if !ok || !found || end.Err != nil {
			continue // not claimed yet, or the broker did not say
		}
		ch <- prometheus.MustNewConstMetric(m.lagDesc, prometheus.GaugeValue, float64(max(end.Offset-n, 0)), labels(p.Topic, p.Partition)...)
	}
}
