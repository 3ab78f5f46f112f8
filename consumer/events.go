package consumer

// The messages of a worker's ownership events. They are a contract: the
// history checker (the coordinator's side of a partition's history), the
// chaos run's logbook, the demo and the tests find events by them, so each
// is written once, here. Every event of a partition is logged by its lane's
// logger, with the partition's topic and partition, the member, and the
// lane's claim id; observe.go lists the fields of each.
const (
	// MsgPartitionsAssigned: the group gave this member partitions (member,
	// epoch, partitions).
	MsgPartitionsAssigned = "partitions assigned"
	// MsgClaiming: a lane starts claiming a partition it was assigned
	// (member_epoch, start_offset): the coordinator's side of the history.
	MsgClaiming = "claiming partition"
	// MsgClaimed: the claim was accepted (token, next_offset).
	MsgClaimed = "partition claimed"
	// MsgClaimFenced: the claim was rejected (claim_token, held_by).
	MsgClaimFenced = "claim rejected: fenced"
	// MsgClaimFailed: a claim could not be made for another reason (the
	// database, a lock the claim cannot end, a prepared batch this worker
	// may not finish, the claim timeout): the partition waits, paused and
	// recorded as stalled with the reason, and its lane claims it again by
	// itself (MsgStalled, MsgRecovered). The group session goes on.
	MsgClaimFailed = "claim failed: the partition waits, held as stalled, and its lane claims it again by itself"
	// MsgRecovered: a lane claimed its partition again after a rejection.
	MsgRecovered = "partition claimed again: processing resumes"
	// MsgBatchFenced: the fence rejected a batch (from, to).
	MsgBatchFenced = "batch rejected: fenced; dropping this partition's buffered records and checking whether this member still holds it"
	// MsgStalled: the member holds the partition but cannot claim it.
	MsgStalled = "partition stalled: this member holds it but cannot claim it; trying again"
	// MsgRevoked, MsgLost, MsgReleased: a lane has stopped (token,
	// next_offset) after a revoke, a loss, or a graceful stop.
	MsgRevoked  = "partition revoked"
	MsgLost     = "partition lost"
	MsgReleased = "partition released: worker stopping"
	// MsgHeldForLog and MsgHeldDiverged: a partition held for an operator
	// (hold, reason, next_offset, and the log's or the acknowledged
	// offsets).
	MsgHeldForLog   = "partition held: its stored offsets do not fit the log; waiting for an operator to run `"
	MsgHeldDiverged = "partition held: the database is behind what this group had acknowledged (it lost commits); waiting for an operator to run `"
	// IncarnationMovedOn: a claim of this worker moved the group's
	// incarnation on (why: a reset of the group's epochs, or a tie).
	IncarnationMovedOn = "incarnation moved on"
	// MsgPartitionCountChanged: a topic's partition count in Kafka changed
	// (topic, from, to); the worker refreshes its metadata at once, so that
	// the group assigns the new partitions.
	MsgPartitionCountChanged = "topic partition count changed in Kafka: refreshing metadata"
	// MsgSteppedDown and MsgRejoining: the worker left the group because its
	// database did not answer, and joins again now that it does.
	MsgSteppedDown = "worker stepped down: it holds no partitions until its database answers"
	MsgRejoining   = "the database answers again: joining the group"

	// Strict hand-off (Config.Strict). MsgStrictPrepared: a batch is
	// prepared (gid, from, to). MsgStrictSent: its offset commit is sent
	// (gid, commit_member, generation, offset, attempt, sent_at_ms);
	// MsgStrictAnswered: the coordinator's answer (gid, accepted,
	// generation, attempt). MsgStrictDecided: the lane committed or rolled
	// back its batch (gid, committed, decided_by, evidence);
	// MsgStrictResolved: a claim decided an older lane's prepared batch
	// (gid, committed, batch_token, batch_claim_id, evidence);
	// MsgStrictLeftPrepared: a stopped lane left its batch prepared, the
	// answer unknown. MsgAssignmentEnded: the group revoked the partition
	// from this lane, or the member lost it (why): the end of the lane's
	// assignment in the coordinator's timeline, for the history checker.
	MsgStrictPrepared     = "strict batch prepared"
	MsgStrictSent         = "strict offset commit sent"
	MsgStrictAnswered     = "strict offset commit answered"
	MsgStrictDecided      = "strict batch decided"
	MsgStrictResolved     = "prepared batch of an older claim resolved"
	MsgStrictLeftPrepared = "strict batch left prepared: the coordinator's answer is unknown; the next claim of the partition decides it"
	MsgAssignmentEnded    = "partition's assignment ended"
)
