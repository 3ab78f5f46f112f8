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
// that answers with errors keeps the longer backoff.
func TestRetryDelayIsShortWhileTheDatabaseIsAway(t *testing.T) {
	c := &Consumer{cfg: Config{RetryBackoff: 100 * time.Millisecond, RetryBackoffMax: 5 * time.Second}}
	away := []error{
		&pgconn.ConnectError{},
		fmt.Errorf("commit: %w", io.ErrUnexpectedEOF),
		&net.OpError{Op: "read", Err: errors.New("connection reset by peer")},
		&pgconn.PgError{Code: "57P01"}, &pgconn.PgError{Code: "08006"}, &pgconn.PgError{Code: "25006"},
	}
	for _, err := range away {
		if d := c.retryDelay(10, err); d != time.Second {
			t.Errorf("retryDelay(10, %T %v) = %v, want 1s", err, err, d)
		}
	}
	answers := []error{&pgconn.PgError{Code: "42P01"}, &pgconn.PgError{Code: "53100"}, errors.New("handler said no")}
	for _, err := range answers {
		if d := c.retryDelay(10, err); d != 5*time.Second {
			t.Errorf("retryDelay(10, %v) = %v, want the full 5s", err, d)
		}
	}
	if d := c.retryDelay(1, &pgconn.ConnectError{}); d != 100*time.Millisecond {
		t.Errorf("first retry while away = %v, want the initial 100ms", d)
	}
}
