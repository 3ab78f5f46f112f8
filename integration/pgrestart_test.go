package integration

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tenure-dev/tenure/internal/devbroker"
	"github.com/tenure-dev/tenure/internal/history"
	"github.com/tenure-dev/tenure/internal/testinfra/kafkatest"
	"github.com/tenure-dev/tenure/internal/testinfra/pgtest"
	"github.com/tenure-dev/tenure/internal/testinfra/testdb"
	"github.com/tenure-dev/tenure/sink"
)

// workerApp is the application_name the workers of an outage test connect
// with, so that the test can end exactly their sessions.
const workerApp = "tenure-outage-worker"

// newOutageEnv is newEnv on a throwaway PostgreSQL cluster, which the test
// may stop, restart and break: the shared server is never touched.
func newOutageEnv(t *testing.T, partitions int32) (*env, *pgtest.Cluster) {
	t.Helper()
	pg := pgtest.Start(t)
	br := startBroker(t, devbroker.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool := testPool(t, ctx, pg.URL()) // registered after pgtest's: closed before the cluster is removed
	schema := testdb.NewSchemaName("tenure_outage")
	if _, err := sink.Migrate(ctx, pool, schema); err != nil {
		t.Fatalf("migrating %s on the throwaway cluster: %v", schema, err)
	}
	e := &env{t: t, brokers: br.ListenAddrs(), pool: pool, schema: schema,
		dbURL: pg.URL() + "&application_name=" + workerApp}
	e.createTopic(partitions)
	return e, pg
}

// roundProducer writes rounds of jobs in the background until it is stopped
// or out of rounds.
type roundProducer struct {
	e        *env
	stopOnce sync.Once
	quit     chan struct{}
	done     chan struct{}
	rounds   atomic.Int64
	err      error
}

func (e *env) produceInRounds(maxRounds, perRound int, every time.Duration) *roundProducer {
	p := &roundProducer{e: e, quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for round := range maxRounds {
			select {
			case <-p.quit:
				return
			default:
			}
			recs := make([]*kgo.Record, perRound)
			for i := range recs {
				recs[i] = &kgo.Record{Topic: e.topic, Key: []byte(keys[(round*perRound+i)%len(keys)] + fmt.Sprint(i%7)),
					Value: fmt.Appendf(nil, `{"round":%d,"i":%d}`, round, i)}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			err := e.cl.ProduceSync(ctx, recs...).FirstErr()
			cancel()
			if err != nil {
				p.err = fmt.Errorf("round %d: %w", round, err)
				return
			}
			p.rounds.Add(1)
			select {
			case <-p.quit:
				return
			case <-time.After(every):
			}
		}
	}()
	e.t.Cleanup(func() { p.stop() })
	return p
}

// stop ends production and reports how many rounds were produced.
func (p *roundProducer) stop() int64 {
	p.stopOnce.Do(func() { close(p.quit) })
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		p.e.t.Fatal("the producer did not stop within 30s")
	}
	if p.err != nil {
		p.e.t.Fatalf("producing: %v", p.err)
	}
	return p.rounds.Load()
}

// highWatermarks is every partition's high watermark.
func (e *env) highWatermarks() map[int32]int64 {
	e.t.Helper()
	return kafkatest.EndOffsets(e.t, e.cl, e.topic)
}

// storedOffsets reads the stored next offset of each of the group's
// partitions; ok is false when the database does not answer (it may be
// restarting).
func (e *env) storedOffsets() (offs map[int32]int64, sum int64, ok bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	rows, err := e.pool.Query(ctx, `SELECT partition, next_offset FROM "`+e.schema+`".fences WHERE consumer_group = $1 AND topic = $2`,
		e.group, e.topic)
	if err != nil {
		return nil, 0, false
	}
	defer rows.Close()
	offs = map[int32]int64{}
	for rows.Next() {
		var p int32
		var n int64
		if err := rows.Scan(&p, &n); err != nil {
			return nil, 0, false
		}
		offs[p] = n
		sum += n
	}
	return offs, sum, rows.Err() == nil
}

// waitWorking polls cond until it holds, and fails at once if a worker
// exits: a worker must ride out every outage. cond also says where things
// stand, for the failure message.
func (e *env) waitWorking(timeout time.Duration, what string, ws []*worker, cond func() (bool, string)) {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		for _, w := range ws {
			select {
			case <-w.done:
				e.t.Fatalf("worker %s exited (%v) while waiting for %s; a worker must ride out outages", w.name, w.p.ProcessState(), what)
			default:
			}
		}
		done, status := cond()
		if done {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out after %s waiting for %s: %s", timeout, what, status)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// waitForMoreCommits waits until at least n more jobs are committed than
// when it was called.
func (e *env) waitForMoreCommits(n int64, timeout time.Duration, ws ...*worker) {
	e.t.Helper()
	var base int64 = -1
	e.waitWorking(timeout, fmt.Sprintf("%d more jobs to be committed", n), ws, func() (bool, string) {
		_, sum, ok := e.storedOffsets()
		if !ok {
			return false, "the database does not answer"
		}
		if base < 0 {
			base = sum
		}
		return sum >= base+n, fmt.Sprintf("%d committed, from %d", sum, base)
	})
}

// waitEveryPartitionCommitted waits until every partition's stored next
// offset reaches its high watermark in end.
func (e *env) waitEveryPartitionCommitted(end map[int32]int64, timeout time.Duration, ws ...*worker) {
	e.t.Helper()
	e.waitWorking(timeout, fmt.Sprintf("every partition to be committed up to its high watermark %v", end), ws, func() (bool, string) {
		offs, _, ok := e.storedOffsets()
		if !ok {
			return false, "the database does not answer"
		}
		for p, hwm := range end {
			if offs[p] < hwm {
				return false, fmt.Sprintf("stored next offsets %v", offs)
			}
		}
		return true, ""
	})
}

// requireWorkersRunning fails the test if a worker process has exited.
func requireWorkersRunning(t *testing.T, ws ...*worker) {
	t.Helper()
	for _, w := range ws {
		select {
		case <-w.done:
			t.Errorf("worker %s exited (%v); a worker must ride out outages", w.name, w.p.ProcessState())
		default:
		}
	}
}

// terminateWorkerSessions ends every worker session on the cluster for the
// given time, over and over, and returns how many it ended.
func terminateWorkerSessions(t *testing.T, e *env, d time.Duration) int {
	t.Helper()
	return terminateSessions(t, e, d, workerApp)
}

// Postgres goes away under running workers, again and again: clean
// restarts, crash-like restarts, and sessions killed one by one, while jobs
// keep arriving. A commit that was in flight is settled by the fencing row;
// everything else is retried. The workers never exit, nothing is
// dead-lettered (an outage is not a job's fault: the workers run with
// --max-attempts 1, so one misjudged failure would dead-letter a job), and
// every job's effects are committed exactly once.
func TestPostgresOutagesAreRiddenOut(t *testing.T) {
	t.Parallel()
	const partitions = 4
	e, pg := newOutageEnv(t, partitions)
	// One worker commits every job on its own (the most commits in flight),
	// the other in batches.
	w1 := e.startWorker("R1", "--batch-max", "1", "--max-attempts", "1")
	w2 := e.startWorker("R2", "--batch-max", "20", "--max-attempts", "1")
	ws := []*worker{w1, w2}
	for _, w := range ws {
		w.waitLog(30*time.Second, map[string]any{"msg": "worker starting"})
	}
	waitForMembers(t, e, 2)

	prod := e.produceInRounds(1000, 20, 40*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for i, step := range []string{"fast", "terminate", "immediate", "terminate", "immediate", "fast", "immediate", "immediate"} {
		e.waitForMoreCommits(40, 30*time.Second, ws...) // batches are flowing
		start := time.Now()
		switch step {
		case "terminate":
			n := terminateWorkerSessions(t, e, time.Second)
			t.Logf("step %d: ended %d worker sessions in %s", i, n, time.Since(start).Round(time.Millisecond))
		default:
			if err := pg.Restart(ctx, step); err != nil {
				t.Fatalf("step %d: restarting Postgres (%s): %v", i, step, err)
			}
			t.Logf("step %d: Postgres restarted (%s) in %s", i, step, time.Since(start).Round(time.Millisecond))
		}
		requireWorkersRunning(t, ws...)
	}
	e.waitForMoreCommits(40, 30*time.Second, ws...)
	rounds := prod.stop()

	end := e.highWatermarks()
	e.waitEveryPartitionCommitted(end, 45*time.Second, ws...)
	requireWorkersRunning(t, ws...)
	h := checkRun(t, e, expect{ends: end})

	resolved := map[string]int{} // by outcome
	var retried int
	for _, w := range ws {
		for _, out := range []string{"committed", "not committed", "fenced", "unknown"} {
			resolved[out] += w.countLogs(map[string]any{"msg": "commit outcome was unknown; resolved from the fencing row", "outcome": out})
		}
		retried += w.countLogs(map[string]any{"msg": "batch failed on the database, retrying"})
	}
	t.Logf("%d rounds, %d jobs, %d fenced commits; %d database failures retried; commits of unknown outcome resolved: %v",
		rounds, len(h.Writes), fenceLogCount(h, "commit"), retried, resolved)
	if retried == 0 {
		t.Errorf("no batch failed on the database: the outages did not hit a batch in flight")
	}
	for _, w := range ws {
		w.stop(30 * time.Second)
	}
}

func fenceLogCount(h *history.History, kind string) int {
	n := 0
	for _, e := range h.Log {
		if e.Kind == kind {
			n++
		}
	}
	return n
}
