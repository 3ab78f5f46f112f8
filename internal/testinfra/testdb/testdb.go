// Package testdb gives tests a real Postgres: a pool on
// TENURE_TEST_DATABASE_URL (default: the local server) and a fresh, migrated
// schema per test, dropped when the test ends.
package testdb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenure-dev/tenure/sink"
)

// DefaultURL is used when TENURE_TEST_DATABASE_URL is not set.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// URL is the database tests run against.
func URL() string {
	if u := os.Getenv("TENURE_TEST_DATABASE_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// Pool opens a pool on URL, closed when the test ends. A database that is
// not reachable fails the test: these tests exist to talk to a real one.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool := PoolOn(t, ctx, URL(), nil)
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("test database %s is not reachable (run scripts/ensure-postgres.sh): %v", redact(URL()), err)
	}
	return pool
}

// PoolOn opens a pool on dbURL (the test database's, through a proxy, or
// a server the test started) with no search_path, once tune (if not nil)
// has adjusted its configuration. It is closed when the test ends; any
// error fails the test. Unlike Pool it does not wait for a connection.
func PoolOn(t testing.TB, ctx context.Context, dbURL string, tune func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatalf("database URL %s: %v", redact(dbURL), err)
	}
	// A statement that forgets its schema must fail, not find a table in
	// public by luck.
	cfg.ConnConfig.RuntimeParams["search_path"] = ""
	if tune != nil {
		tune(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("connecting to %s: %v", redact(dbURL), err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// NewSchemaName returns a schema name no other test uses.
func NewSchemaName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + "_" + hex.EncodeToString(b[:])
}

// Schema creates and migrates a fresh schema (FreshSchema), dropped when
// the test ends.
func Schema(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	name := FreshSchema(t, pool, "tenure_test")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := sink.Migrate(ctx, pool, name); err != nil {
		t.Fatalf("migrating schema %s: %v", name, err)
	}
	return name
}

// FreshSchema returns a schema name no other test uses (NewSchemaName) for
// the test or the code under test to create: the schema does not exist
// yet. It is dropped when the test ends (kept if the test failed and
// TENURE_TEST_KEEP is set, for inspection).
func FreshSchema(t testing.TB, pool *pgxpool.Pool, prefix string) string {
	t.Helper()
	name := NewSchemaName(prefix)
	t.Cleanup(func() {
		if t.Failed() && os.Getenv("TENURE_TEST_KEEP") != "" {
			t.Logf("keeping schema %s", name)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS "`+name+`" CASCADE`); err != nil {
			t.Logf("dropping schema %s: %v", name, err)
		}
	})
	return name
}

// Querier is what QueryRows reads through: a pool, a connection or a
// transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// QueryRows runs sql on q and makes one T of each row with scan
// (pgx.RowTo[T] for a single column); any error fails the test.
func QueryRows[T any](t testing.TB, ctx context.Context, q Querier, scan pgx.RowToFunc[T], sql string, args ...any) []T {
	t.Helper()
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, scan)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func redact(u string) string {
	if i := strings.Index(u, "@"); i > 0 {
		if j := strings.Index(u, "://"); j > 0 && j < i {
			return u[:j+3] + "…" + u[i:]
		}
	}
	return u
}
