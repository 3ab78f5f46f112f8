// Package bench is `tenure bench` (Run) and the programs it compares tenure
// with (Child, run as `tenure bench-child KIND`). The CLI (internal/cli)
// parses their flags and opens their connections.
package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/internal/devbroker"
	"github.com/tenure-dev/tenure/sink"
)

type Result struct {
	Name        string  `json:"name"`
	What        string  `json:"what"`
	Jobs        int64   `json:"jobs"`
	JobsPerSec  float64 `json:"jobs_per_sec"`
	WallSeconds float64 `json:"wall_seconds"`
	CPUPerMJobs float64 `json:"cpu_seconds_per_million_jobs"`
	// The PostgreSQL server's CPU time over the run, when it runs on this
	// machine (omitted otherwise). Other use of the server counts too.
	DBCPUPerMJobs *float64 `json:"postgres_cpu_seconds_per_million_jobs,omitempty"`
	PeakRSSMB     float64  `json:"peak_rss_mb"`
	Note          string   `json:"note,omitempty"`
}

type Report struct {
	ID       string             `json:"id"` // in the names of the run's topics, schemas and groups
	Machine  map[string]string  `json:"machine"`
	Settings map[string]any     `json:"settings"`
	Results  []Result           `json:"results"`
	Latency  map[string]float64 `json:"latency_ms,omitempty"`
	// LatencyRate says how the latency's rate was chosen.
	LatencyRate string    `json:"latency_rate"`
	Scaling     []Result  `json:"scaling,omitempty"`
	Targets     []Target  `json:"targets"`
	StartedAt   time.Time `json:"started_at"`
}

type Target struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
	Want  string  `json:"want"`
	Met   bool    `json:"met"`
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
	// Jobs are pre-produced for each throughput run, over Partitions
	// partitions, values of ValueBytes bytes, Keys distinct keys spread
	// evenly; the naive program runs NaiveJobs of them.
	Jobs, Partitions, ValueBytes, Keys, NaiveJobs int
	// Latency: jobs produced for LatencySeconds at LatencyRate jobs/s (0:
	// half of tenure's measured rate).
	LatencySeconds, LatencyRate int
	// ScalingJobs are the jobs of each scaling run, unless SkipScaling.
	ScalingJobs int
	SkipScaling bool
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
	postmaster  int // the local PostgreSQL server's pid; 0 not looked for yet, -1 not here
}

// Run measures, in one run on the same broker, database and jobs, tenure
// beside what a user would write instead, so that the figures compare side
// by side on whatever machine it runs on (ratios, not absolute numbers,
// are the point on a shared machine). See README, "Throughput". The
// programs it compares run as processes of their own (their CPU time and
// peak memory are measured): `tenure worker` and `tenure bench-child` of
// the running binary.
func Run(ctx context.Context, cfg Config) error {
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

	rep := &Report{ID: b.id, Machine: machineInfo(ctx, b.pool), StartedAt: time.Now().UTC(),
		Settings: map[string]any{"worker_flags": strings.Join(cfg.WorkerFlags, " "), "jobs": b.jobs, "partitions": b.partitions, "value_bytes": b.valueBytes, "keys": b.keys, "naive_jobs": cfg.NaiveJobs}}
	if err := b.throughput(ctx, rep); err != nil {
		return err
	}
	rate := rep.Results[0].JobsPerSec / 2
	rep.LatencyRate = "half of tenure's rate"
	if cfg.LatencyRate > 0 {
		rate = float64(cfg.LatencyRate)
		rep.LatencyRate = "--latency-rate"
	}
	b.say("measuring end-to-end latency at %.0f jobs/s for %ds", rate, cfg.LatencySeconds)
	if rep.Latency, err = b.latency(ctx, rate, time.Duration(cfg.LatencySeconds)*time.Second); err != nil {
		return fmt.Errorf("latency: %w", err)
	}
	if !cfg.SkipScaling {
		if rep.Scaling, err = b.scaling(ctx); err != nil {
			return err
		}
	}
	rep.Targets = targets(rep)
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
	return nil
}

// throughput runs each program on the same backlog.
func (b *bench) throughput(ctx context.Context, rep *Report) error {
	topic, err := b.topicWithJobs(ctx, "main", b.partitions, b.jobs)
	if err != nil {
		return err
	}
	naive := min(b.cfg.NaiveJobs, b.jobs)
	steps := []struct {
		name, what string
		fn         func() (Result, error)
	}{
		{"tenure", "tenure worker, ledger handler, fenced, default settings", func() (Result, error) {
			return b.runWorkers(ctx, "tenure", topic, b.jobs, 1, nil)
		}},
		{"tenure-unfenced", "the same without the fence statement (--unsafe-no-fence)", func() (Result, error) {
			return b.runWorkers(ctx, "unfenced", topic, b.jobs, 1, []string{"--unsafe-no-fence"})
		}},
		{"at-least-once", fmt.Sprintf("franz-go + pgx: tenure's batches (at most %d jobs) by COPY, Kafka offsets committed after them, no fencing", b.batchMax()), func() (Result, error) {
			return b.runChild(ctx, "alo", topic, b.jobs, "alo", "--batch-max", strconv.Itoa(b.batchMax()))
		}},
		{"at-least-once-fetch", "the same, each partition's part of a poll in one COPY (kgo's default fetch sizes: memory not bounded)", func() (Result, error) {
			return b.runChild(ctx, "alofetch", topic, b.jobs, "alo")
		}},
		{"naive", fmt.Sprintf("one autocommitted INSERT per job, in order (measured on %d jobs)", naive), func() (Result, error) {
			return b.runChild(ctx, "naive", topic, naive, "naive")
		}},
		{"copy-ceiling", "the same rows by parallel COPY into the same table, no Kafka", func() (Result, error) {
			return b.runCopy(ctx, "ledger")
		}},
		{"copy-plain", "the same rows by parallel COPY into a plain table of the same columns", func() (Result, error) {
			return b.runCopy(ctx, "plain")
		}},
	}
	for _, s := range steps {
		b.say("running %s", s.name)
		r, err := s.fn()
		if err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		r.Name, r.What = s.name, s.what
		rep.Results = append(rep.Results, r)
		b.say("%s: %.0f jobs/s", s.name, r.JobsPerSec)
	}
	return nil
}

// scaling runs tenure with 1, 2 and 3 workers and 1, 12 and 48 partitions.
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
		r, err := b.runWorkers(ctx, fmt.Sprintf("scale%dw%dp", s.workers, s.parts), t, b.cfg.ScalingJobs, s.workers, nil)
		if err != nil {
			return nil, fmt.Errorf("scaling %s: %w", s.name, err)
		}
		r.Name = s.name
		out = append(out, r)
	}
	return out, nil
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
	topic := "bench-" + b.id + "-" + name
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := kadm.NewClient(b.cl).CreateTopic(cctx, int32(partitions), 1, nil, topic); err != nil {
		return "", fmt.Errorf("creating topic %s: %w", topic, err)
	}
	b.topics = append(b.topics, topic)
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
		return "", fmt.Errorf("producing to %s: %w", topic, *err)
	}
	b.say("produced %d jobs to %s in %s", n, topic, time.Since(start).Round(time.Millisecond))
	return topic, nil
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
func (b *bench) runWorkers(ctx context.Context, name, topic string, jobs, workers int, extra []string) (Result, error) {
	s, err := b.schema(ctx, name)
	if err != nil {
		return Result{}, err
	}
	group := b.group(name)
	var procs []*proc
	start, db0 := time.Now(), b.postgresCPU(ctx)
	for i := range workers {
		args := append([]string{"worker", "--brokers", strings.Join(b.brokers, ","), "--group", group, "--topic", topic,
			"--database-url", b.dbURL, "--schema", s, "--handler", "ledger", "--no-migrate", "--log-level", "error",
			"--name", fmt.Sprintf("bench-%d", i)}, slices.Concat(b.kafkaArgs, b.workerFlags, extra)...)
		p, err := startProc(args...)
		if err != nil {
			return Result{}, err
		}
		procs = append(procs, p)
	}
	defer func() {
		for _, p := range procs {
			p.stop()
		}
	}()
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
	start, db0 := time.Now(), b.postgresCPU(ctx)
	p, err := startProc(append([]string{"bench-child", kind, "--brokers", strings.Join(b.brokers, ","), "--group", b.group(name),
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

func (b *bench) runCopy(ctx context.Context, table string) (Result, error) {
	s, err := b.schema(ctx, "copy"+table)
	if err != nil {
		return Result{}, err
	}
	start, db0 := time.Now(), b.postgresCPU(ctx)
	p, err := startProc("bench-child", "copy", "--database-url", b.dbURL, "--schema", s, "--table", table,
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

// waitRows waits until table holds want rows, saying how far it is.
func (b *bench) waitRows(ctx context.Context, schema, table string, want int64, procs []*proc) error {
	q := pgx.Identifier{schema, table}.Sanitize()
	last := time.Now()
	for {
		for _, p := range procs {
			if p.exited() && want > 0 {
				var n int64
				_ = b.pool.QueryRow(ctx, `SELECT count(*) FROM `+q).Scan(&n)
				if n >= want {
					return nil
				}
				return fmt.Errorf("the measured process exited after %d of %d jobs: %s", n, want, p.lastOutput())
			}
		}
		var n int64
		// The table's size from the statistics: cheap, a second late at
		// most; the exact count is read once it says done.
		if err := b.pool.QueryRow(ctx, `SELECT coalesce(n_tup_ins, 0) FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = $2`, schema, table).Scan(&n); err != nil && !errors.Is(err, pgx.ErrNoRows) {
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
	var cpu float64
	for _, p := range procs {
		c, rss := p.usage()
		cpu += c
		r.PeakRSSMB = max(r.PeakRSSMB, rss)
	}
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
func (b *bench) latency(ctx context.Context, rate float64, d time.Duration) (map[string]float64, error) {
	if rate < 1 {
		rate = 1
	}
	topic := "bench-" + b.id + "-latency"
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := kadm.NewClient(b.cl).CreateTopic(cctx, int32(b.partitions), 1, nil, topic); err != nil {
		return nil, err
	}
	b.topics = append(b.topics, topic)
	s, err := b.schema(ctx, "latency")
	if err != nil {
		return nil, err
	}
	p, err := startProc(append([]string{"worker", "--brokers", strings.Join(b.brokers, ","), "--group", b.group("latency"), "--topic", topic,
		"--database-url", b.dbURL, "--schema", s, "--handler", "ledger", "--no-migrate", "--log-level", "error", "--name", "bench-latency",
		"--fence-log-max-age", "0", "--fence-log-max-entries", "0"}, slices.Concat(b.kafkaArgs, b.workerFlags)...)...) // the latencies are read from the fence log
	if err != nil {
		return nil, err
	}
	defer p.stop()
	time.Sleep(3 * time.Second) // joined and claimed
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
	end := time.Now().Add(d)
	next := time.Now()
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
	wg.Wait()
	if err := b.waitRows(ctx, s, "ledger", int64(total), []*proc{p}); err != nil {
		return nil, err
	}
	// The fence log's commit entry is written by the fence statement,
	// which travels with COMMIT: its time (clock_timestamp) is the commit's,
	// to within the COMMIT's own flush.
	rows, err := b.pool.Query(ctx, `SELECT partition, from_offset, to_offset, at FROM `+pgx.Identifier{s, "fence_log"}.Sanitize()+
		` WHERE kind = 'commit' AND topic = $1 ORDER BY partition, from_offset`, topic)
	if err != nil {
		return nil, err
	}
	type commit struct {
		from, to int64
		at       time.Time
	}
	commits := map[int32][]commit{}
	var pp int32
	var c commit
	if _, err := pgx.ForEachRow(rows, []any{&pp, &c.from, &c.to, &c.at}, func() error {
		commits[pp] = append(commits[pp], c)
		return nil
	}); err != nil {
		return nil, err
	}
	var lat, acks []float64
	for part, jobs := range sent {
		cs := commits[part]
		for _, j := range jobs {
			k := sort.Search(len(cs), func(k int) bool { return cs[k].to > j.off })
			if k == len(cs) || cs[k].from > j.off {
				return nil, fmt.Errorf("no commit in the fence log covers job %d of partition %d", j.off, part)
			}
			lat = append(lat, float64(cs[k].at.Sub(j.at).Microseconds())/1000)
			acks = append(acks, float64(j.ack.Sub(j.at).Microseconds())/1000)
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
	return map[string]float64{"rate_jobs_per_sec": rate, "jobs": float64(len(lat)), "p50": pct(0.50), "p99": pct(0.99), "max": lat[len(lat)-1],
		"produce_ack_p50": ackPct(0.50), "produce_ack_p99": ackPct(0.99)}, nil
}

func targets(rep *Report) []Target {
	by := map[string]Result{}
	for _, r := range rep.Results {
		by[r.Name] = r
	}
	ratio := func(a, b string) float64 {
		if by[b].JobsPerSec == 0 {
			return 0
		}
		return by[a].JobsPerSec / by[b].JobsPerSec
	}
	t := []Target{
		{Name: "fenced / unfenced", Value: ratio("tenure", "tenure-unfenced"), Want: ">= 0.95"},
		{Name: "tenure / at-least-once", Value: ratio("tenure", "at-least-once"), Want: ">= 1.0"},
		{Name: "tenure / naive", Value: ratio("tenure", "naive"), Want: ">= 100"},
		{Name: "tenure / COPY ceiling (same table)", Value: ratio("tenure", "copy-ceiling"), Want: ">= 0.75"},
		{Name: "tenure peak RSS (MB)", Value: by["tenure"].PeakRSSMB, Want: "<= 150"},
	}
	if p99, ok := rep.Latency["p99"]; ok && rep.LatencyRate == "half of tenure's rate" {
		t = append(t, Target{Name: "p99 end-to-end latency at half load (ms)", Value: p99, Want: "<= 50"})
	}
	for i := range t {
		want, _ := strconv.ParseFloat(strings.TrimSpace(t[i].Want[2:]), 64)
		if strings.HasPrefix(t[i].Want, ">=") {
			t[i].Met = t[i].Value >= want
		} else {
			t[i].Met = t[i].Value <= want
		}
	}
	return t
}

// Print writes the report as tables.
func Print(w io.Writer, rep *Report) {
	fmt.Fprintf(w, "tenure bench: %v jobs of %v bytes over %v partitions, %v keys; %s, %s cores, %s\n\n",
		rep.Settings["jobs"], rep.Settings["value_bytes"], rep.Settings["partitions"], rep.Settings["keys"],
		rep.Machine["cpu"], rep.Machine["cores"], rep.Machine["postgres"])
	if f, _ := rep.Settings["worker_flags"].(string); f != "" {
		fmt.Fprintf(w, "tenure workers run with %s\n", f)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tJOBS/S\tWALL S\tCPU S/1M JOBS\tPOSTGRES CPU S/1M\tPEAK RSS MB\tWHAT")
	for _, r := range rep.Results {
		fmt.Fprintf(tw, "%s\t%.0f\t%.1f\t%.1f\t%s\t%.0f\t%s\n", r.Name, r.JobsPerSec, r.WallSeconds, r.CPUPerMJobs, dbCPUString(r), r.PeakRSSMB, r.What)
	}
	_ = tw.Flush()
	if l := rep.Latency; l != nil {
		fmt.Fprintf(w, "\nend-to-end latency (produce called to the batch's commit) at %.0f jobs/s (%s), %.0f jobs: p50 %.1f ms, p99 %.1f ms, max %.1f ms;\n"+
			"  of which producing (produce called to the broker's acknowledgement): p50 %.1f ms, p99 %.1f ms\n",
			l["rate_jobs_per_sec"], rep.LatencyRate, l["jobs"], l["p50"], l["p99"], l["max"], l["produce_ack_p50"], l["produce_ack_p99"])
	}
	if len(rep.Scaling) > 0 {
		fmt.Fprintln(w, "\nscaling (tenure, ledger):")
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  RUN\tJOBS/S\tWALL S\tCPU S/1M JOBS\tPOSTGRES CPU S/1M\tPEAK RSS MB (per worker)")
		for _, r := range rep.Scaling {
			fmt.Fprintf(tw, "  %s\t%.0f\t%.1f\t%.1f\t%s\t%.0f\n", r.Name, r.JobsPerSec, r.WallSeconds, r.CPUPerMJobs, dbCPUString(r), r.PeakRSSMB)
		}
		_ = tw.Flush()
	}
	fmt.Fprintln(w, "\ntargets:")
	for _, t := range rep.Targets {
		mark := "met"
		if !t.Met {
			mark = "NOT met"
		}
		fmt.Fprintf(w, "  %-42s %8.2f  (want %s) %s\n", t.Name, t.Value, t.Want, mark)
	}
}

// dbCPUString is the POSTGRES CPU column: "-" when the server is not on
// this machine.
func dbCPUString(r Result) string {
	if r.DBCPUPerMJobs == nil {
		return "-"
	}
	return strconv.FormatFloat(*r.DBCPUPerMJobs, 'f', 1, 64)
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

func (b *bench) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, s := range b.schemas {
		_, _ = b.pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{s}.Sanitize()+` CASCADE`)
	}
	adm := kadm.NewClient(b.cl)
	if len(b.groups) > 0 {
		_, _ = adm.DeleteGroups(ctx, b.groups...)
	}
	if len(b.topics) > 0 {
		_, _ = adm.DeleteTopics(ctx, b.topics...)
	}
}

// proc is a measured process: the running binary with args.
type proc struct {
	cmd  *exec.Cmd
	out  *strings.Builder
	mu   sync.Mutex
	done chan struct{}
	cpu  float64 // seconds, read before it is stopped
	rss  float64 // MB, VmHWM
}

func startProc(args ...string) (*proc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	p := &proc{cmd: exec.Command(exe, args...), out: &strings.Builder{}, done: make(chan struct{})}
	p.cmd.Stderr = lockedWriter{p}
	p.cmd.Stdout = io.Discard
	p.cmd.SysProcAttr = sysProcAttr()
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	return p, nil
}

type lockedWriter struct{ p *proc }

func (w lockedWriter) Write(b []byte) (int, error) {
	w.p.mu.Lock()
	defer w.p.mu.Unlock()
	if w.p.out.Len() < 1<<20 {
		w.p.out.Write(b)
	}
	return len(b), nil
}

func (p *proc) lastOutput() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := strings.TrimSpace(p.out.String())
	if i := strings.LastIndex(s, "\n"); i >= 0 {
		s = s[i+1:]
	}
	return s
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// usage reads the process's CPU time (user + system) and peak resident
// memory from /proc while it runs.
func (p *proc) usage() (cpuSeconds, peakMB float64) {
	if p.exited() {
		// It ended by itself (the programs that stop at their count):
		// what wait(2) reported for it.
		if ru, ok := p.cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
			cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
			return cpu.Seconds(), float64(ru.Maxrss) / 1024
		}
		return 0, 0
	}
	pid := p.cmd.Process.Pid
	if st, err := readStat(pid); err == nil {
		cpuSeconds = (st.utime + st.stime) / 100 // USER_HZ
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
				kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
				peakMB = kb / 1024
			}
		}
	}
	return cpuSeconds, peakMB
}

// stop ends the process we started, by its PID: SIGTERM, then SIGKILL.
func (p *proc) stop() {
	if p.exited() {
		return
	}
	_ = p.cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func (b *bench) getenv(k string) string {
	if b.cfg.Getenv == nil {
		return ""
	}
	return b.cfg.Getenv(k)
}
