package pgha

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// The formation fails over when its primary dies, keeps what the primary
// acknowledged (synchronous standby), takes the dead node back as a standby,
// and fails over again, the other way.
func TestFailoverAndRejoin(t *testing.T) {
	f := Start(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if names, err := f.SyncStandbyNames(ctx); err != nil || !strings.HasPrefix(names, "ANY 1") {
		t.Fatalf("synchronous_standby_names = %q, %v; want ANY 1 (...)", names, err)
	}
	write := func(n int) {
		t.Helper()
		conn, err := pgx.Connect(ctx, f.URL())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS acked (i int)`); err != nil {
			t.Fatal(err)
		}
		for i := range n {
			if _, err := conn.Exec(ctx, `INSERT INTO acked VALUES ($1)`, i); err != nil {
				t.Fatal(err)
			}
		}
	}
	count := func() int {
		t.Helper()
		conn, err := pgx.Connect(ctx, f.URL())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM acked`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	want := 0
	for round, from := range []string{"node1", "node2"} {
		write(300)
		want += 300
		killed, at, err := f.KillPrimary(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if killed.Name != from {
			t.Fatalf("round %d: killed %s, want %s", round, killed.Name, from)
		}
		n, err := f.WaitWritable(ctx, 60*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d: %s killed; %s writable %s later", round, killed.Name, n.Name, time.Since(at).Round(time.Millisecond))
		if n == killed {
			t.Fatalf("written on the killed node %s", n.Name)
		}
		if got := count(); got != want {
			t.Fatalf("round %d: %d acknowledged rows survived the failover, want %d", round, got, want)
		}
		if err := f.Restart(killed); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if err := f.WaitHealthy(ctx); err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d: %s rejoined as a standby in %s", round, killed.Name, time.Since(start).Round(time.Millisecond))
	}
	st, err := f.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pg_autoctl show state:\n%s", st)
}
