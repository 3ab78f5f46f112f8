package bench

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/tenure-dev/tenure/sink"
)

// partitionRun is one run of the partition dimension: workers tenure
// workers join a group on an empty topic of parts partitions; once each of
// them holds some, the backlog is produced behind a gate (gatedBacklog)
// and the gate opened; when a third of it is
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
func (b *bench) partitionRun(ctx context.Context, parts, workers, round int) (PartitionRun, error) {
	out := PartitionRun{Partitions: parts, Workers: workers, Round: round}
	name := fmt.Sprintf("dim%dpr%d", parts, round)
	b.say("partition dimension, round %d: tenure, %d partitions, %d workers", round+1, parts, workers)
	topic, err := b.topic(ctx, name, parts)
	if err != nil {
		return out, err
	}
	defer b.dropTopics(topic) // the development broker keeps every record in memory
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
	for i := range workers {
		args := append([]string{"worker", "--brokers", strings.Join(b.brokers, ","), "--group", group, "--topic", topic,
			"--database-url", b.dbURL, "--schema", s, "--handler", "ledger", "--no-migrate", "--log-level", "error",
			"--name", fmt.Sprintf("bench-%d", i), "--session-timeout", dimSessionTimeout.String(), "--rebalance-timeout", "10s",
			"--fence-log-max-age", "-1s", "--fence-log-max-entries", "-1"},
			slices.Concat(b.kafkaArgs, b.workerFlags)...)
		p, err := startProc(nil, args...)
		if err != nil {
			return out, err
		}
		procs = append(procs, p)
		names = append(names, fmt.Sprintf("bench-%d", i))
	}
	q := pgx.Identifier{s, "ledger"}.Sanitize()
	store, err := sink.NewStore(b.pool, s)
	if err != nil {
		return out, err
	}
	// fencesOf reads the fencing rows of the run's topic (the schema holds
	// only the run's group).
	fencesOf := func(ctx context.Context) ([]sink.Fence, error) {
		all, err := store.List(ctx, group)
		return slices.DeleteFunc(all, func(f sink.Fence) bool { return f.Topic != topic }), err
	}
	// Settled: every partition claimed, by as many members as workers.
	base, gated, note, err := b.gatedBacklog(ctx, procs, s, func() (bool, string, error) {
		fences, err := fencesOf(ctx)
		owners := map[string]bool{}
		for _, f := range fences {
			owners[f.Owner] = true
		}
		return len(fences) == parts && len(owners) >= min(workers, parts),
			fmt.Sprintf("%d partitions, %d workers: %d partitions are claimed by %d members", parts, workers, len(fences), len(owners)), err
	}, b.backlogTo(topic))
	if err != nil {
		return out, err
	}
	out.GatedSeconds, out.Note = gated, note
	// A third of the way, by the fencing rows' next offsets: exact and
	// cheap (a row per partition), where the table's statistics lag by a
	// second, a sixth of the backlog at these rates.
	if err := b.wait(ctx, s, "ledger", int64(b.dimJobs/3), procs, func(ctx context.Context) (n int64, err error) {
		fences, err := fencesOf(ctx)
		for _, f := range fences {
			n += f.NextOffset
		}
		return n, err
	}); err != nil {
		return out, err
	}
	// Up to the kill: CPU since the group settled, peak RSS, rows.
	cpu, db, peak := base.since(ctx, b, procs)
	out.PeakRSSMB = max(out.PeakRSSMB, peak)
	// The victim: the worker whose members hold the most partitions now.
	victim, err := b.victim(ctx, q, topic, fencesOf)
	if err != nil {
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
	out.JobsToKill = n
	out.CPUPerMJobs = cpu / float64(n) * 1e6
	if db != nil {
		v := *db / float64(n) * 1e6
		out.DBCPUPerMJobs = &v
	}
	if err := b.waitRows(ctx, s, "ledger", int64(b.dimJobs), survivors); err != nil {
		return out, err
	}
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+q).Scan(&out.Jobs); err != nil {
		return out, err
	}
	// Claims at start-up: every partition's first claim, over the time from
	// the first to the last of them.
	log, err := store.FenceLog(ctx, group)
	if err != nil {
		return out, err
	}
	log = slices.DeleteFunc(log, func(e sink.FenceLogEntry) bool { return e.Partition.Topic != topic })
	firstClaim := map[int32]time.Time{}
	for _, e := range log {
		if at, ok := firstClaim[e.Partition.Partition]; e.Kind == "claim" && (!ok || e.At.Before(at)) {
			firstClaim[e.Partition.Partition] = e.At
		}
	}
	var firstAt, lastAt time.Time
	for _, at := range firstClaim {
		if firstAt.IsZero() || at.Before(firstAt) {
			firstAt = at
		}
		if at.After(lastAt) {
			lastAt = at
		}
	}
	if span := lastAt.Sub(firstAt).Seconds(); len(firstClaim) > 0 && span > 0 {
		out.ClaimsPerSec = float64(len(firstClaim)) / span
	}
	// The hand-off, from the fence log.
	handOff, claimedAt, err := b.handOff(ctx, q, topic, victim, killAt, log, &out)
	if err != nil {
		return out, err
	}
	if handOff != nil {
		out.HandOffSeconds = *handOff
	}
	if claimedAt != nil {
		out.HandOffClaimSeconds = *claimedAt
	}
	if out.HandedOff == 0 {
		out.Note = joinNotes(out.Note, fmt.Sprintf("none of the %d partitions the killed worker held had jobs left", out.Held))
	}
	b.say("partition dimension, %d partitions: %.0f jobs/s, %.0f claims/s, hand-off %.1f s (claimed within %.1f s) over %d of the %d partitions %s held when killed after %d of %d jobs", parts, out.JobsPerSec, out.ClaimsPerSec, out.HandOffSeconds, out.HandOffClaimSeconds, out.HandedOff, out.Held, victim, n, b.dimJobs)
	return out, nil
}

// dimSessionTimeout is the partition dimension's --session-timeout (the
// classic protocol's lowest): the hand-off target is this plus 2 s.
const dimSessionTimeout = 6 * time.Second

// aloPartitionRun is the at-least-once program's run beside partitionRun's:
// workers `bench-child alo --per-poll` processes in one consumer group (one
// COPY per poll across partitions, what a user with many partitions would
// write), on a topic of its own of parts partitions, the same backlog
// produced behind the same gate once the group has settled, measured the same way up to a third
// of it (rate, the processes' and the server's CPU per job, the largest
// peak RSS); then they are stopped. Nothing is killed: the program has no
// hand-off to measure (a crash repeats its batches).
func (b *bench) aloPartitionRun(ctx context.Context, parts, workers, round int) (Result, error) {
	name := fmt.Sprintf("alodim%dpr%d", parts, round)
	b.say("partition dimension, round %d: at-least-once, %d partitions, %d processes", round+1, parts, workers)
	topic, err := b.topic(ctx, name, parts)
	if err != nil {
		return Result{}, err
	}
	defer b.dropTopics(topic)
	s, err := b.schema(ctx, name)
	if err != nil {
		return Result{}, err
	}
	defer b.dropSchema(s)
	group := b.group(name)
	var procs []*proc
	defer func() {
		for _, p := range procs {
			p.stop()
		}
	}()
	for range workers {
		p, err := startProc(nil, append([]string{"bench-child", "alo", "--per-poll", "--brokers", strings.Join(b.brokers, ","), "--group", group,
			"--topic", topic, "--database-url", b.dbURL, "--schema", s, "--jobs", "0"}, b.kafkaArgs...)...)
		if err != nil {
			return Result{}, err
		}
		procs = append(procs, p)
	}
	// Settled: every process a member with partitions, all of them assigned
	// (the group's view: the program has no fencing rows to read).
	adm := kadm.NewClient(b.cl)
	base, gated, note, err := b.gatedBacklog(ctx, procs, s, func() (bool, string, error) {
		members, assigned, err := groupAssignment(ctx, adm, group, topic)
		return members >= workers && assigned == parts,
			fmt.Sprintf("%d partitions, %d processes: the group has %d members holding %d partitions", parts, workers, members, assigned), err
	}, b.backlogTo(topic))
	if err != nil {
		return Result{}, err
	}
	// A third of the way by the group's committed offsets (after the rows:
	// never ahead of them), read from the broker so that the server whose
	// CPU is measured is not asked.
	if err := b.wait(ctx, s, "ledger", int64(b.dimJobs/3), procs, func(ctx context.Context) (n int64, err error) {
		offs, err := adm.FetchOffsets(ctx, group)
		offs.Each(func(o kadm.OffsetResponse) {
			if o.Topic == topic && o.Err == nil {
				n += o.At
			}
		})
		return n, err
	}); err != nil {
		return Result{}, err
	}
	r := Result{GatedSeconds: gated, Note: note}
	cpu, db, peak := base.since(ctx, b, procs)
	r.PeakRSSMB = max(r.PeakRSSMB, peak)
	var at time.Time
	if err := b.pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&at); err != nil {
		return r, err
	}
	var first, last time.Time
	q := pgx.Identifier{s, "ledger"}.Sanitize()
	if err := b.pool.QueryRow(ctx, `SELECT count(*), min(committed_at), max(committed_at) FROM `+q+` WHERE committed_at <= $1`, at).Scan(&r.Jobs, &first, &last); err != nil {
		return r, err
	}
	if r.Jobs == 0 {
		return r, fmt.Errorf("%d partitions: no row was written by the time a third of the jobs was committed", parts)
	}
	if span := last.Sub(first).Seconds(); span > 0 {
		r.JobsPerSec, r.DrainSeconds = float64(r.Jobs)/span, span
	}
	r.CPUPerMJobs = cpu / float64(r.Jobs) * 1e6
	if db != nil {
		v := *db / float64(r.Jobs) * 1e6
		r.DBCPUPerMJobs = &v
	}
	for _, p := range procs {
		p.stop()
	}
	b.say("partition dimension, %d partitions: at-least-once %.0f jobs/s over the first %d jobs", parts, r.JobsPerSec, r.Jobs)
	return r, nil
}

// groupAssignment is the group's members and the partitions of topic
// assigned among them once the group is stable (0, 0 before).
func groupAssignment(ctx context.Context, adm *kadm.Client, group, topic string) (members, assigned int, err error) {
	dg, err := adm.DescribeGroups(ctx, group)
	if err != nil {
		return 0, 0, err
	}
	g, ok := dg[group]
	if !ok || g.Err != nil || g.State != "Stable" {
		return 0, 0, nil
	}
	for _, m := range g.Members {
		c, ok := m.Assigned.AsConsumer()
		if !ok {
			continue
		}
		held := 0
		for _, t := range c.Topics {
			if t.Topic == topic {
				held += len(t.Partitions)
			}
		}
		if held > 0 {
			members++
		}
		assigned += held
	}
	return members, assigned, nil
}

// victim is the worker whose members hold the most of the topic's
// partitions now: a fencing row's owner is a member id, the coordinator's;
// its worker is the one that wrote ledger rows (table q) at the row's
// token. A partition its owner has not committed on yet does not count;
// ties go to the first name. "" when no row matches.
func (b *bench) victim(ctx context.Context, q, topic string, fencesOf func(context.Context) ([]sink.Fence, error)) (string, error) {
	type at struct {
		partition int32
		token     sink.Token
	}
	rows, err := b.pool.Query(ctx, `SELECT DISTINCT partition, incarnation, epoch, worker FROM `+q+` WHERE topic = $1`, topic)
	if err != nil {
		return "", err
	}
	writers := map[at][]string{}
	var (
		k      at
		worker string
	)
	if _, err := pgx.ForEachRow(rows, []any{&k.partition, &k.token.Incarnation, &k.token.Epoch, &worker}, func() error {
		writers[k] = append(writers[k], worker)
		return nil
	}); err != nil {
		return "", err
	}
	fences, err := fencesOf(ctx)
	if err != nil {
		return "", err
	}
	held := map[string]int{}
	for _, f := range fences {
		for _, w := range writers[at{f.Partition.Partition, f.Token}] {
			held[w]++
		}
	}
	victim := ""
	for w, n := range held {
		if victim == "" || n > held[victim] || (n == held[victim] && w < victim) {
			victim = w
		}
	}
	return victim, nil
}

// handOff measures the hand-off after the kill at killAt from the topic's
// fence log: the killed worker's partitions are those whose last claim
// before the kill was one of its members' (a member id is the
// coordinator's, not the worker's name: the killed worker's are the
// owners of the claims at whose tokens it wrote ledger rows, table q; the
// ledger has no index, so one scan, not a lookup per entry). Counting by
// the last commit instead misses every partition it claimed but had not
// committed on yet, which with hundreds of partitions is most of them.
// For each of them that had jobs left, the time from the kill to another
// member's first commit on it, and to its first claim. It sets out.Held
// and out.HandedOff, and returns the longest of each time (nil: none).
func (b *bench) handOff(ctx context.Context, q, topic, victim string, killAt time.Time, log []sink.FenceLogEntry, out *PartitionRun) (handOff, claimedAt *float64, err error) {
	type at struct {
		partition int32
		token     sink.Token
	}
	rows, err := b.pool.Query(ctx, `SELECT DISTINCT partition, incarnation, epoch FROM `+q+` WHERE topic = $1 AND worker = $2`, topic, victim)
	if err != nil {
		return nil, nil, err
	}
	wrote := map[at]bool{}
	var k at
	if _, err := pgx.ForEachRow(rows, []any{&k.partition, &k.token.Incarnation, &k.token.Epoch}, func() error {
		wrote[k] = true
		return nil
	}); err != nil {
		return nil, nil, err
	}
	killed := map[string]bool{}
	for _, e := range log {
		if e.Kind == "claim" && wrote[at{e.Partition.Partition, e.Token}] {
			killed[e.Owner] = true
		}
	}
	// held: each partition's last claim at or before the kill (the log is in
	// id order); after and claimed: another member's first commit and claim
	// after it.
	held := map[int32]string{}
	after, claimed := map[int32]time.Time{}, map[int32]time.Time{}
	for _, e := range log {
		p := e.Partition.Partition
		switch {
		case e.Kind == "claim" && !e.At.After(killAt):
			held[p] = e.Owner
		case e.At.After(killAt) && !killed[e.Owner] && (e.Kind == "commit" || e.Kind == "claim"):
			first := after
			if e.Kind == "claim" {
				first = claimed
			}
			if t, ok := first[p]; !ok || e.At.Before(t) {
				first[p] = e.At
			}
		}
	}
	for p, owner := range held {
		if !killed[owner] {
			continue
		}
		out.Held++
		a, ok := after[p]
		if !ok {
			continue
		}
		out.HandedOff++
		d := a.Sub(killAt).Seconds()
		if handOff == nil || d > *handOff {
			handOff = &d
		}
		if c, ok := claimed[p]; ok {
			d := c.Sub(killAt).Seconds()
			if claimedAt == nil || d > *claimedAt {
				claimedAt = &d
			}
		}
	}
	return handOff, claimedAt, nil
}

// backlogTo produces the run's backlog to topic.
func (b *bench) backlogTo(topic string) func(context.Context) error {
	return func(ctx context.Context) error { return b.produce(ctx, topic, b.dimJobs) }
}

// cpuMark is the CPU the processes and the server had used when a
// partition-dimension run's group settled.
type cpuMark struct {
	procs float64
	db    pgCPU
}

// cpuBase marks the CPU used so far, taken once the group has settled: a
// run's CPU per job counts from there, the window its rate is measured in
// (first commit to the kill), so that neither program is charged for its
// start-up. Tenure's start-up is a claim per partition, 1,000 of them at
// 1,000 partitions, which is the claims-per-second and hand-off columns'
// business, not the cost of a job.
func (b *bench) cpuBase(ctx context.Context, procs []*proc) cpuMark {
	c, _ := usageOf(procs)
	return cpuMark{procs: c, db: b.postgresCPU(ctx)}
}

// since is the CPU the processes and the server (nil: not measured) used
// since the mark, and the processes' largest peak RSS.
func (m cpuMark) since(ctx context.Context, b *bench, procs []*proc) (cpu float64, db *float64, peakMB float64) {
	c, peak := usageOf(procs)
	if now := b.postgresCPU(ctx); m.db.ok && now.ok {
		v := now.seconds - m.db.seconds
		db = &v
	}
	return c - m.procs, db, peak
}

// gateLimit bounds how long a gated backlog holds the programs' writes,
// so that a slow producer costs the drain its head start, never a batch a
// timeout and a retry. The tightest bound is not the lock_timeout of a
// tenure batch transaction (half its handler timeout, 30 s by default)
// but the kernel's: a COPY that waits behind the gate stops being read by
// its server once the socket buffers are full, and a connection whose
// data goes unread for sink.TCPUserTimeout (10 s) is aborted by its own
// kernel, as if the network had dropped it. At 20 s the at-least-once
// program's first COPY of a poll across 1,000 partitions died that way
// ("unexpected EOF") whenever the backlog took over 10 s to produce.
const gateLimit = sink.TCPUserTimeout - 2*time.Second

// gatedBacklog waits, for at most 2 minutes, until settled says the group
// has settled (or why not); marks the CPU used so far; then produces the
// whole backlog (produce) while the programs' writes to schema's ledger
// wait behind a lock the bench holds (SHARE: a COPY needs ROW EXCLUSIVE),
// and releases it. The programs fetch and buffer the jobs meanwhile
// (their fetching is counted in the CPU from the mark) and then drain a
// backlog that is all there: the measured rate is theirs, not the
// producer's, which runs in the bench's process on the same cores and
// runs slower beside the program that takes more of them. Produced while
// they drained it instead, a program that kept up measured the producer,
// with batches as small as the jobs that came meanwhile. Producing before
// the group settles measured something else again: the first worker to
// join drained much of the backlog alone.
//
// gated is how long the writes were held; if the backlog took longer than
// gateLimit (b.gateLimit in tests) the gate opens then, the rest is
// produced while they drain, and note says so.
func (b *bench) gatedBacklog(ctx context.Context, procs []*proc, schema string, settled func() (bool, string, error), produce func(context.Context) error) (base cpuMark, gated float64, note string, err error) {
	for start := time.Now(); ; {
		ok, state, err := settled()
		if err != nil {
			return base, 0, "", err
		}
		if ok {
			break
		}
		if time.Since(start) > 2*time.Minute {
			return base, 0, "", fmt.Errorf("after 2 minutes not settled: %s", state)
		}
		for _, p := range procs {
			if p.Exited() {
				return base, 0, "", fmt.Errorf("a process exited before the group settled: %s", p.lastOutput())
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	base = b.cpuBase(ctx, procs)
	gate, err := b.pool.Begin(ctx)
	if err != nil {
		return base, 0, "", err
	}
	defer gate.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // ends the gate on every path
	if _, err := gate.Exec(ctx, `LOCK TABLE `+pgx.Identifier{schema, "ledger"}.Sanitize()+` IN SHARE MODE`); err != nil {
		return base, 0, "", fmt.Errorf("the gate on the ledger: %w", err)
	}
	held := time.Now()
	done := make(chan error, 1)
	go func() { done <- produce(ctx) }()
	limit := cmp.Or(b.gateLimit, gateLimit)
	select {
	case err = <-done:
	case <-time.After(limit):
		note = fmt.Sprintf("the backlog took longer than %s to produce: the rest came while the programs drained it", limit)
		defer func() {
			if perr := <-done; err == nil {
				err = perr
			}
		}()
	}
	if err != nil {
		return base, 0, "", err
	}
	if err := gate.Rollback(ctx); err != nil {
		return base, 0, "", fmt.Errorf("opening the gate on the ledger: %w", err)
	}
	return base, time.Since(held).Seconds(), note, nil
}

// joinNotes joins a run's notes with "; ", leaving out empty ones.
func joinNotes(notes ...string) string {
	return strings.Join(slices.DeleteFunc(notes, func(n string) bool { return n == "" }), "; ")
}
