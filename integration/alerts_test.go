package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/tenure-dev/tenure/internal/testinfra/freeport"
)

// rulesPath is the alerting rules shipped for Prometheus.
const rulesPath = "../deploy/prometheus/tenure-rules.yaml"

// heldFor replaces TenurePartitionHeld's `for:` (2m in the rules file) in
// the copy the test's Prometheus loads, so that the test does not wait two
// minutes; everything else is the file as shipped.
const heldFor = "3s"

// A real Prometheus (Debian's prometheus package) scrapes a real worker
// every second and evaluates the shipped rules: while the worker runs
// normally TenurePartitionHeld does not fire; once the partition is held
// (its topic deleted and re-created under the worker) the alert fires for
// that worker, and the command its description names, `tenure admin holds
// acknowledge`, clears it. Without /usr/bin/prometheus the test fails: it
// does not skip.
func TestAlertPartitionHeldFiresInPrometheus(t *testing.T) {
	t.Parallel()
	promBin := prometheusBin(t)
	e := newEnv(t, 1)
	if e.real {
		t.Skip("holds the partition by deleting and re-creating the topic; kept to the development broker")
	}
	e.produce(jobsFor(keys, 0, 10)...)
	w := e.startWorker("W", "--http-addr", "127.0.0.1:0")
	waitCommitted(t, e, 0, 10, "")
	target := w.httpAddr()

	p := startPrometheus(t, promBin, target)

	// Healthy: Prometheus scrapes the worker's lane, and the alert is not
	// firing (nor pending).
	waitFor(t, 60*time.Second, "Prometheus to scrape tenure_lanes 1 from the worker", func() bool {
		v, ok := p.query(`tenure_lanes{instance="` + target + `"}`)
		return ok && v == 1
	})
	time.Sleep(2 * time.Second) // a few evaluations
	if a := p.alert("TenurePartitionHeld", target); a != nil {
		t.Fatalf("TenurePartitionHeld is %s while the worker runs normally: %+v", a.State, a)
	}

	// Hold the partition: the topic is deleted and re-created under the
	// worker, whose claim of the new log finds offsets that belong to the
	// old one (as in TestTopicRecreatedIsHeldUntilAcknowledged).
	e.recreateTopic()
	e.produceTo(0, jobsFor(keys, 100, 3)...)
	held := time.Now()
	w.waitLog(60*time.Second, map[string]any{"hold": "topic-recreated", "held": true})

	var firing *promAlert
	waitFor(t, 90*time.Second, "TenurePartitionHeld to fire in Prometheus", func() bool {
		a := p.alert("TenurePartitionHeld", target)
		if a != nil && a.State == "firing" {
			firing = a
			return true
		}
		return false
	})
	t.Logf("TenurePartitionHeld firing %s after the topic was re-created: labels %v\n  summary: %s\n  description: %s",
		time.Since(held).Round(time.Second), firing.Labels, firing.Annotations["summary"], firing.Annotations["description"])
	if v, err := strconv.ParseFloat(firing.Value, 64); err != nil || v != 1 || firing.Labels["severity"] != "critical" || firing.Labels["job"] != "tenure" {
		t.Errorf("alert labels %v, value %q: want severity critical, job tenure, value 1", firing.Labels, firing.Value)
	}
	if d := firing.Annotations["description"]; !strings.Contains(d, "tenure admin holds acknowledge") || !strings.Contains(d, "Worker "+target) {
		t.Errorf("the description should name the worker and the command: %q", d)
	}

	// The runbook's command lets the partition go on; the alert clears.
	r := runCLI(t, 30*time.Second, "", "admin", "holds", "acknowledge", "--brokers", strings.Join(e.brokers, ","),
		"--database-url", e.dbURL, "--schema", e.schema, "--group", e.group, "--topic", e.topic, "--partition", "0", "--actor", "ops@example")
	if r.code != 0 {
		t.Fatalf("acknowledge: %s", r)
	}
	waitCommitted(t, e, 0, 3, "")
	waitFor(t, 60*time.Second, "TenurePartitionHeld to clear in Prometheus", func() bool {
		return p.alert("TenurePartitionHeld", target) == nil
	})
	if v, ok := p.query(`tenure_lanes_halted{instance="` + target + `"}`); !ok || v != 0 {
		t.Errorf("tenure_lanes_halted in Prometheus after the acknowledgement: %v (found %v)", v, ok)
	}
	w.stop(30 * time.Second)
}

// promServer is a prometheus process this test started.
type promServer struct {
	t    *testing.T
	base string // http://127.0.0.1:PORT
	cmd  *exec.Cmd
	log  *lockedWriter // its stdout and stderr
	done chan struct{}
}

// prometheusBin is the prometheus binary; a test that needs it fails
// without it, it does not skip.
func prometheusBin(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatalf("prometheus is required (Debian's prometheus package: apt-get install prometheus; scripts/test.sh installs it): %v", err)
	}
	return bin
}

// lockedWriter is a buffer a process writes to while the test reads it.
type lockedWriter struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (w *lockedWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(b)
}

func (w *lockedWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// startPrometheus runs prometheus in a temporary directory on a free
// loopback port, scraping target every second and evaluating the shipped
// rules (TenurePartitionHeld's for: shortened to heldFor) every second. It
// is stopped, by its PID, and its directory removed when the test ends.
func startPrometheus(t *testing.T, bin, target string) *promServer {
	t.Helper()
	dir := t.TempDir()
	rules := shortenedRules(t)
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), rules, 0o644); err != nil {
		t.Fatal(err)
	}
	config := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - rules.yaml
scrape_configs:
  - job_name: tenure
    static_configs:
      - targets: [%q]
`, target)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	// A free port below the ephemeral range (freeport), handed to
	// prometheus. Another process could still take it meanwhile: then
	// prometheus exits at once, and it is tried again with another (three
	// times at most).
	for attempt := 1; ; attempt++ {
		port, err := freeport.Block(1)
		if err != nil {
			t.Fatal(err)
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		p := &promServer{t: t, base: "http://" + addr, log: &lockedWriter{}, done: make(chan struct{})}
		p.cmd = exec.Command(bin,
			"--config.file="+filepath.Join(dir, "prometheus.yml"),
			"--storage.tsdb.path="+filepath.Join(dir, "data"),
			"--web.listen-address="+addr,
			"--log.level=warn")
		p.cmd.Dir = dir
		p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
		if err := p.cmd.Start(); err != nil {
			t.Fatalf("starting prometheus: %v", err)
		}
		go func() { _ = p.cmd.Wait(); close(p.done) }()
		// Registered after t.TempDir: cleanups run last-in first-out, so
		// the process is gone before its directory is removed.
		t.Cleanup(p.stop)
		if p.waitReady(30 * time.Second) {
			t.Logf("prometheus %s on %s, scraping %s", bin, addr, target)
			return p
		}
		p.stop()
		if attempt == 3 {
			t.Fatalf("prometheus did not become ready:\n%s", p.output())
		}
		t.Logf("prometheus did not start on %s (attempt %d), trying another port:\n%s", addr, attempt, p.output())
	}
}

// shortenedRules is the rules file with TenurePartitionHeld's for: set to
// heldFor, edited as a YAML tree so that nothing else changes.
func shortenedRules(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(rulesPath)
	if err != nil {
		t.Fatal(err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	changed := 0
	var walk func(n *yaml.Node)
	walk = func(n *yaml.Node) {
		if n.Kind == yaml.MappingNode {
			var alert string
			var forNode *yaml.Node
			for i := 0; i+1 < len(n.Content); i += 2 {
				switch n.Content[i].Value {
				case "alert":
					alert = n.Content[i+1].Value
				case "for":
					forNode = n.Content[i+1]
				}
			}
			if alert == "TenurePartitionHeld" && forNode != nil {
				t.Logf("TenurePartitionHeld: for: %s in %s, %s in the copy this test's Prometheus loads", forNode.Value, rulesPath, heldFor)
				forNode.Value = heldFor
				changed++
			}
		}
		for _, c := range n.Content {
			walk(c)
		}
	}
	walk(&doc)
	if changed != 1 {
		t.Fatalf("%s: found TenurePartitionHeld with a for: %d times, want once", rulesPath, changed)
	}
	out, err := yaml.Marshal(&doc)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func (p *promServer) output() string { return p.log.String() }

// stop ends the prometheus process this test started, by its PID: SIGTERM,
// then SIGKILL after 10s.
func (p *promServer) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return
	case <-time.After(10 * time.Second):
	}
	_ = p.cmd.Process.Kill()
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.t.Errorf("prometheus (pid %d) did not exit after SIGKILL", p.cmd.Process.Pid)
	}
}

// waitReady polls /-/ready until it answers 200, the process exits, or the
// timeout passes.
func (p *promServer) waitReady(timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			return false
		default:
		}
		if code, _, err := p.get("/-/ready"); err == nil && code == http.StatusOK {
			return true
		}
		time.Sleep(100 * time.Millisecond)
	}
	return false
}

func (p *promServer) get(path string) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.base+path, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// promAlert is one alert of /api/v1/alerts.
type promAlert struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	State       string            `json:"state"`
	ActiveAt    string            `json:"activeAt"`
	Value       string            `json:"value"`
}

// alert returns the named alert for instance (pending or firing), nil if
// there is none. An API that does not answer fails the test.
func (p *promServer) alert(name, instance string) *promAlert {
	p.t.Helper()
	code, body, err := p.get("/api/v1/alerts")
	if err != nil || code != http.StatusOK {
		p.t.Fatalf("GET /api/v1/alerts: %d %v %s\nprometheus log:\n%s", code, err, body, p.output())
	}
	var resp struct {
		Status string `json:"status"`
		Data   struct {
			Alerts []promAlert `json:"alerts"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &resp); err != nil || resp.Status != "success" {
		p.t.Fatalf("/api/v1/alerts: %v %s", err, body)
	}
	for i, a := range resp.Data.Alerts {
		if a.Labels["alertname"] == name && a.Labels["instance"] == instance {
			return &resp.Data.Alerts[i]
		}
	}
	return nil
}

// query evaluates an instant query that returns one series: its value, and
// whether there was exactly one.
func (p *promServer) query(q string) (float64, bool) {
	p.t.Helper()
	code, body, err := p.get("/api/v1/query?query=" + url.QueryEscape(q))
	if err != nil || code != http.StatusOK {
		p.t.Fatalf("query %s: %d %v %s", q, code, err, body)
	}
	var resp struct {
		Data struct {
			Result []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &resp); err != nil {
		p.t.Fatalf("query %s: %v %s", q, err, body)
	}
	if len(resp.Data.Result) != 1 {
		return 0, false
	}
	var v float64
	s, _ := resp.Data.Result[0].Value[1].(string)
	if _, err := fmt.Sscan(s, &v); err != nil {
		return 0, false
	}
	return v, true
}
