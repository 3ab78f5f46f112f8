package integration

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// httpAddr is the address a worker started with --http-addr (or
// --metrics-addr) serves on, from its log.
func (w *worker) httpAddr() string {
	w.t.Helper()
	return w.waitLog(30*time.Second, map[string]any{"msg": "http listening"})["addr"].(string)
}

// get fetches a path of the worker's HTTP endpoint: status and body (0 if
// it did not answer).
func (w *worker) get(path string) (int, string) {
	addr := w.httpAddr()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// metricValue reads one series from a /metrics body: name with its labels
// as Prometheus prints them (`tenure_claims_total{partition="0",topic="t"}`);
// -1 if it is not there.
func metricValue(body, series string) float64 {
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			if f, err := strconv.ParseFloat(v, 64); err == nil {
				return f
			}
		}
	}
	return -1
}

// A worker started with --http-addr serves Prometheus metrics from the
// client library: per-partition counters, histograms, the lag, the Stats
// counters and kgo's client metrics; after it has committed every job,
// they say so.
func TestWorkerMetrics(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	e.produce(jobsFor(keys, 0, 40)...)
	w := e.startWorker("M", "--http-addr", "127.0.0.1:0")
	scrape := func() string { _, body := w.get("/metrics"); return body }
	series := func(name, p string) string {
		return name + `{partition="` + p + `",topic="` + e.topic + `"}`
	}
	waitFor(t, 60*time.Second, "40 committed records and no lag in /metrics", func() bool {
		b := scrape()
		return metricValue(b, series("tenure_records_committed_total", "0"))+metricValue(b, series("tenure_records_committed_total", "1")) == 40 &&
			metricValue(b, series("tenure_partition_lag", "0")) == 0 && metricValue(b, series("tenure_partition_lag", "1")) == 0
	})
	body := scrape()
	for _, c := range []struct {
		series string
		want   float64
	}{
		{series("tenure_claims_total", "0"), 1},
		{series("tenure_claims_total", "1"), 1},
		{series("tenure_batches_fenced_total", "0"), 0},
		{series("tenure_claims_fenced_total", "1"), 0},
		{"tenure_lanes", 2},
		{"tenure_lanes_halted", 0},
		{"tenure_dead_letters_total", 0},
		{"tenure_handler_bugs_total", 0},
		{"tenure_incarnation_bumps_total", 0},
		{"tenure_end_to_end_latency_seconds_count", 40},
		{"tenure_handler_oldest_running_seconds", 0},
	} {
		if got := metricValue(body, c.series); got != c.want {
			t.Errorf("%s = %v, want %v", c.series, got, c.want)
		}
	}
	for _, want := range []string{"# TYPE tenure_lanes gauge", "# TYPE tenure_handler_duration_seconds histogram",
		`tenure_commit_duration_seconds_count{outcome="committed"}`, "# TYPE tenure_partition_lag gauge",
		`tenure_kafka_connects_total{node_id="0"}`, "go_goroutines", "process_resident_memory_bytes",
		"# TYPE tenure_kafka_buffered_fetch_records gauge", "# TYPE tenure_kafka_buffered_produce_records gauge",
		"# TYPE tenure_kafka_buffered_fetch_bytes gauge", `tenure_build_info{go_version="go`} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, body)
		}
	}
	// A gauge is not named like a counter.
	for _, l := range strings.Split(body, "\n") {
		if f := strings.Fields(l); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" && f[3] == "gauge" && strings.HasSuffix(f[2], "_total") {
			t.Errorf("gauge %s ends in _total", f[2])
		}
	}
	if !regexp.MustCompile(`(?m)^tenure_build_info\{go_version="go[^"]+",revision="[^"]+",version="[^"]+"\} 1$`).MatchString(body) {
		t.Errorf("/metrics has no tenure_build_info 1 with its three labels:\n%s", body)
	}
	if code, out := w.get("/healthz"); code != http.StatusOK || out != "ok\n" {
		t.Errorf("/healthz: %d %q", code, out)
	}
	if code, out := w.get("/readyz"); code != http.StatusOK || out != "ready\n" {
		t.Errorf("/readyz: %d %q", code, out)
	}
	w.stop(30 * time.Second)
}

// --metrics-addr still works, as a deprecated name of --http-addr, and
// says so.
func TestMetricsAddrIsDeprecated(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	w := e.startWorker("D", "--metrics-addr", "127.0.0.1:0")
	w.waitLog(30*time.Second, map[string]any{"level": "warn",
		"msg": "--metrics-addr (TENURE_METRICS_ADDR) is deprecated: use --http-addr (TENURE_HTTP_ADDR), which serves /readyz too"})
	if code, _ := w.get("/metrics"); code != http.StatusOK {
		t.Errorf("/metrics: %d", code)
	}
	w.stop(30 * time.Second)
}

// scrapeMetric reads one unlabelled value from a worker's /metrics
// (started with --http-addr); -1 if it is not there.
func scrapeMetric(t *testing.T, w *worker, name string) int64 {
	t.Helper()
	code, body := w.get("/metrics")
	if code != http.StatusOK {
		t.Fatalf("scraping %s: %d %s", w.name, code, body)
	}
	return int64(metricValue(body, name))
}
