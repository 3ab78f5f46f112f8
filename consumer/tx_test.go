package consumer_test

import (
	"bytes"
	"context"
	"encoding/binary"
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
	p := &txProbe{schema: b.schema, table: pgx.Identifier{b.schema, "out"}.Sanitize()}
	b.exec(`CREATE TABLE ` + p.table + ` (job text PRIMARY KEY, note text NOT NULL)`)
	b.produce(5, oneKey)
	b.runUntilDone(b.config(consumer.HandlerFunc(p.handle), zaptest.NewLogger(t)), 60*time.Second)
	p.mu.Lock()
	defer p.mu.Unlock()

	t.Run("nothing ends it", func(t *testing.T) {
		for _, r := range p.reached {
			t.Errorf("the handler could reach %s", r)
		}
	})
	t.Run("savepoints", func(t *testing.T) {
		var n, undone int
		if err := b.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE note = 'kept'), count(*) FILTER (WHERE note = 'undone') FROM `+p.table).Scan(&n, &undone); err != nil {
			t.Fatal(err)
		}
		if n != 5 || undone != 0 {
			t.Errorf("out has %d released and %d rolled-back savepoint rows, want 5 and 0", n, undone)
		}
	})
	t.Run("binary COPY", func(t *testing.T) {
		for _, l := range p.lacks {
			t.Errorf("the handler's %s", l)
		}
		var n int
		if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+p.table+` WHERE note = 'copied'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 5 {
			t.Errorf("out has %d rows from binary COPY, want 5", n)
		}
	})
	t.Run("kept past Handle", func(t *testing.T) {
		if p.kept == nil {
			t.Fatal("the handler never ran")
		}
		if bc, ok := p.kept.(consumer.BinaryCopier); !ok {
			t.Errorf("%T is not a BinaryCopier", p.kept)
		} else if _, err := bc.CopyFromBinary(ctx, pgx.Identifier{b.schema, "out"}, []string{"job", "note"},
			bytes.NewReader(copyRow("late", "late"))); !errors.Is(err, consumer.ErrTxDone) {
			t.Errorf("binary COPY on a Tx used after Handle returned: %v, want ErrTxDone", err)
		}
		if _, err := p.kept.Exec(ctx, `INSERT INTO `+p.table+` VALUES ('late', 'late')`); !errors.Is(err, consumer.ErrTxDone) {
			t.Errorf("a Tx used after Handle returned: %v, want ErrTxDone", err)
		}
	})
}

// txProbe is a handler that tries what a handler must not be able to do
// with its Tx, and uses savepoints into table.
type txProbe struct {
	schema  string
	table   string // schema's out, quoted
	mu      sync.Mutex
	kept    consumer.Tx
	reached []string // what the handler could reach that it must not
	lacks   []string // what the handler's Tx should have and had not
}

func (p *txProbe) reach(what string) {
	p.mu.Lock()
	p.reached = append(p.reached, what)
	p.mu.Unlock()
}

func (p *txProbe) handle(ctx context.Context, tx consumer.Tx, batch *consumer.Batch) error {
	var v any = tx
	if _, ok := v.(interface{ Commit(context.Context) error }); ok {
		p.reach("Tx.Commit")
	}
	if _, ok := v.(interface{ Rollback(context.Context) error }); ok {
		p.reach("Tx.Rollback")
	}
	if _, ok := v.(interface{ Conn() *pgx.Conn }); ok {
		p.reach("Tx.Conn")
	}
	rows, err := tx.Query(ctx, `SELECT 1`)
	if err != nil {
		return err
	}
	if rows.Conn() != nil {
		p.reach("Rows.Conn")
	}
	rows.Close()
	var pb pgx.Batch
	pb.Queue(`SELECT 2`).Query(func(rows pgx.Rows) error {
		if rows.Conn() != nil {
			p.reach("batch callback Rows.Conn")
		}
		return nil
	})
	if err := tx.SendBatch(ctx, &pb).Close(); err != nil {
		return err
	}
	for _, r := range batch.Records {
		if err := p.savepoints(ctx, tx, consumer.JobID(r)); err != nil {
			return err
		}
	}
	if err := p.copyBinary(ctx, tx, batch); err != nil {
		return err
	}
	p.mu.Lock()
	p.kept = tx
	p.mu.Unlock()
	return nil
}

// copyBinary writes a row per job by binary COPY, half of them through a
// savepoint (which has it too).
func (p *txProbe) copyBinary(ctx context.Context, tx consumer.Tx, batch *consumer.Batch) error {
	for i, r := range batch.Records {
		var sp consumer.Savepoint
		var via consumer.Tx = tx
		if i%2 == 1 {
			var err error
			if sp, err = tx.Begin(ctx); err != nil {
				return err
			}
			via = sp
		}
		bc, ok := via.(consumer.BinaryCopier)
		if !ok {
			p.lack(fmt.Sprintf("%T is not a BinaryCopier", via))
			return nil
		}
		n, err := bc.CopyFromBinary(ctx, pgx.Identifier{p.schema, "out"}, []string{"job", "note"},
			bytes.NewReader(copyRow(consumer.JobID(r)+"/copied", "copied")))
		if err != nil {
			return fmt.Errorf("binary COPY: %w", err)
		}
		if n != 1 {
			p.lack(fmt.Sprintf("binary COPY of one row reported %d rows", n))
		}
		if sp != nil {
			if err := sp.Commit(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

func (p *txProbe) lack(what string) {
	p.mu.Lock()
	p.lacks = append(p.lacks, what)
	p.mu.Unlock()
}

// copyRow is a binary COPY stream of one row of two text fields.
func copyRow(a, b string) []byte {
	out := []byte("PGCOPY\n\377\r\n\000\x00\x00\x00\x00\x00\x00\x00\x00")
	out = binary.BigEndian.AppendUint16(out, 2)
	for _, f := range []string{a, b} {
		out = binary.BigEndian.AppendUint32(out, uint32(len(f)))
		out = append(out, f...)
	}
	return binary.BigEndian.AppendUint16(out, 0xFFFF)
}

// savepoints writes job's row in a savepoint that is released (its row
// stays) and another in one that is rolled back (its row goes, the batch
// goes on).
func (p *txProbe) savepoints(ctx context.Context, tx consumer.Tx, job string) error {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return err
	}
	if _, err := sp.Exec(ctx, `INSERT INTO `+p.table+` VALUES ($1, 'kept')`, job); err != nil {
		return err
	}
	if err := sp.Commit(ctx); err != nil {
		return fmt.Errorf("releasing a savepoint: %w", err)
	}
	sp, err = tx.Begin(ctx)
	if err != nil {
		return err
	}
	if _, err := sp.Exec(ctx, `INSERT INTO `+p.table+` VALUES ($1, 'undone')`, job+"/undone"); err != nil {
		return err
	}
	if err := sp.Rollback(ctx); err != nil {
		return fmt.Errorf("rolling back to a savepoint: %w", err)
	}
	return nil
}
