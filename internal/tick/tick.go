// Package tick holds the loop that every periodic watch of tenure (and of
// its tests) runs: call a function on a ticker until a context ends.
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
