package bench

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// partitionRun is one run of the partition dimension: workers tenure
// workers join a group on an empty topic of parts partitions; once each of
// them holds some, the backlog is produced; when a third of it is
// committed, the worker that holds the most partitions is killed (SIGKILL)
// and the others drain the rest. The workers run with --session-timeout 6s
// (the classic protocol's lowest), so that the group notices the death
// soon, and --rebalance-timeout 10s (a member that dies in the middle of a
// rebalance holds the group up to it), and keep their whole fence log (the
// claims are read from it).
//
// Producing before the group settles measured something else: the first
// worker to join drained much of the backlog alone, and the one killed
// (the first started, not necessarily the first to join) could hold
// nothing, or die in the middle of its join and stall the group for the
// whole default rebalance timeout.
func (b *bench) partitionRun(ctx context.Context, parts, workers int) (PartitionRun, error) {
	out := PartitionRun{Partitions: parts, Workers: workers}
	name := fmt.Sprintf("dim%dp", parts)
	b.say("partition dimension: %d partitions, %d workers", parts, workers)
	topic, err := b.topic(ctx, name, parts)
	if err != nil {
		return out, err
	}
	s, err := b.schema(ctx, name)
	if err != nil {
		return out, err
	}
	defer b.dropSchema(s)
	group := b.group(name)
	var procs []*proc
	var names []string // procs[i] runs with --name names[i]
	defer func() {
		for _, p := range procs {
			p.stop()
		}
	}()
	db0 := b.postgresCPU(ctx)
	for i := range workers {
		args := append([]string{"worker", "--brokers", strings.Join(b.brokers, ","), "--group", group, "--topic", topic,
			"--database-url", b.dbURL, "--schema", s, "--handler", "ledger", "--no-migrate", "--log-level", "error",
			"--name", fmt.Sprintf("bench-%d", i), "--session-timeout", "6s", "--rebalance-timeout", "10s",
			"--fence-log-max-age", "-1s", "--fence-log-max-entries", "-1"},
			slices.Concat(b.kafkaArgs, b.workerFlags)...)
		p, err := startProc(nil, args...)
		if err != nil {
			return out, err
		}
		procs = append(procs, p)
		names = append(names, fmt.Sprintf("bench-%d", i))
	}
	fences := pgx.Identifier{s, "fences"}.Sanitize()
	q := pgx.Identifier{s, "ledger"}.Sanitize()
	settle := time.Now()
	for {
		var claimed, owners int
		if err := b.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT owner) FROM `+fences+` WHERE topic = $1`, topic).Scan(&claimed, &owners); err != nil {
			return out, err
		}
		if claimed == parts && owners >= min(workers, parts) {
			break
		}
		if time.Since(settle) > 2*time.Minute {
			return out, fmt.Errorf("%d partitions, %d workers: after 2 minutes %d partitions are claimed by %d members", parts, workers, claimed, owners)
		}
		for _, p := range procs {
			if p.Exited() {
				return out, fmt.Errorf("a worker exited before the group settled: %s", p.lastOutput())
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The backlog is produced while the workers drain it: producing first
	// and waiting for it would let them drain most of it meanwhile (the
	// producer is not much faster than three workers), and the kill would
	// come after the third.
	produced := make(chan error, 1)
	go func() { produced <- b.produce(ctx, topic, b.jobs) }()
	defer func() {
		if produced != nil {
			<-produced
		}
	}()
	// A third of the way, by the fencing rows' next offsets: exact and
	// cheap (a row per partition), where the table's statistics lag by a
	// second, a sixth of the backlog at these rates.
	if err := b.wait(ctx, s, "ledger", int64(b.jobs/3), procs, func(ctx context.Context) (n int64, err error) {
		err = b.pool.QueryRow(ctx, `SELECT coalesce(sum(next_offset), 0) FROM `+fences+` WHERE topic = $1`, topic).Scan(&n)
		return n, err
	}); err != nil {
		return out, err
	}
	// Up to the kill: CPU, peak RSS, rows.
	var cpu float64
	for _, p := range procs {
		c, rss := p.usage()
		cpu += c
		out.PeakRSSMB = max(out.PeakRSSMB, rss)
	}
	db1 := b.postgresCPU(ctx)
	// The victim: the worker whose members hold the most partitions now
	// (a fencing row's owner is a member id, the coordinator's; its
	// worker is the one that wrote ledger rows at the row's token; a
	// partition its owner has not committed on yet does not count).
	var victim string
	if err := b.pool.QueryRow(ctx, `SELECT coalesce((SELECT l.worker FROM `+fences+` f
			JOIN (SELECT DISTINCT partition, incarnation, epoch, worker FROM `+q+` WHERE topic = $1) l USING (partition, incarnation, epoch)
			WHERE f.topic = $1 GROUP BY l.worker ORDER BY count(*) DESC, l.worker LIMIT 1), '')`, topic).Scan(&victim); err != nil {
		return out, err
	}
	k := max(0, slices.Index(names, victim))
	killed, survivors := procs[k], slices.Delete(slices.Clone(procs), k, k+1)
	victim = names[k]
	_ = killed.Kill() // by its PID; returns once it has exited
	var killAt time.Time
	if err := b.pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&killAt); err != nil {
		return out, err
	}
	var n int64
	var first, last time.Time
	if err := b.pool.QueryRow(ctx, `SELECT count(*), min(committed_at), max(committed_at) FROM `+q+` WHERE committed_at <= $1`, killAt).Scan(&n, &first, &last); err != nil {
		return out, err
	}
	if span := last.Sub(first).Seconds(); span > 0 {
		out.JobsPerSec = float64(n) / span
	}
	out.CPUPerMJobs = cpu / float64(n) * 1e6
	if db0.ok && db1.ok {
		v := (db1.seconds - db0.seconds) / float64(n) * 1e6
		out.DBCPUPerMJobs = &v
	}
	err, produced = <-produced, nil
	if err != nil {
		return out, err
	}
	if err := b.waitRows(ctx, s, "ledger", int64(b.jobs), survivors); err != nil {
		return out, err
	}
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+q).Scan(&out.Jobs); err != nil {
		return out, err
	}
	// Claims at start-up: every partition's first claim, over the time from
	// the first to the last of them.
	var claimed int
	var span *float64
	if err := b.pool.QueryRow(ctx, `SELECT count(*), extract(epoch FROM max(at) - min(at))::float8 FROM (
			SELECT partition, min(at) AS at FROM `+pgx.Identifier{s, "fence_log"}.Sanitize()+`
			WHERE kind = 'claim' AND topic = $1 GROUP BY partition) f`, topic).Scan(&claimed, &span); err != nil {
		return out, err
	}
	if span != nil && *span > 0 {
		out.ClaimsPerSec = float64(claimed) / *span
	}
	// The hand-off. The killed worker's partitions are those whose last
	// claim before the kill was one of its members' (a member id is the
	// coordinator's, not the worker's name: the killed worker's are the
	// owners of the claims at whose tokens it wrote ledger rows; the ledger
	// has no index, so one scan, not a lookup per entry). Counting by the
	// last commit instead misses every partition it claimed but had not
	// committed on yet, which with hundreds of partitions is most of them.
	// For each of them that had jobs left, the time from the kill to
	// another member's first commit on it.
	fl := pgx.Identifier{s, "fence_log"}.Sanitize()
	var handOff, claimedAt *float64
	if err := b.pool.QueryRow(ctx, `WITH killed AS (
			SELECT DISTINCT c.owner FROM `+fl+` c
			JOIN (SELECT DISTINCT partition, incarnation, epoch FROM `+q+` WHERE topic = $3 AND worker = $2) l USING (partition, incarnation, epoch)
			WHERE c.kind = 'claim' AND c.topic = $3),
		held AS (
			SELECT DISTINCT ON (partition) partition, owner FROM `+fl+`
			WHERE kind = 'claim' AND topic = $3 AND at <= $1 ORDER BY partition, id DESC),
		after AS (
			SELECT partition, min(at) AS at FROM `+fl+`
			WHERE kind = 'commit' AND topic = $3 AND at > $1 AND owner NOT IN (SELECT owner FROM killed) GROUP BY partition),
		claimed AS (
			SELECT partition, min(at) AS at FROM `+fl+`
			WHERE kind = 'claim' AND topic = $3 AND at > $1 AND owner NOT IN (SELECT owner FROM killed) GROUP BY partition)
		SELECT count(*), count(after.at), extract(epoch FROM max(after.at - $1))::float8,
			extract(epoch FROM max(claimed.at - $1) FILTER (WHERE after.at IS NOT NULL))::float8
		FROM held LEFT JOIN after USING (partition) LEFT JOIN claimed USING (partition) WHERE held.owner IN (SELECT owner FROM killed)`,
		killAt, victim, topic).Scan(&out.Held, &out.HandedOff, &handOff, &claimedAt); err != nil {
		return out, err
	}
	if handOff != nil {
		out.HandOffSeconds = *handOff
	}
	if claimedAt != nil {
		out.HandOffClaimSeconds = *claimedAt
	}
	if out.HandedOff == 0 {
		out.Note = fmt.Sprintf("none of the %d partitions the killed worker held had jobs left", out.Held)
	}
	b.say("partition dimension, %d partitions: %.0f jobs/s, %.0f claims/s, hand-off %.1f s (claimed within %.1f s) over %d of the %d partitions %s held when killed after %d of %d jobs", parts, out.JobsPerSec, out.ClaimsPerSec, out.HandOffSeconds, out.HandOffClaimSeconds, out.HandedOff, out.Held, victim, n, b.jobs)
	return out, nil
}
