package fence

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// HoldKind says why a partition is not being processed.
type HoldKind string

const (
	// HoldStalled: the worker that holds the partition could not claim or
	// commit it and is recovering on its own (re-checking with the group
	// coordinator and claiming again). It clears itself.
	HoldStalled HoldKind = "stalled"
	// HoldHandlerBug: the handler ended the batch's transaction itself
	// (COMMIT or ROLLBACK in its SQL), so what it wrote may have been
	// committed outside the fence; running it again would do the same.
	HoldHandlerBug HoldKind = "handler-bug"
	// HoldTopicRecreated: the topic was deleted and re-created under the same
	// name; the stored offsets belong to the old log.
	HoldTopicRecreated HoldKind = "topic-recreated"
	// HoldLogTruncated: the log starts above the stored next offset: jobs
	// were deleted (retention, DeleteRecords) before they were processed.
	HoldLogTruncated HoldKind = "log-truncated"
	// HoldAheadOfLog: the stored next offset is above the log's end: the log
	// lost records the workers had processed, and new jobs would land at
	// offsets the stored offset says are done.
	HoldAheadOfLog HoldKind = "ahead-of-log"
	// HoldDiverged: the stored next offset is below an offset workers had
	// already acknowledged (AckedOffset, mirrored to Kafka's committed
	// offsets): the database lost commits it had acknowledged (a failover to
	// a standby that was behind, a restore). Going on would redo those jobs
	// without a word.
	HoldDiverged HoldKind = "diverged"
)

// NeedsAck reports whether a hold of kind k waits for an operator.
func (k HoldKind) NeedsAck() bool { return k != HoldStalled }

// Hold is a partition a worker does not process, and why.
type Hold struct {
	ID        int64
	Partition Partition
	Kind      HoldKind
	Reason    string
	// The offsets at stake as the worker saw them; -1 when unknown.
	NextOffset, LogStart, HighWatermark int64
	TopicID                             [16]byte // the log's topic id now (zero: unknown)
	// handler-bug: the batch the handler was running ([From, To), its
	// first and last jobs, "topic/partition/offset") and its token.
	From, To          int64
	FirstJob, LastJob string
	Token             Token
	// diverged: the highest next offset acknowledged before (-1: unknown).
	AckedOffset int64
	// LogEpoch is the partition's log epoch when the hold was recorded.
	LogEpoch               int64
	Owner                  string
	Since                  time.Time
	ResolvedAt             *time.Time
	ResolvedBy, Resolution string
}

// HoldPartition records that p is held. A hold that waits for an operator
// replaces an open hold of its own kind (the same finding, recorded again
// by whichever worker holds the partition now) and any stall, but never a
// hold of another kind: each one waits for its own acknowledgement, so
// that nothing an operator must see disappears unresolved. A stall replaces
// only a stall, and is not recorded while any hold is open.
//
// Worker protocol: package consumer calls it; not API (see the package doc).
func (s *Store) HoldPartition(ctx context.Context, h Hold) error {
	q := quote(s.schema)
	p := h.Partition
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if h.Kind.NeedsAck() {
			if _, err := tx.Exec(ctx, `DELETE FROM `+q+`.partition_holds
				WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND resolved_at IS NULL AND kind IN ('stalled', $4)`,
				p.Group, p.Topic, p.Partition, string(h.Kind)); err != nil {
				return err
			}
		} else {
			tag, err := tx.Exec(ctx, `DELETE FROM `+q+`.partition_holds
				WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND resolved_at IS NULL AND kind = 'stalled'`,
				p.Group, p.Topic, p.Partition)
			if err != nil {
				return err
			}
			if tag.RowsAffected() == 0 {
				var open bool
				if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+q+`.partition_holds
					WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND resolved_at IS NULL)`, p.Group, p.Topic, p.Partition).Scan(&open); err != nil {
					return err
				}
				if open {
					return nil
				}
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+q+`.partition_holds
			(consumer_group, topic, partition, kind, reason, needs_ack, next_offset, log_start, high_watermark, topic_id,
			 from_offset, to_offset, first_job, last_job, incarnation, epoch, owner, acked_offset, log_epoch)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18,
				(SELECT log_epoch FROM `+q+`.fences WHERE consumer_group = $1 AND topic = $2 AND partition = $3))`,
			p.Group, p.Topic, p.Partition, string(h.Kind), validText(h.Reason), h.Kind.NeedsAck(),
			nullOffset(h.NextOffset), nullOffset(h.LogStart), nullOffset(h.HighWatermark), uuidOf(h.TopicID),
			nullOffset(h.From), nullOffset(h.To), nullText(h.FirstJob), nullText(h.LastJob),
			h.Token.Incarnation, h.Token.Epoch, h.Owner, nullOffset(h.AckedOffset))
		return err
	})
}

// ClearStall removes p's open stalled hold, if any: the worker recovered.
// Holds that need an operator are left alone.
//
// Worker protocol: package consumer calls it; not API (see the package doc).
func (s *Store) ClearStall(ctx context.Context, p Partition) error {
	_, err := s.pool.Exec(ctx, `DELETE FROM `+quote(s.schema)+`.partition_holds
		WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND resolved_at IS NULL AND kind = 'stalled'`,
		p.Group, p.Topic, p.Partition)
	return err
}

// OpenHold returns p's open hold (the oldest that waits for an operator,
// else a stall); pgx.ErrNoRows if there is none.
func (s *Store) OpenHold(ctx context.Context, p Partition) (Hold, error) {
	return scanHold(s.pool.QueryRow(ctx, holdSelect(s.schema)+` WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND resolved_at IS NULL
		ORDER BY needs_ack DESC, id LIMIT 1`, p.Group, p.Topic, p.Partition))
}

// OpenHolds lists the open holds of group ("" for every group).
func (s *Store) OpenHolds(ctx context.Context, group string) ([]Hold, error) {
	rows, err := s.pool.Query(ctx, holdSelect(s.schema)+` WHERE ($1 = '' OR consumer_group = $1) AND resolved_at IS NULL
		ORDER BY consumer_group, topic, partition, id`, group)
	return collect(rows, err, scanHold)
}

// OpenHoldNeedingAck returns p's oldest open hold that waits for an
// operator; ok is false if there is none (or only a stall).
//
// Worker protocol: package consumer calls it; not API (see the package doc).
func (s *Store) OpenHoldNeedingAck(ctx context.Context, p Partition) (h Hold, ok bool, err error) {
	h, err = s.OpenHold(ctx, p)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Hold{}, false, nil
	case err != nil:
		return Hold{}, false, err
	}
	return h, h.Kind.NeedsAck(), nil
}

// ErrNoHold is returned by AcknowledgeHold for a partition with no open hold
// that waits for an operator.
var ErrNoHold = errors.New("no open hold that waits for an acknowledgement")

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
	q := quote(s.schema)
	var h Hold
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		h, err = scanHold(tx.QueryRow(ctx, holdSelect(s.schema)+` WHERE consumer_group = $1 AND topic = $2 AND partition = $3
			AND resolved_at IS NULL AND needs_ack ORDER BY id LIMIT 1 FOR UPDATE`, p.Group, p.Topic, p.Partition))
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrNoHold
		}
		if err != nil {
			return err
		}
		var f Fence
		f, err = scanFence(tx.QueryRow(ctx, `SELECT consumer_group, topic, partition, incarnation, epoch, owner, next_offset,
			partition_count, created_at, claimed_at, committed_at, claim_id, log_epoch FROM `+q+`.fences
			WHERE consumer_group = $1 AND topic = $2 AND partition = $3 FOR UPDATE`, p.Group, p.Topic, p.Partition))
		if err != nil {
			return fmt.Errorf("reading the fencing row: %w", err)
		}
		to := f.NextOffset
		switch h.Kind {
		case HoldTopicRecreated:
			to = max(logStart, 0)
		case HoldLogTruncated:
			to = max(f.NextOffset, logStart)
		case HoldAheadOfLog:
			// Down to the log's end as the worker found it, or lower if
			// the log is shorter now. Not up to the end as read now: jobs
			// appended after the loss sit at offsets below the stored one,
			// and an operator who acknowledges after the log has grown
			// past it must not skip them.
			to = min(f.NextOffset, highWatermark)
			if h.HighWatermark >= 0 {
				to = min(to, h.HighWatermark)
			}
		}
		h.Resolution = fmt.Sprintf("next offset %d kept", f.NextOffset)
		switch h.Kind {
		case HoldHandlerBug:
			h.Resolution = fmt.Sprintf("resumed: processing goes on at offset %d", f.NextOffset)
		case HoldDiverged:
			h.Resolution = fmt.Sprintf("the database's next offset %d accepted", f.NextOffset)
			if h.AckedOffset > f.NextOffset {
				h.Resolution += fmt.Sprintf(": jobs %d to %d, acknowledged before, are processed again", f.NextOffset, h.AckedOffset-1)
			}
		}
		if h.Kind != HoldHandlerBug {
			if _, err := tx.Exec(ctx, `UPDATE `+q+`.fences SET log_epoch = log_epoch + 1
				WHERE consumer_group = $1 AND topic = $2 AND partition = $3`, p.Group, p.Topic, p.Partition); err != nil {
				return err
			}
		}
		if to != f.NextOffset || h.Kind == HoldTopicRecreated {
			if _, err := tx.Exec(ctx, `UPDATE `+q+`.fences SET next_offset = $4, topic_id = coalesce($5, topic_id)
				WHERE consumer_group = $1 AND topic = $2 AND partition = $3`, p.Group, p.Topic, p.Partition, to, uuidOf(topicID)); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO `+q+`.fence_log
				(kind, consumer_group, topic, partition, incarnation, epoch, owner, from_offset, to_offset, claim_id)
				VALUES ('reset', $1, $2, $3, $4, $5, $6, $7, $8, $9)`,
				p.Group, p.Topic, p.Partition, f.Token.Incarnation, f.Token.Epoch, by, f.NextOffset, to, f.ClaimID); err != nil {
				return err
			}
			h.Resolution = fmt.Sprintf("next offset moved from %d to %d", f.NextOffset, to)
			if h.Kind == HoldTopicRecreated {
				h.Resolution += " in the new log"
			}
		}
		now := time.Now()
		h.ResolvedAt, h.ResolvedBy = &now, by
		_, err = tx.Exec(ctx, `UPDATE `+q+`.partition_holds SET resolved_at = now(), resolved_by = $2, resolution = $3 WHERE id = $1`,
			h.ID, by, h.Resolution)
		return err
	})
	return h, err
}

func holdSelect(schema string) string {
	return `SELECT id, consumer_group, topic, partition, kind, reason, next_offset, log_start, high_watermark, topic_id,
	from_offset, to_offset, coalesce(first_job, ''), coalesce(last_job, ''), coalesce(incarnation, 0), coalesce(epoch, 0),
	acked_offset, owner, since, resolved_at, coalesce(resolved_by, ''), coalesce(resolution, ''), coalesce(log_epoch, 0) FROM ` + quote(schema) + `.partition_holds`
}

func scanHold(r pgx.Row) (Hold, error) {
	var h Hold
	var kind string
	var next, start, hwm, from, to, acked pgtype.Int8
	var id pgtype.UUID
	err := r.Scan(&h.ID, &h.Partition.Group, &h.Partition.Topic, &h.Partition.Partition, &kind, &h.Reason, &next, &start, &hwm, &id,
		&from, &to, &h.FirstJob, &h.LastJob, &h.Token.Incarnation, &h.Token.Epoch,
		&acked, &h.Owner, &h.Since, &h.ResolvedAt, &h.ResolvedBy, &h.Resolution, &h.LogEpoch)
	h.AckedOffset = offsetOf(acked)
	h.Kind = HoldKind(kind)
	h.NextOffset, h.LogStart, h.HighWatermark = offsetOf(next), offsetOf(start), offsetOf(hwm)
	h.From, h.To = offsetOf(from), offsetOf(to)
	if id.Valid {
		h.TopicID = id.Bytes
	}
	return h, err
}

func nullOffset(o int64) pgtype.Int8 { return pgtype.Int8{Int64: o, Valid: o >= 0} }

func nullText(s string) pgtype.Text { return pgtype.Text{String: validText(s), Valid: s != ""} }

// validText makes s storable in a text column: valid UTF-8 without NUL
// bytes (Postgres refuses both). For messages, not for a job's bytes.
func validText(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", `\x00`)
}

func offsetOf(v pgtype.Int8) int64 {
	if !v.Valid {
		return -1
	}
	return v.Int64
}

// uuidOf is a topic id as a query argument: NULL for the zero id.
func uuidOf(id [16]byte) pgtype.UUID { return pgtype.UUID{Bytes: id, Valid: id != [16]byte{}} }
