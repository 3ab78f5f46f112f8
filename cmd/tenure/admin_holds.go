package main

import (
	"context"
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/tenure-dev/tenure/partition"
	"github.com/tenure-dev/tenure/sink"
)

// holdRow is one row of `tenure admin holds`.
type holdRow struct {
	Group         string    `json:"consumer_group"`
	Topic         string    `json:"topic"`
	Partition     int32     `json:"partition"`
	Kind          string    `json:"kind"`
	NeedsAck      bool      `json:"needs_ack"`
	NextOffset    *int64    `json:"next_offset"`
	LogStart      *int64    `json:"log_start"`
	HighWatermark *int64    `json:"high_watermark"`
	From          *int64    `json:"from_offset"`
	To            *int64    `json:"to_offset"`
	FirstJob      string    `json:"first_job"`
	LastJob       string    `json:"last_job"`
	Token         string    `json:"token"`
	Owner         string    `json:"owner"`
	Since         time.Time `json:"since"`
	Reason        string    `json:"reason"`
}

func offsetPtr(o int64) *int64 {
	if o < 0 {
		return nil
	}
	return &o
}

func toHoldRow(h sink.Hold) holdRow {
	r := holdRow{Group: h.Partition.Group, Topic: h.Partition.Topic, Partition: h.Partition.Partition, Kind: string(h.Kind),
		NeedsAck: h.Kind.NeedsAck(), NextOffset: offsetPtr(h.NextOffset), LogStart: offsetPtr(h.LogStart),
		HighWatermark: offsetPtr(h.HighWatermark), From: offsetPtr(h.From), To: offsetPtr(h.To),
		FirstJob: h.FirstJob, LastJob: h.LastJob, Owner: h.Owner, Since: h.Since.UTC(), Reason: h.Reason}
	if h.Token != (sink.Token{}) {
		r.Token = h.Token.String()
	}
	return r
}

// runHolds lists the open holds: partitions that workers do not process,
// and why.
func runHolds(ctx context.Context, e *env, f *flagSet, args []string) error {
	db := addDBFlags(f)
	group := f.String("group", "", "only this consumer group's holds (default: every group)")
	output := outputFlag(f)
	if err := f.parse(args, 0); err != nil {
		return err
	}
	if err := optional(*group, func() error { return validGroup("group", *group) }); err != nil {
		return err
	}
	out, err := output()
	if err != nil {
		return err
	}
	sch, err := db.check()
	if err != nil {
		return err
	}
	pool, err := openDB(ctx, *db.url)
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := sink.NewStore(pool, sch)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	holds, err := store.OpenHolds(ctx, *group)
	if err != nil {
		return dbError(sch, err)
	}
	rows := make([]holdRow, len(holds))
	for i, h := range holds {
		rows[i] = toHoldRow(h)
	}
	if out == "json" {
		return writeJSON(e.stdout, rows)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
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
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", printableString(r.Group), printableString(r.Topic), r.Partition,
			r.Kind, ack, dashInt(r.NextOffset), dash(printableString(jobs)), printableString(r.Owner),
			r.Since.Format("2006-01-02 15:04:05Z"), printableString(r.Reason))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(rows) == 0 {
		fmt.Fprintf(e.stderr, "no held partitions in schema %s\n", sch)
	}
	return nil
}

// runHoldAcknowledge resolves a partition's hold for an operator, recorded
// with the actor: the workers holding it claim it again within seconds and
// go on from the stored offset, which the acknowledgement may move (see
// sink.Store.AcknowledgeHold).
func runHoldAcknowledge(ctx context.Context, e *env, f *flagSet, args []string) error {
	db := addDBFlags(f)
	group := f.String("group", "", "the consumer group")
	topic := f.String("topic", "", "the topic")
	part := f.Int("partition", -1, "the partition")
	kafka := addKafkaFlags(f, "Kafka seed brokers: needed for holds about the log (where it now starts and ends)")
	brokers := kafka.brokers
	actor := actorFlag(f)
	if err := f.parse(args, 0); err != nil {
		return err
	}
	if err := required("group", *group, "topic", *topic); err != nil {
		return err
	}
	if err := validGroup("group", *group); err != nil {
		return err
	}
	if err := validTopics("topic", []string{*topic}); err != nil {
		return err
	}
	if *part < 0 || *part >= partition.MaxCount {
		return usagef("--partition is required: a partition number from 0 to %d", partition.MaxCount-1)
	}
	sch, err := db.check()
	if err != nil {
		return err
	}
	who, err := actor()
	if err != nil {
		return err
	}
	pool, err := openDB(ctx, *db.url)
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := sink.NewStore(pool, sch)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	p := sink.Partition{Group: *group, Topic: *topic, Partition: int32(*part)}
	open, held, err := store.OpenHoldNeedingAck(ctx, p)
	if err != nil {
		return dbError(sch, err)
	}
	if !held {
		return fmt.Errorf("partition %s has no hold that waits for an acknowledgement in schema %s; nothing was changed", printableString(p.String()), sch)
	}
	logStart, hwm, topicID := int64(-1), int64(-1), [16]byte{}
	if open.Kind != sink.HoldHandlerBug {
		if *brokers == "" {
			return usagef("--brokers is required to acknowledge a %s hold: where the log now starts and ends decides the offset to go on from", open.Kind)
		}
		if logStart, hwm, topicID, err = logOf(ctx, kafka, splitList(*brokers), *topic, int32(*part)); err != nil {
			return err
		}
	}
	h, err := store.AcknowledgeHold(ctx, p, who, logStart, hwm, topicID)
	if errors.Is(err, sink.ErrNoHold) {
		return fmt.Errorf("partition %s has no hold that waits for an acknowledgement in schema %s; nothing was changed", printableString(p.String()), sch)
	}
	if err != nil {
		return dbError(sch, err)
	}
	extra := ""
	if h.Kind == sink.HoldHandlerBug {
		extra = fmt.Sprintf("; the batch from offset %d runs again: whatever the handler committed itself for %s stays", h.From, printableString(h.FirstJob))
	}
	goOn := "workers holding it go on within seconds"
	if next, still, err := store.OpenHoldNeedingAck(ctx, p); err == nil && still {
		// Holds of different kinds wait for one acknowledgement each.
		goOn = fmt.Sprintf("the partition is still held: a %s hold (since %s) waits for its own acknowledgement; run this command again once you have looked at it (tenure admin holds)",
			next.Kind, next.Since.UTC().Format(time.RFC3339))
	}
	fmt.Fprintf(e.stdout, "acknowledged the %s hold of partition %s (since %s, by %s): %s, recorded as done by %s; %s%s\n",
		h.Kind, printableString(p.String()), h.Since.UTC().Format(time.RFC3339), printableString(h.Owner), h.Resolution, who, goOn, extra)
	return nil
}

// logOf reads a partition's log start, end and topic id from the brokers.
func logOf(ctx context.Context, kafka *kafkaFlags, brokers []string, topic string, p int32) (start, end int64, id [16]byte, err error) {
	cl, err := kafka.client(brokers)
	if err != nil {
		return 0, 0, id, err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	td, err := adm.ListTopics(ctx, topic)
	if err != nil {
		return 0, 0, id, kafkaError("reading the topic's metadata", brokers, err)
	}
	d, ok := td[topic]
	if !ok || d.Err != nil {
		return 0, 0, id, fmt.Errorf("topic %q does not exist on the brokers", topic)
	}
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err != nil {
		return 0, 0, id, kafkaError("listing log start offsets", brokers, err)
	}
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return 0, 0, id, kafkaError("listing end offsets", brokers, err)
	}
	s, ok1 := starts.Lookup(topic, p)
	en, ok2 := ends.Lookup(topic, p)
	if !ok1 || !ok2 || s.Err != nil || en.Err != nil {
		return 0, 0, id, fmt.Errorf("topic %q has no partition %d on the brokers", topic, p)
	}
	return s.Offset, en.Offset, d.ID, nil
}
