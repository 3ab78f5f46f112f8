package fence

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

// Registration is what Register read: the group's incarnation, and the
// highest epoch registered under it, the caller's included.
type Registration struct {
	Incarnation int64
	HighEpoch   int32
}

// Register records that a member is about to have the group coordinator
// confirm epoch, and returns the group's incarnation and the highest epoch
// registered under it (at least epoch). One statement, under the group's row
// lock.
//
// It is the first step of every claim round (docs/fencing.md, "Group
// lifetimes"): register, then have the coordinator confirm the epoch, then
// claim with (Incarnation, epoch) — but only if HighEpoch is not above epoch.
// A higher registered epoch, with ours confirmed after we registered, means
// the group's epochs restarted: the caller bumps the incarnation
// (BumpIncarnation) and starts over. Because a claimant registers before its
// confirmation, every member of an older group lifetime registered before
// the reset that ended it, so the first claimant of the new lifetime sees
// their epochs, whichever claim happens to come first.
//
// Worker protocol: package consumer calls it; not API (see the package doc).
func (s *Store) Register(ctx context.Context, group string, epoch int32, by string) (Registration, error) {
	if epoch < 0 {
		return Registration{}, fmt.Errorf("sink: cannot register negative epoch %d", epoch)
	}
	var r Registration
	err := s.pool.QueryRow(ctx, `INSERT INTO `+quote(s.schema)+`.group_incarnations AS g
		(consumer_group, incarnation, high_epoch, bumped_by, reason) VALUES ($1, 0, $2, $3, 'first registration')
	ON CONFLICT (consumer_group) DO UPDATE SET high_epoch = greatest(g.high_epoch, excluded.high_epoch)
	RETURNING g.incarnation, g.high_epoch`, group, epoch, by).Scan(&r.Incarnation, &r.HighEpoch)
	if err != nil {
		return Registration{}, fmt.Errorf("registering epoch %d of group %q: %w", epoch, group, err)
	}
	return r, nil
}

// BumpIncarnation moves the group from incarnation from to from+1, only if it
// is still at from (compare-and-set), and starts the new incarnation's
// registered high epoch at 0. It returns the group's incarnation afterwards
// and whether this call moved it.
//
// A bump never lets anyone in: every claim carries the incarnation its
// claimant registered under before the coordinator confirmed it, so a
// claimant that was confirmed before the bump claims with the older
// incarnation and loses to every claim made after it. Members call it after
// the coordinator confirmed their epoch although a higher one is registered
// (the epochs restarted) or a claim at their very token is stored (a tie);
// `tenure admin group delete` calls it before deleting a group.
//
// Worker protocol: package consumer calls it; not API (see the package doc).
func (s *Store) BumpIncarnation(ctx context.Context, group string, from int64, by, reason string) (int64, bool, error) {
	var inc int64
	err := s.pool.QueryRow(ctx, `INSERT INTO `+quote(s.schema)+`.group_incarnations AS g
		(consumer_group, incarnation, high_epoch, bumped_by, reason) VALUES ($1, $2 + 1, 0, $3, $4)
	ON CONFLICT (consumer_group) DO UPDATE
		SET incarnation = excluded.incarnation, high_epoch = 0, bumped_at = now(), bumped_by = excluded.bumped_by, reason = excluded.reason
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
