package cli

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/tenure-dev/tenure/partition"
	"github.com/tenure-dev/tenure/sink"
)

// offsetsReset is `tenure admin offsets reset`: it moves a group's stored
// offsets for an operator, through the fence (sink.Store.ResetOffset), so
// that the workers need not be stopped: their batches in flight are
// rejected and their lanes go on from the new offsets. Without --execute it
// only shows the plan.
type offsetsReset struct {
	admin
	f                         *flagSet
	group, topic, actor       string
	partitions                partitionList
	all                       bool
	toEarliest, toLatest      bool
	toOffset, shiftBy, toTime string
	dryRun, execute           bool

	target resetTarget // from check
}

// resetTarget is where the offsets go: one of the --to-* flags or
// --shift-by.
type resetTarget struct {
	kind   string // "earliest", "latest", "offset", "shift", "datetime"
	offset int64  // the offset (offset) or the shift (shift)
	at     time.Time
}

func (t resetTarget) String() string {
	switch t.kind {
	case "earliest":
		return "the log's start (--to-earliest)"
	case "latest":
		return "the log's end (--to-latest)"
	case "offset":
		return fmt.Sprintf("offset %d (--to-offset)", t.offset)
	case "shift":
		return fmt.Sprintf("the stored offset %+d (--shift-by)", t.offset)
	case "datetime":
		return fmt.Sprintf("the first job at or after %s (--to-datetime)", t.at.UTC().Format(time.RFC3339Nano))
	}
	return t.kind
}

func (c *offsetsReset) define(f *flagSet) {
	c.f = f
	c.withKafka(f, brokersUsage+": where each partition's log starts and ends bounds the new offsets", required)
	c.withDB(f)
	f.String(&c.group, "group", "", "the consumer group whose offsets move", arg("G"), required)
	f.String(&c.topic, "topic", "", "the topic", arg("T"), required)
	f.fs.Var(&c.partitions, "partition", "a partition to reset; repeat it (or give a comma-separated list) for several")
	f.annotate("partition", []flagOpt{arg("P")})
	f.Bool(&c.all, "all-partitions", false, "every partition of the topic", noEnv)
	f.Bool(&c.toEarliest, "to-earliest", false, "move to the log's start: every job still in the log runs again", noEnv)
	f.Bool(&c.toLatest, "to-latest", false, "move to the log's end: every job not yet processed is skipped", noEnv)
	f.String(&c.toOffset, "to-offset", "", "move to offset N", arg("N"), noEnv)
	f.String(&c.shiftBy, "shift-by", "", "move by N from the stored offset (negative: back, repeating jobs; positive: forward, skipping them)", arg("N"), noEnv)
	f.String(&c.toTime, "to-datetime", "", "move to the first job at or after this RFC3339 time (the broker's timestamps)", arg("TIME"), noEnv)
	f.Bool(&c.dryRun, "dry-run", false, "show the plan and change nothing (the default)", noEnv)
	f.Bool(&c.execute, "execute", false, "move the offsets (recorded in the fence log with --actor)", noEnv)
	c.actorFlag(f, &c.actor)
	c.withTableOutput(f)
}

func (c *offsetsReset) check([]string) error {
	if err := validGroup("group", c.group); err != nil {
		return err
	}
	if err := validTopic("topic", c.topic); err != nil {
		return err
	}
	switch {
	case len(c.partitions) == 0 && !c.all:
		return usagef("give the partitions to reset: --partition P (repeatable) or --all-partitions")
	case len(c.partitions) > 0 && c.all:
		return usagef("--partition and --all-partitions do not go together")
	}
	var given []string
	for _, name := range []string{"to-earliest", "to-latest", "to-offset", "shift-by", "to-datetime"} {
		if c.f.given(name) && !(name == "to-earliest" && !c.toEarliest) && !(name == "to-latest" && !c.toLatest) {
			given = append(given, "--"+name)
		}
	}
	switch len(given) {
	case 0:
		return usagef("say where the offsets go: one of --to-earliest, --to-latest, --to-offset N, --shift-by N, --to-datetime TIME")
	case 1:
	default:
		return usagef("%s do not go together: give one", strings.Join(given, " and "))
	}
	switch {
	case c.toEarliest:
		c.target = resetTarget{kind: "earliest"}
	case c.toLatest:
		c.target = resetTarget{kind: "latest"}
	case c.f.given("to-offset"):
		n, err := strconv.ParseInt(c.toOffset, 10, 64)
		if err != nil || n < 0 {
			return usagef("--to-offset %q is not an offset (a whole number, 0 or more)", c.toOffset)
		}
		c.target = resetTarget{kind: "offset", offset: n}
	case c.f.given("shift-by"):
		n, err := strconv.ParseInt(c.shiftBy, 10, 64)
		if err != nil {
			return usagef("--shift-by %q is not a whole number", c.shiftBy)
		}
		if n == 0 {
			return usagef("--shift-by 0 moves nothing")
		}
		c.target = resetTarget{kind: "shift", offset: n}
	case c.f.given("to-datetime"):
		at, err := time.Parse(time.RFC3339Nano, c.toTime)
		if err != nil {
			return usagef("--to-datetime %q is not an RFC3339 time (such as 2026-12-03T07:46:25Z)", c.toTime)
		}
		c.target = resetTarget{kind: "datetime", at: at}
	}
	if c.dryRun && c.execute {
		return usagef("--dry-run and --execute do not go together")
	}
	return checkActor(c.actor)
}

// partitionList is a flag given once or more, each time a partition or a
// comma-separated list of them.
type partitionList []int32

func (l *partitionList) String() string {
	parts := make([]string, len(*l))
	for i, p := range *l {
		parts[i] = strconv.Itoa(int(p))
	}
	return strings.Join(parts, ",")
}

func (l *partitionList) Set(s string) error {
	for _, w := range strings.Split(s, ",") {
		n, err := strconv.ParseInt(strings.TrimSpace(w), 10, 32)
		if err != nil || n < 0 || n >= partition.MaxCount {
			what := fmt.Sprintf("a partition number: a whole number from 0 to %d", partition.MaxCount-1)
			if strings.TrimSpace(w) == strings.TrimSpace(s) {
				return notA{what}
			}
			return fmt.Errorf("%q is %v", strings.TrimSpace(w), notA{what})
		}
		if slices.Contains(*l, int32(n)) {
			return fmt.Errorf("partition %d is given twice", n)
		}
		*l = append(*l, int32(n))
	}
	return nil
}

func (l *partitionList) Type() string { return "partitions" }

// offsetSpan is a range of offsets a reset skips or repeats, first to last.
type offsetSpan struct {
	First int64 `json:"first"`
	Last  int64 `json:"last"`
	Count int64 `json:"count"`
}

func spanOf(from, to int64) *offsetSpan { // [from, to)
	if to <= from {
		return nil
	}
	return &offsetSpan{First: from, Last: to - 1, Count: to - from}
}

func (s *offsetSpan) String() string {
	if s.First == s.Last {
		return fmt.Sprintf("offset %d", s.First)
	}
	return fmt.Sprintf("offsets %d to %d", s.First, s.Last)
}

// resetRow is one partition of the plan, or of what was done.
type resetRow struct {
	Partition  int32 `json:"partition"`
	NextOffset int64 `json:"next_offset"` // the stored next offset (when executed: the one the reset found)
	NewOffset  int64 `json:"new_offset"`
	LogStart   int64 `json:"log_start"`
	LogEnd     int64 `json:"log_end"`
	// Skipped are the jobs never to be processed; Repeated the jobs that
	// run again (or for the first time, for any the group never reached).
	Skipped  *offsetSpan `json:"skipped"`
	Repeated *offsetSpan `json:"repeated"`
	// DeadLettersRepeated counts the dead letters among the repeated jobs.
	DeadLettersRepeated int64 `json:"dead_letters_repeated"`
	// Holds are the kinds of the partition's open holds that wait for an
	// operator: the reset does not resolve them.
	Holds []string `json:"holds"`
	// Executed: the reset's fence log entry (0: nothing moved) and the
	// partition's log epoch after it.
	Executed bool   `json:"executed"`
	EntryID  int64  `json:"reset_entry_id,omitempty"`
	LogEpoch *int64 `json:"log_epoch,omitempty"`
}

// partLog is a partition's log as the brokers describe it: [start, end),
// and for --to-datetime the offset of the first job at or after the time.
type partLog struct {
	start, end, atTime int64
}

// resetOutOfLog is a plan's refusal: the target is outside the log.
type resetOutOfLog struct {
	partition        int32
	target           resetTarget
	from, to         int64
	logStart, logEnd int64
}

func (e *resetOutOfLog) Error() string {
	where := fmt.Sprintf("offset %d", e.to)
	if e.target.kind == "shift" {
		where = fmt.Sprintf("offset %d (%d %+d)", e.to, e.from, e.target.offset)
	}
	return fmt.Sprintf("partition %d: %s is outside the log, which holds offsets %d to %d (a next offset may be from %d to %d)",
		e.partition, where, e.logStart, e.logEnd-1, e.logStart, e.logEnd)
}

// planReset computes where one partition's offset goes and what that
// skips or repeats; a target outside [log start, log end] is refused.
func planReset(t resetTarget, p int32, next int64, l partLog) (resetRow, error) {
	to := next
	switch t.kind {
	case "earliest":
		to = l.start
	case "latest":
		to = l.end
	case "offset":
		to = t.offset
	case "shift":
		to = next + t.offset
	case "datetime":
		to = l.atTime
	default:
		return resetRow{}, fmt.Errorf("unknown target %q", t.kind)
	}
	if to < l.start || to > l.end {
		return resetRow{}, &resetOutOfLog{partition: p, target: t, from: next, to: to, logStart: l.start, logEnd: l.end}
	}
	return rowFor(p, next, to, l), nil
}

func rowFor(p int32, from, to int64, l partLog) resetRow {
	return resetRow{Partition: p, NextOffset: from, NewOffset: to, LogStart: l.start, LogEnd: l.end,
		Skipped: spanOf(from, to), Repeated: spanOf(to, from), Holds: []string{}}
}

// effect says in a few words what a row does to the jobs.
func (r resetRow) effect() string {
	switch {
	case r.Skipped != nil:
		return fmt.Sprintf("skips %d (%s)", r.Skipped.Count, r.Skipped)
	case r.Repeated != nil:
		return fmt.Sprintf("repeats %d (%s)", r.Repeated.Count, r.Repeated)
	}
	return "none (already there)"
}

// resetReport is the JSON of `admin offsets reset`.
type resetReport struct {
	Group      string     `json:"consumer_group"`
	Topic      string     `json:"topic"`
	Target     string     `json:"target"`
	DryRun     bool       `json:"dry_run"`
	Actor      string     `json:"actor"`
	Partitions []resetRow `json:"partitions"`
	Skipped    int64      `json:"skipped_jobs"`
	Repeated   int64      `json:"repeated_jobs"`
}

func (c *offsetsReset) run(ctx context.Context) error {
	logs, topicID, err := c.readLogs(ctx)
	if err != nil {
		return err
	}
	store, fences, err := c.fencingRows(ctx, c.group)
	if err != nil {
		return err
	}
	next := map[int32]int64{}
	for _, f := range fences {
		if f.Topic == c.topic {
			next[f.Partition.Partition] = f.NextOffset
		}
	}
	parts := c.selected(logs)
	var missing []string
	for _, p := range parts {
		if _, ok := next[p]; !ok {
			missing = append(missing, strconv.Itoa(int(p)))
		}
	}
	if len(missing) > 0 {
		which, has, it := "partition "+missing[0], "has", "it"
		if len(missing) > 1 {
			which, has, it = "partitions "+strings.Join(missing, ", "), "have", "them"
		}
		return fmt.Errorf("%s of topic %s %s no fencing row for group %s in schema %s: no worker of the group has claimed %s, so there is no stored offset to move; nothing was changed "+
			"(a partition's first claim starts at the offset the group committed in Kafka, else at the log's start: to choose where it starts, commit that offset for the group before any worker runs, e.g. with kafka-consumer-groups --reset-offsets)",
			which, printableString(c.topic), has, printableString(c.group), c.schema, it)
	}
	if err := c.checkLogIdentity(ctx, topicID); err != nil {
		return err
	}
	rows := make([]resetRow, 0, len(parts))
	for _, p := range parts {
		r, err := planReset(c.target, p, next[p], logs[p])
		if err != nil {
			return fmt.Errorf("%v; nothing was changed", err)
		}
		rows = append(rows, r)
	}
	if err := c.annotate(ctx, store, rows); err != nil {
		return err
	}
	if !c.execute {
		return c.report(rows, true)
	}
	done := make([]resetRow, 0, len(rows))
	for _, r := range rows {
		p := sink.Partition{Group: c.group, Topic: c.topic, Partition: r.Partition}
		req := sink.ResetRequest{Partition: p, To: r.NewOffset, LogStart: r.LogStart, LogEnd: r.LogEnd, TopicID: topicID, By: c.actor}
		if c.target.kind == "shift" {
			// From wherever the offset is when the reset runs: workers
			// may have moved it since the plan was read.
			req.To, req.Shift = c.target.offset, true
		}
		res, err := store.ResetOffset(ctx, req)
		if err != nil {
			if len(done) > 0 {
				_ = c.report(done, false)
			}
			return c.resetFailed(r.Partition, done, rows, err)
		}
		d := rowFor(r.Partition, res.From, res.To, partLog{start: r.LogStart, end: r.LogEnd})
		d.Holds, d.Executed, d.EntryID = r.Holds, true, res.EntryID
		epoch := res.LogEpoch
		d.LogEpoch = &epoch
		if d.Repeated != nil {
			if d.DeadLettersRepeated, err = store.DeadLettersIn(ctx, p, d.Repeated.First, d.Repeated.Last+1); err != nil {
				return c.dbError("counting the dead letters of the repeated jobs", err)
			}
		}
		done = append(done, d)
	}
	return c.report(done, false)
}

// resetFailed is the sentence for a reset that stopped at partition p:
// what was done before it and what was not.
func (c *offsetsReset) resetFailed(p int32, done, rows []resetRow, err error) error {
	var oe *sink.ResetOutOfLogError
	var ol *sink.ResetOtherLogError
	msg := c.dbError(fmt.Sprintf("resetting partition %d", p), err).Error()
	switch {
	case errors.As(err, &oe):
		msg = fmt.Sprintf("partition %d: %v (the offset moved since the plan was read)", p, oe)
	case errors.As(err, &ol):
		msg = fmt.Sprintf("partition %d: %v", p, ol)
	case errors.Is(err, sink.ErrNoFencingRow):
		msg = fmt.Sprintf("partition %d: its fencing row is gone", p)
	}
	var left []string
	for _, r := range rows[len(done):] {
		left = append(left, strconv.Itoa(int(r.Partition)))
	}
	if len(done) == 0 {
		return fmt.Errorf("%s; nothing was changed", msg)
	}
	var did []string
	for _, r := range done {
		did = append(did, strconv.Itoa(int(r.Partition)))
	}
	return fmt.Errorf("%s; partitions %s were reset (shown above), partitions %s were not", msg, strings.Join(did, ", "), strings.Join(left, ", "))
}

// readLogs reads the topic's partitions, their logs and its id from the
// brokers, and for --to-datetime the first offset at or after the time.
func (c *offsetsReset) readLogs(ctx context.Context) (map[int32]partLog, [16]byte, error) {
	var id [16]byte
	cl, err := c.client()
	if err != nil {
		return nil, id, err
	}
	if _, err := checkTopics(ctx, cl, c.brokers(), []string{c.topic}); err != nil {
		return nil, id, err
	}
	adm := kadm.NewClient(cl)
	td, err := adm.ListTopics(ctx, c.topic)
	if err != nil {
		return nil, id, c.kafkaError("reading the topic's metadata", err)
	}
	d := td[c.topic]
	id = d.ID
	starts, err := adm.ListStartOffsets(ctx, c.topic)
	if err != nil {
		return nil, id, c.kafkaError("listing the log start offsets of "+c.topic, err)
	}
	ends, err := adm.ListEndOffsets(ctx, c.topic)
	if err != nil {
		return nil, id, c.kafkaError("listing the end offsets of "+c.topic, err)
	}
	var at kadm.ListedOffsets
	if c.target.kind == "datetime" {
		if at, err = adm.ListOffsetsAfterMilli(ctx, c.target.at.UnixMilli(), c.topic); err != nil {
			return nil, id, c.kafkaError("listing the offsets at "+c.target.at.Format(time.RFC3339), err)
		}
	}
	out := map[int32]partLog{}
	for p := range d.Partitions {
		s, ok1 := starts.Lookup(c.topic, p)
		e, ok2 := ends.Lookup(c.topic, p)
		if !ok1 || !ok2 || s.Err != nil || e.Err != nil {
			return nil, id, fmt.Errorf("the brokers did not say where partition %d of topic %s starts and ends: %v", p, c.topic, errors.Join(s.Err, e.Err))
		}
		l := partLog{start: s.Offset, end: e.Offset, atTime: -1}
		if c.target.kind == "datetime" {
			a, ok := at.Lookup(c.topic, p)
			if !ok || a.Err != nil {
				return nil, id, fmt.Errorf("the brokers did not say which offset of partition %d of topic %s is at %s: %v", p, c.topic, c.target.at.Format(time.RFC3339), a.Err)
			}
			l.atTime = max(a.Offset, l.start) // a log start above the time's first job: the log's start
		}
		out[p] = l
	}
	for _, p := range c.partitions {
		if _, ok := out[p]; !ok {
			return nil, id, usagef("topic %s has %d partitions: there is no partition %d", c.topic, len(out), p)
		}
	}
	return out, id, nil
}

// selected are the partitions to reset, in order.
func (c *offsetsReset) selected(logs map[int32]partLog) []int32 {
	parts := append([]int32(nil), c.partitions...)
	if c.all {
		for p := range logs {
			parts = append(parts, p)
		}
	}
	slices.Sort(parts)
	return parts
}

// checkLogIdentity refuses a topic whose stored offsets belong to another
// log of the same name (deleted and re-created): its workers hold it as
// topic-recreated, and acknowledging that moves the offsets.
func (c *offsetsReset) checkLogIdentity(ctx context.Context, id [16]byte) error {
	if id == [16]byte{} {
		return nil
	}
	store, err := c.Store()
	if err != nil {
		return err
	}
	ids, err := store.TopicIDs(ctx, c.group, c.topic)
	if err != nil {
		return c.dbError("reading the fencing rows' topic ids", err)
	}
	for _, u := range ids {
		if u != id {
			return fmt.Errorf("the offsets group %s stores for topic %s belong to an earlier topic of that name (deleted and re-created): acknowledge its topic-recreated hold (tenure admin holds acknowledge) instead; nothing was changed",
				printableString(c.group), c.topic)
		}
	}
	return nil
}

// annotate adds to each row the partition's open holds and the dead
// letters among the jobs it repeats.
func (c *offsetsReset) annotate(ctx context.Context, store *sink.Store, rows []resetRow) error {
	holds, err := store.OpenHolds(ctx, c.group)
	if err != nil {
		return c.dbError("reading the holds", err)
	}
	for i := range rows {
		r := &rows[i]
		for _, h := range holds {
			if h.Partition.Topic == c.topic && h.Partition.Partition == r.Partition && h.Kind.NeedsAck() {
				r.Holds = append(r.Holds, string(h.Kind))
			}
		}
		if r.Repeated != nil {
			p := sink.Partition{Group: c.group, Topic: c.topic, Partition: r.Partition}
			if r.DeadLettersRepeated, err = store.DeadLettersIn(ctx, p, r.Repeated.First, r.Repeated.Last+1); err != nil {
				return c.dbError("counting the dead letters of the repeated jobs", err)
			}
		}
	}
	return nil
}

// report prints the plan (dry) or what was done.
func (c *offsetsReset) report(rows []resetRow, dry bool) error {
	rep := resetReport{Group: c.group, Topic: c.topic, Target: c.target.String(), DryRun: dry, Actor: c.actor, Partitions: rows}
	moved := 0
	for _, r := range rows {
		if r.Skipped != nil {
			rep.Skipped += r.Skipped.Count
		}
		if r.Repeated != nil {
			rep.Repeated += r.Repeated.Count
		}
		if r.NewOffset != r.NextOffset {
			moved++
		}
	}
	if c.output == "json" {
		return c.json(rep)
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].Partition < rows[j].Partition })
	what := "plan (dry run: nothing was changed)"
	if !dry {
		what = "done, recorded as reset by " + printableString(c.actor)
	}
	fmt.Fprintf(c.stdout, "group %s, topic %s: offsets to %s; %s\n", printableString(c.group), printableString(c.topic), c.target, what)
	tw := c.table()
	head := "PARTITION\tNEXT_OFFSET\tNEW_OFFSET\tLOG_START\tLOG_END\tJOBS"
	if !dry {
		head += "\tFENCE_LOG\tLOG_EPOCH"
	}
	fmt.Fprintln(tw, head)
	for _, r := range rows {
		line := fmt.Sprintf("%d\t%d\t%d\t%d\t%d\t%s", r.Partition, r.NextOffset, r.NewOffset, r.LogStart, r.LogEnd, r.effect())
		if !dry {
			entry := "-"
			if r.EntryID != 0 {
				entry = fmt.Sprintf("reset #%d", r.EntryID)
			}
			line += "\t" + entry + "\t" + dashInt(r.LogEpoch)
		}
		fmt.Fprintln(tw, line)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range rows {
		if r.DeadLettersRepeated > 0 {
			fmt.Fprintf(c.stdout, "note: partition %d: %d of the repeated jobs are in the dead-letter table: they run again, and one that fails again is dead-lettered again; look at them first (tenure admin dlq list --group %s --topic %s)\n",
				r.Partition, r.DeadLettersRepeated, printableString(c.group), printableString(c.topic))
		}
		if len(r.Holds) > 0 {
			fmt.Fprintf(c.stdout, "note: partition %d is held (%s): the reset does not resolve that; the workers go on only once it is acknowledged (tenure admin holds)\n",
				r.Partition, strings.Join(r.Holds, ", "))
		}
	}
	summary := fmt.Sprintf("%s repeated, %s skipped, on %d of %d partitions", countJobs(rep.Repeated), countJobs(rep.Skipped), moved, len(rows))
	if dry {
		fmt.Fprintf(c.stdout, "%s; run again with --execute to move the offsets (recorded as reset by %s)\n", summary, printableString(c.actor))
		return nil
	}
	fmt.Fprintf(c.stdout, "%s; workers that hold these partitions, busy or idle, have their batches in flight rejected and go on from the new offsets within seconds\n", summary)
	return nil
}

func countJobs(n int64) string {
	if n == 1 {
		return "1 job"
	}
	return strconv.FormatInt(n, 10) + " jobs"
}
