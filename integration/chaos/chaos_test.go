package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tenure-dev/tenure/internal/history"
	"github.com/tenure-dev/tenure/internal/netfault"
	"github.com/tenure-dev/tenure/internal/pgtest"
	"github.com/tenure-dev/tenure/sink"
)

const (
	partitions     = 6
	nkeys          = 36
	sessionTimeout = 3 * time.Second
	schemaName     = "tenure_chaos"
	groupName      = "chaos-workers"
	topicName      = "chaos-jobs"

	// Setup, drain and checks around the faults, for the deadline check.
	overhead = 150 * time.Second
)

// Fault kinds.
const (
	kindPause       = "pause"
	kindKill        = "kill"
	kindPGRestart   = "pg-restart"
	kindBrokerRst   = "broker-restart"
	kindGroupDelete = "group-delete"
	kindPauseInTx   = "pause-in-tx"
	kindPGFailover  = "pg-failover"    // with -chaos.postgres formation (formation_test.go)
	kindDeleteRecs  = "delete-records" // deleterecords_test.go
)

var kinds = []string{kindPause, kindPauseInTx, kindKill, kindPGRestart, kindBrokerRst, kindGroupDelete, kindDeleteRecs, kindPGFailover,
	kindPartKafka, kindPartPG, kindPartOneWay, kindPartFull} // the last four: network_test.go

// deck is one round of faults; each round is shuffled, so that every kind
// comes up in every round.
var deck = []string{kindPause, kindPause, kindPauseInTx, kindKill, kindKill, kindPGRestart, kindBrokerRst, kindGroupDelete, kindDeleteRecs,
	kindPartKafka, kindPartPG, kindPartOneWay, kindPartFull}

// Group reset modes (issue 7), the group-delete fault's Mode: how the
// group's lifetime ends, and what else is going on meanwhile.
const (
	resetGraceful = "graceful" // every worker stopped (SIGTERM), the group deleted, the workers started
	resetFrozen   = "frozen"   // a zombie frozen across the reset, woken once the new lifetime runs
	resetLive     = "live"     // every worker SIGKILLed, the group deleted the moment it is empty
	resetExpiry   = "expiry"   // the empty group's offsets expire and the broker sweeps the group
)

var resetModes = []string{resetGraceful, resetFrozen, resetLive, resetExpiry}

// handoffKinds are the faults whose hand-off latency the summary reports:
// a worker gone (killed) or frozen (paused, paused inside its transaction)
// while it owns partitions.
var handoffKinds = []string{kindKill, kindPause, kindPauseInTx}

// Broker settings of the run: the retention check runs every 500ms (Kafka:
// 10 minutes), so that an expiry fault takes a second once it lowers the
// retention; offsets are kept for the default 7 days otherwise, and an
// active group's offsets never expire.
const brokerConfig = "offsets.retention.check.interval.ms=500"

// fault is one injected fault and how the system recovered from it.
type fault struct {
	Kind, Mode, Target string
	Injected, Ended    time.Time
	Markers            map[int32]int64 // the job produced to each partition at injection
	MarkErr            error
	Recovered          time.Time // every partition past its marker
	Net                *netCut   // a network fault's particulars (network_test.go), or nil
}

func (f *fault) String() string {
	s := fmt.Sprintf("%s %s", f.Injected.Format("15:04:05.000"), f.Kind)
	if f.Mode != "" {
		s += "/" + f.Mode
	}
	if f.Target != "" {
		s += " " + f.Target
	}
	s += fmt.Sprintf(" (lasted %s", f.Ended.Sub(f.Injected).Round(time.Millisecond))
	switch {
	case f.MarkErr != nil:
		s += fmt.Sprintf("; markers not produced: %v", f.MarkErr)
	case f.Recovered.IsZero():
		s += "; not recovered"
	default:
		s += fmt.Sprintf("; recovered %s after injection", f.Recovered.Sub(f.Injected).Round(time.Millisecond))
	}
	return s + ")"
}

type slot struct {
	n   int
	gen int
	p   *proc
	ns  *netfault.Namespace // the slot's network namespace: every worker of the slot runs in it
}

// world is one chaos run.
type world struct {
	t      *testing.T
	cfg    config
	rng    *rand.Rand // the fault schedule
	logDir string
	start  time.Time

	pg         *pgtest.Cluster // nil with a formation
	ha         *haRun          // the pg_auto_failover formation (formation_test.go), or nil
	pool       *pgxpool.Pool
	admin      *kgo.Client
	adm        *kadm.Client
	prod       *producer
	book       *logbook
	brokerAddr string
	brokerArgs []string

	mu          sync.Mutex
	broker      *proc
	brokerGen   int
	slots       []*slot
	resets      []string // group reset modes still to come, shuffled
	all         []*proc
	unexpected  []string // processes that ended on their own
	notes       []string // what the harness saw that is worth a line
	faults      []*fault
	next        map[int32]int64 // last fencing rows read
	markerWG    sync.WaitGroup
	keepLogs    bool // findings: keep the logs for whoever reads them
	trackerDone chan struct{}

	trunc truncation // delete-records: the deletions and the harness as operator (deleterecords_test.go)

	svc  netfault.Services // the ports the workers' namespaces forward (network_test.go)
	sess sessionStats      // the workers' Postgres sessions and the live processes, sampled
}

func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("the chaos run takes minutes; skipped with -short")
	}
	cfg, err := loadConfig()
	if err != nil {
		t.Fatal(err)
	}
	if dl, ok := t.Deadline(); ok {
		if need := cfg.duration + overhead; time.Until(dl) < need {
			t.Fatalf("the run needs about %s (%s of faults) but the test deadline is in %s: "+
				"pass -timeout 0 (or -timeout %s), e.g. go test ./integration/chaos -run TestChaos -v -timeout 0 -chaos.soak",
				need.Round(time.Second), cfg.duration, time.Until(dl).Round(time.Second), (need + time.Minute).Round(time.Minute))
		}
	}
	w := &world{t: t, cfg: cfg, rng: rand.New(rand.NewPCG(uint64(cfg.seed), 1)), book: newLogbook(),
		next: map[int32]int64{}, start: time.Now()}
	t.Logf("chaos run: seed %d, %d workers, %s protocol, %s of faults, %d jobs/s over %d partitions (replay: -chaos.seed %d)",
		cfg.seed, cfg.workers, cfg.protocol, cfg.duration, cfg.rate, partitions, cfg.seed)
	w.setup()
	w.inject()
	w.acknowledgeLeftovers()
	hwm, records := w.drain()
	w.checkFailovers()
	w.checkAndReport(hwm, records)
}

// setup starts PostgreSQL, the broker, the workers and the producer, and
// waits until every partition has made progress.
func (w *world) setup() {
	t := w.t
	dir, err := os.MkdirTemp("", "tenure-chaos-")
	if err != nil {
		t.Fatal(err)
	}
	w.logDir = dir
	t.Cleanup(func() {
		if t.Failed() || w.cfg.keep || w.keepLogs {
			t.Logf("logs, broker data and timeline kept in %s", dir)
			return
		}
		os.RemoveAll(dir)
	})

	if w.cfg.postgres == postgresFormation {
		w.startFormation() // before the 60s context: a formation takes longer to start
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if w.ha == nil {
		w.pg, err = pgtest.New(ctx)
		if err != nil {
			t.Fatalf("throwaway PostgreSQL: %v", err)
		}
		t.Cleanup(func() {
			if err := w.pg.Close(); err != nil {
				t.Logf("removing throwaway PostgreSQL: %v", err)
			}
		})
		// Strict workers refuse a server without prepared transactions.
		if w.cfg.strict {
			if err := w.pg.AppendConf("max_prepared_transactions = 64"); err != nil {
				t.Fatal(err)
			}
			if err := w.pg.Restart(ctx, "fast"); err != nil {
				t.Fatalf("restarting the throwaway PostgreSQL with prepared transactions: %v", err)
			}
		}
	}
	// Every process is ended by its PID, after SIGCONT, whatever happens.
	t.Cleanup(w.killAll)

	out, err := exec.CommandContext(ctx, tenureBin, "migrate", "--database-url", w.dbURL(), "--schema", schemaName).CombinedOutput()
	if err != nil {
		t.Fatalf("tenure migrate: %v: %s", err, out)
	}
	w.pool, err = pgxpool.New(ctx, w.dbURL()+"&pool_max_conns=4&application_name="+harnessApp)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.pool.Close)
	sampleCtx, stopSampling := context.WithCancel(context.Background())
	sampled := make(chan struct{})
	go w.sampleSessions(sampleCtx, sampled)
	t.Cleanup(func() { stopSampling(); <-sampled })

	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	w.brokerAddr = fmt.Sprintf("127.0.0.1:%d", port)
	w.brokerArgs = []string{"broker", "--listen", w.brokerAddr, "--data-dir", filepath.Join(dir, "broker-data"),
		"--topic", topicName, "--partitions", strconv.Itoa(partitions),
		"--consumer-session-timeout", sessionTimeout.String(), "--consumer-heartbeat-interval", "500ms",
		"--broker-config", brokerConfig}
	if err := w.startBroker(); err != nil {
		t.Fatal(err)
	}

	w.admin, err = kgo.NewClient(kgo.SeedBrokers(w.brokerAddr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.admin.Close)
	w.adm = kadm.NewClient(w.admin)

	w.prod, err = newProducer([]string{w.brokerAddr}, topicName, partitions, nkeys)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.prod.cl.Close)

	for i := 1; i <= w.cfg.workers; i++ {
		w.slots = append(w.slots, &slot{n: i})
	}
	w.setupNetwork(port)
	for _, s := range w.slots {
		if err := w.startWorker(s); err != nil {
			t.Fatal(err)
		}
	}
	w.trackerDone = make(chan struct{})
	trackCtx, stopTracking := context.WithCancel(context.Background())
	t.Cleanup(func() { stopTracking(); <-w.trackerDone })
	go w.track(trackCtx)
	w.startOperator()
	go w.prod.run(w.cfg.rate, rand.New(rand.NewPCG(uint64(w.cfg.seed), 2)))
	t.Cleanup(w.prod.halt) // a run that fails early stops producing too

	// Warm-up: every partition claimed and past its first jobs.
	deadline := time.Now().Add(60 * time.Second)
	for {
		w.mu.Lock()
		n, ok := len(w.next), true
		for p := int32(0); p < partitions; p++ {
			if w.next[p] == 0 {
				ok = false
			}
		}
		w.mu.Unlock()
		if n == partitions && ok {
			break
		}
		if time.Now().After(deadline) {
			w.dumpState("warm-up")
			t.Fatalf("the workers did not start processing every partition within 60s")
		}
		w.supervise()
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("warm-up done in %s; injecting faults for %s", time.Since(w.start).Round(time.Millisecond), w.cfg.duration)
}

func (w *world) startBroker() error {
	w.mu.Lock()
	w.brokerGen++
	name := fmt.Sprintf("broker.%d", w.brokerGen)
	w.mu.Unlock()
	p, err := startProc(name, filepath.Join(w.logDir, "broker.log"), nil, w.brokerArgs, nil)
	if err != nil {
		return err
	}
	w.mu.Lock()
	w.broker = p
	w.all = append(w.all, p)
	w.mu.Unlock()
	return waitListening(w.brokerAddr, 30*time.Second, p)
}

// nextName is the name of the slot's next worker process.
func (s *slot) nextName() string { return fmt.Sprintf("w%d.%d", s.n, s.gen) }

// startWorker starts the slot's next worker process, with extra flags.
func (w *world) startWorker(s *slot, extra ...string) error {
	name := s.nextName()
	s.gen++
	args := []string{"worker",
		"--brokers", w.brokerAddr, "--group", groupName, "--topic", topicName,
		"--database-url", w.dbURL(), "--schema", schemaName, "--no-migrate",
		"--handler", "export", "--inject-faults",
		"--session-timeout", sessionTimeout.String(), "--max-attempts", "2", "--handler-timeout", "1s",
		// kfake waits the whole rebalance timeout for a member that died in
		// the middle of a rebalance; keep that short.
		"--rebalance-timeout", "10s",
		"--protocol", w.cfg.protocol, "--batch-max", "50",
		"--name", name, "--log-level", "debug",
	}
	if w.cfg.strict {
		args = append(args, "--strict")
	}
	args = append(args, extra...)
	p, err := startProc(name, filepath.Join(w.logDir, fmt.Sprintf("w%d.log", s.n)), s.ns, args,
		func(line string) { w.book.record(name, line) })
	if err != nil {
		return err
	}
	s.p = p
	w.mu.Lock()
	w.all = append(w.all, p)
	w.mu.Unlock()
	return nil
}

// killAll ends every process the run started, by PID, each resumed first if
// it was stopped.
func (w *world) killAll() {
	w.mu.Lock()
	all := append([]*proc(nil), w.all...)
	w.mu.Unlock()
	for _, p := range all {
		if err := p.kill(); err != nil {
			w.t.Errorf("cleanup: %v", err)
		}
	}
}

// supervise restarts a worker or the broker that ended on its own, as a
// process supervisor would, and records it.
func (w *world) supervise() {
	for _, s := range w.slots {
		if bad, err := s.p.unexpectedExit(); bad {
			w.noteUnexpected(s.p, err)
			if err := w.startWorker(s); err != nil {
				w.t.Fatalf("restarting %s: %v", s.p.name, err)
			}
		}
	}
	if bad, err := w.broker.unexpectedExit(); bad {
		w.noteUnexpected(w.broker, err)
		if err := w.startBroker(); err != nil {
			w.t.Fatalf("restarting the broker: %v", err)
		}
	}
}

func (w *world) noteUnexpected(p *proc, err error) {
	msg := fmt.Sprintf("%s (pid %d) exited on its own at +%s: %s; last lines:\n    %s", p.name, p.pid(),
		time.Since(w.start).Round(time.Millisecond), exitString(err), strings.Join(p.lastLines(8), "\n    "))
	w.mu.Lock()
	w.unexpected = append(w.unexpected, msg)
	w.mu.Unlock()
	w.t.Logf("unexpected exit: %s", msg)
}

func (w *world) note(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	w.mu.Lock()
	w.notes = append(w.notes, msg)
	w.mu.Unlock()
	w.t.Logf("note: %s", msg)
}

// fences reads every partition's stored next offset.
func (w *world) fences(ctx context.Context) (map[int32]int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	rows, err := w.pool.Query(ctx, `SELECT partition, next_offset FROM `+schemaName+`.fences WHERE consumer_group = $1 AND topic = $2`, groupName, topicName)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[int32]int64{}
	for rows.Next() {
		var p int32
		var n int64
		if err := rows.Scan(&p, &n); err != nil {
			return nil, err
		}
		out[p] = n
	}
	return out, rows.Err()
}

// track reads the fencing rows every 100ms and marks faults recovered once
// every partition is past the fault's markers.
func (w *world) track(ctx context.Context) {
	defer close(w.trackerDone)
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		w.trackOnce(ctx)
	}
}

func (w *world) trackOnce(ctx context.Context) {
	next, err := w.fences(ctx)
	if err != nil {
		return // Postgres is restarting: read again at the next tick
	}
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.next = next
	for _, f := range w.faults {
		if !f.Recovered.IsZero() || f.Markers == nil {
			continue
		}
		past := true
		for p, off := range f.Markers {
			if next[p] <= off {
				past = false
				break
			}
		}
		if past {
			f.Recovered = now
		}
	}
}

// begin records a fault at its injection.
func (w *world) begin(kind, mode, target string) *fault {
	f := &fault{Kind: kind, Mode: mode, Target: target, Injected: time.Now()}
	w.mu.Lock()
	w.faults = append(w.faults, f)
	w.mu.Unlock()
	return f
}

// mark produces the fault's markers, one job to every partition, once the
// fault is in effect (the process stopped, the server down): a job produced
// earlier could be processed before the fault bites and say nothing.
// Recovery is still measured from injection.
func (w *world) mark(f *fault) {
	w.markerWG.Add(1)
	go func() {
		defer w.markerWG.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		m, err := w.prod.mark(ctx)
		w.mu.Lock()
		f.Markers, f.MarkErr = m, err
		w.mu.Unlock()
	}()
}

func (w *world) end(f *fault) {
	w.mu.Lock()
	f.Ended = time.Now()
	w.mu.Unlock()
	w.t.Logf("fault +%s: %s %s %s (%s)", f.Injected.Sub(w.start).Round(time.Millisecond), f.Kind, f.Mode, f.Target,
		f.Ended.Sub(f.Injected).Round(time.Millisecond))
}

// between returns a random duration in [lo, hi).
func (w *world) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(w.rng.Int64N(int64(hi-lo)))
}

// sleep waits d while supervising the processes.
func (w *world) sleep(d time.Duration) {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		w.supervise()
		time.Sleep(min(100*time.Millisecond, time.Until(end)))
	}
}

// inject runs the fault schedule for the configured duration. Faults come one
// at a time, a random gap apart; their recoveries may overlap.
func (w *world) inject() {
	stopAt := time.Now().Add(w.cfg.duration)
	var round []string
	for time.Now().Before(stopAt) {
		if len(round) == 0 {
			round = append([]string(nil), w.deck()...)
			w.rng.Shuffle(len(round), func(i, j int) { round[i], round[j] = round[j], round[i] })
		}
		kind := round[0]
		round = round[1:]
		switch kind {
		case kindPause:
			w.pauseWorker()
		case kindKill:
			w.killWorker()
		case kindPGRestart:
			w.restartPostgres()
		case kindBrokerRst:
			w.restartBroker()
		case kindGroupDelete:
			w.deleteGroup()
		case kindPauseInTx:
			w.pauseInTx()
		case kindPGFailover:
			w.failoverPostgres()
		case kindDeleteRecs:
			w.deleteRecords()
		case kindPartKafka, kindPartPG, kindPartOneWay, kindPartFull:
			w.partition(kind)
		}
		w.sleep(w.between(time.Second, 4*time.Second))
	}
}

// pauseWorker stops a worker with SIGSTOP for longer than the session
// timeout, then resumes it: it wakes up as a zombie that lost its
// partitions.
func (w *world) pauseWorker() {
	s := w.slots[w.rng.IntN(len(w.slots))]
	d := w.between(sessionTimeout+time.Second, sessionTimeout+4*time.Second)
	w.freeze(w.begin(kindPause, d.Round(100*time.Millisecond).String(), s.p.name), s, d)
}

// freeze is fault f: s's worker SIGSTOPped for d, then resumed.
func (w *world) freeze(f *fault, s *slot, d time.Duration) {
	if err := s.p.pause(); err != nil {
		w.note("%s: %v", f.Kind, err)
	}
	w.mark(f)
	time.Sleep(d)
	s.p.resume()
	w.end(f)
}

// killWorker ends a worker with SIGKILL and starts a new one in its place.
func (w *world) killWorker() {
	s := w.slots[w.rng.IntN(len(w.slots))]
	down := w.between(200*time.Millisecond, 2*time.Second)
	f := w.begin(kindKill, "", s.p.name)
	if err := s.p.kill(); err != nil {
		w.t.Fatalf("kill: %v", err)
	}
	w.mark(f)
	time.Sleep(down)
	if err := w.startWorker(s); err != nil {
		w.t.Fatalf("restarting %s: %v", s.p.name, err)
	}
	w.end(f)
}

// restartPostgres stops the server (fast: sessions ended cleanly;
// immediate: like a crash, recovery on start) and starts it again.
func (w *world) restartPostgres() {
	mode := "fast"
	if w.rng.IntN(2) == 0 {
		mode = "immediate"
	}
	down := w.between(0, 2*time.Second)
	f := w.begin(kindPGRestart, mode, "")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := w.pg.Stop(ctx, mode); err != nil {
		w.t.Fatalf("stopping PostgreSQL: %v", err)
	}
	w.mark(f)
	time.Sleep(down)
	if err := w.pg.Start(ctx); err != nil {
		w.t.Fatalf("starting PostgreSQL again: %v", err)
	}
	w.end(f)
}

// restartBroker stops the broker (SIGTERM: it saves and closes; SIGKILL: a
// crash) and starts it again on the same port and data directory.
func (w *world) restartBroker() {
	mode := "term"
	if w.rng.IntN(2) == 0 {
		mode = "kill"
	}
	down := w.between(200*time.Millisecond, 1500*time.Millisecond)
	b := w.broker
	f := w.begin(kindBrokerRst, mode, b.name)
	if mode == "term" {
		if err := b.stop(20 * time.Second); err != nil {
			w.note("broker restart: %v", err)
		}
	} else if err := b.kill(); err != nil {
		w.t.Fatalf("broker restart: %v", err)
	}
	w.mark(f) // acknowledged once the broker is back
	time.Sleep(down)
	if err := w.startBroker(); err != nil {
		w.t.Fatalf("restarting the broker: %v", err)
	}
	w.end(f)
}

// pauseInTx freezes a worker inside its batch transaction, holding the row
// locks of the export rows its batch wrote: the slot's worker is restarted
// (SIGTERM, then started again) with --hold-once before-commit, so that its
// first batch, once the handler has run and before the commit, logs
// "holding" and waits for SIGCONT (cmd/tenure/worker.go holdHooks); then it
// gets SIGSTOP, stays stopped past the session timeout, and SIGCONT, which
// resumes it and releases the hold: its commit must be refused, and the new
// owner's batches, which wait for those row locks, must not wait for the
// zombie. Who frees the locks is the mode:
//
//   - idle-timeout: the worker's default idle_in_transaction_session_timeout
//     (--handler-timeout 1s + 1s = 2s), which ends the frozen session before
//     the coordinator even moves its partitions (one session timeout);
//   - lock-watch: the worker is started with --idle-in-tx-timeout 60s, so
//     that only the new owner's lock watch (consumer/handoff.go: it ends the
//     session of an older claimant of its partition that blocks its batch)
//     lets the new owner's batches through.
//
// The fault is injected at the SIGSTOP; the restart before it is not part
// of it.
func (w *world) pauseInTx() {
	s := w.slots[w.rng.IntN(len(w.slots))]
	d := w.between(sessionTimeout+time.Second, sessionTimeout+4*time.Second)
	mode, flags := "idle-timeout", []string{"--hold-once", "before-commit"}
	if w.rng.IntN(2) == 0 {
		mode, flags = "lock-watch", append(flags, "--idle-in-tx-timeout", "60s")
	}
	if !w.restartHolding(s, kindPauseInTx, flags...) {
		return
	}
	w.freeze(w.begin(kindPauseInTx, mode+" "+d.Round(100*time.Millisecond).String(), s.p.name), s, d)
}

// nextReset picks the mode of the next group reset: from the seeded rng, each
// mode once before any comes again, so that a run with two resets has two
// modes.
func (w *world) nextReset() string {
	if len(w.resets) == 0 {
		w.resets = append([]string(nil), resetModes...)
		w.rng.Shuffle(len(w.resets), func(i, j int) { w.resets[i], w.resets[j] = w.resets[j], w.resets[i] })
	}
	m := w.resets[0]
	w.resets = w.resets[1:]
	return m
}

// deleteGroup ends the consumer group's lifetime: its epochs restart at 1,
// below the tokens Postgres holds, and the workers must get going on their
// own through a new incarnation, while nothing of the old lifetime is
// accepted once the new one has claimed (issue 7). The harness deletes the
// group with the Kafka API (DeleteGroups), not `tenure admin group delete`,
// so no incarnation is bumped beforehand: the workers must detect the reset
// themselves. The modes:
//
//   - graceful: every worker stopped (SIGTERM), the group deleted, the
//     workers started again;
//   - frozen: one worker SIGSTOPped first (a zombie holding partitions), the
//     others stopped; once the coordinator has evicted the zombie (one
//     session timeout) the group is deleted, the others start a new
//     lifetime, and only when it has claimed every partition does the
//     zombie get SIGCONT: its claims and commits must all be refused;
//   - live: deletion without stopping the workers first. Kafka (and kfake)
//     refuse DeleteGroups while the group has members (NON_EMPTY_GROUP), so
//     no operator can delete a group under members that heartbeat; what
//     "without stopping" can mean is members that never left: every worker
//     SIGKILLed (no LeaveGroup, no last mirror of offsets, transactions cut
//     off), the group deleted the moment the coordinator has expired the
//     last of them, and the workers started again at once;
//   - expiry: the group expires instead of being deleted: every worker
//     stopped (the group is empty, with the offsets the workers mirrored to
//     it), the broker's offset retention lowered to 1ms so that its
//     retention check (every 500ms here) expires the offsets and sweeps the
//     empty group, as Kafka does after offsets.retention.minutes; the
//     retention is put back and the workers started again. Nobody deleted
//     anything: to tenure the group and its committed offsets are just gone
//     (no divergence can be seen without them, docs/fencing.md).
func (w *world) deleteGroup() {
	mode := w.nextReset()
	switch mode {
	case resetFrozen:
		w.resetFrozen()
		return
	case resetLive:
		w.resetLive()
		return
	}
	f := w.begin(kindGroupDelete, mode, "")
	w.stopAll(w.slots, "group "+mode)
	w.mark(f)
	if mode == resetExpiry {
		w.expireGroup()
	} else {
		w.deleteWhenEmpty()
	}
	w.startAll(w.slots)
	w.end(f)
}

func (w *world) resetFrozen() {
	// The zombie must hold partitions (a worker that has just joined may
	// hold none yet): one of the workers whose claims are on fencing rows.
	candidates := w.holders()
	if len(candidates) == 0 {
		candidates = w.slots
	}
	z := candidates[w.rng.IntN(len(candidates))]
	f := w.begin(kindGroupDelete, resetFrozen, z.p.name)
	if err := z.p.pause(); err != nil {
		w.note("group frozen: %v", err)
	}
	var others []*slot
	for _, s := range w.slots {
		if s != z {
			others = append(others, s)
		}
	}
	w.stopAll(others, "group frozen")
	w.mark(f)
	w.deleteWhenEmpty() // once the coordinator has evicted the zombie
	restarted := time.Now()
	w.startAll(others)
	// The zombie wakes only once the new lifetime holds every partition:
	// the case the incarnation exists for.
	if err := w.waitClaimedSince(restarted, 60*time.Second); err != nil {
		w.note("group frozen: %v; resuming %s anyway", err, z.p.name)
	}
	z.p.resume()
	w.end(f)
}

func (w *world) resetLive() {
	f := w.begin(kindGroupDelete, resetLive, "")
	var wg sync.WaitGroup
	for _, s := range w.slots {
		wg.Add(1)
		go func(p *proc) {
			defer wg.Done()
			if err := p.kill(); err != nil {
				w.t.Errorf("group live: %v", err)
			}
		}(s.p)
	}
	wg.Wait()
	w.mark(f)
	w.deleteWhenEmpty()
	w.startAll(w.slots)
	w.end(f)
}

// holders are the slots whose current worker holds a partition: its lane's
// claim is on the partition's fencing row.
func (w *world) holders() []*slot {
	claimWorker, _ := w.book.claimants()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	rows, err := w.pool.Query(ctx, `SELECT claim_id FROM `+schemaName+`.fences WHERE consumer_group = $1 AND topic = $2`, groupName, topicName)
	if err != nil {
		return nil
	}
	held := map[string]bool{}
	var id int64
	if _, err := pgx.ForEachRow(rows, []any{&id}, func() error {
		held[claimWorker[id]] = true
		return nil
	}); err != nil {
		return nil
	}
	var out []*slot
	for _, s := range w.slots {
		if held[s.p.name] {
			out = append(out, s)
		}
	}
	return out
}

// stopAll stops the slots' workers gracefully, in parallel.
func (w *world) stopAll(slots []*slot, why string) {
	var wg sync.WaitGroup
	for _, s := range slots {
		wg.Add(1)
		go func(p *proc) {
			defer wg.Done()
			if err := p.stop(45 * time.Second); err != nil {
				w.note("%s: %v", why, err)
			}
		}(s.p)
	}
	wg.Wait()
}

func (w *world) startAll(slots []*slot) {
	for _, s := range slots {
		if err := w.startWorker(s); err != nil {
			w.t.Fatalf("starting %s again: %v", s.nextName(), err)
		}
	}
}

// deleteWhenEmpty deletes the group as soon as the coordinator lets it
// (it refuses while the group has members).
func (w *world) deleteWhenEmpty() {
	// A worker killed between its JoinGroup and SyncGroup can keep the group
	// non-empty until the rebalance timeout passes: kfake waits that long
	// for it, where Apache Kafka would drop it after the session timeout.
	// Wait past that.
	deadline := time.Now().Add(90 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := w.adm.DeleteGroup(ctx, groupName)
		cancel()
		if err == nil && resp.Err == nil {
			return
		}
		if err == nil && errors.Is(resp.Err, kerr.GroupIDNotFound) {
			w.note("group delete: the group did not exist any more")
			return
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("deleting group %s: %v / %v", groupName, err, resp.Err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// expireGroup lets the empty group expire: the broker's offset retention is
// lowered until its retention check has expired the group's offsets and
// swept the group, then put back.
func (w *world) expireGroup() {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if offs, err := w.adm.FetchOffsets(ctx, groupName); err == nil {
		n := 0
		offs.Each(func(kadm.OffsetResponse) { n++ })
		w.t.Logf("group expiry: the empty group has %d committed offsets (the workers' mirror)", n)
	}
	one := "1"
	if _, err := w.adm.AlterBrokerConfigs(ctx, []kadm.AlterConfig{{Op: kadm.SetConfig, Name: "offset.retention.ms", Value: &one}}); err != nil {
		w.t.Fatalf("group expiry: lowering the offset retention: %v", err)
	}
	defer func() {
		if _, err := w.adm.AlterBrokerConfigs(context.Background(), []kadm.AlterConfig{{Op: kadm.DeleteConfig, Name: "offset.retention.ms"}}); err != nil {
			w.t.Fatalf("group expiry: putting the offset retention back: %v", err)
		}
	}()
	for {
		lg, err := w.adm.ListGroups(ctx)
		if err == nil {
			if _, ok := lg[groupName]; !ok {
				return
			}
		}
		if ctx.Err() != nil {
			w.t.Fatalf("group expiry: group %s still there 60s after the retention was lowered (%v)", groupName, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitClaimedSince waits until every partition's fencing row was claimed
// after since (by the Postgres clock; one machine).
func (w *world) waitClaimedSince(since time.Time, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		var n int
		err := w.pool.QueryRow(ctx, `SELECT count(*) FROM `+schemaName+`.fences WHERE consumer_group = $1 AND topic = $2 AND claimed_at > $3`,
			groupName, topicName, since).Scan(&n)
		cancel()
		if err == nil && n == partitions {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d partitions claimed %s after the restart (%v)", n, partitions, timeout, err)
		}
		w.sleep(100 * time.Millisecond)
	}
}

// drain stops the producer and waits until every partition's stored next
// offset has reached the end of the log. It returns the log's end offsets
// and every record in the log.
func (w *world) drain() (map[int32]int64, map[int32][]*kgo.Record) {
	t := w.t
	t.Logf("faults done at +%s; draining", time.Since(w.start).Round(time.Millisecond))
	if err := w.prod.finish(60 * time.Second); err != nil {
		t.Errorf("%v", err)
	}
	w.markerWG.Wait()
	w.supervise()

	hwm := w.endOffsets()
	acked := w.prod.ackedEnd()
	for p := int32(0); p < partitions; p++ {
		if hwm[p] < acked[p] {
			t.Errorf("partition %d: the log ends at %d but offset %d was acknowledged: the broker lost jobs", p, hwm[p], acked[p]-1)
		}
	}

	drainStart := time.Now()
	deadline := drainStart.Add(90 * time.Second)
	for {
		w.trackOnce(context.Background())
		lost := w.brokerLostHolds()
		w.mu.Lock()
		var behind []string
		for p := int32(0); p < partitions; p++ {
			if _, ok := lost[p]; !ok && w.next[p] < hwm[p] {
				behind = append(behind, fmt.Sprintf("%d at %d of %d", p, w.next[p], hwm[p]))
			}
		}
		w.mu.Unlock()
		if len(behind) == 0 {
			t.Logf("caught up with the log in %s", time.Since(drainStart).Round(time.Millisecond))
			break
		}
		if time.Now().After(deadline) {
			w.dumpState("drain")
			t.Errorf("STUCK: partitions %s did not reach the end of the log within 90s of the end of the faults", strings.Join(behind, ", "))
			break
		}
		w.sleep(200 * time.Millisecond)
	}

	w.stopOperator() // before the broker stops: it acknowledges with the brokers' help
	records := w.readLog(hwm)
	if n, _, err := w.countSessions(context.Background()); err == nil {
		w.mu.Lock()
		w.sess.atDrain = n
		w.mu.Unlock()
	}

	// Stop everything gracefully: a worker that does not stop is a finding too.
	var wg sync.WaitGroup
	for _, s := range w.slots {
		wg.Add(1)
		go func(p *proc) {
			defer wg.Done()
			if err := p.stop(40 * time.Second); err != nil {
				w.note("final stop: %v", err)
			}
		}(s.p)
	}
	wg.Wait()
	// What the stopped workers leave behind: a session whose client
	// vanished during a cut lasts until a keepalive or a timeout ends it.
	time.Sleep(2 * time.Second)
	if left, err := w.leftoverSessions(context.Background()); err == nil {
		w.mu.Lock()
		w.sess.leftover = left
		w.mu.Unlock()
	} else {
		w.note("listing the sessions left once the workers had stopped: %v", err)
	}
	if err := w.broker.stop(20 * time.Second); err != nil {
		w.note("final stop: %v", err)
	}
	return hwm, records
}

// endOffsets lists the topic's high watermarks, retrying while the broker
// settles.
func (w *world) endOffsets() map[int32]int64 {
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		offs, err := w.adm.ListEndOffsets(ctx, topicName)
		cancel()
		if err == nil {
			out := map[int32]int64{}
			ok := true
			for p := int32(0); p < partitions; p++ {
				o, found := offs.Lookup(topicName, p)
				if !found || o.Err != nil {
					ok = false
					err = fmt.Errorf("partition %d: %v", p, o.Err)
					break
				}
				out[p] = o.Offset
			}
			if ok {
				return out
			}
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("listing end offsets: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// readLog reads every record of the topic below hwm.
func (w *world) readLog(hwm map[int32]int64) map[int32][]*kgo.Record {
	starts := map[int32]kgo.Offset{}
	for p := int32(0); p < partitions; p++ {
		starts[p] = kgo.NewOffset().AtStart()
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(w.brokerAddr),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topicName: starts}))
	if err != nil {
		w.t.Fatal(err)
	}
	defer cl.Close()
	out := map[int32][]*kgo.Record{}
	done := func() bool {
		for p := int32(0); p < partitions; p++ {
			n := len(out[p])
			if hwm[p] > 0 && (n == 0 || out[p][n-1].Offset < hwm[p]-1) {
				return false
			}
		}
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for !done() {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			w.t.Errorf("reading the log back: %v", ctx.Err())
			break
		}
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset < hwm[r.Partition] {
				out[r.Partition] = append(out[r.Partition], r)
			}
		})
	}
	return out
}

// dumpState logs what the harness knows when something is stuck: the
// fencing rows, the group, and the end of every worker's log.
func (w *world) dumpState(when string) {
	t := w.t
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var b strings.Builder
	fmt.Fprintf(&b, "state at %s (+%s):\n", when, time.Since(w.start).Round(time.Millisecond))
	rows, err := w.pool.Query(ctx, `SELECT partition, incarnation, epoch, owner, next_offset, claimed_at, committed_at FROM `+schemaName+`.fences WHERE consumer_group = $1 ORDER BY partition`, groupName)
	if err == nil {
		for rows.Next() {
			var p int32
			var inc int64
			var ep int32
			var owner string
			var next int64
			var claimed time.Time
			var committed *time.Time
			if rows.Scan(&p, &inc, &ep, &owner, &next, &claimed, &committed) == nil {
				fmt.Fprintf(&b, "  fence %d: token %d.%d owner %s next %d claimed %s committed %v\n", p, inc, ep, owner, next, claimed.Format("15:04:05.000"), committed)
			}
		}
		rows.Close()
	} else {
		fmt.Fprintf(&b, "  fences: %v\n", err)
	}
	if dg, err := w.adm.DescribeGroups(ctx, groupName); err == nil {
		for _, g := range dg {
			fmt.Fprintf(&b, "  group %s: state %s, protocol %s, %d members\n", g.Group, g.State, g.Protocol, len(g.Members))
			for _, m := range g.Members {
				a, _ := m.Assigned.AsConsumer()
				fmt.Fprintf(&b, "    member %s (%s): %v\n", m.MemberID, m.ClientID, a)
			}
		}
	} else {
		fmt.Fprintf(&b, "  describe group: %v\n", err)
	}
	if w.cfg.protocol == "consumer" {
		if cg, err := w.adm.DescribeConsumerGroups(ctx, groupName); err == nil {
			for _, g := range cg {
				fmt.Fprintf(&b, "  consumer group %s: state %s, epoch %d, assignment epoch %d, %d members, err %v\n",
					g.Group, g.State, g.Epoch, g.AssignmentEpoch, len(g.Members), g.Err)
				for _, m := range g.Members {
					fmt.Fprintf(&b, "    member %s (%s) epoch %d: assigned %v, target %v\n", m.MemberID, m.ClientID, m.MemberEpoch,
						m.Assignment.Sorted(), m.TargetAssignment.Sorted())
				}
			}
		} else {
			fmt.Fprintf(&b, "  describe consumer group: %v\n", err)
		}
	}
	for _, s := range w.slots {
		fmt.Fprintf(&b, "  ---- %s (pid %d, state %q), last lines:\n    %s\n", s.p.name, s.p.pid(), s.p.state(), strings.Join(s.p.lastLines(25), "\n    "))
	}
	t.Log(b.String())
	_ = os.WriteFile(filepath.Join(w.logDir, "state-"+when+".txt"), []byte(b.String()), 0o644)
}

// recordValue decodes a job's value.
func recordValue(r *kgo.Record) jobValue {
	var v jobValue
	_ = json.Unmarshal(r.Value, &v)
	return v
}

type pos struct {
	p   int32
	off int64
}

// checkAndReport loads the history from Postgres, runs the checker and the
// harness's own checks, and prints the summary.
//
// A violation is a broken promise (G1-G3, exactly once, a fault job not
// dead-lettered, a lost acknowledged job, an export that went backwards, a
// worker believing in a commit Postgres does not have) and fails the test. A
// finding is something the guarantee allows but nobody wants (a good job
// dead-lettered, a process that died on its own, a worker that would not
// stop): it is printed with its evidence and does not fail the run.
func (w *world) checkAndReport(hwm map[int32]int64, records map[int32][]*kgo.Record) {
	t := w.t
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	h, err := history.Load(ctx, w.pool, schemaName, groupName, false)
	if err != nil {
		t.Fatalf("loading the history: %v", err)
	}
	var violations, findings []string
	violate := func(format string, args ...any) { violations = append(violations, fmt.Sprintf(format, args...)) }
	find := func(format string, args ...any) { findings = append(findings, fmt.Sprintf(format, args...)) }

	w.mu.Lock()
	faults := append([]*fault(nil), w.faults...)
	unexpected := append([]string(nil), w.unexpected...)
	notes := append([]string(nil), w.notes...)
	w.mu.Unlock()
	sort.Slice(faults, func(i, j int) bool { return faults[i].Injected.Before(faults[j].Injected) })

	// 1. The log as it is: every record is a job the workers had to handle,
	// but for the offsets the harness deleted (delete-records), which are
	// not the log's any more: they are checked against the producer's
	// acknowledgements instead (checkDeleted), and left out of every check
	// below that compares the log with the producer or with the exports,
	// even where kfake shows some of them again (reappeared).
	dels := w.deletedRanges()
	produced := map[history.TopicPartition][]int64{}
	byPos := map[pos]*kgo.Record{}
	reappeared := map[int32][]int64{}
	for p := int32(0); p < partitions; p++ {
		tp := history.TopicPartition{Topic: topicName, Partition: p}
		var prev int64 = -1
		for _, r := range records[p] {
			if dels[p].contains(r.Offset) {
				reappeared[p] = append(reappeared[p], r.Offset)
				continue
			}
			for _, g := range dels[p].outside(prev+1, r.Offset) {
				violate("log: partition %d has no record at offsets [%d,%d)", p, g.from, g.to)
			}
			prev = r.Offset
			produced[tp] = append(produced[tp], r.Offset)
			byPos[pos{p, r.Offset}] = r
		}
		if len(dels[p].outside(prev+1, hwm[p])) > 0 {
			violate("log: partition %d read up to %d, the log ends at %d", p, prev+1, hwm[p])
		}
	}

	// 2. The checker over the whole history: G1-G3, exactly once, exports.
	checked := h.Check(produced)
	for _, v := range checked {
		violate("history: %s", v)
	}
	// 2b. The coordinator's side: once the claim of a newer assignment
	// (as the workers logged being given the partition) was accepted,
	// nothing made for an older one may be, whatever the tokens say. This
	// is the check that does not trust the incarnation: a reset the
	// protocol failed to notice shows up here even when CheckLog is
	// satisfied by the tokens.
	//
	// Unmatched entries (a claim or commit whose claim id no worker logged
	// as "claiming partition") cannot be checked, so they are reported, as
	// a line in the summary and a finding (the logs are kept), not as
	// violations: a lane logs that line before its first claim, and the
	// harness reads every worker's stderr to its end, a SIGKILLed worker's
	// too (what it wrote is in the pipe), so there should be none. One
	// means that a log line went missing, or that something claimed outside
	// the assignment path: either way the evidence has a gap that someone
	// should read, but no promise is shown to be broken, and CheckLog above
	// still checks those entries' tokens.
	claimWorker, assignments := w.book.claimants()
	owned, unmatched := history.CheckOwnership(h.Log, assignments)
	for _, v := range owned {
		violate("ownership: %s", v)
	}
	for i, u := range unmatched {
		if i == 10 {
			find("... and %d more fence log entries that match no logged assignment", len(unmatched)-10)
			break
		}
		find("fence log entry #%d (%s of partition %d by %q, token %s, claim id %d) matches no assignment a worker logged",
			u.ID, u.Kind, u.Partition.Partition, u.Owner, u.Token, u.ClaimID)
	}
	var strictLine string
	// 2c. Strict hand-off (-chaos.strict): no batch became visible unless
	// the coordinator accepted its offset commit while its assignment was
	// current, the decisions recorded agree with the fence log, and none
	// is left prepared. A group's deletion, or a broker SIGKILL (kfake may
	// lose the committed offsets it had acknowledged), can take away an
	// accepted commit's record: such runs do not hold G3-record to it.
	if w.cfg.strict {
		wiped := slices.ContainsFunc(w.faults, func(f *fault) bool { return f.Kind == kindGroupDelete || f.Kind == kindBrokerRst })
		events := w.book.strictEvents()
		for _, v := range history.CheckStrict(h, assignments, events, w.cfg.protocol == "classic", wiped) {
			violate("strict: %s", v)
		}
		decided := map[string]int{}
		for _, d := range h.StrictDecisions {
			k := "rolled back"
			if d.Committed {
				k = "committed"
			}
			if d.ByResolver {
				k += " by a later claim"
			}
			decided[k]++
		}
		strictLine = fmt.Sprintf("strict:      %d strict log lines (offset commits sent and answered, assignments ended); decisions %v; %d left prepared; G3-record excused by a group deletion or broker restart: %v\n",
			len(events), decided, len(h.Prepared), wiped)
	}
	fenceNext := map[int32]int64{}
	for _, f := range h.Fences {
		fenceNext[f.Partition.Partition] = f.NextOffset
	}
	lost := w.brokerLostHolds()
	for p := int32(0); p < partitions; p++ {
		if fenceNext[p] == hwm[p] {
			continue
		}
		if hd, ok := lost[p]; ok {
			find("partition %d: held ahead-of-log since %s: after the broker's SIGKILL at %s its log ended at %d, below the stored next offset %d (kfake lost records it had served); tenure held it, as it must, until an operator acknowledges it (not processed since: stored %d, the log ends at %d)",
				p, hd.since.Format("15:04:05.000"), hd.kill.Injected.Format("15:04:05.000"), hd.end, hd.next, fenceNext[p], hwm[p])
			continue
		}
		violate("partition %d: stored next offset %d, the log ends at %d", p, fenceNext[p], hwm[p])
	}

	// 3. Fault jobs dead-lettered; good jobs exported; effects belong to
	// their job.
	writes := map[pos][]history.Write{}
	for _, wr := range h.Writes {
		writes[pos{wr.Partition, wr.Offset}] = append(writes[pos{wr.Partition, wr.Offset}], wr)
	}
	dead := map[pos]int{}
	for _, d := range h.DeadLetters {
		dead[pos{d.Partition, d.Offset}]++
	}
	dls := w.deadLetters(ctx)
	acked, failed := w.prod.snapshot()
	// The deleted jobs: each processed once or declared lost by a hold.
	// Those processed are judged below as the log's jobs are.
	deleted := w.checkDeleted(acked, dels, reappeared, writes, dead, h.Log)
	for _, v := range deleted.violations {
		violate("deleted jobs: %s", v)
	}
	for _, f := range deleted.findings {
		find("%s", f)
	}
	type jobAt struct {
		key string
		v   jobValue
	}
	jobs := map[pos]jobAt{}
	for ps, r := range byPos {
		jobs[ps] = jobAt{string(r.Key), recordValue(r)}
	}
	for ps, j := range deleted.done {
		jobs[ps] = jobAt{j.Key, jobValue{Seq: j.Seq, Key: j.Key, Marker: j.Marker, Fault: j.Fault}}
	}
	var faultJobs, faultErr, faultPanic int
	goodDead := map[string]int{} // by the latest fault before it
	newest := map[string]int64{} // per key, the newest exported job's offset
	for ps, r := range jobs {
		if ps.off >= fenceNext[ps.p] {
			continue // not processed (a stuck partition, reported above)
		}
		v := r.v
		if v.Fault != "" {
			faultJobs++
			if v.Fault == "error" {
				faultErr++
			} else {
				faultPanic++
			}
			if dead[ps] != 1 || len(writes[ps]) != 0 {
				violate("fault job %s/%d/%d (%s): %d dead letters, %d effects; want 1 dead letter and no effect", topicName, ps.p, ps.off, v.Fault, dead[ps], len(writes[ps]))
			}
			continue
		}
		for _, wr := range writes[ps] {
			if wr.Key != r.key {
				violate("effect at %d/%d is for key %q, the job's key is %q", ps.p, ps.off, wr.Key, r.key)
			}
		}
		if dead[ps] > 0 {
			d := dls[ps]
			after := "no fault"
			if f := latestFault(faults, d.at); f != nil {
				after = fmt.Sprintf("%s %s +%s", f.Kind, f.Target, d.at.Sub(f.Injected).Round(time.Millisecond))
				goodDead[f.Kind]++
			} else {
				goodDead["none"]++
			}
			find("good job %s/%d/%d (key %s) was dead-lettered at %s (after %s) by %s: %q after %d attempts",
				topicName, ps.p, ps.off, r.key, d.at.Format("15:04:05.000"), after, d.owner, d.err, d.attempts)
			continue
		}
		if o, ok := newest[r.key]; !ok || ps.off > o {
			newest[r.key] = ps.off
		}
	}

	// 4. Every acknowledged job is in the log where the broker said, but for
	// the jobs the harness deleted (checked above).
	seqs := map[int64]int{}
	for _, r := range byPos {
		seqs[recordValue(r).Seq]++
	}
	ackedPos := map[pos]bool{}
	for _, j := range acked {
		if dels[j.Partition].contains(j.Offset) {
			continue
		}
		ackedPos[pos{j.Partition, j.Offset}] = true
		r := byPos[pos{j.Partition, j.Offset}]
		if r == nil || recordValue(r).Seq != j.Seq {
			violate("acknowledged job seq %d at %d/%d is not in the log there", j.Seq, j.Partition, j.Offset)
		}
	}
	var unacked, dupSeq int
	for ps := range byPos {
		if !ackedPos[ps] {
			unacked++
		}
	}
	for _, n := range seqs {
		if n > 1 {
			dupSeq += n - 1
		}
	}
	if unacked > 0 || dupSeq > 0 || len(failed) > 0 {
		find("producer/broker: %d records in the log were never acknowledged, %d seqs are in the log more than once, %d produce errors %v",
			unacked, dupSeq, len(failed), failed[:min(3, len(failed))])
	}

	// 5. Each key's visible export is its newest exported job.
	for key, off := range w.finalExports(ctx) {
		if want, ok := newest[key]; ok && off != want {
			violate("key %s: the export shows the job at offset %d, its newest exported job is at %d", key, off, want)
		}
	}

	// 6. What the workers logged agrees with what Postgres recorded.
	type commitKey struct {
		p        int32
		token    string
		owner    string
		from, to int64
	}
	inLog := map[commitKey]bool{}
	var commits, claims int
	for _, e := range h.Log {
		if e.Kind == "commit" {
			commits++
			inLog[commitKey{e.Partition.Partition, e.Token.String(), e.Owner, e.From, e.To}] = true
		} else {
			claims++
		}
	}
	w.book.mu.Lock()
	for _, c := range w.book.commits {
		if !inLog[commitKey{c.Partition, c.Token, c.Member, c.From, c.To}] {
			violate("a worker logged a commit the fence log does not have: %s", c)
		}
	}
	for _, c := range w.book.rejections {
		if inLog[commitKey{c.Partition, c.Token, c.Member, c.From, c.To}] {
			violate("a worker logged a rejection of a batch the fence log has as committed: %s", c)
		}
	}
	for job := range w.book.deadLetters {
		var p int32
		var off int64
		if _, err := fmt.Sscanf(strings.TrimPrefix(job, topicName+"/"), "%d/%d", &p, &off); err != nil || dead[pos{p, off}] == 0 {
			violate("a worker logged dead letter %s, the dead-letter table does not have it", job)
		}
	}
	rejections := append(append([]batchEvent(nil), w.book.rejections...), w.book.claimFenced...)
	book := struct {
		lines, unparsed, batchRej, claimRej, incarnations, incSeen, panics, lost, loggedCommits int
		unknown                                                                                 map[string]int
	}{w.book.lines, w.book.unparsed, len(w.book.rejections), len(w.book.claimFenced), w.book.incarnations, w.book.incSeen,
		w.book.panics, w.book.lost, len(w.book.commits), w.book.unknown}
	w.book.mu.Unlock()
	for _, u := range unexpected {
		find("unexpected exit: %s", u)
	}
	for _, n := range notes {
		find("%s", n)
	}

	// 7. Hand-off latency of kills and pauses (measured, not asserted).
	byPart, err := w.fenceEntries(ctx)
	if err != nil {
		t.Errorf("reading the fence log for the hand-offs: %v", err)
	}
	ho := handoffsOf(byPart, faults, claimWorker)
	for _, l := range ho.slow {
		find("%s", l)
	}
	// 8. Network faults: hand-offs (a miss is a finding), step-downs and
	// rejoins, zombies, commits cut in the middle.
	nr := w.networkReport(faults, byPart, claimWorker)
	for _, l := range nr.findings {
		find("%s", l)
	}
	w.mu.Lock()
	sess := w.sess
	w.mu.Unlock()

	// The summary.
	var total int64
	for p := int32(0); p < partitions; p++ {
		total += hwm[p]
	}
	var s strings.Builder
	mode := ""
	if w.cfg.strict {
		mode = " (strict hand-off)"
	}
	fmt.Fprintf(&s, "==== chaos summary: seed %d, %d workers, %s protocol%s, %s of faults, %d jobs/s, %d partitions, run took %s\n",
		w.cfg.seed, w.cfg.workers, w.cfg.protocol, mode, w.cfg.duration, w.cfg.rate, partitions, time.Since(w.start).Round(time.Second))
	fmt.Fprintf(&s, "jobs:        %d in the log (%d acknowledged, %d produce errors, %d unacknowledged, %d duplicate seqs); %d exported, %d dead-lettered\n",
		total, len(acked), len(failed), unacked, dupSeq, len(h.Writes), len(h.DeadLetters))
	fmt.Fprintf(&s, "fault jobs:  %d (%d error, %d panic), each must be dead-lettered; good jobs dead-lettered: %d %v\n",
		faultJobs, faultErr, faultPanic, sumMap(goodDead), goodDead)
	s.WriteString(deleted.summary())
	fmt.Fprintf(&s, "history:     %d claims, %d commits in the fence log; %d incarnation bumps (seen by %d claims)\n", claims, commits, book.incarnations, book.incSeen)
	s.WriteString(strictLine)
	fmt.Fprintf(&s, "rejections:  %d batches fenced, %d claims fenced; %d partitions-lost events; %d commits of unknown outcome %v; %d handler panics\n",
		book.batchRej, book.claimRej, book.lost, sumMap(book.unknown), book.unknown, book.panics)
	fmt.Fprintf(&s, "faults:      %d injected", len(faults))
	for _, k := range w.kinds() {
		fmt.Fprintf(&s, ", %s %d", k, countKind(faults, k))
	}
	fmt.Fprintf(&s, "; unexpected process exits %d\n", len(unexpected))
	fmt.Fprintf(&s, "recovery:    time until every partition has processed a job produced once the fault was in effect\n")
	kw := kindWidth(tableRows(w.kinds()))
	fmt.Fprintf(&s, "  %-*s %5s %23s %23s %11s %11s\n", kw, "kind", "count", "from injection p50/max", "from fault end p50/max", "unrecovered", "rejections")
	for _, k := range tableRows(w.kinds()) {
		var fromInj, fromEnd []time.Duration
		unrec, n := 0, 0
		for _, f := range faults {
			if f.row() != k {
				continue
			}
			n++
			if f.Recovered.IsZero() {
				unrec++
				continue
			}
			fromInj = append(fromInj, f.Recovered.Sub(f.Injected))
			fromEnd = append(fromEnd, max(0, f.Recovered.Sub(f.Ended)))
		}
		fmt.Fprintf(&s, "  %-*s %5d %23s %23s %11d %11d\n", kw, k, n, p50max(fromInj), p50max(fromEnd), unrec, rejectionsAfter(faults, k, rejections))
	}
	fmt.Fprintf(&s, "hand-off:    from the fault (SIGKILL, SIGSTOP) to the first commit by a new owner of each partition the worker held then (Postgres's clock); "+
		"target max <= %s (session timeout + 2s); overlapped: another fault was injected before the new owner's commit (apart: not in the target)\n", handoffTarget)
	fmt.Fprintf(&s, "  %-*s %5s %9s %9s %9s %8s %14s %10s %14s\n", kw, "kind", "count", "p50", "p99", "max", "target", "not handed off", "overlapped", "overlapped max")
	for _, k := range tableRows(w.kinds()) {
		if !slices.Contains(handoffKinds, strings.Split(k, "/")[0]) {
			continue
		}
		ds := ho.took[k]
		within := "-"
		if len(ds) > 0 {
			within = "met"
			if slices.Max(ds) > handoffTarget {
				within = "MISSED"
			}
		}
		fmt.Fprintf(&s, "  %-*s %5d %9s %9s %9s %8s %14d %10d %14s\n", kw, k, len(ds), pct(ds, 50), pct(ds, 99), pct(ds, 100), within, ho.none[k],
			len(ho.overlapped[k]), pct(ho.overlapped[k], 100))
	}
	s.WriteString(nr.summary(w, sess))
	fmt.Fprintf(&s, "ownership:   %d fence log entries checked against %d assignments the workers logged; %d unmatched\n",
		len(h.Log), len(assignments), len(unmatched))
	s.WriteString(w.failoverSummary())
	fmt.Fprintf(&s, "violations:  %d (history checker %d, ownership %d, deleted jobs %d, harness checks %d)\n", len(violations), len(checked), len(owned),
		len(deleted.violations), len(violations)-len(checked)-len(owned)-len(deleted.violations))
	fmt.Fprintf(&s, "findings:    %d (allowed by the guarantee, listed in the test log)\n", len(findings))
	fmt.Fprintf(&s, "worker logs: %d lines (%d not JSON), %d commits logged; most frequent warnings and errors:\n", book.lines, book.unparsed, book.loggedCommits)
	for _, l := range w.book.topMessages(8) {
		fmt.Fprintf(&s, "  %s\n", l)
	}
	fmt.Fprintf(&s, "replay:      %s\n", w.replay())
	summary := s.String()

	var tl strings.Builder
	for _, f := range faults {
		fmt.Fprintf(&tl, "+%-9s %s\n", f.Injected.Sub(w.start).Round(time.Millisecond), f)
	}
	var fl strings.Builder
	for _, f := range findings {
		fmt.Fprintf(&fl, "FINDING: %s\n", f)
	}
	_ = os.WriteFile(filepath.Join(w.logDir, "timeline.txt"), []byte(tl.String()+fl.String()), 0o644)
	_ = os.WriteFile(filepath.Join(w.logDir, "summary.txt"), []byte(summary), 0o644)

	t.Logf("timeline:\n%s", tl.String())
	if len(findings) > 0 {
		w.keepLogs = true
		t.Logf("findings (%d, first 30):\n%s", len(findings), strings.Join(findings[:min(30, len(findings))], "\n"))
	}
	t.Log("\n" + summary)
	fmt.Print(summary)
	for i, v := range violations {
		if i == 50 {
			t.Errorf("... and %d more", len(violations)-50)
			break
		}
		t.Errorf("VIOLATION: %s", v)
	}
	for _, f := range faults {
		if f.MarkErr != nil {
			t.Errorf("fault %s: its markers could not be produced: %v", f, f.MarkErr)
		}
	}
	if t.Failed() {
		t.Logf("replay with: %s", w.replay())
	}
}

// replay is the command that runs this run's fault schedule again.
func (w *world) replay() string {
	s := fmt.Sprintf("go test ./integration/chaos -run TestChaos -v -timeout 0 -chaos.seed %d -chaos.duration %s -chaos.workers %d -chaos.protocol %s -chaos.rate %d",
		w.cfg.seed, w.cfg.duration, w.cfg.workers, w.cfg.protocol, w.cfg.rate)
	if w.ha != nil {
		s += " -chaos.postgres formation"
	}
	if w.cfg.strict {
		s += " -chaos.strict"
	}
	return s
}

// kinds are the fault kinds this run deals (its deck's), in kinds' order:
// the summary's rows.
func (w *world) kinds() []string {
	d := w.deck()
	var out []string
	for _, k := range kinds {
		if slices.Contains(d, k) {
			out = append(out, k)
		}
	}
	return out
}

// row is the fault's line in the summary's tables: its kind, with group
// resets by mode, pauses inside a transaction by who frees their locks, and
// deletions of records by mode.
func (f *fault) row() string {
	switch f.Kind {
	case kindGroupDelete:
		return f.Kind + "/" + f.Mode
	case kindPauseInTx:
		mode, _, _ := strings.Cut(f.Mode, " ")
		return f.Kind + "/" + mode
	case kindDeleteRecs:
		return f.Kind + "/" + f.Mode
	}
	if f.Net != nil && f.Net.mode != "" {
		return f.Kind + "/" + f.Net.mode
	}
	return f.Kind
}

// kindWidth is the width of the summary tables' kind column.
func kindWidth(rows []string) int {
	n := 24
	for _, r := range rows {
		n = max(n, len(r))
	}
	return n
}

func tableRows(kinds []string) []string {
	var out []string
	for _, k := range kinds {
		switch k {
		case kindGroupDelete:
			for _, m := range resetModes {
				out = append(out, k+"/"+m)
			}
		case kindPauseInTx:
			out = append(out, k+"/idle-timeout", k+"/lock-watch")
		case kindDeleteRecs:
			for _, m := range deleteModes {
				out = append(out, k+"/"+m)
			}
		case kindPartPG, kindPartOneWay:
			for _, m := range netModes[k] {
				out = append(out, k+"/"+m)
			}
		default:
			out = append(out, k)
		}
	}
	return out
}

// aheadOfLog is an open ahead-of-log hold: the stored next offset, the
// log's end as the worker found it, when, and the broker SIGKILL before it.
type aheadOfLog struct {
	next, end int64
	since     time.Time
	kill      *fault
}

// brokerLostHolds returns, by partition, the open ahead-of-log holds that a
// broker SIGKILL explains: kfake, SIGKILLed, has come back with a log shorter
// than what it had served (a soak saw two partitions end 1 and 2 records
// below offsets the workers had processed), where Kafka keeps what it
// appended across a process kill. tenure must then hold the partition until
// an operator acknowledges it: the guarantee working, not a stuck
// partition. Such a hold names a log end below the stored offset and came
// within a minute after a broker SIGKILL; any other hold is not excused.
func (w *world) brokerLostHolds() map[int32]aheadOfLog {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w.mu.Lock()
	faults := append([]*fault(nil), w.faults...)
	w.mu.Unlock()
	out := map[int32]aheadOfLog{}
	for p, h := range w.aheadOfLogHolds(ctx) {
		if h.end >= 0 && h.end < h.next {
			if h.kill = brokerKillBefore(faults, h.since, time.Minute); h.kill != nil {
				out[p] = h
			}
		}
	}
	return out
}

// aheadOfLogHolds reads the open ahead-of-log holds, by partition.
func (w *world) aheadOfLogHolds(ctx context.Context) map[int32]aheadOfLog {
	out := map[int32]aheadOfLog{}
	store, err := sink.NewStore(w.pool, schemaName)
	if err == nil {
		var hs []sink.Hold
		if hs, err = store.OpenHolds(ctx, groupName); err == nil {
			for _, h := range hs {
				if h.Kind == sink.HoldAheadOfLog && h.Partition.Topic == topicName {
					out[h.Partition.Partition] = aheadOfLog{next: h.NextOffset, end: h.HighWatermark, since: h.Since}
				}
			}
		}
	}
	if err != nil {
		w.t.Errorf("reading the holds: %v", err)
	}
	return out
}

// brokerKillBefore returns the latest broker SIGKILL injected at most within
// before at, the broker back before at (a hold judged against the restarted
// log), or nil.
func brokerKillBefore(faults []*fault, at time.Time, within time.Duration) *fault {
	var k *fault
	for _, f := range faults {
		if f.Kind == kindBrokerRst && f.Mode == "kill" && !f.Ended.IsZero() && f.Ended.Before(at) && at.Sub(f.Injected) <= within {
			k = f
		}
	}
	return k
}

// handoffTarget is issue 16's bound on a hand-off: the coordinator notices a
// dead or frozen member after one session timeout; two seconds more for the
// rebalance, the claim and the first batch.
const handoffTarget = sessionTimeout + 2*time.Second

type handoffs struct {
	// per table row (fault.row), one per (fault, partition) with no other
	// fault injected until the new owner's commit: what the target is about
	took map[string][]time.Duration
	none map[string]int // per row, (fault, partition) pairs with no commit by a new owner
	// per row, the hand-offs during which another fault was injected (a
	// Postgres or broker restart, say, that the new owner waited for): shown
	// apart, since their time is the other fault's too
	overlapped map[string][]time.Duration
	slow       []string // the hand-offs above the target, for the findings
}

// handoffsOf measures, for each kill, pause and pause-in-tx, the time from the
// fault (the SIGKILL or SIGSTOP) to the first commit by a new owner of each
// partition the target held at that instant, from tenure's side: the fence
// log's commit times (clock_timestamp() of the commit statement, the
// harness and Postgres share a clock). The holder of a partition at the
// instant is the claimant of its last accepted claim before it (the fence
// log), and that claim's lane belongs to the target process if the target
// logged its claim id ("claiming partition"); a new owner is any other
// claim, the target's own after it rejoined included (a new lane the
// coordinator gave the partition to). Measuring commits, not the harness's
// markers, keeps the producer's own stalls out of it.
func handoffsOf(byPart map[int32][]fenceEntry, faults []*fault, claimWorker map[int64]string) handoffs {
	ho := handoffs{took: map[string][]time.Duration{}, none: map[string]int{}, overlapped: map[string][]time.Duration{}}
	for _, f := range faults {
		if !slices.Contains(handoffKinds, f.Kind) {
			continue
		}
		for p := int32(0); p < partitions; p++ {
			es := byPart[p]
			held := heldAt(es, f.Injected)
			if held < 0 || claimWorker[es[held].claimID] != f.Target {
				continue
			}
			found := false
			for _, e := range es[held+1:] {
				if e.kind == "commit" && e.claimID != es[held].claimID && e.at.After(f.Injected) {
					d := e.at.Sub(f.Injected)
					// Faults injected while the partition was between owners.
					var during []string
					for _, g := range faults {
						if g.Injected.After(f.Injected) && g.Injected.Before(e.at) {
							during = append(during, fmt.Sprintf("%s +%s", g.row(), g.Injected.Sub(f.Injected).Round(time.Millisecond)))
						}
					}
					if len(during) > 0 {
						ho.overlapped[f.row()] = append(ho.overlapped[f.row()], d)
					} else {
						ho.took[f.row()] = append(ho.took[f.row()], d)
					}
					if d > handoffTarget {
						msg := fmt.Sprintf("hand-off of partition %d after %s took %s (target %s): new owner %s",
							p, f, d.Round(time.Millisecond), handoffTarget, claimWorker[e.claimID])
						if len(during) > 0 {
							msg += "; faults injected meanwhile: " + strings.Join(during, ", ")
						}
						ho.slow = append(ho.slow, msg)
					}
					found = true
					break
				}
			}
			if !found {
				ho.none[f.row()]++
			}
		}
	}
	return ho
}

// pct is the q-th percentile (nearest rank) of ds.
func pct(ds []time.Duration, q int) string {
	if len(ds) == 0 {
		return "-"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (q*len(s)+99)/100 - 1
	return s[max(0, i)].Round(10 * time.Millisecond).String()
}

// latestFault is the last fault injected at or before at.
func latestFault(fs []*fault, at time.Time) *fault {
	var latest *fault
	for _, f := range fs {
		if !f.Injected.After(at) {
			latest = f
		}
	}
	return latest
}

type deadLetter struct {
	err      string
	attempts int
	owner    string
	at       time.Time
}

// deadLetters reads why and when each job was parked.
func (w *world) deadLetters(ctx context.Context) map[pos]deadLetter {
	out := map[pos]deadLetter{}
	rows, err := w.pool.Query(ctx, `SELECT partition, job_offset, error, attempts, owner, dead_at FROM `+schemaName+`.dead_letters WHERE consumer_group = $1`, groupName)
	if err != nil {
		w.t.Errorf("reading dead letters: %v", err)
		return out
	}
	defer rows.Close()
	for rows.Next() {
		var p int32
		var off int64
		var d deadLetter
		if rows.Scan(&p, &off, &d.err, &d.attempts, &d.owner, &d.at) == nil {
			out[pos{p, off}] = d
		}
	}
	return out
}

// finalExports is each key's visible export: the offset of its job.
func (w *world) finalExports(ctx context.Context) map[string]int64 {
	out := map[string]int64{}
	rows, err := w.pool.Query(ctx, `SELECT job_key, job_offset FROM `+schemaName+`.exports WHERE topic = $1`, topicName)
	if err != nil {
		w.t.Errorf("reading exports: %v", err)
		return out
	}
	defer rows.Close()
	for rows.Next() {
		var k string
		var off int64
		if rows.Scan(&k, &off) == nil {
			out[k] = off
		}
	}
	return out
}

func countKind(fs []*fault, kind string) int {
	n := 0
	for _, f := range fs {
		if f.Kind == kind {
			n++
		}
	}
	return n
}

// rejectionsAfter counts the rejections logged while a fault of kind was the
// latest one injected.
func rejectionsAfter(fs []*fault, row string, rej []batchEvent) int {
	n := 0
	for _, r := range rej {
		if f := latestFault(fs, r.At); f != nil && f.row() == row {
			n++
		}
	}
	return n
}

func p50max(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return fmt.Sprintf("%s / %s", ds[(len(ds)-1)/2].Round(10*time.Millisecond), ds[len(ds)-1].Round(10*time.Millisecond))
}

func sumMap(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
