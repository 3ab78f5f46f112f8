package fence

// Commits that span partitions: one transaction carries the batches of
// several partitions of one group, and one fence statement checks and moves
// all of them (docs/fencing.md, "Commits that span partitions").

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// JointApplicationName is the application_name of a transaction that
// carries the batches of claims lo to hi of one process (claim ids are a
// random base plus a sequence per process, so a process's claims form a
// range that another process's almost never meets). EndStaleBlockers and a
// claim's watch read it as the claims lo..hi; the one-claim form
// (ApplicationName) is the range of one.
func JointApplicationName(lo, hi int64) string {
	if lo == hi {
		return ApplicationName(lo)
	}
	return "tenure:" + strconv.FormatInt(lo, 10) + "-" + strconv.FormatInt(hi, 10)
}

// claimRangeSQL are the lowest and highest claim ids a session's
// application_name (a.application_name) names, NULL for a session that is
// not a tenure batch transaction: 'tenure:<id>' or 'tenure:<lo>-<hi>'.
const (
	claimLoSQL = `substring(a.application_name from '^tenure:([0-9]{1,18})(?:-[0-9]{1,18})?$')::bigint`
	claimHiSQL = `coalesce(substring(a.application_name from '^tenure:[0-9]{1,18}-([0-9]{1,18})$'),
	                            substring(a.application_name from '^tenure:([0-9]{1,18})$'))::bigint`
)

// JointFencedError is CommitJoint's answer when the fence refused some of
// the transaction's partitions: nothing of the transaction committed.
// Fenced holds, by index into the requests, why each refused one was
// refused (a *FencedError); the others may go again without them.
type JointFencedError struct {
	Fenced map[int]error
}

func (e *JointFencedError) Error() string {
	return fmt.Sprintf("%v: %d of the transaction's partitions refused, nothing of it committed", ErrFenced, len(e.Fenced))
}

// Unwrap makes errors.Is(err, ErrFenced) true.
func (e *JointFencedError) Unwrap() error { return ErrFenced }

// CommitJoint is CommitBatch for a transaction that carries the batches of
// several partitions of one group (reqs, at most one per partition): one
// fence statement over all of them, sent with COMMIT in one round trip.
// Every row must pass every condition of a single commit (token, owner,
// claim id, next offset, log epoch, the marker); if any does not, the
// statement raises and nothing of the transaction commits, the other
// partitions' output and offsets included.
//
// Errors as CommitBatch's, except a refusal: a *JointFencedError says which
// partitions were refused (read from their rows afterwards). If every row
// reads as passing by then (it changed again between the refusal and the
// read), the error is a plain one and every batch is retried whole.
//
// Worker protocol: package consumer calls it; not API (see the package doc).
func (s *Store) CommitJoint(ctx context.Context, tx pgx.Tx, reqs []CommitRequest, marker string) error {
	if len(reqs) == 0 {
		return errors.New("sink: a joint commit needs at least one batch")
	}
	group := reqs[0].Partition.Group
	topics := make([]string, len(reqs))
	parts := make([]int32, len(reqs))
	incs, froms, tos, claims, logEpochs := make([]int64, len(reqs)), make([]int64, len(reqs)), make([]int64, len(reqs)), make([]int64, len(reqs)), make([]int64, len(reqs))
	epochs := make([]int32, len(reqs))
	owners := make([]string, len(reqs))
	seen := make(map[Partition]bool, len(reqs))
	for i, r := range reqs {
		p := r.Partition
		switch {
		case p.Group != group:
			return fmt.Errorf("sink: a joint commit spans one group: %s is not in %q", p, group)
		case seen[p]:
			return fmt.Errorf("sink: a joint commit carries %s twice", p)
		case r.To <= r.From:
			return fmt.Errorf("sink: commit of %s must advance: from %d to %d", p, r.From, r.To)
		}
		seen[p] = true
		topics[i], parts[i], incs[i], epochs[i], owners[i] = p.Topic, p.Partition, r.Token.Incarnation, r.Token.Epoch, r.Owner
		froms[i], tos[i], claims[i], logEpochs[i] = r.From, r.To, r.ClaimID, r.LogEpoch
	}
	b := &pgx.Batch{}
	b.Queue(s.jointSQL(), group, topics, parts, incs, epochs, owners, froms, tos, claims, logEpochs, marker, int64(len(reqs)))
	b.Queue("COMMIT")
	return sendFence(ctx, tx, b, 1, func(ctx context.Context) error {
		return s.whichFenced(ctx, reqs)
	}, func(err error) error {
		return fmt.Errorf("joint commit of %d partitions: %w", len(reqs), err)
	})
}

// jointSQL is the fence statement of CommitJoint: today's pipelined fence
// (NewStore's pipelinedSQL), row for row, over unnest of the requests. The
// count of rows it moved must be all of them: fence_check raises on
// anything else, so the COMMIT behind it finds the transaction aborted.
func (s *Store) jointSQL() string {
	q := quote(s.schema)
	return `WITH r AS (
	SELECT * FROM unnest($2::text[], $3::int[], $4::bigint[], $5::int[], $6::text[], $7::bigint[], $8::bigint[], $9::bigint[], $10::bigint[])
		AS r(topic, partition, incarnation, epoch, owner, from_offset, to_offset, claim_id, log_epoch)
), u AS (
	UPDATE ` + q + `.fences f
	SET next_offset = r.to_offset, committed_at = now()
	FROM r
	WHERE f.consumer_group = $1 AND f.topic = r.topic AND f.partition = r.partition
	  AND f.incarnation = r.incarnation AND f.epoch = r.epoch AND f.owner = r.owner AND f.claim_id = r.claim_id
	  AND f.next_offset = r.from_offset AND f.log_epoch = r.log_epoch
	  AND coalesce(current_setting('tenure.tx', true), '') = $11
	RETURNING r.*
), l AS (
	INSERT INTO ` + q + `.fence_log
		(kind, consumer_group, topic, partition, incarnation, epoch, owner, from_offset, to_offset, claim_id)
	SELECT 'commit', $1, topic, partition, incarnation, epoch, owner, from_offset, to_offset, claim_id FROM u
)
SELECT ` + q + `.fence_check(CASE WHEN count(*) = $12 THEN 1 ELSE 0 END, coalesce(current_setting('tenure.tx', true), '') = $11) FROM u`
}

// whichFenced reads the rows of a refused joint commit's partitions (on
// another connection: the transaction is aborted) and says which requests
// they refuse.
func (s *Store) whichFenced(ctx context.Context, reqs []CommitRequest) error {
	// Bounded like fenced: a starved pool must not turn a refusal into a hang.
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	parts := make([]Partition, len(reqs))
	for i, r := range reqs {
		parts[i] = r.Partition
	}
	rows, err := s.FenceRows(rctx, reqs[0].Partition.Group, parts)
	if err != nil {
		return fmt.Errorf("joint commit of %d partitions refused, and reading which failed: %w", len(reqs), err)
	}
	out := &JointFencedError{Fenced: map[int]error{}}
	for i, r := range reqs {
		f, ok := rows[r.Partition]
		switch {
		case !ok:
			out.Fenced[i] = &FencedError{Op: "commit", Partition: r.Partition, Presented: r.Token, Owner: r.Owner, ClaimID: r.ClaimID, From: r.From, LogEpoch: r.LogEpoch}
		case f.Token != r.Token || f.Owner != r.Owner || f.ClaimID != r.ClaimID || f.NextOffset != r.From || f.LogEpoch != r.LogEpoch:
			out.Fenced[i] = withClaim(fencedFrom("commit", r.Partition, r.Token, r.Owner, r.From, f), r)
		}
	}
	if len(out.Fenced) == 0 {
		return fmt.Errorf("joint commit of %d partitions refused, but every row reads as passing now: trying again", len(reqs))
	}
	return out
}
