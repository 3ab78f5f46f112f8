package fence

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ErrPartitionsChanged is matched by the error of a topic whose partition
// count differs from the one the group recorded.
var ErrPartitionsChanged = errors.New("partition count changed")

// LayoutError says how a topic's partitions changed.
type LayoutError struct {
	Group, Topic     string
	Recorded, Now    int32
	AcknowledgeUsing string // the command that accepts the new count
}

func (e *LayoutError) Error() string {
	return fmt.Sprintf("topic %q now has %d partitions but group %q recorded %d: keys now map to different partitions, "+
		"so jobs of one key could be processed by two owners at once and out of order; this group will not process the topic "+
		"until an operator drains or checks it and runs %s",
		e.Topic, e.Now, e.Group, e.Recorded, e.AcknowledgeUsing)
}

// Is makes errors.Is(err, ErrPartitionsChanged) true.
func (e *LayoutError) Is(target error) bool { return target == ErrPartitionsChanged }

// CheckLayout records the topic's partition count for the group the first
// time it is seen and compares it afterwards. A different count returns a
// *LayoutError.
//
// Worker protocol: package consumer calls it; not API (see the package doc).
func (s *Store) CheckLayout(ctx context.Context, group, topic string, now int32) error {
	if now <= 0 {
		return fmt.Errorf("topic %q has %d partitions", topic, now)
	}
	q := quote(s.schema)
	var recorded int32
	// The no-op update makes the statement return the row whether this call
	// inserted it or another did concurrently (a plain DO NOTHING returns no
	// row to the loser of that race).
	err := s.pool.QueryRow(ctx, `INSERT INTO `+q+`.topic_layouts AS l (consumer_group, topic, partition_count) VALUES ($1, $2, $3)
		ON CONFLICT (consumer_group, topic) DO UPDATE SET partition_count = l.partition_count
		RETURNING partition_count`, group, topic, now).Scan(&recorded)
	if err != nil {
		return fmt.Errorf("checking the partition count of topic %q: %w", topic, err)
	}
	if recorded != now {
		return &LayoutError{Group: group, Topic: topic, Recorded: recorded, Now: now,
			AcknowledgeUsing: fmt.Sprintf("`tenure admin topic acknowledge-partitions --group %s --topic %s --partitions %d`", group, topic, now)}
	}
	return nil
}

// AcknowledgePartitions accepts count as the topic's partition count for the
// group. It returns the count recorded before.
func (s *Store) AcknowledgePartitions(ctx context.Context, group, topic string, count int32, by string) (int32, error) {
	if count <= 0 {
		return 0, fmt.Errorf("partition count %d must be positive", count)
	}
	q := quote(s.schema)
	var old int32
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `SELECT partition_count FROM `+q+`.topic_layouts WHERE consumer_group = $1 AND topic = $2 FOR UPDATE`, group, topic).Scan(&old)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("group %q has no recorded layout for topic %q (it never consumed it)", group, topic)
		}
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE `+q+`.topic_layouts SET partition_count = $3, acknowledged_at = now(), acknowledged_by = $4
			WHERE consumer_group = $1 AND topic = $2`, group, topic, count, by); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE `+q+`.fences SET partition_count = $3 WHERE consumer_group = $1 AND topic = $2`, group, topic, count)
		return err
	})
	return old, err
}

// Layout is the partition count a group recorded for a topic the first time
// its workers consumed it (or the count an operator acknowledged since).
type Layout struct {
	Group, Topic string
	Partitions   int32
}

// Layouts returns the partition counts recorded for group's topics, or for
// every group's when group is "", ordered by group and topic. A topic the
// group never consumed has no layout.
func (s *Store) Layouts(ctx context.Context, group string) ([]Layout, error) {
	rows, err := s.pool.Query(ctx, `SELECT consumer_group, topic, partition_count FROM `+quote(s.schema)+
		`.topic_layouts WHERE ($1 = '' OR consumer_group = $1) ORDER BY consumer_group, topic`, group)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Layout, error) {
		var l Layout
		err := r.Scan(&l.Group, &l.Topic, &l.Partitions)
		return l, err
	})
}
