package consumer

// Retries and backoff, shared by the claim (claim.go), the commit path
// (attempt.go, strict.go), recovery (recover.go, lane.go) and the mirror
// (mirror.go): a failure is tried again after a capped, jittered,
// exponential delay, shortened while the database cannot be reached at
// all.

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"time"

	"go.uber.org/zap"

	"github.com/tenure-dev/tenure/sink"
)

// retry runs fn until it succeeds, returns an error matching sink.ErrFenced
// or errStuck, or ctx ends; between attempts it backs off like a failing
// batch does.
func (c *Consumer) retry(ctx context.Context, what string, log *zap.Logger, fn func() error) error {
	for attempt := 1; ; attempt++ {
		err := fn()
		if err == nil || errors.Is(err, sink.ErrFenced) || errors.Is(err, errStuck) {
			return err
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w (last error: %v)", what, ctx.Err(), err)
		}
		d := c.retryDelay(attempt, err)
		log.Warn(what+" failed, retrying", zap.Error(err), zap.Int("attempt", attempt), zap.Duration("backoff", d))
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%s: %w (last error: %v)", what, ctx.Err(), err)
		case <-t.C:
		}
	}
}

// backoff is the delay after the given failed attempt (1-based): capped
// exponential.
func (c *Consumer) backoff(attempt int) time.Duration {
	d := c.cfg.RetryBackoff
	for i := 1; i < attempt && d < c.cfg.RetryBackoffMax; i++ {
		d *= 2
	}
	return min(d, c.cfg.RetryBackoffMax)
}

// doubling is the delay before attempt (1-based) of a wait that starts at
// first and doubles (four times at most) up to limit: a lane's recovery,
// a strict offset commit sent again.
func doubling(first, limit time.Duration, attempt int) time.Duration {
	return min(first<<min(attempt-1, 4), limit)
}

// reconnectBackoffMax caps the backoff while the database cannot be reached
// at all. Asking again costs one connection attempt, and the moment it is
// back (a failover: a standby promoted after seconds) is when every lane
// should be at work; a database that answers with errors keeps the longer
// backoff (RetryBackoffMax), which spares it.
const reconnectBackoffMax = time.Second

// retryDelay is backoff for a failure with error err, jittered.
func (c *Consumer) retryDelay(attempt int, err error) time.Duration {
	d := c.backoff(attempt)
	if databaseAway(err) {
		d = min(d, reconnectBackoffMax)
	}
	return jitter(d)
}

// jitter spreads d over [0.75d, 1.25d): waits that many lanes or workers
// start together (a database back, a hand-off) do not stay in step.
func jitter(d time.Duration) time.Duration {
	return d*3/4 + time.Duration(mrand.Int64N(int64(d)/2+1))
}

// errStuck is matched by errors that retrying does not mend: retry gives
// up on them at once, and the lane holds its partition as stalled.
var errStuck = errors.New("stuck")

type stuckError struct{ err error }

func (e stuckError) Error() string        { return e.err.Error() }
func (e stuckError) Unwrap() error        { return e.err }
func (e stuckError) Is(target error) bool { return target == errStuck }

func stuck(err error) error { return stuckError{err} }
