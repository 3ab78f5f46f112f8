package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tenure-dev/tenure/internal/testinfra/testdb"
)

// canary is a table in the shared database that an injection through any
// name would be aimed at; it must be intact after every command.
type canary struct {
	t      *testing.T
	e      *env
	schema string
}

func newCanary(t *testing.T, e *env) *canary {
	t.Helper()
	c := &canary{t: t, e: e, schema: testdb.FreshSchema(t, e.pool, "tenure_canary")}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := e.pool.Exec(ctx, `CREATE SCHEMA "`+c.schema+`"; CREATE TABLE "`+c.schema+`".canary (id int PRIMARY KEY);
		INSERT INTO "`+c.schema+`".canary SELECT generate_series(1, 3)`); err != nil {
		t.Fatal(err)
	}
	return c
}

// check fails the test unless the canary table and the test's tenure tables
// are still there, whole.
func (c *canary) check(after string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n int
	if err := c.e.pool.QueryRow(ctx, `SELECT count(*) FROM "`+c.schema+`".canary`).Scan(&n); err != nil || n != 3 {
		c.t.Fatalf("after %s: the canary table has %d rows (%v), want 3", after, n, err)
	}
	for _, table := range []string{"fences", "fence_log", "dead_letters", "topic_layouts", "export_versions"} {
		var ok bool
		if err := c.e.pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, `"`+c.e.schema+`".`+table).Scan(&ok); err != nil || !ok {
			c.t.Fatalf("after %s: table %s.%s is gone (%v)", after, c.e.schema, table, err)
		}
	}
}

// Every name a user can set reaches SQL safely. A schema name is an
// identifier: anything but a plain lower-case one is refused before any
// connection (exit 2, one sentence). Groups and topics are values: bind
// parameters, so quotes and semicolons are just characters (Kafka may refuse
// a topic name; SQL never breaks).
func TestInjectionThroughNames(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	c := newCanary(t, e)
	brokers := strings.Join(e.brokers, ",")
	target := `"` + c.schema + `".canary`

	checkBadSchemas(t, e, c, target)
	db := []string{"--database-url", e.dbURL, "--schema", e.schema}
	checkOddNames(t, e, c, target, db)

	// IDs are numbers, nothing else.
	for _, id := range []string{"1; DROP TABLE " + target, "1 OR 1=1", "1'", "0x10"} {
		r := runCLI(t, 30*time.Second, "", append([]string{"admin", "dlq", "show", id}, db...)...)
		wantFailure(t, r, 2, "not a positive integer")
		r = runCLI(t, 30*time.Second, "", append([]string{"admin", "dlq", "discard", id}, db...)...)
		wantFailure(t, r, 2, "not a positive integer")
	}
	c.check("dead letter IDs")

	// A group name full of SQL is a perfectly good Kafka group: a worker
	// runs under it, and every command finds its rows by that exact name.
	group := `workers'; DROP TABLE ` + target + `; --"`
	e.produce(jobsFor(keys, 0, 20)...)
	w := e.startWorker("odd", "--group", group)
	waitFor(t, 60*time.Second, "the worker with an odd group name to commit every job", func() bool {
		var next int64
		err := e.pool.QueryRow(context.Background(), `SELECT next_offset FROM "`+e.schema+`".fences WHERE consumer_group = $1 AND topic = $2 AND partition = 0`,
			group, e.topic).Scan(&next)
		return err == nil && next == 20
	})
	r := runCLI(t, 30*time.Second, "", append([]string{"admin", "fences", "--group", group, "--output", "json"}, db...)...)
	var fences []map[string]any
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &fences) != nil || len(fences) != 1 || fences[0]["consumer_group"] != group {
		t.Errorf("admin fences --group %q: %s", group, r)
	}
	r = runCLI(t, 30*time.Second, "", append([]string{"admin", "assignments", "--brokers", brokers, "--group", group, "--output", "json"}, db...)...)
	var rows []map[string]any
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &rows) != nil || len(rows) != 1 || rows[0]["state"] != "ok" {
		t.Errorf("admin assignments --group %q: %s", group, r)
	}
	r = runCLI(t, 30*time.Second, "", append([]string{"admin", "topic", "acknowledge-partitions", "--brokers", brokers, "--group", group, "--topic", e.topic}, db...)...)
	if r.code != 0 || !strings.Contains(r.stdout, "nothing changed") {
		t.Errorf("acknowledge-partitions --group %q: %s", group, r)
	}
	r = runCLI(t, 30*time.Second, "", append([]string{"admin", "dlq", "list", "--group", group}, db...)...)
	if r.code != 0 {
		t.Errorf("admin dlq list --group %q: %s", group, r)
	}
	w.stop(30 * time.Second)
	c.check("a worker with an odd group name")
}

// checkBadSchemas: every command refuses a schema name that is not a
// plain lower-case identifier, or is PostgreSQL's, before it connects (exit
// 2, one sentence); the canary table in target stays.
func checkBadSchemas(t *testing.T, e *env, c *canary, target string) {
	t.Helper()
	brokers := strings.Join(e.brokers, ",")
	badSchemas := []string{
		`x"; DROP TABLE ` + target + `; --`,
		`public; DROP TABLE ` + target,
		`tenure; DROP SCHEMA ` + e.schema + ` CASCADE`,
		`"` + e.schema + `"`,
		`a"b`,
		`it's`,
		`My Schema`,
		`Tenure`,
		strings.ToUpper(e.schema),
		`tenure.fences`,
		`tenure--x`,
		"tenure\nx",
		`tenüre`,
		`1tenure`,
		strings.Repeat("a", 64),
		`pg_catalog`,
		`pg_temp`,
		`information_schema`,
		``,
	}
	commands := func(schema string) map[string][]string {
		db := []string{"--database-url", e.dbURL, "--schema", schema}
		return map[string][]string{
			"worker":             append([]string{"worker", "--brokers", brokers, "--group", e.group, "--topic", e.topic, "--handler", "export"}, db...),
			"migrate up":         append(append([]string{"migrate"}, db...), "up"),
			"migrate down":       append(append([]string{"migrate"}, db...), "down"),
			"migrate status":     append(append([]string{"migrate"}, db...), "status"),
			"admin fences":       append([]string{"admin", "fences"}, db...),
			"admin holds":        append([]string{"admin", "holds"}, db...),
			"admin fences prune": append([]string{"admin", "fences", "prune"}, db...),
			"admin holds acknowledge": append([]string{"admin", "holds", "acknowledge", "--group", e.group, "--topic", e.topic,
				"--partition", "0"}, db...),
			"admin assignments": append([]string{"admin", "assignments", "--brokers", brokers, "--group", e.group}, db...),
			"admin dlq list":    append([]string{"admin", "dlq", "list"}, db...),
			"admin dlq show":    append([]string{"admin", "dlq", "show", "1"}, db...),
			"admin dlq replay":  append([]string{"admin", "dlq", "replay", "1", "--brokers", brokers}, db...),
			"admin dlq discard": append([]string{"admin", "dlq", "discard", "1"}, db...),
			"admin topic acknowledge-partitions": append([]string{"admin", "topic", "acknowledge-partitions", "--brokers", brokers,
				"--group", e.group, "--topic", e.topic, "--partitions", "2"}, db...),
		}
	}
	for _, schema := range badSchemas {
		for name, args := range commands(schema) {
			t.Run(fmt.Sprintf("%s --schema %q", name, schema), func(t *testing.T) {
				r := runCLI(t, 30*time.Second, "", args...)
				if strings.HasPrefix(schema, "pg_") || schema == "information_schema" {
					wantFailure(t, r, 2, "schema name", "is reserved by PostgreSQL")
				} else {
					wantFailure(t, r, 2, "schema name", "is not valid")
				}
				// One sentence says what is wrong, beside the usage.
				var said []string
				for _, l := range strings.Split(r.stderr, "\n") {
					if strings.Contains(l, "schema name") {
						said = append(said, l)
					}
				}
				if len(said) != 1 || !strings.HasPrefix(said[0], "tenure ") {
					t.Errorf("want one line saying what is wrong with the schema name: %q", r.stderr)
				}
			})
		}
		c.check(fmt.Sprintf("--schema %q", schema))
	}
}

// checkOddNames: SQL in group names reaches the database as bind
// parameters only, and topic names with it are refused.
func checkOddNames(t *testing.T, e *env, c *canary, target string, db []string) {
	t.Helper()
	brokers := strings.Join(e.brokers, ",")
	// Groups are bind parameters: any valid UTF-8 without control
	// characters is a group name Kafka accepts. Topics follow Kafka's rules
	// (letters, digits, '.', '_', '-'): every command refuses such a topic
	// name before connecting to anything (exit 2, one sentence).
	oddNames := []string{
		`g'; DROP TABLE ` + target + `; --`,
		`g"; DROP SCHEMA "` + e.schema + `" CASCADE; --`,
		`' OR '1'='1`,
		`$1); DELETE FROM "` + e.schema + `".fences; --`,
		"g\\x00; SELECT pg_sleep(30)",
	}
	for _, odd := range oddNames {
		t.Run(fmt.Sprintf("names %q", odd), func(t *testing.T) {
			// A name the schema has never seen is refused, quoted.
			unknown := fmt.Sprintf("no group %q in schema %s", odd, e.schema)
			r := runCLI(t, 30*time.Second, "", append([]string{"admin", "fences", "--group", odd}, db...)...)
			wantFailure(t, r, 1, unknown)
			r = runCLI(t, 30*time.Second, "", append([]string{"admin", "dlq", "list", "--status", "all", "--group", odd}, db...)...)
			wantFailure(t, r, 1, unknown)
			r = runCLI(t, 30*time.Second, "", append([]string{"admin", "topic", "acknowledge-partitions", "--brokers", brokers,
				"--group", odd, "--topic", e.topic}, db...)...)
			wantFailure(t, r, 1, unknown, "nor on the brokers")
			r = runCLI(t, 30*time.Second, "", append([]string{"admin", "assignments", "--brokers", brokers, "--group", odd}, db...)...)
			wantFailure(t, r, 1)
			// Kafka's rules refuse such topic names, on every command.
			for name, args := range map[string][]string{
				"worker":         append([]string{"worker", "--brokers", brokers, "--group", e.group, "--topic", odd, "--handler", "export"}, db...),
				"produce":        {"produce", "--brokers", brokers, "--topic", odd, "--key", "k", "--value", "v"},
				"dlq list":       append([]string{"admin", "dlq", "list", "--topic", odd}, db...),
				"assignments":    append([]string{"admin", "assignments", "--brokers", brokers, "--group", e.group, "--topic", odd}, db...),
				"acknowledge":    append([]string{"admin", "topic", "acknowledge-partitions", "--brokers", brokers, "--group", e.group, "--topic", odd}, db...),
				"topic create":   {"admin", "topic", "create", "--brokers", brokers, "--topic", odd, "--partitions", "1"},
				"topic describe": {"admin", "topic", "describe", "--brokers", brokers, "--topic", odd},
			} {
				t.Run(name, func(t *testing.T) {
					wantFailure(t, runCLI(t, 30*time.Second, "", args...), 2, "topic name", "is not valid")
				})
			}
			c.check(fmt.Sprintf("names %q", odd))
		})
	}
}
