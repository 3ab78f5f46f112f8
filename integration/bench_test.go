package integration

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
)

// tenure bench, small: every run drains exactly the jobs it was given (a
// duplicate or a lost job shows as a wrong count: tenure's runs must be
// exact, fenced or not, since nothing fails here), every figure is
// measured, and the run leaves no schema, topic or process behind.
func TestBenchSmall(t *testing.T) {
	e := newEnv(t, 1)
	out := filepath.Join(t.TempDir(), "bench.json")
	const jobs, naive, scaling = 3000, 300, 1000
	r := runCLI(t, 5*time.Minute, "", "bench", "--brokers", strings.Join(e.brokers, ","), "--database-url", e.dbURL,
		"--jobs", "3000", "--partitions", "4", "--naive-jobs", "300", "--repeat", "2", "--latency-seconds", "2", "--latency-rate", "2000",
		"--scaling-jobs", "1000", "--dimension-partitions", "3,6", "--json", out)
	if r.code != 0 {
		t.Fatalf("bench failed: %s", r)
	}
	t.Run("Report", func(t *testing.T) {
		for _, want := range []string{"RUN", "tenure-unfenced", "tenure-strict", "tenure-traced", "at-least-once", "copy-ceiling", "end-to-end latency", "scaling",
			"median (min–max) of 2 runs", "by stage", "SLOWEST 1%", "partition dimension", "partition dimension side by side", "RATE RATIO", "CLAIMS/S AT START", "HELD", "HAND-OFF MAX S", "targets", "want >= 1.0", "want <= 50", "where a tenure worker's CPU goes"} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("the report lacks %q:\n%s", want, r.stdout)
			}
		}
		// Every figure of a repeated run is a median with its spread, and every
		// target a verdict of three.
		if !regexp.MustCompile(`\d+ \(\d+–\d+\)`).MatchString(r.stdout) {
			t.Errorf("no \"median (min–max)\" cell in the report:\n%s", r.stdout)
		}
		if !regexp.MustCompile(`want [<>]= [0-9.]+\s+(met|unclear|not met)`).MatchString(r.stdout) {
			t.Errorf("no target verdict (met, unclear, not met) in the report:\n%s", r.stdout)
		}
	})
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var rep benchReport
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatalf("bench JSON: %v\n%s", err, data)
	}
	t.Run("Results", func(t *testing.T) { checkBenchResults(t, rep, jobs, naive) })
	t.Run("LatencyScalingPartitions", func(t *testing.T) { checkBenchDimensions(t, rep, jobs, scaling) })
	t.Run("ProfileAndTargets", func(t *testing.T) {
		// The profiled run wrote a profile next to the JSON; a run this short
		// may be too short to be sampled, which the report then says.
		if p := rep.Profile; p == nil {
			t.Error("no profile in the report")
		} else if _, err := os.Stat(p.File); err != nil || (len(p.Areas) == 0 && p.Note == "") {
			t.Errorf("profile %+v: %v", p, err)
		}
		verdicts := map[string]bool{"met": true, "unclear": true, "not met": true}
		// The throughput rows' and the latency's 8, and the partition
		// dimension's 5 at its largest count.
		if len(rep.Targets) != 13 {
			t.Errorf("%d targets, want 13", len(rep.Targets))
		}
		for _, tg := range rep.Targets {
			if !verdicts[tg.Verdict] {
				t.Errorf("target %q: verdict %q, want met, unclear or not met", tg.Name, tg.Verdict)
			}
		}
	})
	t.Run("NothingLeftBehind", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		var schemas int
		if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname LIKE $1`, "bench_"+rep.ID+"_%").Scan(&schemas); err != nil || schemas != 0 {
			t.Errorf("bench left %d schemas (err %v)", schemas, err)
		}
		// leftBehind reports the names (of kind topic or group) that are
		// the bench's.
		leftBehind := func(kind string, names []string) {
			for _, name := range names {
				if strings.HasPrefix(name, "bench-"+rep.ID) {
					t.Errorf("bench left %s %s", kind, name)
				}
			}
		}
		topics, err := kadm.NewClient(e.cl).ListTopics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		leftBehind("topic", topics.Names())
		groups, err := kadm.NewClient(e.cl).ListGroups(ctx)
		if err != nil {
			t.Fatal(err)
		}
		leftBehind("group", groups.Groups())
	})
}

type benchStat struct {
	Median, Min, Max float64
	N                int
}
type benchReport struct {
	ID      string
	Repeat  int
	Results []struct {
		Name    string
		Skipped string
		Runs    []struct {
			Jobs        int64
			JobsPerSec  float64  `json:"jobs_per_sec"`
			CPUPerMJobs float64  `json:"cpu_seconds_per_million_jobs"`
			PeakRSSMB   float64  `json:"peak_rss_mb"`
			PGCPU       *float64 `json:"postgres_cpu_seconds_per_million_jobs"`
		}
		JobsPerSec benchStat `json:"jobs_per_sec"`
	}
	Latency map[string]benchStat `json:"latency_ms"`
	Scaling []struct {
		Name string
		Jobs int64
	}
	Partitions []struct {
		Partitions     int
		Jobs           int64
		JobsPerSec     float64 `json:"jobs_per_sec"`
		ClaimsPerSec   float64 `json:"claims_per_sec"`
		Held           int     `json:"held_partitions"`
		HandedOff      int     `json:"handed_off_partitions"`
		HandOffSeconds float64 `json:"hand_off_seconds_max"`
	} `json:"partition_dimension"`
	PartitionCounts []struct {
		Partitions  int
		Tenure      struct{ Runs []struct{ Jobs int64 } }
		AtLeastOnce struct {
			Runs []struct {
				Jobs       int64
				JobsPerSec float64 `json:"jobs_per_sec"`
				PeakRSSMB  float64 `json:"peak_rss_mb"`
			}
		} `json:"at_least_once"`
	} `json:"partition_dimension_by_count"`
	DimensionJobs int64 `json:"partition_dimension_jobs"`
	Targets       []struct{ Name, Verdict string }
	Profile       *struct {
		File  string
		Note  string
		Areas []struct {
			Name    string
			Percent float64
		}
	}
}

// checkBenchDimensions: the latency percentiles in order, the scaling
// and partition dimension runs with exactly their jobs (a SIGKILL loses
// none and duplicates none). The partition dimension's backlog is three
// batches of the default --batch-max (1000) for each partition of its
// largest count (6), more than the throughput runs' jobs.
func checkBenchDimensions(t *testing.T, rep benchReport, jobs, scaling int64) {
	t.Helper()
	if want := max(jobs, 3*1000*6); rep.DimensionJobs != want {
		t.Errorf("the partition dimension's backlog: %d jobs, want %d", rep.DimensionJobs, want)
	}
	jobs = rep.DimensionJobs
	if l := rep.Latency; l["jobs"].Min < 1 || l["p50"].Median <= 0 || l["p50"].Median > l["p99"].Median || l["p99"].Median > l["max"].Median || l["p99"].N != 2 {
		t.Errorf("latency percentiles out of order or missing: %v", l)
	}
	if len(rep.Scaling) != 5 {
		t.Errorf("%d scaling runs, want 5", len(rep.Scaling))
	}
	for _, s := range rep.Scaling {
		if s.Jobs != scaling {
			t.Errorf("scaling %q wrote %d rows, want exactly %d", s.Name, s.Jobs, scaling)
		}
	}
	if len(rep.Partitions) != 2 {
		t.Errorf("%d partition dimension runs, want 2 (3 and 6 partitions)", len(rep.Partitions))
	}
	// Beside tenure at each count, the at-least-once program, measured up
	// to a third of the backlog (at least that, at most all of it).
	if len(rep.PartitionCounts) != 2 {
		t.Errorf("%d partition counts side by side, want 2", len(rep.PartitionCounts))
	}
	for _, c := range rep.PartitionCounts {
		if len(c.Tenure.Runs) != 1 || len(c.AtLeastOnce.Runs) != 1 {
			t.Errorf("partition count %d: %d tenure runs, %d at-least-once runs, want 1 of each", c.Partitions, len(c.Tenure.Runs), len(c.AtLeastOnce.Runs))
			continue
		}
		if a := c.AtLeastOnce.Runs[0]; a.Jobs < jobs/3 || a.Jobs > jobs || a.JobsPerSec <= 0 || a.PeakRSSMB <= 0 {
			t.Errorf("partition count %d: the at-least-once run %+v", c.Partitions, a)
		}
		if n := c.Tenure.Runs[0].Jobs; n < jobs/3 || n > jobs {
			t.Errorf("partition count %d: tenure measured over %d jobs up to the kill, want from a third of %d to all", c.Partitions, n, jobs)
		}
	}
	for _, p := range rep.Partitions {
		// SIGKILL loses no job and duplicates none: exactly every job.
		if p.Jobs != jobs || p.JobsPerSec <= 0 || p.ClaimsPerSec <= 0 {
			t.Errorf("partition dimension %d: %+v", p.Partitions, p)
		}
		// The group settles before the backlog is produced, and the worker
		// killed is the one holding the most partitions: it held some.
		if p.Held < 1 || p.HandedOff > p.Held || (p.HandedOff > 0) != (p.HandOffSeconds > 0) {
			t.Errorf("partition dimension %d: the killed worker held %d partitions, %d handed off in %.1f s", p.Partitions, p.Held, p.HandedOff, p.HandOffSeconds)
		}
	}
}

// checkBenchResults: every run of the report wrote exactly its jobs and
// measured its figures, twice (only strict may be skipped, for the
// server's reason).
func checkBenchResults(t *testing.T, rep benchReport, jobs, naive int64) {
	t.Helper()
	local := os.Getenv("TENURE_TEST_DATABASE_URL") == ""
	want := map[string]int64{"tenure": jobs, "tenure-unfenced": jobs, "tenure-strict": jobs, "tenure-traced": jobs, "at-least-once": jobs, "at-least-once-fetch": jobs, "naive": naive, "copy-ceiling": jobs, "copy-plain": jobs}
	if len(rep.Results) != len(want) || rep.Repeat != 2 {
		t.Fatalf("%d results (repeat %d), want %d (repeat 2): %+v", len(rep.Results), rep.Repeat, len(want), rep)
	}
	var pgCPU float64 // the server's CPU over every run
	for _, res := range rep.Results {
		n, ok := want[res.Name]
		if !ok {
			t.Errorf("unexpected run %q", res.Name)
			continue
		}
		if res.Skipped != "" {
			// Only strict may be skipped: when the server has no prepared
			// transactions, the bench starts a throwaway cluster with
			// them, unless this machine has no server binaries for it.
			if res.Name != "tenure-strict" || !strings.Contains(res.Skipped, "no PostgreSQL server binaries") {
				t.Errorf("%s skipped: %s", res.Name, res.Skipped)
			}
			continue
		}
		if len(res.Runs) != 2 || res.JobsPerSec.N != 2 || res.JobsPerSec.Min > res.JobsPerSec.Median || res.JobsPerSec.Median > res.JobsPerSec.Max {
			t.Errorf("%s: %d runs, rate %+v: want 2 runs and min <= median <= max", res.Name, len(res.Runs), res.JobsPerSec)
		}
		for _, run := range res.Runs {
			if run.Jobs != n {
				t.Errorf("%s wrote %d rows, want exactly %d", res.Name, run.Jobs, n)
			}
			if run.JobsPerSec <= 0 || run.CPUPerMJobs <= 0 || run.PeakRSSMB <= 0 {
				t.Errorf("%s: a figure was not measured: %+v", res.Name, run)
			}
			// The server's CPU is read from /proc when it runs here, as the
			// test database does unless TENURE_TEST_DATABASE_URL says otherwise.
			// In clock ticks (10 ms): a run this small may take none, so
			// only the sum over the runs must be above 0.
			if local && run.PGCPU == nil {
				t.Errorf("%s: the local PostgreSQL server's CPU time was not measured", res.Name)
			}
			if run.PGCPU != nil {
				pgCPU += *run.PGCPU
			}
		}
	}
	if local && pgCPU <= 0 {
		t.Errorf("the local PostgreSQL server's CPU time was measured as 0 over every run")
	}
}

// --latency-only runs the latency rounds alone, each variant of
// --latency-variants beside the default in every round, and breaks each
// run's latency down by stage from the worker's stage log.
func TestBenchLatencyOnly(t *testing.T) {
	e := newEnv(t, 1)
	out := filepath.Join(t.TempDir(), "bench.json")
	r := runCLI(t, 5*time.Minute, "", "bench", "--brokers", strings.Join(e.brokers, ","), "--database-url", e.dbURL,
		"--partitions", "4", "--repeat", "2", "--latency-seconds", "2", "--latency-rate", "2000", "--latency-only", "--skip-scaling",
		"--partitions-dimension=false", "--latency-variants", "small=--batch-max 10;gc=GOGC=200", "--json", out)
	if r.code != 0 {
		t.Fatalf("bench failed: %s", r)
	}
	for _, want := range []string{"end-to-end latency", "by stage", "queue", "handler", "commit", "beside it, in turns in each round: small", "beside it, in turns in each round: gc",
		"SLOWEST 1% (MEAN)", "latency runs only"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("the report lacks %q:\n%s", want, r.stdout)
		}
	}
	if strings.Contains(r.stdout, "at-least-once") || strings.Contains(r.stdout, "scaling (") {
		t.Errorf("--latency-only ran more than the latency runs:\n%s", r.stdout)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	type stat struct {
		Median float64
		N      int
	}
	var rep struct {
		Latency  map[string]stat `json:"latency_ms"`
		Variants []struct {
			Name, Env   string
			WorkerFlags string          `json:"worker_flags"`
			Latency     map[string]stat `json:"latency_ms"`
			Runs        []map[string]float64
		} `json:"latency_variants"`
	}
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatalf("bench JSON: %v\n%s", err, data)
	}
	if len(rep.Variants) != 2 || rep.Variants[0].WorkerFlags != "--batch-max 10" || rep.Variants[1].Env != "GOGC=200" {
		t.Fatalf("variants %+v", rep.Variants)
	}
	for name, l := range map[string]map[string]stat{"default": rep.Latency, "small": rep.Variants[0].Latency, "gc": rep.Variants[1].Latency} {
		if l["p99"].N != 2 || l["stage_jobs"].Median < l["jobs"].Median*0.99 {
			t.Errorf("%s: %d runs, %v of %v jobs broken down by stage; want 2 runs, every job", name, l["p99"].N, l["stage_jobs"].Median, l["jobs"].Median)
		}
		// The stages add up to the worker's COMMIT returning, which the
		// fence log's time precedes (the fence statement travels with it).
		var sum float64
		for _, st := range []string{"produce", "fetch", "queue", "handler", "commit"} {
			sum += l["tail_"+st].Median
		}
		if sum <= 0 || l["fencelog_vs_commit_p50"].Median > 0 {
			t.Errorf("%s: stages of the slowest jobs add up to %v ms; fence log minus commit %v ms", name, sum, l["fencelog_vs_commit_p50"].Median)
		}
	}
	if b := rep.Variants[0].Latency["batch_jobs_mean"].Median; b <= 0 || b > 10 {
		t.Errorf("--batch-max 10 variant: batches of %v jobs on average", b)
	}
}
