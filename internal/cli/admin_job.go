package cli

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/partition"
	"github.com/tenure-dev/tenure/sink"
)

// jobLookup is `tenure admin job TOPIC/PARTITION/OFFSET`: what became of
// one job for a group, from the fencing row, the fence log, the dead-letter
// table and, for a job the group has not reached, the log.
type jobLookup struct {
	admin
	group string

	topic  string
	part   int32
	offset int64
}

func (c *jobLookup) define(f *flagSet) {
	c.withDB(f)
	f.String(&c.group, "group", "", "the consumer group (offsets, and so what became of a job, are per group)", arg("G"), required)
	c.withKafka(f, brokersUsage+": needed for a job the group has not reached (pending, deleted from the log, or beyond its end)")
	c.withTableOutput(f)
}

// parseJobID reads a job's id as handlers get it and workers log it
// (consumer.JobID): TOPIC/PARTITION/OFFSET.
func parseJobID(s string) (topic string, part int32, offset int64, err error) {
	fields := strings.Split(s, "/")
	if len(fields) != 3 {
		return "", 0, 0, usagef("job %q is not TOPIC/PARTITION/OFFSET (the id a handler gets, and workers and `admin dlq list` show)", s)
	}
	if err := consumer.ValidateTopic(fields[0]); err != nil {
		return "", 0, 0, usagef("job %q: %v", s, err)
	}
	p, err := strconv.ParseInt(fields[1], 10, 32)
	if err != nil || p < 0 || p >= partition.MaxCount {
		return "", 0, 0, usagef("job %q: the partition %q is not a whole number from 0 to %d", s, fields[1], partition.MaxCount-1)
	}
	o, err := strconv.ParseInt(fields[2], 10, 64)
	if err != nil || o < 0 {
		return "", 0, 0, usagef("job %q: the offset %q is not a whole number, 0 or more", s, fields[2])
	}
	return fields[0], int32(p), o, nil
}

func (c *jobLookup) check(args []string) error {
	if err := validGroup("group", c.group); err != nil {
		return err
	}
	if len(args) != 1 {
		return usagef("give one job: TOPIC/PARTITION/OFFSET")
	}
	var err error
	c.topic, c.part, c.offset, err = parseJobID(args[0])
	return err
}

// jobReport is `admin job`'s answer (its --output json).
type jobReport struct {
	Job       string `json:"job"`
	Group     string `json:"consumer_group"`
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
	// State: committed, dead-lettered, pending, lost, not-in-log, or
	// unknown (the fence log disagrees with the fencing row).
	State  string `json:"state"`
	Reason string `json:"reason"`
	// NextOffset is the group's stored next offset for the partition
	// (null: no fencing row); LagBefore, for a pending job, the jobs
	// before it.
	NextOffset *int64 `json:"next_offset"`
	LagBefore  *int64 `json:"lag_before"`
	LogStart   *int64 `json:"log_start"`
	LogEnd     *int64 `json:"log_end"`
	// Commits are the fence log's commits whose batch covered the job,
	// oldest first (several when a reset moved the offsets back over it).
	Commits []jobCommit `json:"commits"`
	// Resets are the operators' resets that moved the offsets over it.
	Resets     []jobReset     `json:"resets"`
	DeadLetter *deadLetterRow `json:"dead_letter"`
	// FenceLogPruned says where the partition's fence log was cut (null:
	// never): commits before it are gone.
	FenceLogPruned *jobCut  `json:"fence_log_pruned"`
	Holds          []string `json:"holds"`
}

type jobCommit struct {
	ID      int64     `json:"fence_log_id"`
	At      time.Time `json:"at"`
	Token   string    `json:"token"`
	Owner   string    `json:"owner"`
	ClaimID int64     `json:"claim_id"`
	From    int64     `json:"from_offset"` // the batch: [from, to)
	To      int64     `json:"to_offset"`
}

type jobReset struct {
	ID     int64     `json:"fence_log_id"`
	At     time.Time `json:"at"`
	Actor  string    `json:"actor"`
	From   int64     `json:"from_offset"`
	To     int64     `json:"to_offset"`
	Effect string    `json:"effect"` // skipped or repeated: what it did to this job
}

type jobCut struct {
	ThroughID  int64     `json:"through_id"`
	NextOffset int64     `json:"next_offset"`
	PrunedAt   time.Time `json:"pruned_at"`
}

func (c *jobLookup) run(ctx context.Context) error {
	store, err := c.Store()
	if err != nil {
		return err
	}
	p := sink.Partition{Group: c.group, Topic: c.topic, Partition: c.part}
	r := jobReport{Job: fmt.Sprintf("%s/%d/%d", c.topic, c.part, c.offset), Group: c.group, Topic: c.topic, Partition: c.part, Offset: c.offset,
		Commits: []jobCommit{}, Resets: []jobReset{}, Holds: []string{}}
	f, err := store.Get(ctx, p)
	found := err == nil
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return c.dbError("reading the fencing row", err)
	default:
		r.NextOffset = &f.NextOffset
	}
	jl, err := store.FenceLogAt(ctx, p, c.offset)
	if err != nil {
		return c.dbError("reading the fence log", err)
	}
	for _, e := range jl.Commits {
		r.Commits = append(r.Commits, jobCommit{ID: e.ID, At: e.At.UTC(), Token: e.Token.String(), Owner: e.Owner, ClaimID: e.ClaimID, From: e.From, To: e.To})
	}
	var lastSkip *jobReset
	for _, e := range jl.Resets {
		jr := jobReset{ID: e.ID, At: e.At.UTC(), Actor: e.Owner, From: e.From, To: e.To, Effect: "repeated"}
		if e.To > e.From {
			jr.Effect = "skipped"
		}
		r.Resets = append(r.Resets, jr)
		if jr.Effect == "skipped" {
			lastSkip = &r.Resets[len(r.Resets)-1]
		}
	}
	if jl.Cut != nil {
		r.FenceLogPruned = &jobCut{ThroughID: jl.Cut.ThroughID, NextOffset: jl.Cut.NextOffset, PrunedAt: jl.Cut.PrunedAt.UTC()}
	}
	holds, err := store.OpenHolds(ctx, c.group)
	if err != nil {
		return c.dbError("reading the holds", err)
	}
	for _, h := range holds {
		if h.Partition == p && h.Kind.NeedsAck() {
			r.Holds = append(r.Holds, string(h.Kind))
		}
	}
	d, err := store.DeadLetterAt(ctx, p, c.offset)
	switch {
	case errors.Is(err, sink.ErrNoDeadLetter):
	case err != nil:
		return c.dbError("reading the dead letters", err)
	default:
		row := newDeadLetterRow(d)
		r.DeadLetter = &row
	}

	ahead := !found || c.offset >= f.NextOffset // not reached (again)
	again := ""
	if found && ahead && len(r.Commits)+boolInt(r.DeadLetter != nil) > 0 {
		again = "; it was processed before, and runs again: the offsets were moved back over it"
		if n := len(r.Resets); n > 0 {
			again += fmt.Sprintf(" (reset #%d by %s)", r.Resets[n-1].ID, printableString(r.Resets[n-1].Actor))
		}
	}
	switch {
	case r.DeadLetter != nil:
		r.State = "dead-lettered"
		r.Reason = fmt.Sprintf("dead-lettered at %s by %s with token %s after %d attempts (dead letter %d, %s): %s",
			r.DeadLetter.DeadAt.Format(time.RFC3339), printableString(d.Owner), r.DeadLetter.Token, d.Attempts, d.ID, d.Status, printableString(d.Error))
		if again != "" {
			r.Reason += again + "; if it fails again it is dead-lettered again"
		}
	case len(r.Commits) > 0 && !ahead:
		r.State = "committed"
		last := r.Commits[len(r.Commits)-1]
		batch := "a batch of its own"
		if last.To-last.From > 1 {
			batch = fmt.Sprintf("the batch of offsets %d to %d", last.From, last.To-1)
		}
		r.Reason = fmt.Sprintf("committed at %s by %s with token %s (claim %d), in %s (fence log #%d)",
			last.At.Format(time.RFC3339Nano), printableString(last.Owner), last.Token, last.ClaimID, batch, last.ID)
		if len(r.Commits) > 1 {
			r.Reason += fmt.Sprintf("; committed %d times in all: a reset moved the offsets back over it", len(r.Commits))
		}
	case ahead:
		if c.kafka.brokers == "" {
			return usagef("job %s is at or beyond the group's stored next offset%s: whether it is pending, deleted from the log or beyond its end needs the log: give --brokers",
				r.Job, nextText(r.NextOffset))
		}
		start, end, err := c.logOf(ctx)
		if err != nil {
			return err
		}
		r.LogStart, r.LogEnd = &start, &end
		switch {
		case c.offset >= end:
			r.State = "not-in-log"
			r.Reason = fmt.Sprintf("beyond the log's end: partition %d holds offsets up to %d (its next job gets offset %d)", c.part, end-1, end)
		case c.offset < start:
			r.State = "lost"
			if found {
				r.Reason = fmt.Sprintf("deleted from the log (it now starts at %d) before the group processed it (stored next offset %d): the workers hold the partition as log-truncated until an operator acknowledges it", start, f.NextOffset)
			} else {
				r.Reason = fmt.Sprintf("deleted from the log (it now starts at %d) before any worker of the group claimed the partition", start)
			}
		case !found:
			r.State = "pending"
			r.Reason = "not processed yet: no worker of the group has claimed the partition; its first claim starts at the offset the group committed in Kafka, or at the log's start"
		default:
			r.State = "pending"
			lag := c.offset - f.NextOffset
			r.LagBefore = &lag
			r.Reason = fmt.Sprintf("not processed yet: the stored next offset is %d, %s before it", f.NextOffset, countJobs(lag))
		}
		if len(r.Holds) > 0 && r.State == "pending" {
			r.Reason += fmt.Sprintf("; the partition is held (%s): nothing is processed until that is acknowledged (tenure admin holds)", strings.Join(r.Holds, ", "))
		}
		r.Reason += again
	case lastSkip != nil:
		r.State = "lost"
		r.Reason = fmt.Sprintf("skipped: reset #%d by %s at %s moved the offsets from %d to %d, over it", lastSkip.ID, printableString(lastSkip.Actor),
			lastSkip.At.Format(time.RFC3339), lastSkip.From, lastSkip.To)
	case jl.Cut != nil && c.offset < jl.Cut.NextOffset:
		r.State = "committed"
		r.Reason = fmt.Sprintf("below the stored next offset %d, but the fence log entries that would say when and by whom were pruned (entries up to #%d, offsets below %d, pruned at %s): committed, unless a reset pruned with them skipped it; it has no dead letter",
			f.NextOffset, jl.Cut.ThroughID, jl.Cut.NextOffset, jl.Cut.PrunedAt.UTC().Format(time.RFC3339))
	case jl.Cut == nil && jl.FirstClaim != nil && c.offset < jl.FirstClaim.From:
		r.State = "lost"
		r.Reason = fmt.Sprintf("never processed by this group: its first claim of the partition (fence log #%d at %s) started at offset %d, after it (the group's committed Kafka offset or the log's start then)",
			jl.FirstClaim.ID, jl.FirstClaim.At.UTC().Format(time.RFC3339), jl.FirstClaim.From)
	default:
		r.State = "unknown"
		r.Reason = fmt.Sprintf("below the stored next offset %d, but no commit in the fence log covers it and no reset skipped it: the fence log disagrees with the fencing row (check the history)", f.NextOffset)
	}
	if c.output == "json" {
		return c.json(r)
	}
	return printJob(c.stdout, r)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func nextText(n *int64) string {
	if n == nil {
		return " (it has none: no worker claimed the partition)"
	}
	return fmt.Sprintf(" %d", *n)
}

// logOf reads where the job's partition starts and ends.
func (c *jobLookup) logOf(ctx context.Context) (start, end int64, err error) {
	cl, err := c.client()
	if err != nil {
		return 0, 0, err
	}
	counts, err := checkTopics(ctx, cl, c.brokers(), []string{c.topic})
	if err != nil {
		return 0, 0, err
	}
	if c.part >= counts[c.topic] {
		return 0, 0, fmt.Errorf("topic %s has %d partitions: there is no partition %d", c.topic, counts[c.topic], c.part)
	}
	adm := kadm.NewClient(cl)
	starts, err := adm.ListStartOffsets(ctx, c.topic)
	if err != nil {
		return 0, 0, c.kafkaError("listing the log start offsets of "+c.topic, err)
	}
	ends, err := adm.ListEndOffsets(ctx, c.topic)
	if err != nil {
		return 0, 0, c.kafkaError("listing the end offsets of "+c.topic, err)
	}
	s, ok1 := starts.Lookup(c.topic, c.part)
	e, ok2 := ends.Lookup(c.topic, c.part)
	if !ok1 || !ok2 || s.Err != nil || e.Err != nil {
		return 0, 0, fmt.Errorf("the brokers did not say where partition %d of topic %s starts and ends: %v", c.part, c.topic, errors.Join(s.Err, e.Err))
	}
	return s.Offset, e.Offset, nil
}

func printJob(w interface{ Write([]byte) (int, error) }, r jobReport) error {
	tw := tabwriter.NewWriter(w, 0, 4, 1, ' ', 0)
	fmt.Fprintf(tw, "job\t%s\n", printableString(r.Job))
	fmt.Fprintf(tw, "group\t%s\n", printableString(r.Group))
	fmt.Fprintf(tw, "state\t%s\n", r.State)
	fmt.Fprintf(tw, "reason\t%s\n", r.Reason)
	fmt.Fprintf(tw, "next offset\t%s\n", dashInt(r.NextOffset))
	if r.LogStart != nil {
		fmt.Fprintf(tw, "log\toffsets %d to %d\n", *r.LogStart, *r.LogEnd-1)
	}
	if r.LagBefore != nil {
		fmt.Fprintf(tw, "lag before it\t%d\n", *r.LagBefore)
	}
	if len(r.Commits) == 0 {
		fmt.Fprintf(tw, "commits\t(none in the fence log)\n")
	}
	for _, cm := range r.Commits {
		fmt.Fprintf(tw, "commit\t#%d at %s: %s by %s, token %s, claim %d\n", cm.ID, cm.At.Format(time.RFC3339Nano),
			spanOf(cm.From, cm.To), printableString(cm.Owner), cm.Token, cm.ClaimID)
	}
	for _, rs := range r.Resets {
		fmt.Fprintf(tw, "reset\t#%d at %s by %s: from %d to %d (%s it)\n", rs.ID, rs.At.Format(time.RFC3339Nano), printableString(rs.Actor), rs.From, rs.To, rs.Effect)
	}
	if r.DeadLetter == nil {
		fmt.Fprintf(tw, "dead letter\t(none)\n")
	} else {
		fmt.Fprintf(tw, "dead letter\t%d (%s; see tenure admin dlq show %d)\n", r.DeadLetter.ID, r.DeadLetter.Status, r.DeadLetter.ID)
	}
	if r.FenceLogPruned != nil {
		fmt.Fprintf(tw, "fence log\tpruned through #%d (offsets below %d) at %s\n", r.FenceLogPruned.ThroughID, r.FenceLogPruned.NextOffset,
			r.FenceLogPruned.PrunedAt.Format(time.RFC3339))
	}
	if len(r.Holds) > 0 {
		fmt.Fprintf(tw, "holds\t%s\n", strings.Join(r.Holds, ", "))
	}
	return tw.Flush()
}
