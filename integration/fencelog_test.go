package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tenure-dev/tenure/sink"
)

// `tenure admin fences prune` bounds the fence log of every partition of a
// group, keeping the holder's claim and the newest entries.
func TestCLIFencesPrune(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	tk := sink.Token{Epoch: 1}
	store, p := e.claimed(tk)
	ctx := context.Background()
	for i := range int64(20) {
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(context.Background()) }() // released on every path: a failure must not hang the pool's Close
		if err := store.Commit(ctx, tx, sink.CommitRequest{Partition: p, Token: tk, Owner: "w", From: i, To: i + 1}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	db := []string{"--database-url", e.dbURL, "--schema", e.schema}
	r := runCLI(t, 30*time.Second, "", append([]string{"admin", "fences", "prune", "--group", e.group, "--max-entries", "5"}, db...)...)
	if r.code != 0 || !strings.HasPrefix(r.stdout, "pruned 15 fence log entries of 1 partitions (group "+e.group) {
		t.Fatalf("admin fences prune: %s", r)
	}
	var n int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM "`+e.schema+`".fence_log`).Scan(&n); err != nil || n != 6 {
		t.Errorf("%d entries left (%v), want 6: the claim and the newest 5", n, err)
	}
	wantFailure(t, runCLI(t, 30*time.Second, "", append([]string{"admin", "fences", "prune", "--max-age", "-1s", "--max-entries", "-1"}, db...)...),
		2, "nothing to prune")
	// `admin fences` still lists the fencing rows.
	if r := runCLI(t, 30*time.Second, "", append([]string{"admin", "fences", "--group", e.group}, db...)...); r.code != 0 || !strings.Contains(r.stdout, e.topic) {
		t.Errorf("admin fences: %s", r)
	}
}
