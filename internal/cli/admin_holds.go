package cli

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/internal/fence"
	"github.com/tenure-dev/tenure/partition"
	"github.com/tenure-dev/tenure/sink"
)

// holdRow is one row of `tenure admin holds`: an open hold of a
// partition, or a topic whose partition count changed (kind
// partitions-changed: every partition of it, partition null, with the
// recorded and current counts).
type holdRow struct {
	Group         string     `json:"consumer_group"`
	Topic         string     `json:"topic"`
	Partition     *int32     `json:"partition"`
	Kind          string     `json:"kind"`
	NeedsAck      bool       `json:"needs_ack"`
	NextOffset    *int64     `json:"next_offset"`
	LogStart      *int64     `json:"log_start"`
	HighWatermark *int64     `json:"high_watermark"`
	From          *int64     `json:"from_offset"`
	To            *int64     `json:"to_offset"`
	FirstJob      string     `json:"first_job"`
	LastJob       string     `json:"last_job"`
	Token         string     `json:"token"`
	Owner         string     `json:"owner"`
	Since         *time.Time `json:"since"`
	Reason        string     `json:"reason"`
	// partitions-changed: the count the group recorded, and Kafka's.
	RecordedPartitions *int32 `json:"recorded_partitions"`
	Partitions         *int32 `json:"partitions"`
}

// kindPartitionsChanged is the kind of a topic whose partition count in
// Kafka is not the one its group recorded: not a row of partition_holds,
// but held all the same (assignments: held-partitions).
const kindPartitionsChanged = "partitions-changed"

func offsetPtr(o int64) *int64 {
	if o < 0 {
		return nil
	}
	return &o
}

func toHoldRow(h sink.Hold) holdRow {
	since := h.Since.UTC()
	r := holdRow{Group: h.Partition.Group, Topic: h.Partition.Topic, Partition: &h.Partition.Partition, Kind: string(h.Kind),
		NeedsAck: h.Kind.NeedsAck(), NextOffset: offsetPtr(h.NextOffset), LogStart: offsetPtr(h.LogStart),
		HighWatermark: offsetPtr(h.HighWatermark), From: offsetPtr(h.From), To: offsetPtr(h.To),
		FirstJob: h.FirstJob, LastJob: h.LastJob, Owner: h.Owner, Since: &since, Reason: h.Reason}
	if h.Token != (sink.Token{}) {
		r.Token = h.Token.String()
	}
	return r
}

// holds is `tenure admin holds`: the open holds, partitions that workers do
// not process, and why.
type holds struct{ groupFilter }

func (c *holds) define(f *flagSet) {
	c.withDB(f)
	c.groupFlag(f, "holds")
	c.withKafka(f, "Kafka seed brokers: with them, the topics whose partition count changed are listed too (kind partitions-changed: Kafka has the current counts)")
	c.withTableOutput(f)
}

func (c *holds) run(ctx context.Context) error {
	store, err := c.Store()
	if err != nil {
		return err
	}
	holds, err := store.OpenHolds(ctx, c.group)
	if err != nil {
		return c.dbError("reading the holds", err)
	}
	rows := make([]holdRow, len(holds))
	for i, h := range holds {
		rows[i] = toHoldRow(h)
	}
	layouts, err := c.layouts(ctx)
	if err != nil {
		return c.dbError("reading the recorded partition counts", err)
	}
	changed, err := c.partitionsChanged(ctx, layouts)
	if err != nil {
		return err
	}
	rows = append(rows, changed...)
	if c.output == "json" {
		if err := c.json(rows); err != nil {
			return err
		}
	} else if err := c.printTable(rows); err != nil {
		return err
	}
	note := ""
	if c.kafka.brokers == "" && len(layouts) > 0 {
		note = fmt.Sprintf("topics whose partition count changed (kind %s) are not listed: give --brokers (or set TENURE_BROKERS), Kafka has the current counts", kindPartitionsChanged)
	}
	switch {
	case len(rows) == 0:
		c.nothingListed("held partitions", note)
	case note != "":
		fmt.Fprintln(c.stderr, note)
	}
	return nil
}

func (c *holds) printTable(rows []holdRow) error {
	tw := c.table()
	fmt.Fprintln(tw, "GROUP\tTOPIC\tPARTITION\tKIND\tNEEDS_ACK\tNEXT_OFFSET\tJOBS\tBY\tSINCE\tREASON")
	for _, r := range rows {
		jobs := r.FirstJob
		if r.LastJob != r.FirstJob {
			jobs += " to " + r.LastJob
		}
		ack := "no"
		if r.NeedsAck {
			ack = "yes"
		}
		part, since := "all", "-"
		if r.Partition != nil {
			part = fmt.Sprint(*r.Partition)
		}
		if r.Since != nil {
			since = r.Since.Format("2006-01-02 15:04:05Z")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", printableString(r.Group), printableString(r.Topic), part,
			r.Kind, ack, dashInt(r.NextOffset), dash(printableString(jobs)), dash(printableString(r.Owner)),
			since, printableString(r.Reason))
	}
	return tw.Flush()
}

// layouts reads the partition counts the groups (--group) recorded.
func (c *holds) layouts(ctx context.Context) ([]sink.Layout, error) {
	store, err := c.Store()
	if err != nil {
		return nil, err
	}
	return store.Layouts(ctx, c.group)
}

// partitionsChanged compares the recorded counts with Kafka's (with
// --brokers; none without): a row per topic whose count changed, which its
// group's workers hold whole. A topic Kafka no longer has is left out.
func (c *holds) partitionsChanged(ctx context.Context, layouts []sink.Layout) ([]holdRow, error) {
	if c.kafka.brokers == "" || len(layouts) == 0 {
		return nil, nil
	}
	cl, err := c.client()
	if err != nil {
		return nil, err
	}
	var topics []string
	for _, l := range layouts {
		if !slices.Contains(topics, l.Topic) {
			topics = append(topics, l.Topic)
		}
	}
	td, err := kadm.NewClient(cl).ListTopics(ctx, topics...)
	if err != nil {
		return nil, c.kafkaError("reading the topics' partition counts", err)
	}
	var out []holdRow
	for _, l := range layouts {
		d, ok := td[l.Topic]
		if !ok || d.Err != nil || int32(len(d.Partitions)) == l.Partitions {
			continue
		}
		recorded, now := l.Partitions, int32(len(d.Partitions))
		out = append(out, holdRow{Group: l.Group, Topic: l.Topic, Kind: kindPartitionsChanged, NeedsAck: now > recorded,
			Reason:             consumer.PartitionsChangedReason(l.Group, l.Topic, recorded, now),
			RecordedPartitions: &recorded, Partitions: &now})
	}
	return out, nil
}

// holdAcknowledge is `tenure admin holds acknowledge`: it resolves a
// partition's hold for an operator, recorded with the actor; the workers
// holding it claim it again within seconds and go on from the stored
// offset, which the acknowledgement may move (see
// sink.Store.AcknowledgeHold).
type holdAcknowledge struct {
	admin
	group, topic, actor string
	partition           int
}

func (c *holdAcknowledge) define(f *flagSet) {
	c.withDB(f)
	f.String(&c.group, "group", "", "the consumer group", arg("G"), required)
	f.String(&c.topic, "topic", "", "the topic", arg("T"), required)
	f.Int(&c.partition, "partition", -1, "the partition", arg("P"), required)
	c.withKafka(f, "Kafka seed brokers: needed for holds about the log (where it now starts and ends)")
	c.actorFlag(f, &c.actor)
}

func (c *holdAcknowledge) check([]string) error {
	if err := validGroup("group", c.group); err != nil {
		return err
	}
	if err := validTopics("topic", []string{c.topic}); err != nil {
		return err
	}
	if c.partition < 0 || c.partition >= partition.MaxCount {
		return usagef("--partition is required: a partition number from 0 to %d", partition.MaxCount-1)
	}
	return checkActor(c.actor)
}

func (c *holdAcknowledge) run(ctx context.Context) error {
	store, err := c.Store()
	if err != nil {
		return err
	}
	p := sink.Partition{Group: c.group, Topic: c.topic, Partition: int32(c.partition)}
	noHold := fmt.Errorf("partition %s has no hold that waits for an acknowledgement in schema %s; nothing was changed", printableString(p.String()), c.schema)
	open, held, err := fence.Of(store).OpenHoldNeedingAck(ctx, p)
	if err != nil {
		return c.dbError("reading the holds", err)
	}
	if !held {
		return noHold
	}
	logStart, hwm, topicID := int64(-1), int64(-1), [16]byte{}
	if open.Kind != sink.HoldHandlerBug {
		if c.kafka.brokers == "" {
			return usagef("--brokers is required to acknowledge a %s hold: where the log now starts and ends decides the offset to go on from", open.Kind)
		}
		if logStart, hwm, topicID, err = c.logOf(ctx); err != nil {
			return err
		}
	}
	h, err := store.AcknowledgeHold(ctx, p, c.actor, logStart, hwm, topicID)
	if errors.Is(err, sink.ErrNoHold) {
		return noHold
	}
	if err != nil {
		return c.dbError("acknowledging the hold", err)
	}
	extra := ""
	if h.Kind == sink.HoldHandlerBug {
		extra = fmt.Sprintf("; the batch from offset %d runs again: whatever the handler committed itself for %s stays", h.From, printableString(h.FirstJob))
	}
	goOn := "workers holding it go on within seconds"
	if next, still, err := fence.Of(store).OpenHoldNeedingAck(ctx, p); err == nil && still {
		// Holds of different kinds wait for one acknowledgement each.
		goOn = fmt.Sprintf("the partition is still held: a %s hold (since %s) waits for its own acknowledgement; run this command again once you have looked at it (tenure admin holds)",
			next.Kind, next.Since.UTC().Format(time.RFC3339))
	}
	fmt.Fprintf(c.stdout, "acknowledged the %s hold of partition %s (since %s, by %s): %s, recorded as done by %s; %s%s\n",
		h.Kind, printableString(p.String()), h.Since.UTC().Format(time.RFC3339), printableString(h.Owner), h.Resolution, c.actor, goOn, extra)
	return nil
}

// logOf reads the partition's log start, end and topic id from the
// brokers.
func (c *holdAcknowledge) logOf(ctx context.Context) (start, end int64, id [16]byte, err error) {
	cl, err := c.client()
	if err != nil {
		return 0, 0, id, err
	}
	adm := kadm.NewClient(cl)
	td, err := adm.ListTopics(ctx, c.topic)
	if err != nil {
		return 0, 0, id, c.kafkaError("reading the topic's metadata", err)
	}
	d, ok := td[c.topic]
	if !ok || d.Err != nil {
		return 0, 0, id, fmt.Errorf("topic %q does not exist on the brokers", c.topic)
	}
	starts, err := adm.ListStartOffsets(ctx, c.topic)
	if err != nil {
		return 0, 0, id, c.kafkaError("listing log start offsets", err)
	}
	ends, err := adm.ListEndOffsets(ctx, c.topic)
	if err != nil {
		return 0, 0, id, c.kafkaError("listing end offsets", err)
	}
	p := int32(c.partition)
	s, ok1 := starts.Lookup(c.topic, p)
	en, ok2 := ends.Lookup(c.topic, p)
	if !ok1 || !ok2 || s.Err != nil || en.Err != nil {
		return 0, 0, id, fmt.Errorf("topic %q has no partition %d on the brokers", c.topic, p)
	}
	return s.Offset, en.Offset, d.ID, nil
}
