package main

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/tenure-dev/tenure/partition"
	"github.com/tenure-dev/tenure/sink"
)

// haltRow is one row of `tenure admin halts`.
type haltRow struct {
	Group     string    `json:"consumer_group"`
	Topic     string    `json:"topic"`
	Partition int32     `json:"partition"`
	From      int64     `json:"from_offset"`
	To        int64     `json:"to_offset"`
	FirstJob  string    `json:"first_job"`
	LastJob   string    `json:"last_job"`
	Owner     string    `json:"owner"`
	Token     string    `json:"token"`
	HaltedAt  time.Time `json:"halted_at"`
	Reason    string    `json:"reason"`
}

func toHaltRow(h sink.Halt) haltRow {
	return haltRow{Group: h.Group, Topic: h.Topic, Partition: h.Partition.Partition, From: h.From, To: h.To,
		FirstJob: h.FirstJob, LastJob: h.LastJob, Owner: h.Owner, Token: h.Token.String(),
		HaltedAt: h.HaltedAt.UTC(), Reason: h.Reason}
}

func runHalts(ctx context.Context, e *env, f *flagSet, args []string) error {
	db := addDBFlags(f)
	group := f.String("group", "", "only this consumer group's halted partitions (default: every group)")
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
	halts, err := store.Halts(ctx, *group)
	if err != nil {
		return dbError(sch, err)
	}
	rows := make([]haltRow, len(halts))
	for i, h := range halts {
		rows[i] = toHaltRow(h)
	}
	if out == "json" {
		return writeJSON(e.stdout, rows)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GROUP\tTOPIC\tPARTITION\tJOBS\tTOKEN\tHALTED_BY\tHALTED_AT\tREASON")
	for _, r := range rows {
		jobs := r.FirstJob
		if r.LastJob != r.FirstJob {
			jobs += " to " + r.LastJob
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", printableString(r.Group), printableString(r.Topic), r.Partition,
			printableString(jobs), r.Token, printableString(r.Owner), r.HaltedAt.Format("2006-01-02 15:04:05Z"), printableString(r.Reason))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(rows) == 0 {
		fmt.Fprintf(e.stderr, "no halted partitions in schema %s\n", sch)
	}
	return nil
}

func runHaltResume(ctx context.Context, e *env, f *flagSet, args []string) error {
	db := addDBFlags(f)
	group := f.String("group", "", "the consumer group")
	topic := f.String("topic", "", "the topic")
	part := f.Int("partition", -1, "the partition")
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
	h, ok, err := store.ResumePartition(ctx, p)
	if err != nil {
		return dbError(sch, err)
	}
	if !ok {
		return fmt.Errorf("partition %s is not halted in schema %s; nothing was changed", printableString(p.String()), sch)
	}
	fmt.Fprintf(e.stdout, "resumed partition %s (halted at %s by %s while handling %s); workers holding it go on within seconds, "+
		"starting again at offset %d: whatever the handler committed itself for those jobs is still there\n",
		printableString(p.String()), h.HaltedAt.UTC().Format(time.RFC3339), printableString(h.Owner), printableString(h.FirstJob), h.From)
	return nil
}
