package cli

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tenure-dev/tenure/sink"
)

// orderingHazard is said whenever partitions are added or a new partition
// count is accepted.
const orderingHazard = "ordering hazard: keys now hash to other partitions, so a key's jobs still waiting on its old partition " +
	"can run after, or at the same time as, its newer jobs on the new one; if per-key order matters, drain the old partitions before acknowledging"

// addPartitions is `tenure admin topic add-partitions`: it grows a topic to
// --partitions partitions. The groups that consume it notice and hold it
// until acknowledge-partitions.
type addPartitions struct {
	admin
	topic      string
	partitions int32
}

func (c *addPartitions) define(f *flagSet) {
	c.withKafka(f, brokersUsage, required)
	f.String(&c.topic, "topic", "", "topic to grow", arg("T"), required)
	f.Count(&c.partitions, "partitions", 0, "the topic's new partition count, in all (more than it has; Kafka cannot remove partitions)", required)
}

func (c *addPartitions) check([]string) error {
	if err := validTopic("topic", c.topic); err != nil {
		return err
	}
	if c.partitions == 0 {
		return usagef("--partitions is required: the topic's new partition count, from 2 to 10000")
	}
	return nil
}

func (c *addPartitions) run(ctx context.Context) error {
	cl, was, err := c.partitionCount(c.topic)
	if err != nil {
		return err
	}
	want := c.partitions
	switch {
	case want == was:
		fmt.Fprintf(c.stdout, "topic %s already has %s; nothing changed\n", c.topic, plural(int(was), "partition"))
		return nil
	case want < was:
		return fmt.Errorf("topic %q has %s and Kafka cannot remove partitions: --partitions is the new count in all, more than %d; nothing was changed",
			c.topic, plural(int(was), "partition"), was)
	}
	resp, err := kadm.NewClient(cl).UpdatePartitions(ctx, int(want), c.topic)
	if err == nil {
		err = resp.Error()
	}
	var ke *kerr.Error
	switch {
	case err == nil:
	case errors.As(err, &ke):
		msg := ke.Message + ": " + ke.Description
		if r, ok := resp[c.topic]; ok && r.ErrMessage != "" {
			msg = ke.Message + ": " + r.ErrMessage
		}
		return fmt.Errorf("the broker refused to grow topic %q to %s: %s", c.topic, plural(int(want), "partition"), msg)
	default:
		return c.kafkaError("adding partitions to topic "+c.topic, err)
	}
	fmt.Fprintf(c.stdout, "topic %s now has %s (was %d); the workers of every group that consumes it stop processing it "+
		"until `tenure admin topic acknowledge-partitions --group G --topic %s` is run for that group; %s\n",
		c.topic, plural(int(want), "partition"), was, c.topic, orderingHazard)
	return nil
}

// acknowledgePartitions is `tenure admin topic acknowledge-partitions`.
type acknowledgePartitions struct {
	admin
	group, topic, actor string
	partitions          int32
}

func (c *acknowledgePartitions) define(f *flagSet) {
	c.withDB(f)
	f.String(&c.group, "group", "", "consumer group whose workers hold the topic", arg("G"), required)
	f.String(&c.topic, "topic", "", "topic whose partition count changed", arg("T"), required)
	c.withKafka(f, "Kafka seed brokers: the topic's partition count is read from Kafka", required)
	f.Count(&c.partitions, "partitions", 0, "the count you expect; refused unless Kafka has exactly it (default: Kafka's count)")
	c.actorFlag(f, &c.actor)
}

func (c *acknowledgePartitions) check([]string) error {
	if err := validGroup("group", c.group); err != nil {
		return err
	}
	if err := validTopic("topic", c.topic); err != nil {
		return err
	}
	return checkActor(c.actor)
}

func (c *acknowledgePartitions) run(ctx context.Context) error {
	_, count, err := c.partitionCount(c.topic)
	if err != nil {
		return err
	}
	if c.partitions != 0 && c.partitions != count {
		return fmt.Errorf("topic %q has %s in Kafka, not %d as --partitions says; nothing was changed", c.topic, plural(int(count), "partition"), c.partitions)
	}
	store, err := c.Store()
	if err != nil {
		return err
	}
	recorded, err := recordedCount(ctx, store, c.group, c.topic)
	if err != nil {
		return c.dbError("reading the recorded partition count", err)
	}
	switch {
	case recorded == 0:
		return fmt.Errorf("group %s has no recorded partition count for topic %s (it never consumed it); nothing was changed",
			printableString(c.group), c.topic)
	case count < recorded:
		// Kafka cannot remove partitions: the topic was deleted and
		// re-created, and the offsets Postgres holds belong to the old one.
		return fmt.Errorf("topic %q has %s in Kafka, fewer than the %d group %s recorded: partitions cannot be removed, so the topic was re-created "+
			"and the offsets in Postgres belong to the old one; a decrease is never accepted; nothing was changed",
			c.topic, plural(int(count), "partition"), recorded, printableString(c.group))
	}
	old, err := store.AcknowledgePartitions(ctx, c.group, c.topic, count, c.actor)
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) || errors.Is(err, context.DeadlineExceeded) {
			return c.dbError("recording the partition count", err)
		}
		return fmt.Errorf("%v; nothing was changed", err)
	}
	if old == count {
		fmt.Fprintf(c.stdout, "group %s already had topic %s recorded at %s; nothing changed\n",
			printableString(c.group), c.topic, plural(int(count), "partition"))
		return nil
	}
	fmt.Fprintf(c.stdout, "group %s now accepts topic %s at %s (was %d), recorded as acknowledged by %s; workers that see %d partitions resume the topic within seconds; %s\n",
		printableString(c.group), c.topic, plural(int(count), "partition"), old, printableString(c.actor), count, orderingHazard)
	return nil
}

// recordedCount is the partition count group recorded for topic (0: none
// recorded).
func recordedCount(ctx context.Context, store *sink.Store, group, topic string) (int32, error) {
	layouts, err := store.Layouts(ctx, group)
	if err != nil {
		return 0, err
	}
	for _, l := range layouts {
		if l.Group == group && l.Topic == topic {
			return l.Partitions, nil
		}
	}
	return 0, nil
}

// partitionCount connects to Kafka and reads topic's partition count, or
// says in one sentence why it cannot (unreachable brokers, no such topic).
func (a *admin) partitionCount(topic string) (*kgo.Client, int32, error) {
	cl, err := a.client()
	if err != nil {
		return nil, 0, err
	}
	counts, err := checkTopics(a.ctx, cl, a.brokers(), []string{topic})
	if err != nil {
		return nil, 0, err
	}
	return cl, counts[topic], nil
}
