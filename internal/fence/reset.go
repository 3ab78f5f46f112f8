package fence

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// ErrNoFencingRow is returned by ResetOffset for a partition that has no
// fencing row: no worker ever claimed it, so no offset is stored to move.
var ErrNoFencingRow = errors.New("no fencing row")

// ResetOutOfLogError says that a reset's target is outside the log: the
// new next offset must be at or above the log's start and at or below its
// end (the offset the next job will get), or the workers would hold the
// partition (log-truncated, ahead-of-log) at their next claim.
type ResetOutOfLogError struct {
	Partition        Partition
	From, To         int64 // the stored next offset, and the target refused
	LogStart, LogEnd int64
	Shift            bool
	ShiftBy          int64
}

func (e *ResetOutOfLogError) Error() string {
	what := fmt.Sprintf("offset %d", e.To)
	if e.Shift {
		what = fmt.Sprintf("offset %d (%d %+d)", e.To, e.From, e.ShiftBy)
	}
	return fmt.Sprintf("%s is outside the log of %s, which holds offsets %d to %d (a next offset may be from its start %d to its end %d)",
		what, e.Partition, e.LogStart, e.LogEnd-1, e.LogStart, e.LogEnd)
}

// ResetOtherLogError says that the stored offsets belong to another log
// than the one the caller read: the topic was deleted and re-created since
// (the workers hold it as topic-recreated, and acknowledging that hold is
// how its offsets move to the new log).
type ResetOtherLogError struct {
	Partition       Partition
	Stored, Current [16]byte
}

func (e *ResetOtherLogError) Error() string {
	return fmt.Sprintf("the offsets of %s belong to topic id %x, but the topic is now %x (deleted and re-created): acknowledge its topic-recreated hold (tenure admin holds acknowledge) instead of resetting it",
		e.Partition, e.Stored, e.Current)
}

// ResetRequest moves a partition's stored next offset for an operator.
type ResetRequest struct {
	Partition Partition
	// To is the new next offset; with Shift, the offset moves by To from
	// wherever it is when the reset runs (a negative To moves it back).
	To    int64
	Shift bool
	// LogStart and LogEnd are the partition's log as the caller read it
	// (its start offset and its high watermark): the new next offset must
	// be within [LogStart, LogEnd].
	LogStart, LogEnd int64
	// TopicID is the topic's id as the caller read it (zero: unknown). A
	// fencing row that records another one belongs to an earlier log of
	// the same name, and is refused (ResetOtherLogError).
	TopicID [16]byte
	// By is the operator, recorded as the fence log entry's owner.
	By string
}

// Reset is what ResetOffset did.
type Reset struct {
	Partition Partition
	// From is the stored next offset the reset found, To the one it left.
	// Jobs [From, To) are skipped when To > From; jobs [To, From) run again
	// when To < From.
	From, To int64
	// LogEpoch is the partition's log epoch after the reset (one more than
	// before when the offset moved).
	LogEpoch int64
	// EntryID is the reset's fence log entry; 0 when nothing moved (the
	// offset was already To: nothing was changed or recorded).
	EntryID int64
	At      time.Time
	// The claim that held the fencing row at the reset (recorded with the
	// entry): its lane's batches in flight are rejected.
	Token   Token
	Holder  string
	ClaimID int64
}

// Moved reports whether the reset moved the offset (and was recorded).
func (r Reset) Moved() bool { return r.EntryID != 0 }

// resetLockTimeout bounds the wait for the fencing row's lock: a batch
// committing holds it for a moment, a worker frozen between its fence
// statement and its COMMIT for as long as it is frozen.
const resetLockTimeout = 5 * time.Second

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
	p := req.Partition
	if req.By == "" {
		return Reset{}, errors.New("sink: a reset needs an operator (By)")
	}
	if req.LogStart < 0 || req.LogEnd < req.LogStart {
		return Reset{}, fmt.Errorf("sink: reset of %s: log [%d, %d] is not a log", p, req.LogStart, req.LogEnd)
	}
	q := quote(s.schema)
	r := Reset{Partition: p}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, fmt.Sprintf(`SET LOCAL lock_timeout = %d`, resetLockTimeout.Milliseconds())); err != nil {
			return err
		}
		var f Fence
		var topicID pgtype.UUID
		err := tx.QueryRow(ctx, `SELECT incarnation, epoch, owner, next_offset, claim_id, log_epoch, topic_id FROM `+q+`.fences
			WHERE consumer_group = $1 AND topic = $2 AND partition = $3 FOR UPDATE`, p.Group, p.Topic, p.Partition).
			Scan(&f.Token.Incarnation, &f.Token.Epoch, &f.Owner, &f.NextOffset, &f.ClaimID, &f.LogEpoch, &topicID)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("reset of %s: %w", p, ErrNoFencingRow)
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == CodeLockNotAvailable {
			return fmt.Errorf("reset of %s: its fencing row stayed locked for %s (a batch committing, or a worker frozen between its fence statement and its COMMIT): try again", p, resetLockTimeout)
		}
		if err != nil {
			return fmt.Errorf("reading the fencing row of %s: %w", p, err)
		}
		if topicID.Valid && req.TopicID != [16]byte{} && topicID.Bytes != req.TopicID {
			return &ResetOtherLogError{Partition: p, Stored: topicID.Bytes, Current: req.TopicID}
		}
		to := req.To
		if req.Shift {
			to = f.NextOffset + req.To
		}
		r.From, r.To, r.LogEpoch = f.NextOffset, to, f.LogEpoch
		r.Token, r.Holder, r.ClaimID = f.Token, f.Owner, f.ClaimID
		if to < req.LogStart || to > req.LogEnd {
			return &ResetOutOfLogError{Partition: p, From: f.NextOffset, To: to, LogStart: req.LogStart, LogEnd: req.LogEnd, Shift: req.Shift, ShiftBy: req.To}
		}
		if to == f.NextOffset {
			return nil // nothing to move: no new log epoch, no entry
		}
		if err := tx.QueryRow(ctx, `UPDATE `+q+`.fences SET next_offset = $4, log_epoch = log_epoch + 1
			WHERE consumer_group = $1 AND topic = $2 AND partition = $3 RETURNING log_epoch`,
			p.Group, p.Topic, p.Partition, to).Scan(&r.LogEpoch); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `INSERT INTO `+q+`.fence_log
			(kind, consumer_group, topic, partition, incarnation, epoch, owner, from_offset, to_offset, claim_id)
			VALUES ('reset', $1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING id, at`,
			p.Group, p.Topic, p.Partition, f.Token.Incarnation, f.Token.Epoch, validText(req.By), f.NextOffset, to, f.ClaimID).
			Scan(&r.EntryID, &r.At)
	})
	if err != nil {
		return Reset{}, err
	}
	return r, nil
}

// FenceLogEntry is one entry of the fence log: an accepted claim or
// commit, or an operator's reset.
type FenceLogEntry struct {
	ID        int64
	Kind      string // "claim", "commit" or "reset"
	Partition Partition
	Token     Token
	// Owner is the claimant (claims and commits) or the operator (resets).
	Owner   string
	ClaimID int64
	// From and To: a commit's range [From, To); a claim's offset (both);
	// a reset's move, from From to To.
	From, To int64
	At       time.Time
	// GID is the prepared transaction's id of a strict mode commit ("" for
	// every other entry).
	GID string
}

// JobLog is what p's fence log says about the job at one offset.
type JobLog struct {
	// Commits are the commits whose range covers the offset, oldest first:
	// more than one when a reset moved the offsets back over it.
	Commits []FenceLogEntry
	// Resets are the operators' resets whose move passed over the offset
	// (skipping it when moving forward, repeating it when moving back),
	// oldest first.
	Resets []FenceLogEntry
	// FirstClaim is the oldest claim kept in the log (nil: none); when the
	// log was never pruned, the claim that started the partition.
	FirstClaim *FenceLogEntry
	// Cut is where the log was pruned (nil: it never was): entries up to
	// Cut.ThroughID are gone, except its kept claim.
	Cut *FenceLogCut
}

// FenceLogAt reads what p's fence log says about the job at offset: the
// commits that covered it, the resets that passed over it, the oldest claim
// kept, and the cut if the log was pruned (`tenure admin job`).
func (s *Store) FenceLogAt(ctx context.Context, p Partition, offset int64) (JobLog, error) {
	q := quote(s.schema)
	var out JobLog
	rows, err := s.pool.Query(ctx, `SELECT id, kind, incarnation, epoch, owner, claim_id, from_offset, to_offset, at FROM `+q+`.fence_log
		WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND (
			(kind = 'commit' AND from_offset <= $4 AND $4 < to_offset)
			OR (kind = 'reset' AND least(from_offset, to_offset) <= $4 AND $4 < greatest(from_offset, to_offset))
			OR id = (SELECT min(id) FROM `+q+`.fence_log WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND kind = 'claim'))
		ORDER BY id`, p.Group, p.Topic, p.Partition, offset)
	if err != nil {
		return out, err
	}
	var e FenceLogEntry
	e.Partition = p
	if _, err := pgx.ForEachRow(rows, []any{&e.ID, &e.Kind, &e.Token.Incarnation, &e.Token.Epoch, &e.Owner, &e.ClaimID, &e.From, &e.To, &e.At}, func() error {
		switch e.Kind {
		case "commit":
			out.Commits = append(out.Commits, e)
		case "reset":
			out.Resets = append(out.Resets, e)
		case "claim":
			c := e
			out.FirstClaim = &c
		}
		return nil
	}); err != nil {
		return out, err
	}
	var c FenceLogCut
	err = s.pool.QueryRow(ctx, `SELECT through_id, coalesce(kept_claim_id, 0), next_offset, max_incarnation, max_epoch, pruned, pruned_at
		FROM `+q+`.fence_log_pruned WHERE consumer_group = $1 AND topic = $2 AND partition = $3`, p.Group, p.Topic, p.Partition).
		Scan(&c.ThroughID, &c.KeptClaimID, &c.NextOffset, &c.MaxToken.Incarnation, &c.MaxToken.Epoch, &c.Pruned, &c.PrunedAt)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return out, err
	default:
		c.Partition = p
		out.Cut = &c
	}
	return out, nil
}

// DeadLetterAt returns the newest dead letter of the job at offset of p (a
// job repeated by an operator's reset may have one per log epoch);
// ErrNoDeadLetter if there is none.
func (s *Store) DeadLetterAt(ctx context.Context, p Partition, offset int64) (DeadLetter, error) {
	d, err := scanDeadLetter(s.pool.QueryRow(ctx, `SELECT `+deadLetterCols+` FROM `+quote(s.schema)+`.dead_letters
		WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND job_offset = $4 ORDER BY id DESC LIMIT 1`, p.Group, p.Topic, p.Partition, offset))
	if errors.Is(err, pgx.ErrNoRows) {
		return d, fmt.Errorf("job %s/%d/%d of group %q: %w", p.Topic, p.Partition, offset, p.Group, ErrNoDeadLetter)
	}
	return d, err
}

// DeadLettersIn counts p's dead-lettered jobs at offsets in [from, to).
func (s *Store) DeadLettersIn(ctx context.Context, p Partition, from, to int64) (int64, error) {
	var n int64
	err := s.pool.QueryRow(ctx, `SELECT count(DISTINCT job_offset) FROM `+quote(s.schema)+`.dead_letters
		WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND job_offset >= $4 AND job_offset < $5`,
		p.Group, p.Topic, p.Partition, from, to).Scan(&n)
	return n, err
}
