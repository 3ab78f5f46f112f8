package sink

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Halt records that a partition must not be processed until an operator
// resumes it: its handler ended its own transaction, so what it wrote may
// have been committed outside the fence, and running it again would do the
// same.
type Halt struct {
	Partition
	From, To          int64  // the batch the handler was running
	FirstJob, LastJob string // its jobs, "topic/partition/offset"
	Reason            string
	Owner             string // the worker that found it
	Token             Token
	HaltedAt          time.Time
}

const haltCols = `consumer_group, topic, partition, from_offset, to_offset, first_job, last_job, reason, owner,
	incarnation, epoch, halted_at`

// HaltPartition records h (replacing an earlier halt of the partition). It
// runs on its own, outside any batch transaction, so that it stands whatever
// happens to the batch.
func (s *Store) HaltPartition(ctx context.Context, h Halt) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO `+quote(s.schema)+`.halted_partitions AS h (`+haltCols+`)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, now())
		ON CONFLICT (consumer_group, topic, partition) DO UPDATE SET
			from_offset = excluded.from_offset, to_offset = excluded.to_offset, first_job = excluded.first_job,
			last_job = excluded.last_job, reason = excluded.reason, owner = excluded.owner,
			incarnation = excluded.incarnation, epoch = excluded.epoch, halted_at = excluded.halted_at`,
		h.Group, h.Topic, h.Partition.Partition, h.From, h.To, validText(h.FirstJob), validText(h.LastJob),
		validText(h.Reason), h.Owner, h.Token.Incarnation, h.Token.Epoch)
	return err
}

// HaltOf returns the halt of p, and whether there is one.
func (s *Store) HaltOf(ctx context.Context, p Partition) (Halt, bool, error) {
	h, err := scanHalt(s.pool.QueryRow(ctx, `SELECT `+haltCols+` FROM `+quote(s.schema)+`.halted_partitions
		WHERE consumer_group = $1 AND topic = $2 AND partition = $3`, p.Group, p.Topic, p.Partition))
	if errors.Is(err, pgx.ErrNoRows) {
		return Halt{}, false, nil
	}
	return h, err == nil, err
}

// Halts lists the halted partitions of group, or of every group when group
// is "".
func (s *Store) Halts(ctx context.Context, group string) ([]Halt, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+haltCols+` FROM `+quote(s.schema)+`.halted_partitions
		WHERE ($1 = '' OR consumer_group = $1) ORDER BY consumer_group, topic, partition`, group)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Halt, error) { return scanHalt(r) })
}

// ResumePartition removes p's halt and returns it; false if p was not
// halted. Workers waiting on the partition go on within seconds.
func (s *Store) ResumePartition(ctx context.Context, p Partition) (Halt, bool, error) {
	h, err := scanHalt(s.pool.QueryRow(ctx, `DELETE FROM `+quote(s.schema)+`.halted_partitions
		WHERE consumer_group = $1 AND topic = $2 AND partition = $3 RETURNING `+haltCols, p.Group, p.Topic, p.Partition))
	if errors.Is(err, pgx.ErrNoRows) {
		return Halt{}, false, nil
	}
	return h, err == nil, err
}

func scanHalt(r pgx.Row) (Halt, error) {
	var h Halt
	err := r.Scan(&h.Group, &h.Topic, &h.Partition.Partition, &h.From, &h.To, &h.FirstJob, &h.LastJob, &h.Reason,
		&h.Owner, &h.Token.Incarnation, &h.Token.Epoch, &h.HaltedAt)
	return h, err
}

// validText makes s storable in a text column: valid UTF-8 without NUL
// bytes (Postgres refuses both). For messages, not for a job's bytes.
func validText(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", `\x00`)
}
