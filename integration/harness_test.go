package integration

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"os"
	"os/exec"
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

	"github.com/tenure-dev/tenure/internal/childproc"
	"github.com/tenure-dev/tenure/internal/devbroker"
	"github.com/tenure-dev/tenure/internal/history"
	"github.com/tenure-dev/tenure/internal/testinfra/kafkatest"
	"github.com/tenure-dev/tenure/internal/testinfra/netfault"
	"github.com/tenure-dev/tenure/internal/testinfra/tenurebin"
	"github.com/tenure-dev/tenure/internal/testinfra/testdb"
	"github.com/tenure-dev/tenure/sink"
)

// tenureBin is the `tenure` binary built once for the package.
var tenureBin string

func TestMain(m *testing.M) { os.Exit(tenurebin.Run(m, &tenureBin)) }

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
		c := startBroker(t, devbroker.Config{BrokerConfigs: brokerConfigs})
		e.brokers = c.ListenAddrs()
		e.cluster = c
	}
	e.pool = testdb.Pool(t)
	e.dbURL = testdb.URL()
	e.schema = testdb.Schema(t, e.pool)
	e.createTopic(partitions)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		adm := kadm.NewClient(e.cl)
		_, _ = adm.DeleteTopics(ctx, e.topic)
		_, _ = adm.DeleteGroup(ctx, e.group)
	})
	return e
}

// eachProtocol runs test once per group protocol, in parallel subtests,
// each on a fresh env with a topic of the given partitions. On a real
// cluster it runs the classic protocol only: the KIP-848 tests need
// kfake's short session timeout.
func eachProtocol(t *testing.T, partitions int32, test func(t *testing.T, e *env, proto string)) {
	t.Helper()
	for _, proto := range []string{"classic", "consumer"} {
		t.Run(proto, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, partitions)
			if proto == "consumer" && e.real {
				t.Skip("needs kfake's short KIP-848 session timeout")
			}
			test(t, e, proto)
		})
	}
}

// store is e's schema as a sink.Store.
func (e *env) store() *sink.Store {
	e.t.Helper()
	store, err := sink.NewStore(e.pool, e.schema)
	if err != nil {
		e.t.Fatal(err)
	}
	return store
}

// claimed has owner "w" claim partition 0 of e's topic with token tk, as
// a worker does before it commits, and returns the store and the partition.
func (e *env) claimed(tk sink.Token) (*sink.Store, sink.Partition) {
	e.t.Helper()
	store := e.store()
	p := sink.Partition{Group: e.group, Topic: e.topic}
	if _, err := store.Claim(context.Background(), sink.ClaimRequest{Partition: p, Token: tk, Owner: "w", PartitionCount: 1}); err != nil {
		e.t.Fatal(err)
	}
	return store, p
}

// recreateTopic deletes e's topic and creates it again with one partition:
// a new log under the old name.
func (e *env) recreateTopic() {
	t := e.t
	t.Helper()
	adm := kadm.NewClient(e.cl)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := adm.DeleteTopics(ctx, e.topic); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the topic to be gone", func() bool {
		td, err := adm.ListTopics(ctx, e.topic)
		return err == nil && !td.Has(e.topic)
	})
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, e.topic); err != nil {
		t.Fatal(err)
	}
}

// oneWorkerCaughtUp is an env of one partition on the in-process broker
// (a test that does what why says is skipped on a real cluster) whose
// worker W has committed the topic's first 10 jobs.
func oneWorkerCaughtUp(t *testing.T, why string) (*env, *worker) {
	t.Helper()
	e := newEnv(t, 1)
	if e.real {
		t.Skip(why)
	}
	e.produce(jobsFor(keys, 0, 10)...)
	w := e.startWorker("W")
	waitCommitted(t, e, 0, 10, "")
	return e, w
}

// ledgerCaughtUp starts worker W with the ledger handler and the extra
// flags, and waits until partition 0's next offset reaches off.
func (e *env) ledgerCaughtUp(off int64, extra ...string) *worker {
	e.t.Helper()
	w := e.startWorker("W", append([]string{"--handler", "ledger"}, extra...)...)
	waitCommitted(e.t, e, 0, off, "")
	return w
}

// startBroker starts the in-process broker the tests' environments use,
// closed when the test ends.
func startBroker(t *testing.T, c devbroker.Config) *kfake.Cluster {
	t.Helper()
	c.ConsumerSessionTimeout, c.ConsumerHeartbeat = sessionTimeout, 500*time.Millisecond
	br, err := devbroker.Start(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(br.Close)
	return br
}

// createTopic names the topic and group after e's schema (its random
// part, testdb.NewSchemaName's), connects the test's client to
// e.brokers (with opts, TLS and SASL) and creates the topic.
func (e *env) createTopic(partitions int32, opts ...kgo.Opt) {
	t := e.t
	t.Helper()
	suffix := e.schema[strings.LastIndex(e.schema, "_")+1:]
	e.topic, e.group = "jobs-"+suffix, "workers-"+suffix
	var err error
	e.cl, err = kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(e.brokers...),
		kgo.RequiredAcks(kgo.AllISRAcks()), kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.cl.Close)
	kafkatest.CreateTopic(t, e.cl, e.topic, partitions)
}

// testPool is the test's own pool on a database the test starts (not the
// shared server's): no search_path, named tenure-test, a short connect
// timeout. It is closed when the test ends, before the cleanups registered
// earlier (the database's own) run.
func testPool(t *testing.T, ctx context.Context, url string) *pgxpool.Pool {
	t.Helper()
	return testdb.PoolOn(t, ctx, url, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.RuntimeParams["application_name"] = "tenure-test"
		cfg.ConnConfig.ConnectTimeout = 2 * time.Second
	})
}

// terminateSessions ends, for d, over and over, every session on e's
// database whose application_name is LIKE one of apps, and returns how
// many it ended.
func terminateSessions(t *testing.T, e *env, d time.Duration, apps ...string) int {
	t.Helper()
	n := 0
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		var k int
		err := e.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
			FROM pg_stat_activity WHERE application_name LIKE ANY($1) AND pid <> pg_backend_pid()`, apps).Scan(&k)
		cancel()
		if err != nil {
			t.Fatalf("terminating the sessions of %v: %v", apps, err)
		}
		n += k
		time.Sleep(10 * time.Millisecond)
	}
	return n
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

// jobsFailingAt is jobsFor(keys, 0, n) with job i failing in a worker
// run with --inject-faults ("tenure-fault": "error").
func jobsFailingAt(n, i int) [][2]string {
	jobs := jobsFor(keys, 0, n)
	jobs[i][1] = fmt.Sprintf(`{"seq":%d,"tenure-fault":"error"}`, i)
	return jobs
}

// highWatermark is the partition's end offset, read with the others
// (highWatermarks).
func (e *env) highWatermark(p int32) int64 {
	e.t.Helper()
	o, ok := e.highWatermarks()[p]
	if !ok {
		e.t.Fatalf("no end offset of %s/%d", e.topic, p)
	}
	return o
}

// worker is a running `tenure worker` process and the lines it logged
// (childproc keeps every one: the tests search the whole log).
type worker struct {
	t    *testing.T
	name string
	p    *childproc.Proc
	done <-chan struct{} // closed once it has exited and its log is read
}

func (e *env) startWorker(name string, extra ...string) *worker {
	e.t.Helper()
	return e.startWorkerCmd(name, func(args []string) *exec.Cmd { return exec.Command(tenureBin, args...) }, extra...)
}

// startWorkerIn starts a worker inside a network namespace of its own
// (internal/testinfra/netfault): it reaches the broker and the database through the
// namespace's forwarders, on the same addresses as every worker, and a
// fault injected there drops its packets.
func (e *env) startWorkerIn(ns *netfault.Namespace, name string, extra ...string) *worker {
	e.t.Helper()
	return e.startWorkerCmd(name, func(args []string) *exec.Cmd { return ns.Command(tenureBin, args...) }, extra...)
}

// newNamespacedEnv is newEnv with a network namespace whose forwarders
// carry a worker started in it to the broker and the database (on the
// in-process broker only: the forwarders reach loopback services).
func newNamespacedEnv(t *testing.T, partitions int32) (*env, *netfault.Namespace, netfault.Services) {
	t.Helper()
	e := newEnv(t, partitions)
	if e.real {
		t.Skip("the namespace forwards to loopback services only")
	}
	svc := e.services()
	ns, err := netfault.NewT(t, svc.Ports()...)
	if err != nil {
		t.Fatal(err)
	}
	return e, ns, svc
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
	p, err := childproc.Start(cmd, childproc.Options{Name: name, Keep: childproc.KeepAll})
	if err != nil {
		e.t.Fatal(err)
	}
	w := &worker{t: e.t, name: name, p: p, done: p.Done()}
	e.mu.Lock()
	e.workers = append(e.workers, w)
	e.mu.Unlock()
	e.t.Cleanup(func() {
		w.kill() // a paused worker is thawed first
		if e.t.Failed() {
			e.t.Logf("---- %s log (%d lines, last 80) ----\n%s", name, w.p.Count(), strings.Join(w.p.Tail(80), "\n"))
		}
	})
	return w
}

// assignments reads, from every worker's log, when each was given which
// partition and the claim id its lane claimed with: the coordinator's side
// of the history (history.CheckOwnership).
func (e *env) assignments() []history.Assignment { return parseLogs(e, history.ParseAssignment) }

// parseLogs reads every worker's log lines with parse, keeping what it
// recognises as one of e's group's.
func parseLogs[T any](e *env, parse func(group string, line map[string]any) (T, bool)) []T {
	e.mu.Lock()
	ws := append([]*worker(nil), e.workers...)
	e.mu.Unlock()
	var out []T
	for _, w := range ws {
		for _, m := range w.logs() {
			if v, ok := parse(e.group, m); ok {
				out = append(out, v)
			}
		}
	}
	return out
}

func tail(s []string, n int) []string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// logs is every JSON line the worker logged so far.
func (w *worker) logs() []map[string]any {
	var out []map[string]any
	for _, l := range w.p.Lines(0) {
		if l.Fields != nil {
			out = append(out, l.Fields)
		}
	}
	return out
}

// raw is every line the worker wrote to stderr so far.
func (w *worker) raw() []string { return w.p.Tail(math.MaxInt) }

func (w *worker) signal(sig syscall.Signal) { _ = w.p.Signal(sig) }

// kill ends the process we started (by its PID) and waits for it.
func (w *worker) kill() {
	if err := w.p.Kill(); err != nil {
		w.t.Errorf("%s did not exit after SIGKILL", w.name)
	}
}

// stop asks for a graceful stop and waits for the process to exit.
func (w *worker) stop(timeout time.Duration) {
	w.t.Helper()
	var se *childproc.StopError
	if errors.As(w.p.Stop(timeout), &se) {
		w.t.Errorf("%s did not stop within %s of SIGTERM", w.name, timeout)
		if se.KillErr != nil {
			w.t.Errorf("%s did not exit after SIGKILL", w.name)
		}
	}
}

// waitLog waits until the worker logs a line matching every field given
// (values compared as strings) and returns it.
func (w *worker) waitLog(timeout time.Duration, fields map[string]any) map[string]any {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	l, err := w.p.WaitLine(ctx, 0, childproc.HasFields(fields))
	switch {
	case errors.Is(err, childproc.ErrExited):
		w.t.Fatalf("%s exited before logging %v", w.name, fields)
	case err != nil:
		w.t.Fatalf("%s did not log %v within %s", w.name, fields, timeout)
	}
	return l.Fields
}

// waitLogAny waits until the worker logs a line matching one of the
// alternatives and returns it.
func (w *worker) waitLogAny(timeout time.Duration, alternatives ...map[string]any) map[string]any {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	l, err := w.p.WaitLine(ctx, 0, func(m map[string]any) bool {
		for _, f := range alternatives {
			if matches(m, f) {
				return true
			}
		}
		return false
	})
	if err != nil {
		w.t.Fatalf("%s logged none of %v within %s", w.name, alternatives, timeout)
	}
	return l.Fields
}

func (w *worker) findLog(fields map[string]any) map[string]any {
	l, ok := w.p.Find(0, childproc.HasFields(fields))
	if !ok {
		return nil
	}
	return l.Fields
}

func (w *worker) countLogs(fields map[string]any) int {
	n := 0
	for _, m := range w.logs() {
		if matches(m, fields) {
			n++
		}
	}
	return n
}

func matches(m, fields map[string]any) bool { return childproc.HasFields(fields)(m) }

// pause sends SIGSTOP and waits until the kernel reports the process stopped.
func (w *worker) pause() {
	w.t.Helper()
	if err := w.p.Freeze(5 * time.Second); err != nil {
		w.t.Fatalf("timed out after %s waiting for %s", 5*time.Second, "worker "+w.name+" to be stopped")
	}
}

func (w *worker) resume() { _ = w.p.Thaw() }

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
