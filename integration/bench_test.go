package integration

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
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
	r := runCLI(t, 4*time.Minute, "", "bench", "--brokers", strings.Join(e.brokers, ","), "--database-url", e.dbURL,
		"--jobs", "3000", "--partitions", "4", "--naive-jobs", "300", "--latency-seconds", "2",
		"--scaling-jobs", "1000", "--json", out)
	if r.code != 0 {
		t.Fatalf("bench failed: %s", r)
	}
	local := os.Getenv("TENURE_TEST_DATABASE_URL") == ""
	for _, want := range []string{"RUN", "tenure-unfenced", "at-least-once", "copy-ceiling", "end-to-end latency", "scaling", "targets:"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("the table lacks %q:\n%s", want, r.stdout)
		}
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		ID      string
		Results []struct {
			Name        string
			Jobs        int64
			JobsPerSec  float64  `json:"jobs_per_sec"`
			CPUPerMJobs float64  `json:"cpu_seconds_per_million_jobs"`
			PeakRSSMB   float64  `json:"peak_rss_mb"`
			PGCPU       *float64 `json:"postgres_cpu_seconds_per_million_jobs"`
		}
		Latency map[string]float64 `json:"latency_ms"`
		Scaling []struct {
			Name string
			Jobs int64
		}
		Targets []struct{ Name string }
	}
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatalf("bench JSON: %v\n%s", err, data)
	}
	want := map[string]int64{"tenure": jobs, "tenure-unfenced": jobs, "at-least-once": jobs, "at-least-once-fetch": jobs, "naive": naive, "copy-ceiling": jobs, "copy-plain": jobs}
	if len(rep.Results) != len(want) {
		t.Fatalf("%d results, want %d: %s", len(rep.Results), len(want), data)
	}
	for _, res := range rep.Results {
		n, ok := want[res.Name]
		switch {
		case !ok:
			t.Errorf("unexpected run %q", res.Name)
		case res.Jobs != n:
			t.Errorf("%s wrote %d rows, want exactly %d", res.Name, res.Jobs, n)
		}
		if res.JobsPerSec <= 0 || res.CPUPerMJobs <= 0 || res.PeakRSSMB <= 0 {
			t.Errorf("%s: a figure was not measured: %+v", res.Name, res)
		}
		// The server's CPU is read from /proc when it runs here, as the
		// test database does unless TENURE_TEST_DATABASE_URL says otherwise.
		if local && (res.PGCPU == nil || *res.PGCPU <= 0) {
			t.Errorf("%s: the local PostgreSQL server's CPU time was not measured", res.Name)
		}
	}
	if l := rep.Latency; l["jobs"] < 1 || l["p50"] <= 0 || l["p50"] > l["p99"] || l["p99"] > l["max"] {
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
	if len(rep.Targets) != 6 {
		t.Errorf("%d targets, want 6", len(rep.Targets))
	}

	// Nothing left behind.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var schemas int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname LIKE $1`, "bench_"+rep.ID+"_%").Scan(&schemas); err != nil || schemas != 0 {
		t.Errorf("bench left %d schemas (err %v)", schemas, err)
	}
	topics, err := kadm.NewClient(e.cl).ListTopics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range topics.Names() {
		if strings.HasPrefix(name, "bench-"+rep.ID) {
			t.Errorf("bench left topic %s", name)
		}
	}
	groups, err := kadm.NewClient(e.cl).ListGroups(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range groups.Groups() {
		if strings.HasPrefix(g, "bench-"+rep.ID) {
			t.Errorf("bench left group %s", g)
		}
	}
}
