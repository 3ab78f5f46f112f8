package consumer

import "sync/atomic"

// Stats are a worker's counters since it started, for metrics endpoints and
// tests. All fields are totals except Lanes and LanesHalted.
type Stats struct {
	Claims         int64 // partitions claimed
	ClaimsRejected int64 // claims refused by the fence or the coordinator
	// ClaimsFailed counts claims that could not be made (the database, a
	// lock the claim cannot end, a prepared batch it may not finish, the
	// claim timeout): each partition is held as stalled and its lane
	// claims it again by itself.
	ClaimsFailed    int64
	Batches         int64 // batches committed
	Records         int64 // records committed (dead letters included)
	BatchesFenced   int64 // batches rejected by the fence
	DeadLetters     int64 // jobs parked in the dead-letter table
	HandlerFailures int64 // handler failures counted against jobs: errors, panics and timeouts
	// HandlerTransient counts handler failures retried without counting
	// against the jobs: Transient errors, and lock timeouts, deadlocks and
	// serialization failures of the handler's statements.
	HandlerTransient int64
	// HandlerEnvironment counts handler failures whose SQLSTATE says the
	// environment is wrong (missing table or column, permission, read-only
	// or stopping server): the partition stalls, nothing is dead-lettered.
	HandlerEnvironment int64
	// HandlerBugs counts batches whose handler ended its own transaction
	// (ErrHandlerEndedTx); each halts its partition.
	HandlerBugs int64
	// LanesHalted is the number of partitions this worker holds but does not
	// process because they wait for an operator (sink.Hold: a handler bug,
	// offsets that do not fit the log); a gauge, like Lanes.
	LanesHalted int64
	// FenceLogPruned counts fence log entries this worker pruned
	// (Config.FenceLogRetention).
	FenceLogPruned int64
	Retries        int64 // batch attempts after a failure of any kind
	Resets         int64 // incarnation bumps made by this worker
	Lanes          int64 // partitions being processed now
	Recoveries     int64 // partitions claimed again after a rejection, by the lane itself
	Stalled        int64 // partitions recovering now (claim or commit rejected, not yet claimed again)
	JobsLost       int64 // jobs deleted from the log before they were processed (found below the log start)
	// StaleSessionsEnded counts sessions of older owners of a partition
	// that held locks a batch waited for, ended by the lock watch.
	StaleSessionsEnded int64
	// Divergences counts partitions found with a stored offset below one
	// already acknowledged (the database lost commits); each is held.
	Divergences int64
	// StepDowns counts the times this worker gave its partitions up because
	// its database did not answer for Config.DatabaseTimeout; SteppedDown
	// is 1 while it is out of the group for that reason (a gauge).
	StepDowns, SteppedDown int64
	// BufferedBytes is what the lanes hold now, ahead of their handlers
	// and in the batches being handled (keys, values, headers and a
	// record's own size; a gauge), bounded by Config.WorkerBufferBytes plus
	// one poll's records. BufferedBytesPeak is the most they held at once
	// since the worker started.
	BufferedBytes, BufferedBytesPeak int64
	// GroupWatchErrors counts group watches (Stuck) that failed.
	GroupWatchErrors int64
}

type counters struct {
	claims, claimsRejected, batches, records, batchesFenced atomic.Int64
	deadLetters, handlerFailures, retries, resets, lanes    atomic.Int64
	handlerTransient, handlerEnvironment, handlerBugs       atomic.Int64
	lanesHalted, fenceLogPruned, strictResolved             atomic.Int64
	recoveries, stalled, jobsLost, staleSessionsEnded       atomic.Int64
	divergences, stepDowns, claimsFailed                    atomic.Int64
}

// Stats returns a snapshot of the counters.
func (c *Consumer) Stats() Stats {
	s := &c.stats
	return Stats{
		Claims: s.claims.Load(), ClaimsRejected: s.claimsRejected.Load(), ClaimsFailed: s.claimsFailed.Load(),
		Batches: s.batches.Load(), Records: s.records.Load(), BatchesFenced: s.batchesFenced.Load(),
		DeadLetters: s.deadLetters.Load(), HandlerFailures: s.handlerFailures.Load(),
		HandlerTransient: s.handlerTransient.Load(), HandlerEnvironment: s.handlerEnvironment.Load(),
		HandlerBugs: s.handlerBugs.Load(), LanesHalted: s.lanesHalted.Load(), FenceLogPruned: s.fenceLogPruned.Load(),
		Retries: s.retries.Load(), Resets: s.resets.Load(), Lanes: s.lanes.Load(),
		Recoveries: s.recoveries.Load(), Stalled: s.stalled.Load(), JobsLost: s.jobsLost.Load(),
		StaleSessionsEnded: s.staleSessionsEnded.Load(), Divergences: s.divergences.Load(),
		StepDowns: s.stepDowns.Load(), SteppedDown: b2i(c.db.down.Load()),
		BufferedBytes: c.buffered.Load(), BufferedBytesPeak: c.bufferedPeak.Load(), GroupWatchErrors: c.watch.errors.Load(),
	}
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}
