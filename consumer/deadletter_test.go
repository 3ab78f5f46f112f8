package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/sink"
)

// poisonValues gives job i's value, naming the failure kinds has for it,
// if any, for poisonHandler.
func poisonValues(kinds map[int]string) func(i int) string {
	return func(i int) string {
		if k, ok := kinds[i]; ok {
			return fmt.Sprintf(`{"i":%d,"kind":%q}`, i, k)
		}
		return fmt.Sprintf(`{"i":%d}`, i)
	}
}

// poisonHandler writes ledger rows but fails on chosen jobs: "fail" forever
// (transient-looking), "garbage" permanently, "panic" by panicking, "slow" by
// outliving the handler timeout, "flaky" only on its first two attempts.
func poisonHandler(t *testing.T, schema string) (consumer.Handler, func(job string) int) {
	inner := ledger(t, schema)
	var mu sync.Mutex
	tries := map[string]int{}
	h := consumer.HandlerFunc(func(ctx context.Context, tx consumer.Tx, b *consumer.Batch) error {
		if err := inner.Handle(ctx, tx, b); err != nil {
			return err
		}
		for _, r := range b.Records {
			v := string(r.Value)
			mu.Lock()
			tries[consumer.JobID(r)]++
			n := tries[consumer.JobID(r)]
			mu.Unlock()
			switch {
			case strings.Contains(v, "fail"):
				return fmt.Errorf("cannot export %s", consumer.JobID(r))
			case strings.Contains(v, "garbage"):
				return consumer.Permanent(errors.New("job is not valid JSON"))
			case strings.Contains(v, "panic"):
				var m map[string]int
				m["boom"]++ // a nil map write: a real bug, not a panic() call
			case strings.Contains(v, "slow"):
				<-ctx.Done()
				return ctx.Err()
			case strings.Contains(v, "flaky") && n <= 2:
				return errors.New("flaky dependency")
			}
		}
		return nil
	})
	return h, func(job string) int { mu.Lock(); defer mu.Unlock(); return tries[job] }
}

// Bad jobs are isolated and parked in the dead-letter table in the fenced
// transaction that moves past them; every other job commits exactly once,
// and the partition keeps moving.
func TestPoisonJobsAreDeadLetteredAndTheRestCommit(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	kinds := map[int]string{7: "fail", 23: "garbage", 41: "panic", 55: "slow", 60: "flaky"}
	values := poisonValues(kinds)
	b.produceValues(100, func(i int) string { return fmt.Sprintf("k%d", i%2) }, values)
	h, _ := poisonHandler(t, b.schema)
	core, logs := observer.New(zap.DebugLevel)
	cfg := b.config(h, zap.New(core))
	cfg.MaxAttempts = 3
	cfg.HandlerTimeout = 300 * time.Millisecond
	defer func() {
		if t.Failed() {
			for _, e := range logs.All() {
				t.Logf("%s %s %v", e.Level, e.Message, e.ContextMap())
			}
		}
	}()
	b.runUntilDone(cfg, 60*time.Second)
	hist := b.check()
	if len(hist.Writes) != 96 {
		t.Errorf("ledger has %d rows, want 96 (100 jobs, 4 dead)", len(hist.Writes))
	}
	dls, err := b.store.DeadLetters(context.Background(), sink.DeadLetterFilter{Group: b.group})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]sink.DeadLetter{}
	for _, d := range dls {
		got[string(d.Value)] = d
	}
	for i, kind := range kinds {
		d, dead := got[values(i)]
		if kind == "flaky" {
			if dead {
				t.Errorf("the flaky job was dead-lettered after %d attempts; it should have succeeded on its third", d.Attempts)
			}
			continue
		}
		if !dead {
			t.Errorf("%s job %d is not in the dead-letter table", kind, i)
			continue
		}
		wantAttempts := 3
		if kind == "garbage" || kind == "panic" {
			wantAttempts = 1
		}
		if d.Attempts != wantAttempts {
			t.Errorf("%s job: %d attempts recorded, want %d", kind, d.Attempts, wantAttempts)
		}
		if d.Status != "dead" || d.Error == "" || d.Token.Epoch <= 0 || d.Owner == "" || string(d.Key) == "" {
			t.Errorf("%s job: incomplete dead letter %+v", kind, d)
		}
	}
	if len(dls) != 4 {
		t.Errorf("%d dead letters, want 4", len(dls))
	}
	if !strings.Contains(got[values(55)].Error, "timed out") {
		t.Errorf("the slow job's error should say it timed out: %q", got[values(55)].Error)
	}
	if logs.FilterMessage("handler panicked").Len() == 0 {
		t.Error("the panic was not logged")
	}
}

// A database that is down is not the job's fault: nothing is dead-lettered
// while the handler's statements fail on a dead connection, and the batch
// commits once the database answers again. (Here the "outage" is a handler
// whose statements fail with a connection-class error.)
func TestConnectionErrorsNeverDeadLetter(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	b.produce(10, oneKey)
	h, _ := failFirst(t, b, 8, func(ctx context.Context, tx consumer.Tx) error { // more than MaxAttempts
		_, err := tx.Exec(ctx, `SELECT pg_terminate_backend(pg_backend_pid())`)
		if err == nil {
			return errors.New("expected the session to be terminated")
		}
		return err
	})
	cfg := b.config(h, zap.NewNop())
	cfg.MaxAttempts = 2
	b.runUntilDone(cfg, 60*time.Second)
	dls, err := b.store.DeadLetters(context.Background(), sink.DeadLetterFilter{Group: b.group})
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 0 {
		t.Fatalf("connection failures dead-lettered %d jobs: %+v", len(dls), dls)
	}
	if h := b.check(); len(h.Writes) != 10 {
		t.Fatalf("ledger has %d rows, want 10", len(h.Writes))
	}
}
