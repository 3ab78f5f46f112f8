package fence

import (
	"context"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/jackc/pgx/v5"
)

// FenceLogRetention bounds a partition's fence log (one entry per accepted
// claim or commit). An entry is pruned when it is older than MaxAge or not
// among the partition's newest MaxEntries; a zero or negative field sets no
// limit of its kind. Whatever the limits, the claim that held the partition
// at the cut is kept.
type FenceLogRetention struct {
	MaxAge     time.Duration
	MaxEntries int
}

// Enabled reports whether r prunes anything.
func (r FenceLogRetention) Enabled() bool { return r.MaxAge > 0 || r.MaxEntries > 0 }

// FenceLogCut describes what pruning removed from the front of a
// partition's fence log; a checker needs it to read the log that is left
// (the table fence_log_pruned holds one per pruned partition).
type FenceLogCut struct {
	Partition
	// ThroughID: every entry with id <= ThroughID was removed, except
	// KeptClaimID (0: none), the claim that held the partition at the cut.
	ThroughID, KeptClaimID int64
	// NextOffset is where the entries after the cut resume: the removed
	// log's last to_offset. The first entry with id > ThroughID starts
	// there (a commit's from_offset, or a claim's offset).
	NextOffset int64
	// MaxToken is the highest token of the removed entries (the kept claim
	// included): no later entry may carry a lower one (G2).
	MaxToken Token
	Pruned   int64 // entries removed so far, in all passes
	PrunedAt time.Time
}

// PruneFenceLog removes the front of p's fence log that r does not keep,
// and records the cut (FenceLogCut) in the same transaction. What is left is
// the claim that held p at the cut, then every entry after the cut, in
// order: a consistent, front-trimmed history. Another pruner of the same
// partition makes it return 0 at once. It returns the number of entries
// removed.
//
// It is safe while workers commit: the fencing row's lock serialises a
// partition's claims and commits, so an entry not yet visible has a higher
// id than every visible one, and the cut is chosen among visible ones.
//
// Worker protocol: package consumer calls it; not API (see the package doc).
func (s *Store) PruneFenceLog(ctx context.Context, p Partition, r FenceLogRetention) (int64, error) {
	if !r.Enabled() {
		return 0, nil
	}
	q := quote(s.schema)
	var removed int64
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var locked bool
		if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, pruneLockKey(s.schema, p)).Scan(&locked); err != nil || !locked {
			return err
		}
		maxEntries, maxAgeMS := int64(max(r.MaxEntries, 0)), max(r.MaxAge.Milliseconds(), 0)
		if r.MaxAge > 0 && maxAgeMS == 0 {
			maxAgeMS = 1
		}
		var cut *int64
		if err := tx.QueryRow(ctx, `SELECT greatest(
			CASE WHEN $4::bigint > 0 THEN (SELECT id FROM `+q+`.fence_log
				WHERE consumer_group = $1 AND topic = $2 AND partition = $3 ORDER BY id DESC OFFSET $4 LIMIT 1) END,
			CASE WHEN $5::bigint > 0 THEN (SELECT max(id) FROM `+q+`.fence_log
				WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND at < clock_timestamp() - $5 * interval '1 millisecond') END)`,
			p.Group, p.Topic, p.Partition, maxEntries, maxAgeMS).Scan(&cut); err != nil {
			return fmt.Errorf("choosing the cut: %w", err)
		}
		if cut == nil {
			return nil
		}
		var next int64
		var keep *int64
		var top Token
		if err := tx.QueryRow(ctx, `SELECT
			(SELECT to_offset FROM `+q+`.fence_log WHERE id = $4),
			(SELECT max(id) FROM `+q+`.fence_log WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND kind = 'claim' AND id <= $4),
			t.incarnation, t.epoch
			FROM (SELECT incarnation, epoch FROM `+q+`.fence_log WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND id <= $4
				ORDER BY incarnation DESC, epoch DESC LIMIT 1) t`, p.Group, p.Topic, p.Partition, *cut).
			Scan(&next, &keep, &top.Incarnation, &top.Epoch); err != nil {
			return fmt.Errorf("reading the cut: %w", err)
		}
		tag, err := tx.Exec(ctx, `DELETE FROM `+q+`.fence_log WHERE consumer_group = $1 AND topic = $2 AND partition = $3
			AND id <= $4 AND id IS DISTINCT FROM $5`, p.Group, p.Topic, p.Partition, *cut, keep)
		if err != nil {
			return fmt.Errorf("pruning: %w", err)
		}
		removed = tag.RowsAffected()
		if removed == 0 {
			return nil // only the kept claim is at or below the cut: nothing changed
		}
		_, err = tx.Exec(ctx, `INSERT INTO `+q+`.fence_log_pruned AS w
			(consumer_group, topic, partition, through_id, kept_claim_id, next_offset, max_incarnation, max_epoch, pruned)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
			ON CONFLICT (consumer_group, topic, partition) DO UPDATE SET
				through_id = excluded.through_id, kept_claim_id = excluded.kept_claim_id, next_offset = excluded.next_offset,
				max_incarnation = CASE WHEN (excluded.max_incarnation, excluded.max_epoch) > (w.max_incarnation, w.max_epoch)
					THEN excluded.max_incarnation ELSE w.max_incarnation END,
				max_epoch = CASE WHEN (excluded.max_incarnation, excluded.max_epoch) > (w.max_incarnation, w.max_epoch)
					THEN excluded.max_epoch ELSE w.max_epoch END,
				pruned = w.pruned + excluded.pruned, pruned_at = now()`,
			p.Group, p.Topic, p.Partition, *cut, keep, next, top.Incarnation, top.Epoch, removed)
		if err != nil {
			return fmt.Errorf("recording the cut: %w", err)
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("pruning the fence log of %s: %w", p, err)
	}
	return removed, nil
}

// PruneFenceLogs prunes the fence log of every partition of group (every
// group when group is "") that has a fencing row. It returns the number of
// entries removed and of partitions pruned.
func (s *Store) PruneFenceLogs(ctx context.Context, group string, r FenceLogRetention) (removed int64, partitions int, err error) {
	fences, err := s.List(ctx, group)
	if err != nil {
		return 0, 0, err
	}
	for _, f := range fences {
		n, err := s.PruneFenceLog(ctx, f.Partition, r)
		if err != nil {
			return removed, partitions, err
		}
		if n > 0 {
			removed += n
			partitions++
		}
	}
	return removed, partitions, nil
}

// FenceLogCuts lists the cuts recorded by PruneFenceLog for group (every
// group when group is "").
//
// Worker protocol: package consumer calls it; not API (see the package doc).
func (s *Store) FenceLogCuts(ctx context.Context, group string) ([]FenceLogCut, error) {
	rows, err := s.pool.Query(ctx, `SELECT consumer_group, topic, partition, through_id, coalesce(kept_claim_id, 0), next_offset,
		max_incarnation, max_epoch, pruned, pruned_at FROM `+quote(s.schema)+`.fence_log_pruned
		WHERE ($1 = '' OR consumer_group = $1) ORDER BY consumer_group, topic, partition`, group)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (FenceLogCut, error) {
		var c FenceLogCut
		err := r.Scan(&c.Group, &c.Topic, &c.Partition.Partition, &c.ThroughID, &c.KeptClaimID, &c.NextOffset,
			&c.MaxToken.Incarnation, &c.MaxToken.Epoch, &c.Pruned, &c.PrunedAt)
		return c, err
	})
}

func pruneLockKey(schema string, p Partition) int64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "tenure.fencelog.%s\x00%s\x00%s\x00%d", schema, p.Group, p.Topic, p.Partition)
	return int64(h.Sum64())
}

// FenceLog returns every entry of group's fence log that pruning kept,
// oldest first. It reads the whole log: a check over a group's history
// (tests, the demo) uses it, not a worker.
func (s *Store) FenceLog(ctx context.Context, group string) ([]FenceLogEntry, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, kind, consumer_group, topic, partition, incarnation, epoch, owner, claim_id,
		from_offset, to_offset, at, coalesce(gid, '') FROM `+quote(s.schema)+`.fence_log WHERE consumer_group = $1 ORDER BY id`, group)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (FenceLogEntry, error) {
		var e FenceLogEntry
		err := r.Scan(&e.ID, &e.Kind, &e.Partition.Group, &e.Partition.Topic, &e.Partition.Partition, &e.Token.Incarnation, &e.Token.Epoch,
			&e.Owner, &e.ClaimID, &e.From, &e.To, &e.At, &e.GID)
		return e, err
	})
}

// ClaimQuery selects the claims that Claims returns.
type ClaimQuery struct {
	Group string
	// Scan bounds the read to the schema's newest Scan fence log entries
	// (of every group), so that it costs the same however long the log.
	Scan int64
	// Since, when set, keeps only the claims made after it (no resets);
	// otherwise claims and resets are returned.
	Since time.Time
	// Limit bounds the number returned (0: no bound).
	Limit int
}

// ClaimEntry is a claim or an operator's reset from the fence log, with
// the claim or commit before it on the same partition.
type ClaimEntry struct {
	FenceLogEntry
	// Previous and PreviousToken are the owner and token of the partition's
	// claim or commit before this entry ("" and zero: none kept): for a
	// claim by another owner, the owner it fenced.
	Previous      string
	PreviousToken Token
}

// Claims returns the claims (and resets) of the group among the schema's
// newest fence log entries, newest first, each with the entry before it:
// who held the partition, and with which token, until the claim.
func (s *Store) Claims(ctx context.Context, cq ClaimQuery) ([]ClaimEntry, error) {
	q := quote(s.schema)
	sql := `SELECT l.id, l.kind, l.at, l.consumer_group, l.topic, l.partition, l.incarnation, l.epoch, l.owner, l.claim_id,
		l.from_offset, l.to_offset, coalesce(p.owner, ''), coalesce(p.incarnation, 0), coalesce(p.epoch, 0)
	FROM ` + q + `.fence_log l
	LEFT JOIN LATERAL (SELECT owner, incarnation, epoch FROM ` + q + `.fence_log p
		WHERE p.consumer_group = l.consumer_group AND p.topic = l.topic AND p.partition = l.partition
		  AND p.id < l.id AND p.kind IN ('claim', 'commit')
		ORDER BY p.id DESC LIMIT 1) p ON true
	WHERE l.consumer_group = $1 AND l.kind IN ('claim', 'reset')
	  AND l.id > (SELECT coalesce(max(id), 0) FROM ` + q + `.fence_log) - $2`
	args := []any{cq.Group, cq.Scan}
	if !cq.Since.IsZero() {
		args = append(args, cq.Since)
		sql += fmt.Sprintf(` AND l.kind = 'claim' AND l.at > $%d::timestamptz`, len(args))
	}
	sql += ` ORDER BY l.id DESC`
	if cq.Limit > 0 {
		args = append(args, cq.Limit)
		sql += fmt.Sprintf(` LIMIT $%d`, len(args))
	}
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (ClaimEntry, error) {
		var c ClaimEntry
		err := r.Scan(&c.ID, &c.Kind, &c.At, &c.Partition.Group, &c.Partition.Topic, &c.Partition.Partition, &c.Token.Incarnation, &c.Token.Epoch,
			&c.Owner, &c.ClaimID, &c.From, &c.To, &c.Previous, &c.PreviousToken.Incarnation, &c.PreviousToken.Epoch)
		return c, err
	})
}

// Groups returns the consumer groups that have fencing rows, sorted.
func (s *Store) Groups(ctx context.Context) ([]string, error) {
	rows, err := s.pool.Query(ctx, `SELECT DISTINCT consumer_group FROM `+quote(s.schema)+`.fences ORDER BY 1`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}
