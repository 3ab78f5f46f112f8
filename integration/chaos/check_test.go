package chaos

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tenure-dev/tenure/internal/history"
	"github.com/tenure-dev/tenure/sink"
)

// The end of a run: what Postgres recorded, checked against the log, the
// producer's acknowledgements, what the workers logged and the faults, and
// the summary. checkAndReport runs the checks in order, one method each;
// each reads what the ones before it established (the fields of runCheck,
// grouped by the step that sets them) and adds violations and findings.

type pos struct {
	p   int32
	off int64
}

// runCheck is one run's check in progress.
type runCheck struct {
	w   *world
	ctx context.Context
	hwm map[int32]int64
	h   *history.History
	np  int32 // the topic's partitions at the end

	// A snapshot of the run's own record, taken once.
	faults     []*fault // by injection time
	unexpected []string
	notes      []string

	violations, findings []string

	// checkLog: the log as the checks see it.
	dels       map[int32]offRanges
	produced   map[history.TopicPartition][]int64
	byPos      map[pos]*kgo.Record
	reappeared map[int32][]int64

	// checkHistory, checkOwnership, checkStrict.
	checked     []history.Violation
	claimWorker map[int64]string
	assignments []history.Assignment
	owned       []history.Violation
	unmatched   []history.Entry
	strictLine  string
	jointLine   string // -chaos.commit-span: how many transactions spanned partitions

	// checkStored.
	fenceNext map[int32]int64

	// checkJobs.
	writes                        map[pos][]history.Write
	dead                          map[pos]int
	acked                         []job
	failed                        []string
	deleted                       deletedReport
	faultJobs, faultErr, faultPan int
	goodDead                      map[string]int             // by the latest fault before it
	newest                        map[string]map[int32]int64 // per key and partition, the newest exported job's offset
	covered                       map[pos]int                // per job, the commits that covered it (fence log)
	skippedByReset                int                        // jobs below the next offset no commit covered: an offsets reset skipped them

	// checkProducer.
	unacked, dupSeq int

	// checkResets.
	resets resetReport

	// checkWorkerLogs.
	commits, claims int
	rejections      []batchEvent
	book            bookCounts

	// measure.
	ho handoffs
	nr netReport

	// checkLiveness.
	live liveReport
}

// bookCounts is the logbook's figures, copied under its lock.
type bookCounts struct {
	lines, unparsed, batchRej, claimRej, incarnations, incSeen, panics, lost, loggedCommits int
	unknown                                                                                 map[string]int
}

func (c *runCheck) violate(format string, args ...any) {
	c.violations = append(c.violations, fmt.Sprintf(format, args...))
}

func (c *runCheck) find(format string, args ...any) {
	c.findings = append(c.findings, fmt.Sprintf(format, args...))
}

// checkAndReport loads the history from Postgres, runs the checker and the
// harness's own checks, and prints the summary.
//
// A violation is a broken promise (G1-G3, exactly once, a fault job not
// dead-lettered, a lost acknowledged job, an export that went backwards, a
// worker believing in a commit Postgres does not have) and fails the test. A
// finding is something the guarantee allows but nobody wants (a good job
// dead-lettered, a process that died on its own, a worker that would not
// stop): it is printed with its evidence and does not fail the run.
func (w *world) checkAndReport(hwm map[int32]int64, records map[int32][]*kgo.Record) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	h, err := history.Load(ctx, w.pool, schemaName, groupName, false)
	if err != nil {
		w.t.Fatalf("loading the history: %v", err)
	}
	c := &runCheck{w: w, ctx: ctx, hwm: hwm, h: h, np: w.nparts()}
	w.mu.Lock()
	c.faults = append([]*fault(nil), w.faults...)
	c.unexpected = append([]string(nil), w.unexpected...)
	c.notes = append([]string(nil), w.notes...)
	w.mu.Unlock()
	sort.Slice(c.faults, func(i, j int) bool { return c.faults[i].Injected.Before(c.faults[j].Injected) })

	c.checkLog(records)
	c.checkHistory()
	c.checkOwnership()
	c.checkStrict()
	c.countJoint()
	c.checkStored()
	c.checkJobs()
	c.checkProducer()
	c.checkResets()
	c.checkExports()
	c.checkWorkerLogs()
	c.measure()
	c.checkLiveness()
	c.report(c.summary())
}

// checkLog reads the log as it is: every record is a job the workers had
// to handle, but for the offsets the harness deleted (delete-records),
// which are not the log's any more: they are checked against the
// producer's acknowledgements instead (checkDeleted), and left out of every
// check below that compares the log with the producer or with the exports,
// even where kfake shows some of them again (reappeared).
func (c *runCheck) checkLog(records map[int32][]*kgo.Record) {
	c.dels = c.w.deletedRanges()
	c.produced = map[history.TopicPartition][]int64{}
	c.byPos = map[pos]*kgo.Record{}
	c.reappeared = map[int32][]int64{}
	for p := range c.np {
		tp := history.TopicPartition{Topic: topicName, Partition: p}
		var prev int64 = -1
		for _, r := range records[p] {
			if c.dels[p].contains(r.Offset) {
				c.reappeared[p] = append(c.reappeared[p], r.Offset)
				continue
			}
			for _, g := range c.dels[p].outside(prev+1, r.Offset) {
				c.violate("log: partition %d has no record at offsets [%d,%d)", p, g.from, g.to)
			}
			prev = r.Offset
			c.produced[tp] = append(c.produced[tp], r.Offset)
			c.byPos[pos{p, r.Offset}] = r
		}
		if len(c.dels[p].outside(prev+1, c.hwm[p])) > 0 {
			c.violate("log: partition %d read up to %d, the log ends at %d", p, prev+1, c.hwm[p])
		}
	}
}

// checkHistory runs the checker over the whole history: G1-G3, exactly
// once, exports.
func (c *runCheck) checkHistory() {
	c.checked = c.h.Check(c.produced)
	for _, v := range c.checked {
		c.violate("history: %s", v)
	}
}

// checkOwnership checks the coordinator's side: once the claim of a newer
// assignment (as the workers logged being given the partition) was
// accepted, nothing made for an older one may be, whatever the tokens say.
// This is the check that does not trust the incarnation: a reset the
// protocol failed to notice shows up here even when CheckLog is satisfied
// by the tokens.
//
// Unmatched entries (a claim or commit whose claim id no worker logged as
// "claiming partition") cannot be checked, so they are reported, as a line
// in the summary and a finding (the logs are kept), not as violations: a
// lane logs that line before its first claim, and the harness reads every
// worker's stderr to its end, a SIGKILLed worker's too (what it wrote is in
// the pipe), so there should be none. One means that a log line went
// missing, or that something claimed outside the assignment path: either
// way the evidence has a gap that someone should read, but no promise is
// shown to be broken, and CheckLog above still checks those entries'
// tokens.
func (c *runCheck) checkOwnership() {
	c.claimWorker, c.assignments = c.w.book.claimants()
	c.owned, c.unmatched = history.CheckOwnership(c.h.Log, c.assignments)
	for _, v := range c.owned {
		c.violate("ownership: %s", v)
	}
	for i, u := range c.unmatched {
		if i == 10 {
			c.find("... and %d more fence log entries that match no logged assignment", len(c.unmatched)-10)
			break
		}
		c.find("fence log entry #%d (%s of partition %d by %q, token %s, claim id %d) matches no assignment a worker logged",
			u.ID, u.Kind, u.Partition.Partition, u.Owner, u.Token, u.ClaimID)
	}
}

// countJoint (-chaos.commit-span): how many commit transactions carried
// several partitions' batches, read from the fence log (one transaction
// writes its entries under one xmin). The history checks above hold for
// them as for any commit; this line says that the run exercised them.
func (c *runCheck) countJoint() {
	if c.w.cfg.span <= 1 {
		return
	}
	var joint, most int
	err := c.w.pool.QueryRow(c.ctx, `SELECT count(*), coalesce(max(n), 0) FROM (
	SELECT count(*) AS n FROM `+schemaName+`.fence_log WHERE consumer_group = $1 AND kind = 'commit'
	GROUP BY xmin::text HAVING count(*) > 1) j`, groupName).Scan(&joint, &most)
	if err != nil {
		c.w.t.Errorf("counting the joint commits: %v", err)
		return
	}
	c.jointLine = fmt.Sprintf("joint:       %d commit transactions carried several partitions' batches (at most %d; --commit-span %d)\n", joint, most, c.w.cfg.span)
}

// checkStrict (-chaos.strict): no batch became visible unless the
// coordinator accepted its offset commit while its assignment was current,
// the decisions recorded agree with the fence log, and none is left
// prepared. A group's deletion, or a broker SIGKILL (kfake may lose the
// committed offsets it had acknowledged), can take away an accepted
// commit's record: such runs do not hold G3-record to it.
func (c *runCheck) checkStrict() {
	w := c.w
	if !w.cfg.strict {
		return
	}
	wiped := slices.ContainsFunc(c.faults, func(f *fault) bool { return f.Kind == kindGroupDelete || f.Kind == kindBrokerRst })
	events := w.book.strictEvents()
	for _, v := range history.CheckStrict(c.h, c.assignments, events, w.cfg.protocol == "classic", wiped) {
		c.violate("strict: %s", v)
	}
	decided := map[string]int{}
	for _, d := range c.h.StrictDecisions {
		k := "rolled back"
		if d.Committed {
			k = "committed"
		}
		if d.ByResolver {
			k += " by a later claim"
		}
		decided[k]++
	}
	c.strictLine = fmt.Sprintf("strict:      %d strict log lines (offset commits sent and answered, assignments ended); decisions %v; %d left prepared; G3-record excused by a group deletion or broker restart: %v\n",
		len(events), decided, len(c.h.Prepared), wiped)
}

// checkStored: every partition's stored next offset is the log's end,
// unless a broker SIGKILL lost records under it and tenure holds the
// partition for an operator, as it must.
func (c *runCheck) checkStored() {
	c.fenceNext = map[int32]int64{}
	for _, f := range c.h.Fences {
		c.fenceNext[f.Partition.Partition] = f.NextOffset
	}
	lost := c.w.brokerLostHolds()
	for p := range c.np {
		if c.fenceNext[p] == c.hwm[p] {
			continue
		}
		if hd, ok := lost[p]; ok {
			c.find("partition %d: held ahead-of-log since %s: after the broker's SIGKILL at %s its log ended at %d, below the stored next offset %d (kfake lost records it had served); tenure held it, as it must, until an operator acknowledges it (not processed since: stored %d, the log ends at %d)",
				p, hd.since.Format("15:04:05.000"), hd.kill.Injected.Format("15:04:05.000"), hd.end, hd.next, c.fenceNext[p], c.hwm[p])
			continue
		}
		c.violate("partition %d: stored next offset %d, the log ends at %d", p, c.fenceNext[p], c.hwm[p])
	}
}

// checkJobs: fault jobs dead-lettered, good jobs exported, effects belong
// to their job; the deleted jobs each processed once or declared lost by a
// hold (those processed are judged as the log's jobs are).
func (c *runCheck) checkJobs() {
	c.indexEffects()
	dls := c.w.deadLetters(c.ctx)
	c.acked, c.failed = c.w.prod.snapshot()
	cuts := map[int32]int64{}
	for _, x := range c.h.Cuts {
		if x.Topic == topicName {
			cuts[x.Partition.Partition] = x.NextOffset
		}
	}
	c.checkDeletedJobs(cuts)
	c.goodDead = map[string]int{}
	c.newest = map[string]map[int32]int64{}
	rec := readOpRecord(c.h.Log, cuts)
	c.covered = rec.covered
	for ps, r := range c.jobsToJudge() {
		if ps.off >= c.fenceNext[ps.p] {
			continue // not processed (a stuck partition, reported by checkStored)
		}
		// Each commit that covered a job ran it once: one, unless an
		// offsets reset moved the partition back over it (it ran again)
		// or forward past it (it never ran: history.Check reports a job
		// no commit covers that no reset skipped). Below a pruned
		// partition's cut the commits are gone: one.
		want := rec.want(ps)
		if want == 0 {
			c.skippedByReset++
			continue
		}
		if r.v.Fault != "" {
			c.checkFaultJob(ps, r.v, want)
			continue
		}
		c.checkGoodJob(ps, r, dls)
	}
}

// indexEffects indexes the history's effects and dead letters by position.
func (c *runCheck) indexEffects() {
	c.writes = map[pos][]history.Write{}
	for _, wr := range c.h.Writes {
		c.writes[pos{wr.Partition, wr.Offset}] = append(c.writes[pos{wr.Partition, wr.Offset}], wr)
	}
	c.dead = map[pos]int{}
	for _, d := range c.h.DeadLetters {
		c.dead[pos{d.Partition, d.Offset}]++
	}
}

// checkDeletedJobs judges the acknowledged jobs the harness deleted
// (checkDeleted) and reports what it found.
func (c *runCheck) checkDeletedJobs(cuts map[int32]int64) {
	c.deleted = c.w.checkDeleted(c.acked, c.dels, c.reappeared, c.writes, c.dead, c.h.Log, cuts)
	for _, v := range c.deleted.violations {
		c.violate("deleted jobs: %s", v)
	}
	for _, f := range c.deleted.findings {
		c.find("%s", f)
	}
}

// jobAt is a job to judge: its key and value.
type jobAt struct {
	key string
	v   jobValue
}

// jobsToJudge are the log's jobs and the deleted jobs processed before
// their deletion, by position.
func (c *runCheck) jobsToJudge() map[pos]jobAt {
	jobs := map[pos]jobAt{}
	for ps, r := range c.byPos {
		jobs[ps] = jobAt{string(r.Key), recordValue(r)}
	}
	for ps, j := range c.deleted.done {
		jobs[ps] = jobAt{j.Key, jobValue{Seq: j.Seq, Key: j.Key, Marker: j.Marker, Fault: j.Fault}}
	}
	return jobs
}

// checkFaultJob: a fault job is dead-lettered once per commit that covered
// it, and has no effect.
func (c *runCheck) checkFaultJob(ps pos, v jobValue, want int) {
	c.faultJobs++
	if v.Fault == "error" {
		c.faultErr++
	} else {
		c.faultPan++
	}
	if c.dead[ps] != want || len(c.writes[ps]) != 0 {
		c.violate("fault job %s/%d/%d (%s): %d dead letters, %d effects; want %d dead letters (one per commit that covered it) and no effect",
			topicName, ps.p, ps.off, v.Fault, c.dead[ps], len(c.writes[ps]), want)
	}
}

// checkGoodJob: a good job's effects are for its key; dead-lettered, it is
// a finding; exported, it is the newest of its key and partition or older.
func (c *runCheck) checkGoodJob(ps pos, r jobAt, dls map[pos]deadLetter) {
	for _, wr := range c.writes[ps] {
		if wr.Key != r.key {
			c.violate("effect at %d/%d is for key %q, the job's key is %q", ps.p, ps.off, wr.Key, r.key)
		}
	}
	if c.dead[ps] > 0 {
		d := dls[ps]
		after := "no fault"
		if f := latestFault(c.faults, d.at); f != nil {
			after = fmt.Sprintf("%s %s +%s", f.Kind, f.Target, d.at.Sub(f.Injected).Round(time.Millisecond))
			c.goodDead[f.Kind]++
		} else {
			c.goodDead["none"]++
		}
		c.find("good job %s/%d/%d (key %s) was dead-lettered at %s (after %s) by %s: %q after %d attempts",
			topicName, ps.p, ps.off, r.key, d.at.Format("15:04:05.000"), after, d.owner, d.err, d.attempts)
		return
	}
	if c.newest[r.key] == nil {
		c.newest[r.key] = map[int32]int64{}
	}
	if o, ok := c.newest[r.key][ps.p]; !ok || ps.off > o {
		c.newest[r.key][ps.p] = ps.off
	}
}

// checkResets: the fence log's 'reset' entries are exactly the resets the
// harness made as an operator (offsetsreset_test.go), and the holds it
// acknowledged (checkDeleted judges those).
func (c *runCheck) checkResets() {
	c.w.mu.Lock()
	resets := slices.Clone(c.w.offResets)
	c.w.mu.Unlock()
	c.resets = checkResetLog(c.h.Log, resets)
	for _, v := range c.resets.violations {
		c.violate("offsets reset: %s", v)
	}
}

// checkProducer: every acknowledged job is in the log where the broker
// said, but for the jobs the harness deleted (checkJobs judged those).
func (c *runCheck) checkProducer() {
	seqs := map[int64]int{}
	for _, r := range c.byPos {
		seqs[recordValue(r).Seq]++
	}
	ackedPos := map[pos]bool{}
	for _, j := range c.acked {
		if c.dels[j.Partition].contains(j.Offset) {
			continue
		}
		ackedPos[pos{j.Partition, j.Offset}] = true
		r := c.byPos[pos{j.Partition, j.Offset}]
		if r == nil || recordValue(r).Seq != j.Seq {
			c.violate("acknowledged job seq %d at %d/%d is not in the log there", j.Seq, j.Partition, j.Offset)
		}
	}
	for ps := range c.byPos {
		if !ackedPos[ps] {
			c.unacked++
		}
	}
	for _, n := range seqs {
		if n > 1 {
			c.dupSeq += n - 1
		}
	}
	if c.unacked > 0 || c.dupSeq > 0 || len(c.failed) > 0 {
		c.find("producer/broker: %d records in the log were never acknowledged, %d seqs are in the log more than once, %d produce errors %v",
			c.unacked, c.dupSeq, len(c.failed), c.failed[:min(3, len(c.failed))])
	}
}

// checkExports: each key's visible export is its newest exported job on
// the partition of the job that wrote it.
//
// Why per partition: a key's jobs are on one partition until the topic
// grows (add-partitions). Until the harness acknowledges the new count,
// every worker that saw it holds the whole topic (claimed, not processed),
// and one that did not see it yet goes on with the old layout, whose
// partitions hold every job produced before the producer moved to the new
// count. After the acknowledgement a key whose partition changed has jobs
// on two partitions with two owners: what was left of it on the old one
// and its new jobs, processed side by side, each partition in order. So
// the export (one row per key, written by whichever commit came last) is
// the newest job of the key on one of its partitions, not necessarily its
// newest overall: the ordering hazard `tenure admin topic add-partitions`
// warns about. What still holds is per partition: the export is the newest
// exported job of its key on its own partition, and the export versions
// never go back within a partition (history.Check). For a key whose jobs
// are all on one partition, as every key's are in a run without
// add-partitions, that is the newest exported job, as before.
func (c *runCheck) checkExports() {
	for key, e := range c.w.finalExports(c.ctx) {
		newest := c.newest[key]
		if len(newest) == 0 {
			continue
		}
		want, ok := newest[e.p]
		switch {
		case !ok:
			c.violate("key %s: the export shows the job at %d/%d, but no exported job of the key is on partition %d (its newest exported jobs: %v)", key, e.p, e.off, e.p, newest)
		case e.off != want:
			c.violate("key %s: the export shows the job at %d/%d, its newest exported job on that partition is at %d", key, e.p, e.off, want)
		}
	}
}

// rerun says whether commit e, of the same range, token and owner as the
// rejected batch r, is that range run again after an offsets reset, rather
// than the rejected batch itself: a reset rejects the batch in flight (a
// new log epoch), the lane claims again with the same claim, and so the
// same token, and when the reset moved the offset back to or below the
// range it may cut the same batch again. It is if such a reset precedes e
// in the fence log and e committed after the rejection was logged (a batch
// that did commit committed before its lane could log it as rejected; the
// log's times are milliseconds, hence the slack).
func (c *runCheck) rerun(e history.Entry, r batchEvent, at map[int64]time.Time) bool {
	t, ok := at[e.ID]
	if !ok || !t.After(r.At.Add(time.Millisecond)) {
		return false
	}
	for _, x := range c.h.Log {
		if x.ID >= e.ID {
			break
		}
		if x.Kind == "reset" && x.Partition == e.Partition && x.To <= e.From {
			return true
		}
	}
	return false
}

// fenceLogTimes are the fence log's entries' times (Postgres's clock), by
// id.
func (w *world) fenceLogTimes(ctx context.Context) map[int64]time.Time {
	out := map[int64]time.Time{}
	var id int64
	var t time.Time
	w.readRows(ctx, "the fence log's times", []any{&id, &t}, func() { out[id] = t },
		`SELECT id, at FROM `+schemaName+`.fence_log WHERE consumer_group = $1`, groupName)
	return out
}

// readRows runs the query sql and calls row for each row it scans into
// dest; a row that does not scan is passed over. A failed query is an error
// of the run, reading what.
func (w *world) readRows(ctx context.Context, what string, dest []any, row func(), sql string, args ...any) {
	rows, err := w.pool.Query(ctx, sql, args...)
	if err != nil {
		w.t.Errorf("reading %s: %v", what, err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		if rows.Scan(dest...) == nil {
			row()
		}
	}
}

// checkWorkerLogs: what the workers logged agrees with what Postgres
// recorded; the processes that died on their own and the run's notes are
// findings.
func (c *runCheck) checkWorkerLogs() {
	type commitKey struct {
		p        int32
		token    string
		owner    string
		from, to int64
	}
	inLog := map[commitKey][]history.Entry{}
	for _, e := range c.h.Log {
		switch e.Kind {
		case "commit":
			c.commits++
			k := commitKey{e.Partition.Partition, e.Token.String(), e.Owner, e.From, e.To}
			inLog[k] = append(inLog[k], e)
		case "claim":
			c.claims++
		}
	}
	at := c.w.fenceLogTimes(c.ctx)
	b := c.w.book
	b.mu.Lock()
	for _, bc := range b.commits {
		if len(inLog[commitKey{bc.Partition, bc.Token, bc.Member, bc.From, bc.To}]) == 0 {
			c.violate("a worker logged a commit the fence log does not have: %s", bc)
		}
	}
	for _, bc := range b.rejections {
		for _, e := range inLog[commitKey{bc.Partition, bc.Token, bc.Member, bc.From, bc.To}] {
			if !c.rerun(e, bc, at) {
				c.violate("a worker logged a rejection of a batch the fence log has as committed: %s (commit #%d)", bc, e.ID)
				break
			}
		}
	}
	for job := range b.deadLetters {
		var p int32
		var off int64
		if _, err := fmt.Sscanf(strings.TrimPrefix(job, topicName+"/"), "%d/%d", &p, &off); err != nil || c.dead[pos{p, off}] == 0 {
			c.violate("a worker logged dead letter %s, the dead-letter table does not have it", job)
		}
	}
	c.rejections = append(append([]batchEvent(nil), b.rejections...), b.claimFenced...)
	c.book = bookCounts{b.lines, b.unparsed, len(b.rejections), len(b.claimFenced), b.incarnations, b.incSeen,
		b.panics, b.lost, len(b.commits), b.unknown}
	b.mu.Unlock()
	for _, u := range c.unexpected {
		c.find("unexpected exit: %s", u)
	}
	for _, n := range c.notes {
		c.find("%s", n)
	}
}

// measure takes the hand-off latency of kills and pauses (measured, not
// asserted), and for the network faults the hand-offs (a miss is a
// finding), step-downs and rejoins, zombies, and commits cut in the middle.
func (c *runCheck) measure() {
	byPart, err := c.w.fenceEntries(c.ctx)
	if err != nil {
		c.w.t.Errorf("reading the fence log for the hand-offs: %v", err)
	}
	c.ho = handoffsOf(byPart, c.faults, c.claimWorker, c.np)
	for _, l := range c.ho.slow {
		c.find("%s", l)
	}
	c.nr = c.w.networkReport(c.faults, byPart, c.claimWorker, c.np)
	for _, l := range c.nr.findings {
		c.find("%s", l)
	}
}

// checkLiveness: no partition with jobs waiting went without moving for
// longer than B of quiet time, held with no reason the run expected, and
// no worker stayed out of the group (liveness_test.go); each such wedge
// was reported when it was seen, with its evidence, and is a violation.
func (c *runCheck) checkLiveness() {
	c.live = c.w.liveReport(c.faults)
	for _, wd := range c.live.wedges {
		c.violate("wedge: %s", wd)
	}
}

// summary is the run's summary, as the CI log shows it.
func (c *runCheck) summary() string {
	w, h := c.w, c.h
	w.mu.Lock()
	sess := w.sess
	w.mu.Unlock()
	var total int64
	for p := range c.np {
		total += c.hwm[p]
	}
	var s strings.Builder
	mode := ""
	if w.cfg.strict {
		mode = " (strict hand-off)"
	}
	if w.cfg.span > 1 {
		mode = fmt.Sprintf(" (commits spanning up to %d partitions)", w.cfg.span)
		if w.cfg.spanTxs > 0 {
			mode = fmt.Sprintf(" (commits spanning up to %d partitions, %d transactions at once)", w.cfg.span, w.cfg.spanTxs)
		}
	}
	fmt.Fprintf(&s, "==== chaos summary: seed %d, %d workers, %s protocol%s, %s of faults, %d jobs/s, %d partitions, run took %s\n",
		w.cfg.seed, w.cfg.workers, w.cfg.protocol, mode, w.cfg.duration, w.cfg.rate, c.np, time.Since(w.start).Round(time.Second))
	fmt.Fprintf(&s, "jobs:        %d in the log (%d acknowledged, %d produce errors, %d unacknowledged, %d duplicate seqs); %d exported, %d dead-lettered\n",
		total, len(c.acked), len(c.failed), c.unacked, c.dupSeq, len(h.Writes), len(h.DeadLetters))
	fmt.Fprintf(&s, "fault jobs:  %d (%d error, %d panic), each must be dead-lettered; good jobs dead-lettered: %d %v\n",
		c.faultJobs, c.faultErr, c.faultPan, sumMap(c.goodDead), c.goodDead)
	s.WriteString(c.deleted.summary())
	s.WriteString(c.resets.summary(c.skippedByReset))
	s.WriteString(w.additionsSummary())
	s.WriteString(w.rollsSummary())
	fmt.Fprintf(&s, "history:     %d claims, %d commits in the fence log; %d incarnation bumps (seen by %d claims)\n", c.claims, c.commits, c.book.incarnations, c.book.incSeen)
	s.WriteString(c.strictLine)
	s.WriteString(c.jointLine)
	fmt.Fprintf(&s, "rejections:  %d batches fenced, %d claims fenced; %d partitions-lost events; %d commits of unknown outcome %v; %d handler panics\n",
		c.book.batchRej, c.book.claimRej, c.book.lost, sumMap(c.book.unknown), c.book.unknown, c.book.panics)
	fmt.Fprintf(&s, "faults:      %d injected", len(c.faults))
	for _, k := range w.kinds() {
		fmt.Fprintf(&s, ", %s %d", k, countKind(c.faults, k))
	}
	fmt.Fprintf(&s, "; unexpected process exits %d\n", len(c.unexpected))
	c.recoveryTable(&s)
	c.handoffTable(&s)
	s.WriteString(c.nr.summary(w, sess))
	s.WriteString(c.live.summary(tableRows(w.kinds())))
	fmt.Fprintf(&s, "ownership:   %d fence log entries checked against %d assignments the workers logged; %d unmatched\n",
		len(h.Log), len(c.assignments), len(c.unmatched))
	s.WriteString(w.failoverSummary())
	fmt.Fprintf(&s, "violations:  %d (history checker %d, ownership %d, deleted jobs %d, liveness %d, harness checks %d)\n", len(c.violations), len(c.checked), len(c.owned),
		len(c.deleted.violations), len(c.live.wedges), len(c.violations)-len(c.checked)-len(c.owned)-len(c.deleted.violations)-len(c.live.wedges))
	fmt.Fprintf(&s, "findings:    %d (allowed by the guarantee, listed in the test log)\n", len(c.findings))
	fmt.Fprintf(&s, "worker logs: %d lines (%d not JSON), %d commits logged; most frequent warnings and errors:\n", c.book.lines, c.book.unparsed, c.book.loggedCommits)
	for _, l := range w.book.topMessages(8) {
		fmt.Fprintf(&s, "  %s\n", l)
	}
	fmt.Fprintf(&s, "replay:      %s\n", w.replay())
	return s.String()
}

// recoveryTable: per fault kind, the time until every partition had
// processed a job produced once the fault was in effect.
func (c *runCheck) recoveryTable(s *strings.Builder) {
	fmt.Fprintf(s, "recovery:    time until every partition has processed a job produced once the fault was in effect\n")
	rows := tableRows(c.w.kinds())
	kw := kindWidth(rows)
	fmt.Fprintf(s, "  %-*s %5s %23s %23s %11s %11s\n", kw, "kind", "count", "from injection p50/max", "from fault end p50/max", "unrecovered", "rejections")
	for _, k := range rows {
		var fromInj, fromEnd []time.Duration
		unrec, n := 0, 0
		for _, f := range c.faults {
			if f.row() != k {
				continue
			}
			n++
			if f.Recovered.IsZero() {
				unrec++
				continue
			}
			fromInj = append(fromInj, f.Recovered.Sub(f.Injected))
			fromEnd = append(fromEnd, max(0, f.Recovered.Sub(f.Ended)))
		}
		fmt.Fprintf(s, "  %-*s %5d %23s %23s %11d %11d\n", kw, k, n, p50max(fromInj), p50max(fromEnd), unrec, rejectionsAfter(c.faults, k, c.rejections))
	}
}

// handoffTable: per kind that takes a worker away (SIGKILL, SIGSTOP), the
// time to the first commit by a new owner of each partition it held.
func (c *runCheck) handoffTable(s *strings.Builder) {
	rows := tableRows(c.w.kinds())
	kw := kindWidth(rows)
	fmt.Fprintf(s, "hand-off:    from the fault (SIGKILL, SIGSTOP) to the first commit by a new owner of each partition the worker held then (Postgres's clock); "+
		"target max <= %s (session timeout + 2s); overlapped: another fault was injected before the new owner's commit (apart: not in the target)\n", handoffTarget)
	fmt.Fprintf(s, "  %-*s %5s %9s %9s %9s %8s %14s %10s %14s\n", kw, "kind", "count", "p50", "p99", "max", "target", "not handed off", "overlapped", "overlapped max")
	for _, k := range rows {
		if !slices.Contains(handoffKinds, strings.Split(k, "/")[0]) {
			continue
		}
		ds := c.ho.took[k]
		within := "-"
		if len(ds) > 0 {
			within = "met"
			if slices.Max(ds) > handoffTarget {
				within = "MISSED"
			}
		}
		fmt.Fprintf(s, "  %-*s %5d %9s %9s %9s %8s %14d %10d %14s\n", kw, k, len(ds), pct(ds, 50), pct(ds, 99), pct(ds, 100), within, c.ho.none[k],
			len(c.ho.overlapped[k]), pct(c.ho.overlapped[k], 100))
	}
}

// report writes the timeline and the summary next to the logs, prints the
// summary, and fails the test on every violation (findings are logged and
// keep the logs).
func (c *runCheck) report(summary string) {
	w, t := c.w, c.w.t
	var tl strings.Builder
	for _, f := range c.faults {
		fmt.Fprintf(&tl, "+%-9s %s\n", f.Injected.Sub(w.start).Round(time.Millisecond), f)
	}
	var fl strings.Builder
	for _, f := range c.findings {
		fmt.Fprintf(&fl, "FINDING: %s\n", f)
	}
	_ = os.WriteFile(filepath.Join(w.logDir, "timeline.txt"), []byte(tl.String()+fl.String()), 0o644)
	_ = os.WriteFile(filepath.Join(w.logDir, "summary.txt"), []byte(summary), 0o644)

	t.Logf("timeline:\n%s", tl.String())
	if len(c.findings) > 0 {
		w.keepLogs = true
		t.Logf("findings (%d, first 30):\n%s", len(c.findings), strings.Join(c.findings[:min(30, len(c.findings))], "\n"))
	}
	t.Log("\n" + summary)
	fmt.Print(summary)
	for i, v := range c.violations {
		if i == 50 {
			t.Errorf("... and %d more", len(c.violations)-50)
			break
		}
		t.Errorf("VIOLATION: %s", v)
	}
	for _, f := range c.faults {
		if f.MarkErr != nil {
			t.Errorf("fault %s: its markers could not be produced: %v", f, f.MarkErr)
		}
	}
	if t.Failed() {
		t.Logf("replay with: %s", w.replay())
	}
}

// kindWidth is the width of the summary tables' kind column.
func kindWidth(rows []string) int {
	n := 24
	for _, r := range rows {
		n = max(n, len(r))
	}
	return n
}

func tableRows(kinds []string) []string {
	var out []string
	for _, k := range kinds {
		switch k {
		case kindGroupDelete:
			for _, m := range resetModes {
				out = append(out, k+"/"+m)
			}
		case kindPauseInTx:
			out = append(out, k+"/idle-timeout", k+"/lock-watch")
		case kindDeleteRecs:
			for _, m := range deleteModes {
				out = append(out, k+"/"+m)
			}
		case kindOffsetsReset:
			for _, m := range offsetResetModes {
				out = append(out, k+"/"+m)
			}
		case kindAddParts:
			for _, m := range addModes {
				out = append(out, k+"/"+m)
			}
		case kindPartPG, kindPartOneWay:
			for _, m := range netModes[k] {
				out = append(out, k+"/"+m)
			}
		default:
			out = append(out, k)
		}
	}
	return out
}

// aheadOfLog is an open ahead-of-log hold: the stored next offset, the
// log's end as the worker found it, when, and the broker SIGKILL before it.
type aheadOfLog struct {
	next, end int64
	since     time.Time
	kill      *fault
}

// brokerLostHolds returns, by partition, the open ahead-of-log holds that a
// broker SIGKILL explains: kfake, SIGKILLed, has come back with a log shorter
// than what it had served (a soak saw two partitions end 1 and 2 records
// below offsets the workers had processed), where Kafka keeps what it
// appended across a process kill. tenure must then hold the partition until
// an operator acknowledges it: the guarantee working, not a stuck
// partition. Such a hold names a log end below the stored offset and came
// within a minute after a broker SIGKILL; any other hold is not excused.
func (w *world) brokerLostHolds() map[int32]aheadOfLog {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w.mu.Lock()
	faults := append([]*fault(nil), w.faults...)
	w.mu.Unlock()
	out := map[int32]aheadOfLog{}
	for p, h := range w.aheadOfLogHolds(ctx) {
		if h.end >= 0 && h.end < h.next {
			if h.kill = brokerKillBefore(faults, h.since, time.Minute); h.kill != nil {
				out[p] = h
			}
		}
	}
	return out
}

// aheadOfLogHolds reads the open ahead-of-log holds, by partition.
func (w *world) aheadOfLogHolds(ctx context.Context) map[int32]aheadOfLog {
	out := map[int32]aheadOfLog{}
	store, err := sink.NewStore(w.pool, schemaName)
	if err == nil {
		var hs []sink.Hold
		if hs, err = store.OpenHolds(ctx, groupName); err == nil {
			for _, h := range hs {
				if h.Kind == sink.HoldAheadOfLog && h.Partition.Topic == topicName {
					out[h.Partition.Partition] = aheadOfLog{next: h.NextOffset, end: h.HighWatermark, since: h.Since}
				}
			}
		}
	}
	if err != nil {
		w.t.Errorf("reading the holds: %v", err)
	}
	return out
}

// brokerKillBefore returns the latest broker SIGKILL injected at most within
// before at, the broker back before at (a hold judged against the restarted
// log), or nil.
func brokerKillBefore(faults []*fault, at time.Time, within time.Duration) *fault {
	var k *fault
	for _, f := range faults {
		if f.Kind == kindBrokerRst && f.Mode == "kill" && !f.Ended.IsZero() && f.Ended.Before(at) && at.Sub(f.Injected) <= within {
			k = f
		}
	}
	return k
}

// handoffTarget is the bound on a hand-off: the coordinator notices a
// dead or frozen member after one session timeout; two seconds more for the
// rebalance, the claim and the first batch.
const handoffTarget = sessionTimeout + 2*time.Second

type handoffs struct {
	// per table row (fault.row), one per (fault, partition) with no other
	// fault injected until the new owner's commit: what the target is about
	took map[string][]time.Duration
	none map[string]int // per row, (fault, partition) pairs with no commit by a new owner
	// per row, the hand-offs during which another fault was injected (a
	// Postgres or broker restart, say, that the new owner waited for): shown
	// apart, since their time is the other fault's too
	overlapped map[string][]time.Duration
	slow       []string // the hand-offs above the target, for the findings
}

// handoffsOf measures, for each kill, pause and pause-in-tx, the time from the
// fault (the SIGKILL or SIGSTOP) to the first commit by a new owner of each
// partition the target held at that instant, from tenure's side: the fence
// log's commit times (clock_timestamp() of the commit statement, the
// harness and Postgres share a clock). The holder of a partition at the
// instant is the claimant of its last accepted claim before it (the fence
// log), and that claim's lane belongs to the target process if the target
// logged its claim id ("claiming partition"); a new owner is any other
// claim, the target's own after it rejoined included (a new lane the
// coordinator gave the partition to). Measuring commits, not the harness's
// markers, keeps the producer's own stalls out of it.
func handoffsOf(byPart map[int32][]fenceEntry, faults []*fault, claimWorker map[int64]string, np int32) handoffs {
	ho := handoffs{took: map[string][]time.Duration{}, none: map[string]int{}, overlapped: map[string][]time.Duration{}}
	for _, f := range faults {
		if !slices.Contains(handoffKinds, f.Kind) {
			continue
		}
		for p := range np {
			es := byPart[p]
			held := heldAt(es, f.Injected)
			if held < 0 || claimWorker[es[held].claimID] != f.Target {
				continue
			}
			found := false
			for _, e := range es[held+1:] {
				if e.kind == "commit" && e.claimID != es[held].claimID && e.at.After(f.Injected) {
					d := e.at.Sub(f.Injected)
					// Faults injected while the partition was between owners.
					var during []string
					for _, g := range faults {
						if g.Injected.After(f.Injected) && g.Injected.Before(e.at) {
							during = append(during, fmt.Sprintf("%s +%s", g.row(), g.Injected.Sub(f.Injected).Round(time.Millisecond)))
						}
					}
					if len(during) > 0 {
						ho.overlapped[f.row()] = append(ho.overlapped[f.row()], d)
					} else {
						ho.took[f.row()] = append(ho.took[f.row()], d)
					}
					if d > handoffTarget {
						msg := fmt.Sprintf("hand-off of partition %d after %s took %s (target %s): new owner %s",
							p, f, d.Round(time.Millisecond), handoffTarget, claimWorker[e.claimID])
						if len(during) > 0 {
							msg += "; faults injected meanwhile: " + strings.Join(during, ", ")
						}
						ho.slow = append(ho.slow, msg)
					}
					found = true
					break
				}
			}
			if !found {
				ho.none[f.row()]++
			}
		}
	}
	return ho
}

// pct is the q-th percentile (nearest rank) of ds.
func pct(ds []time.Duration, q int) string {
	if len(ds) == 0 {
		return "-"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (q*len(s)+99)/100 - 1
	return s[max(0, i)].Round(10 * time.Millisecond).String()
}

// latestFault is the last fault injected at or before at.
func latestFault(fs []*fault, at time.Time) *fault {
	var latest *fault
	for _, f := range fs {
		if !f.Injected.After(at) {
			latest = f
		}
	}
	return latest
}

type deadLetter struct {
	err      string
	attempts int
	owner    string
	at       time.Time
}

// deadLetters reads why and when each job was parked.
func (w *world) deadLetters(ctx context.Context) map[pos]deadLetter {
	out := map[pos]deadLetter{}
	var p int32
	var off int64
	var d deadLetter
	w.readRows(ctx, "dead letters", []any{&p, &off, &d.err, &d.attempts, &d.owner, &d.at}, func() { out[pos{p, off}] = d },
		`SELECT partition, job_offset, error, attempts, owner, dead_at FROM `+schemaName+`.dead_letters WHERE consumer_group = $1`, groupName)
	return out
}

// finalExports is each key's visible export: the partition and offset of
// its job.
func (w *world) finalExports(ctx context.Context) map[string]pos {
	out := map[string]pos{}
	var k string
	var e pos
	w.readRows(ctx, "exports", []any{&k, &e.p, &e.off}, func() { out[k] = e },
		`SELECT job_key, partition, job_offset FROM `+schemaName+`.exports WHERE topic = $1`, topicName)
	return out
}

func countKind(fs []*fault, kind string) int {
	n := 0
	for _, f := range fs {
		if f.Kind == kind {
			n++
		}
	}
	return n
}

// rejectionsAfter counts the rejections logged while a fault of kind was the
// latest one injected.
func rejectionsAfter(fs []*fault, row string, rej []batchEvent) int {
	n := 0
	for _, r := range rej {
		if f := latestFault(fs, r.At); f != nil && f.row() == row {
			n++
		}
	}
	return n
}

func p50max(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return fmt.Sprintf("%s / %s", ds[(len(ds)-1)/2].Round(10*time.Millisecond), ds[len(ds)-1].Round(10*time.Millisecond))
}

func sumMap(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
