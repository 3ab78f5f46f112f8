package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tenure-dev/tenure/internal/testinfra/testdb"
	"github.com/tenure-dev/tenure/sink"
)

// The partition dimension's gate: a write to the run's ledger waits while
// the backlog is produced and goes through once it is all there; a backlog
// slower than the limit opens the gate at the limit, and the run says so.
func TestBenchGate(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := testdb.Pool(t)
	s := testdb.FreshSchema(t, pool, "benchgate")
	if _, err := sink.Migrate(ctx, pool, s); err != nil {
		t.Fatal(err)
	}
	b := &bench{pool: pool}
	settled := func() (bool, string, error) { return true, "", nil }
	// write is what a program's batch does: a row into the ledger. Its
	// answer arrives on the channel when the statement is through.
	write := func() <-chan error {
		done := make(chan error, 1)
		go func() {
			_, err := pool.Exec(ctx, `INSERT INTO `+pgx.Identifier{s, "ledger"}.Sanitize()+
				` (topic, partition, job_offset, job_key, incarnation, epoch, worker) VALUES ('t', 0, 0, 'k', 1, 1, 'w')`)
			done <- err
		}()
		return done
	}

	var wrote <-chan error
	_, gated, note, err := b.gatedBacklog(ctx, nil, s, settled, func(context.Context) error {
		wrote = write()
		select {
		case err := <-wrote:
			return fmt.Errorf("a write went through while the backlog was produced (err %v): the gate does not hold", err)
		case <-time.After(500 * time.Millisecond):
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatalf("the held write, once the gate opened: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the held write still waits 10 s after the gate opened")
	}
	if gated < 0.5 || note != "" {
		t.Errorf("gated %.2f s, note %q; want at least the 0.5 s the backlog took, and no note", gated, note)
	}

	// A backlog slower than the limit: the gate opens at the limit, and
	// gatedBacklog returns once the backlog is all there.
	b.gateLimit = 200 * time.Millisecond
	produced := false
	_, gated, note, err = b.gatedBacklog(ctx, nil, s, settled, func(context.Context) error {
		wrote = write()
		select {
		case err := <-wrote:
			if err != nil {
				return fmt.Errorf("the write after the limit: %w", err)
			}
		case <-time.After(5 * time.Second):
			return errors.New("the gate still held 5 s after its 200 ms limit")
		}
		produced = true
		return nil
	})
	if err != nil || !produced {
		t.Fatalf("gatedBacklog: err %v, backlog produced %v; want nil and all of it", err, produced)
	}
	if gated > 1 || !strings.Contains(note, "longer than 200ms") {
		t.Errorf("gated %.2f s, note %q; want about the 200 ms limit and a note that says so", gated, note)
	}
}
