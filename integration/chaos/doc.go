// Package chaos is tenure's chaos run: a real broker (`tenure broker`, kfake
// persisted to disk), N >= 3 real `tenure worker` processes, a throwaway
// PostgreSQL cluster and a producer of keyed jobs, with faults injected at
// random (from a seed) for a bounded time.
//
// Every worker process runs in a network namespace of its own, one per
// worker slot (a worker restarted in its slot gets the slot's namespace
// again; internal/testinfra/netfault): forwarders on the namespace's 127.0.0.1 carry
// its connections to the broker's port and to the Postgres port (every host
// of the formation's multi-host URL with -chaos.postgres formation), so it
// dials the usual addresses, and nftables inside drops their packets when a
// network fault says so. The run needs root, iproute2 and nftables (it
// installs Debian's package if missing); where namespaces cannot be made it
// fails, it does not skip. The faults:
//
//   - pause: SIGSTOP of a worker for longer than the session timeout, then
//     SIGCONT (the worker wakes up as a zombie);
//   - pause-in-tx: the same, of a worker frozen inside its batch transaction
//     (--hold-once before-commit), holding the row locks of its exports,
//     freed by Postgres's idle-in-transaction timeout (idle-timeout) or, with
//     that timeout at 60s, by the new owner's lock watch (lock-watch);
//   - kill: SIGKILL of a worker, restarted a moment later;
//   - pg-restart: PostgreSQL stopped (fast or immediate) and started again;
//   - broker-restart: the broker stopped (SIGTERM or SIGKILL) and started
//     again on the same port and data directory;
//   - group-delete: the consumer group's lifetime ends (its epochs restart
//     at 1), in one of four modes: graceful (every worker stopped,
//     the group deleted, the workers started again), frozen (the same with
//     one worker SIGSTOPped throughout, woken once the new lifetime holds
//     every partition), live (every worker SIGKILLed, the group deleted the
//     moment it is empty) and expiry (the empty group's offsets expire and
//     the broker sweeps it: nobody deletes anything);
//   - delete-records: a burst of 20-60 jobs produced to one partition and
//     its log start moved into the middle of the burst (kadm DeleteRecords),
//     above the partition's stored next offset, so that jobs not processed
//     yet are deleted (deleterecords_test.go), in one of two modes: lagging
//     (the worker holding the partition, found from the fencing row's owner
//     and the members the workers logged, SIGSTOPped for 1-2s, under the
//     session timeout, around the burst and the deletion: it wakes up with a
//     fetch position below the log start) and live (nobody frozen: whether
//     the lane fetched the deleted jobs first is a race). A lane the log
//     moved under holds the partition as log-truncated; the harness plays
//     the operator: it acknowledges each such hold that names offsets it
//     deleted with `tenure admin holds acknowledge --actor chaos` (a
//     log-truncated hold it did not cause is a violation; one still open at
//     the end of the faults is a finding, acknowledged so that the drain
//     can finish);
//   - pg-failover, with -chaos.postgres formation (in place of pg-restart):
//     the run's PostgreSQL is a pg_auto_failover formation (a monitor, a
//     primary and a synchronous standby: internal/testinfra/pgha), everything connects
//     through its multi-host URL; the primary is killed (its keeper and every
//     Postgres process, SIGKILL), the standby promoted, the killed node
//     started again and back as a synchronous standby before the fault ends;
//     at least 20s between two of them (formation_test.go);
//   - partition-kafka: a worker cut off from the broker, both directions
//     (network_test.go): a live zombie, evicted by the coordinator after a
//     session timeout, that goes on committing what it had fetched until the
//     new owner's claim fences it;
//   - partition-postgres: a worker cut off from Postgres, both directions,
//     packets dropped (no reset: its connections half-open), in one of two
//     modes: cut (at whatever moment) and mid-commit (the worker restarted
//     with --hold-once before-commit, as pause-in-tx is, the cut made while
//     it holds its first batch, after its handler and before its fence and
//     COMMIT, then the hold released: the COMMIT goes out into the cut);
//   - partition-one-way: only the answers dropped (requests arrive and are
//     acted on), in one of three modes: kafka, postgres, and
//     postgres-mid-commit (as mid-commit, with the requests arriving: on a
//     connection that has the fence statement prepared, the fence and
//     COMMIT arrive and commit and their answer is lost; on a fresh one the
//     statement's prepare waits for its answer first and nothing commits);
//   - partition-full: both services cut at once, both directions: the
//     worker's host vanished;
//   - partition-multi-host: the worker restarted (once; its slot keeps the
//     URL for the rest of the run) with a multi-host database URL whose
//     first host is dead, postgres://127.0.0.2:P,127.0.0.1:P/...?
//     connect_timeout=3 (every namespace drops every packet to 127.0.0.2:
//     netfault's Blackhole; 3s is above the database probe's 2s budget),
//     then cut from Postgres as partition-postgres is, long or (two times in
//     three) an outage: it must work through the second host, step down in
//     an outage and join the group again once the database answers
//     (network_test.go);
//   - offsets-reset: `tenure admin offsets reset --execute --actor
//     chaos-reset` of one partition by 10-40 jobs, in one of four modes:
//     busy-back and busy-forward (traffic goes on) and idle-back and
//     idle-forward (the producer leaves the partition alone from before the
//     reset, once its lane has caught up, until the partition has moved
//     again or B and a second have passed: a lane with nothing to commit
//     must still notice the reset); back is --shift-by -N, forward
//     --to-offset into the middle of a burst produced while the worker that
//     holds the partition is frozen for a moment (under the session
//     timeout), so that the lane is behind; the history checker takes the
//     'reset' entries as the operator's record (jobs a reset skipped have
//     no effect, jobs it repeated one per commit that covered them), and
//     checkResets holds the fence log to exactly the resets the harness made
//     (offsetsreset_test.go);
//   - add-partitions: the topic grown by 1 or 2 partitions (`tenure admin
//     topic add-partitions`, at most twice a run) and the new count
//     acknowledged (`tenure admin topic acknowledge-partitions`) at once
//     (ack-first: before the workers can notice) or once a worker has
//     logged that it noticed (ack-after); the producer moves to the new
//     count as soon as its client has the new partitions, partitioning with
//     partition.For; the fault lasts until the acknowledgement, after which
//     the new partitions must be owned and moving within B like any other
//     (addpartitions_test.go; checkExports says what per-key checks still
//     hold once keys have moved);
//   - rolling-restart: every worker in turn stopped (SIGTERM, its exit
//     awaited) and started again, the next one once the restarted one has
//     claimed a partition (B at most); with -chaos.strict each comes back
//     with --strict toggled, so that the group mixes strict and plain
//     workers for the length of the roll, and a strict worker that is to
//     come back plain leaves a batch prepared on its way out (restarted
//     holding its first prepared batch before the offset commit, then
//     killed instead of stopped, as when a grace period runs out), which
//     whoever claims the partition next must decide (rolling_test.go);
//   - fault jobs, all along: about 1% of the jobs carry
//     "tenure-fault":"error" or "panic" and must end in the dead-letter table.
//
// Each network fault targets a worker that holds partitions and lasts a
// duration drawn from a band: short (1-2.5s, under the 3s session timeout),
// long (4-12s, over it) or, one cut in five of the kinds that cut Postgres
// alone, outage (15-35s: over the workers' database timeout, the default
// 10s, after which the worker steps down, leaves the group and joins again
// once the database answers; some over the 30s hand-off target); then the
// namespace heals. A network fault's mode reads "<mode> <band> <duration>".
// Faults come one at a time, as the others do: what overlaps is their
// recoveries (a rejoin, a connection waiting out its retransmissions) with
// the next faults.
//
// Afterwards the producer stops, the workers catch up with the log, and
// (check_test.go: checkAndReport, one method per check, in order) the
// whole history Postgres recorded (fence log, fencing rows, export versions,
// dead letters) goes through internal/history's checker, plus checks of its
// own: every record in the log was exported or dead-lettered exactly once,
// fault jobs were dead-lettered and nothing else was, every acknowledged job
// is in the log, every commit a worker logged is in the fence log and no
// rejected batch is, and each key's final export is its newest job. The
// offsets the harness deleted are not the log's: every acknowledged job
// there must have been processed exactly once (its lane had fetched it
// before the deletion) or be inside the range a log-truncated hold declared
// lost and the harness acknowledged, never both and never neither (a job
// "skipped in silence"); the checks above leave exactly those offsets out
// (kfake, SIGKILLed, can bring deleted records back: its log start is only
// saved by a clean shutdown). The
// fence log is also checked against the coordinator's side
// (history.CheckOwnership over the assignments every worker logged): once a
// newer assignment's claim was accepted, nothing of an older one may be,
// whatever the tokens say. The summary gives the jobs, the faults by kind
// (group resets, deletions and network faults by mode), the deleted jobs
// (processed before the deletion, reported lost by holds, skipped in
// silence: must be 0), the rejections observed, the violations (must be 0),
// the time to recover from each kind of fault, the hand-off latency of
// kills and pauses, the network faults' own measures (below), the offsets
// resets, the topic's growths, the rolling restarts and the liveness
// check's wedges and stalls.
//
// The liveness check (liveness_test.go, which says it in full): every
// second, per partition, the log's end, the stored next offset and the open
// holds are sampled; a partition is waiting when its next offset is below
// the log's end, and a stall is the time it waits at one next offset. The
// bound is B = session timeout + claim timeout + margin (a rebalance
// timeout and the lanes' longest retry backoff), read from the worker
// command line the harness builds: 3s + 30s + (10s + 5s) = 48s. A stall's
// clock runs only in quiet time (not while a fault's function runs, from
// its start to its fault's end, nor during its recovery allowance after:
// as long again as a network cut lasted, none for the others; so in the
// gaps between faults, in a fault's quiet tail such as offsets-reset's idle
// wait, and after the schedule, the drain included) and not while the
// partition is held with a reason the run expected (a log-truncated hold
// of the harness's own deletion until it acknowledges it, an ahead-of-log
// hold after a broker SIGKILL). A stall whose clock passes B is a wedge: a
// violation, reported when seen with the partition, the stall, what
// consumer.Describe (tenure admin assignments) says of it then and the
// workers' last lines about it. So is a worker that stepped down and has
// not joined the group again after B of quiet time. The drain must catch
// up within B of the start of the last quiet window. The summary gives the
// wedges and, per fault kind, the longest stall attributed to the fault
// injected last before it began, with its quiet part.
//
// A violation (a broken promise) fails the test. A finding is something the
// guarantee allows but that deserves a look: a good job dead-lettered, a
// process that died on its own, a worker that would not stop on SIGTERM (it
// then gets SIGQUIT, so that its log ends with a goroutine dump). Findings
// are listed in the test log and keep the logs directory.
//
// Recovery time of a fault: once the fault is in effect (the worker stopped
// or dead, the server down, the group's workers stopped, the records
// deleted) the harness produces one marker job to every partition; the
// fault has recovered when every partition's stored next offset is past its
// marker (after a deletion, that includes the hold and the harness's
// acknowledgement of it). It is measured from injection (SIGSTOP, SIGKILL,
// the server stop, the first SIGTERM, a deletion's start, a cut in force)
// and from the end of the fault (SIGCONT, the restart, the workers started
// again, the deletion done, the heal); a pause often recovers before its
// end, as the group moves the partitions after one session timeout, and so
// does a long cut.
//
// The summary goes to the test log and to stdout; `go test` shows a passing
// package's output only with -v.
//
// Hand-off latency of a kill, pause or pause-in-tx: for each partition the
// target held at the fault (its last accepted claim before it), the time
// from the SIGKILL or SIGSTOP to the partition's first commit by another
// claim, by the fence log's commit times: tenure's side, so the producer's
// own stalls do not count. The target is at most the session
// timeout + 2s; it is measured and printed, not asserted. A hand-off during
// which another fault was injected (a Postgres restart the new owner waits
// for) is counted as overlapped, and one above the target is a finding that
// names the faults that overlapped it.
//
// Network faults, per kind and mode (network_test.go): the cuts by band; the
// hand-off of each partition the target held at the cut, from the cut to the
// first commit by another claim (fence log), p50/p99/max, against a target
// of 30s for a cut from Postgres alone (the database watch hands off: the
// database timeout, a probe, the rebalance, the claim, a batch) and of the
// session timeout + 2s for a cut from the broker (the coordinator evicts);
// a partition its holder kept through a cut longer than the target misses
// it too, and a cut that ended before the hand-off (the holder committed
// the partition again first: nothing moved) is counted as stayed. A miss is
// a finding, as for kills and pauses: the bound is a promise about
// liveness, asserted where it is measured alone (integration/network_test.go),
// while here other faults' recoveries overlap. Step-downs of the database
// watch ("stepped_down":true) and rejoins (consumer.MsgRejoining): a cut
// from Postgres longer than the database timeout + 4s must make its target
// step down and join again within 30s of the heal, one shorter than the
// timeout - 4s must not, nor must a cut from the broker alone; each
// exception is a finding, as is a step-down no cut explains (but after a
// pg-restart or pg-failover: a database down for every worker). For a cut
// from the broker, the zombie: commits of the claims it held accepted after
// the cut, its batches fenced ("batch rejected: fenced"), how long after the
// cut it kept trying (its last commit or rejection), and when kgo told it
// that it had lost its partitions. For the mid-commit modes, whether the
// held batch committed and the commits of unknown outcome the worker
// resolved. And the workers' Postgres sessions and the live processes,
// sampled every second, to see that nothing piles up (a session whose
// client vanished in a cut lasts until a keepalive or a timeout ends it),
// with the namespaces checked gone at the end.
//
// Run the short run (part of `go test ./...`; about 2 minutes, at most 3 on
// two cores unless something is stuck):
//
//	go test ./integration/chaos -run TestChaos -v
//
// scripts/test.sh runs four of 60s of faults (classic, KIP-848, a
// formation, strict) with every kind, and one of 60s with the newest kinds
// alone (offsets-reset, add-partitions, rolling-restart,
// partition-multi-host; strict, so that the roll mixes strict and plain
// workers), so that each of them is dealt in every CI run. The soak (30
// minutes of faults, `make chaos-soak CHAOS_DURATION=30m CHAOS_PROTOCOL=classic`;
// go test's default 10-minute timeout must be lifted):
//
//	go test ./integration/chaos -run TestChaos -v -timeout 0 -chaos.soak
//
// Flags (environment variables in brackets): -chaos.duration [TENURE_CHAOS_DURATION]
// (default 90s, 30m with -chaos.soak), -chaos.workers [TENURE_CHAOS_WORKERS]
// (default 3), -chaos.seed [TENURE_CHAOS_SEED] (default: from the clock;
// printed in the summary's first and last lines, the last being the command
// that replays the run's fault schedule),
// -chaos.soak [TENURE_CHAOS_SOAK], -chaos.postgres [TENURE_CHAOS_POSTGRES]
// (single, the default, or formation: needs pg_autoctl, which
// scripts/test.sh installs), -chaos.rate [TENURE_CHAOS_RATE] (jobs per
// second, default 100), -chaos.protocol [TENURE_CHAOS_PROTOCOL] (classic or
// consumer), -chaos.strict [TENURE_CHAOS_STRICT] (workers run with --strict
// on a server with prepared transactions, and the run also checks G3-strict
// with history.CheckStrict: classic protocol and a single server only),
// -chaos.keep [TENURE_CHAOS_KEEP] (keep the logs directory even when the run
// passes; it is always kept when it fails), -chaos.kinds
// [TENURE_CHAOS_KINDS] (deal only the fault kinds listed, comma separated,
// as often as the full deck does: scripts/test.sh's run of the newest
// kinds).
//
// A seed fixes the schedule (which fault, which worker, how long) and the
// jobs' keys and faults; the timing of real processes still varies from run
// to run.
package chaos
