package chaos

// Network faults (internal/testinfra/netfault). Every worker process of the run runs
// in a network namespace of its own, one per slot (a worker restarted in
// its slot gets the slot's namespace again): inside it, forwarders on
// 127.0.0.1 carry the worker's connections to the broker's port and to the
// Postgres port(s) of the root namespace, so that the worker dials the same
// addresses as without it, and nftables there drops their packets on
// demand: silently, no reset, as a vanished host or a firewall does.
//
// The kinds, dealt in the deck like the others (each once a round), each
// held for a duration drawn from a band (short: 1-2.5s, under the session
// timeout; long: 4-12s, over it; outage: 15-35s, over the database timeout
// too, one cut in five of the kinds that cut Postgres alone), then healed:
//
//   - partition-kafka: the worker cut off from the broker, both directions:
//     a live zombie, evicted by the coordinator after one session timeout,
//     that goes on committing what it had fetched until the new owner's
//     claim fences it;
//   - partition-postgres: cut off from Postgres, both directions (its
//     connections half-open), in two modes: cut (at whatever moment) and
//     mid-commit (the worker restarted with --hold-once before-commit, the
//     cut made while it holds its first batch inside the transaction,
//     after its handler, then the hold released: the worker sends its fence
//     and COMMIT into the cut);
//   - partition-one-way: only the answers dropped (requests arrive and are
//     acted on): kafka, postgres, or postgres-mid-commit (as mid-commit
//     above; the fence and COMMIT arrive and commit, their answer is lost,
//     if the connection has the fence statement prepared: on a fresh one
//     its prepare waits for an answer first, and nothing commits);
//   - partition-full: both services at once, both directions: the worker's
//     host vanished;
//   - partition-multi-host: the worker restarted with a multi-host database
//     URL whose first host is dead (postgres://127.0.0.2:P,127.0.0.1:P/...
//     ?connect_timeout=3: every namespace drops every packet to 127.0.0.2,
//     netfault's Blackhole, so each connection waits out the 3s on it before
//     it tries the real server), then cut off from Postgres as
//     partition-postgres is, mostly for an outage (past the database
//     timeout: it steps down). It must keep working through the second
//     host, and join the group again once the database answers: a probe
//     whose budget includes the dial never gets past the first host
//     (DESIGN.md, "Liveness"). The slot keeps that URL for the rest of the
//     run, through every later restart.
//
// Measured (networkReport): per kind and mode, the hand-off of each
// partition the target held at the cut (to the first commit by another
// claim, in the fence log), the cuts that ended before anything moved, the
// step-downs and rejoins of the database watch (consumer/dbwatch.go), and
// for the cuts from the broker what the zombie did: commits accepted after
// the cut, batches fenced, how long it kept trying, when kgo told it that
// it had lost its partitions.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/internal/testinfra/netfault"
	"github.com/tenure-dev/tenure/internal/tick"
)

// Network fault kinds.
const (
	kindPartKafka  = "partition-kafka"
	kindPartPG     = "partition-postgres"
	kindPartOneWay = "partition-one-way"
	kindPartFull   = "partition-full"
	kindPartMulti  = "partition-multi-host"
)

var netKinds = []string{kindPartKafka, kindPartPG, kindPartOneWay, kindPartFull, kindPartMulti}

// deadHost is the first host of partition-multi-host's URL: every
// namespace drops every packet to it (netfault's Blackhole).
var deadHost = netip.MustParseAddr("127.0.0.2")

// multiHostConnectTimeout is connect_timeout in partition-multi-host's
// URL, in seconds: longer than the database probe's budget (2s,
// consumer/dbwatch.go), as a production URL's often is.
const multiHostConnectTimeout = 3

// multiHostURL is base with deadHost (at the first host's port) put in
// front of its hosts and connect_timeout set.
func multiHostURL(base string) (string, error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", err
	}
	first, _, _ := strings.Cut(u.Host, ",")
	_, port, err := net.SplitHostPort(first)
	if err != nil {
		return "", fmt.Errorf("the database URL's first host %q: %v", first, err)
	}
	u.Host = net.JoinHostPort(deadHost.String(), port) + "," + u.Host
	q := u.Query()
	q.Set("connect_timeout", strconv.Itoa(multiHostConnectTimeout))
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// Modes of the network kinds that have some: the first word of the fault's
// Mode (the band and the duration follow).
const (
	netModeCut       = "cut"        // partition-postgres: at whatever moment
	netModeMidCommit = "mid-commit" // partition-postgres: while the worker holds before its COMMIT
	oneWayKafka      = "kafka"
	oneWayPostgres   = "postgres"
	oneWayPGCommit   = "postgres-mid-commit"
)

var netModes = map[string][]string{
	kindPartPG:     {netModeCut, netModeMidCommit},
	kindPartOneWay: {oneWayKafka, oneWayPostgres, oneWayPGCommit},
}

// cutBand is a range of cut durations.
type cutBand struct {
	name   string
	lo, hi time.Duration
}

var (
	bandShort  = cutBand{"short", time.Second, 2500 * time.Millisecond} // under the session timeout
	bandLong   = cutBand{"long", 4 * time.Second, 12 * time.Second}     // over the session timeout
	bandOutage = cutBand{"outage", 15 * time.Second, 35 * time.Second}  // over the database timeout; some over pgHandoffTarget
)

// rejoinWithin is how soon after the heal a worker that stepped down must
// have joined the group again: two probes, and a connection that may wait
// out a SYN retransmission.
const rejoinWithin = 30 * time.Second

// dbTimeout is the workers' database timeout: they get the default.
var dbTimeout = consumer.DefaultDatabaseTimeout(sessionTimeout)

// pgHandoffTarget is how soon after a worker is cut off from Postgres
// another member must be committing the partitions it held, when the cut
// lasts that long (docs/fencing.md, "A network that drops";
// integration/network_test.go asserts the same bound): the database
// timeout, a probe, the rebalance, the claim and a batch.
const pgHandoffTarget = 30 * time.Second

// stepDownSlack bounds the moments around a cut at which a step-down is
// neither expected nor ruled out: the last answer came up to a probe
// interval before the cut, the probe that notices takes up to its timeout,
// and after the heal a fresh connection takes a moment.
const stepDownSlack = 4 * time.Second

// netCut is what a network fault did, beyond its fault record.
type netCut struct {
	slot     int
	mode     string // netModes' entry, or ""
	band     string
	planned  time.Duration
	kind     netfault.Kind
	faults   []netfault.Fault
	held     *batchEvent // mid-commit: the batch the worker held at the cut
	pgOnly   bool        // Postgres alone is cut: the database watch is what hands off
	kafkaCut bool        // the broker is cut (either direction): the coordinator evicts
}

// netKindOf maps a kind and mode to internal/testinfra/netfault's kind.
func netKindOf(kind, mode string) netfault.Kind {
	switch kind {
	case kindPartKafka:
		return netfault.KafkaCut
	case kindPartPG:
		return netfault.PostgresCut
	case kindPartOneWay:
		if mode == oneWayKafka {
			return netfault.KafkaOneWay
		}
		return netfault.PostgresOneWay
	case kindPartFull:
		return netfault.FullCut
	case kindPartMulti:
		return netfault.PostgresCut
	}
	panic("not a network kind: " + kind)
}

func isMidCommit(mode string) bool { return mode == netModeMidCommit || mode == oneWayPGCommit }

// setupNetwork finds the ports the workers reach and makes each slot's
// namespace. Without namespaces (not root, no nftables) the run fails: it
// was asked for, and CI runs as root.
func (w *world) setupNetwork(brokerPort int) {
	t := w.t
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	unsupported := func(err error) {
		t.Fatalf("the chaos run puts every worker in a network namespace of its own (internal/testinfra/netfault) and cannot here: %v "+
			"(it needs root, iproute2's ip and nftables; CI runs as root)", err)
	}
	if err := netfault.EnsureNftables(ctx); err != nil {
		unsupported(err)
	}
	cfg, err := pgconn.ParseConfig(w.dbURL())
	if err != nil {
		t.Fatalf("parsing the database URL: %v", err)
	}
	w.svc = netfault.Services{Kafka: []int{brokerPort}}
	hosts := []struct {
		host string
		port uint16
	}{{cfg.Host, cfg.Port}}
	for _, fb := range cfg.Fallbacks {
		hosts = append(hosts, struct {
			host string
			port uint16
		}{fb.Host, fb.Port})
	}
	for _, h := range hosts {
		if h.host != "127.0.0.1" {
			t.Fatalf("database host %q: the namespaces forward 127.0.0.1 only", h.host)
		}
		if !slices.Contains(w.svc.Postgres, int(h.port)) {
			w.svc.Postgres = append(w.svc.Postgres, int(h.port))
		}
	}
	t.Cleanup(w.closeNamespaces) // runs before the cleanups registered earlier: it kills the workers first
	for _, s := range w.slots {
		ns, err := netfault.New(w.svc.Ports()...)
		if errors.Is(err, netfault.ErrUnsupported) {
			unsupported(err)
		}
		if err != nil {
			t.Fatalf("network namespace of slot %d: %v", s.n, err)
		}
		if err := ns.Blackhole(deadHost); err != nil {
			t.Fatalf("network namespace of slot %d: %v", s.n, err)
		}
		s.ns = ns
	}
	t.Logf("network: each worker in a namespace of its own (%s), forwarding the broker's port %v and Postgres's %v",
		strings.Join(w.namespaceNames(), ", "), w.svc.Kafka, w.svc.Postgres)
}

func (w *world) namespaceNames() []string {
	var out []string
	for _, s := range w.slots {
		if s.ns != nil {
			out = append(out, s.ns.Name())
		}
	}
	return out
}

// closeNamespaces ends every process first (Close kills none), then closes
// the namespaces and checks that none is left.
func (w *world) closeNamespaces() {
	w.killAll()
	for _, s := range w.slots {
		if s.ns == nil {
			continue
		}
		if err := s.ns.Close(); err != nil {
			w.t.Errorf("closing slot %d's network namespace: %v", s.n, err)
		}
		if _, err := os.Stat(filepath.Join("/run/netns", s.ns.Name())); err == nil {
			w.t.Errorf("network namespace %s is still there after Close", s.ns.Name())
		}
	}
}

// partition is a network fault of kind: a worker's namespace drops its
// packets to and from the services the kind names for a random duration,
// then heals. The target holds partitions (the slot drawn, or the next one
// that does), so that something has to move; for the mid-commit modes the
// slot's worker is restarted with --hold-once before-commit first, and the
// cut is made while it holds (before that restart's first COMMIT), then
// the hold released.
func (w *world) partition(kind string) {
	mode := ""
	if ms := netModes[kind]; ms != nil {
		mode = ms[w.rng.IntN(len(ms))]
	}
	// Short and long alike; an outage (Postgres alone) one time in five:
	// it takes up to 35s of the run.
	bands := []cutBand{bandShort, bandLong}
	nk := netKindOf(kind, mode)
	pgOnly := nk == netfault.PostgresCut || nk == netfault.PostgresOneWay
	if pgOnly {
		bands = []cutBand{bandShort, bandShort, bandLong, bandLong, bandOutage}
	}
	if kind == kindPartMulti {
		// Mostly past the database timeout: the step-down and the
		// rejoin through the second host are what it is about.
		bands = []cutBand{bandLong, bandOutage, bandOutage}
	}
	b := bands[w.rng.IntN(len(bands))]
	d := w.between(b.lo, b.hi)
	s := w.slots[w.rng.IntN(len(w.slots))]
	nc := &netCut{slot: s.n, mode: mode, band: b.name, planned: d, kind: nk, faults: w.svc.Faults(nk),
		pgOnly: pgOnly, kafkaCut: nk == netfault.KafkaCut || nk == netfault.KafkaOneWay || nk == netfault.FullCut}
	desc := strings.TrimSpace(mode + " " + b.name + " " + d.Round(100*time.Millisecond).String())
	if kind == kindPartMulti {
		if !w.restartMultiHost(s) {
			return
		}
	} else if isMidCommit(mode) {
		if !w.restartHolding(s, kind+" "+desc, "--hold-once", "before-commit") {
			return
		}
		if hb, ok := w.book.heldBatch(s.p.name); ok {
			nc.held = &hb
		}
	} else if hs := w.holders(); len(hs) > 0 && !slices.Contains(hs, s) {
		// The next slot that holds a partition, so that the draw stays the
		// same whatever the holders are.
		for i := range w.slots {
			if c := w.slots[(s.n+i)%len(w.slots)]; slices.Contains(hs, c) {
				s = c
				break
			}
		}
		nc.slot = s.n
	}
	if err := s.ns.Inject(nc.faults...); err != nil {
		w.t.Fatalf("%s: %v", kind, err)
	}
	f := &fault{Kind: kind, Mode: desc, Target: s.p.name, Injected: time.Now(), Net: nc}
	w.addFault(f)
	if isMidCommit(mode) {
		s.p.resume() // SIGCONT: releases the hold; the fence and COMMIT go out into the cut
	}
	w.mark(f)
	w.sleep(d)
	if err := s.ns.Heal(); err != nil {
		w.t.Fatalf("%s: healing: %v", kind, err)
	}
	w.end(f)
	if kind == kindPartMulti {
		// The quiet tail: a worker that stepped down must join the group
		// again through the second host; nothing else happens until it
		// has, or until the liveness check has had B of quiet time to
		// judge it.
		target := s.p
		if f.Ended.Sub(f.Injected) >= dbTimeout-stepDownSlack {
			w.sleep(stepDownSlack) // a step-down may come just after the heal
		}
		w.quietTail(func() bool {
			_, out := w.book.outOfGroup()[target.name]
			return !out || target.exited()
		})
	}
}

// restartMultiHost restarts s's worker (SIGTERM, then started again) with
// the multi-host URL whose first host is dead, unless it runs with it
// already, and waits (B at most) until it has claimed a partition through
// the second host. It returns false if it did not: the worker cannot work
// with that URL, which the run notes.
func (w *world) restartMultiHost(s *slot) bool {
	if s.dbURL != "" {
		return true
	}
	u, err := multiHostURL(w.dbURL())
	if err != nil {
		w.t.Fatalf("%s: %v", kindPartMulti, err)
	}
	if err := s.p.stop(45 * time.Second); err != nil {
		w.note("%s: %v", kindPartMulti, err)
	}
	s.dbURL = u
	claimed := w.book.awaitLine(s.nextName(), msgClaimed)
	if err := w.startWorker(s); err != nil {
		w.t.Fatalf("starting %s: %v", s.nextName(), err)
	}
	if !w.awaitClosed(claimed, w.live.bound.total()) {
		w.note("%s: %s, given %s, claimed no partition within B = %s", kindPartMulti, s.p.name, u, w.live.bound.total())
		return false
	}
	return true
}

// restartHolding restarts s's worker (SIGTERM, then started again) with
// flags that include a --hold-once point, and waits (30s at most) until it
// logs "holding". If it does not, it is restarted without the hold (which
// would otherwise stop it for good once reached) and restartHolding
// returns false.
func (w *world) restartHolding(s *slot, why string, flags ...string) bool {
	if err := s.p.stop(45 * time.Second); err != nil {
		w.note("%s: %v", why, err)
	}
	holding := w.book.awaitHolding(s.nextName())
	if err := w.startWorker(s, flags...); err != nil {
		w.t.Fatalf("starting %s: %v", s.nextName(), err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-holding:
			return true
		default:
		}
		if time.Now().Before(deadline) && !s.p.exited() {
			w.supervise()
			time.Sleep(5 * time.Millisecond)
			continue
		}
		// Never reached its hold (no partition, or it died).
		w.note("%s: %s did not reach its hold within 30s; restarted without it", why, s.p.name)
		if err := s.p.stop(45 * time.Second); err != nil {
			w.note("%s: %v", why, err)
		}
		if err := w.startWorker(s); err != nil {
			w.t.Fatalf("restarting %s: %v", s.p.name, err)
		}
		return false
	}
}

// fenceEntry is one fence log entry, for the hand-off measures.
type fenceEntry struct {
	kind     string
	claimID  int64
	at       time.Time
	from, to int64
}

// fenceEntries reads the fence log, by partition, in order.
func (w *world) fenceEntries(ctx context.Context) (map[int32][]fenceEntry, error) {
	byPart := map[int32][]fenceEntry{}
	rows, err := w.pool.Query(ctx, `SELECT kind, partition, claim_id, at, from_offset, to_offset FROM `+schemaName+`.fence_log
		WHERE consumer_group = $1 AND topic = $2 ORDER BY id`, groupName, topicName)
	if err != nil {
		return nil, err
	}
	var e fenceEntry
	var p int32
	var claim *int64
	if _, err := pgx.ForEachRow(rows, []any{&e.kind, &p, &claim, &e.at, &e.from, &e.to}, func() error {
		e.claimID = 0
		if claim != nil {
			e.claimID = *claim
		}
		byPart[p] = append(byPart[p], e)
		return nil
	}); err != nil {
		return nil, err
	}
	return byPart, nil
}

// heldAt is the index of the last claim in es at or before at, or -1.
func heldAt(es []fenceEntry, at time.Time) int {
	held := -1
	for i, e := range es {
		if e.at.After(at) {
			break
		}
		if e.kind == "claim" {
			held = i
		}
	}
	return held
}

// cutOutcome is what became of a partition its holder was cut off with.
type cutOutcome int

const (
	handedOff cutOutcome = iota + 1 // another claim committed it
	stayed                          // the cut ended and the holder's claim committed it again first: nothing moved
	noCommit                        // nobody committed it since
)

// afterCut says what became of the partition whose entries are es, held by
// es[held]'s claim, after a cut from cut to healed: the first commit after
// the cut by another claim (handedOff, at), unless the holder's own claim
// committed it after the heal before that (stayed, at). Commits of the
// holder's claim during the cut (a zombie cut off from the broker) decide
// nothing.
func afterCut(es []fenceEntry, held int, cut, healed time.Time) (cutOutcome, time.Time) {
	for _, e := range es[held+1:] {
		if e.kind != "commit" || !e.at.After(cut) {
			continue
		}
		if e.claimID != es[held].claimID {
			return handedOff, e.at
		}
		if !e.at.Before(healed) {
			return stayed, e.at
		}
	}
	return noCommit, time.Time{}
}

// netRow is one network kind and mode in the summary.
type netRow struct {
	cuts       int
	bands      map[string]int
	took       []time.Duration // hand-offs with no other fault injected meanwhile
	overlapped []time.Duration
	target     time.Duration
	missed     int
	stayedCuts int // cuts after which nothing moved
	stayed     int // (cut, partition) pairs
	none       int

	stepExpected, stepSeen, stepMissing, stepUnexpected, rejoined, notRejoined int
	stepAfter                                                                  []time.Duration // cut to step-down

	// cuts from the broker: the zombie
	zCommits, zFenced int
	zFencedAfterHeal  int             // of zFenced
	zTried            []time.Duration // cut to its last commit or rejection
	zNoticed          []time.Duration // cut to kgo's partitions lost (or revoked)
	zNoticedInCut     int
	zNotNoticed       int

	// mid-commit
	heldCommitted, heldNot int
	unknown                map[string]int // unknown outcomes the target logged, by resolution
}

type netReport struct {
	rows          map[string]*netRow
	findings      []string
	leftoverInCut int            // sessions left once the workers stopped, last active during a cut from Postgres
	otherSteps    map[string]int // step-downs no network fault explains, by the latest fault before them
}

// networkReport measures every network fault: see the file comment.
func (w *world) networkReport(faults []*fault, byPart map[int32][]fenceEntry, claimWorker map[int64]string, np int32) netReport {
	c := &netCheck{
		r:      netReport{rows: map[string]*netRow{}, otherSteps: map[string]int{}},
		faults: faults, byPart: byPart, claimWorker: claimWorker, np: np,
	}
	w.book.mu.Lock()
	c.steps = slices.Clone(w.book.stepDowns)
	c.rejoins = slices.Clone(w.book.rejoins)
	c.rejections = slices.Clone(w.book.rejections)
	c.lost = slices.Clone(w.book.lostEvents)
	c.unknowns = slices.Clone(w.book.unknowns)
	w.book.mu.Unlock()
	c.explained = make([]bool, len(c.steps))
	w.mu.Lock()
	c.procs = slices.Clone(w.all)
	left := slices.Clone(w.sess.leftover)
	w.mu.Unlock()

	for _, f := range faults {
		if f.Net == nil {
			continue
		}
		row := c.row(f)
		moved := c.handoffs(f, row)
		c.stepDowns(f, row)
		c.zombie(f, row, moved)
		c.midCommit(f, row)
	}
	c.leftover(left)
	c.unexplainedStepDowns()
	return c.r
}

// netCheck is one pass of networkReport: the run's logbook, copied once,
// and the report it fills. Each method is one question asked of every
// network fault, or of the run once at the end.
type netCheck struct {
	r           netReport
	faults      []*fault
	byPart      map[int32][]fenceEntry
	claimWorker map[int64]string
	np          int32 // the topic's partitions at the end
	procs       []*proc

	steps, rejoins, rejections, lost, unknowns []batchEvent
	explained                                  []bool // of steps: a network fault's cut explains it
}

func (c *netCheck) find(format string, args ...any) {
	c.r.findings = append(c.r.findings, fmt.Sprintf(format, args...))
}

// row is the fault's row of the table, counting this cut.
func (c *netCheck) row(f *fault) *netRow {
	nc := f.Net
	row := c.r.rows[f.row()]
	if row == nil {
		row = &netRow{bands: map[string]int{}, unknown: map[string]int{}, target: handoffTarget}
		if nc.pgOnly {
			row.target = pgHandoffTarget
		}
		c.r.rows[f.row()] = row
	}
	row.cuts++
	row.bands[nc.band]++
	return row
}

// exitedBefore: the worker process ended (a later fault ended it) before
// at.
func (c *netCheck) exitedBefore(worker string, at time.Time) bool {
	for _, p := range c.procs {
		if e := p.exitTime(); p.name == worker && !e.IsZero() && e.Before(at) {
			return true
		}
	}
	return false
}

// handoffs measures the hand-off of each partition the target held at the
// cut, and returns the held claims whose partitions were handed off: the
// zombie's.
func (c *netCheck) handoffs(f *fault, row *netRow) map[int64]bool {
	lasted := f.Ended.Sub(f.Injected)
	movedClaims := map[int64]bool{}
	var kept []int32
	moved := false
	for p := range c.np {
		es := c.byPart[p]
		held := heldAt(es, f.Injected)
		if held < 0 || c.claimWorker[es[held].claimID] != f.Target {
			continue
		}
		out, at := afterCut(es, held, f.Injected, f.Ended)
		switch out {
		case handedOff:
			moved = true
			movedClaims[es[held].claimID] = true
			d := at.Sub(f.Injected)
			var during []string
			for _, g := range c.faults {
				if g != f && g.Injected.After(f.Injected) && g.Injected.Before(at) {
					during = append(during, fmt.Sprintf("%s +%s", g.row(), g.Injected.Sub(f.Injected).Round(time.Millisecond)))
				}
			}
			if len(during) > 0 {
				row.overlapped = append(row.overlapped, d)
			} else {
				row.took = append(row.took, d)
			}
			if d > row.target {
				row.missed++
				msg := fmt.Sprintf("hand-off of partition %d after %s took %s (target %s)", p, f, d.Round(time.Millisecond), row.target)
				if len(during) > 0 {
					msg += "; faults injected meanwhile: " + strings.Join(during, ", ")
				}
				c.find("%s", msg)
			}
		case stayed:
			row.stayed++
			kept = append(kept, p)
			if lasted > row.target {
				row.missed++
				c.find("partition %d stayed with %s through its cut of %s, longer than the hand-off target %s: nothing moved until the network healed (%s)",
					p, f.Target, lasted.Round(time.Millisecond), row.target, f)
			}
		case noCommit:
			row.none++
		}
	}
	if len(kept) > 0 && !moved {
		row.stayedCuts++
	}
	return movedClaims
}

// stepDowns checks the database watch: a cut from Postgres longer than the
// database timeout makes the target step down (and join again once
// healed); a shorter one, or one from the broker alone, does not.
func (c *netCheck) stepDowns(f *fault, row *netRow) {
	nc := f.Net
	lasted := f.Ended.Sub(f.Injected)
	var mine []int
	for i, sd := range c.steps {
		if sd.Worker == f.Target && !sd.At.Before(f.Injected) && sd.At.Before(f.Ended.Add(stepDownSlack)) {
			mine = append(mine, i)
			c.explained[i] = true
		}
	}
	cutsPostgres := nc.kind != netfault.KafkaCut && nc.kind != netfault.KafkaOneWay
	expect := cutsPostgres && lasted >= dbTimeout+stepDownSlack
	forbid := !cutsPostgres || lasted < dbTimeout-stepDownSlack
	if expect {
		row.stepExpected++
	}
	row.stepSeen += len(mine)
	switch {
	case expect && len(mine) == 0:
		row.stepMissing++
		c.find("%s: cut off from Postgres for %s, longer than the database timeout %s, and it did not step down", f, lasted.Round(time.Millisecond), dbTimeout)
	case forbid && len(mine) > 0:
		row.stepUnexpected++
		c.find("%s: it stepped down at +%s after the cut, which should not make it (the database timeout is %s)",
			f, c.steps[mine[0]].At.Sub(f.Injected).Round(time.Millisecond), dbTimeout)
	}
	for _, i := range mine {
		row.stepAfter = append(row.stepAfter, c.steps[i].At.Sub(f.Injected))
		var back time.Time
		for _, rj := range c.rejoins {
			if rj.Worker == f.Target && rj.At.After(c.steps[i].At) {
				back = rj.At
				break
			}
		}
		switch {
		case !back.IsZero() && back.Before(f.Ended.Add(rejoinWithin)):
			row.rejoined++
		case c.exitedBefore(f.Target, f.Ended.Add(rejoinWithin)):
			// ended by a later fault before it had to be back: nothing to say
		default:
			row.notRejoined++
			when := "never"
			if !back.IsZero() {
				when = fmt.Sprintf("only %s after the heal", back.Sub(f.Ended).Round(time.Millisecond))
			}
			c.find("%s: %s stepped down at +%s and joined the group again %s (at most %s after the heal expected)",
				f, f.Target, c.steps[i].At.Sub(f.Injected).Round(time.Millisecond), when, rejoinWithin)
		}
	}
}

// zombie follows the target cut off from the broker: what of the work of
// its claims that were handed off still reached Postgres, and when kgo
// told it. (A claim whose partition stayed was no zombie: it just went
// on.)
func (c *netCheck) zombie(f *fault, row *netRow, movedClaims map[int64]bool) {
	if !f.Net.kafkaCut || len(movedClaims) == 0 {
		return
	}
	var last time.Time
	for p := range c.np {
		for _, e := range c.byPart[p] {
			if e.kind == "commit" && movedClaims[e.claimID] && e.at.After(f.Injected) {
				row.zCommits++
				if e.at.After(last) {
					last = e.at
				}
			}
		}
	}
	for _, rj := range c.rejections {
		if movedClaims[rj.ClaimID] && rj.At.After(f.Injected) {
			row.zFenced++
			if !rj.At.Before(f.Ended) {
				row.zFencedAfterHeal++
			}
			if rj.At.After(last) {
				last = rj.At
			}
		}
	}
	if !last.IsZero() {
		row.zTried = append(row.zTried, last.Sub(f.Injected))
	}
	for _, l := range c.lost {
		if l.Worker == f.Target && l.At.After(f.Injected) {
			row.zNoticed = append(row.zNoticed, l.At.Sub(f.Injected))
			if l.At.Before(f.Ended) {
				row.zNoticedInCut++
			}
			return
		}
	}
	row.zNotNoticed++
}

// midCommit asks of a cut made mid-commit: did the held batch commit, and
// what did the worker make of it?
func (c *netCheck) midCommit(f *fault, row *netRow) {
	nc := f.Net
	if nc.held != nil {
		committed := false
		for _, e := range c.byPart[nc.held.Partition] {
			if e.kind == "commit" && e.from == nc.held.From && e.to == nc.held.To && c.claimWorker[e.claimID] == f.Target {
				committed = true
			}
		}
		if committed {
			row.heldCommitted++
		} else {
			row.heldNot++
		}
	}
	if isMidCommit(nc.mode) || nc.pgOnly || nc.kind == netfault.FullCut {
		for _, u := range c.unknowns {
			if u.Worker == f.Target && u.At.After(f.Injected) && u.At.Before(f.Ended.Add(time.Minute)) {
				row.unknown[u.Outcome]++
			}
		}
	}
}

// leftover judges the sessions left once every worker had stopped:
// a worker's connection whose client end vanished behind a cut (the worker
// gave it up: its reset was dropped) stays open on the server's side until
// a keepalive or a timeout ends it (here the forwarder's keepalive, 2.5
// min, stands in for the server's). A stopped worker closed every other
// connection, so a session idle since before the end of a cut from
// Postgres is one of those; any other is a finding.
func (c *netCheck) leftover(left []leftSession) {
	for _, l := range left {
		var in *fault
		for _, f := range c.faults {
			if f.Net != nil && f.Net.kind != netfault.KafkaCut && f.Net.kind != netfault.KafkaOneWay &&
				l.lastActive.Before(f.Ended) {
				in = f
			}
		}
		if in != nil {
			c.r.leftoverInCut++
			continue
		}
		c.find("Postgres session pid %d (%s, started %s, last active %s) was still open 2s after every worker had stopped, with no cut to explain it",
			l.pid, l.state, l.backend.Format("15:04:05.000"), l.lastActive.Format("15:04:05.000"))
	}
}

// unexplainedStepDowns: a database down for everyone (pg-restart,
// pg-failover) may make every worker step down; any other step-down no
// network fault explains is a finding.
func (c *netCheck) unexplainedStepDowns() {
	for i, sd := range c.steps {
		if c.explained[i] {
			continue
		}
		why := "no fault"
		if g := latestFault(c.faults, sd.At); g != nil {
			why = g.row()
			if (g.Kind == kindPGRestart || g.Kind == kindPGFailover) && sd.At.Sub(g.Injected) < time.Minute {
				c.r.otherSteps[why]++
				continue
			}
		}
		c.r.otherSteps[why]++
		c.find("%s stepped down at %s with no cut from Postgres to explain it (latest fault: %s)", sd.Worker, sd.At.Format("15:04:05.000"), why)
	}
}

// summary is the network faults' part of the run's summary.
func (r netReport) summary(w *world, sess sessionStats) string {
	var b strings.Builder
	var rows []string
	for _, k := range tableRows(w.kinds()) {
		if slices.Contains(netKinds, strings.Split(k, "/")[0]) {
			rows = append(rows, k)
		}
	}
	kw := kindWidth(tableRows(w.kinds()))
	get := func(k string) *netRow {
		if x := r.rows[k]; x != nil {
			return x
		}
		return &netRow{bands: map[string]int{}, unknown: map[string]int{}}
	}
	fmt.Fprintf(&b, "network:     every worker in a network namespace of its own (netfault: nftables drops inside it; forwarders to the broker's port %v and Postgres's %v); "+
		"cut bands short %s-%s, long %s-%s, outage %s-%s (Postgres alone); database timeout %s (the workers' default)\n",
		w.svc.Kafka, w.svc.Postgres, bandShort.lo, bandShort.hi, bandLong.lo, bandLong.hi, bandOutage.lo, bandOutage.hi, dbTimeout)
	fmt.Fprintf(&b, "  %-*s %4s %17s %32s %22s %8s\n", kw, "kind", "cuts", "short/long/outage", "step-downs exp/seen/miss/unexp", "cut to step-down p50/max", "rejoined")
	for _, k := range rows {
		x := get(k)
		fmt.Fprintf(&b, "  %-*s %4d %17s %32s %22s %8s\n", kw, k, x.cuts,
			fmt.Sprintf("%d/%d/%d", x.bands[bandShort.name], x.bands[bandLong.name], x.bands[bandOutage.name]),
			fmt.Sprintf("%d/%d/%d/%d", x.stepExpected, x.stepSeen, x.stepMissing, x.stepUnexpected),
			p50max(x.stepAfter), fmt.Sprintf("%d/%d", x.rejoined, x.rejoined+x.notRejoined))
	}
	if len(r.otherSteps) > 0 {
		fmt.Fprintf(&b, "  step-downs outside network cuts, by the latest fault before them: %v\n", r.otherSteps)
	}
	fmt.Fprintf(&b, "network hand-off: from the cut to the first commit by another claim of each partition the target held (fence log); "+
		"target %s for a cut from Postgres alone (when the cut lasts that long: a partition kept through a longer cut misses it too), %s otherwise; "+
		"stayed: the cut ended and the target committed it again first, nothing moved\n", pgHandoffTarget, handoffTarget)
	fmt.Fprintf(&b, "  %-*s %5s %9s %9s %9s %8s %13s %9s %10s %14s\n", kw, "kind", "moved", "p50", "p99", "max", "target", "stayed (cuts)", "no commit", "overlapped", "overlapped max")
	for _, k := range rows {
		x := get(k)
		met := "-"
		if len(x.took)+len(x.overlapped)+x.stayed > 0 {
			met = "met"
			if x.missed > 0 {
				met = fmt.Sprintf("MISSED %d", x.missed)
			}
		}
		fmt.Fprintf(&b, "  %-*s %5d %9s %9s %9s %8s %13s %9d %10d %14s\n", kw, k, len(x.took), pct(x.took, 50), pct(x.took, 99), pct(x.took, 100), met,
			fmt.Sprintf("%d (%d)", x.stayed, x.stayedCuts), x.none, len(x.overlapped), pct(x.overlapped, 100))
	}
	fmt.Fprintf(&b, "zombies:     cut off from the broker: commits of the claims it held accepted after the cut, batches fenced (of them after the heal), "+
		"kept trying (cut to its last commit or rejection), noticed (cut to kgo's partitions lost or revoked; during the cut / never)\n")
	fmt.Fprintf(&b, "  %-*s %7s %12s %22s %22s %13s\n", kw, "kind", "commits", "fenced (heal)", "kept trying p50/max", "noticed p50/max", "in cut/never")
	for _, k := range rows {
		x := get(k)
		if x.zCommits+x.zFenced+len(x.zTried)+len(x.zNoticed)+x.zNotNoticed == 0 && !strings.HasPrefix(k, kindPartKafka) {
			continue
		}
		fmt.Fprintf(&b, "  %-*s %7d %12s %22s %22s %13s\n", kw, k, x.zCommits, fmt.Sprintf("%d (%d)", x.zFenced, x.zFencedAfterHeal), p50max(x.zTried), p50max(x.zNoticed),
			fmt.Sprintf("%d/%d", x.zNoticedInCut, x.zNotNoticed))
	}
	var mid []string
	for _, k := range rows {
		x := get(k)
		var parts []string
		if n := x.heldCommitted + x.heldNot; n > 0 {
			parts = append(parts, fmt.Sprintf("the batch held at the cut committed %d of %d", x.heldCommitted, n))
		}
		if len(x.unknown) > 0 {
			parts = append(parts, fmt.Sprintf("commits of unknown outcome the target logged, by resolution, %v", x.unknown))
		}
		if len(parts) > 0 {
			mid = append(mid, k+": "+strings.Join(parts, ", "))
		}
	}
	if len(mid) > 0 {
		fmt.Fprintf(&b, "commits cut: %s\n", strings.Join(mid, "; "))
	}
	fmt.Fprintf(&b, "sessions:    the workers' Postgres sessions (sampled every second): max %d (idle in transaction max %d), %d at the end of the drain, "+
		"%d once the workers had stopped (%d of them idle since before the end of a cut from Postgres: their client vanished behind it); processes alive at once max %d (%d workers and the broker)\n",
		sess.max, sess.maxIdleTx, sess.atDrain, len(sess.leftover), r.leftoverInCut, sess.maxProcs, w.cfg.workers)
	return b.String()
}

// sessionStats samples the workers' Postgres sessions and the live
// processes, to see that nothing piles up (half-open connections leave
// sessions behind until a keepalive or a timeout ends them).
type sessionStats struct {
	max, maxIdleTx, last, atDrain, maxProcs int
	leftover                                []leftSession // once the workers had stopped
}

// leftSession is a session still there once every worker had stopped.
type leftSession struct {
	pid                 int32
	state               string
	backend, lastActive time.Time
}

// leftoverSessions lists the workers' sessions still open.
func (w *world) leftoverSessions(ctx context.Context) ([]leftSession, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	rows, err := w.pool.Query(ctx, `SELECT pid, coalesce(state, ''), backend_start, coalesce(state_change, backend_start)
		FROM pg_stat_activity WHERE datname = current_database() AND backend_type = 'client backend'
		AND application_name <> $1 AND pid <> pg_backend_pid()`, harnessApp)
	if err != nil {
		return nil, err
	}
	var out []leftSession
	var l leftSession
	_, err = pgx.ForEachRow(rows, []any{&l.pid, &l.state, &l.backend, &l.lastActive}, func() error {
		out = append(out, l)
		return nil
	})
	return out, err
}

// harnessApp is the application_name of the harness's own connections,
// left out of the count.
const harnessApp = "chaos-harness"

func (w *world) countSessions(ctx context.Context) (all, idleTx int, err error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	err = w.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE state LIKE 'idle in transaction%')
		FROM pg_stat_activity WHERE datname = current_database() AND backend_type = 'client backend'
		AND application_name <> $1 AND pid <> pg_backend_pid()`, harnessApp).Scan(&all, &idleTx)
	return all, idleTx, err
}

// sampleSessions runs until ctx ends.
func (w *world) sampleSessions(ctx context.Context, done chan<- struct{}) {
	defer close(done)
	tick.Every(ctx, time.Second, func() {
		n, idle, err := w.countSessions(ctx)
		w.mu.Lock()
		defer w.mu.Unlock()
		procs := 0
		for _, p := range w.all {
			if !p.exited() {
				procs++
			}
		}
		w.sess.maxProcs = max(w.sess.maxProcs, procs)
		if err == nil {
			w.sess.max = max(w.sess.max, n)
			w.sess.maxIdleTx = max(w.sess.maxIdleTx, idle)
			w.sess.last = n
		}
	})
}

// What became of a partition after a cut: handed off at the first commit of
// another claim, stayed when the holder's claim committed again after the
// heal first, and commits of the holder during the cut (a zombie's) decide
// nothing.
func TestAfterCut(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	cut, healed := at(10), at(20)
	for _, c := range []struct {
		name string
		es   []fenceEntry
		want cutOutcome
		when time.Time
	}{
		{"handed off", []fenceEntry{{kind: "claim", claimID: 1, at: at(1)}, {kind: "commit", claimID: 1, at: at(9)},
			{kind: "claim", claimID: 2, at: at(13)}, {kind: "commit", claimID: 2, at: at(14)}}, handedOff, at(14)},
		{"zombie commits first", []fenceEntry{{kind: "claim", claimID: 1, at: at(1)}, {kind: "commit", claimID: 1, at: at(11)},
			{kind: "commit", claimID: 1, at: at(12)}, {kind: "claim", claimID: 2, at: at(13)}, {kind: "commit", claimID: 2, at: at(15)}}, handedOff, at(15)},
		{"stayed", []fenceEntry{{kind: "claim", claimID: 1, at: at(1)}, {kind: "commit", claimID: 1, at: at(21)},
			{kind: "claim", claimID: 2, at: at(30)}, {kind: "commit", claimID: 2, at: at(31)}}, stayed, at(21)},
		{"handed off after the heal", []fenceEntry{{kind: "claim", claimID: 1, at: at(1)},
			{kind: "claim", claimID: 3, at: at(21)}, {kind: "commit", claimID: 3, at: at(22)}}, handedOff, at(22)},
		{"no commit", []fenceEntry{{kind: "claim", claimID: 1, at: at(1)}, {kind: "commit", claimID: 1, at: at(5)}}, noCommit, time.Time{}},
	} {
		held := heldAt(c.es, cut)
		if held != 0 {
			t.Fatalf("%s: held %d, want 0", c.name, held)
		}
		got, when := afterCut(c.es, held, cut, healed)
		if got != c.want || !when.Equal(c.when) {
			t.Errorf("%s: got %v at %v, want %v at %v", c.name, got, when, c.want, c.when)
		}
	}
}

// The multi-host URL puts the dead host first, at the first host's port,
// and bounds each host's connect.
func TestMultiHostURL(t *testing.T) {
	for base, want := range map[string]string{
		"postgres://postgres@127.0.0.1:5433/postgres?sslmode=disable":                                   "postgres://postgres@127.0.0.2:5433,127.0.0.1:5433/postgres?connect_timeout=3&sslmode=disable",
		"postgres://u@127.0.0.1:6001,127.0.0.1:6002/db?target_session_attrs=read-write&sslmode=disable": "postgres://u@127.0.0.2:6001,127.0.0.1:6001,127.0.0.1:6002/db?connect_timeout=3&sslmode=disable&target_session_attrs=read-write",
	} {
		got, err := multiHostURL(base)
		if err != nil || got != want {
			t.Errorf("multiHostURL(%s) = %s, %v; want %s", base, got, err, want)
		}
		cfg, err := pgconn.ParseConfig(got)
		if err != nil || cfg.Host != deadHost.String() || len(cfg.Fallbacks) == 0 || cfg.ConnectTimeout != multiHostConnectTimeout*time.Second {
			t.Errorf("%s parses to %v, %v", got, cfg, err)
		}
	}
}

// Each network kind deals its modes into rows of their own.
func TestNetworkRows(t *testing.T) {
	rows := tableRows(netKinds)
	want := []string{kindPartKafka, kindPartPG + "/cut", kindPartPG + "/mid-commit",
		kindPartOneWay + "/kafka", kindPartOneWay + "/postgres", kindPartOneWay + "/postgres-mid-commit", kindPartFull, kindPartMulti}
	if !slices.Equal(rows, want) {
		t.Errorf("rows %v, want %v", rows, want)
	}
	f := &fault{Kind: kindPartOneWay, Mode: "postgres long 5s", Net: &netCut{mode: oneWayPostgres}}
	if f.row() != kindPartOneWay+"/postgres" {
		t.Errorf("row %q", f.row())
	}
	for _, k := range netKinds {
		for _, m := range append(netModes[k], "") {
			if (m == "") != (netModes[k] == nil) {
				continue
			}
			nk := netKindOf(k, m)
			if len((netfault.Services{Kafka: []int{1}, Postgres: []int{2}}).Faults(nk)) == 0 {
				t.Errorf("%s/%s: no faults", k, m)
			}
		}
	}
}
