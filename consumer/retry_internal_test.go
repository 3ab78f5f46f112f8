package consumer

import (
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// A database that cannot be reached is asked again within a second, whatever
// the backoff has grown to (a failover's new primary is used at once); one
// that answers with errors keeps the longer backoff. Each delay is
// jittered by a quarter either way.
func TestRetryDelayIsShortWhileTheDatabaseIsAway(t *testing.T) {
	near := func(d, want time.Duration) bool { return d >= want*3/4 && d < want*5/4 }
	c := &Consumer{cfg: Config{RetryBackoff: 100 * time.Millisecond, RetryBackoffMax: 5 * time.Second}}
	away := []error{
		&pgconn.ConnectError{},
		fmt.Errorf("commit: %w", io.ErrUnexpectedEOF),
		&net.OpError{Op: "read", Err: errors.New("connection reset by peer")},
		&pgconn.PgError{Code: "57P01"}, &pgconn.PgError{Code: "08006"}, &pgconn.PgError{Code: "25006"},
	}
	for _, err := range away {
		if d := c.retryDelay(10, err); !near(d, time.Second) {
			t.Errorf("retryDelay(10, %T %v) = %v, want 1s", err, err, d)
		}
	}
	answers := []error{&pgconn.PgError{Code: "42P01"}, &pgconn.PgError{Code: "53100"}, errors.New("handler said no")}
	for _, err := range answers {
		if d := c.retryDelay(10, err); !near(d, 5*time.Second) {
			t.Errorf("retryDelay(10, %v) = %v, want the full 5s", err, d)
		}
	}
	if d := c.retryDelay(1, &pgconn.ConnectError{}); !near(d, 100*time.Millisecond) {
		t.Errorf("first retry while away = %v, want the initial 100ms", d)
	}
}

// Waits that start together (the lanes of a database that is back, of a
// hand-off) must not stay in step.
func TestJitterSpreads(t *testing.T) {
	seen := map[time.Duration]bool{}
	for range 50 {
		d := jitter(time.Second)
		if d < 750*time.Millisecond || d >= 1250*time.Millisecond {
			t.Fatalf("jitter(1s) = %v, outside [750ms, 1250ms)", d)
		}
		seen[d] = true
	}
	if len(seen) < 10 {
		t.Errorf("50 jittered delays took %d values", len(seen))
	}
}
