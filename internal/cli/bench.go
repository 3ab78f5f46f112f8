package cli

import (
	"context"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tenure-dev/tenure/internal/bench"
)

var benchSpec = spec{name: "bench", short: "throughput side by side, repeated (median and spread): tenure fenced, unfenced, strict and traced, an at-least-once program, a naive one, the COPY ceiling; latency at a fixed rate; the partition dimension"}

// benchCmd is `tenure bench`; the measuring is internal/bench's.
type benchCmd struct {
	base
	kafka                                         kafkaFlags
	dbURL, workerFlags, jsonOut                   string
	jobs, partitions, valueBytes, keys, naiveJobs int
	latencySeconds, latencyRate, scalingJobs      int
	repeat, dimensionRepeat                       int
	skipScaling, partitionsDimension, latencyOnly bool
	dimensionOnly                                 bool
	dimensionPartitions, latencyVariants          string
}

func (c *benchCmd) define(f *flagSet) {
	c.kafka.define(f, "Kafka seed brokers (default: a development broker in this process)")
	f.String(&c.dbURL, "database-url", localDatabaseURL, "PostgreSQL URL; bench creates and drops its own schemas", arg("URL"))
	f.Int(&c.jobs, "jobs", 0, "jobs pre-produced for each throughput run (0: sized by a short calibration run so that every program drains for at least about 5 s)")
	f.Int(&c.repeat, "repeat", 5, "rounds of every throughput and latency run; the report gives each figure's median and spread (min–max) and judges each target by the whole spread", arg("N"))
	f.Int(&c.partitions, "partitions", 12, "partitions of the topics", arg("P"))
	f.Int(&c.valueBytes, "value-bytes", 100, "size of a job's value")
	f.Int(&c.keys, "keys", 10_000, "distinct keys, spread evenly")
	f.Int(&c.naiveJobs, "naive-jobs", 0, "jobs the naive program (one INSERT per job) runs, its rate measured on them (0: sized by calibration for about 5 s)")
	f.Int(&c.latencySeconds, "latency-seconds", 10, "how long jobs are produced at --latency-rate in each latency run, for the end-to-end latency")
	f.Int(&c.latencyRate, "latency-rate", 100_000, "the fixed produce rate (jobs/s) of the latency runs; the report says the rate the producer achieved, and the target is unclear if it fell short")
	f.Bool(&c.latencyOnly, "latency-only", false, "run only the latency runs (no calibration, throughput rows or profile); with --skip-scaling and --partitions-dimension=false a latency comparison takes minutes")
	f.String(&c.latencyVariants, "latency-variants", "", "latency runs beside the default in each round, in turns: NAME=FLAGS entries separated by ';', each with these worker flags after --worker-flags, e.g. \"linger=--batch-linger 5ms\"", arg("\"NAME=FLAGS;...\""))
	f.String(&c.workerFlags, "worker-flags", "", "extra flags for the tenure workers of every tenure run, e.g. \"--batch-max 5000\" (the table then no longer shows the defaults)", arg("\"...\""))
	f.Int(&c.scalingJobs, "scaling-jobs", 500_000, "jobs of each scaling run (1, 2, 3 workers; 1, 12, 48 partitions)")
	f.Bool(&c.skipScaling, "skip-scaling", false, "skip the scaling runs")
	f.Bool(&c.partitionsDimension, "partitions-dimension", true, "run the partition dimension (part of the default run; --partitions-dimension=false skips it): the same backlog over each of --dimension-partitions with 3 workers, one SIGKILLed a third of the way through: rate, CPU per job, peak RSS per worker, claims per second at start-up, the hand-off time")
	f.Int(&c.dimensionRepeat, "dimension-repeat", 1, "rounds of the partition dimension, each running tenure and the at-least-once program at every count; its targets are judged by the spread of the rounds", arg("N"))
	f.Bool(&c.dimensionOnly, "dimension-only", false, "run only the partition dimension (no throughput rows, profile, latency or scaling runs; the backlog is still calibrated unless --jobs is given)")
	f.String(&c.dimensionPartitions, "dimension-partitions", "12,120,1000", "the partition counts of the partition dimension, comma-separated", arg("P,P,..."))
	f.String(&c.jsonOut, "json", "", "also write the report as JSON to this file", arg("FILE"))
}

func (c *benchCmd) check([]string) error {
	if c.latencyRate < 0 || c.latencySeconds < 1 {
		return usagef("--latency-rate must not be negative and --latency-seconds must be at least 1")
	}
	if c.latencyRate < 1 {
		return usagef("--latency-rate must be at least 1")
	}
	if (c.jobs != 0 && c.jobs < 1000) || c.partitions < 1 || c.partitions > 1000 || c.valueBytes < 16 || c.keys < 1 || c.repeat < 1 || c.naiveJobs < 0 {
		return usagef("--jobs must be 0 (calibrated) or at least 1000, --partitions from 1 to 1000, --value-bytes at least 16, --keys at least 1, --repeat at least 1")
	}
	if _, err := c.dimension(); err != nil {
		return err
	}
	if c.dimensionRepeat < 1 {
		return usagef("--dimension-repeat must be at least 1")
	}
	if c.dimensionOnly && (c.latencyOnly || !c.partitionsDimension) {
		return usagef("--dimension-only runs the partition dimension alone: it goes with neither --latency-only nor --partitions-dimension=false")
	}
	if _, err := bench.ParseLatencyVariants(c.latencyVariants); err != nil {
		return usagef("--latency-variants: %v", err)
	}
	return nil
}

// dimension is --dimension-partitions, none without --partitions-dimension.
func (c *benchCmd) dimension() ([]int, error) {
	if !c.partitionsDimension {
		return nil, nil
	}
	var out []int
	for _, f := range strings.Split(c.dimensionPartitions, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 3 || n > 10_000 {
			return nil, usagef("--dimension-partitions: %q is not a partition count from 3 (one per worker) to 10000", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func (c *benchCmd) run(ctx context.Context) error {
	if _, err := c.kafka.kgoOpts(nil); err != nil {
		return err
	}
	if c.kafka.brokers == "" && len(c.kafka.args()) > 0 {
		return usagef("the TLS and SASL flags need --brokers: the development broker bench starts itself speaks plaintext")
	}
	dim, err := c.dimension()
	if err != nil {
		return err
	}
	variants, err := bench.ParseLatencyVariants(c.latencyVariants)
	if err != nil {
		return usagef("--latency-variants: %v", err)
	}
	pool, err := openDB(ctx, c.dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	return bench.Run(ctx, bench.Config{
		Brokers: c.kafka.list(), KafkaArgs: c.kafka.args(),
		NewClient: func(brokers []string, opts ...kgo.Opt) (*kgo.Client, error) { return c.kafka.client(brokers, opts...) },
		Pool:      pool, DatabaseURL: c.dbURL,
		Jobs: c.jobs, Partitions: c.partitions, ValueBytes: c.valueBytes, Keys: c.keys, NaiveJobs: c.naiveJobs,
		LatencySeconds: c.latencySeconds, LatencyRate: c.latencyRate, ScalingJobs: c.scalingJobs, SkipScaling: c.skipScaling,
		Repeat: c.repeat, DimensionPartitions: dim, DimensionRepeat: c.dimensionRepeat,
		WorkerFlags: strings.Fields(c.workerFlags), JSONFile: c.jsonOut,
		LatencyOnly: c.latencyOnly, LatencyVariants: variants, DimensionOnly: c.dimensionOnly,
		Getenv: c.getenv, Stdout: c.stdout, Progress: c.stderr,
	})
}

var benchChildSpec = spec{name: "bench-child", args: "alo|naive|copy", maxArgs: 1, hidden: true,
	short: "internal: a program tenure bench measures (alo, naive, copy)"}

// benchChild is `tenure bench-child KIND`, started by `tenure bench`.
type benchChild struct {
	base
	kafka                              kafkaFlags
	group, topic, dbURL, schema, table string
	jobs, partitions, batchMax         int
	perPoll                            bool
	kind                               string
}

func (c *benchChild) define(f *flagSet) {
	c.kafka.define(f, "Kafka seed brokers")
	f.String(&c.group, "group", "", "consumer group", arg("G"))
	f.String(&c.topic, "topic", "", "topic", arg("T"))
	f.String(&c.dbURL, "database-url", "", "PostgreSQL URL", arg("URL"))
	f.String(&c.schema, "schema", "", "schema of the ledger table", arg("S"))
	f.String(&c.table, "table", "ledger", "copy: the table to copy into", arg("T"))
	f.Int(&c.jobs, "jobs", 0, "copy: rows to write; naive: stop after this many")
	f.Int(&c.partitions, "partitions", 12, "copy: parallel writers (one per partition)", arg("P"))
	f.Int(&c.batchMax, "batch-max", 0, "alo: rows per COPY, at most (0: each partition's part of a poll in one COPY)")
	f.Bool(&c.perPoll, "per-poll", false, "alo: all of a poll, across its partitions, in one COPY")
}

func (c *benchChild) check(args []string) error {
	if len(args) != 1 {
		return usagef("a kind is required: alo, naive or copy")
	}
	switch c.kind = args[0]; c.kind {
	case "alo", "naive", "copy":
		if c.perPoll && (c.kind != "alo" || c.batchMax > 0) {
			return usagef("--per-poll writes a whole poll in one COPY, for kind alo only: it takes no --batch-max")
		}
		return nil
	}
	return usagef("unknown kind %q: alo, naive or copy", c.kind)
}

func (c *benchChild) run(ctx context.Context) error {
	size := poolSize{max: 32, min: 4}
	if c.perPoll {
		// One COPY at a time: the partition dimension runs three of these
		// beside each other, on a server other work shares.
		size = poolSize{max: 2, min: 1}
	}
	pool, err := openDB(ctx, c.dbURL, size)
	if err != nil {
		return err
	}
	defer pool.Close()
	cfg := bench.ChildConfig{Kind: c.kind, Pool: pool, Schema: c.schema, Table: c.table, Brokers: c.kafka.list(),
		Group: c.group, Topic: c.topic, Jobs: c.jobs, Partitions: c.partitions, BatchMax: c.batchMax, PerPoll: c.perPoll}
	if c.kind != "copy" {
		if cfg.KafkaOpts, err = c.kafka.kgoOpts(nil); err != nil {
			return err
		}
	}
	return bench.Child(ctx, cfg)
}
