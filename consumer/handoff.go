package consumer

import (
	"context"
	"time"

	"github.com/tenure-dev/tenure/internal/tick"
	"github.com/tenure-dev/tenure/sink"
	"go.uber.org/zap"
)

// A new owner must not wait for an older owner that froze in the middle of
// its transaction (a GC pause, a VM migration: the paused-worker story itself) and
// holds row locks the new owner's batch needs: Postgres would end that
// session only at idle_in_transaction_session_timeout, which must outlast a
// legal handler and so is often far longer than the session timeout. So a
// batch that runs longer than lockWatchAfter looks, every lockWatchEvery,
// at the sessions blocking it (pg_blocking_pids) and ends those that belong
// to an older claimant of its own partition (fence.Store.EndStaleBlockers),
// provided its own claim is the current one. Walk-through:
//
//  1. A claims p and begins a batch that updates row r; it is frozen before
//     COMMIT, its session idle in the transaction, r locked.
//  2. The coordinator gives p to B (one session timeout later); B claims p:
//     the fencing row now holds B's claim. B's batch updates r and waits.
//  3. B's lock watch sees A's session blocking it; A's application_name
//     names A's claim, which the fence log says was a claim of p, and the
//     fencing row holds B's claim: A is stale. pg_terminate_backend ends
//     A's session: its transaction rolls back, r is free, B goes on.
//  4. A wakes: its connection is gone, its batch never committed; had its
//     COMMIT come first, the fence would have refused it.
//
// The watch never ends a session of another partition or of a newer claim:
// a zombie's watch finds that its own claim is not the current one and
// does nothing. Without the privilege to end the session (another role, no
// pg_signal_backend) it says so once and the idle timeout remains.
const (
	lockWatchAfter = 250 * time.Millisecond
	lockWatchEvery = 250 * time.Millisecond
)

// watchLocks starts the lock watch of the batch transaction of backend pid;
// the returned func stops it.
func (l *lane) watchLocks(pid uint32) (stop func()) {
	if l.c.lockWatchOff.Load() {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		tick.Repeat(done, lockWatchAfter, lockWatchEvery, func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			ended, err := l.c.store.EndStaleBlockers(ctx, l.key, l.claimID, pid)
			cancel()
			if len(ended) > 0 {
				l.c.stats.staleSessionsEnded.Add(int64(len(ended)))
				l.log.Warn("ended the session of an older owner of this partition that held locks this batch waits for (a worker frozen in its transaction)",
					zap.Int32s("pids", ended))
			}
			if err != nil && isPrivilegeError(err) {
				if l.c.lockWatchOff.CompareAndSwap(false, true) {
					l.log.Warn("cannot end an older owner's session that holds locks this batch waits for: the database role needs to be the same as the other worker's, or a member of pg_signal_backend; waiting for idle_in_transaction_session_timeout instead",
						zap.Error(err))
				}
				return false
			}
			return true
		})
	}()
	return func() { close(done) }
}

func isPrivilegeError(err error) bool { return sink.IsInsufficientPrivilege(err) }
