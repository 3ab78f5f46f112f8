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

	"github.com/tenure-dev/tenure/internal/testinfra/netfault"
	"github.com/tenure-dev/tenure/internal/testinfra/pgtest"
	"github.com/tenure-dev/tenure/internal/tick"
)

const (
	initialPartitions = 6 // the topic's count at the start; add-partitions grows it
	nkeys             = 36
	sessionTimeout    = 3 * time.Second
	schemaName        = "tenure_chaos"
	groupName         = "chaos-workers"
	topicName         = "chaos-jobs"

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
	kindOffsetsReset, kindAddParts, kindRolling, // offsetsreset_test.go, addpartitions_test.go, rolling_test.go
	kindPartKafka, kindPartPG, kindPartOneWay, kindPartFull, kindPartMulti} // the last five: network_test.go

// deck is one round of faults; each round is shuffled, so that every kind
// comes up in every round.
var deck = []string{kindPause, kindPause, kindPauseInTx, kindKill, kindKill, kindPGRestart, kindBrokerRst, kindGroupDelete, kindDeleteRecs,
	kindOffsetsReset, kindAddParts, kindRolling,
	kindPartKafka, kindPartPG, kindPartOneWay, kindPartFull, kindPartMulti}

// Group reset modes, the group-delete fault's Mode: how the
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

	// How the slot's next worker is started (the harness's goroutine):
	strict bool   // with --strict (-chaos.strict; rolling-restart toggles it)
	dbURL  string // its --database-url, if not the run's (partition-multi-host)
}

// world is one chaos run.
type world struct {
	t      *failT // the run's *testing.T, keeping its first failure
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

	live      liveness       // the liveness check (liveness_test.go)
	offResets []*offsetReset // the offsets resets the harness made (offsetsreset_test.go)
	added     []*addition    // the topic's growths (addpartitions_test.go)
	rolls     []*roll        // the rolling restarts (rolling_test.go)
}

func TestChaos(tt *testing.T) {
	t := &failT{T: tt}
	// Registered first, so it runs last: the output's last line says why.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("chaos run failed: %s", t.reason())
		}
	})
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
		cfg.seed, cfg.workers, cfg.protocol, cfg.duration, cfg.rate, initialPartitions, cfg.seed)
	w.setup()
	w.inject()
	w.acknowledgeLeftovers()
	hwm, records := w.drain()
	w.checkFailovers()
	w.checkAndReport(hwm, records)
}

// setup starts PostgreSQL, the broker, the workers and the producer, and
// waits until every partition has made progress. Each step registers its
// own cleanups, in this order.
func (w *world) setup() {
	t := w.t
	w.makeLogDir()
	if w.cfg.postgres == postgresFormation {
		w.startFormation() // before the 60s context: a formation takes longer to start
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if w.ha == nil {
		w.startThrowawayPostgres(ctx)
	}
	// Every process is ended by its PID, after SIGCONT, whatever happens.
	t.Cleanup(w.killAll)
	w.connectPostgres(ctx)
	port := w.startKafka()
	w.startWorkers(port)
	w.startBackground()
	w.warmUp()
	t.Logf("warm-up done in %s; injecting faults for %s", time.Since(w.start).Round(time.Millisecond), w.cfg.duration)
}

// makeLogDir makes the run's directory, kept if the run fails or is asked
// to keep it.
func (w *world) makeLogDir() {
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
}

// startThrowawayPostgres starts the run's own PostgreSQL (not a formation).
func (w *world) startThrowawayPostgres(ctx context.Context) {
	t := w.t
	var err error
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

// connectPostgres migrates the schema, opens the harness's pool and starts
// sampling the workers' sessions.
func (w *world) connectPostgres(ctx context.Context) {
	t := w.t
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
}

// startKafka starts the broker on a free port, the admin client and the
// producer; it returns the port.
func (w *world) startKafka() int {
	t := w.t
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	w.brokerAddr = fmt.Sprintf("127.0.0.1:%d", port)
	w.brokerArgs = []string{"broker", "--listen", w.brokerAddr, "--data-dir", filepath.Join(w.logDir, "broker-data"),
		"--topic", topicName, "--partitions", strconv.Itoa(initialPartitions),
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

	w.prod, err = newProducer([]string{w.brokerAddr}, topicName, initialPartitions, nkeys)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.prod.cl.Close)
	return port
}

// startWorkers starts the workers behind their network (port is the
// broker's).
func (w *world) startWorkers(port int) {
	t := w.t
	for i := 1; i <= w.cfg.workers; i++ {
		w.slots = append(w.slots, &slot{n: i, strict: w.cfg.strict})
	}
	w.setupNetwork(port)
	var err error
	if w.live.bound, err = boundOf(w.workerArgs(w.slots[0], "w1.0")); err != nil {
		t.Fatalf("the liveness bound from the worker flags: %v", err)
	}
	for _, s := range w.slots {
		if err := w.startWorker(s); err != nil {
			t.Fatal(err)
		}
	}
}

// startBackground starts the fence tracker, the operator, the liveness
// check and the producer.
func (w *world) startBackground() {
	t := w.t
	w.trackerDone = make(chan struct{})
	trackCtx, stopTracking := context.WithCancel(context.Background())
	t.Cleanup(func() { stopTracking(); <-w.trackerDone })
	go w.track(trackCtx)
	w.startOperator()
	w.startLiveness()
	go w.prod.run(w.cfg.rate, rand.New(rand.NewPCG(uint64(w.cfg.seed), 2)))
	t.Cleanup(w.prod.halt) // a run that fails early stops producing too
}

// warmUp waits until every partition is claimed and past its first jobs.
func (w *world) warmUp() {
	deadline := time.Now().Add(60 * time.Second)
	for {
		w.mu.Lock()
		n, ok := len(w.next), true
		for p := int32(0); p < initialPartitions; p++ {
			if w.next[p] == 0 {
				ok = false
			}
		}
		w.mu.Unlock()
		if n == initialPartitions && ok {
			return
		}
		if time.Now().After(deadline) {
			w.dumpState("warm-up")
			w.t.Fatalf("the workers did not start processing every partition within 60s")
		}
		w.supervise()
		time.Sleep(100 * time.Millisecond)
	}
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
	args := w.workerArgs(s, name, extra...)
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

// workerArgs is the command line of slot s's worker process name, with
// extra flags; the liveness bound is read from it (boundOf).
func (w *world) workerArgs(s *slot, name string, extra ...string) []string {
	url := w.dbURL()
	if s.dbURL != "" {
		url = s.dbURL
	}
	args := []string{"worker",
		"--brokers", w.brokerAddr, "--group", groupName, "--topic", topicName,
		"--database-url", url, "--schema", schemaName, "--no-migrate",
		"--handler", "export", "--inject-faults",
		"--session-timeout", sessionTimeout.String(), "--max-attempts", "2", "--handler-timeout", "1s",
		// kfake waits the whole rebalance timeout for a member that died in
		// the middle of a rebalance; keep that short.
		"--rebalance-timeout", "10s",
		"--protocol", w.cfg.protocol, "--batch-max", "50",
		"--name", name, "--log-level", "debug",
	}
	if s.strict {
		args = append(args, "--strict")
	} else {
		args = append(args, "--commit-span", strconv.Itoa(w.cfg.span))
		if w.cfg.spanTxs > 0 {
			args = append(args, "--commit-transactions", strconv.Itoa(w.cfg.spanTxs))
		}
	}
	return append(args, extra...)
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

// nparts is the topic's partition count as the harness knows it: the
// producer spreads jobs over that many (add-partitions grows it).
func (w *world) nparts() int32 { return w.prod.count() }

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
	tick.Every(ctx, 100*time.Millisecond, func() { w.trackOnce(ctx) })
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
	w.addFault(f)
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
	if len(w.deck()) == 0 {
		w.t.Fatalf("the deck is empty (-chaos.kinds %v)", w.cfg.kinds)
	}
	stopAt := time.Now().Add(w.cfg.duration)
	var round []string
	for time.Now().Before(stopAt) {
		if len(round) == 0 {
			round = append([]string(nil), w.deck()...)
			w.rng.Shuffle(len(round), func(i, j int) { round[i], round[j] = round[j], round[i] })
		}
		kind := round[0]
		round = round[1:]
		if kind == kindAddParts && len(w.added) >= maxAddPartitions {
			continue // the topic has grown enough
		}
		sp := w.openSpan(kind)
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
		case kindOffsetsReset:
			w.offsetsReset()
		case kindAddParts:
			w.addPartitions()
		case kindRolling:
			w.rollingRestart()
		case kindPartKafka, kindPartPG, kindPartOneWay, kindPartFull, kindPartMulti:
			w.partition(kind)
		}
		w.closeSpan(sp)
		w.sleep(w.between(time.Second, 4*time.Second))
	}
	w.mu.Lock()
	w.live.scheduleEnd = time.Now()
	w.mu.Unlock()
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
// accepted once the new one has claimed. The harness deletes the
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
		if err == nil && n == int(w.nparts()) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d partitions claimed %s after the restart (%v)", n, w.nparts(), timeout, err)
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
	for p := range w.nparts() {
		if hwm[p] < acked[p] {
			t.Errorf("partition %d: the log ends at %d but offset %d was acknowledged: the broker lost jobs", p, hwm[p], acked[p]-1)
		}
	}

	drainStart := time.Now()
	deadline := w.drainDeadline(drainStart)
	w.live.drainBound = deadline.Sub(drainStart)
	for {
		w.trackOnce(context.Background())
		lost := w.brokerLostHolds()
		w.mu.Lock()
		var behind []string
		for p := range w.nparts() {
			if _, ok := lost[p]; !ok && w.next[p] < hwm[p] {
				behind = append(behind, fmt.Sprintf("%d at %d of %d", p, w.next[p], hwm[p]))
			}
		}
		w.mu.Unlock()
		if len(behind) == 0 {
			w.live.drainTook = time.Since(drainStart)
			t.Logf("caught up with the log in %s", time.Since(drainStart).Round(time.Millisecond))
			break
		}
		if time.Now().After(deadline) {
			w.live.drainTook = time.Since(drainStart)
			w.dumpState("drain")
			t.Errorf("STUCK: partitions %s did not reach the end of the log within %s of the start of the drain (the liveness bound after the last quiet window began)",
				strings.Join(behind, ", "), w.live.drainBound.Round(time.Second))
			break
		}
		w.sleep(200 * time.Millisecond)
	}

	w.stopLiveness()
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
			for p := range w.nparts() {
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
	for p := range w.nparts() {
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
		for p := range w.nparts() {
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
	if !w.cfg.strict {
		s += " -chaos.commit-span " + strconv.Itoa(w.cfg.span)
	}
	if w.cfg.spanTxs > 0 {
		s += " -chaos.commit-transactions " + strconv.Itoa(w.cfg.spanTxs)
	}
	if len(w.cfg.kinds) > 0 {
		s += " -chaos.kinds " + strings.Join(w.cfg.kinds, ",")
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
	case kindDeleteRecs, kindOffsetsReset, kindAddParts:
		return f.Kind + "/" + f.Mode
	}
	if f.Net != nil && f.Net.mode != "" {
		return f.Kind + "/" + f.Net.mode
	}
	return f.Kind
}
