package consumer

import (
	"context"
	"strconv"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tenure-dev/tenure/sink"
)

// Handler processes the jobs of one partition, one batch at a time.
//
// Handle writes its effects through tx and returns. The framework then
// advances the partition's next offset in the same transaction, conditioned
// on b.Token, and commits: the effects and the progress land together or not
// at all. tx cannot end the transaction (it has no Commit, Rollback or
// Conn); savepoints (tx.Begin) are fine. A handler that ends it anyway, with
// COMMIT or ROLLBACK in its SQL (or a procedure that commits), is a bug the
// lane detects before the fence: the batch fails with a *HandlerBugError
// and the partition is held, on every worker, until an operator
// acknowledges it (`tenure admin holds acknowledge`).
//
// Handle must honour ctx: it is cancelled when the partition is lost or the
// worker stops hard, and then nothing of the batch will be committed. It
// ends after HandlerTimeout; a Handle that returns after that fails as
// timed out, whatever it returns.
//
// Returning an error rolls the batch back. What happens next depends on
// where the error comes from, not on its Go type:
//
//   - Permanent(err): the job is dead-lettered without more attempts.
//     Permanent wins over everything below.
//   - Transient(err): the handler knows that something outside the job is
//     down (an HTTP destination, a broker). The batch is retried whole,
//     with backoff, for as long as it takes; never dead-lettered.
//   - A SQL error of the handler's own statements is read by its SQLSTATE
//     class. 42 (missing table or column, permission), 28, 25, 3D, 3F, 53,
//     57, 58 and 08 say nothing about the job: the partition stalls with
//     backoff and a loud log until the environment is fixed. 55P03 (lock
//     timeout), 40001 and 40P01 are retried like Transient. 22 and 23 (bad
//     data, a constraint), 57014 (statement timeout), 25P02 (an earlier
//     error of the transaction was ignored: return that one instead) and
//     the rest are the job's.
//   - If the batch's connection broke under the handler (Postgres restarted,
//     the session was killed), the failure is not the job's, whatever error
//     the handler returned: retried like tenure's own database errors.
//   - Anything else (an io.ErrUnexpectedEOF from a truncated payload, a
//     *net.OpError from a dead HTTP host, a panic, a timeout) is the job's:
//     the batch is retried once, then split until the failing job is alone;
//     it gets MaxAttempts attempts and is then dead-lettered in the fenced
//     transaction that moves the partition past it. Before a job is blamed,
//     the lane checks that the database answers.
//
// Handle may therefore run more than once for the same records, but at most
// one run's effects in tx are ever committed. Effects outside tx (an HTTP
// call, an e-mail) are not fenced: pass b.Token and JobID to destinations
// that can check them.
//
// Handlers of different partitions run concurrently; one partition's batches
// run one at a time, in offset order.
type Handler interface {
	Handle(ctx context.Context, tx Tx, b *Batch) error
}

// BatchesHandler is a Handler that can also handle the batches of several
// partitions in one call. With Config.CommitSpan above 1, a transaction
// that carries several batches gives them all to HandleBatches (a handler
// that writes rows can send them in one COPY) instead of calling Handle
// once for each, in a savepoint of its own; each partition's fence then
// checks and moves its own offset in the same transaction, as for Handle.
//
// The batches are of different partitions, each in offset order; what
// HandleBatches does in tx commits with all of them or with none.
// HandleBatches need not say which batch failed: when it returns an error
// (or panics, or runs past HandlerTimeout), what it did is rolled back and
// each batch runs again through Handle alone, so that the failing job is
// retried, split or dead-lettered in its own partition as always. Every
// rule of Handle holds for it too (tx only, never COMMIT or ROLLBACK; a
// handler that ends the transaction halts every partition of the call).
// A Handler that wraps another must implement it too when the wrapped one
// does, or every batch gets a call of its own (metrics.Instrument does).
type BatchesHandler interface {
	Handler
	HandleBatches(ctx context.Context, tx Tx, batches []*Batch) error
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, tx Tx, b *Batch) error

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, tx Tx, b *Batch) error { return f(ctx, tx, b) }

// Batch is a run of consecutive records of one partition.
type Batch struct {
	Group     string
	Topic     string
	Partition int32
	// Token is the fencing token this worker claimed the partition with. Pass
	// it to anything outside Postgres that can reject stale owners.
	Token sink.Token
	// Owner is this worker's group member id.
	Owner string
	// From is the partition's next offset before this batch; To is the next
	// offset after it. To is the last record's offset + 1. The range may hold
	// offsets with no record (compaction, transaction markers).
	From, To int64
	// Records are in offset order. Do not keep them after Handle returns.
	Records []*kgo.Record
}

// JobID is a record's stable identity: "topic/partition/offset". It is the
// same on every attempt and every worker, so a destination can deduplicate
// on it.
func JobID(r *kgo.Record) string {
	return r.Topic + "/" + strconv.FormatInt(int64(r.Partition), 10) + "/" + strconv.FormatInt(r.Offset, 10)
}
