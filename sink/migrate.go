package sink

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed migration/*.sql
var migrationFS embed.FS

// Migration is one embedded schema change.
type Migration struct {
	Version int
	Name    string
	up      string
	down    string
}

// MigrationState is a migration and whether it is applied.
type MigrationState struct {
	Version   int
	Name      string
	Applied   bool
	AppliedAt time.Time
}

// Migrations lists the embedded migrations in version order.
func Migrations() []Migration {
	ms, err := loadMigrations()
	if err != nil {
		panic(err) // embedded files are checked by tests; this cannot happen in a build that passed them
	}
	return ms
}

func loadMigrations() ([]Migration, error) { return loadMigrationsFrom(migrationFS) }

// loadMigrationsFrom reads the migration directory of fsys.
func loadMigrationsFrom(fsys fs.FS) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, "migration")
	if err != nil {
		return nil, err
	}
	byVersion := map[int]*Migration{}
	for _, e := range entries {
		name := e.Name()
		base, dir, ok := strings.Cut(strings.TrimSuffix(name, ".sql"), ".")
		if !ok || (dir != "up" && dir != "down") {
			return nil, fmt.Errorf("migration file %s: want NNN_name.up.sql or NNN_name.down.sql", name)
		}
		num, label, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("migration file %s: want a positive version number prefix", name)
		}
		body, err := fs.ReadFile(fsys, "migration/"+name)
		if err != nil {
			return nil, err
		}
		m := byVersion[v]
		if m == nil {
			m = &Migration{Version: v, Name: label}
			byVersion[v] = m
		} else if m.Name != label {
			// Two branches that each added "the next" migration: applying
			// either one as version v would hide the other.
			return nil, fmt.Errorf("two migrations are numbered %03d: %03d_%s and %03d_%s; renumber one", v, v, m.Name, v, label)
		}
		if dir == "up" {
			m.up = string(body)
		} else {
			m.down = string(body)
		}
	}
	out := make([]Migration, 0, len(byVersion))
	for _, m := range byVersion {
		if m.up == "" || m.down == "" {
			return nil, fmt.Errorf("migration %03d_%s needs both an up and a down file", m.Version, m.Name)
		}
		out = append(out, *m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i, m := range out {
		if m.Version != i+1 {
			return nil, fmt.Errorf("migration versions must be 1..n without gaps; found %d at position %d", m.Version, i+1)
		}
	}
	return out, nil
}

func render(sql, schema string) string { return strings.ReplaceAll(sql, "{{schema}}", quote(schema)) }

// lockKey derives the advisory lock that serialises migrations of one schema,
// so that many replicas starting at once migrate it exactly once.
func lockKey(schema string) int64 {
	h := fnv.New64a()
	h.Write([]byte("tenure.migrate." + schema))
	return int64(h.Sum64())
}

// Migrate applies every pending migration to schema, creating the schema if
// needed. It holds a session advisory lock for the whole run, and each
// migration runs in its own transaction together with its version row.
// It returns the versions it applied.
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema string) ([]int, error) {
	return migrate(ctx, pool, schema, func(conn *pgx.Conn, applied map[int]time.Time, all []Migration) ([]int, error) {
		var done []int
		for _, m := range all {
			if _, ok := applied[m.Version]; ok {
				continue
			}
			if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, render(m.up, schema)); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `INSERT INTO `+quote(schema)+`.schema_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name)
				return err
			}); err != nil {
				return done, fmt.Errorf("migration %03d_%s: %w", m.Version, m.Name, err)
			}
			done = append(done, m.Version)
		}
		return done, nil
	})
}

// MigrateDownOptions are MigrateDown's options.
type MigrateDownOptions struct {
	// Force reverts the migration even while the schema holds fencing state
	// (rows in fences): workers that use the schema are then fenced, or fail,
	// and what the migration drops is lost. Without it MigrateDown refuses
	// with a *SchemaInUseError.
	Force bool
}

// ErrSchemaInUse is matched by the error of a MigrateDown that was refused
// because the schema holds fencing state; the error is a *SchemaInUseError.
var ErrSchemaInUse = errors.New("schema holds fencing state")

// SchemaInUseError says why MigrateDown refused and what reverting the
// migration would lose.
type SchemaInUseError struct {
	Schema  string
	Version int
	Name    string
	// Rows counts the rows of tenure's tables, by table: fences,
	// dead_letters, group_incarnations, fence_log, partition_holds, and
	// every table the migration drops. Tables that do not exist are left
	// out.
	Rows map[string]int64
	// Drops are the tables and columns the migration drops ("exports",
	// "exports.job_value").
	Drops []string
}

func (e *SchemaInUseError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "refusing to revert migration %03d_%s of schema %s: it holds fencing state (%d fencing rows, %d dead letters, %d incarnations",
		e.Version, e.Name, e.Schema, e.Rows["fences"], e.Rows["dead_letters"], e.Rows["group_incarnations"])
	if n, ok := e.Rows["fence_log"]; ok {
		fmt.Fprintf(&b, ", %d fence log entries", n)
	}
	if n := e.Rows["partition_holds"]; n > 0 {
		fmt.Fprintf(&b, ", %d partition holds", n)
	}
	b.WriteString(")")
	if len(e.Drops) > 0 {
		b.WriteString("; reverting it drops ")
		for i, d := range e.Drops {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(d)
			if n, ok := e.Rows[d]; ok {
				fmt.Fprintf(&b, " (%d rows)", n)
			}
		}
	}
	b.WriteString("; workers using the schema would be fenced or fail over and over")
	return b.String()
}

// Is makes errors.Is(err, ErrSchemaInUse) true.
func (e *SchemaInUseError) Is(target error) bool { return target == ErrSchemaInUse }

// MigrateDown reverts the newest applied migration, if any, and returns its
// version (0 when nothing was applied). While the schema holds fencing state
// (a row in fences) it refuses with a *SchemaInUseError that says what would
// be lost, unless opts.Force is set.
func MigrateDown(ctx context.Context, pool *pgxpool.Pool, schema string, opts MigrateDownOptions) (int, error) {
	var reverted int
	_, err := migrate(ctx, pool, schema, func(conn *pgx.Conn, applied map[int]time.Time, all []Migration) ([]int, error) {
		for i := len(all) - 1; i >= 0; i-- {
			m := all[i]
			if _, ok := applied[m.Version]; !ok {
				continue
			}
			if !opts.Force {
				if err := checkNotInUse(ctx, conn, schema, m); err != nil {
					return nil, err
				}
			}
			err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, render(m.down, schema)); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `DELETE FROM `+quote(schema)+`.schema_migrations WHERE version = $1`, m.Version)
				return err
			})
			if err != nil {
				return nil, fmt.Errorf("reverting migration %03d_%s: %w", m.Version, m.Name, err)
			}
			reverted = m.Version
			return nil, nil
		}
		return nil, nil
	})
	return reverted, err
}

var (
	dropTableRE  = regexp.MustCompile(`(?i)DROP\s+TABLE\s+(?:IF\s+EXISTS\s+)?\{\{schema\}\}\.([a-z_][a-z0-9_]*)`)
	alterTableRE = regexp.MustCompile(`(?i)ALTER\s+TABLE\s+\{\{schema\}\}\.([a-z_][a-z0-9_]*)\s+DROP\s+COLUMN\s+(?:IF\s+EXISTS\s+)?([a-z_][a-z0-9_]*)`)
)

// Drops lists the tables and columns ("table.column") that reverting m
// drops, read from its down SQL.
func (m Migration) Drops() []string {
	var out []string
	for _, g := range alterTableRE.FindAllStringSubmatch(m.down, -1) {
		out = append(out, g[1]+"."+g[2])
	}
	for _, g := range dropTableRE.FindAllStringSubmatch(m.down, -1) {
		out = append(out, g[1])
	}
	return out
}

// checkNotInUse returns a *SchemaInUseError if schema has fencing rows.
func checkNotInUse(ctx context.Context, q querier, schema string, m Migration) error {
	e := &SchemaInUseError{Schema: schema, Version: m.Version, Name: m.Name, Rows: map[string]int64{}, Drops: m.Drops()}
	tables := []string{"fences", "dead_letters", "group_incarnations", "fence_log", "partition_holds"}
	for _, d := range e.Drops {
		if !strings.Contains(d, ".") && !slices.Contains(tables, d) {
			tables = append(tables, d)
		}
	}
	for _, t := range tables {
		var exists bool
		if err := q.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, quote(schema)+"."+pgx.Identifier{t}.Sanitize()).Scan(&exists); err != nil {
			return err
		}
		if !exists {
			continue
		}
		var n int64
		if err := q.QueryRow(ctx, `SELECT count(*) FROM `+quote(schema)+"."+pgx.Identifier{t}.Sanitize()).Scan(&n); err != nil {
			return err
		}
		e.Rows[t] = n
	}
	if e.Rows["fences"] == 0 {
		return nil
	}
	return e
}

// MigrationStatus reports every embedded migration and whether schema has it.
func MigrationStatus(ctx context.Context, pool *pgxpool.Pool, schema string) ([]MigrationState, error) {
	if err := ValidateSchema(schema); err != nil {
		return nil, err
	}
	all, err := loadMigrations()
	if err != nil {
		return nil, err
	}
	applied, err := appliedVersions(ctx, pool, schema, all)
	if err != nil {
		return nil, err
	}
	out := make([]MigrationState, len(all))
	for i, m := range all {
		at, ok := applied[m.Version]
		out[i] = MigrationState{Version: m.Version, Name: m.Name, Applied: ok, AppliedAt: at}
	}
	return out, nil
}

// CheckSchema returns an error unless every embedded migration is applied to
// schema. Workers started with migrations disabled call it so that a missing
// or outdated schema is one clear sentence at start, not a failure per batch.
func CheckSchema(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	st, err := MigrationStatus(ctx, pool, schema)
	if err != nil {
		return err
	}
	for _, m := range st {
		if !m.Applied {
			return fmt.Errorf("schema %q lacks migration %03d_%s: run `tenure migrate up --schema %s`", schema, m.Version, m.Name, schema)
		}
	}
	return nil
}

type migrateFunc func(conn *pgx.Conn, applied map[int]time.Time, all []Migration) ([]int, error)

func migrate(ctx context.Context, pool *pgxpool.Pool, schema string, fn migrateFunc) ([]int, error) {
	if err := ValidateSchema(schema); err != nil {
		return nil, err
	}
	all, err := loadMigrations()
	if err != nil {
		return nil, err
	}
	pc, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer pc.Release()
	conn := pc.Conn()
	// A session lock, not a transaction lock: it must span several
	// transactions. It is released below, or by Postgres when the session
	// ends if this process dies.
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, lockKey(schema)); err != nil {
		return nil, err
	}
	defer func() {
		// Use a fresh context: the caller's may be cancelled, and a lock left
		// on a pooled session would block every later migration.
		uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := conn.Exec(uctx, `SELECT pg_advisory_unlock($1)`, lockKey(schema)); err != nil {
			_ = conn.Close(uctx) // closing the session releases the lock
		}
	}()
	q := quote(schema)
	if _, err := conn.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+q); err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+q+`.schema_migrations (
		version    integer     PRIMARY KEY,
		name       text        NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return nil, err
	}
	applied, err := appliedVersions(ctx, conn, schema, all)
	if err != nil {
		return nil, err
	}
	return fn(conn, applied, all)
}

func checkNotNewer(schema string, applied map[int]time.Time, all []Migration) error {
	for v := range applied {
		if v > len(all) {
			return fmt.Errorf("schema %q has migration version %d but this binary knows only up to %d: it was migrated by a newer tenure", schema, v, len(all))
		}
	}
	return nil
}

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// appliedVersions reads the migrations schema has, and when each was
// applied. It refuses a schema that a newer tenure migrated (a version
// beyond all, checkNotNewer): no reader of the versions can go on then.
func appliedVersions(ctx context.Context, q querier, schema string, all []Migration) (map[int]time.Time, error) {
	rows, err := q.Query(ctx, `SELECT version, applied_at FROM `+quote(schema)+`.schema_migrations`)
	if err != nil {
		if isUndefinedTable(err) {
			return map[int]time.Time{}, nil
		}
		return nil, err
	}
	out := map[int]time.Time{}
	var v int
	var at time.Time
	if _, err := pgx.ForEachRow(rows, []any{&v, &at}, func() error { out[v] = at; return nil }); err != nil {
		return nil, err
	}
	return out, checkNotNewer(schema, out, all)
}

func isUndefinedTable(err error) bool { return IsMissingTables(err) }
