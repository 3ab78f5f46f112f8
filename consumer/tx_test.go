package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap/zaptest"

	"github.com/tenure-dev/tenure/consumer"
)

// The handler's transaction can run statements and savepoints but cannot
// be ended, nor its connection reached, through what the handler is given:
// no Commit, Rollback or Conn on the Tx, and rows (from Query or from a
// batch's callbacks) without their Conn. A savepoint's Commit releases the
// savepoint and its Rollback undoes only what ran since it. A Tx kept past
// Handle refuses to work.
func TestHandlerTxCannotEndTheTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	ctx := context.Background()
	table := pgx.Identifier{b.schema, "out"}.Sanitize()
	if _, err := b.pool.Exec(ctx, `CREATE TABLE `+table+` (job text PRIMARY KEY, note text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	b.produce(5, func(int) string { return "k" })

	var (
		mu      sync.Mutex
		kept    consumer.Tx
		reached []string // what the handler could reach that it must not
	)
	h := consumer.HandlerFunc(func(ctx context.Context, tx consumer.Tx, batch *consumer.Batch) error {
		var v any = tx
		if _, ok := v.(interface{ Commit(context.Context) error }); ok {
			mu.Lock()
			reached = append(reached, "Tx.Commit")
			mu.Unlock()
		}
		if _, ok := v.(interface{ Rollback(context.Context) error }); ok {
			mu.Lock()
			reached = append(reached, "Tx.Rollback")
			mu.Unlock()
		}
		if _, ok := v.(interface{ Conn() *pgx.Conn }); ok {
			mu.Lock()
			reached = append(reached, "Tx.Conn")
			mu.Unlock()
		}
		rows, err := tx.Query(ctx, `SELECT 1`)
		if err != nil {
			return err
		}
		if rows.Conn() != nil {
			mu.Lock()
			reached = append(reached, "Rows.Conn")
			mu.Unlock()
		}
		rows.Close()
		var pb pgx.Batch
		pb.Queue(`SELECT 2`).Query(func(rows pgx.Rows) error {
			if rows.Conn() != nil {
				mu.Lock()
				reached = append(reached, "batch callback Rows.Conn")
				mu.Unlock()
			}
			return nil
		})
		if err := tx.SendBatch(ctx, &pb).Close(); err != nil {
			return err
		}
		for _, r := range batch.Records {
			job := consumer.JobID(r)
			// A savepoint that is released: its row stays.
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := sp.Exec(ctx, `INSERT INTO `+table+` VALUES ($1, 'kept')`, job); err != nil {
				return err
			}
			if err := sp.Commit(ctx); err != nil {
				return fmt.Errorf("releasing a savepoint: %w", err)
			}
			// A savepoint that is rolled back: its row goes, the batch goes on.
			sp, err = tx.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := sp.Exec(ctx, `INSERT INTO `+table+` VALUES ($1, 'undone')`, job+"/undone"); err != nil {
				return err
			}
			if err := sp.Rollback(ctx); err != nil {
				return fmt.Errorf("rolling back to a savepoint: %w", err)
			}
		}
		mu.Lock()
		kept = tx
		mu.Unlock()
		return nil
	})
	stop := b.start(b.config(h, zaptest.NewLogger(t)))
	b.waitDone(60 * time.Second)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, r := range reached {
		t.Errorf("the handler could reach %s", r)
	}
	var n, undone int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE note = 'kept'), count(*) FILTER (WHERE note = 'undone') FROM `+table).Scan(&n, &undone); err != nil {
		t.Fatal(err)
	}
	if n != 5 || undone != 0 {
		t.Errorf("out has %d released and %d rolled-back savepoint rows, want 5 and 0", n, undone)
	}
	if kept == nil {
		t.Fatal("the handler never ran")
	}
	if _, err := kept.Exec(ctx, `INSERT INTO `+table+` VALUES ('late', 'late')`); !errors.Is(err, consumer.ErrTxDone) {
		t.Errorf("a Tx used after Handle returned: %v, want ErrTxDone", err)
	}
}
