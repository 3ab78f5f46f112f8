package sink

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Incarnation returns the group's current incarnation (0 if it never had a
// reset).
func (s *Store) Incarnation(ctx context.Context, group string) (int64, error) {
	var inc int64
	err := s.pool.QueryRow(ctx, `SELECT incarnation FROM `+quote(s.schema)+`.group_incarnations WHERE consumer_group = $1`, group).Scan(&inc)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("reading the incarnation of group %q: %w", group, err)
	}
	return inc, nil
}

// BumpIncarnation moves the group from incarnation from to from+1, only if it
// is still at from (compare-and-set). It returns the group's incarnation
// afterwards and whether this call moved it. Call it only after the group
// coordinator confirmed the caller's epoch is current while a higher epoch is
// stored: that combination proves the group's epochs restarted.
func (s *Store) BumpIncarnation(ctx context.Context, group string, from int64, by, reason string) (int64, bool, error) {
	var inc int64
	err := s.pool.QueryRow(ctx, `INSERT INTO `+quote(s.schema)+`.group_incarnations AS g
		(consumer_group, incarnation, bumped_by, reason) VALUES ($1, $2 + 1, $3, $4)
	ON CONFLICT (consumer_group) DO UPDATE
		SET incarnation = excluded.incarnation, bumped_at = now(), bumped_by = excluded.bumped_by, reason = excluded.reason
		WHERE g.incarnation = $2
	RETURNING incarnation`, group, from, by, reason).Scan(&inc)
	if errors.Is(err, pgx.ErrNoRows) {
		inc, err = s.Incarnation(ctx, group)
		return inc, false, err
	}
	if err != nil {
		return 0, false, fmt.Errorf("bumping the incarnation of group %q: %w", group, err)
	}
	return inc, true, nil
}
