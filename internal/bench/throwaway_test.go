package bench

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenure-dev/tenure/sink"
)

// The tenure-strict row's throwaway cluster: it starts with prepared
// transactions and the settings given, serves a prepared transaction, and
// Close stops it and removes its files.
func TestThrowawayPG(t *testing.T) {
	if _, err := pgBinDir(); errors.Is(err, errNoPostgresBinaries) {
		t.Skip("no PostgreSQL server binaries (initdb) on this machine: the bench skips the strict row here too")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := startThrowawayPG(ctx, map[string]string{"synchronous_commit": "off", "shared_buffers": "32MB"})
	if err != nil {
		t.Fatalf("starting: %v", err)
	}
	closed := false
	defer func() {
		if !closed {
			_ = c.Close()
		}
	}()
	pool, err := pgxpool.New(ctx, c.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := sink.CheckPreparedTransactions(ctx, pool); err != nil {
		t.Fatalf("prepared transactions: %v", err)
	}
	got, err := serverSettings(ctx, pool, []string{"synchronous_commit", "shared_buffers", "max_prepared_transactions", "no_such_setting"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"synchronous_commit": "off", "shared_buffers": "32MB", "max_prepared_transactions": "100"}
	if len(got) != len(want) {
		t.Errorf("settings %v, want %v (no_such_setting left out)", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	// What --strict does with each batch.
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{`CREATE TABLE t (x int)`, `BEGIN`, `INSERT INTO t VALUES (1)`, `PREPARE TRANSACTION 'bench-test'`, `COMMIT PREPARED 'bench-test'`} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	conn.Release()
	pool.Close()
	if err := c.Close(); err != nil {
		t.Fatalf("closing: %v", err)
	}
	closed = true
	if _, err := os.Stat(c.root); !os.IsNotExist(err) {
		t.Errorf("%s is still there after Close: %v", c.root, err)
	}
	cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
	defer ccancel()
	if conn, err := pgx.Connect(cctx, c.URL()); err == nil {
		conn.Close(ctx)
		t.Errorf("the cluster still accepts connections on port %d after Close", c.port)
	}
}
