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
// # What is API
//
// Everything this package exports is API, and stable: it changes only in a
// compatible way, or with a CHANGELOG.md entry that says how.
//
//   - the operator's API, what `tenure admin` and an operator's own program
//     use to read and act on the fencing state: Store's Get, List, OpenHold,
//     OpenHolds, AcknowledgeHold, AcknowledgePartitions, Layouts,
//     ResetOffset, TopicIDs, FenceLog, FenceLogAt, Claims, Groups,
//     KnownGroups, KnownTopics,
//     PruneFenceLogs, DeadLetters, DeadLetterByID, DeadLetterAt,
//     DeadLettersIn, DeadLetterCounts, DeadLetterActions, Replay, Discard,
//     Incarnation, Workers and Now; Migrate with its companions; the checks
//     (CheckSchema, CheckPreparedTransactions, ReplicationOf);
//   - what a handler and the program that runs a worker need: the types a
//     batch carries (Partition, Token), the errors to match (ErrFenced and
//     the others), ReadPartitionLog, and the store's settings (SetPooled,
//     SetPreparedRole);
//   - Claim and Commit, the two statements above, for a program that fences
//     its own work.
//
// # The worker's protocol is not
//
// The steps package consumer takes around Claim and Commit (registering
// epochs, the pipelined commit and the resolution of an unknown outcome,
// holds and stalls, the layout check, dead-lettering, heartbeats, strict
// mode's prepared batches, pruning a lane's fence log) are not exported: they
// live in tenure's internal package fence, which runs them on the same
// Store, and they change with the protocol that docs/fencing.md describes
// and the model checks, in any release. Many of this package's types are
// aliases of that package's, so a value passes between the two unchanged.
package sink
