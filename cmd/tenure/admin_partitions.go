package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
)

// orderingHazard is said whenever partitions are added or a new partition
// count is accepted.
const orderingHazard = "ordering hazard: keys now hash to other partitions, so a key's jobs still waiting on its old partition " +
	"can run after, or at the same time as, its newer jobs on the new one; if per-key order matters, drain the old partitions before acknowledging"

// runAddPartitions grows a topic to --partitions partitions. The groups that
// consume it notice and hold it until acknowledge-partitions.
func runAddPartitions(ctx context.Context, e *env, f *flagSet, args []string) error {
	kafka := addKafkaFlags(f, "Kafka seed brokers, comma separated")
	brokers := kafka.brokers
	topic := f.String("topic", "", "topic to grow")
	partitions := f.Count("partitions", 0, "the topic's new partition count, in all (more than it has; Kafka cannot remove partitions)")
	if err := f.parse(args, 0); err != nil {
		return err
	}
	if err := required("brokers", *brokers, "topic", *topic); err != nil {
		return err
	}
	if err := validTopic("topic", *topic); err != nil {
		return err
	}
	if *partitions == 0 {
		return usagef("--partitions is required: the topic's new partition count, from 2 to 10000")
	}
	brokerList := splitList(*brokers)
	cl, err := kafka.client(brokerList)
	if err != nil {
		return err
	}
	defer cl.Close()
	counts, err := checkTopics(ctx, cl, brokerList, []string{*topic})
	if err != nil {
		return err
	}
	was, want := counts[*topic], *partitions
	switch {
	case want == was:
		fmt.Fprintf(e.stdout, "topic %s already has %s; nothing changed\n", *topic, plural(int(was), "partition"))
		return nil
	case want < was:
		return fmt.Errorf("topic %q has %s and Kafka cannot remove partitions: --partitions is the new count in all, more than %d; nothing was changed",
			*topic, plural(int(was), "partition"), was)
	}
	ctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	resp, err := kadm.NewClient(cl).UpdatePartitions(ctx, int(want), *topic)
	if err == nil {
		err = resp.Error()
	}
	var ke *kerr.Error
	switch {
	case err == nil:
	case errors.As(err, &ke):
		msg := ke.Message + ": " + ke.Description
		if r, ok := resp[*topic]; ok && r.ErrMessage != "" {
			msg = ke.Message + ": " + r.ErrMessage
		}
		return fmt.Errorf("the broker refused to grow topic %q to %s: %s", *topic, plural(int(want), "partition"), msg)
	default:
		return kafkaError("adding partitions to topic "+*topic, brokerList, err)
	}
	fmt.Fprintf(e.stdout, "topic %s now has %s (was %d); the workers of every group that consumes it stop processing it "+
		"until `tenure admin topic acknowledge-partitions --group G --topic %s` is run for that group; %s\n",
		*topic, plural(int(want), "partition"), was, *topic, orderingHazard)
	return nil
}

func runAcknowledgePartitions(ctx context.Context, e *env, f *flagSet, args []string) error {
	db := addDBFlags(f)
	group := f.String("group", "", "consumer group whose workers hold the topic")
	topic := f.String("topic", "", "topic whose partition count changed")
	kafka := addKafkaFlags(f, "Kafka seed brokers: the topic's partition count is read from Kafka")
	brokers := kafka.brokers
	partitions := f.Count("partitions", 0, "the count you expect; refused unless Kafka has exactly it (default: Kafka's count)")
	actor := actorFlag(f)
	if err := f.parse(args, 0); err != nil {
		return err
	}
	if err := required("database-url", *db.url, "brokers", *brokers, "group", *group, "topic", *topic); err != nil {
		return err
	}
	if err := validGroup("group", *group); err != nil {
		return err
	}
	if err := validTopic("topic", *topic); err != nil {
		return err
	}
	sch, err := db.schema()
	if err != nil {
		return err
	}
	who, err := actor()
	if err != nil {
		return err
	}
	brokerList := splitList(*brokers)
	cl, err := kafka.client(brokerList)
	if err != nil {
		return err
	}
	counts, err := checkTopics(ctx, cl, brokerList, []string{*topic})
	cl.Close()
	if err != nil {
		return err
	}
	count := counts[*topic]
	if *partitions != 0 && *partitions != count {
		return fmt.Errorf("topic %q has %s in Kafka, not %d as --partitions says; nothing was changed", *topic, plural(int(count), "partition"), *partitions)
	}
	pool, store, err := openStore(ctx, *db.url, sch)
	if err != nil {
		return err
	}
	defer pool.Close()
	ctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	recorded, err := recordedCount(ctx, pool, sch, *group, *topic)
	if err != nil {
		return storeError(sch, "reading the recorded partition count", err)
	}
	switch {
	case recorded == 0:
		return fmt.Errorf("group %s has no recorded partition count for topic %s (it never consumed it); nothing was changed",
			printableString(*group), *topic)
	case count < recorded:
		// Kafka cannot remove partitions: the topic was deleted and
		// re-created, and the offsets Postgres holds belong to the old one.
		return fmt.Errorf("topic %q has %s in Kafka, fewer than the %d group %s recorded: partitions cannot be removed, so the topic was re-created "+
			"and the offsets in Postgres belong to the old one; a decrease is never accepted; nothing was changed",
			*topic, plural(int(count), "partition"), recorded, printableString(*group))
	}
	old, err := store.AcknowledgePartitions(ctx, *group, *topic, count, who)
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) || errors.Is(err, context.DeadlineExceeded) {
			return storeError(sch, "recording the partition count", err)
		}
		return fmt.Errorf("%v; nothing was changed", err)
	}
	if old == count {
		fmt.Fprintf(e.stdout, "group %s already had topic %s recorded at %s; nothing changed\n",
			printableString(*group), *topic, plural(int(count), "partition"))
		return nil
	}
	fmt.Fprintf(e.stdout, "group %s now accepts topic %s at %s (was %d), recorded as acknowledged by %s; workers that see %d partitions resume the topic within seconds; %s\n",
		printableString(*group), *topic, plural(int(count), "partition"), old, printableString(who), count, orderingHazard)
	return nil
}

// recordedCount is the partition count group recorded for topic (0: none
// recorded).
func recordedCount(ctx context.Context, pool *pgxpool.Pool, schema, group, topic string) (int32, error) {
	var n int32
	err := pool.QueryRow(ctx, `SELECT partition_count FROM `+pgx.Identifier{schema}.Sanitize()+`.topic_layouts
		WHERE consumer_group = $1 AND topic = $2`, group, topic).Scan(&n)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	return n, err
}
