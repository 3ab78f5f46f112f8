package consumer_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/internal/fence"
	"github.com/tenure-dev/tenure/sink"
)

// A handler that ends its own transaction with COMMIT (or ROLLBACK) in its
// SQL would make the fence run in autocommit, where its rejection rolls
// nothing back. The lane finds out before the fence, names the job, and
// halts the partition: nothing more is committed for it, not even by the
// next worker it is assigned to, until an operator resumes it.
//
// With CommitSpan above 1 the one partition's batches go through the joint
// committer, each alone in its transaction (nothing else is queued): the
// path without a savepoint catches the bug the same way.
func TestHandlerThatEndsItsTransactionHaltsThePartition(t *testing.T) {
	t.Parallel()
	for _, span := range []int{1, 4} {
		for _, stmt := range []string{"COMMIT", "ROLLBACK"} {
			t.Run(fmt.Sprintf("%s/span%d", stmt, span), func(t *testing.T) {
				t.Parallel()
				testHandlerEndsItsTransaction(t, stmt, span)
			})
		}
	}
}

func testHandlerEndsItsTransaction(t *testing.T, stmt string, span int) {
	r := newHaltRun(t, stmt)
	log, logs := dumpedLogger(t)
	r.cfg = r.b.config(consumer.HandlerFunc(r.handle), log)
	r.cfg.CommitSpan = span
	c, stop := runNew(t, r.cfg)
	before := r.runIntoTheBug(t, c)
	r.checkHalted(t, c, logs, before)

	// The halt is in Postgres: another worker that gets the partition does
	// not run the handler either.
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	r.nextWorkerWaitsForTheOperator(t, before)
}

// haltRun is testHandlerEndsItsTransaction's partition and handler: a
// handler that, until fixed, ends its transaction with stmt at a job whose
// value is "bug".
type haltRun struct {
	b     *bundle
	ctx   context.Context
	key   sink.Partition
	table string
	stmt  string
	cfg   consumer.Config
	mu    sync.Mutex
	calls int
	fixed bool
}

func newHaltRun(t *testing.T, stmt string) *haltRun {
	b := setup(t, 1)
	r := &haltRun{b: b, ctx: context.Background(), key: sink.Partition{Group: b.group, Topic: b.topic},
		table: pgx.Identifier{b.schema, "out"}.Sanitize(), stmt: stmt}
	if _, err := b.pool.Exec(r.ctx, `CREATE TABLE `+r.table+` (job text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *haltRun) handle(ctx context.Context, tx consumer.Tx, batch *consumer.Batch) error {
	r.mu.Lock()
	r.calls++
	buggy := !r.fixed
	r.mu.Unlock()
	for _, rec := range batch.Records {
		if _, err := tx.Exec(ctx, `INSERT INTO `+r.table+` VALUES ($1)`, consumer.JobID(rec)); err != nil {
			return err
		}
		if buggy && string(rec.Value) == "bug" {
			// A helper that "finishes" its own work.
			if _, err := tx.Exec(ctx, r.stmt); err != nil {
				return err
			}
		}
	}
	return nil
}

func (r *haltRun) callsSoFar() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls
}

// runIntoTheBug runs five good jobs, then the bug, then five more jobs the
// halted lane must not run; it returns the handler's calls up to the bug.
func (r *haltRun) runIntoTheBug(t *testing.T, c *consumer.Consumer) (before int) {
	r.b.produce(5, oneKey)
	r.b.waitDone(30 * time.Second)
	r.b.produceValues(1, oneKey, func(int) string { return "bug" })
	waitForCond(t, 30*time.Second, "the handler bug to be detected", func() bool { return c.Stats().HandlerBugs == 1 })
	before = r.callsSoFar()
	r.b.produce(5, oneKey)
	time.Sleep(time.Second) // a lane that went on would have run by now
	return before
}

// checkHalted checks that the partition is halted at the bug, and says so.
func (r *haltRun) checkHalted(t *testing.T, c *consumer.Consumer, logs *observer.ObservedLogs, before int) {
	b := r.b
	if f, err := b.store.Get(r.ctx, r.key); err != nil || f.NextOffset != 5 {
		t.Errorf("the fencing row moved past the halted batch: %+v, %v", f, err)
	}
	if calls := r.callsSoFar(); calls != before {
		t.Errorf("the handler ran %d more times after the bug was found", calls-before)
	}
	if st := c.Stats(); st.LanesHalted != 1 || st.Batches != 1 {
		t.Errorf("stats: %d lanes halted, %d batches committed; want 1 and 1", st.LanesHalted, st.Batches)
	}
	logged := logs.FilterMessageSnippet("handler bug: it ended the batch's transaction itself").All()
	if len(logged) != 1 || logged[0].Level != zap.ErrorLevel || logged[0].ContextMap()["job"] != b.topic+"/0/5" ||
		!strings.Contains(logged[0].Message, "tenure admin holds acknowledge --group "+b.group+" --topic "+b.topic+" --partition 0") {
		t.Errorf("the halt was not logged as an error naming job %s/0/5 and the command that resumes it: %v", b.topic, logged)
	}
	halt, halted, err := fence.Of(b.store).OpenHoldNeedingAck(r.ctx, r.key)
	if err != nil || !halted || halt.Kind != sink.HoldHandlerBug || halt.FirstJob != b.topic+"/0/5" || halt.From != 5 || halt.To != 6 || halt.Token.Epoch <= 0 {
		t.Fatalf("halt recorded: %+v %v %v", halt, halted, err)
	}
	if dls := b.deadLetters(); len(dls) != 0 {
		t.Errorf("a handler bug dead-lettered %d jobs", len(dls))
	}
}

// nextWorkerWaitsForTheOperator starts another worker: it does not run
// the handler on the halted partition until the operator deploys a fixed
// handler and acknowledges, then it runs every job.
func (r *haltRun) nextWorkerWaitsForTheOperator(t *testing.T, before int) {
	b := r.b
	c2, stop := runNew(t, r.cfg)
	waitForCond(t, 30*time.Second, "the next worker to see the halt", func() bool { return c2.Stats().LanesHalted == 1 })
	time.Sleep(500 * time.Millisecond)
	r.mu.Lock()
	if r.calls != before {
		t.Errorf("the next worker ran the handler %d times on a halted partition", r.calls-before)
	}
	r.fixed = true // the operator deploys a fixed handler...
	r.mu.Unlock()
	if _, err := b.store.AcknowledgeHold(r.ctx, r.key, "ops", -1, -1, [16]byte{}); err != nil { // ...and acknowledges
		t.Fatalf("acknowledging the hold: %v", err)
	}
	b.waitDone(30 * time.Second)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if st := c2.Stats(); st.LanesHalted != 0 || st.HandlerBugs != 0 {
		t.Errorf("after the resume: %d lanes halted, %d bugs; want 0 and 0", st.LanesHalted, st.HandlerBugs)
	}
	var n int
	if err := b.pool.QueryRow(r.ctx, `SELECT count(DISTINCT job) FROM `+r.table).Scan(&n); err != nil || n != 11 {
		t.Errorf("%d jobs written (%v), want 11", n, err)
	}
}
