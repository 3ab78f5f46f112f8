package consumer_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/internal/fence"
	"github.com/tenure-dev/tenure/internal/testinfra/pgproxy"
	"github.com/tenure-dev/tenure/internal/testinfra/testdb"
	"github.com/tenure-dev/tenure/sink"
)

const resolvedMsg = "commit outcome was unknown; resolved from the fencing row"

// A batch's COMMIT is sent, and the connection breaks before the worker
// learns the result. The worker must not guess: it reads the fencing row,
// which only its own commit could have moved. When the commit took effect
// the lane goes on after the batch; when it did not, the batch is retried.
// Either way every job lands exactly once and the lane keeps its partition.
func TestUnknownCommitOutcomeIsResolvedFromTheFence(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		cut  pgproxy.Cut
		want fence.Outcome
	}{
		{"committed", pgproxy.AfterCommit, fence.Committed},
		{"not committed", pgproxy.BeforeCommit, fence.NotCommitted},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			testUnknownCommitOutcome(t, c.cut, c.want)
		})
	}
}

func testUnknownCommitOutcome(t *testing.T, cut pgproxy.Cut, want fence.Outcome) {
	const jobs = 300
	b, proxy, store := proxiedSetup(t, 3, jobs, 41)

	// The handler arms the proxy on the connection of one batch in the
	// middle of a partition (not its first): that batch's COMMIT is cut.
	h, victim := cutVictim(t, b, proxy.CutCommit, cut)
	log, logs := observedLogger(t, zap.WarnLevel)
	cfg := b.config(h, log)
	cfg.Store = store
	stop := b.start(cfg)

	r := victim.waitCut(t)
	t.Logf("cut %s: batch %s/%d [%d,%d), server reply %q", r.Cut, victim.Topic, victim.Partition, victim.From, victim.To, r.Reply)
	if cut == pgproxy.AfterCommit && r.Reply != "COMMIT" {
		t.Fatalf("the server answered the cut COMMIT with %q, want COMMIT", r.Reply)
	}

	waitDoneUnfenced(t, b, logs, 30*time.Second)
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	resolved := logs.FilterMessage(resolvedMsg).All()
	if len(resolved) != 1 {
		t.Fatalf("%q logged %d times, want once", resolvedMsg, len(resolved))
	}
	f := resolved[0].ContextMap()
	if f["outcome"] != want.String() || f["from"] != victim.From || f["to"] != victim.To {
		t.Errorf("resolved %v (batch [%v,%v)), want %q for the cut batch [%d,%d)", f["outcome"], f["from"], f["to"], want, victim.From, victim.To)
	}
	for _, msg := range []string{"job dead-lettered", "batch rejected: fenced; dropping this partition's buffered records and checking whether this member still holds it"} {
		if n := logs.FilterMessage(msg).Len(); n != 0 {
			t.Errorf("%q logged %d times, want never", msg, n)
		}
	}

	hist := b.check() // every job exactly once, G1-G3
	if len(hist.Writes) != jobs {
		t.Fatalf("ledger has %d rows, want %d", len(hist.Writes), jobs)
	}
	// The cut batch is in the fence log once: as committed by the cut
	// COMMIT, or as the retry after it.
	n := 0
	for _, e := range hist.Log {
		if e.Kind == "commit" && e.Partition.Partition == victim.Partition && e.From == victim.From {
			n++
			if e.To != victim.To {
				t.Errorf("the batch after the cut committed [%d,%d), want [%d,%d)", e.From, e.To, victim.From, victim.To)
			}
		}
	}
	if n != 1 {
		t.Errorf("%d commits start at the cut batch's offset %d, want 1", n, victim.From)
	}
}

// The database goes away at the very moment of a batch's COMMIT and stays
// away for longer than the worker's budget for resolving it. Until the
// database answers, nothing can tell whether the commit happened, and the
// worker must not guess; but once it answers, the partition must move on
// (the issue: "processing continues"), with no rebalance to help: this
// consumer is the group's only member.
func TestCommitOutcomeUnknownForLongStillEndsInProgress(t *testing.T) {
	t.Parallel()
	const jobs = 200
	b, proxy, store := proxiedSetup(t, 2, jobs, 29)

	h, victim := cutVictim(t, b, proxy.CutCommitAndGoDown, pgproxy.AfterCommit)
	log, logs := observedLogger(t, zap.ErrorLevel)
	cfg := b.config(h, log)
	cfg.Store = store
	// Resolving gets 2 x ClaimTimeout = 1s; the outage lasts 3s.
	cfg.ClaimTimeout = 500 * time.Millisecond
	const outage = 3 * time.Second
	stop := b.start(cfg)

	r := victim.waitCut(t)
	t.Logf("cut %s and down for %s: batch %s/%d [%d,%d), server reply %q", r.Cut, outage, victim.Topic, victim.Partition, victim.From, victim.To, r.Reply)
	time.Sleep(outage) // the outage itself
	proxy.SetDown(false)

	waitDoneUnfenced(t, b, nil, 20*time.Second)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if n := logs.FilterMessage(resolvedMsg).Len(); n == 0 {
		t.Errorf("%q never logged", resolvedMsg)
	}
	if hist := b.check(); len(hist.Writes) != jobs {
		t.Fatalf("ledger has %d rows, want %d", len(hist.Writes), jobs)
	}
}

// picked is the batch a oneVictim handler picked.
type picked struct {
	consumer.Batch
	armed  chan struct{}
	report <-chan pgproxy.Report // with cutVictim: the cut's
}

// oneVictim is a ledger handler that picks one batch in the middle of a
// partition (not its first) and, after the ledger's writes, calls arm in
// that batch's transaction: the batch whose COMMIT the test interferes
// with. arm's error is the handler's.
func oneVictim(t *testing.T, b *bundle, arm func(context.Context, consumer.Tx) error) (consumer.Handler, *picked) {
	inner := ledger(t, b.schema)
	v := &picked{armed: make(chan struct{})}
	var once sync.Once
	return consumer.HandlerFunc(func(ctx context.Context, tx consumer.Tx, batch *consumer.Batch) error {
		if err := inner.Handle(ctx, tx, batch); err != nil {
			return err
		}
		var err error
		if batch.From > 0 {
			once.Do(func() {
				v.Batch = *batch
				err = arm(ctx, tx)
				close(v.armed)
			})
		}
		return err
	}), v
}

// cutVictim is oneVictim whose arm has the proxy cut the victim's COMMIT
// (cutCommit is the proxy's CutCommit or CutCommitAndGoDown).
func cutVictim(t *testing.T, b *bundle, cutCommit func(net.Addr, pgproxy.Cut) <-chan pgproxy.Report, cut pgproxy.Cut) (consumer.Handler, *picked) {
	var v *picked
	h, v := oneVictim(t, b, func(_ context.Context, tx consumer.Tx) error {
		v.report = cutCommit(consumer.ConnOf(tx).PgConn().Conn().LocalAddr(), cut)
		return nil
	})
	return h, v
}

// waitCut waits for the victim to be picked and its COMMIT cut.
func (v *picked) waitCut(t *testing.T) pgproxy.Report {
	t.Helper()
	v.waitArmed(t)
	select {
	case r := <-v.report:
		return r
	case <-time.After(30 * time.Second):
		t.Fatalf("the COMMIT of batch %s/%d [%d,%d) was not cut within 30s", v.Topic, v.Partition, v.From, v.To)
		return pgproxy.Report{}
	}
}

// waitArmed waits for the handler to pick its victim.
func (v *picked) waitArmed(t *testing.T) {
	t.Helper()
	select {
	case <-v.armed:
	case <-time.After(30 * time.Second):
		t.Fatal("no batch past the first of its partition within 30s")
	}
}

// proxiedSetup is a bundle of partitions with jobs produced, their keys
// cycling through keys names (k0, k1, ...), a proxy in front of the test
// database, and a store on the bundle's schema whose pool (claims,
// batches, Resolve) goes through that proxy.
func proxiedSetup(t *testing.T, partitions int32, jobs, keys int) (*bundle, *pgproxy.Proxy, *sink.Store) {
	t.Helper()
	b := setup(t, partitions)
	b.produce(jobs, func(i int) string { return fmt.Sprintf("k%d", i%keys) })
	proxy, store := proxiedStoreAfter(t, b)
	return b, proxy, store
}

// proxiedStoreAfter starts a proxy in front of the test database and
// returns it with a store on b's schema whose pool goes through it, and
// whose URL lists the hosts before first, the proxy last: a multi-host URL
// (postgres://h1,h2/...) that tries them in turn, each for up to its
// connect_timeout (2s).
func proxiedStoreAfter(t *testing.T, b *bundle, before ...string) (*pgproxy.Proxy, *sink.Store) {
	t.Helper()
	proxy, u := pgproxy.InFront(t, testdb.URL())
	u.Host = strings.Join(append(before, proxy.Addr()), ",")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool := testdb.PoolOn(t, ctx, u.String(), func(cfg *pgxpool.Config) { cfg.ConnConfig.ConnectTimeout = 2 * time.Second })
	store, err := sink.NewStore(pool, b.schema)
	if err != nil {
		t.Fatal(err)
	}
	return proxy, store
}

// waitDoneUnfenced is waitDone that gives up at once when a lane is fenced
// (unless logs is nil): nothing else is in the group, so a fenced lane means
// the worker misjudged its own commit, and its partition would wait for a
// reassignment that never comes.
func waitDoneUnfenced(t *testing.T, b *bundle, logs *observer.ObservedLogs, timeout time.Duration) {
	t.Helper()
	end := b.endOffsets()
	deadline := time.Now().Add(timeout)
	for {
		fs, err := b.store.List(context.Background(), b.group)
		if err != nil {
			t.Fatal(err)
		}
		next := map[int32]int64{}
		done := 0
		for _, f := range fs {
			next[f.Partition.Partition] = f.NextOffset
			if f.NextOffset >= end[f.Partition.Partition] {
				done++
			}
		}
		if done == len(end) {
			return
		}
		if logs != nil {
			if fenced := logs.FilterField(zap.Bool("fenced", true)).All(); len(fenced) > 0 {
				t.Fatalf("a lane was fenced with no other member in the group: %s %v", fenced[0].Message, fenced[0].ContextMap())
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("not all partitions done within %s: stored next offsets %v, ends %v", timeout, next, end)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A COMMIT slower than the commit timeout (here a deferred trigger sleeps in
// it; in production a synchronous standby that lags, or an I/O stall): the
// worker stops waiting, the outcome is unknown, and the COMMIT lands a
// moment later. The worker must find that out, not conclude "not committed"
// from the row while the COMMIT is still running and retry the batch into an
// offset mismatch (which used to stop the partition until a rebalance).
// Cancel requests are dropped on the way, as a cut network would drop them:
// the COMMIT runs to its end.
func TestCommitSlowerThanTheTimeoutIsWaitedFor(t *testing.T) {
	t.Parallel()
	const jobs = 60
	b, proxy, store := proxiedSetup(t, 1, jobs, 7)
	proxy.DropCancelRequests(true)
	slow := `"` + b.schema + `".slow_once`
	if _, err := b.pool.Exec(context.Background(), `CREATE TABLE `+slow+` (x int);
		CREATE FUNCTION "`+b.schema+`".sleep_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(2); RETURN NULL; END $$;
		CREATE CONSTRAINT TRIGGER sleep_at_commit AFTER INSERT ON `+slow+` DEFERRABLE INITIALLY DEFERRED
			FOR EACH ROW EXECUTE FUNCTION "`+b.schema+`".sleep_at_commit()`); err != nil {
		t.Fatal(err)
	}
	h, victim := oneVictim(t, b, func(ctx context.Context, tx consumer.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+slow+` VALUES (1)`) // this batch's COMMIT takes 2s
		return err
	})
	log, logs := observedLogger(t, zap.WarnLevel)
	cfg := b.config(h, log)
	cfg.Store = store
	cfg.BatchMax = 10
	cfg.CommitTimeout = 300 * time.Millisecond
	stop := b.start(cfg)
	waitDoneUnfenced(t, b, logs, 60*time.Second)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	resolved := logs.FilterMessage(resolvedMsg).All()
	if len(resolved) != 1 || resolved[0].ContextMap()["outcome"] != "committed" || resolved[0].ContextMap()["from"] != victim.From {
		t.Fatalf("want the slow batch [%d,%d) resolved once as committed; logged %v", victim.From, victim.To, resolved)
	}
	if hist := b.check(); len(hist.Writes) != jobs {
		t.Fatalf("ledger has %d rows, want %d", len(hist.Writes), jobs)
	}
}
