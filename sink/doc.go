// Package sink is tenure's Postgres side: the fencing state and the two
// statements that guard it.
//
// One row per (consumer group, topic, partition) holds the current token,
// the owner that claimed the partition with it, and the next offset to
// process. Offsets live here, not in Kafka: Kafka's committed offsets are at
// most a mirror for lag tools.
//
//   - Claim runs when the group assigns a partition. It takes the row for the
//     claimant only if the stored token is lower (or equal and held by the same
//     owner) and returns the offset to resume from. From that moment any
//     commit by the previous owner is rejected, even if the new owner has not
//     written anything yet.
//   - Commit runs inside the handler's transaction, last. It advances the next
//     offset from the value this owner last saw to the end of the batch, only
//     if token and owner still match. When no row matches, the caller rolls
//     the whole transaction back and gets an error that matches ErrFenced.
//
// Both are single statements whose WHERE clause is the check: no read before
// the write, no lease timestamps, no wall clocks. The design note is
// docs/fencing.md in the repository.
//
// # The worker's protocol is not API
//
// Besides Claim and Commit, a Store has the methods that package consumer
// calls from a worker's lanes: Register, BumpIncarnation, CommitBatch,
// ResolveSession, EndStaleBlockers, HoldPartition, ClearStall,
// OpenHoldNeedingAck, CheckLayout, AddDeadLetter, PruneFenceLog,
// FenceLogCuts, Heartbeat, ForgetWorker and PruneWorkers. They are exported only because consumer is another package.
// Their order, arguments and meaning follow the protocol that
// docs/fencing.md describes and the model checks, and they change with it in
// any release: call them through package consumer, not directly. Each says
// so in its comment.
//
// The rest is the operator's API, what `tenure admin` and tests use to read
// and act on the fencing state: Get, List, OpenHold, OpenHolds,
// AcknowledgeHold, AcknowledgePartitions, ResetOffset, FenceLogAt,
// DeadLetters, DeadLetterByID, DeadLetterAt, DeadLettersIn, Replay,
// Discard, PruneFenceLogs, Incarnation, Workers, and Migrate with its
// companions.
package sink
