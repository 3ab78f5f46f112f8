package integration

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Least privilege: the roles `tenure migrate --print-roles` creates, on a
// throwaway cluster. Two workers log in as the worker role and hand a
// partition over, the new owner ending the session of the old one frozen
// in its transaction (pg_terminate_backend between sessions of the same
// role); the read-only admin commands run as the admin role. Neither role
// can change the schema, and the admin role cannot change rows.
// workerRoleHandOff runs two workers as the worker role, and the hand-off
// of a partition whose owner froze before its COMMIT with the rows it
// wrote locked; owner is the schema owner's connection.
func workerRoleHandOff(t *testing.T, ctx context.Context, e *env, owner *pgx.Conn) {
	t.Helper()
	e.produce(jobsFor(keys, 0, 20)...)
	a := e.startWorker("A", "--hold-once", "before-commit")
	a.waitLog(30*time.Second, map[string]any{"msg": "holding", "point": "before-commit"})
	b := e.startWorker("B")
	b.waitLog(30*time.Second, map[string]any{"msg": "worker starting"})
	waitForMembers(t, e, 2)
	a.pause()
	e.produce(jobsFor(keys, 20, 10)...)
	waitCommitted(t, e, 0, e.highWatermark(0), "B")
	b.waitLog(10*time.Second, map[string]any{"msg": "ended the session of an older owner of this partition that held locks this batch waits for (a worker frozen in its transaction)"})
	if m := b.findLog(map[string]any{"msg": "cannot end an older owner's session that holds locks this batch waits for: the database role needs to be the same as the other worker's, or a member of pg_signal_backend; waiting for idle_in_transaction_session_timeout instead"}); m != nil {
		t.Errorf("B could not end A's session: %v", m)
	}
	// The worker role writes the workers' heartbeat rows.
	var beats int
	if err := owner.QueryRow(ctx, `SELECT count(*) FROM "`+e.schema+`".workers WHERE consumer_group = $1 AND client_id = 'tenure-B'`, e.group).Scan(&beats); err != nil || beats != 1 {
		t.Errorf("B's heartbeat row as the worker role: %d rows, %v", beats, err)
	}
	a.resume()
	a.waitLogAny(30*time.Second, rejected, abandoned, map[string]any{"msg": "partitions lost"})
	checkStopped(t, e, b, a)
}

func TestLeastPrivilegeRoles(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	e, pg := newOutageEnv(t, 1)

	code, script := runTenure(t, nil, "migrate", "--print-roles", "--schema", e.schema, "--worker-role", "tw", "--admin-role", "ta")
	if code != 0 {
		t.Fatalf("--print-roles: exit %d\n%s", code, script)
	}
	owner, err := pgx.Connect(ctx, pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close(ctx)
	// The script runs as one simple-protocol batch, like psql -f.
	if _, err := owner.Exec(ctx, script, pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatalf("running the printed script: %v\n%s", err, script)
	}
	if _, err := owner.Exec(ctx, script, pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatalf("running it again (it must be idempotent): %v", err)
	}
	if _, err := owner.Exec(ctx, `ALTER ROLE tw LOGIN; ALTER ROLE ta LOGIN`); err != nil {
		t.Fatal(err)
	}
	as := func(role string) string {
		return fmt.Sprintf("postgres://%s@127.0.0.1:%d/postgres?sslmode=disable&application_name=%s", role, pg.Port, workerApp)
	}

	e.dbURL = as("tw")
	brokers := strings.Join(e.brokers, ",")
	workerRoleHandOff(t, ctx, e, owner)
	// The admin commands that read, as the admin role.
	t.Run("AdminReads", func(t *testing.T) {
		for _, args := range [][]string{
			{"admin", "assignments", "--brokers", brokers, "--group", e.group},
			{"admin", "fences", "--group", e.group},
			{"admin", "holds", "--group", e.group},
			{"admin", "dlq", "list", "--group", e.group},
			{"migrate", "status"},
		} {
			code, out := runTenure(t, nil, append(args, "--database-url", as("ta"), "--schema", e.schema)...)
			if code != 0 {
				t.Errorf("%v as the admin role: exit %d\n%s", args, code, out)
			}
		}
	})
	// What the roles may not do.
	t.Run("Refused", func(t *testing.T) {
		for _, c := range []struct {
			role, sql string
		}{
			{"tw", `CREATE TABLE "` + e.schema + `".intruder (x int)`},
			{"tw", `ALTER TABLE "` + e.schema + `".fences ADD COLUMN x int`},
			{"tw", `INSERT INTO "` + e.schema + `".schema_migrations (version, name) VALUES (999, 'x')`},
			{"tw", `CREATE SCHEMA elsewhere`},
			{"ta", `UPDATE "` + e.schema + `".fences SET next_offset = 0`},
			{"ta", `DELETE FROM "` + e.schema + `".dead_letters`},
		} {
			conn, err := pgx.Connect(ctx, as(c.role))
			if err != nil {
				t.Fatal(err)
			}
			_, err = conn.Exec(ctx, c.sql)
			conn.Close(ctx)
			if err == nil || !strings.Contains(err.Error(), "SQLSTATE 42501") {
				t.Errorf("%s: %s: %v, want insufficient_privilege (42501)", c.role, c.sql, err)
			}
		}
		code, out := runTenure(t, nil, "admin", "holds", "acknowledge", "--database-url", as("ta"), "--schema", e.schema,
			"--group", e.group, "--topic", e.topic, "--partition", "0")
		if code == 0 {
			t.Errorf("a state-changing admin command succeeded as the read-only role:\n%s", out)
		}
	})
	// A worker role whose schema is behind says so at start instead of
	// trying to migrate.
	t.Run("SchemaBehind", func(t *testing.T) {
		if _, err := owner.Exec(ctx, `DELETE FROM "`+e.schema+`".schema_migrations WHERE version = (SELECT max(version) FROM "`+e.schema+`".schema_migrations)`); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(tenureBin, "worker", "--brokers", brokers, "--group", e.group, "--topic", e.topic,
			"--database-url", as("tw"), "--schema", e.schema, "--handler", "export")
		outb, _ := cmd.CombinedOutput()
		if cmd.ProcessState.ExitCode() != 1 || !strings.Contains(string(outb), "lacks migration") ||
			!strings.Contains(string(outb), "this worker's database role may not migrate it") {
			t.Errorf("a worker role with a schema behind: exit %d\n%s", cmd.ProcessState.ExitCode(), outb)
		}
	})
}
