package sink_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenure-dev/tenure/internal/testinfra/testdb"
	"github.com/tenure-dev/tenure/sink"
)

func allVersions() []int {
	var vs []int
	for _, m := range sink.Migrations() {
		vs = append(vs, m.Version)
	}
	return vs
}

func TestMigrationsEmbedded(t *testing.T) {
	t.Parallel()
	ms := sink.Migrations()
	if len(ms) < 2 {
		t.Fatalf("Migrations() = %d migrations, want at least 2", len(ms))
	}
	for i, m := range ms {
		if m.Version != i+1 || m.Name == "" {
			t.Errorf("migration %d = %d %q, want version %d with a name", i, m.Version, m.Name, i+1)
		}
	}
	if ms[0].Name != "fences" || ms[1].Name != "jobs" {
		t.Errorf("first migrations = %q, %q; want fences, jobs", ms[0].Name, ms[1].Name)
	}
}

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// freshDB is testCtx, the test database's pool and a FreshSchema on it.
func freshDB(t *testing.T) (context.Context, *pgxpool.Pool, string) {
	t.Helper()
	ctx := testCtx(t)
	pool := testdb.Pool(t)
	return ctx, pool, testdb.FreshSchema(t, pool, "tenure_mig")
}

func TestMigrateIdempotent(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	pool := testdb.Pool(t)
	schema := testdb.Schema(t, pool) // migrated once already
	for range 2 {
		applied, err := sink.Migrate(ctx, pool, schema)
		if err != nil {
			t.Fatalf("second Migrate: %v", err)
		}
		if len(applied) != 0 {
			t.Errorf("second Migrate applied %v, want nothing", applied)
		}
	}
	st, err := sink.MigrationStatus(ctx, pool, schema)
	if err != nil {
		t.Fatal(err)
	}
	if len(st) != len(sink.Migrations()) {
		t.Fatalf("MigrationStatus = %d entries, want %d", len(st), len(sink.Migrations()))
	}
	for i, s := range st {
		m := sink.Migrations()[i]
		if s.Version != m.Version || s.Name != m.Name || !s.Applied || s.AppliedAt.IsZero() {
			t.Errorf("status %+v, want %d %s applied with a time", s, m.Version, m.Name)
		}
	}
	if err := sink.CheckSchema(ctx, pool, schema); err != nil {
		t.Errorf("CheckSchema on a migrated schema: %v", err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{schema}.Sanitize()+`.schema_migrations`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != len(sink.Migrations()) {
		t.Errorf("schema_migrations has %d rows, want %d", n, len(sink.Migrations()))
	}
}

func tableExists(t *testing.T, ctx context.Context, pool *pgxpool.Pool, schema, table string) bool {
	t.Helper()
	var ok bool
	if err := pool.QueryRow(ctx, `SELECT pg_catalog.to_regclass($1) IS NOT NULL`,
		pgx.Identifier{schema, table}.Sanitize()).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

// Down one at a time, newest first, until nothing is left; then up again,
// and the store works on the result.
func TestMigrateDownAndUp(t *testing.T) {
	t.Parallel()
	ctx, pool, schema := freshDB(t)
	all := allVersions()
	tables := map[int][]string{1: {"fences", "fence_log"}, 2: {"exports", "export_versions", "ledger"}}

	applied, err := sink.Migrate(ctx, pool, schema)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(applied, all) {
		t.Fatalf("Migrate on a fresh schema applied %v, want %v", applied, all)
	}
	for v := len(all); v >= 1; v-- {
		got, err := sink.MigrateDown(ctx, pool, schema, sink.MigrateDownOptions{})
		if err != nil {
			t.Fatalf("MigrateDown: %v", err)
		}
		if got != v {
			t.Fatalf("MigrateDown reverted %d, want %d", got, v)
		}
		st, err := sink.MigrationStatus(ctx, pool, schema)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range st {
			if want := s.Version < v; s.Applied != want {
				t.Errorf("after reverting %d: %d applied = %v, want %v", v, s.Version, s.Applied, want)
			}
		}
		for tv, names := range tables {
			for _, name := range names {
				if got, want := tableExists(t, ctx, pool, schema, name), tv < v; got != want {
					t.Errorf("after reverting %d: table %s exists = %v, want %v", v, name, got, want)
				}
			}
		}
		err = sink.CheckSchema(ctx, pool, schema)
		if err == nil || !strings.Contains(err.Error(), "tenure migrate") {
			t.Errorf("CheckSchema after reverting %d: %v, want an error saying to run tenure migrate", v, err)
		}
	}
	got, err := sink.MigrateDown(ctx, pool, schema, sink.MigrateDownOptions{})
	if err != nil || got != 0 {
		t.Errorf("MigrateDown with nothing applied = %d, %v; want 0, nil", got, err)
	}
	applied, err = sink.Migrate(ctx, pool, schema)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(applied, all) {
		t.Errorf("Migrate after reverting all applied %v, want %v", applied, all)
	}
	if err := sink.CheckSchema(ctx, pool, schema); err != nil {
		t.Errorf("CheckSchema: %v", err)
	}
	store, err := sink.NewStore(pool, schema)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Claim(ctx, sink.ClaimRequest{Partition: part, Token: tok(0, 1), Owner: "a", PartitionCount: 1}); err != nil {
		t.Errorf("claim on the re-migrated schema: %v", err)
	}
}

// Replicas starting at once: each migration is applied exactly once, by one
// of them, and none fails.
func TestMigrateConcurrent(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	pool := sizedPool(t, 8)
	schema := testdb.FreshSchema(t, pool, "tenure_mig")
	const n = 5
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		applied []int
		gate    = make(chan struct{})
	)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			got, err := sink.Migrate(ctx, pool, schema)
			if err != nil {
				t.Errorf("concurrent Migrate: %v", err)
			}
			mu.Lock()
			applied = append(applied, got...)
			mu.Unlock()
		}()
	}
	close(gate)
	wg.Wait()
	slices.Sort(applied)
	if want := allVersions(); !slices.Equal(applied, want) {
		t.Errorf("versions applied across %d concurrent runs = %v, want each of %v once", n, applied, want)
	}
	got := testdb.QueryRows(t, ctx, pool, pgx.RowTo[int], `SELECT version FROM `+pgx.Identifier{schema}.Sanitize()+`.schema_migrations ORDER BY version`)
	if want := allVersions(); !slices.Equal(got, want) {
		t.Errorf("schema_migrations = %v, want %v", got, want)
	}
	if err := sink.CheckSchema(ctx, pool, schema); err != nil {
		t.Errorf("CheckSchema: %v", err)
	}
}

// CheckSchema is one sentence that says what to run, on a schema that does
// not exist, on an empty one, and on one whose migration table is empty.
func TestCheckSchemaUnmigrated(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	pool := testdb.Pool(t)
	missing := testdb.FreshSchema(t, pool, "tenure_mig")
	empty := testdb.FreshSchema(t, pool, "tenure_mig")
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{empty}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	emptyTable := testdb.FreshSchema(t, pool, "tenure_mig")
	if _, err := sink.Migrate(ctx, pool, emptyTable); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `DELETE FROM `+pgx.Identifier{emptyTable}.Sanitize()+`.schema_migrations`); err != nil {
		t.Fatal(err)
	}
	for _, schema := range []string{missing, empty, emptyTable} {
		err := sink.CheckSchema(ctx, pool, schema)
		if err == nil {
			t.Errorf("CheckSchema(%s) = nil on an unmigrated schema", schema)
			continue
		}
		msg := err.Error()
		if !strings.Contains(msg, "tenure migrate") || !strings.Contains(msg, schema) || strings.Contains(msg, "\n") {
			t.Errorf("CheckSchema(%s) = %q, want one sentence naming the schema and `tenure migrate`", schema, msg)
		}
		st, err := sink.MigrationStatus(ctx, pool, schema)
		if err != nil {
			t.Errorf("MigrationStatus(%s): %v", schema, err)
		}
		for _, s := range st {
			if s.Applied {
				t.Errorf("MigrationStatus(%s): %+v applied", schema, s)
			}
		}
	}
	// CheckSchema only reads.
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_catalog.pg_namespace WHERE nspname = $1)`, missing).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Errorf("CheckSchema created schema %s", missing)
	}
}

// A schema migrated by a newer binary is refused, not half-managed.
func TestMigrateRefusesNewerSchema(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	pool := testdb.Pool(t)
	schema := testdb.Schema(t, pool)
	if _, err := pool.Exec(ctx, `INSERT INTO `+pgx.Identifier{schema}.Sanitize()+`.schema_migrations (version, name) VALUES ($1, 'future')`,
		len(sink.Migrations())+1); err != nil {
		t.Fatal(err)
	}
	if _, err := sink.Migrate(ctx, pool, schema); err == nil || !strings.Contains(err.Error(), "newer") {
		t.Errorf("Migrate on a newer schema: %v, want an error saying it is newer", err)
	}
	if v, err := sink.MigrateDown(ctx, pool, schema, sink.MigrateDownOptions{}); err == nil || v != 0 {
		t.Errorf("MigrateDown on a newer schema = %d, %v; want an error", v, err)
	}
	if !tableExists(t, ctx, pool, schema, "ledger") {
		t.Error("MigrateDown reverted a migration of a newer schema")
	}
}

var badSchemaNames = []string{
	"x; drop table y",
	`"a"`,
	`a"; DROP SCHEMA public CASCADE; --`,
	"A",
	"Tenure",
	"1abc",
	"",
	strings.Repeat("a", 64),
	"a-b",
	"a b",
	"a.b",
	"abc\n",
	"\nabc",
	"abc\x00",
	"é",
	"ab$c",
	"tenure'",
}

var goodSchemaNames = []string{"a", "_", "_a", "tenure", "tenure_test_0123456789abcdef", "a1", strings.Repeat("z", 63)}

func TestValidateSchema(t *testing.T) {
	t.Parallel()
	for _, name := range badSchemaNames {
		if err := sink.ValidateSchema(name); err == nil {
			t.Errorf("ValidateSchema(%q) accepted", name)
		}
	}
	for _, name := range goodSchemaNames {
		if err := sink.ValidateSchema(name); err != nil {
			t.Errorf("ValidateSchema(%q): %v", name, err)
		}
	}
}

// Bad names are refused before any connection is made: the pool points at a
// port nothing listens on, so touching the database would give another error.
func TestBadSchemaNeverReachesTheDatabase(t *testing.T) {
	t.Parallel()
	cfg, err := pgxpool.ParseConfig("postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, name := range badSchemaNames {
		if name == "" {
			continue // NewStore maps "" to DefaultSchema; the others reject it below
		}
		want := sink.ValidateSchema(name).Error()
		check := func(op string, err error) {
			t.Helper()
			if err == nil || err.Error() != want {
				t.Errorf("%s(%q) = %v, want the validation error %q", op, name, err, want)
			}
		}
		_, err := sink.NewStore(pool, name)
		check("NewStore", err)
		_, err = sink.Migrate(ctx, pool, name)
		check("Migrate", err)
		_, err = sink.MigrateDown(ctx, pool, name, sink.MigrateDownOptions{})
		check("MigrateDown", err)
		_, err = sink.MigrationStatus(ctx, pool, name)
		check("MigrationStatus", err)
		check("CheckSchema", sink.CheckSchema(ctx, pool, name))
	}
	// "" is not DefaultSchema for the migration functions: they want a name.
	_, err = sink.Migrate(ctx, pool, "")
	if err == nil || err.Error() != sink.ValidateSchema("").Error() {
		t.Errorf(`Migrate(""): %v, want the validation error`, err)
	}
	_, err = sink.MigrationStatus(ctx, pool, "")
	if err == nil || err.Error() != sink.ValidateSchema("").Error() {
		t.Errorf(`MigrationStatus(""): %v, want the validation error`, err)
	}
	if s := pool.Stat(); s.AcquireCount() != 0 || s.TotalConns() != 0 {
		t.Errorf("pool was used: %d acquires, %d connections", s.AcquireCount(), s.TotalConns())
	}
}

func TestNewStore(t *testing.T) {
	t.Parallel()
	if _, err := sink.NewStore(nil, "tenure"); err == nil {
		t.Error("NewStore(nil) accepted")
	}
	pool := testdb.Pool(t)
	s, err := sink.NewStore(pool, "")
	if err != nil {
		t.Fatal(err)
	}
	if s.Schema() != sink.DefaultSchema || s.Pool() != pool {
		t.Errorf("NewStore(pool, \"\") = schema %q pool %p, want %q and %p", s.Schema(), s.Pool(), sink.DefaultSchema, pool)
	}
}

// FuzzValidateSchema: a name ValidateSchema accepts is a plain lower-case
// identifier, so quoting it adds nothing but the quotes, and interpolating it
// can never break out of the identifier.
func FuzzValidateSchema(f *testing.F) {
	for _, s := range append(append([]string{}, badSchemaNames...), goodSchemaNames...) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		err := sink.ValidateSchema(name)
		if want := plainIdent(name); (err == nil) != want {
			t.Fatalf("ValidateSchema(%q) = %v, want accepted = %v", name, err, want)
		}
		if err != nil {
			if !strings.Contains(err.Error(), "is not valid") {
				t.Fatalf("ValidateSchema(%q) error %q does not say what is wrong", name, err)
			}
			return
		}
		for _, r := range name {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_') {
				t.Fatalf("accepted %q contains %q", name, r)
			}
		}
		if q := sink.Quote(name); q != `"`+name+`"` {
			t.Fatalf("quote(%q) = %s, want the name in double quotes", name, q)
		}
	})
}

// plainIdent is ValidateSchema's rule written without a regexp.
func plainIdent(s string) bool {
	if len(s) < 1 || len(s) > 63 || s[0] >= '0' && s[0] <= '9' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// Two branches that each add "the next" migration must not merge into a
// schema history where one of them silently replaces the other.
func TestMigrationsRefuseTwoWithOneNumber(t *testing.T) {
	t.Parallel()
	fsys := fstest.MapFS{
		"migration/001_a.up.sql":   {Data: []byte("SELECT 1")},
		"migration/001_a.down.sql": {Data: []byte("SELECT 1")},
		"migration/002_b.up.sql":   {Data: []byte("SELECT 1")},
		"migration/002_b.down.sql": {Data: []byte("SELECT 1")},
		"migration/002_c.up.sql":   {Data: []byte("SELECT 1")},
		"migration/002_c.down.sql": {Data: []byte("SELECT 1")},
	}
	_, err := sink.LoadMigrationsFrom(fsys)
	if err == nil || !strings.Contains(err.Error(), "two migrations are numbered 002: 002_b and 002_c") {
		t.Fatalf("loading two migrations numbered 002: %v, want an error naming both", err)
	}
	delete(fsys, "migration/002_c.up.sql")
	delete(fsys, "migration/002_c.down.sql")
	if ms, err := sink.LoadMigrationsFrom(fsys); err != nil || len(ms) != 2 {
		t.Fatalf("loading 001 and 002: %d migrations, %v", len(ms), err)
	}
}

// `migrate down` used to drop the incarnations and dead letters (and, at the
// bottom, the offsets) of a schema in use without asking; its workers then
// spun, fenced. While fencing rows exist it refuses, saying what would be
// lost, unless forced.
func TestMigrateDownRefusesWhileFencing(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.park(t, deadLetter("g", "t", 0, 5)) // a claim (a fencing row), a commit and a dead letter
	all := allVersions()
	newest := all[len(all)-1]
	v, err := sink.MigrateDown(e.ctx, e.pool, e.schema, sink.MigrateDownOptions{})
	var inUse *sink.SchemaInUseError
	if !errors.Is(err, sink.ErrSchemaInUse) || !errors.As(err, &inUse) || v != 0 {
		t.Fatalf("MigrateDown of a schema in use = %d, %v; want a refusal", v, err)
	}
	if inUse.Version != newest || inUse.Rows["fences"] != 1 || inUse.Rows["dead_letters"] != 1 || inUse.Rows["fence_log"] != 2 {
		t.Errorf("refusal %+v", inUse)
	}
	wants := []string{"1 fencing rows", "1 dead letters", "0 incarnations", "2 fence log entries", "would be fenced"}
	if len(inUse.Drops) > 0 { // the newest migration may drop only an index
		wants = append(wants, "reverting it drops")
	}
	for _, want := range wants {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal does not say %q: %v", want, err)
		}
	}
	st, err := sink.MigrationStatus(e.ctx, e.pool, e.schema)
	if err != nil || !st[len(st)-1].Applied {
		t.Fatalf("a refused MigrateDown reverted something: %+v %v", st, err)
	}
	// Forced, it goes down to the bottom; the last refusal would have named
	// the fencing tables themselves.
	for i := len(all) - 1; i >= 0; i-- {
		if i == 0 {
			_, err := sink.MigrateDown(e.ctx, e.pool, e.schema, sink.MigrateDownOptions{})
			if !errors.As(err, &inUse) || !slices.Contains(inUse.Drops, "fences") || !slices.Contains(inUse.Drops, "fence_log") {
				t.Errorf("refusing to revert 001: %v (drops %v)", err, inUse.Drops)
			}
		}
		v, err := sink.MigrateDown(e.ctx, e.pool, e.schema, sink.MigrateDownOptions{Force: true})
		if err != nil || v != all[i] {
			t.Fatalf("forced MigrateDown = %d, %v; want %d", v, err, all[i])
		}
	}
	// Nothing left: nothing to refuse.
	if _, err := sink.Migrate(e.ctx, e.pool, e.schema); err != nil {
		t.Fatal(err)
	}
	if v, err := sink.MigrateDown(e.ctx, e.pool, e.schema, sink.MigrateDownOptions{}); err != nil || v != newest {
		t.Fatalf("MigrateDown of a schema without fencing rows = %d, %v", v, err)
	}
}

func TestMigrationDrops(t *testing.T) {
	t.Parallel()
	ms := sink.Migrations()
	if d := ms[0].Drops(); !slices.Equal(d, []string{"fence_log", "fences"}) {
		t.Errorf("001 drops %v", d)
	}
	if d := ms[4].Drops(); !slices.Contains(d, "exports.job_value") || !slices.Contains(d, "fence_log_pruned") {
		t.Errorf("005 drops %v", d)
	}
	if d := ms[5].Drops(); !slices.Contains(d, "fences.topic_id") || !slices.Contains(d, "partition_holds") {
		t.Errorf("006 drops %v", d)
	}
}
