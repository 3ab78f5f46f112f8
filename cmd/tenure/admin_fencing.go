package main

import (
	"context"
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/sink"
)

func runAssignments(ctx context.Context, e *env, f *flagSet, args []string) error {
	kafka := addKafkaFlags(f, "Kafka seed brokers, comma separated")
	brokers := kafka.brokers
	group := f.String("group", "", "consumer group to describe")
	db := addDBFlags(f)
	topic := f.String("topic", "", "topics, comma separated (default: those the group's members consume plus those in its fencing rows)")
	output := outputFlag(f)
	if err := f.parse(args, 0); err != nil {
		return err
	}
	if err := required("brokers", *brokers, "group", *group, "database-url", *db.url); err != nil {
		return err
	}
	if err := validGroup("group", *group); err != nil {
		return err
	}
	if err := validTopics("topic", splitList(*topic)); err != nil {
		return err
	}
	out, err := output()
	if err != nil {
		return err
	}
	sch, err := db.schema()
	if err != nil {
		return err
	}
	brokerList, topics := splitList(*brokers), splitList(*topic)
	cl, err := kafka.client(brokerList)
	if err != nil {
		return err
	}
	defer cl.Close()

	pool, err := openDB(ctx, *db.url)
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := sink.NewStore(pool, sch)
	if err != nil {
		return err
	}
	if len(topics) > 0 {
		if _, err := checkTopics(ctx, cl, brokerList, topics); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	// Read the fencing rows once up front, so that a database problem is
	// reported as one, not as a failed describe.
	if _, err := store.List(ctx, *group); err != nil {
		return dbError(sch, err)
	}
	rows, err := consumer.Describe(ctx, cl, store, *group, topics)
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) || pgconn.Timeout(err) {
			return dbError(sch, err)
		}
		return kafkaError("describing group "+*group, brokerList, err)
	}
	if len(rows) == 0 {
		return fmt.Errorf("nothing to show: group %q has no members, no fencing rows in schema %q, and no --topic was given", *group, sch)
	}
	if out == "json" {
		return writeJSON(e.stdout, rows)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TOPIC\tPARTITION\tMEMBER_ID\tCLIENT_ID\tHOST\tEPOCH\tFENCE_EPOCH\tFENCE_OWNER\tNEXT_OFFSET\tHIGH_WATERMARK\tLAG\tSTATE")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", printableString(r.Topic), r.Partition,
			dash(printableString(r.MemberID)), dash(printableString(r.ClientID)), dash(printableString(r.Host)), dashInt(r.Epoch),
			dash(r.FenceEpoch), dash(printableString(r.FenceOwner)), dashInt(r.NextOffset),
			dashInt(r.HighWatermark), dashInt(r.Lag), r.State)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range rows {
		if r.Reason != "" {
			fmt.Fprintf(e.stdout, "%s/%d %s: %s\n", printableString(r.Topic), r.Partition, r.State, printableString(r.Reason))
		}
	}
	return nil
}

// fenceRow is one row of `tenure admin fences`: the fences table as is, plus
// the token in its "incarnation.epoch" form.
type fenceRow struct {
	Group          string     `json:"consumer_group"`
	Topic          string     `json:"topic"`
	Partition      int32      `json:"partition"`
	Token          string     `json:"token"`
	Incarnation    int64      `json:"incarnation"`
	Epoch          int32      `json:"epoch"`
	Owner          string     `json:"owner"`
	NextOffset     int64      `json:"next_offset"`
	PartitionCount int32      `json:"partition_count"`
	CreatedAt      time.Time  `json:"created_at"`
	ClaimedAt      time.Time  `json:"claimed_at"`
	CommittedAt    *time.Time `json:"committed_at"`
}

func runFences(ctx context.Context, e *env, f *flagSet, args []string) error {
	db := addDBFlags(f)
	group := f.String("group", "", "only this consumer group's rows (default: every group)")
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
	fences, err := store.List(ctx, *group)
	if err != nil {
		return dbError(sch, err)
	}
	rows := make([]fenceRow, len(fences))
	for i, fe := range fences {
		rows[i] = fenceRow{Group: fe.Group, Topic: fe.Topic, Partition: fe.Partition.Partition,
			Token: fe.Token.String(), Incarnation: fe.Token.Incarnation, Epoch: fe.Token.Epoch,
			Owner: fe.Owner, NextOffset: fe.NextOffset, PartitionCount: fe.PartitionCount,
			CreatedAt: fe.CreatedAt.UTC(), ClaimedAt: fe.ClaimedAt.UTC()}
		if fe.CommittedAt != nil {
			t := fe.CommittedAt.UTC()
			rows[i].CommittedAt = &t
		}
	}
	if out == "json" {
		return writeJSON(e.stdout, rows)
	}
	const ts = "2006-01-02 15:04:05.000Z"
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GROUP\tTOPIC\tPARTITION\tTOKEN\tOWNER\tNEXT_OFFSET\tPARTITION_COUNT\tCLAIMED_AT\tCOMMITTED_AT")
	for _, r := range rows {
		committed := "-"
		if r.CommittedAt != nil {
			committed = r.CommittedAt.Format(ts)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%d\t%d\t%s\t%s\n", printableString(r.Group), printableString(r.Topic), r.Partition, r.Token, printableString(r.Owner),
			r.NextOffset, r.PartitionCount, r.ClaimedAt.Format(ts), committed)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(rows) == 0 {
		where := "schema " + sch
		if *group != "" {
			where += " for group " + printableString(*group)
		}
		fmt.Fprintf(e.stderr, "no fencing rows in %s\n", where)
	}
	return nil
}

func runFencesPrune(ctx context.Context, e *env, f *flagSet, args []string) error {
	db := addDBFlags(f)
	group := f.String("group", "", "only this consumer group's partitions (default: every group)")
	maxAge := f.Duration("max-age", consumer.DefaultFenceLogMaxAge, "remove entries older than this (0: no age limit)")
	maxEntries := f.Int("max-entries", consumer.DefaultFenceLogMaxEntries, "keep at most this many entries per partition (0: no count limit)")
	if err := f.parse(args, 0); err != nil {
		return err
	}
	if err := optional(*group, func() error { return validGroup("group", *group) }); err != nil {
		return err
	}
	if *maxAge < 0 || *maxEntries < 0 {
		return usagef("--max-age and --max-entries must not be negative (0 means no limit)")
	}
	if *maxAge == 0 && *maxEntries == 0 {
		return usagef("--max-age 0 and --max-entries 0 keep everything: nothing to prune")
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
	// Pruning a long log takes a while: no adminTimeout here, only the
	// command's own context (a signal stops it; what was pruned stays, each
	// partition in its own transaction).
	removed, parts, err := store.PruneFenceLogs(ctx, *group, sink.FenceLogRetention{MaxAge: *maxAge, MaxEntries: *maxEntries})
	if err != nil {
		return dbError(sch, err)
	}
	where := "every group"
	if *group != "" {
		where = "group " + printableString(*group)
	}
	fmt.Fprintf(e.stdout, "pruned %d fence log entries of %d partitions (%s, schema %s); each partition keeps the claim that holds it and every entry after the cut, which is recorded in fence_log_pruned\n",
		removed, parts, where, sch)
	return nil
}
