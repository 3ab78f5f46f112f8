package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
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

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tenure-dev/tenure/internal/devbroker"
	"github.com/tenure-dev/tenure/internal/history"
	"github.com/tenure-dev/tenure/internal/netfault"
	"github.com/tenure-dev/tenure/internal/testdb"
)

// tenureBin is the `tenure` binary built once for the package.
var tenureBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "tenure-integration-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	tenureBin = filepath.Join(dir, "tenure")
	build := exec.Command("go", "build", "-o", tenureBin, "github.com/tenure-dev/tenure/cmd/tenure")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building tenure:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// sessionTimeout is the group session timeout the tests run with: short, so
// that a paused worker is evicted quickly.
const sessionTimeout = 3 * time.Second

// env is one test's world: a broker, a database schema, a topic and a group
// nobody else uses.
type env struct {
	t       *testing.T
	brokers []string
	real    bool // TENURE_TEST_BROKERS: a real cluster
	pool    *pgxpool.Pool
	dbURL   string
	schema  string
	topic   string
	group   string
	cl      *kgo.Client
	cluster *kfake.Cluster // the in-process broker; nil on a real cluster

	mu      sync.Mutex
	workers []*worker // every worker started, for the coordinator's side of the history
}

func newEnv(t *testing.T, partitions int32) *env {
	t.Helper()
	return newEnvWith(t, partitions, nil)
}

// newEnvWith is newEnv with extra settings for the in-process broker.
func newEnvWith(t *testing.T, partitions int32, brokerConfigs map[string]string) *env {
	t.Helper()
	e := &env{t: t}
	if b := os.Getenv("TENURE_TEST_BROKERS"); b != "" {
		e.brokers = strings.Split(b, ",")
		e.real = true
	} else {
		c, err := devbroker.Start(devbroker.Config{
			ConsumerSessionTimeout: sessionTimeout,
			ConsumerHeartbeat:      500 * time.Millisecond,
			BrokerConfigs:          brokerConfigs,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		e.brokers = c.ListenAddrs()
		e.cluster = c
	}
	e.pool = testdb.Pool(t)
	e.dbURL = testdb.URL()
	e.schema = testdb.Schema(t, e.pool)
	suffix := strings.TrimPrefix(e.schema, "tenure_test_")
	e.topic = "jobs-" + suffix
	e.group = "workers-" + suffix
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...),
		kgo.RequiredAcks(kgo.AllISRAcks()), kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	e.cl = cl
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	adm := kadm.NewClient(cl)
	if _, err := adm.CreateTopic(ctx, partitions, 1, nil, e.topic); err != nil {
		t.Fatalf("creating topic: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopics(ctx, e.topic)
		_, _ = adm.DeleteGroup(ctx, e.group)
	})
	return e
}

// produce writes jobs (key, value) and waits until they are acknowledged.
func (e *env) produce(jobs ...[2]string) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	recs := make([]*kgo.Record, len(jobs))
	for i, j := range jobs {
		recs[i] = &kgo.Record{Topic: e.topic, Key: []byte(j[0]), Value: []byte(j[1])}
	}
	if err := e.cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		e.t.Fatalf("producing: %v", err)
	}
}

// jobsFor makes n jobs spread over the given keys, values numbered from start.
func jobsFor(keys []string, start, n int) [][2]string {
	out := make([][2]string, n)
	for i := range out {
		out[i] = [2]string{keys[i%len(keys)], fmt.Sprintf(`{"seq":%d}`, start+i)}
	}
	return out
}

// highWatermark is the partition's end offset.
func (e *env) highWatermark(p int32) int64 {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	offs, err := kadm.NewClient(e.cl).ListEndOffsets(ctx, e.topic)
	if err != nil {
		e.t.Fatal(err)
	}
	o, ok := offs.Lookup(e.topic, p)
	if !ok || o.Err != nil {
		e.t.Fatalf("end offset of %s/%d: %v", e.topic, p, o.Err)
	}
	return o.Offset
}

// worker is a running `tenure worker` process and the JSON lines it logged.
type worker struct {
	t    *testing.T
	name string
	cmd  *exec.Cmd
	mu   sync.Mutex
	logs []map[string]any
	raw  []string
	done chan struct{}
}

func (e *env) startWorker(name string, extra ...string) *worker {
	e.t.Helper()
	return e.startWorkerCmd(name, func(args []string) *exec.Cmd { return exec.Command(tenureBin, args...) }, extra...)
}

// startWorkerIn starts a worker inside a network namespace of its own
// (internal/netfault): it reaches the broker and the database through the
// namespace's forwarders, on the same addresses as every worker, and a
// fault injected there drops its packets.
func (e *env) startWorkerIn(ns *netfault.Namespace, name string, extra ...string) *worker {
	e.t.Helper()
	return e.startWorkerCmd(name, func(args []string) *exec.Cmd { return ns.Command(tenureBin, args...) }, extra...)
}

// services are the ports a worker reaches: the brokers' and the database's.
func (e *env) services() netfault.Services {
	e.t.Helper()
	var s netfault.Services
	for _, b := range e.brokers {
		_, port, err := net.SplitHostPort(b)
		if err != nil {
			e.t.Fatal(err)
		}
		n, _ := strconv.Atoi(port)
		s.Kafka = append(s.Kafka, n)
	}
	u, err := url.Parse(e.dbURL)
	if err != nil {
		e.t.Fatal(err)
	}
	n, _ := strconv.Atoi(u.Port())
	if n == 0 {
		n = 5432
	}
	s.Postgres = []int{n}
	return s
}

func (e *env) startWorkerCmd(name string, command func(args []string) *exec.Cmd, extra ...string) *worker {
	e.t.Helper()
	args := append([]string{"worker",
		"--brokers", strings.Join(e.brokers, ","), "--group", e.group, "--topic", e.topic,
		"--database-url", e.dbURL, "--schema", e.schema, "--handler", "export",
		"--session-timeout", sessionTimeout.String(), "--name", name, "--log-level", "debug",
		"--batch-max", "50",
	}, extra...)
	cmd := command(args)
	cmd.Env = os.Environ()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		e.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	w := &worker{t: e.t, name: name, cmd: cmd, done: make(chan struct{})}
	e.mu.Lock()
	e.workers = append(e.workers, w)
	e.mu.Unlock()
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			var m map[string]any
			_ = json.Unmarshal([]byte(line), &m)
			w.mu.Lock()
			w.raw = append(w.raw, line)
			if m != nil {
				w.logs = append(w.logs, m)
			}
			w.mu.Unlock()
		}
		_ = cmd.Wait()
		close(w.done)
	}()
	e.t.Cleanup(func() {
		w.signal(syscall.SIGCONT)
		w.kill()
		if e.t.Failed() {
			w.mu.Lock()
			e.t.Logf("---- %s log (%d lines, last 80) ----\n%s", name, len(w.raw), strings.Join(tail(w.raw, 80), "\n"))
			w.mu.Unlock()
		}
	})
	return w
}

// assignments reads, from every worker's log, when each was given which
// partition and the claim id its lane claimed with: the coordinator's side
// of the history (history.CheckOwnership).
func (e *env) assignments() []history.Assignment {
	e.mu.Lock()
	ws := append([]*worker(nil), e.workers...)
	e.mu.Unlock()
	var out []history.Assignment
	for _, w := range ws {
		w.mu.Lock()
		for _, m := range w.logs {
			if a, ok := history.ParseAssignment(e.group, m); ok {
				out = append(out, a)
			}
		}
		w.mu.Unlock()
	}
	return out
}

func tail(s []string, n int) []string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func (w *worker) signal(sig syscall.Signal) {
	if w.cmd.Process != nil {
		_ = w.cmd.Process.Signal(sig)
	}
}

// kill ends the process we started (by its PID) and waits for it.
func (w *worker) kill() {
	select {
	case <-w.done:
		return
	default:
	}
	w.signal(syscall.SIGKILL)
	select {
	case <-w.done:
	case <-time.After(10 * time.Second):
		w.t.Errorf("%s did not exit after SIGKILL", w.name)
	}
}

// stop asks for a graceful stop and waits for the process to exit.
func (w *worker) stop(timeout time.Duration) {
	w.t.Helper()
	w.signal(syscall.SIGTERM)
	select {
	case <-w.done:
	case <-time.After(timeout):
		w.t.Errorf("%s did not stop within %s of SIGTERM", w.name, timeout)
		w.kill()
	}
}

// waitLog waits until the worker logs a line matching every field given
// (values compared as strings) and returns it.
func (w *worker) waitLog(timeout time.Duration, fields map[string]any) map[string]any {
	w.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if m := w.findLog(fields); m != nil {
			return m
		}
		select {
		case <-w.done:
			if m := w.findLog(fields); m != nil {
				return m
			}
			w.t.Fatalf("%s exited before logging %v", w.name, fields)
		default:
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("%s did not log %v within %s", w.name, fields, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitLogAny waits until the worker logs a line matching one of the
// alternatives and returns it.
func (w *worker) waitLogAny(timeout time.Duration, alternatives ...map[string]any) map[string]any {
	w.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		for _, f := range alternatives {
			if m := w.findLog(f); m != nil {
				return m
			}
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("%s logged none of %v within %s", w.name, alternatives, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (w *worker) findLog(fields map[string]any) map[string]any {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, m := range w.logs {
		if matches(m, fields) {
			return m
		}
	}
	return nil
}

func (w *worker) countLogs(fields map[string]any) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, m := range w.logs {
		if matches(m, fields) {
			n++
		}
	}
	return n
}

func matches(m, fields map[string]any) bool {
	for k, v := range fields {
		got, ok := m[k]
		if !ok || fmt.Sprint(got) != fmt.Sprint(v) {
			return false
		}
	}
	return true
}

// processState reads /proc/PID/stat's state letter ('T' when stopped).
func (w *worker) processState() byte {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", w.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return 0
	}
	return s[i+2]
}

// pause sends SIGSTOP and waits until the kernel reports the process stopped.
func (w *worker) pause() {
	w.t.Helper()
	w.signal(syscall.SIGSTOP)
	waitFor(w.t, 5*time.Second, "worker "+w.name+" to be stopped", func() bool { return w.processState() == 'T' })
}

func (w *worker) resume() { w.signal(syscall.SIGCONT) }

// waitFor polls cond until it holds or the timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(25 * time.Millisecond)
	}
}
