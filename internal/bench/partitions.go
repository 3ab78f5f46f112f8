package bench

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// partitionRun is one run of the partition dimension: the backlog over
// parts partitions, drained by workers tenure workers; when a third of it
// is committed, the first worker is killed (SIGKILL) and the others drain
// the rest. The workers run with --session-timeout 6s (the classic
// protocol's lowest), so that the group notices the death soon, and keep
// their whole fence log (the claims are read from it).
func (b *bench) partitionRun(ctx context.Context, parts, workers int) (PartitionRun, error) {
	out := PartitionRun{Partitions: parts, Workers: workers}
	name := fmt.Sprintf("dim%dp", parts)
	b.say("partition dimension: %d partitions, %d workers", parts, workers)
	topic, err := b.topicWithJobs(ctx, name, parts, b.jobs)
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
	defer func() {
		for _, p := range procs {
			p.stop()
		}
	}()
	db0 := b.postgresCPU(ctx)
	for i := range workers {
		args := append([]string{"worker", "--brokers", strings.Join(b.brokers, ","), "--group", group, "--topic", topic,
			"--database-url", b.dbURL, "--schema", s, "--handler", "ledger", "--no-migrate", "--log-level", "error",
			"--name", fmt.Sprintf("bench-%d", i), "--session-timeout", "6s", "--fence-log-max-age", "0", "--fence-log-max-entries", "0"},
			slices.Concat(b.kafkaArgs, b.workerFlags)...)
		p, err := startProc(nil, args...)
		if err != nil {
			return out, err
		}
		procs = append(procs, p)
	}
	if err := b.waitRows(ctx, s, "ledger", int64(b.jobs/3), procs); err != nil {
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
	killed := procs[0]
	_ = killed.Kill()
	var killAt time.Time
	if err := b.pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&killAt); err != nil {
		return out, err
	}
	q := pgx.Identifier{s, "ledger"}.Sanitize()
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
	if err := b.waitRows(ctx, s, "ledger", int64(b.jobs), procs[1:]); err != nil {
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
	// The hand-off: the partitions whose last commit before the kill was
	// the killed worker's and that had jobs left; for each, the time from
	// the kill to another worker's first commit on it.
	var handOff *float64
	if err := b.pool.QueryRow(ctx, `WITH last AS (
			SELECT DISTINCT ON (partition) partition, worker FROM `+q+` WHERE committed_at <= $1 ORDER BY partition, committed_at DESC, job_offset DESC),
		after AS (
			SELECT partition, min(committed_at) AS at FROM `+q+` WHERE committed_at > $1 AND worker <> $2 GROUP BY partition)
		SELECT count(*), extract(epoch FROM max(after.at - $1))::float8 FROM last JOIN after USING (partition) WHERE last.worker = $2`,
		killAt, "bench-0").Scan(&out.HandedOff, &handOff); err != nil {
		return out, err
	}
	if handOff != nil {
		out.HandOffSeconds = *handOff
	}
	if out.HandedOff == 0 {
		out.Note = "the killed worker held no partition with jobs left"
	}
	b.say("partition dimension, %d partitions: %.0f jobs/s, %.0f claims/s, hand-off %.1f s over %d partitions", parts, out.JobsPerSec, out.ClaimsPerSec, out.HandOffSeconds, out.HandedOff)
	return out, nil
}
