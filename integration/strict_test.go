package integration

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tenure-dev/tenure/consumer"
	protocol "github.com/tenure-dev/tenure/internal/fence"
	"github.com/tenure-dev/tenure/internal/history"
	"github.com/tenure-dev/tenure/internal/testinfra/pgtest"
	"github.com/tenure-dev/tenure/sink"
)

// Strict hand-off (--strict, G3-strict) with real worker processes. The
// machine's shared Postgres runs with max_prepared_transactions = 0, so
// these tests run against a throwaway cluster started with prepared
// transactions enabled (internal/testinfra/pgtest); the broker is kfake's, and the
// group protocol classic: kfake's KIP-848 offset commit rule cannot carry
// strict hand-off (docs/model/strict.pml, kip848-kfake), and the worker
// refuses it there. On a real cluster (TENURE_TEST_BROKERS) the KIP-848
// variant runs too, declared with --strict-coordinator kafka.

// newStrictEnv is newEnv on a throwaway Postgres with prepared
// transactions enabled.
func newStrictEnv(t *testing.T, partitions int32) *env {
	t.Helper()
	e := newEnv(t, partitions)
	c := pgtest.StartPrepared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pool := testPool(t, ctx, c.URL())
	if _, err := sink.Migrate(ctx, pool, e.schema); err != nil {
		t.Fatalf("migrating the throwaway cluster: %v", err)
	}
	e.pool, e.dbURL = pool, c.URL()
	return e
}

// strictProtocols are the group protocols the strict tests run under here.
func strictProtocols(e *env) [][]string {
	out := [][]string{{"--protocol", "classic"}}
	if e.real {
		out = append(out, []string{"--protocol", "consumer", "--strict-coordinator", "kafka"})
	}
	return out
}

// strictArgs are a strict worker's flags; TENURE_TEST_STRICT_CURGEN=1 adds
// the unsafe switch (the lane commits at the client's current generation),
// to show that these tests fail then.
func strictArgs(extra ...string) []string {
	args := append([]string{"--strict"}, extra...)
	if os.Getenv("TENURE_TEST_STRICT_CURGEN") != "" {
		args = append(args, "--unsafe-strict-current-generation")
	}
	return args
}

// strictEvents reads every worker's strict lines.
func (e *env) strictEvents() []history.StrictEvent { return parseLogs(e, history.ParseStrictEvent) }

// checkStrict runs checkRun (G1-G3, the coordinator's side, every job
// exactly once) and the strict check (history.CheckStrict), and returns
// the strict check's violations (reported as errors unless expectStrict).
func checkStrict(t *testing.T, e *env, classic, expectStrict bool, partitions ...int32) (*history.History, []history.Violation) {
	t.Helper()
	h := checkRun(t, e, expect{partitions: partitions})
	vs := history.CheckStrict(h, e.assignments(), e.strictEvents(), classic, false)
	for _, v := range vs {
		if expectStrict {
			t.Logf("strict violation (expected): %s", v)
		} else {
			t.Errorf("violation: %s", v)
		}
	}
	strictBatches := 0
	for _, en := range h.Log {
		if en.Kind == "commit" {
			if en.GID == "" {
				t.Errorf("commit #%d [%d,%d) of a strict worker carries no prepared transaction id", en.ID, en.From, en.To)
			}
			strictBatches++
		}
	}
	t.Logf("%d strict batches committed; %d decisions recorded; %d left prepared", strictBatches, len(h.StrictDecisions), len(h.Prepared))
	return h, vs
}

// strictFreeze is one of the freezes below: where worker A is held and
// frozen, and what B's claim must then decide about A's prepared batch.
type strictFreeze struct {
	point        string
	commitByNext bool // B's claim commits A's batch (else rolls it back)
}

// The old owner is frozen (SIGSTOP past the session timeout) with a batch
// prepared: before its offset commit; with the offset commit built and on
// its way (held in the worker, as a proxy would hold it in the network);
// after the coordinator accepted it and before COMMIT PREPARED. The new
// owner's claim waits for nothing: it lists the partition's prepared
// batches, reads the group's committed offset after its own assignment,
// and decides A's batch (commit only in the third case, where the offset
// names A's batch), then claims and processes everything else. When A
// wakes, nothing of its assignment becomes visible any more.
func TestStrictOldOwnerFrozen(t *testing.T) {
	for _, f := range []strictFreeze{
		{point: "strict-before-offset-commit"},
		{point: "strict-mid-offset-commit"},
		{point: "strict-before-commit-prepared", commitByNext: true},
	} {
		t.Run(f.point, func(t *testing.T) {
			t.Parallel()
			e := newStrictEnv(t, 1)
			for _, proto := range strictProtocols(e) {
				testStrictOldOwnerFrozen(t, e, f, proto)
				if len(strictProtocols(e)) > 1 {
					e = newStrictEnv(t, 1)
				}
			}
		})
	}
}

func testStrictOldOwnerFrozen(t *testing.T, e *env, f strictFreeze, proto []string) {
	e.produce(jobsFor(keys, 0, 20)...)
	a := e.startWorker("A", strictArgs(append(proto, "--hold-once", f.point)...)...)
	held := a.waitLog(30*time.Second, map[string]any{"msg": "holding", "point": f.point})
	gid := fmt.Sprint(held["gid"])
	b := e.startWorker("B", strictArgs(proto...)...)
	b.waitLog(30*time.Second, map[string]any{"msg": "worker starting"})
	waitForMembers(t, e, 2)
	a.pause()
	t.Logf("A frozen at %s with batch [%v,%v) prepared as %s", f.point, held["from"], held["to"], gid)
	if !strings.HasPrefix(gid, protocol.StrictPrefix(e.schema, sink.Partition{Group: e.group, Topic: e.topic, Partition: 0})) {
		t.Fatalf("A's batch id %q does not start with the partition's prefix", gid)
	}

	// B's claim resolves A's batch as the model says, then claims.
	res := b.waitLog(60*time.Second, map[string]any{"msg": consumer.MsgStrictResolved, "gid": gid})
	if got := res["committed"] == true; got != f.commitByNext {
		t.Errorf("B's claim decided A's batch committed=%v, want %v (%v)", got, f.commitByNext, res["evidence"])
	}
	claimed := b.waitLog(30*time.Second, map[string]any{"msg": consumer.MsgClaimed})
	wantNext := int64(held["from"].(float64))
	if f.commitByNext {
		wantNext = int64(held["to"].(float64))
	}
	if got := int64(claimed["next_offset"].(float64)); got != wantNext {
		t.Errorf("B claimed at next offset %d, want %d", got, wantNext)
	}
	waitCommitted(t, e, 0, e.highWatermark(0), "B")
	e.produce(jobsFor(keys, 20, 10)...)
	waitCommitted(t, e, 0, e.highWatermark(0), "B")

	a.resume()
	// A goes on: its offset commit (or COMMIT PREPARED) finds the batch
	// decided by B, and the fence log says which way.
	dec := a.waitLog(30*time.Second, map[string]any{"msg": consumer.MsgStrictDecided, "gid": gid})
	if dec["committed"] != f.commitByNext || dec["decided_by"] != "another claim" {
		t.Errorf("A learned committed=%v decided_by=%v, want %v by another claim", dec["committed"], dec["decided_by"], f.commitByNext)
	}
	if f.point != "strict-before-commit-prepared" {
		if ans := a.findLog(map[string]any{"msg": consumer.MsgStrictAnswered, "gid": gid}); ans == nil || ans["accepted"] != false {
			t.Errorf("A's late offset commit must be rejected by the coordinator: %v", ans)
		}
	}
	b.stop(30 * time.Second)
	a.stop(30 * time.Second)
	checkStrict(t, e, proto[1] == "classic", false, 0)
}

// A lane must commit its offsets at its OWN assignment's generation. Worker
// A holds two partitions, each lane with a batch prepared and held before
// its offset commit (strict-before-offset-commit-every). B joins: the
// cooperative rebalance revokes one partition from A (A stays alive:
// nothing is frozen), and A's revoke callback stops that lane, which then
// goes on to commit its batch's offset. At its own generation the
// coordinator rejects it (the group moved on) and the batch is rolled
// back; at the client's current generation (kgo's, which already is the
// new one) it would be accepted, and the batch of a revoked assignment
// would become visible. The kept lane commits at the generation its
// assignment was kept at.
func TestStrictLaneCommitsAtItsOwnGeneration(t *testing.T) {
	t.Parallel()
	_, vs := testStrictRevokedLane(t, false)
	if len(vs) > 0 {
		t.Errorf("%d strict violations (above)", len(vs))
	}
}

// The same with the lane committing at the client's current generation
// (--unsafe-strict-current-generation, the model's -DCURGEN): the check
// must catch it.
func TestStrictCurrentGenerationIsCaught(t *testing.T) {
	t.Parallel()
	h, vs := testStrictRevokedLane(t, true)
	found := false
	for _, v := range vs {
		found = found || v.Rule == "G3-strict"
	}
	if !found {
		t.Errorf("committing at the client's current generation went unnoticed: %d strict batches, violations %v", len(h.Log), vs)
	}
}

func testStrictRevokedLane(t *testing.T, unsafeCurrent bool) (*history.History, []history.Violation) {
	e := newStrictEnv(t, 2)
	produceTo(t, e, 0, 10)
	produceTo(t, e, 1, 10)
	args := strictArgs("--hold-once", "strict-before-offset-commit-every", "--rebalance-timeout", "4s")
	if unsafeCurrent {
		args = append(args, "--unsafe-strict-current-generation")
	}
	a := e.startWorker("A", args...)
	waitFor(t, 30*time.Second, "both of A's lanes to hold a prepared batch", func() bool {
		return a.countLogs(map[string]any{"msg": "holding"}) == 2
	})
	b := e.startWorker("B", strictArgs()...)
	// The revoked lane is stopped hard after half the rebalance timeout and
	// goes on with its offset commit; B is then given the partition.
	ended := a.waitLog(60*time.Second, map[string]any{"msg": consumer.MsgAssignmentEnded, "why": "revoked"})
	p := int32(ended["partition"].(float64))
	t.Logf("partition %d revoked from A", p)
	dec := a.waitLog(30*time.Second, map[string]any{"msg": consumer.MsgStrictDecided, "partition": p})
	t.Logf("A's revoked lane: committed=%v (%v)", dec["committed"], dec["evidence"])
	if !unsafeCurrent && dec["committed"] != false {
		t.Errorf("the revoked lane's batch must be rolled back: %v", dec)
	}
	b.waitLog(60*time.Second, map[string]any{"msg": consumer.MsgClaimed, "partition": p})
	a.resume() // SIGCONT releases the kept lane's hold
	produceTo(t, e, 0, 5)
	produceTo(t, e, 1, 5)
	waitCommitted(t, e, 0, e.highWatermark(0), "")
	waitCommitted(t, e, 1, e.highWatermark(1), "")
	b.stop(30 * time.Second)
	a.stop(30 * time.Second)
	return checkStrict(t, e, true, unsafeCurrent, 0, 1)
}

// produceTo writes n jobs to partition p.
func produceTo(t *testing.T, e *env, p int32, n int) {
	t.Helper()
	jobs := make([][2]string, n)
	for i := range jobs {
		// Keys of their own per partition: a prepared batch holds its
		// exports' row locks until it is decided, and another partition's
		// batch writing the same keys would wait for it.
		jobs[i] = [2]string{fmt.Sprintf("p%d-%s", p, keys[i%len(keys)]), fmt.Sprintf(`{"p":%d,"seq":%d}`, p, i)}
	}
	e.produceTo(p, jobs...)
}

// A strict worker refuses to start, in one sentence, on a server whose
// max_prepared_transactions is 0 (the machine's shared Postgres), and
// under the consumer protocol unless the coordinator's rule is declared.
func TestStrictRefusedWithoutPreparedTransactions(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT current_setting('max_prepared_transactions')::int`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Skipf("the test database has max_prepared_transactions = %d: nothing to refuse", n)
	}
	base := []string{"worker", "--brokers", strings.Join(e.brokers, ","), "--group", e.group, "--topic", e.topic,
		"--database-url", e.dbURL, "--schema", e.schema, "--handler", "export"}
	r := runCLI(t, 60*time.Second, "", append(base, "--strict")...)
	wantFailure(t, r, 1, "max_prepared_transactions is 0")

	r = runCLI(t, 60*time.Second, "", append(base, "--strict", "--protocol", "consumer")...)
	wantFailure(t, r, 2, "--strict-coordinator kafka")
}

// `tenure demo --strict` tells the strict story on a database with
// prepared transactions: A frozen with its batch prepared, B's claim rolls
// it back, the coordinator refuses A's late offset commit.
func TestDemoStrict(t *testing.T) {
	t.Parallel()
	e := newStrictEnv(t, 1) // only its throwaway cluster is used
	stdout := runDemoStory(t, e.dbURL, []string{
		"PREPAREs the transaction",
		"SIGSTOP worker A — frozen with its batch prepared",
		"reads the group's committed offset",
		"rolls it back (ROLLBACK PREPARED)",
		"the coordinator rejects A's offset commit",
		"already rolled back by B's claim",
		"verdict: PASS",
	}, "--strict", "--schema", "tenure_demo_strict")
	t.Logf("demo output:\n%s", stdout)
}

// A group deleted while a batch is prepared: A's offset commit was
// accepted, A is frozen before COMMIT PREPARED and evicted, and the empty
// group is deleted (`tenure admin group delete`: the incarnation moves on,
// Kafka's offsets are gone with the group). The next lifetime's first claim
// is above A's token, resolves A's batch, and finds no offset naming it: the
// batch is rolled back (its record was lost with the group, which the
// model allows), and its jobs run again in the new lifetime, once.
func TestStrictGroupDeletedWithPreparedBatch(t *testing.T) {
	t.Parallel()
	e := newStrictEnv(t, 1)
	e.produce(jobsFor(keys, 0, 20)...)
	a := e.startWorker("A", strictArgs("--hold-once", "strict-before-commit-prepared")...)
	held := a.waitLog(30*time.Second, map[string]any{"msg": "holding", "point": "strict-before-commit-prepared"})
	gid := fmt.Sprint(held["gid"])
	a.pause()
	del := func() cliResult {
		return runCLI(t, 30*time.Second, "", "admin", "group", "delete", "--brokers", strings.Join(e.brokers, ","),
			"--database-url", e.dbURL, "--schema", e.schema, "--group", e.group, "--actor", "ops@example")
	}
	var r cliResult
	waitFor(t, 30*time.Second, "A to be evicted and the group deleted", func() bool {
		r = del()
		return r.code == 0
	})
	t.Logf("group deleted with A's accepted batch %s prepared: %s", gid, strings.TrimSpace(r.stdout))
	n := e.startWorker("N", strictArgs()...)
	res := n.waitLog(60*time.Second, map[string]any{"msg": consumer.MsgStrictResolved, "gid": gid})
	if res["committed"] != false {
		t.Errorf("the new lifetime's claim must roll A's batch back (the group's offsets are gone): %v", res)
	}
	claimed := n.waitLog(30*time.Second, map[string]any{"msg": consumer.MsgClaimed})
	if claimed["token"] != "1.1" {
		t.Errorf("the new lifetime's first claim has token %v, want 1.1", claimed["token"])
	}
	waitCommitted(t, e, 0, e.highWatermark(0), "N")
	a.resume()
	dec := a.waitLog(30*time.Second, map[string]any{"msg": consumer.MsgStrictDecided, "gid": gid})
	if dec["committed"] != false {
		t.Errorf("A's batch must stay rolled back: %v", dec)
	}
	h := checkStopped(t, e, n, a)
	// A's batch was accepted, then rolled back: excused by the deletion.
	for _, v := range history.CheckStrict(h, e.assignments(), e.strictEvents(), true, true) {
		t.Errorf("violation: %s", v)
	}
	strict := history.CheckStrict(h, e.assignments(), e.strictEvents(), true, false)
	if len(strict) != 1 || strict[0].Rule != "strict-record" {
		t.Errorf("without the deletion excused, the checker must report A's accepted batch rolled back (G3-record) and nothing else: %v", strict)
	}
}

// A worker without --strict meets a strict worker's prepared batch (a
// rolling restart that turns strict off, a strict owner that froze). The
// batch holds the fencing row's lock until it is decided, and only strict
// claims used to decide: the plain worker's claim waited on the lock until
// its claim timeout, abandoned its whole group session, rejoined, and did
// it again every few seconds, the partition never processed. Every claim
// now decides the older prepared batches first, whatever its own mode.
func TestPlainWorkerResolvesAStrictBatch(t *testing.T) {
	t.Parallel()
	e := newStrictEnv(t, 1)
	e.produce(jobsFor(keys, 0, 20)...)
	a := e.startWorker("A", strictArgs("--protocol", "classic", "--hold-once", "strict-before-offset-commit")...)
	held := a.waitLog(30*time.Second, map[string]any{"msg": "holding", "point": "strict-before-offset-commit"})
	gid := fmt.Sprint(held["gid"])
	b := e.startWorker("B", "--protocol", "classic")
	b.waitLog(30*time.Second, map[string]any{"msg": "worker starting"})
	waitForMembers(t, e, 2)
	a.pause()
	t.Logf("A (strict) frozen with batch [%v,%v) prepared as %s; B runs without --strict", held["from"], held["to"], gid)

	res := b.waitLog(60*time.Second, map[string]any{"msg": consumer.MsgStrictResolved, "gid": gid})
	if res["committed"] != false {
		t.Errorf("B decided A's batch committed=%v, want rolled back: its offset commit was never sent (%v)", res["committed"], res["evidence"])
	}
	waitCommitted(t, e, 0, e.highWatermark(0), "B")
	if m := b.findLog(map[string]any{"msg": consumer.MsgClaimFailed}); m != nil {
		t.Errorf("B's claim failed on the way: %v", m)
	}
	a.resume()
	a.waitLogAny(30*time.Second, map[string]any{"msg": consumer.MsgStrictDecided, "gid": gid}, map[string]any{"msg": "partitions lost"})
	checkStopped(t, e, b, a)
}

// Workers that log in as different roles, each granted the schema's worker
// role (the setup `migrate --print-roles` documents). PostgreSQL lets only
// the role that prepared a transaction, or a superuser, finish it: the
// next owner's ROLLBACK PREPARED failed with 42501 and its claim then
// waited on the fencing row's lock, the partition wedged. Batches are now
// prepared and finished as the shared worker role.
func TestStrictBatchOfAnotherLoginRole(t *testing.T) {
	t.Parallel()
	e := newStrictEnv(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	code, script := runTenure(t, nil, "migrate", "--print-roles", "--schema", e.schema, "--worker-role", "tw", "--admin-role", "ta")
	if code != 0 {
		t.Fatalf("--print-roles: exit %d\n%s", code, script)
	}
	if _, err := e.pool.Exec(ctx, script, pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatalf("running the printed script: %v", err)
	}
	if _, err := e.pool.Exec(ctx, `CREATE ROLE alice LOGIN; GRANT tw TO alice; CREATE ROLE bob LOGIN; GRANT tw TO bob`, pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatal(err)
	}
	as := func(role string) string {
		u, err := url.Parse(e.dbURL)
		if err != nil {
			t.Fatal(err)
		}
		u.User = url.User(role)
		return u.String()
	}
	e.produce(jobsFor(keys, 0, 20)...)
	a := e.startWorker("A", strictArgs("--protocol", "classic", "--hold-once", "strict-before-offset-commit", "--database-url", as("alice"))...)
	held := a.waitLog(30*time.Second, map[string]any{"msg": "holding", "point": "strict-before-offset-commit"})
	gid := fmt.Sprint(held["gid"])
	var owner string
	if err := e.pool.QueryRow(ctx, `SELECT owner::text FROM pg_prepared_xacts WHERE gid = $1`, gid).Scan(&owner); err != nil {
		t.Fatal(err)
	}
	if owner != "tw" {
		t.Errorf("A (logged in as alice) prepared its batch as %q, want the shared worker role tw", owner)
	}
	b := e.startWorker("B", strictArgs("--protocol", "classic", "--database-url", as("bob"))...)
	b.waitLog(30*time.Second, map[string]any{"msg": "worker starting"})
	waitForMembers(t, e, 2)
	a.pause()

	res := b.waitLog(60*time.Second, map[string]any{"msg": consumer.MsgStrictResolved, "gid": gid})
	if res["committed"] != false {
		t.Errorf("B decided A's batch committed=%v, want rolled back (%v)", res["committed"], res["evidence"])
	}
	waitCommitted(t, e, 0, e.highWatermark(0), "B")
	a.resume()
	a.waitLogAny(30*time.Second, map[string]any{"msg": consumer.MsgStrictDecided, "gid": gid}, map[string]any{"msg": "partitions lost"})
	b.stop(30 * time.Second)
	a.stop(30 * time.Second)
	checkStrict(t, e, true, false, 0)
}
