package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tenure-dev/tenure/internal/devbroker"
	"github.com/tenure-dev/tenure/internal/testinfra/testdb"
	"github.com/tenure-dev/tenure/metrics"
)

// requiredArgs are the required string flags of cl, filled with values
// that pass the flags' own checks, but for skip.
func requiredArgs(t *testing.T, cl []string, skip string) []string {
	t.Helper()
	tr := newTree(&env{getenv: func(string) string { return "" }})
	cmd, _, err := tr.root.Find(cl)
	if err != nil {
		t.Fatal(err)
	}
	values := map[string]string{"brokers": "127.0.0.1:1", "group": "g", "topic": "t", "handler": "noop", "export-store": "file:///tmp/x"}
	var out []string
	tr.flags[cmd].fs.VisitAll(func(fl *pflag.Flag) {
		if fl.Annotations[annRequired] == nil || fl.Value.Type() != "string" || fl.Name == skip {
			return
		}
		v, ok := values[fl.Name]
		if !ok {
			v = "x"
		}
		out = append(out, "--"+fl.Name, v)
	})
	return out
}

// A --database-url (or TENURE_DATABASE_URL) that is not a PostgreSQL URL
// is bad usage in every command that takes one: exit 2, one sentence,
// before anything connects.
func TestDatabaseURLThatIsNotOne(t *testing.T) {
	n := 0
	for _, cl := range commandLines() {
		tr := newTree(&env{getenv: func(string) string { return "" }})
		cmd, _, _ := tr.root.Find(cl)
		if cmd == nil || cmd.Flags().Lookup("database-url") == nil {
			continue
		}
		n++
		name := strings.Join(cl, " ")
		args := append(append(append([]string{}, cl...), requiredArgs(t, cl, "database-url")...), "--database-url", "http://foo")
		start := time.Now()
		code, stdout, stderr := runIn(t, args...)
		if code != 2 || stdout != "" || !strings.HasPrefix(stderr, "tenure "+name+": the database URL (--database-url) is not a PostgreSQL URL: \"http://foo\" has the scheme http://") {
			t.Errorf("%s --database-url http://foo: exit %d, stdout %q, stderr %q", name, code, stdout, stderr)
		}
		if time.Since(start) > 2*time.Second {
			t.Errorf("%s: refused after %s", name, time.Since(start))
		}
		code, _, stderr = runInEnv(t, map[string]string{"TENURE_DATABASE_URL": "mysql://db/x"}, append(append([]string{}, cl...), requiredArgs(t, cl, "database-url")...)...)
		if code != 2 || !strings.Contains(stderr, "the database URL (TENURE_DATABASE_URL) is not a PostgreSQL URL") {
			t.Errorf("%s with TENURE_DATABASE_URL=mysql://db/x: exit %d, stderr %q", name, code, stderr)
		}
	}
	if n < 10 {
		t.Fatalf("only %d commands take --database-url", n)
	}
	for _, c := range []struct{ url, want string }{
		{"localhost", "is not valid: invalid keyword/value"},
		{"postgres://%zz", "is not valid: invalid percent-encoded token"},
		{"postgres://u:secret-pw@h:99999999/db", "is not valid: invalid port"},
	} {
		code, _, stderr := runIn(t, "admin", "fences", "--database-url", c.url)
		if code != 2 || !strings.Contains(stderr, c.want) || strings.Contains(stderr, "secret-pw") {
			t.Errorf("--database-url %s: exit %d, stderr %q, want exit 2 and %q", c.url, code, stderr, c.want)
		}
	}
	// What parses is not refused at the door: host lists, key=value.
	for _, url := range []string{"postgres://a@h1:5432,h2:5432/db?target_session_attrs=read-write", "host=/nonexistent dbname=x connect_timeout=1"} {
		if err := checkDatabaseURL(url, false); err != nil {
			t.Errorf("%s: %v", url, err)
		}
	}
}

func TestWorkerCreateSchemaWithNoMigrate(t *testing.T) {
	code, _, stderr := runIn(t, "worker", "--brokers", "h:1", "--group", "g", "--topic", "t", "--handler", "noop",
		"--database-url", "postgres://127.0.0.1:1/x", "--create-schema", "--no-migrate")
	if code != 2 || !strings.Contains(stderr, "--create-schema creates and migrates the schema, --no-migrate forbids") {
		t.Errorf("exit %d, stderr %q", code, stderr)
	}
}

// A worker whose --schema does not exist refuses to start, naming the
// schemas that hold tenure tables; with --create-schema it creates and
// migrates it. An existing schema with pending migrations is migrated.
func TestWorkerDoesNotCreateASchemaUnlessTold(t *testing.T) {
	pool := testdb.Pool(t)
	existing := testdb.Schema(t, pool)
	br := startBroker(t, devbroker.Config{})
	missing := testdb.FreshSchema(t, pool, "tenure_typo")
	worker := func(extra ...string) (int, string) {
		args := append([]string{"worker", "--brokers", strings.Join(br.ListenAddrs(), ","), "--group", "g", "--topic", "absent-topic",
			"--handler", "noop", "--database-url", testdb.URL(), "--log-level", "error"}, extra...)
		code, _, stderr := runIn(t, args...)
		return code, stderr
	}
	exists := func(s string) bool {
		ok, err := schemaExists(context.Background(), pool, s)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}

	code, stderr := worker("--schema", missing)
	want := regexp.MustCompile(`^tenure worker: schema "` + missing + `" does not exist in this database; schemas with tenure tables: [^;]*\b` + existing +
		`\b[^;]*; give the right --schema, run ` + "`tenure migrate up --schema " + missing + "`" + ` first, or pass --create-schema\n$`)
	if code != 1 || !want.MatchString(stderr) {
		t.Errorf("a missing schema: exit %d, stderr %q", code, stderr)
	}
	if exists(missing) {
		t.Fatalf("schema %s was created", missing)
	}
	code, stderr = worker("--schema", missing, "--no-migrate")
	if code != 1 || !strings.Contains(stderr, "does not exist in this database") || strings.Contains(stderr, "--create-schema") {
		t.Errorf("a missing schema with --no-migrate: exit %d, stderr %q", code, stderr)
	}

	// --create-schema: created and migrated, then the missing topic stops
	// the worker.
	code, stderr = worker("--schema", missing, "--create-schema")
	if code != 1 || !strings.Contains(stderr, `topic "absent-topic" does not exist`) {
		t.Errorf("--create-schema: exit %d, stderr %q", code, stderr)
	}
	schemas, err := tenureSchemas(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	if !exists(missing) || !strings.Contains(" "+strings.Join(schemas, " ")+" ", " "+missing+" ") {
		t.Errorf("--create-schema: schema %s not created and migrated (tenure schemas: %v)", missing, schemas)
	}

	// An existing schema without its migrations (one an administrator
	// created for the workers, say) is migrated at start, as before.
	empty := testdb.FreshSchema(t, pool, "tenure_empty")
	if _, err := pool.Exec(context.Background(), `CREATE SCHEMA "`+empty+`"`); err != nil {
		t.Fatal(err)
	}
	code, stderr = worker("--schema", empty, "--log-level", "info")
	if code != 1 || !strings.Contains(stderr, "migrations applied") || !strings.Contains(stderr, `topic "absent-topic" does not exist`) {
		t.Errorf("a schema behind: exit %d, stderr %q", code, stderr)
	}
}

// The admin commands: a --schema that does not exist names the schemas
// that do hold tenure tables; a missing export in an existing schema says
// where it is instead of suggesting a migration.
func TestAdminMissingSchemaAndExports(t *testing.T) {
	pool := testdb.Pool(t)
	a, b := testdb.Schema(t, pool), testdb.Schema(t, pool)
	db := testdb.URL()
	ctx := context.Background()

	code, _, stderr := runIn(t, "admin", "exports", "get", "acme", "--database-url", db, "--schema", "tenure_no_such_schema")
	if code != 1 || !strings.Contains(stderr, `schema "tenure_no_such_schema" does not exist in this database; schemas with tenure tables: `) ||
		!strings.Contains(stderr, a) || !strings.Contains(stderr, "give the right --schema") {
		t.Errorf("exports get in a missing schema: exit %d, %q", code, stderr)
	}
	plain := testdb.FreshSchema(t, pool, "tenure_plain")
	if _, err := pool.Exec(ctx, `CREATE SCHEMA "`+plain+`"; CREATE TABLE "`+plain+`".other (x int)`); err != nil {
		t.Fatal(err)
	}
	code, _, stderr = runIn(t, "admin", "fences", "--database-url", db, "--schema", plain)
	if code != 1 || !strings.Contains(stderr, `schema "`+plain+`" holds no tenure tables; schemas with tenure tables: `) ||
		!strings.Contains(stderr, "`tenure migrate up --schema "+plain+"` to add them to it") {
		t.Errorf("a schema without tenure tables: exit %d, %q", code, stderr)
	}

	// A key published in b, asked for in a.
	if _, err := pool.Exec(ctx, `INSERT INTO "`+b+`".export_pointers (export_key, store, object, consumer_group, topic, partition, job_offset,
		incarnation, epoch, size, sha256, worker, version) VALUES ('acme', 'file:///x', 'objects/acme', 'g', 't', 0, 5, 0, 1, 3, sha256('abc'::bytea), 'w', 1)`); err != nil {
		t.Fatal(err)
	}
	code, _, stderr = runIn(t, "admin", "exports", "get", "acme", "--database-url", db, "--schema", a)
	if code != 1 || strings.Contains(stderr, "migrate") || !strings.Contains(stderr, `key "acme" has no published export in schema "`+a+`"; schema`) ||
		!regexp.MustCompile(`\b`+b+`\b.* one: `+"`tenure admin exports get acme --schema [a-z0-9_]+`").MatchString(stderr) {
		t.Errorf("exports get of a key published in another schema: exit %d, %q", code, stderr)
	}
	code, _, stderr = runIn(t, "admin", "exports", "get", "acme", "--database-url", db, "--schema", "tenure_no_such_schema")
	if code != 1 || !strings.Contains(stderr, `schema "tenure_no_such_schema" does not exist in this database`) ||
		!regexp.MustCompile(`\b`+b+`\b.* one: `+"`tenure admin exports get acme --schema [a-z0-9_]+`").MatchString(stderr) {
		t.Errorf("exports get in a missing schema, of a key published in another: exit %d, %q", code, stderr)
	}
	code, _, stderr = runIn(t, "admin", "exports", "get", "nobody's", "--database-url", db, "--schema", a)
	if code != 1 || strings.Contains(stderr, "migrate") || !strings.Contains(stderr, `key "nobody's" has no published export in schema "`+a+`" (see `+"`tenure admin exports list`") {
		t.Errorf("exports get of an unknown key: exit %d, %q", code, stderr)
	}

	// The exports table of the export handler without a store: said, not
	// "no exports".
	// A row per group, topic and key: globex from two groups on two topics.
	if _, err := pool.Exec(ctx, `INSERT INTO "`+a+`".exports (consumer_group, job_key, document, job_value, topic, partition, job_offset, incarnation, epoch, worker, version)
		VALUES ('g', 'globex', '{}', 'v', 'jobs', 2, 7, 0, 3, 'w', 4), ('g', 'initech', '{}', 'v', 'jobs', 1, 8, 0, 3, 'w', 1),
		('h', 'globex', '{}', 'v', 'faults', 0, 1, 0, 1, 'w', 1)`); err != nil {
		t.Fatal(err)
	}
	// The schema knows both groups (a worker's heartbeat row each), as it
	// would once they had run: --group refuses a group it has never seen.
	if _, err := pool.Exec(ctx, `INSERT INTO "`+a+`".workers (consumer_group, member_id, client_id, host, pid)
		VALUES ('g', 'm1', 'c', 'h', 1), ('h', 'm2', 'c', 'h', 2)`); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runIn(t, "admin", "exports", "list", "--database-url", db, "--schema", a)
	if code != 0 || !strings.HasPrefix(stderr, "no exports in an object store in schema "+a+`; the exports table "`+a+`".exports holds 3 exports (one per group, topic and key) written by the export handler without --export-store`) ||
		!strings.Contains(stderr, `SELECT consumer_group, topic, job_key, version, partition, job_offset, document FROM "`+a+`".exports`) {
		t.Errorf("exports list with table rows: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	code, stdout, stderr = runIn(t, "admin", "exports", "list", "--database-url", db, "--schema", a, "--output", "json")
	if code != 0 || strings.TrimSpace(stdout) != "[]" || !strings.Contains(stderr, "not listed: the exports table") {
		t.Errorf("exports list --output json with table rows: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	code, _, stderr = runIn(t, "admin", "exports", "list", "--database-url", db, "--schema", a, "--prefix", "zzz")
	if code != 0 || stderr != "no exports in schema "+a+"\n" {
		t.Errorf("exports list --prefix zzz: exit %d, stderr %q", code, stderr)
	}
	code, _, stderr = runIn(t, "admin", "exports", "list", "--database-url", db, "--schema", a, "--group", "h")
	if code != 0 || !strings.Contains(stderr, `".exports holds 1 export (one per group, topic and key) written by`) {
		t.Errorf("exports list --group h with table rows: exit %d, stderr %q", code, stderr)
	}
	code, _, stderr = runIn(t, "admin", "exports", "get", "globex", "--database-url", db, "--schema", a)
	if code != 1 || !strings.Contains(stderr, `the export handler without --export-store wrote it to the exports table "`+a+`".exports `+
		`(group g, topic jobs: version 4, job jobs/2/7, token 0.3; group h, topic faults: version 1, job faults/0/1, token 0.1)`) {
		t.Errorf("exports get of a table export: exit %d, %q", code, stderr)
	}
	code, _, stderr = runIn(t, "admin", "exports", "list", "--database-url", db, "--schema", b)
	if code != 0 || strings.Contains(stderr, "exports table") {
		t.Errorf("exports list of b: exit %d, stderr %q", code, stderr)
	}
}

// admin holds lists the topics whose partition count changed (with
// --brokers: Kafka has the counts), with both counts and the command that
// resolves it; without --brokers it says they are not listed.
func TestHoldsListPartitionsChanged(t *testing.T) {
	pool := testdb.Pool(t)
	schema := testdb.Schema(t, pool)
	br := startBroker(t, devbroker.Config{})
	brokers := strings.Join(br.ListenAddrs(), ",")
	cl, err := kgo.NewClient(kgo.SeedBrokers(br.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 3, 1, nil, "grown"); err != nil {
		t.Fatal(err)
	}
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 2, 1, nil, "same"); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO "`+schema+`".topic_layouts (consumer_group, topic, partition_count)
		VALUES ('workers', 'grown', 2), ('workers', 'same', 2), ('workers', 'deleted-topic', 4)`); err != nil {
		t.Fatal(err)
	}
	db := []string{"--database-url", testdb.URL(), "--schema", schema}

	code, stdout, stderr := runIn(t, append([]string{"admin", "holds", "--brokers", brokers}, db...)...)
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if code != 0 || stderr != "" || len(lines) != 2 {
		t.Fatalf("admin holds --brokers: exit %d, stdout:\n%s\nstderr %q", code, stdout, stderr)
	}
	f := strings.Fields(lines[1])
	if strings.Join(f[:9], " ") != "workers grown all partitions-changed yes - - - -" ||
		!strings.Contains(lines[1], "topic grown has 3 partitions in Kafka but group workers recorded 2") ||
		!strings.Contains(lines[1], "`tenure admin topic acknowledge-partitions --group workers --topic grown`") {
		t.Errorf("the row: %q", lines[1])
	}
	code, stdout, _ = runIn(t, append([]string{"admin", "holds", "--brokers", brokers, "--output", "json"}, db...)...)
	var rows []map[string]any
	if err := json.Unmarshal([]byte(stdout), &rows); code != 0 || err != nil || len(rows) != 1 {
		t.Fatalf("admin holds --output json: exit %d, %v\n%s", code, err, stdout)
	}
	r := rows[0]
	if r["kind"] != "partitions-changed" || r["partition"] != nil || r["recorded_partitions"] != 2.0 || r["partitions"] != 3.0 ||
		r["needs_ack"] != true || r["since"] != nil || r["consumer_group"] != "workers" || r["topic"] != "grown" {
		t.Errorf("json row: %v", r)
	}

	code, stdout, stderr = runIn(t, append([]string{"admin", "holds"}, db...)...)
	if code != 0 || strings.Count(stdout, "\n") != 1 || !strings.Contains(stderr, "no held partitions in schema "+schema+"; topics whose partition count changed (kind partitions-changed) are not listed: give --brokers") {
		t.Errorf("admin holds without --brokers: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	// A group neither the schema nor the brokers know is refused (known.go).
	code, _, stderr = runIn(t, append([]string{"admin", "holds", "--brokers", brokers, "--group", "others"}, db...)...)
	if want := `tenure admin holds: no group "others" in schema ` + schema + " nor on the brokers; groups the schema has: workers\n"; code != 1 || stderr != want {
		t.Errorf("admin holds --group others: exit %d, stderr %q, want %q", code, stderr, want)
	}
}

func TestShortMember(t *testing.T) {
	for _, c := range []struct{ id, want string }{
		{"tenure-worker-2-4fefa38c7f43b92e79c8ff534fed8faa", "tenure-worker-2-4fefa38c"},
		{"tenure-B-45ac2ce29e5329a4751b053147dc14d9", "tenure-B-45ac2ce2"},
		{"8iqZ3bFjRKOKkdh0bLwNzg", "8iqZ3bFjRKOKkdh0bLwNzg"},
		{"NIvEpb0da-1V9GedaDBc9g==", "NIvEpb0da-1V9GedaDBc9g=="},
		{"consumer-1-6a1b0e2a-4a1c-4b8e-9f3a-1b2c3d4e5f60", "consumer-1-6a1b0e2a-4a1+"},
		{"", ""},
	} {
		if got := shortMember(c.id); got != c.want {
			t.Errorf("shortMember(%q) = %q, want %q", c.id, got, c.want)
		}
	}
}

// Progress goes to a terminal only: never into a pipe or a file.
func TestProgressOnlyOnATerminal(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if isTerminal(w) || isTerminal(&bytes.Buffer{}) {
		t.Fatal("a pipe or a buffer taken for a terminal")
	}
	stop := startProgress(w, func(time.Duration) string { return "progress" })
	time.Sleep(progressDelay + 2*progressEvery)
	stop()
	w.Close()
	var got bytes.Buffer
	_, _ = got.ReadFrom(r)
	if got.Len() != 0 {
		t.Errorf("progress written to a pipe: %q", got.String())
	}
	p := newProduction("jobs", 3, 5_000_000)
	p.acked = 1_000_000
	if line := p.progressLine(2 * time.Second); line != "producing to topic jobs: 1000000 of 5000000 jobs acknowledged (20%), 500000 jobs/s, about 8s left" {
		t.Errorf("progress line: %q", line)
	}
}

// tenure_build_info carries what `tenure version` says.
func TestBuildInfoMetricMatchesVersion(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics.BuildInfo())
	fams, err := reg.Gather()
	if err != nil || len(fams) != 1 || fams[0].GetName() != "tenure_build_info" || len(fams[0].Metric) != 1 {
		t.Fatalf("gathered %v, %v", fams, err)
	}
	m := fams[0].Metric[0]
	labels := map[string]string{}
	for _, l := range m.Label {
		labels[l.GetName()] = l.GetValue()
	}
	bi, _ := debug.ReadBuildInfo()
	text := formatVersion(bi)
	if m.Gauge.GetValue() != 1 || !strings.HasPrefix(text, "tenure "+labels["version"]+"\n") || labels["go_version"] != runtime.Version() ||
		(strings.Contains(text, "revision  ") != (labels["revision"] != "unknown")) {
		t.Errorf("build info %v against `tenure version`:\n%s", labels, text)
	}
}
