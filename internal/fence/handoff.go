package fence

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tenure-dev/tenure/internal/tick"
)

// ApplicationName is the application_name a batch transaction of claim
// claimID sets (SET LOCAL): other sessions see it in pg_stat_activity, and
// EndStaleBlockers recognises an older claimant's session by it.
func ApplicationName(claimID int64) string { return "tenure:" + strconv.FormatInt(claimID, 10) }

// EndStaleBlockers ends the sessions that block backend pid (the caller's
// batch transaction, pg_blocking_pids) if they belong to an older claimant of
// p: their application_name names a claim of p (ApplicationName) that is not
// claimID, while p's fencing row holds claimID. Such a session is a zombie
// (a worker frozen in the middle of its transaction, holding row locks the
// new owner needs): its transaction is aborted, nothing it wrote becomes
// visible, and its COMMIT, if it ever came, could not pass the fence anyway.
// A caller that does not hold p's current claim ends nothing: it is the
// zombie. Sessions of other partitions, and of anything that is not a tenure
// lane, are left alone.
//
// It returns the PIDs it ended. Ending another session needs the same role,
// or membership in pg_signal_backend; without it the error says so and the
// caller falls back on idle_in_transaction_session_timeout.
//
// A joint transaction (CommitJoint) names a range of its process's claims
// (JointApplicationName) rather than one. A newer owner of p blocked by it
// reads an older claim of p in that range in the fence log: the joint
// transaction carries that claimant's batch, a zombie's, whose fence row
// would refuse it anyway. Ending the session aborts the other partitions'
// batches in it too; their lanes resolve NotCommitted and go again. The
// range may also cover an older claim of p by the same process that is not
// in the transaction (claims of a process grow one by one): then the
// session is ended for a lock it holds on p's behalf or not, which costs a
// retry of its batches, never a commit (ending a session commits nothing).
//
// Worker protocol: package consumer calls it; not API (see the package doc).
func (s *Store) EndStaleBlockers(ctx context.Context, p Partition, claimID int64, pid uint32) ([]int32, error) {
	q := quote(s.schema)
	return s.terminate(ctx, p, `SELECT a.pid, pg_terminate_backend(a.pid)
	FROM pg_stat_activity a
	WHERE a.pid = ANY (pg_blocking_pids($1))
	  AND EXISTS (SELECT 1 FROM `+q+`.fences f
	              WHERE f.consumer_group = $2 AND f.topic = $3 AND f.partition = $4 AND f.claim_id = $5)
	  AND EXISTS (SELECT 1 FROM `+q+`.fence_log l
	              WHERE l.kind = 'claim'
	                AND l.claim_id BETWEEN `+claimLoSQL+` AND `+claimHiSQL+`
	                AND l.claim_id <> $5
	                AND l.consumer_group = $2 AND l.topic = $3 AND l.partition = $4)`,
		int32(pid), p.Group, p.Topic, p.Partition, claimID)
}

// claimWatchAfter is how long a claim waits for the fencing row's lock
// before it looks at who holds it, and how often it looks again.
const claimWatchAfter = 250 * time.Millisecond

// watchClaim looks, while the claim of backend pid waits, for sessions of
// older claimants of p that block it, and ends them (endOlderClaimants).
// stop ends the watch and returns how many sessions it ended.
func (s *Store) watchClaim(req ClaimRequest, pid uint32) (stop func() int) {
	done := make(chan struct{})
	var ended atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick.Repeat(done, claimWatchAfter, claimWatchAfter, func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			n, err := s.endOlderClaimants(ctx, req, pid)
			cancel()
			ended.Add(int64(len(n)))
			// On a privilege error, idle_in_transaction_session_timeout
			// will do it.
			return err == nil || !isPrivilege(err)
		})
	}()
	return func() int {
		close(done)
		wg.Wait()
		return int(ended.Load())
	}
}

// endOlderClaimants ends the sessions that block backend pid (a claim of p
// with token t, which the coordinator has confirmed) if they are batch
// transactions of a claim of p with a lower token (their application_name
// names it, ApplicationName, and the fence log records it). Such a session
// stopped between its fence statement and its COMMIT, holding p's fencing
// row: its transaction rolls back, and its COMMIT, if it ever came, could
// not pass the fence of a claim made after it. A caller whose token is not
// the highest never ends the current owner's session: a zombie's claim
// waits, then is rejected. It returns the PIDs it ended; see
// EndStaleBlockers for the privilege it needs.
//
// It ends nothing for a claim that the claim statement would refuse once
// the lock is free: the same test as the claim's, against the committed
// row (which is what the claim meets: a commit moves only the next
// offset). Without it, an older lane of the same member recovering at a
// higher epoch ended its newer lane's session in the middle of a commit,
// and was then refused as superseded: a commit lost for nothing.
func (s *Store) endOlderClaimants(ctx context.Context, req ClaimRequest, pid uint32) ([]int32, error) {
	p, t := req.Partition, req.Token
	q := quote(s.schema)
	return s.terminate(ctx, p, `SELECT a.pid, pg_terminate_backend(a.pid)
	FROM pg_stat_activity a
	WHERE a.pid = ANY (pg_blocking_pids($1))
	  AND EXISTS (SELECT 1 FROM `+q+`.fence_log l
	              WHERE l.kind = 'claim'
	                AND l.claim_id BETWEEN `+claimLoSQL+` AND `+claimHiSQL+`
	                AND l.consumer_group = $2 AND l.topic = $3 AND l.partition = $4
	                AND (l.incarnation, l.epoch) < ($5::bigint, $6::integer))
	  -- The claim would be accepted: its incarnation is the group's, and
	  -- the row's claimant is older and not a newer lane of this member.
	  AND $5::bigint = coalesce((SELECT g.incarnation FROM `+q+`.group_incarnations g WHERE g.consumer_group = $2), 0)
	  AND EXISTS (SELECT 1 FROM `+q+`.fences f
	              WHERE f.consumer_group = $2 AND f.topic = $3 AND f.partition = $4
	                AND ((f.incarnation, f.epoch) < ($5::bigint, $6::integer)
	                     OR ((f.incarnation, f.epoch) = ($5::bigint, $6::integer) AND f.owner = $7 AND f.claim_id = $8))
	                AND NOT (f.owner = $7 AND f.claim_id > $8))`,
		int32(pid), p.Group, p.Topic, p.Partition, t.Incarnation, t.Epoch, req.Owner, req.ClaimID)
}

// terminate runs query, which selects (pid, pg_terminate_backend(pid)) for
// the sessions of older claimants of p, and returns the PIDs it ended.
func (s *Store) terminate(ctx context.Context, p Partition, query string, args ...any) ([]int32, error) {
	rows, err := s.pool.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("ending the sessions of older claimants of %s: %w", p, err)
	}
	defer rows.Close()
	var ended []int32
	for rows.Next() {
		var bpid int32
		var ok bool
		if err := rows.Scan(&bpid, &ok); err != nil {
			return ended, err
		}
		if ok {
			ended = append(ended, bpid)
		}
	}
	return ended, rows.Err()
}

func isPrivilege(err error) bool { return IsInsufficientPrivilege(err) }
