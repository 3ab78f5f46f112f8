package integration

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/internal/testinfra/freeport"
	"github.com/tenure-dev/tenure/internal/testinfra/pgtest"
)

// PgBouncer in transaction pooling mode in front of a throwaway Postgres
// (docs/pgbouncer.md). scripts/test.sh installs the Debian package and sets
// TENURE_TEST_REQUIRE_PGBOUNCER, so that CI cannot skip these tests.

// pgbouncerDB is the database name clients use; pgbouncer maps it to the
// cluster's postgres database.
const pgbouncerDB = "pgb_tenure"

type pgBouncer struct {
	t      *testing.T
	port   int
	bin    string
	args   []string
	cmd    *exec.Cmd
	exited chan struct{}
	out    lockedWriter // pgbouncer's log (for the test's failure message)
}

// url is a database URL through the pooler; query is appended as is.
func (b *pgBouncer) url(query string) string {
	u := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", b.port, pgbouncerDB)
	if query != "" {
		u += "&" + query
	}
	return u
}

func pgbouncerPath(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("pgbouncer")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/pgbouncer"); serr == nil {
			return "/usr/sbin/pgbouncer"
		}
		if os.Getenv("TENURE_TEST_REQUIRE_PGBOUNCER") != "" {
			t.Fatalf("pgbouncer is required (TENURE_TEST_REQUIRE_PGBOUNCER) but not found: %v", err)
		}
		t.Skip("pgbouncer not installed (apt-get install pgbouncer)")
	}
	return p
}

// startPgBouncer runs pgbouncer (transaction pooling, at most poolSize
// server connections) in front of pg on a port in 16400-16499, as the
// postgres OS user when the test runs as root (pgbouncer refuses root),
// and ends it (by its PID) when the test ends.
func startPgBouncer(t *testing.T, pg *pgtest.Cluster, poolSize int) *pgBouncer {
	t.Helper()
	bin := pgbouncerPath(t)
	dir, err := os.MkdirTemp("", "pgb_")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b := &pgBouncer{}
	// freeport: never the port of another test's PgBouncer that has not
	// bound it yet (these tests run in parallel).
	if b.port, err = freeport.Block(1); err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf(`[databases]
%s = host=127.0.0.1 port=%d dbname=postgres user=postgres

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = %d
max_client_conn = 500
server_reset_query =
ignore_startup_parameters = extra_float_digits
server_login_retry = 1
`, pgbouncerDB, pg.Port, b.port, poolSize)
	ini := filepath.Join(dir, "pgbouncer.ini")
	if err := os.WriteFile(ini, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{ini}
	if os.Geteuid() == 0 {
		if _, err := user.Lookup("postgres"); err != nil {
			t.Fatalf("pgbouncer refuses to run as root and there is no postgres OS user: %v", err)
		}
		args = []string{"-u", "postgres", ini}
	}
	b.t, b.bin, b.args = t, bin, args
	t.Cleanup(func() { b.stop(syscall.SIGINT) })
	b.start()
	return b
}

// start runs pgbouncer and waits until it listens.
func (b *pgBouncer) start() {
	t := b.t
	t.Helper()
	b.cmd = exec.Command(b.bin, b.args...)
	b.cmd.Stdout, b.cmd.Stderr = &b.out, &b.out
	if err := b.cmd.Start(); err != nil {
		t.Fatalf("starting pgbouncer: %v", err)
	}
	exited := make(chan struct{})
	b.exited = exited
	go func(cmd *exec.Cmd) { _ = cmd.Wait(); close(exited) }(b.cmd)
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", b.port), time.Second)
		if err == nil {
			c.Close()
			return
		}
		select {
		case <-exited:
			t.Fatalf("pgbouncer exited at start: %s", b.out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("pgbouncer does not listen on %d after 15s: %s", b.port, b.out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop ends pgbouncer (by its PID) with sig and waits for it to exit.
func (b *pgBouncer) stop(sig syscall.Signal) {
	if b.cmd == nil || b.cmd.Process == nil {
		return
	}
	_ = b.cmd.Process.Signal(sig)
	select {
	case <-b.exited:
	case <-time.After(10 * time.Second):
		_ = b.cmd.Process.Kill()
		<-b.exited
	}
}

// A worker started through a transaction pooler with pgx's default
// statement cache, and a migration through it, are refused at start with
// one sentence; with default_query_exec_mode=cache_describe the worker starts.
func TestPgBouncerRefusals(t *testing.T) {
	t.Parallel()
	e, pg := newOutageEnv(t, 1)
	pgb := startPgBouncer(t, pg, 10)
	base := []string{"worker", "--brokers", strings.Join(e.brokers, ","), "--group", e.group, "--topic", e.topic,
		"--schema", e.schema, "--handler", "export"}

	r := runCLI(t, 60*time.Second, "", append(base, "--database-url", pgb.url(""))...)
	wantFailure(t, r, 1, "connection pooler", "default_query_exec_mode=cache_describe")
	t.Logf("default exec mode through pgbouncer: %s", strings.TrimSpace(r.stderr))

	// A schema that needs migrating: the worker would migrate it, under a
	// session-level advisory lock that the pooler does not keep.
	r = runCLI(t, 60*time.Second, "", append(base[:len(base)-4], "--schema", "pgb_new", "--create-schema", "--handler", "export",
		"--database-url", pgb.url("default_query_exec_mode=cache_describe"))...)
	wantFailure(t, r, 1, "session-level advisory lock", "tenure migrate up")
	t.Logf("migration by a worker through pgbouncer: %s", strings.TrimSpace(r.stderr))

	r = runCLI(t, 60*time.Second, "", "migrate", "up", "--schema", "pgb_new", "--database-url", pgb.url("default_query_exec_mode=cache_describe"))
	wantFailure(t, r, 1, "session-level advisory lock")
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_namespace WHERE nspname = 'pgb_new'`).Scan(&n); err != nil || n != 0 {
		t.Errorf("schema pgb_new after refused migrations: %d (%v)", n, err)
	}

	// The same URL straight to Postgres is not a pooler: accepted. (The
	// group has never run here: a heartbeat row makes it one the schema
	// knows, or the command would refuse the name.)
	if _, err := e.pool.Exec(context.Background(), `INSERT INTO `+pgx.Identifier{e.schema}.Sanitize()+`.workers (consumer_group, member_id, client_id, host, pid)
		VALUES ($1, 'm', 'c', 'h', 1)`, e.group); err != nil {
		t.Fatal(err)
	}
	r = runCLI(t, 60*time.Second, "", "admin", "assignments", "--brokers", strings.Join(e.brokers, ","), "--group", e.group, "--topic", e.topic,
		"--schema", e.schema, "--database-url", pg.URL())
	if r.code != 0 {
		t.Errorf("an admin command straight to Postgres failed: %s", r)
	}
}

// Workers in transaction pooling mode (default_query_exec_mode=cache_describe):
// batches flow; backends ended under them (a COMMIT whose outcome is
// unknown) are ridden out; a zombie's batch is rejected by the fence; the
// lock watch ends a frozen older owner's server backend through the
// pooler; admin commands work; every job is committed exactly once.
// outagesBehindPgBouncer ends server backends, kills pgbouncer and
// restarts Postgres in turn, each after the workers ws committed more,
// and checks that they ride every outage out.
func outagesBehindPgBouncer(t *testing.T, e *env, pg *pgtest.Cluster, pgb *pgBouncer, ws []*worker) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for i, step := range []string{"terminate", "kill-pgbouncer", "immediate", "terminate", "kill-pgbouncer", "fast", "kill-pgbouncer"} {
		e.waitForMoreCommits(40, 45*time.Second, ws...)
		switch step {
		case "terminate":
			n := terminateServerBackends(t, e, time.Second)
			t.Logf("step %d: ended %d server backends behind pgbouncer", i, n)
		case "kill-pgbouncer":
			// Every client connection drops at once, COMMITs in flight
			// included: their outcome is unknown to the worker.
			pgb.stop(syscall.SIGKILL)
			time.Sleep(200 * time.Millisecond)
			pgb.start()
			t.Logf("step %d: pgbouncer killed and restarted", i)
		default:
			if err := pg.Restart(ctx, step); err != nil {
				t.Fatalf("step %d: restarting Postgres (%s): %v", i, step, err)
			}
		}
		requireWorkersRunning(t, ws...)
	}
}

func TestPgBouncerTransactionPooling(t *testing.T) {
	t.Parallel()
	const partitions = 2
	e, pg := newOutageEnv(t, partitions)
	pgb := startPgBouncer(t, pg, 12)
	e.dbURL = pgb.url("default_query_exec_mode=cache_describe&application_name=" + workerApp)

	// Zombie: A holds before its first commit with its transaction open
	// (locks held) and freezes; B gets the partitions, its lock watch ends
	// A's server backend, B commits everything; A, resumed, commits nothing.
	e.produce(jobsFor(keys, 0, 40)...)
	a := e.startWorker("A", "--hold-once", "before-commit")
	held := a.waitLog(60*time.Second, map[string]any{"msg": "holding", "point": "before-commit"})
	b := e.startWorker("B")
	b.waitLog(60*time.Second, map[string]any{"msg": "worker starting"})
	waitForMembers(t, e, 2)
	a.pause()
	claimed := b.waitLog(60*time.Second, map[string]any{"msg": consumer.MsgClaimed, "partition": held["partition"]})
	if !tokenLess(t, fmt.Sprint(held["token"]), fmt.Sprint(claimed["token"])) {
		t.Fatalf("B claimed with token %v, not above A's %v", claimed["token"], held["token"])
	}
	for p := int32(0); p < partitions; p++ {
		waitCommitted(t, e, p, e.highWatermark(p), "B")
	}
	// B's batches wait for the rows A's open transaction locked: only the
	// lock watch, ending A's server backend by the pid the server reports
	// (not the pooler's), lets them commit before the lock timeout.
	ended := b.findLog(map[string]any{"msg": "ended the session of an older owner of this partition that held locks this batch waits for (a worker frozen in its transaction)"})
	if ended == nil {
		t.Errorf("B's lock watch did not end A's server backend through pgbouncer")
	}
	a.resumeLost(t, map[string]any{"msg": "batch failed on the database, retrying"})
	t.Logf("A (token %v) frozen before COMMIT; B claimed at %v; lock watch: %v", held["token"], claimed["token"], ended)
	a.stop(30 * time.Second)

	// Outages under batches in flight through the pooler: server
	// backends ended (pg_terminate_backend) and Postgres restarted.
	w1 := e.startWorker("R1", "--batch-max", "1", "--max-attempts", "1")
	ws := []*worker{b, w1}
	w1.waitLog(60*time.Second, map[string]any{"msg": "worker starting"})
	waitForMembers(t, e, 2)
	prod := e.produceInRounds(1000, 20, 40*time.Millisecond)
	outagesBehindPgBouncer(t, e, pg, pgb, ws)
	e.waitForMoreCommits(40, 45*time.Second, ws...)
	prod.stop()
	end := e.highWatermarks()
	e.waitEveryPartitionCommitted(end, 60*time.Second, ws...)
	requireWorkersRunning(t, ws...)

	// Admin commands through the pooler.
	for _, args := range [][]string{
		{"admin", "assignments", "--brokers", strings.Join(e.brokers, ","), "--group", e.group, "--topic", e.topic, "--schema", e.schema, "--database-url", e.dbURL},
		{"admin", "dlq", "list", "--group", e.group, "--schema", e.schema, "--database-url", e.dbURL},
	} {
		if r := runCLI(t, 60*time.Second, "", args...); r.code != 0 {
			t.Errorf("tenure %s through pgbouncer: %s", strings.Join(args[:2], " "), r)
		}
	}
	for _, w := range ws {
		w.stop(30 * time.Second)
	}
	h := checkRun(t, e, expect{ends: end})
	var retried int
	resolved := map[string]int{}
	for _, w := range ws {
		retried += w.countLogs(map[string]any{"msg": "batch failed on the database, retrying"})
		for _, out := range []string{"committed", "not committed", "fenced", "unknown"} {
			resolved[out] += w.countLogs(map[string]any{"msg": "commit outcome was unknown; resolved from the fencing row", "outcome": out})
		}
	}
	t.Logf("%d jobs; %d database failures retried; unknown commit outcomes resolved: %v", len(h.Writes), retried, resolved)
	if retried == 0 {
		t.Errorf("no batch failed on the database: the outages did not hit a batch in flight")
	}
	if strings.Contains(pgb.out.String(), "prepared statement") {
		t.Errorf("pgbouncer logged prepared statement errors:\n%s", pgb.out.String())
	}
}

// terminateServerBackends ends, for d, every server backend pgbouncer
// opened for the workers (their application_name is the worker's, or a
// batch's tenure:<claim> while it runs).
func terminateServerBackends(t *testing.T, e *env, d time.Duration) int {
	t.Helper()
	return terminateSessions(t, e, d, workerApp, "tenure:%")
}

// Strict hand-off (--strict: PREPARE TRANSACTION, offset commit, COMMIT
// PREPARED) through a transaction pooler: a prepared transaction belongs
// to no session, so COMMIT PREPARED may run on any server connection.
func TestPgBouncerStrict(t *testing.T) {
	t.Parallel()
	const partitions = 2
	e, pg := newOutageEnv(t, partitions)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := pg.AppendConf("max_prepared_transactions = 20"); err != nil {
		t.Fatal(err)
	}
	if err := pg.Restart(ctx, "fast"); err != nil {
		t.Fatal(err)
	}
	pgb := startPgBouncer(t, pg, 8)
	e.dbURL = pgb.url("default_query_exec_mode=cache_describe&application_name=" + workerApp)
	w1 := e.startWorker("S1", "--strict")
	w2 := e.startWorker("S2", "--strict")
	ws := []*worker{w1, w2}
	for _, w := range ws {
		w.waitLog(60*time.Second, map[string]any{"msg": "worker starting"})
	}
	waitForMembers(t, e, 2)
	prod := e.produceInRounds(30, 20, 30*time.Millisecond)
	e.waitForMoreCommits(100, 45*time.Second, ws...)
	w1.stop(30 * time.Second) // a hand-off in the middle
	prod.stop()
	end := e.highWatermarks()
	e.waitEveryPartitionCommitted(end, 60*time.Second, w2)
	w2.stop(30 * time.Second)
	var prepared int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_prepared_xacts`).Scan(&prepared); err != nil || prepared != 0 {
		t.Errorf("%d prepared transactions left (%v)", prepared, err)
	}
	decided := 0
	for _, w := range ws {
		decided += w.countLogs(map[string]any{"msg": consumer.MsgStrictDecided})
	}
	if decided == 0 {
		t.Errorf("no strict batch was decided: the workers did not run strict batches")
	}
	h := checkRun(t, e, expect{ends: end})
	t.Logf("%d jobs committed through pgbouncer with --strict, %d strict batches decided", len(h.Writes), decided)
}
