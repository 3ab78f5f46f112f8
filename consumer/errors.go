package consumer

import (
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/tenure-dev/tenure/sink"
)

// Permanent marks a handler error as one that no retry can fix (a job that
// cannot be decoded, a job that breaks a business rule): the job is
// dead-lettered at once instead of after MaxAttempts. Permanent wins over
// every other reading of the error: Permanent(io.ErrUnexpectedEOF) or a
// Permanent SQL error is dead-lettered like any other.
func Permanent(err error) error { return mark[permanentMark](err) }

// IsPermanent reports whether err was marked with Permanent.
func IsPermanent(err error) bool { return isMarked[permanentMark](err) }

// Transient marks a handler error as a failure of something outside the job
// (the destination of an HTTP call is down, a queue is full): the batch is
// retried with backoff for as long as it takes, whole (it is not split), and
// the job is never dead-lettered; nothing counts against MaxAttempts. It is
// logged and counted (Stats.HandlerTransient). Permanent wins over
// Transient if an error is marked both ways.
func Transient(err error) error { return mark[transientMark](err) }

// IsTransient reports whether err was marked with Transient.
func IsTransient(err error) bool { return isMarked[transientMark](err) }

// infraError marks a failure of tenure's own database work around the
// handler (BEGIN, the transaction check, the fence, COMMIT, or the batch's
// connection breaking): it says nothing about the job, so it is retried for
// as long as it takes and never dead-letters anything.
type infraError = marked[infraMark]

// The marks an error can carry: each is a type of its own, so that
// errors.As tells them apart.
type (
	permanentMark struct{}
	transientMark struct{}
	infraMark     struct{}
)

// marked is err marked with M: the same message, and err for errors.Is and
// errors.As; one type for every mark, as each works the same way.
type marked[M any] struct{ err error }

func (e marked[M]) Error() string { return e.err.Error() }
func (e marked[M]) Unwrap() error { return e.err }

// mark marks err with M; nil stays nil.
func mark[M any](err error) error {
	if err == nil {
		return nil
	}
	return marked[M]{err}
}

// isMarked reports whether err, or an error it wraps, carries mark M.
func isMarked[M any](err error) bool {
	var m marked[M]
	return errors.As(err, &m)
}

// failure is how the lane treats a failed attempt.
type failure int

const (
	// failJob: the job's fault. Counted; the batch is retried once, then
	// split; a lone job gets MaxAttempts attempts, then is dead-lettered.
	failJob failure = iota
	// failPermanent: the job's fault, final (Permanent, or a panic).
	failPermanent
	// failTransient: the handler said its destination is down (Transient),
	// or its statement lost a race with another session (lock timeout,
	// deadlock, serialization failure). Retried whole with backoff, forever,
	// never counted against the job.
	failTransient
	// failEnvironment: the handler's SQL was refused for a reason that says
	// nothing about the job (missing table or column, permissions, a
	// read-only or stopping server). The partition stalls with backoff and a
	// loud log until it passes; never counted, never dead-lettered.
	failEnvironment
	// failInfra: tenure's own database work failed, or the batch's
	// connection broke under the handler. Retried with backoff, forever.
	failInfra
)

func (f failure) String() string {
	switch f {
	case failJob:
		return "job"
	case failPermanent:
		return "permanent"
	case failTransient:
		return "transient"
	case failEnvironment:
		return "environment"
	case failInfra:
		return "infrastructure"
	}
	return "unknown"
}

// classifyHandlerError decides whose fault a handler's error is. The source
// decides, not the Go type: an io.ErrUnexpectedEOF from a truncated JSON
// payload or a *net.OpError from an HTTP call is the job's, because the
// handler returned it; only the state of the batch's own connection
// (connBroken) or a SQLSTATE that Postgres gave the handler's own statement
// says otherwise. timedOut means the handler outlived HandlerTimeout: the
// job's, whatever the error (a timeout breaks the connection too).
func classifyHandlerError(err error, connBroken, timedOut bool) failure {
	switch {
	case IsPermanent(err) || errors.Is(err, errPanicked):
		return failPermanent
	case IsTransient(err):
		return failTransient
	case timedOut:
		return failJob
	case connBroken:
		// The handler's statement hit a dead session (Postgres restarted,
		// the session was terminated, the network broke): not the job's.
		return failInfra
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return classifySQLState(pgErr.Code)
	}
	return failJob
}

// classifySQLState reads a SQLSTATE that a handler's own statement got.
// Classes 22 (data exception) and 23 (integrity constraint violation), and
// everything not listed, are the job's.
func classifySQLState(code string) failure {
	switch code {
	case sink.CodeLockNotAvailable, // lock_timeout: waiting for someone else's row lock
		sink.CodeSerializationFailure,
		sink.CodeDeadlockDetected:
		return failTransient
	case sink.CodeQueryCanceled: // statement_timeout, or a cancel request
		return failJob
	case sink.CodeInFailedTransaction: // an earlier error was ignored; its class is unknown
		return failJob
	}
	if len(code) != 5 {
		return failJob
	}
	switch code[:2] {
	case "08", // connection exception
		"25", // invalid transaction state (read-only transaction, ...)
		"28", // invalid authorization specification
		"3D", // invalid catalog name (no such database)
		"3F", // invalid schema name
		"42", // syntax error or access rule violation (missing table or column, permission denied)
		"53", // insufficient resources (disk full, out of memory, too many connections)
		"57", // operator intervention (shutting down, cannot connect now)
		"58": // system error (I/O error)
		return failEnvironment
	}
	return failJob
}

// ErrHandlerEndedTx is matched by the error of a batch whose transaction the
// handler ended itself, with COMMIT or ROLLBACK in its SQL (or a procedure
// that commits). Its effects may then have been committed outside the fence.
// The lane halts the partition (see HandlerBugError).
var ErrHandlerEndedTx = errors.New("the handler ended the batch's transaction itself (COMMIT or ROLLBACK in its SQL)")

// HandlerBugError reports a handler that ended its batch's transaction. It
// names the batch's jobs: which one's statement ended it cannot be known
// without running it again (and committing again). The lane halts the
// partition: it records a hold in Postgres (sink.HoldHandlerBug), logs it
// as an error, counts it (Stats.HandlerBugs) and commits nothing more for
// the partition, on this worker or any other, until an operator has fixed
// the handler and acknowledges the hold (`tenure admin holds acknowledge`,
// or sink.Store.AcknowledgeHold).
type HandlerBugError struct {
	FirstJob, LastJob string // JobIDs of the batch's first and last records
	From, To          int64
	// EndedBy, when set, names the partition whose handler ended a
	// transaction this batch shared with it (Config.CommitSpan): this
	// batch's handler did nothing wrong, but what it wrote was committed
	// with that COMMIT, outside the fence.
	EndedBy string
}

func (e *HandlerBugError) Error() string {
	jobs := "job " + e.FirstJob
	if e.LastJob != e.FirstJob {
		jobs = "jobs " + e.FirstJob + " to " + e.LastJob
	}
	if e.EndedBy != "" {
		return fmt.Sprintf("handler bug in partition %s, whose handler ended the transaction that %s shared with it (%v): what %s wrote was committed outside the fence", e.EndedBy, jobs, ErrHandlerEndedTx, jobs)
	}
	return fmt.Sprintf("handler bug while handling %s: %v; whatever it wrote before that may be committed outside the fence, and the fence did not run", jobs, ErrHandlerEndedTx)
}

// Is makes errors.Is(err, ErrHandlerEndedTx) true.
func (e *HandlerBugError) Is(target error) bool { return target == ErrHandlerEndedTx }

// databaseAway reports whether err says the database could not be reached or
// the session went away (rather than the database answering with an
// error): a refused or failed connection, a broken one, a server shutting
// down or starting, a standby not yet promoted (read-only).
func databaseAway(err error) bool {
	if err == nil {
		return false
	}
	var ce *pgconn.ConnectError
	var ne net.Error
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &ce), errors.As(err, &ne), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return true
	case errors.As(err, &pgErr):
		switch c := pgErr.Code; {
		case len(c) == 5 && c[:2] == "08", // connection exception
			c == sink.CodeAdminShutdown, c == sink.CodeCrashShutdown, c == sink.CodeCannotConnectNow,
			c == sink.CodeReadOnlyTransaction: // a standby, or one being promoted
			return true
		}
	}
	return false
}
