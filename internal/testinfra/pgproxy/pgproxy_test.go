package pgproxy_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenure-dev/tenure/internal/testinfra/pgproxy"
	"github.com/tenure-dev/tenure/internal/testinfra/testdb"
)

// world is a table on the test database, a proxy in front of that
// database, and a direct pool to check what really committed.
type world struct {
	proxy  *pgproxy.Proxy
	direct *pgxpool.Pool
	url    string // through the proxy
	table  string // quoted
}

func newWorld(t *testing.T) *world {
	t.Helper()
	direct := testdb.Pool(t)
	schema := testdb.Schema(t, direct)
	p, u := pgproxy.InFront(t, testdb.URL())
	w := &world{proxy: p, direct: direct, url: u.String(), table: pgx.Identifier{schema, "t"}.Sanitize()}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := direct.Exec(ctx, `CREATE TABLE `+w.table+` (x int)`); err != nil {
		t.Fatal(err)
	}
	return w
}

func (w *world) connect(t *testing.T) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, w.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

func (w *world) count(t *testing.T, x int) int {
	t.Helper()
	var n int
	if err := w.direct.QueryRow(context.Background(), `SELECT count(*) FROM `+w.table+` WHERE x = $1`, x).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// wantCommitted fails the test unless row x was committed want times.
func (w *world) wantCommitted(t *testing.T, x, want int) {
	t.Helper()
	if n := w.count(t, x); n != want {
		t.Fatalf("row %d committed %d times, want %d", x, n, want)
	}
}

// wantConnError fails the test unless the commit's err is a broken
// connection rather than nil or an error the server sent.
func wantConnError(t *testing.T, err error) {
	t.Helper()
	var pgErr *pgconn.PgError
	if err == nil || errors.As(err, &pgErr) {
		t.Fatalf("commit returned %v, want a connection error", err)
	}
}

// insertAndCommit inserts x in a transaction and commits it, returning the
// commit's error.
func insertAndCommit(t *testing.T, c *pgx.Conn, table string, x int, before func()) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }() // released on every path: a failure must not hang the pool's Close
	if _, err := tx.Exec(ctx, `INSERT INTO `+table+` VALUES ($1)`, x); err != nil {
		t.Fatal(err)
	}
	if before != nil {
		before()
	}
	return tx.Commit(ctx)
}

// commitCutAfter inserts 1 on a new connection through the proxy and
// commits it, the COMMIT armed by arm with AfterCommit; it returns arm's
// report channel and the commit's error.
func (w *world) commitCutAfter(t *testing.T, arm func(client net.Addr, cut pgproxy.Cut) <-chan pgproxy.Report) (<-chan pgproxy.Report, error) {
	t.Helper()
	c := w.connect(t)
	var report <-chan pgproxy.Report
	err := insertAndCommit(t, c, w.table, 1, func() {
		report = arm(c.PgConn().Conn().LocalAddr(), pgproxy.AfterCommit)
	})
	return report, err
}

func wait(t *testing.T, ch <-chan pgproxy.Report) pgproxy.Report {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("the armed COMMIT was not cut")
		return pgproxy.Report{}
	}
}

// A pool of connections works through the proxy as it does directly.
func TestRelaysManyConnections(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(w.url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := range 40 {
		wg.Go(func() {
			// Extended protocol, a transaction and a COMMIT nobody armed.
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `INSERT INTO `+w.table+` SELECT $1 FROM pg_sleep(0.01)`, i)
				return err
			})
			if err != nil {
				errs <- fmt.Errorf("job %d: %w", i, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	var n int
	if err := w.direct.QueryRow(ctx, `SELECT count(DISTINCT x) FROM `+w.table).Scan(&n); err != nil || n != 40 {
		t.Fatalf("%d distinct rows (%v), want 40", n, err)
	}
	if c := w.proxy.Conns(); c < 2 {
		t.Errorf("the pool used %d proxied connections, want several", c)
	}
}

// AfterCommit: the transaction commits, the client gets a broken
// connection and no server error.
func TestCutAfterCommit(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	report, err := w.commitCutAfter(t, w.proxy.CutCommit)
	wantConnError(t, err)
	if r := wait(t, report); r.Cut != pgproxy.AfterCommit || r.Reply != "COMMIT" {
		t.Fatalf("report %+v, want the server's COMMIT", r)
	}
	w.wantCommitted(t, 1, 1)
}

// BeforeCommit: the transaction does not commit; a commit on another
// connection, made while the first one is armed, goes through.
func TestCutBeforeCommit(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	a, b := w.connect(t), w.connect(t)
	var report <-chan pgproxy.Report
	if err := insertAndCommit(t, b, w.table, 2, func() {
		report = w.proxy.CutCommit(a.PgConn().Conn().LocalAddr(), pgproxy.BeforeCommit)
	}); err != nil {
		t.Fatalf("a commit on another connection failed: %v", err)
	}
	err := insertAndCommit(t, a, w.table, 1, nil)
	wantConnError(t, err)
	if r := wait(t, report); r.Cut != pgproxy.BeforeCommit {
		t.Fatalf("report %+v", r)
	}
	// Uncommitted rows are invisible whether or not the server has noticed
	// the closed connection yet.
	w.wantCommitted(t, 1, 0)
	w.wantCommitted(t, 2, 1) // the other connection's row
}

// Down, the proxy breaks every connection and refuses new ones; up again,
// it relays.
func TestDownAndUp(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	c := w.connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w.proxy.SetDown(true)
	if _, err := c.Exec(ctx, `SELECT 1`); err == nil {
		t.Fatal("a connection survived the proxy going down")
	}
	if c, err := pgx.Connect(ctx, w.url); err == nil {
		c.Close(ctx)
		t.Fatal("connected while the proxy is down")
	}
	w.proxy.SetDown(false)
	if _, err := w.connect(t).Exec(ctx, `SELECT 1`); err != nil {
		t.Fatalf("after the proxy came back: %v", err)
	}
}

// CutCommitAndGoDown: the COMMIT is cut and, until the proxy is up again,
// nobody can ask the server what became of it.
func TestCutCommitAndGoDown(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	report, err := w.commitCutAfter(t, w.proxy.CutCommitAndGoDown)
	if err == nil {
		t.Fatal("the cut commit returned no error")
	}
	if r := wait(t, report); r.Reply != "COMMIT" {
		t.Fatalf("report %+v, want the server's COMMIT", r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if c, err := pgx.Connect(ctx, w.url); err == nil {
		c.Close(ctx)
		t.Fatal("connected while the proxy is down")
	}
	w.proxy.SetDown(false)
	w.wantCommitted(t, 1, 1)
}

// A held statement reaches the server when released, even though its client
// gave up on it meanwhile and closed its connection.
func TestHoldRunsTheStatementAfterTheClientGaveUp(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"socket closed", "context ended"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			cfg, err := pgx.ParseConfig(w.url)
			if err != nil {
				t.Fatal(err)
			}
			cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol // the SQL travels in one message
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, err := pgx.ConnectConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			// pgx sends a cancel request on the side when it gives up on
			// a statement; a cancel is best-effort (it may come too late,
			// as a held statement shows), so the proxy drops it here.
			w.proxy.DropCancelRequests(true)
			h := w.proxy.HoldMatching("VALUES (42)")
			qctx, qcancel := context.WithCancel(context.Background())
			defer qcancel()
			done := make(chan error, 1)
			go func() {
				_, err := c.Exec(qctx, `INSERT INTO `+w.table+` VALUES (42)`)
				done <- err
			}()
			select {
			case <-h.Held():
			case <-time.After(10 * time.Second):
				t.Fatal("nothing was held")
			}
			if how == "socket closed" {
				_ = c.PgConn().Conn().Close()
			} else {
				qcancel()
			}
			if err := <-done; err == nil {
				t.Fatal("the held insert returned without error before it was released")
			}
			if n := w.count(t, 42); n != 0 {
				t.Fatalf("the insert ran before it was released (%d rows)", n)
			}
			h.Release()
			<-h.Forwarded()
			deadline := time.Now().Add(10 * time.Second)
			for w.count(t, 42) != 1 {
				if time.Now().After(deadline) {
					t.Fatal("the released insert never ran")
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}
