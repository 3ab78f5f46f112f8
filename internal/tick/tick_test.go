package tick

import (
	"context"
	"testing"
	"time"
)

func TestEveryCallsUntilTheEnd(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	calls := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		Every(ctx, time.Millisecond, func() {
			calls++
			if calls == 3 {
				cancel()
			}
		})
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Every did not return after its context ended")
	}
	if calls != 3 {
		t.Fatalf("f ran %d times, want 3 (it cancels on the third)", calls)
	}
}

// A tick left pending when ctx ends must not start f: select would pick it
// half the time, so a hundred rounds catch a loop that does not check.
func TestEveryNoCallAfterTheEnd(t *testing.T) {
	for i := range 100 {
		ctx, cancel := context.WithCancel(context.Background())
		calls := 0
		Every(ctx, time.Microsecond, func() {
			calls++
			cancel()
			time.Sleep(100 * time.Microsecond) // let the next tick come
		})
		if calls != 1 {
			t.Fatalf("round %d: f ran %d times, want once (it cancels on the first)", i, calls)
		}
	}
}

func TestRepeatEndsWhenFSaysSo(t *testing.T) {
	calls := 0
	Repeat(make(chan struct{}), time.Microsecond, time.Microsecond, func() bool {
		calls++
		return calls < 3
	})
	if calls != 3 {
		t.Fatalf("f ran %d times, want 3 (it says stop on the third)", calls)
	}
}

// Closing quit ends the wait for the first call: f never runs.
func TestRepeatQuitBeforeTheFirstCall(t *testing.T) {
	quit := make(chan struct{})
	close(quit)
	ran := false
	Repeat(quit, time.Hour, time.Hour, func() bool { ran = true; return true })
	if ran {
		t.Fatal("f ran after quit was closed")
	}
}
