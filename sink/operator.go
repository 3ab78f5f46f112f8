package sink

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenure-dev/tenure/internal/fence"
)

// Store reads and acts on the fencing state in one schema: the operator's
// API, and the Claim and Commit a program can fence its own work with.
// Package consumer runs the worker's protocol on the same store through
// internal/fence, which this type does not expose (see the package doc).
type Store struct {
	f *fence.Store
}

func init() {
	// Package consumer finds the protocol behind the *Store its Config
	// names with fence.Of; nothing outside this module can.
	fence.SetAccessor(func(v any) *fence.Store {
		if s, ok := v.(*Store); ok && s != nil {
			return s.f
		}
		return nil
	})
}

// NewStore returns a Store for schema ("" means DefaultSchema). It does not
// touch the database; see Migrate and CheckSchema.
func NewStore(pool *pgxpool.Pool, schema string) (*Store, error) {
	f, err := fence.NewStore(pool, schema)
	if err != nil {
		return nil, err
	}
	return &Store{f: f}, nil
}

// SetPooled declares that the pool leads through a transaction pooler
// (PgBouncer's pool_mode=transaction, docs/pgbouncer.md): the process id a
// connection announced is then the pooler's, not the server backend's that
// runs its transactions, and a session setting would stay behind on a
// server connection other clients get next. The store then asks the server
// for its backend's pid inside each transaction (the lock watch ends
// server backends by it, and the unknown-commit path waits on it), and
// runs a claim in a transaction of its own with SET LOCAL lock_timeout.
// Call it before the store is used.
func (s *Store) SetPooled(pooled bool) { s.f.SetPooled(pooled) }

// Pooled reports SetPooled.
func (s *Store) Pooled() bool { return s.f.Pooled() }

// SetPreparedRole names the role strict batches are prepared and finished
// as (the schema's worker role that every worker's login role is a member
// of); "" prepares and finishes them as the login role. Without it the
// store finds the role when the database first answers: the role with a
// direct UPDATE grant on the fences table that has the login role as a
// member (`tenure migrate --print-roles` makes it). Call it before the
// store is used.
func (s *Store) SetPreparedRole(role string) {
	s.f.SetPreparedRole(role)
}

// Schema is the schema the store works in.
func (s *Store) Schema() string { return s.f.Schema() }

// Pool is the pool the store was built with.
func (s *Store) Pool() *pgxpool.Pool { return s.f.Pool() }

// Claim takes ownership of a partition for req.Token and req.Owner and returns
// the offset to resume from. A claim with a token lower than the stored one,
// or equal to it but by another claimant, or with an incarnation that is not
// the group's current one, is rejected with an error matching ErrFenced. An
// accepted claim fences every earlier token at once, even before the new
// owner commits anything.
//
// The incarnation must be the group's current one (Incarnation). A
// worker's package consumer registers each epoch before the group
// coordinator confirms it: that order is what keeps tokens ordered across
// group lifetimes (docs/fencing.md).
func (s *Store) Claim(ctx context.Context, req ClaimRequest) (Claimed, error) {
	return s.f.Claim(ctx, req)
}

// Commit advances the partition's next offset from req.From to req.To inside
// tx, only if req.Token and req.Owner still hold the partition and the stored
// next offset is req.From. Call it last in the handler's transaction, just
// before tx.Commit, so that the fencing row is locked for as short a time as
// possible. On rejection it returns an error matching ErrFenced and the caller
// must roll tx back; nothing of the batch may be committed.
func (s *Store) Commit(ctx context.Context, tx pgx.Tx, req CommitRequest) error {
	return s.f.Commit(ctx, tx, req)
}

// Get reads one fencing row; pgx.ErrNoRows if there is none.
func (s *Store) Get(ctx context.Context, p Partition) (Fence, error) {
	return s.f.Get(ctx, p)
}

// List reads the fencing rows of group, or of every group when group is "".
func (s *Store) List(ctx context.Context, group string) ([]Fence, error) {
	return s.f.List(ctx, group)
}

// OpenHold returns p's open hold (the oldest that waits for an operator,
// else a stall); pgx.ErrNoRows if there is none.
func (s *Store) OpenHold(ctx context.Context, p Partition) (Hold, error) {
	return s.f.OpenHold(ctx, p)
}

// OpenHolds lists the open holds of group ("" for every group).
func (s *Store) OpenHolds(ctx context.Context, group string) ([]Hold, error) {
	return s.f.OpenHolds(ctx, group)
}

// AcknowledgeHold resolves p's oldest open hold that waits for an operator
// (by), in one transaction with what the acknowledgement means for the
// stored offsets:
//
//   - topic-recreated: the offsets restart in the new log at its start
//     (logStart), and the new topic id is recorded;
//   - log-truncated: the next offset moves up to the log's start (the jobs
//     in between are gone);
//   - ahead-of-log: the next offset moves down to the log's end as the
//     worker found it (or as the caller reads it, if lower), so that the
//     jobs appended from there are processed, even when the log has grown
//     past the stored offset again by the time an operator acknowledges;
//   - handler-bug: nothing moves; the batch runs again (whatever the
//     handler committed on its own for it stays);
//   - diverged: the database's offsets are accepted as they are.
//
// logStart and highWatermark are the log as the caller reads it now (not as
// the worker saw it). A moved offset is recorded in the fence log as a
// 'reset' entry. Every acknowledgement but a handler bug's starts a new log
// epoch of the partition (Fence.LogEpoch): offsets from before it are not
// compared with offsets after it (the mirror in Kafka, export pointers), and
// a batch begun before it cannot commit after it. The worker holding the
// partition notices within seconds, claims again and resumes from the new
// offset. It returns the hold as resolved, its Resolution saying what was
// done. A partition with several open holds needs one acknowledgement each.
func (s *Store) AcknowledgeHold(ctx context.Context, p Partition, by string, logStart, highWatermark int64, topicID [16]byte) (Hold, error) {
	return s.f.AcknowledgeHold(ctx, p, by, logStart, highWatermark, topicID)
}

// AcknowledgePartitions accepts count as the topic's partition count for the
// group. It returns the count recorded before.
func (s *Store) AcknowledgePartitions(ctx context.Context, group, topic string, count int32, by string) (int32, error) {
	return s.f.AcknowledgePartitions(ctx, group, topic, count, by)
}

// Layouts returns the partition counts recorded for group's topics, or for
// every group's when group is "", ordered by group and topic. A topic the
// group never consumed has no layout.
func (s *Store) Layouts(ctx context.Context, group string) ([]Layout, error) {
	return s.f.Layouts(ctx, group)
}

// ResetOffset moves p's stored next offset through the fence, for an
// operator (`tenure admin offsets reset`), in one transaction: it locks the
// fencing row, moves next_offset, starts a new log epoch and appends a
// 'reset' entry to the fence log, recorded by req.By with the token and
// claim id of the claim holding the row.
//
// Workers need not be stopped. Commits carry the log epoch of their claim,
// so every batch begun before the reset is rejected, even one whose range
// starts at the new offset; the lane that held the partition claims it
// again (same claim), reads the new offset and fetches from there. The
// history checker (internal/history) re-bases the partition at the entry.
//
// It refuses a partition with no fencing row (ErrNoFencingRow), a target
// outside [req.LogStart, req.LogEnd] (*ResetOutOfLogError), and a row whose
// offsets belong to another log of the same topic name
// (*ResetOtherLogError); nothing is changed then. A target equal to the
// stored offset changes nothing and records nothing (Reset.Moved is false).
func (s *Store) ResetOffset(ctx context.Context, req ResetRequest) (Reset, error) {
	return s.f.ResetOffset(ctx, req)
}

// TopicIDs returns the distinct topic ids that group's fencing rows of topic
// recorded (the ids their first claims saw; rows that never saw one are left
// out). More than one, or one that is not the topic's id in Kafka, means
// the stored offsets belong to a topic of that name that was deleted and
// re-created.
func (s *Store) TopicIDs(ctx context.Context, group, topic string) ([][16]byte, error) {
	return s.f.TopicIDs(ctx, group, topic)
}

// FenceLogAt reads what p's fence log says about the job at offset: the
// commits that covered it, the resets that passed over it, the oldest claim
// kept, and the cut if the log was pruned (`tenure admin job`).
func (s *Store) FenceLogAt(ctx context.Context, p Partition, offset int64) (JobLog, error) {
	return s.f.FenceLogAt(ctx, p, offset)
}

// FenceLog returns every entry of group's fence log that pruning kept,
// oldest first. It reads the whole log: a check over a group's history
// (tests, the demo) uses it, not a worker.
func (s *Store) FenceLog(ctx context.Context, group string) ([]FenceLogEntry, error) {
	return s.f.FenceLog(ctx, group)
}

// Claims returns the claims (and resets) of the group among the schema's
// newest fence log entries, newest first, each with the entry before it:
// who held the partition, and with which token, until the claim.
func (s *Store) Claims(ctx context.Context, cq ClaimQuery) ([]ClaimEntry, error) {
	return s.f.Claims(ctx, cq)
}

// Groups returns the consumer groups that have fencing rows, sorted.
func (s *Store) Groups(ctx context.Context) ([]string, error) {
	return s.f.Groups(ctx)
}

// KnownGroups returns every consumer group the schema has rows of, sorted:
// fencing rows, recorded partition counts, holds, incarnations, or worker
// heartbeats (a worker beats before it claims anything). A name not among
// them is one the schema has never seen.
func (s *Store) KnownGroups(ctx context.Context) ([]string, error) {
	return s.f.KnownGroups(ctx)
}

// KnownTopics returns the topics the schema has rows of, sorted: those of
// group, or of every group when group is "".
func (s *Store) KnownTopics(ctx context.Context, group string) ([]string, error) {
	return s.f.KnownTopics(ctx, group)
}

// PruneFenceLogs prunes the fence log of every partition of group (every
// group when group is "") that has a fencing row. It returns the number of
// entries removed and of partitions pruned.
func (s *Store) PruneFenceLogs(ctx context.Context, group string, r FenceLogRetention) (removed int64, partitions int, err error) {
	return s.f.PruneFenceLogs(ctx, group, r)
}

// DeadLetters lists dead letters, oldest first (or newest first, with
// f.NewestFirst); at most f.Limit, 1000 when it is not positive.
func (s *Store) DeadLetters(ctx context.Context, f DeadLetterFilter) ([]DeadLetter, error) {
	return s.f.DeadLetters(ctx, f)
}

// DeadLetterByID reads one dead letter.
func (s *Store) DeadLetterByID(ctx context.Context, id int64) (DeadLetter, error) {
	return s.f.DeadLetterByID(ctx, id)
}

// DeadLetterAt returns the newest dead letter of the job at offset of p (a
// job repeated by an operator's reset may have one per log epoch);
// ErrNoDeadLetter if there is none.
func (s *Store) DeadLetterAt(ctx context.Context, p Partition, offset int64) (DeadLetter, error) {
	return s.f.DeadLetterAt(ctx, p, offset)
}

// DeadLettersIn counts p's dead-lettered jobs at offsets in [from, to).
func (s *Store) DeadLettersIn(ctx context.Context, p Partition, from, to int64) (int64, error) {
	return s.f.DeadLettersIn(ctx, p, from, to)
}

// DeadLetterCounts counts group's dead letters: those still dead (neither
// replayed nor discarded), and all.
func (s *Store) DeadLetterCounts(ctx context.Context, group string) (dead, total int64, err error) {
	return s.f.DeadLetterCounts(ctx, group)
}

// DeadLetterActions returns what was done to dead letter id, oldest first
// (none for an id that names no dead letter).
func (s *Store) DeadLetterActions(ctx context.Context, id int64) ([]DeadLetterAction, error) {
	return s.f.DeadLetterActions(ctx, id)
}

// Replay re-produces dead letter id with produce and records the replay. It
// holds the dead letter's row lock while producing, so two operators cannot
// replay the same job at once; a job already replayed or discarded is
// refused. If produce fails nothing is recorded and the job stays dead.
func (s *Store) Replay(ctx context.Context, id int64, actor string, produce ReplayFunc) (DeadLetter, error) {
	return s.f.Replay(ctx, id, actor, produce)
}

// Discard marks dead letter id as discarded and records who did it.
func (s *Store) Discard(ctx context.Context, id int64, actor string) error {
	return s.f.Discard(ctx, id, actor)
}

// Incarnation returns the group's current incarnation (0 if it never had a
// reset).
func (s *Store) Incarnation(ctx context.Context, group string) (int64, error) {
	return s.f.Incarnation(ctx, group)
}

// Workers reads the heartbeat rows of group, ordered by member id, and the
// database's clock at the read: a member's silence is now - SeenAt, both
// on the database's clock. The fencing rows' times (Fence.ClaimedAt,
// CommittedAt) and the holds' (Hold.Since) are on the same clock.
func (s *Store) Workers(ctx context.Context, group string) (ws []Worker, now time.Time, err error) {
	return s.f.Workers(ctx, group)
}

// Now is the database server's clock: the time the operator's views measure
// ages against (a hold's, a heartbeat's), so that they do not depend on the
// clock of the machine that reads them.
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	return s.f.Now(ctx)
}
