package fence

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// Worker is a running member of a consumer group as its own heartbeat
// describes it (the workers table, migrations 016 and 018).
type Worker struct {
	Group    string
	MemberID string // the member id the group coordinator gave it (fence owners are member ids)
	ClientID string
	Host     string
	PID      int32
	// Epoch is the member's epoch as the worker last heard it from the
	// coordinator (classic: the group generation; KIP-848: the member
	// epoch), nil when not known: the worker had not joined, or the row
	// was written before migration 018 or read from a schema without it.
	Epoch *int32
	// StartedAt is the member's first heartbeat and SeenAt its latest, on
	// the database's clock.
	StartedAt, SeenAt time.Time
}

// Heartbeat records that w.MemberID of w.Group is alive now: one statement
// that inserts its row, or sets seen_at (and the client id, host, pid and
// epoch) of the row it wrote before. seen_at is the database's clock, so that
// readers compare it with the database's clock and no worker's. StartedAt
// and SeenAt of w are ignored.
//
// Worker protocol: package consumer calls it; not API (see the package doc).
func (s *Store) Heartbeat(ctx context.Context, w Worker) error {
	if w.Group == "" || w.MemberID == "" {
		return errors.New("sink: a heartbeat needs a group and a member id")
	}
	_, err := s.pool.Exec(ctx, `INSERT INTO `+quote(s.schema)+`.workers AS w (consumer_group, member_id, client_id, host, pid, epoch)
	VALUES ($1, $2, $3, $4, $5, $6)
	ON CONFLICT (consumer_group, member_id) DO UPDATE
		SET seen_at = now(), client_id = excluded.client_id, host = excluded.host, pid = excluded.pid, epoch = excluded.epoch`,
		w.Group, w.MemberID, w.ClientID, w.Host, w.PID, w.Epoch)
	if SQLState(err) == CodeUndefinedColumn {
		// Migration 018 reverted under a running worker: the heartbeat
		// still says the member is alive, without its epoch.
		_, err = s.pool.Exec(ctx, `INSERT INTO `+quote(s.schema)+`.workers AS w (consumer_group, member_id, client_id, host, pid)
	VALUES ($1, $2, $3, $4, $5)
	ON CONFLICT (consumer_group, member_id) DO UPDATE
		SET seen_at = now(), client_id = excluded.client_id, host = excluded.host, pid = excluded.pid`,
			w.Group, w.MemberID, w.ClientID, w.Host, w.PID)
	}
	return err
}

// ForgetWorker deletes member's heartbeat row: a worker that stops
// gracefully, or whose member id changed, says it is gone rather than
// leave a row that reads as silent. It reports whether there was a row.
//
// Worker protocol: package consumer calls it; not API (see the package doc).
func (s *Store) ForgetWorker(ctx context.Context, group, member string) (bool, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM `+quote(s.schema)+`.workers WHERE consumer_group = $1 AND member_id = $2`, group, member)
	return tag.RowsAffected() > 0, err
}

// PruneWorkers deletes the heartbeat rows of group not seen for longer
// than unseen (rows of workers that died, whose member ids never come
// back), and returns how many it deleted.
//
// Worker protocol: package consumer calls it; not API (see the package doc).
func (s *Store) PruneWorkers(ctx context.Context, group string, unseen time.Duration) (int64, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM `+quote(s.schema)+`.workers
	WHERE consumer_group = $1 AND seen_at < now() - make_interval(secs => $2)`, group, unseen.Seconds())
	return tag.RowsAffected(), err
}

// Workers reads the heartbeat rows of group, ordered by member id, and the
// database's clock at the read: a member's silence is now - SeenAt, both
// on the database's clock. The fencing rows' times (Fence.ClaimedAt,
// CommittedAt) and the holds' (Hold.Since) are on the same clock.
//
// The admin commands read schemas they do not migrate: on one before
// migration 018 the rows are read without their epochs (Epoch nil).
func (s *Store) Workers(ctx context.Context, group string) (ws []Worker, now time.Time, err error) {
	ws, now, err = s.workers(ctx, group, "w.epoch")
	if SQLState(err) == CodeUndefinedColumn {
		ws, now, err = s.workers(ctx, group, "NULL::integer")
	}
	return ws, now, err
}

// workers reads the rows with epoch (a column or NULL) as their epoch.
func (s *Store) workers(ctx context.Context, group, epoch string) (ws []Worker, now time.Time, err error) {
	// One round trip: the clock comes with the rows, and alone when there
	// are none.
	rows, err := s.pool.Query(ctx, `SELECT n.now, w.member_id, w.client_id, w.host, w.pid, w.started_at, w.seen_at, `+epoch+`
	FROM (SELECT now()) n
	LEFT JOIN `+quote(s.schema)+`.workers w ON w.consumer_group = $1
	ORDER BY w.member_id`, group)
	if err != nil {
		return nil, time.Time{}, err
	}
	var member, client, host *string
	var pid, ep *int32
	var started, seen *time.Time
	_, err = pgx.ForEachRow(rows, []any{&now, &member, &client, &host, &pid, &started, &seen, &ep}, func() error {
		if member == nil {
			return nil // no rows: the clock alone
		}
		w := Worker{Group: group, MemberID: *member, ClientID: *client, Host: *host, PID: *pid,
			StartedAt: *started, SeenAt: *seen}
		if ep != nil {
			w.Epoch = new(int32)
			*w.Epoch = *ep
		}
		ws = append(ws, w)
		return nil
	})
	if err != nil {
		return nil, time.Time{}, err
	}
	return ws, now, nil
}
