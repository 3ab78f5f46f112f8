package consumer

import (
	"context"
	"errors"
	"io"
	"net"

	"github.com/jackc/pgx/v5/pgconn"
)

// Permanent marks a handler error as one that no retry can fix (a job that
// cannot be decoded, a job that breaks a business rule): the job is
// dead-lettered at once instead of after MaxAttempts.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanentError{err}
}

type permanentError struct{ err error }

func (e permanentError) Error() string { return e.err.Error() }
func (e permanentError) Unwrap() error { return e.err }

// IsPermanent reports whether err was marked with Permanent.
func IsPermanent(err error) bool {
	var p permanentError
	return errors.As(err, &p)
}

// infraError marks a failure of the machinery around the handler (the
// database connection, the commit): it says nothing about the job, so it
// is retried for as long as it takes and never dead-letters anything.
type infraError struct{ err error }

func (e infraError) Error() string { return e.err.Error() }
func (e infraError) Unwrap() error { return e.err }

func isInfra(err error) bool {
	var ie infraError
	return errors.As(err, &ie) || isConnectionError(err)
}

// isConnectionError reports whether err means the database could not be
// reached or the session broke, rather than that a statement was refused.
// A handler that fails because Postgres restarted must not have its jobs
// dead-lettered.
func isConnectionError(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		// A deadline is the handler's timeout (context errors implement
		// net.Error too); process asks the database itself before blaming
		// the job.
		return false
	}
	if pgconn.SafeToRetry(err) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case len(pgErr.Code) == 5 && pgErr.Code[:2] == "08": // connection exception
			return true
		case len(pgErr.Code) == 5 && pgErr.Code[:2] == "53": // insufficient resources
			return true
		}
		switch pgErr.Code {
		case "57P01", "57P02", "57P03", // admin shutdown, crash shutdown, cannot connect now
			"25P03",          // idle-in-transaction timeout ended the session
			"55P03",          // lock_timeout: waiting for someone else's row lock
			"40001", "40P01": // serialization failure, deadlock: transient by definition
			return true
		}
		return false
	}
	var ce *pgconn.ConnectError
	var ne net.Error
	return errors.As(err, &ce) || errors.As(err, &ne) || errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		(pgconn.Timeout(err) && !errors.Is(err, context.DeadlineExceeded))
}
