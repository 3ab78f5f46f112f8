// Package bench is `tenure bench` (Run) and the programs it compares tenure
// with (Child, run as `tenure bench-child KIND`). The CLI (internal/cli)
// parses their flags and opens their connections.
package bench

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/internal/childproc"
	"github.com/tenure-dev/tenure/internal/devbroker"
	"github.com/tenure-dev/tenure/sink"
)

// Result is one run of one program.
type Result struct {
	Name        string  `json:"name,omitempty"`
	Jobs        int64   `json:"jobs"`
	JobsPerSec  float64 `json:"jobs_per_sec"`
	WallSeconds float64 `json:"wall_seconds"`
	// DrainSeconds is the time from the first row's commit to the last.
	DrainSeconds float64 `json:"drain_seconds"`
	CPUPerMJobs  float64 `json:"cpu_seconds_per_million_jobs"`
	// The PostgreSQL server's CPU time over the run, when it runs on this
	// machine (omitted otherwise). Other use of the server counts too.
	DBCPUPerMJobs *float64 `json:"postgres_cpu_seconds_per_million_jobs,omitempty"`
	PeakRSSMB     float64  `json:"peak_rss_mb"`
	// GatedSeconds is, for the partition dimension's runs, how long the
	// program's writes waited behind the bench's gate while the backlog was
	// produced (gatedBacklog); Note says when the gate opened before all of
	// it was there.
	GatedSeconds float64 `json:"gated_seconds,omitempty"`
	Note         string  `json:"note,omitempty"`
}

// Row is one program over the repeats: each run, and the median and spread
// (min–max) of each figure.
type Row struct {
	Name string `json:"name"`
	What string `json:"what"`
	// Skipped says why the row was not run ("" when it was).
	Skipped      string   `json:"skipped,omitempty"`
	Jobs         int64    `json:"jobs"` // of each run
	Runs         []Result `json:"runs"`
	JobsPerSec   Stat     `json:"jobs_per_sec"`
	DrainSeconds Stat     `json:"drain_seconds"`
	CPUPerMJobs  Stat     `json:"cpu_seconds_per_million_jobs"`
	// DBCPUPerMJobs is the server's; TotalCPUPerMJobs the process's and the
	// server's together: the cost of a job on this machine.
	DBCPUPerMJobs    *Stat `json:"postgres_cpu_seconds_per_million_jobs,omitempty"`
	TotalCPUPerMJobs *Stat `json:"total_cpu_seconds_per_million_jobs,omitempty"`
	PeakRSSMB        Stat  `json:"peak_rss_mb"`
}

func (r *Row) add(res Result) {
	r.Runs = append(r.Runs, res)
	r.Jobs = res.Jobs
	col := func(f func(Result) float64) []float64 {
		var vs []float64
		for _, x := range r.Runs {
			vs = append(vs, f(x))
		}
		return vs
	}
	r.JobsPerSec = summarize(col(func(x Result) float64 { return x.JobsPerSec }))
	r.DrainSeconds = summarize(col(func(x Result) float64 { return x.DrainSeconds }))
	r.CPUPerMJobs = summarize(col(func(x Result) float64 { return x.CPUPerMJobs }))
	r.PeakRSSMB = summarize(col(func(x Result) float64 { return x.PeakRSSMB }))
	r.DBCPUPerMJobs, r.TotalCPUPerMJobs = nil, nil
	if db := col(dbCPU); !slices.ContainsFunc(db, math.IsNaN) {
		s, t := summarize(db), summarize(col(totalCPU))
		r.DBCPUPerMJobs, r.TotalCPUPerMJobs = &s, &t
	}
}

func dbCPU(x Result) float64 {
	if x.DBCPUPerMJobs == nil {
		return math.NaN()
	}
	return *x.DBCPUPerMJobs
}

// totalCPU is the process's CPU and the server's per million jobs (the
// process's alone when the server's is not known).
func totalCPU(x Result) float64 {
	if x.DBCPUPerMJobs == nil {
		return x.CPUPerMJobs
	}
	return x.CPUPerMJobs + *x.DBCPUPerMJobs
}

func (r *Row) col(f func(Result) float64) []float64 {
	var vs []float64
	for _, x := range r.Runs {
		vs = append(vs, f(x))
	}
	return vs
}

// PartitionRun is one run of the partition dimension: the same backlog over
// Partitions partitions, 3 workers, one of them killed (SIGKILL) a third of
// the way through.
type PartitionRun struct {
	Partitions int   `json:"partitions"`
	Workers    int   `json:"workers"`
	Round      int   `json:"round"` // from 0
	Jobs       int64 `json:"jobs"`
	// JobsToKill are the rows committed by the kill: what the rate, CPU
	// and RSS below are measured over.
	JobsToKill int64 `json:"jobs_up_to_kill"`
	// Up to the kill: rate, CPU (the workers' and the server's) per
	// million jobs, the largest worker's peak RSS.
	JobsPerSec    float64  `json:"jobs_per_sec"`
	CPUPerMJobs   float64  `json:"cpu_seconds_per_million_jobs"`
	DBCPUPerMJobs *float64 `json:"postgres_cpu_seconds_per_million_jobs,omitempty"`
	PeakRSSMB     float64  `json:"peak_rss_mb_per_worker"`
	// ClaimsPerSec: the partitions claimed at start-up over the time from
	// the first claim to the last partition's first claim.
	ClaimsPerSec float64 `json:"claims_per_sec"`
	// Held are the partitions the killed worker held at the kill (its
	// members' last claims); HandedOff those of them that still had jobs,
	// HandOffSeconds the longest time from the kill to another worker's
	// first commit on one of them, HandOffClaimSeconds to the last of their
	// claims (the group's share; the rest is the new owners' lanes getting
	// to them).
	Held                int     `json:"held_partitions"`
	HandedOff           int     `json:"handed_off_partitions"`
	HandOffSeconds      float64 `json:"hand_off_seconds_max"`
	HandOffClaimSeconds float64 `json:"hand_off_claimed_seconds_max"`
	Note                string  `json:"note,omitempty"`
	GatedSeconds        float64 `json:"gated_seconds,omitempty"`
}

// result is the run up to the kill as a Result, for a Row.
func (p PartitionRun) result() Result {
	return Result{Name: fmt.Sprintf("tenure, %d partitions", p.Partitions), Jobs: p.JobsToKill, JobsPerSec: p.JobsPerSec,
		CPUPerMJobs: p.CPUPerMJobs, DBCPUPerMJobs: p.DBCPUPerMJobs, PeakRSSMB: p.PeakRSSMB, GatedSeconds: p.GatedSeconds, Note: p.Note}
}

// PartitionCount is one partition count of the dimension over its rounds:
// tenure's 3 workers beside the at-least-once program's 3 processes (one
// COPY per poll across partitions), both up to a third of the same backlog.
// Row i of each is round i.
type PartitionCount struct {
	Partitions  int `json:"partitions"`
	Tenure      Row `json:"tenure"`
	AtLeastOnce Row `json:"at_least_once"`
	// HandOffSeconds is tenure's longest hand-off over the rounds that had
	// one (a killed worker whose partitions still had jobs).
	HandOffSeconds Stat      `json:"hand_off_seconds_max"`
	handOffs       []float64 // NaN: none that round
}

// addTenure adds a round of tenure's.
func (c *PartitionCount) addTenure(r PartitionRun) {
	c.Partitions = r.Partitions
	c.Tenure.Name = fmt.Sprintf("tenure at %d partitions", r.Partitions)
	c.Tenure.add(r.result())
	h := math.NaN()
	if r.HandedOff > 0 {
		h = r.HandOffSeconds
	}
	c.handOffs = append(c.handOffs, h)
	c.HandOffSeconds = summarize(c.handOffs)
}

// addAtLeastOnce adds a round of the at-least-once program's.
func (c *PartitionCount) addAtLeastOnce(r Result) {
	c.AtLeastOnce.Name = fmt.Sprintf("at-least-once at %d partitions", c.Partitions)
	c.AtLeastOnce.add(r)
}

type Report struct {
	ID       string            `json:"id"` // in the names of the run's topics, schemas and groups
	Machine  map[string]string `json:"machine"`
	Settings map[string]any    `json:"settings"`
	Repeat   int               `json:"repeat"`
	Results  []Row             `json:"results"`
	// LatencyRuns are the latency runs, one per repeat; Latency their
	// medians and spreads (ms; "achieved_rate" in jobs/s).
	LatencyRuns []map[string]float64 `json:"latency_runs,omitempty"`
	Latency     map[string]Stat      `json:"latency_ms,omitempty"`
	// LatencyVariants are the latency runs of Config.LatencyVariants,
	// interleaved with the default's.
	LatencyVariants []VariantLatency `json:"latency_variants,omitempty"`
	// LatencyRate is the rate asked for (jobs/s).
	LatencyRate float64        `json:"latency_rate"`
	Scaling     []Result       `json:"scaling,omitempty"`
	Partitions  []PartitionRun `json:"partition_dimension,omitempty"`
	// PartitionCounts are the partition dimension side by side with the
	// at-least-once program, one per count, in --dimension-partitions order.
	PartitionCounts []PartitionCount `json:"partition_dimension_by_count,omitempty"`
	// DimensionSessionTimeout is the dimension workers' session timeout
	// (seconds): the hand-off target is it plus 2.
	DimensionSessionTimeout float64 `json:"partition_dimension_session_timeout_seconds,omitempty"`
	// DimensionJobs is the partition dimension's backlog (dimensionJobs).
	DimensionJobs int `json:"partition_dimension_jobs,omitempty"`
	// DimensionFailed is why the partition dimension is not in the report
	// (dropDimension); the bench then exits with that error.
	DimensionFailed string   `json:"partition_dimension_failed,omitempty"`
	Targets         []Target `json:"targets"`
	// Profile is where a tenure worker's CPU goes (one more run, profiled).
	Profile *Profile `json:"profile,omitempty"`
	// WhereTimeGoes explains the targets not met.
	WhereTimeGoes []string  `json:"where_the_time_goes,omitempty"`
	Notes         []string  `json:"notes,omitempty"`
	StartedAt     time.Time `json:"started_at"`
}

type Target struct {
	Name string `json:"name"`
	// Value is the median (of a ratio: the ratio of the medians), Spread
	// the figure's min–max (of a ratio: of the per-repeat ratios).
	Value   float64 `json:"value"`
	Spread  Stat    `json:"spread"`
	Want    string  `json:"want"`
	Verdict string  `json:"verdict"` // met, unclear, not met
	Note    string  `json:"note,omitempty"`
}

// Config is one run of the bench.
type Config struct {
	// Brokers are Kafka's seed brokers; none: a development broker in this
	// process. KafkaArgs are the TLS and SASL flags the tenure processes
	// it starts connect with, and NewClient makes its own clients with
	// them (nil: plain kgo clients).
	Brokers   []string
	KafkaArgs []string
	NewClient func(brokers []string, opts ...kgo.Opt) (*kgo.Client, error)
	// Pool is the database, open; DatabaseURL the same, for the processes
	// it starts. The bench creates and drops schemas of its own.
	Pool        *pgxpool.Pool
	DatabaseURL string
	// Jobs are pre-produced for each throughput run (0: sized by a short
	// calibration run so that tenure drains for MinDrain), over Partitions
	// partitions, values of ValueBytes bytes, Keys distinct keys spread
	// evenly; the naive program runs NaiveJobs of them (0: sized the same
	// way).
	Jobs, Partitions, ValueBytes, Keys, NaiveJobs int
	// Repeat is how many times each throughput and latency run is repeated
	// (at least 1).
	Repeat int
	// MinDrain is the draining time the calibration sizes the backlog for
	// (default 5s).
	MinDrain time.Duration
	// Latency: jobs produced for LatencySeconds at LatencyRate jobs/s.
	LatencySeconds, LatencyRate int
	// ScalingJobs are the jobs of each scaling run, unless SkipScaling.
	ScalingJobs int
	SkipScaling bool
	// DimensionPartitions are the partition counts of the partition
	// dimension (3 workers each, the same backlog); none: skipped.
	DimensionPartitions []int
	// DimensionRepeat is the rounds of the partition dimension (at least 1):
	// each runs tenure and the at-least-once program at every count.
	DimensionRepeat int
	// LatencyOnly runs the latency runs alone (no calibration, throughput
	// rows or profile); LatencyVariants are run beside the default in each
	// latency round, in turns, each with its worker flags after WorkerFlags.
	LatencyOnly     bool
	LatencyVariants []LatencyVariant
	// DimensionOnly runs the partition dimension alone (no throughput rows,
	// profile, latency or scaling runs); the backlog is still sized by a
	// calibration run when Jobs is 0.
	DimensionOnly bool
	// WorkerFlags are extra flags of every tenure worker it runs.
	WorkerFlags []string
	// JSONFile, when set, gets the report as JSON.
	JSONFile string
	// Getenv reads the environment the workers inherit.
	Getenv func(string) string
	// Stdout gets the report, Progress what the bench is doing.
	Stdout, Progress io.Writer
}

type bench struct {
	cfg         Config
	brokers     []string
	dbURL       string
	pool        *pgxpool.Pool
	cl          *kgo.Client
	id          string
	jobs        int
	partitions  int
	valueBytes  int
	keys        int
	schemas     []string
	topics      []string
	groups      []string
	kafkaArgs   []string // TLS and SASL flags, for the processes it starts
	workerFlags []string // --worker-flags
	progress    io.Writer
	postmaster  int           // the local PostgreSQL server's pid; 0 not looked for yet, -1 not here
	env         []string      // extra environment of the processes it starts
	otlpURL     string        // the discarding OTLP/HTTP receiver
	gateLimit   time.Duration // tests: gatedBacklog's limit (0: gateLimit)
	dimJobs     int           // the partition dimension's backlog (dimensionJobs)
}

// noTracing is the environment of every run but tenure-traced.
var noTracing = []string{"OTEL_SDK_DISABLED=true"}

// Run measures, in one run on the same broker, database and jobs, tenure
// beside what a user would write instead, so that the figures compare side
// by side on whatever machine it runs on (ratios, not absolute numbers,
// are the point on a shared machine). Every throughput and latency run is
// repeated; the report gives the median and spread of each figure and
// judges each target by the whole spread. See docs/throughput.md. The
// programs it compares run as processes of their own (their CPU time and
// peak memory are measured): `tenure worker` and `tenure bench-child` of
// the running binary.
func Run(ctx context.Context, cfg Config) error {
	cfg.Repeat = max(cfg.Repeat, 1)
	if cfg.MinDrain <= 0 {
		cfg.MinDrain = 5 * time.Second
	}
	b := &bench{cfg: cfg, workerFlags: cfg.WorkerFlags, dbURL: cfg.DatabaseURL, pool: cfg.Pool, jobs: cfg.Jobs, partitions: cfg.Partitions,
		valueBytes: cfg.ValueBytes, keys: cfg.Keys, progress: cfg.Progress, kafkaArgs: cfg.KafkaArgs}
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	b.id = hex.EncodeToString(rnd[:])
	if len(cfg.Brokers) == 0 {
		c, err := devbroker.Start(devbroker.Config{Listen: "127.0.0.1:0"})
		if err != nil {
			return err
		}
		defer c.Close()
		b.brokers = c.ListenAddrs()
	} else {
		b.brokers = cfg.Brokers
	}
	newClient := cfg.NewClient
	if newClient == nil {
		newClient = func(brokers []string, opts ...kgo.Opt) (*kgo.Client, error) {
			return kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, opts...)...)
		}
	}
	var err error
	if b.cl, err = newClient(b.brokers, kgo.ProducerLinger(5*time.Millisecond), kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil))); err != nil {
		return err
	}
	defer b.cl.Close()
	defer b.cleanup()
	stopOTLP, err := b.startOTLP()
	if err != nil {
		return err
	}
	defer stopOTLP()

	rep := &Report{ID: b.id, Machine: machineInfo(ctx, b.pool), StartedAt: time.Now().UTC(), Repeat: cfg.Repeat}
	naive := cfg.NaiveJobs
	if !cfg.LatencyOnly && (b.jobs == 0 || (naive == 0 && !cfg.DimensionOnly)) {
		if err := b.calibrate(ctx, rep, &naive); err != nil {
			return fmt.Errorf("calibration: %w", err)
		}
	}
	naive = min(naive, b.jobs)
	rep.Settings = map[string]any{"worker_flags": strings.Join(cfg.WorkerFlags, " "), "jobs": b.jobs, "partitions": b.partitions,
		"value_bytes": b.valueBytes, "keys": b.keys, "naive_jobs": naive, "repeat": cfg.Repeat,
		"dimension_repeat": max(cfg.DimensionRepeat, 1)}
	if !cfg.LatencyOnly && !cfg.DimensionOnly {
		if err := b.throughput(ctx, rep, naive); err != nil {
			return err
		}
	}
	rep.LatencyRate = float64(cfg.LatencyRate)
	// The development broker runs in this process and keeps every record
	// of its topics in memory: the backlogs of the runs before would be
	// this process's heap (its collector's work) while it produces and
	// serves the latency runs' jobs.
	b.dropTopics(slices.Clone(b.topics)...)
	// Each round runs the default and then every variant (in turns: the
	// order rotates by round), so that the machine's noise hits them alike.
	variants := append([]LatencyVariant{{}}, cfg.LatencyVariants...)
	runs := make([][]map[string]float64, len(variants))
	latencyRounds := cfg.Repeat
	if cfg.DimensionOnly {
		latencyRounds = 0
	}
	for i := range latencyRounds {
		for k := range variants {
			v := (k + i) % len(variants)
			name := variants[v].Name
			if name == "" {
				name = "default"
			}
			b.say("latency %d/%d (%s): producing at %d jobs/s for %ds", i+1, cfg.Repeat, name, cfg.LatencyRate, cfg.LatencySeconds)
			suffix := ""
			if v > 0 {
				suffix = fmt.Sprintf("v%d", v)
			}
			l, err := b.latency(ctx, i, float64(cfg.LatencyRate), time.Duration(cfg.LatencySeconds)*time.Second, suffix, variants[v].WorkerFlags, variants[v].Env)
			if err != nil {
				return fmt.Errorf("latency (%s): %w", name, err)
			}
			b.say("latency %d/%d (%s): p50 %.1f ms, p99 %.1f ms, max %.1f ms", i+1, cfg.Repeat, name, l["p50"], l["p99"], l["max"])
			runs[v] = append(runs[v], l)
		}
	}
	if latencyRounds > 0 {
		rep.LatencyRuns, rep.Latency = runs[0], summarizeLatency(runs[0])
		for v, lv := range cfg.LatencyVariants {
			rep.LatencyVariants = append(rep.LatencyVariants, VariantLatency{Name: lv.Name, WorkerFlags: strings.Join(lv.WorkerFlags, " "), Env: strings.Join(lv.Env, " "),
				Runs: runs[v+1], Latency: summarizeLatency(runs[v+1])})
		}
	}
	if !cfg.SkipScaling && !cfg.DimensionOnly {
		if rep.Scaling, err = b.scaling(ctx); err != nil {
			return err
		}
	}
	dimErr := b.dimension(ctx, rep)
	if dimErr != nil {
		if ctx.Err() != nil {
			return dimErr
		}
		dropDimension(rep, dimErr)
	}
	rep.Targets = targets(rep)
	rep.WhereTimeGoes = whereTimeGoes(rep)
	Print(cfg.Stdout, rep)
	if cfg.JSONFile != "" {
		data, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(cfg.JSONFile, append(data, '\n'), 0o644); err != nil {
			return err
		}
	}
	if dimErr != nil {
		return fmt.Errorf("the report above has no partition dimension: %w", dimErr)
	}
	return nil
}

// dropDimension takes a failed partition dimension out of the report and
// says why. The runs before it are kept out too: the dimension's targets
// pair round i of tenure with round i of the at-least-once program, so a
// dimension cut short would judge them on part of a round. The rest of the
// report (in a full run, the throughput, latency and scaling runs: most of
// its twenty minutes) is still printed and written; one comparison
// process that exited at 1,000 partitions used to lose all of it.
func dropDimension(rep *Report, err error) {
	rep.DimensionFailed = err.Error()
	rep.Partitions, rep.PartitionCounts = nil, nil
}

// dimension runs the partition dimension: in each of DimensionRepeat
// rounds, at every count, tenure's run and the at-least-once program's, in
// turns (which goes first alternates by round, so that the machine's noise
// hits them alike).
func (b *bench) dimension(ctx context.Context, rep *Report) error {
	if len(b.cfg.DimensionPartitions) == 0 {
		return nil
	}
	rep.DimensionSessionTimeout = dimSessionTimeout.Seconds()
	b.dimJobs = dimensionJobs(b.jobs, b.batchMax(), slices.Max(b.cfg.DimensionPartitions))
	rep.DimensionJobs = b.dimJobs
	rep.PartitionCounts = make([]PartitionCount, len(b.cfg.DimensionPartitions))
	for i := range max(b.cfg.DimensionRepeat, 1) {
		for k, p := range b.cfg.DimensionPartitions {
			c := &rep.PartitionCounts[k]
			c.Partitions = p
			for turn := range 2 {
				if (turn+i)%2 == 0 {
					r, err := b.partitionRun(ctx, p, 3, i)
					if err != nil {
						return fmt.Errorf("partition dimension, %d partitions: %w", p, err)
					}
					rep.Partitions = append(rep.Partitions, r)
					c.addTenure(r)
				} else {
					r, err := b.aloPartitionRun(ctx, p, 3, i)
					if err != nil {
						return fmt.Errorf("partition dimension, at-least-once, %d partitions: %w", p, err)
					}
					c.addAtLeastOnce(r)
				}
			}
		}
	}
	return nil
}

// dimBatches is how many full batches each partition of the partition
// dimension's largest count has in its backlog, at least: with fewer, a
// third of the backlog is the first batch of every partition, and the run
// measures a start rather than a drain (600,000 jobs over 1,000 partitions
// were 600 a partition, one batch each).
const dimBatches = 3

// dimensionJobs is the partition dimension's backlog, the same at every
// count: the throughput runs' (jobs), or dimBatches batches of batchMax for
// each of the largest count's partitions if that is more.
func dimensionJobs(jobs, batchMax, maxParts int) int {
	return max(jobs, dimBatches*batchMax*maxParts)
}

// calibrationFactor: the backlog is what tenure drains in this many times
// MinDrain at its calibration rate. A short run is slower than a long one's
// steady rate (1.6 to 2.4 times slower for tenure on the 2-core development
// machines) and COPY, the fastest row, about 1.6 times faster than tenure.
// Since the first factor varies that much, COPY is calibrated too, on the
// same number of rows, and the backlog is at least copyCalibrationFactor
// times MinDrain at its rate (COPY's short run was 2.1 times slower than
// its steady rate on the same machine): whichever is larger, every row
// drains for at least MinDrain.
const (
	calibrationFactor     = 3.5
	copyCalibrationFactor = 2.5
)

// calibrate sizes the backlog: one short tenure run (and one of the naive
// program) measures the rates (calibrationFactor).
func (b *bench) calibrate(ctx context.Context, rep *Report, naive *int) error {
	n := 150_000
	topic, err := b.topicWithJobs(ctx, "calib", b.partitions, n)
	if err != nil {
		return err
	}
	md := b.cfg.MinDrain.Seconds()
	if b.jobs == 0 {
		b.say("calibrating: tenure on %d jobs", n)
		r, err := b.runWorkers(ctx, "calib", topic, n, 1, nil, nil)
		if err != nil {
			return err
		}
		b.say("calibrating: COPY on %d rows", n)
		b.jobs = n
		c, err := b.runCopy(ctx, 0, "ledger") // its schema is dropped: round 0's is made afresh
		if err != nil {
			return err
		}
		byTenure := int(math.Ceil(r.JobsPerSec*md*calibrationFactor/50_000)) * 50_000
		byCopy := int(math.Ceil(c.JobsPerSec*md*copyCalibrationFactor/50_000)) * 50_000
		b.jobs = max(100_000, byTenure, byCopy)
		rep.Notes = append(rep.Notes, fmt.Sprintf("backlog sized by calibration runs on %d jobs: tenure drained them at %.0f jobs/s (%.1f × %.0f s of that: %d jobs), COPY at %.0f rows/s (%.1f × %.0f s: %d); %d jobs",
			n, r.JobsPerSec, calibrationFactor, md, byTenure, c.JobsPerSec, copyCalibrationFactor, md, byCopy, b.jobs))
	}
	if *naive == 0 && !b.cfg.DimensionOnly {
		b.say("calibrating: naive on 1500 jobs")
		r, err := b.runChild(ctx, "calibnaive", topic, 1500, "naive")
		if err != nil {
			return err
		}
		// The naive program's short run is dominated by its start even
		// more: 1.3 times calibrationFactor.
		*naive = max(1000, int(math.Ceil(r.JobsPerSec*md*calibrationFactor*1.3/1000))*1000)
		rep.Notes = append(rep.Notes, fmt.Sprintf("naive program's jobs sized the same way: %.0f jobs/s on 1500 jobs, %d jobs (%.2f × %.0f s)", r.JobsPerSec, *naive, calibrationFactor*1.3, md))
	}
	return nil
}

// throughput runs each program on the same backlog, Repeat rounds of all
// of them.
func (b *bench) throughput(ctx context.Context, rep *Report, naive int) error {
	topic, err := b.topicWithJobs(ctx, "main", b.partitions, b.jobs)
	if err != nil {
		return err
	}
	strictWhat := "the same with strict hand-off (--strict: PREPARE TRANSACTION, offset commit, COMMIT PREPARED per batch)"
	strict, strictSkip, closeStrict := b.strictDB(ctx, rep)
	defer closeStrict()
	if strict != b {
		strictWhat += ", on the bench's throwaway PostgreSQL cluster (see above)"
	}
	traced := append(slices.Clone(noTracing), "OTEL_SDK_DISABLED=false", "OTEL_TRACES_EXPORTER=otlp", "OTEL_EXPORTER_OTLP_ENDPOINT="+b.otlpURL)
	steps := []struct {
		name, what, skip string
		fn               func(i int) (Result, error)
	}{
		{"tenure", "tenure worker, ledger handler, fenced, default settings", "", func(i int) (Result, error) {
			return b.runWorkers(ctx, fmt.Sprintf("tenure%d", i), topic, b.jobs, 1, nil, nil)
		}},
		{"tenure-unfenced", "the same without the fence statement (--unsafe-no-fence)", "", func(i int) (Result, error) {
			return b.runWorkers(ctx, fmt.Sprintf("unfenced%d", i), topic, b.jobs, 1, []string{"--unsafe-no-fence"}, nil)
		}},
		{"tenure-strict", strictWhat, strictSkip, func(i int) (Result, error) {
			r, err := strict.runWorkers(ctx, fmt.Sprintf("strict%d", i), topic, b.jobs, 1, []string{"--strict"}, nil)
			if strict != b {
				// Its groups are on the bench's broker: b's clean-up
				// deletes them.
				b.groups, strict.groups = append(b.groups, strict.groups...), nil
			}
			return r, err
		}},
		{"tenure-traced", "tenure with tracing on, exporting OTLP/HTTP to a discarding receiver in the bench (other runs: OTEL_SDK_DISABLED=true)", "", func(i int) (Result, error) {
			return b.runWorkers(ctx, fmt.Sprintf("traced%d", i), topic, b.jobs, 1, nil, traced)
		}},
		{"at-least-once", fmt.Sprintf("franz-go + pgx: tenure's batches (at most %d jobs) by COPY, Kafka offsets committed after them, no fencing", b.batchMax()), "", func(i int) (Result, error) {
			return b.runChild(ctx, fmt.Sprintf("alo%d", i), topic, b.jobs, "alo", "--batch-max", strconv.Itoa(b.batchMax()))
		}},
		{"at-least-once-fetch", "the same, each partition's part of a poll in one COPY (kgo's default fetch sizes: memory not bounded)", "", func(i int) (Result, error) {
			return b.runChild(ctx, fmt.Sprintf("alofetch%d", i), topic, b.jobs, "alo")
		}},
		{"naive", fmt.Sprintf("one autocommitted INSERT per job, in order (measured on %d jobs)", naive), "", func(i int) (Result, error) {
			return b.runChild(ctx, fmt.Sprintf("naive%d", i), topic, naive, "naive")
		}},
		{"copy-ceiling", "the same rows by parallel COPY into the same table, no Kafka", "", func(i int) (Result, error) {
			return b.runCopy(ctx, i, "ledger")
		}},
		{"copy-plain", "the same rows by parallel COPY into a plain table of the same columns", "", func(i int) (Result, error) {
			return b.runCopy(ctx, i, "plain")
		}},
	}
	rows := make([]Row, len(steps))
	for i, s := range steps {
		rows[i] = Row{Name: s.name, What: s.what, Skipped: s.skip}
	}
	for i := range b.cfg.Repeat {
		for k, s := range steps {
			if s.skip != "" {
				continue
			}
			b.say("round %d/%d: running %s", i+1, b.cfg.Repeat, s.name)
			r, err := s.fn(i)
			if err != nil {
				return fmt.Errorf("%s: %w", s.name, err)
			}
			rows[k].add(r)
			b.say("%s: %.0f jobs/s over %.1f s", s.name, r.JobsPerSec, r.DrainSeconds)
		}
	}
	rep.Results = rows
	prof, err := b.profileWorker(ctx, topic)
	if err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	rep.Profile = prof
	return nil
}

// strictDB is the bench the tenure-strict row runs on: b when its server
// takes prepared transactions; else a copy of b on a throwaway cluster
// (throwaway.go) with the same broker, settings copied from b's server, a
// note in rep saying so; else nil and why the row is skipped, in one
// sentence. done stops and removes the cluster.
func (b *bench) strictDB(ctx context.Context, rep *Report) (strict *bench, skip string, done func()) {
	done = func() {}
	err := sink.CheckPreparedTransactions(ctx, b.pool)
	if err == nil {
		return b, "", done
	}
	if !errors.Is(err, sink.ErrNoPreparedTransactions) {
		return nil, "skipped: " + err.Error(), done
	}
	refuses := "this PostgreSQL server refuses prepared transactions (max_prepared_transactions is 0), which --strict needs"
	settings, err := serverSettings(ctx, b.pool, copiedSettings)
	if err != nil {
		return nil, fmt.Sprintf("skipped: %s, and its settings could not be read for a throwaway cluster: %v", refuses, err), done
	}
	b.say("%s: starting a throwaway PostgreSQL cluster for the tenure-strict row", refuses)
	c, err := startThrowawayPG(ctx, settings)
	if errors.Is(err, errNoPostgresBinaries) {
		return nil, fmt.Sprintf("skipped: %s, and no PostgreSQL server binaries (initdb) were found here to start a throwaway cluster with them", refuses), done
	}
	if err != nil {
		return nil, fmt.Sprintf("skipped: %s, and a throwaway cluster with them did not start: %v", refuses, err), done
	}
	pool, err := pgxpool.New(ctx, c.URL())
	if err == nil {
		err = sink.CheckPreparedTransactions(ctx, pool)
	}
	if err != nil {
		if pool != nil {
			pool.Close()
		}
		_ = c.Close()
		return nil, fmt.Sprintf("skipped: %s, and the throwaway cluster started for it did not serve: %v", refuses, err), done
	}
	done = func() {
		pool.Close()
		if err := c.Close(); err != nil {
			b.say("removing the throwaway PostgreSQL cluster: %v", err)
		}
	}
	var version string
	_ = pool.QueryRow(ctx, `SHOW server_version`).Scan(&version)
	var copied []string
	for _, k := range copiedSettings {
		if v, ok := settings[k]; ok {
			copied = append(copied, k+"="+v)
		}
	}
	rep.Notes = append(rep.Notes, fmt.Sprintf("tenure-strict ran on a throwaway PostgreSQL %s cluster the bench started on port %d with max_prepared_transactions = 100, since the server at --database-url has it at 0; "+
		"its settings copied from that server (%s), but another server, on the same cores, with cold caches: compare its row with the others' less closely", version, c.port, strings.Join(copied, ", ")))
	s := *b
	s.pool, s.dbURL, s.postmaster, s.schemas, s.groups = pool, c.URL(), 0, nil, nil
	return &s, "", done
}

// scaling runs tenure with 1, 2 and 3 workers and 1, 12 and 48 partitions,
// once each.
func (b *bench) scaling(ctx context.Context) ([]Result, error) {
	var out []Result
	for _, s := range []struct {
		name           string
		workers, parts int
	}{{"1 worker, 12 partitions", 1, 12}, {"2 workers, 12 partitions", 2, 12}, {"3 workers, 12 partitions", 3, 12},
		{"1 worker, 1 partition", 1, 1}, {"1 worker, 48 partitions", 1, 48}} {
		b.say("scaling: %s", s.name)
		t, err := b.topicWithJobs(ctx, fmt.Sprintf("scale%dw%dp", s.workers, s.parts), s.parts, b.cfg.ScalingJobs)
		if err != nil {
			return nil, err
		}
		r, err := b.runWorkers(ctx, fmt.Sprintf("scale%dw%dp", s.workers, s.parts), t, b.cfg.ScalingJobs, s.workers, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("scaling %s: %w", s.name, err)
		}
		r.Name = s.name
		out = append(out, r)
	}
	return out, nil
}

// startOTLP starts the discarding OTLP/HTTP receiver tenure-traced exports
// to: it reads each request and answers 200 with an empty body.
func (b *bench) startOTLP() (func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	}), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	b.otlpURL = "http://" + ln.Addr().String()
	return func() { _ = srv.Close() }, nil
}

// group names a run's consumer group, remembered for the clean-up.
func (b *bench) group(name string) string {
	g := "bench-" + b.id + "-" + name
	b.groups = append(b.groups, g)
	return g
}

func (b *bench) say(format string, args ...any) {
	fmt.Fprintf(b.progress, "bench: "+format+"\n", args...)
}

// topicWithJobs creates a topic and produces n jobs to it, keys spread
// evenly (key i % keys), values of valueBytes bytes.
func (b *bench) topicWithJobs(ctx context.Context, name string, partitions, n int) (string, error) {
	topic, err := b.topic(ctx, name, partitions)
	if err != nil {
		return "", err
	}
	return topic, b.produce(ctx, topic, n)
}

// topic creates the run's topic of that name.
func (b *bench) topic(ctx context.Context, name string, partitions int) (string, error) {
	topic := "bench-" + b.id + "-" + name
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := kadm.NewClient(b.cl).CreateTopic(cctx, int32(partitions), 1, nil, topic); err != nil {
		return "", fmt.Errorf("creating topic %s: %w", topic, err)
	}
	b.topics = append(b.topics, topic)
	return topic, nil
}

// produce produces n jobs to topic, keyed over b.keys keys.
func (b *bench) produce(ctx context.Context, topic string, n int) error {
	pad := strings.Repeat("x", max(0, b.valueBytes-24))
	var failed atomic.Pointer[error]
	var wg sync.WaitGroup
	start := time.Now()
	last := start
	for i := range n {
		v := fmt.Sprintf(`{"i":%012d,"p":"%s"}`, i, pad)
		wg.Add(1)
		b.cl.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte("key-" + strconv.Itoa(i%b.keys)), Value: []byte(v[:min(len(v), b.valueBytes)])},
			func(_ *kgo.Record, err error) {
				if err != nil {
					failed.CompareAndSwap(nil, &err)
				}
				wg.Done()
			})
		if time.Since(last) > 2*time.Second {
			last = time.Now()
			b.say("produced %d/%d jobs to %s", i, n, topic)
		}
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		return fmt.Errorf("producing to %s: %w", topic, *err)
	}
	b.say("produced %d jobs to %s in %s", n, topic, time.Since(start).Round(time.Millisecond))
	return nil
}

// schema creates a migrated schema for one run; the plain table too.
func (b *bench) schema(ctx context.Context, name string) (string, error) {
	s := "bench_" + b.id + "_" + name
	if _, err := sink.Migrate(ctx, b.pool, s); err != nil {
		return "", err
	}
	b.schemas = append(b.schemas, s)
	q := pgx.Identifier{s}.Sanitize()
	// A plain table of the ledger's columns, without even its NOT NULLs:
	// what Postgres ingests when the table costs nothing.
	_, err := b.pool.Exec(ctx, `CREATE TABLE `+q+`.plain (topic text, partition integer, job_offset bigint, job_key text,
		job_key_bytes bytea, incarnation bigint, epoch integer, worker text, committed_at timestamptz DEFAULT clock_timestamp())`)
	return s, err
}

// batchMax is the tenure workers' batch size: --batch-max in --worker-flags,
// or the default. The at-least-once program writes batches of that size, so
// that the two differ by what tenure adds, not by how much a COPY carries.
func (b *bench) batchMax() int {
	for i, f := range b.workerFlags {
		f = strings.TrimLeft(f, "-") // -batch-max and --batch-max are one flag
		v, ok := strings.CutPrefix(f, "batch-max=")
		if !ok && f == "batch-max" && i+1 < len(b.workerFlags) {
			v, ok = b.workerFlags[i+1], true
		}
		if n, err := strconv.Atoi(v); ok && err == nil && n > 0 {
			return n
		}
	}
	// The workers inherit the environment.
	if n, err := strconv.Atoi(b.getenv("TENURE_BATCH_MAX")); err == nil && n > 0 {
		return n
	}
	return consumer.DefaultBatchMax
}

// runWorkers runs n tenure worker processes on topic until they have
// committed jobs jobs.
func (b *bench) runWorkers(ctx context.Context, name, topic string, jobs, workers int, extra, env []string) (Result, error) {
	s, err := b.schema(ctx, name)
	if err != nil {
		return Result{}, err
	}
	defer b.dropSchema(s)
	group := b.group(name)
	var procs []*proc
	// Before the first start: a worker that fails to start must not leave
	// the ones started before it running.
	defer func() {
		for _, p := range procs {
			p.stop()
		}
	}()
	start, db0 := time.Now(), b.postgresCPU(ctx)
	for i := range workers {
		args := append([]string{"worker", "--brokers", strings.Join(b.brokers, ","), "--group", group, "--topic", topic,
			"--database-url", b.dbURL, "--schema", s, "--handler", "ledger", "--no-migrate", "--log-level", "error",
			"--name", fmt.Sprintf("bench-%d", i)}, slices.Concat(b.kafkaArgs, b.workerFlags, extra)...)
		p, err := startProc(env, args...)
		if err != nil {
			return Result{}, err
		}
		procs = append(procs, p)
	}
	if err := b.waitRows(ctx, s, "ledger", int64(jobs), procs); err != nil {
		return Result{}, err
	}
	return b.result(ctx, s, "ledger", start, db0, procs)
}

// runChild runs one bench-child program until it has written jobs rows.
func (b *bench) runChild(ctx context.Context, name, topic string, jobs int, kind string, extra ...string) (Result, error) {
	s, err := b.schema(ctx, name)
	if err != nil {
		return Result{}, err
	}
	defer b.dropSchema(s)
	start, db0 := time.Now(), b.postgresCPU(ctx)
	p, err := startProc(nil, append([]string{"bench-child", kind, "--brokers", strings.Join(b.brokers, ","), "--group", b.group(name),
		"--topic", topic, "--database-url", b.dbURL, "--schema", s, "--jobs", strconv.Itoa(jobs)}, slices.Concat(b.kafkaArgs, extra)...)...)
	if err != nil {
		return Result{}, err
	}
	defer p.stop()
	if err := b.waitRows(ctx, s, "ledger", int64(jobs), []*proc{p}); err != nil {
		return Result{}, err
	}
	return b.result(ctx, s, "ledger", start, db0, []*proc{p})
}

func (b *bench) runCopy(ctx context.Context, i int, table string) (Result, error) {
	s, err := b.schema(ctx, fmt.Sprintf("copy%s%d", table, i))
	if err != nil {
		return Result{}, err
	}
	defer b.dropSchema(s)
	start, db0 := time.Now(), b.postgresCPU(ctx)
	p, err := startProc(nil, "bench-child", "copy", "--database-url", b.dbURL, "--schema", s, "--table", table,
		"--jobs", strconv.Itoa(b.jobs), "--partitions", strconv.Itoa(b.partitions))
	if err != nil {
		return Result{}, err
	}
	defer p.stop()
	if err := b.waitRows(ctx, s, table, int64(b.jobs), []*proc{p}); err != nil {
		return Result{}, err
	}
	return b.result(ctx, s, table, start, db0, []*proc{p})
}

// waitRows waits until table has want rows, or a process in procs exits.
// Its cheap count, polled five times a second, is the table's statistics
// (the ledger has no index to count by), which lag: a busy backend reports
// at most once a second, an idle one may not for a long time. So a count
// that stops moving for two seconds is read exactly, and the exact count
// has the last word. The statistics alone once left the wait for a
// partition dimension's last rows hanging after they were all in.
func (b *bench) waitRows(ctx context.Context, schema, table string, want int64, procs []*proc) error {
	q := pgx.Identifier{schema, table}.Sanitize()
	var seen int64 = -1
	var moved time.Time
	return b.wait(ctx, schema, table, want, procs, func(ctx context.Context) (n int64, err error) {
		err = b.pool.QueryRow(ctx, `SELECT coalesce(n_tup_ins, 0) FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = $2`, schema, table).Scan(&n)
		if errors.Is(err, pgx.ErrNoRows) {
			err = nil
		}
		if err != nil || n != seen {
			seen, moved = n, time.Now()
			return n, err
		}
		if time.Since(moved) > 2*time.Second {
			moved = time.Now()
			err = b.pool.QueryRow(ctx, `SELECT count(*) FROM `+q).Scan(&n)
		}
		return n, err
	})
}

// wait polls progress (cheap, may lag or run ahead) until it says want,
// then confirms with the table's exact count.
func (b *bench) wait(ctx context.Context, schema, table string, want int64, procs []*proc, progress func(context.Context) (int64, error)) error {
	q := pgx.Identifier{schema, table}.Sanitize()
	last := time.Now()
	for {
		for _, p := range procs {
			if p.Exited() && want > 0 {
				var n int64
				_ = b.pool.QueryRow(ctx, `SELECT count(*) FROM `+q).Scan(&n)
				if n >= want {
					return nil
				}
				return fmt.Errorf("the measured process exited after %d of %d jobs: %s", n, want, p.lastOutput())
			}
		}
		n, err := progress(ctx)
		if err != nil {
			return err
		}
		if n >= want {
			if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+q).Scan(&n); err != nil {
				return err
			}
			if n >= want {
				return nil
			}
		}
		if time.Since(last) > 2*time.Second {
			last = time.Now()
			b.say("  %d/%d jobs", n, want)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// result measures a finished run: the rate from the first row's commit to
// the last (start-up, the same for everyone, left out), the processes' CPU
// time and peak memory.
func (b *bench) result(ctx context.Context, schema, table string, start time.Time, db0 pgCPU, procs []*proc) (Result, error) {
	var r Result
	cpu, peak := usageOf(procs)
	r.PeakRSSMB = max(r.PeakRSSMB, peak)
	var first, lastAt time.Time
	q := pgx.Identifier{schema, table}.Sanitize()
	if err := b.pool.QueryRow(ctx, `SELECT count(*), min(committed_at), max(committed_at) FROM `+q).Scan(&r.Jobs, &first, &lastAt); err != nil {
		return r, err
	}
	span := lastAt.Sub(first).Seconds()
	if span <= 0 {
		span = 1e-3
	}
	r.JobsPerSec = float64(r.Jobs) / span
	r.DrainSeconds = span
	r.WallSeconds = lastAt.Sub(start).Seconds() // process start to the last row: start-up included
	r.CPUPerMJobs = cpu / float64(r.Jobs) * 1e6
	if db1 := b.postgresCPU(ctx); db0.ok && db1.ok {
		v := (db1.seconds - db0.seconds) / float64(r.Jobs) * 1e6
		r.DBCPUPerMJobs = &v
	}
	return r, nil
}

// latency runs one tenure worker while jobs are produced at rate jobs/s
// for d, and returns the end-to-end latency percentiles (produce to the
// job's row being written in its fenced batch) in milliseconds.
//
// variant names the run (topic, group and schema; "" for the default) and
// extra are its worker flags after --worker-flags. The worker writes its
// stage log (--stage-log), read into the breakdown (stages).
func (b *bench) latency(ctx context.Context, round int, rate float64, d time.Duration, variant string, extra, env []string) (map[string]float64, error) {
	if rate < 1 {
		rate = 1
	}
	name := fmt.Sprintf("latency%d%s", round, variant)
	topic := fmt.Sprintf("bench-%s-%s", b.id, name)
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := kadm.NewClient(b.cl).CreateTopic(cctx, int32(b.partitions), 1, nil, topic); err != nil {
		return nil, err
	}
	b.topics = append(b.topics, topic)
	defer b.dropTopics(topic) // see Run: the broker may be in this process
	s, err := b.schema(ctx, name)
	if err != nil {
		return nil, err
	}
	defer b.dropSchema(s)
	sf, err := os.CreateTemp("", "tenure-bench-stages-*.txt")
	if err != nil {
		return nil, err
	}
	stageFile := sf.Name()
	_ = sf.Close()
	defer func() { _ = os.Remove(stageFile) }()
	p, err := startProc(env, append([]string{"worker", "--brokers", strings.Join(b.brokers, ","), "--group", b.group(name), "--topic", topic,
		"--database-url", b.dbURL, "--schema", s, "--handler", "ledger", "--no-migrate", "--log-level", "error", "--name", "bench-latency",
		"--fence-log-max-age", "-1s", "--fence-log-max-entries", "-1", "--stage-log", stageFile}, slices.Concat(b.kafkaArgs, b.workerFlags, extra)...)...) // the latencies are read from the fence log
	if err != nil {
		return nil, err
	}
	defer p.stop()
	time.Sleep(3 * time.Second) // joined and claimed
	cpu0, _ := p.usage()
	db0 := b.postgresCPU(ctx)
	m0 := readCPU()
	// Each job's produce time by its position; the commit that covers it
	// is found in the fence log afterwards.
	type sentAt struct {
		off     int64
		at, ack time.Time
	}
	var mu sync.Mutex
	sent := map[int32][]sentAt{}
	var wg sync.WaitGroup
	interval := time.Duration(float64(time.Second) / rate)
	began := time.Now()
	end := began.Add(d)
	next := began
	i, total := 0, 0
	for time.Now().Before(end) {
		if wait := time.Until(next); wait > 0 {
			time.Sleep(wait)
		}
		next = next.Add(interval)
		at := time.Now()
		wg.Add(1)
		b.cl.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte("key-" + strconv.Itoa(i%b.keys)), Value: []byte(strings.Repeat("x", b.valueBytes))},
			func(r *kgo.Record, err error) {
				if err == nil {
					mu.Lock()
					sent[r.Partition] = append(sent[r.Partition], sentAt{r.Offset, at, time.Now()})
					total++
					mu.Unlock()
				}
				wg.Done()
			})
		i++
	}
	sendSeconds := time.Since(began).Seconds()
	wg.Wait()
	// The rate the producer achieved: a loaded machine may not keep up
	// with the rate asked for, and the report says so.
	achieved := float64(total) / sendSeconds
	if err := b.waitRows(ctx, s, "ledger", int64(total), []*proc{p}); err != nil {
		return nil, err
	}
	cpu1, rss := p.usage()
	db1 := b.postgresCPU(ctx)
	m1 := readCPU()
	p.stop() // it writes its stage log as it stops
	// The fence log's commit entry is written by the fence statement,
	// which travels with COMMIT: its time (clock_timestamp) is the commit's,
	// to within the COMMIT's own flush.
	store, err := sink.NewStore(b.pool, s)
	if err != nil {
		return nil, err
	}
	log, err := store.FenceLog(ctx, b.group(name))
	if err != nil {
		return nil, err
	}
	type commit struct {
		from, to int64
		at       time.Time
	}
	commits := map[int32][]commit{}
	for _, e := range log {
		if e.Kind == "commit" && e.Partition.Topic == topic {
			commits[e.Partition.Partition] = append(commits[e.Partition.Partition], commit{e.From, e.To, e.At})
		}
	}
	for _, cs := range commits {
		slices.SortStableFunc(cs, func(a, b commit) int { return cmp.Compare(a.from, b.from) })
	}
	st, err := readStages(stageFile)
	if err != nil {
		return nil, fmt.Errorf("the worker's stage log: %w", err)
	}
	var lat, acks []float64
	var timed []jobTimes
	for part, jobs := range sent {
		cs := commits[part]
		for _, j := range jobs {
			k := sort.Search(len(cs), func(k int) bool { return cs[k].to > j.off })
			if k == len(cs) || cs[k].from > j.off {
				return nil, fmt.Errorf("no commit in the fence log covers job %d of partition %d", j.off, part)
			}
			lat = append(lat, float64(cs[k].at.Sub(j.at).Microseconds())/1000)
			acks = append(acks, float64(j.ack.Sub(j.at).Microseconds())/1000)
			timed = append(timed, jobTimes{partition: part, offset: j.off, produced: j.at.UnixNano(), acked: j.ack.UnixNano(), fenceLog: cs[k].at.UnixNano()})
		}
	}
	if len(lat) == 0 {
		return nil, errors.New("no job was measured")
	}
	sort.Float64s(lat)
	sort.Float64s(acks)
	pct := func(q float64) float64 { return lat[min(len(lat)-1, int(q*float64(len(lat))))] }
	ackPct := func(q float64) float64 { return acks[min(len(acks)-1, int(q*float64(len(acks))))] }
	// The producer's share (Produce called to the broker's acknowledgement)
	// is in the figures: it is part of what a user sees.
	out := map[string]float64{"rate_jobs_per_sec": rate, "achieved_rate": achieved, "jobs": float64(len(lat)), "p50": pct(0.50), "p99": pct(0.99), "max": lat[len(lat)-1],
		"produce_ack_p50": ackPct(0.50), "produce_ack_p99": ackPct(0.99)}
	maps.Copy(out, st.breakdown(timed))
	// What the worker and the server spent on it: CPU per million jobs
	// (from the claim to the last row), the worker's peak memory.
	out["worker_cpu_s_per_mjobs"] = (cpu1 - cpu0) / float64(total) * 1e6
	out["worker_peak_rss_mb"] = rss
	if db0.ok && db1.ok {
		out["postgres_cpu_s_per_mjobs"] = (db1.seconds - db0.seconds) / float64(total) * 1e6
	}
	// How much of the machine the rate took, over the same window: the
	// cores busy on average, the worker's, the server's and the bench's
	// own (the producer, and the broker when it runs in this process)
	// among them. A machine near all its cores busy queues every stage.
	if wall := m1.at.Sub(m0.at).Seconds(); m0.ok && m1.ok && wall > 0 {
		out["cores"] = float64(m1.cores)
		out["machine_busy_cores"] = (m1.machine - m0.machine) / wall
		out["bench_busy_cores"] = (m1.self - m0.self) / wall
		out["worker_busy_cores"] = (cpu1 - cpu0) / wall
		if db0.ok && db1.ok {
			out["postgres_busy_cores"] = (db1.seconds - db0.seconds) / wall
		}
	}
	return out, nil
}

func machineInfo(ctx context.Context, pool *pgxpool.Pool) map[string]string {
	m := map[string]string{"cores": strconv.Itoa(runtime.NumCPU()), "go": runtime.Version(), "os": runtime.GOOS + "/" + runtime.GOARCH}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "model name"); ok {
				m["cpu"] = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	var v string
	if err := pool.QueryRow(ctx, `SHOW server_version`).Scan(&v); err == nil {
		m["postgres"] = "PostgreSQL " + v
	}
	return m
}

// dropTopics deletes topics no run needs any more.
func (b *bench) dropTopics(topics ...string) {
	if len(topics) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	resp, err := kadm.NewClient(b.cl).DeleteTopics(ctx, topics...)
	if err != nil {
		return
	}
	for _, r := range resp {
		if r.Err == nil {
			b.topics = slices.DeleteFunc(b.topics, func(x string) bool { return x == r.Topic })
		}
	}
}

// dropSchema drops a run's schema once it is measured: the repeats'
// rows would otherwise fill the disk.
func (b *bench) dropSchema(s string) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := b.pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{s}.Sanitize()+` CASCADE`); err == nil {
		b.schemas = slices.DeleteFunc(b.schemas, func(x string) bool { return x == s })
	}
}

func (b *bench) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, s := range b.schemas {
		_, _ = b.pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{s}.Sanitize()+` CASCADE`)
	}
	adm := kadm.NewClient(b.cl)
	// A member killed by the partition dimension stays in its group until
	// its session times out, and a group with members cannot be deleted:
	// retry those (bounded by ctx) rather than leave groups behind.
	left := b.groups
	for len(left) > 0 && ctx.Err() == nil {
		res, err := adm.DeleteGroups(ctx, left...)
		if err != nil {
			break
		}
		left = left[:0:0]
		for g, r := range res {
			if errors.Is(r.Err, kerr.NonEmptyGroup) {
				left = append(left, g)
			}
		}
		if len(left) > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(500 * time.Millisecond):
			}
		}
	}
	if len(b.topics) > 0 {
		_, _ = adm.DeleteTopics(ctx, b.topics...)
	}
}

// proc is a measured process: the running binary with args.
type proc struct{ *childproc.Proc }

// startProc starts the running binary with args; its environment is this
// process's with noTracing and env after it (a later entry wins).
func startProc(env []string, args ...string) (*proc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = slices.Concat(os.Environ(), noTracing, env)
	// Its own process group: the terminal's Ctrl-C goes to the bench,
	// which stops it by PID; SIGINT is its graceful stop.
	p, err := childproc.Start(cmd, childproc.Options{Name: args[0], OwnGroup: true, StopSignal: os.Interrupt})
	if err != nil {
		return nil, err
	}
	return &proc{p}, nil
}

// lastOutput is the last line the process wrote to stderr (its error).
func (p *proc) lastOutput() string {
	tail := p.Tail(20)
	for i := len(tail) - 1; i >= 0; i-- {
		if s := strings.TrimSpace(tail[i]); s != "" {
			return s
		}
	}
	return ""
}

// usage is the process's CPU seconds and peak resident memory in MB.
// usageOf sums procs' CPU seconds and returns the highest peak RSS of
// them, in MB.
func usageOf(procs []*proc) (cpuSeconds, peakMB float64) {
	for _, p := range procs {
		c, rss := p.usage()
		cpuSeconds += c
		peakMB = max(peakMB, rss)
	}
	return cpuSeconds, peakMB
}

func (p *proc) usage() (cpuSeconds, peakMB float64) {
	u, _ := p.Usage()
	return u.CPU.Seconds(), float64(u.PeakRSS) / (1 << 20)
}

// stop ends the process, by its PID: SIGINT, then SIGKILL after 10s.
func (p *proc) stop() { _ = p.Stop(10 * time.Second) }

func (b *bench) getenv(k string) string {
	if b.cfg.Getenv == nil {
		return ""
	}
	return b.cfg.Getenv(k)
}
