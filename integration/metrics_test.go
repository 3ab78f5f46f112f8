package integration

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A worker started with --metrics-addr serves its counters; after it has
// committed every job, the committed-records counter says so.
func TestWorkerMetrics(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	e.produce(jobsFor(keys, 0, 40)...)
	w := e.startWorker("M", "--metrics-addr", "127.0.0.1:0")
	addr := w.waitLog(30*time.Second, map[string]any{"msg": "metrics listening"})["addr"].(string)
	scrape := func() string {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	waitFor(t, 60*time.Second, "40 committed records in /metrics", func() bool {
		return strings.Contains(scrape(), "\ntenure_records_committed_total 40\n")
	})
	body := scrape()
	for _, want := range []string{"tenure_claims_total 2", "tenure_lanes 2", "tenure_batches_fenced_total 0", "# TYPE tenure_lanes gauge",
		"tenure_handler_transient_total 0", "tenure_handler_environment_errors_total 0",
		"tenure_handler_bugs_total 0", "# TYPE tenure_lanes_halted gauge", "tenure_fence_log_pruned_total 0"} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, body)
		}
	}
	w.stop(30 * time.Second)
}

// scrapeMetric reads one value from a worker's /metrics (started with
// --metrics-addr); -1 if it is not there.
func scrapeMetric(t *testing.T, w *worker, name string) int64 {
	t.Helper()
	addr := w.waitLog(30*time.Second, map[string]any{"msg": "metrics listening"})["addr"].(string)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("scraping %s: %v", addr, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err == nil {
				return n
			}
		}
	}
	return -1
}
