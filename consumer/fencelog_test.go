package consumer_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/tenure-dev/tenure/internal/fence"
	"github.com/tenure-dev/tenure/sink"
)

// The fence log gets one entry per batch. A worker bounds it for the
// partitions it holds (Config.FenceLogRetention), leaving a front-trimmed
// log that still chains from the recorded cut to the fencing row.
func TestWorkerPrunesTheFenceLogOfItsPartitions(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	b.produce(60, func(i int) string { return fmt.Sprintf("k%d", i) })
	cfg := b.config(ledger(t, b.schema), zap.NewNop())
	cfg.BatchMax = 1 // one commit per job: a long log
	cfg.FenceLogRetention = sink.FenceLogRetention{MaxEntries: 5, MaxAge: -1}
	cfg.FenceLogPruneInterval = 100 * time.Millisecond
	c, stop := runNew(t, cfg)
	b.waitDone(30 * time.Second)
	ctx := context.Background()
	waitForCond(t, 30*time.Second, "the fence log to be pruned to 5 entries and the claim", func() bool {
		n := b.rowsByPartition("fence_log")
		return len(n) == 2 && n[0] <= 6 && n[1] <= 6
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.FenceLogPruned < 60-12 {
		t.Errorf("%d entries pruned, want at least %d", st.FenceLogPruned, 60-12)
	}
	cuts, err := fence.Of(b.store).FenceLogCuts(ctx, b.group)
	if err != nil || len(cuts) != 2 {
		t.Fatalf("cuts %+v, %v", cuts, err)
	}
	for _, cut := range cuts {
		f, err := b.store.Get(ctx, cut.Partition)
		if err != nil {
			t.Fatal(err)
		}
		rows, err := b.pool.Query(ctx, `SELECT id, kind, from_offset, to_offset FROM "`+b.schema+`".fence_log
			WHERE consumer_group = $1 AND partition = $2 ORDER BY id`, b.group, cut.Partition.Partition)
		if err != nil {
			t.Fatal(err)
		}
		next := cut.NextOffset
		for rows.Next() {
			var id, from, to int64
			var kind string
			if err := rows.Scan(&id, &kind, &from, &to); err != nil {
				t.Fatal(err)
			}
			if id <= cut.ThroughID {
				if id != cut.KeptClaimID || kind != "claim" {
					t.Errorf("%s: entry #%d at or below the cut is not the kept claim", cut.Partition, id)
				}
				continue
			}
			if from != next {
				t.Errorf("%s: entry #%d starts at %d, the log had reached %d", cut.Partition, id, from, next)
			}
			next = to
		}
		rows.Close()
		if next != f.NextOffset {
			t.Errorf("%s: the pruned log ends at %d, the fencing row says %d", cut.Partition, next, f.NextOffset)
		}
	}
	// Every job is still committed exactly once (pruning touches only the log).
	var jobs, distinct int
	if err := b.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT (partition, job_offset)) FROM "`+b.schema+`".ledger`).Scan(&jobs, &distinct); err != nil || jobs != 60 || distinct != 60 {
		t.Errorf("ledger: %d rows, %d jobs (%v); want 60 and 60", jobs, distinct, err)
	}
}
