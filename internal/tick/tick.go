// Package tick holds the loops that the periodic watches of tenure (and of
// its tests) run: call a function on a ticker until a context ends (Every),
// or after a delay and then again a while after each call (Repeat).
package tick

import (
	"context"
	"time"
)

// Every calls f every d until ctx ends. The first call comes after d, not
// at once. f runs on the caller's goroutine, so a slow f delays the next
// call rather than overlapping it (the ticker drops the ticks it missed).
// d must be positive, as for time.NewTicker.
func Every(ctx context.Context, d time.Duration, f func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// A tick and the end of ctx can be ready together, and select
		// picks either: check again so that f never starts after the end.
		if ctx.Err() != nil {
			return
		}
		f()
	}
}

// Repeat calls f once first has passed, and again each time next has
// passed since f last returned, until quit is closed or f returns false.
// It runs on the caller's goroutine (start it with go); f never overlaps
// itself, and never starts once quit is seen closed. It makes no goroutine
// or channel of its own: a lane starts such a watch for every batch.
func Repeat(quit <-chan struct{}, first, next time.Duration, f func() bool) {
	t := time.NewTimer(first)
	defer t.Stop()
	for {
		select {
		case <-quit:
			return
		case <-t.C:
		}
		// As in Every: the timer and quit can be ready together, and select
		// picks either.
		select {
		case <-quit:
			return
		default:
		}
		if !f() {
			return
		}
		t.Reset(next)
	}
}
