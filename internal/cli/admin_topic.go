package cli

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/tenure-dev/tenure/partition"
)

const brokersUsage = "Kafka seed brokers, comma separated"

// topicCreate is `tenure admin topic create`.
type topicCreate struct {
	admin
	topic       string
	partitions  int32
	rf          int
	ifNotExists bool
}

func (c *topicCreate) define(f *flagSet) {
	c.withKafka(f, brokersUsage, required)
	f.String(&c.topic, "topic", "", "topic to create", arg("T"), required)
	f.Count(&c.partitions, "partitions", 0, "partition count, from 1 to 10000; it bounds the number of workers that can share the work", required)
	f.Int(&c.rf, "replication-factor", 1, "replicas per partition; -1 means the broker's default (default.replication.factor)", arg("R"))
	f.Bool(&c.ifNotExists, "if-not-exists", false, "succeed if the topic exists already with --partitions partitions (set-up steps that run more than once)")
}

func (c *topicCreate) check([]string) error {
	if err := validTopic("topic", c.topic); err != nil {
		return err
	}
	if c.partitions == 0 {
		return usagef("--partitions is required: a whole number from 1 to %d", partition.MaxCount)
	}
	if c.rf == 0 || c.rf < -1 || c.rf > 32767 {
		return usagef("--replication-factor must be from 1 to 32767, or -1 for the broker's default")
	}
	return nil
}

func (c *topicCreate) run(ctx context.Context) error {
	cl, err := c.client()
	if err != nil {
		return err
	}
	resp, err := kadm.NewClient(cl).CreateTopic(ctx, c.partitions, int16(c.rf), nil, c.topic)
	if err == nil {
		err = resp.Err
	}
	var ke *kerr.Error
	switch {
	case err == nil:
	case errors.Is(err, kerr.TopicAlreadyExists) && c.ifNotExists:
		counts, err := checkTopics(ctx, cl, c.brokers(), []string{c.topic})
		if err != nil {
			return err
		}
		if n := counts[c.topic]; n != c.partitions {
			return fmt.Errorf("topic %q exists with %s, not %d: see `tenure admin topic add-partitions`", c.topic, plural(int(n), "partition"), c.partitions)
		}
		fmt.Fprintf(c.stdout, "topic %s exists already with %s\n", c.topic, plural(int(c.partitions), "partition"))
		return nil
	case errors.Is(err, kerr.TopicAlreadyExists):
		return fmt.Errorf("topic %q already exists: see `tenure admin topic describe --brokers %s --topic %s`", c.topic, strings.Join(c.brokers(), ","), c.topic)
	case errors.As(err, &ke):
		msg := ke.Message + ": " + ke.Description
		if resp.ErrMessage != "" {
			msg = ke.Message + ": " + resp.ErrMessage
		}
		return fmt.Errorf("the broker refused to create topic %q: %s", c.topic, msg)
	default:
		return c.kafkaError("creating topic "+c.topic, err)
	}
	n, r := resp.NumPartitions, resp.ReplicationFactor
	if n <= 0 { // brokers before Kafka 2.4 do not say
		n = c.partitions
	}
	rfs := fmt.Sprint(r)
	if r <= 0 {
		rfs = "broker default"
		if c.rf > 0 {
			rfs = fmt.Sprint(c.rf)
		}
	}
	fmt.Fprintf(c.stdout, "created topic %s with %s (replication factor %s)\n", c.topic, plural(int(n), "partition"), rfs)
	return nil
}

// topicPartition is one row of `tenure admin topic describe`.
type topicPartition struct {
	Topic          string  `json:"topic"`
	Partition      int32   `json:"partition"`
	Leader         int32   `json:"leader"`
	LeaderEpoch    int32   `json:"leader_epoch"`
	Replicas       []int32 `json:"replicas"`
	ISR            []int32 `json:"isr"`
	LogStartOffset *int64  `json:"log_start_offset"`
	HighWatermark  *int64  `json:"high_watermark"`
	Error          string  `json:"error,omitempty"`
}

// topicDescribe is `tenure admin topic describe`.
type topicDescribe struct {
	admin
	topic string
}

func (c *topicDescribe) define(f *flagSet) {
	c.withKafka(f, brokersUsage, required)
	f.String(&c.topic, "topic", "", "topic to describe", arg("T"), required)
	c.withTableOutput(f)
}

func (c *topicDescribe) check([]string) error { return validTopic("topic", c.topic) }

func (c *topicDescribe) run(ctx context.Context) error {
	cl, err := c.client()
	if err != nil {
		return err
	}
	if _, err := checkTopics(c.ctx, cl, c.brokers(), []string{c.topic}); err != nil {
		return err
	}
	adm := kadm.NewClient(cl)
	td, err := adm.ListTopics(ctx, c.topic)
	if err != nil {
		return c.kafkaError("describing topic "+c.topic, err)
	}
	starts, err := adm.ListStartOffsets(ctx, c.topic)
	if err != nil {
		return c.kafkaError("listing the start offsets of "+c.topic, err)
	}
	ends, err := adm.ListEndOffsets(ctx, c.topic)
	if err != nil {
		return c.kafkaError("listing the high watermarks of "+c.topic, err)
	}
	d := td[c.topic]
	rows := make([]topicPartition, 0, len(d.Partitions))
	for _, p := range d.Partitions.Sorted() {
		row := topicPartition{Topic: c.topic, Partition: p.Partition, Leader: p.Leader, LeaderEpoch: p.LeaderEpoch,
			Replicas: nonNil(p.Replicas), ISR: nonNil(p.ISR)}
		if p.Err != nil {
			row.Error = p.Err.Error()
		}
		if o, ok := starts.Lookup(c.topic, p.Partition); ok && o.Err == nil {
			row.LogStartOffset = &o.Offset
		}
		if o, ok := ends.Lookup(c.topic, p.Partition); ok && o.Err == nil {
			row.HighWatermark = &o.Offset
		}
		rows = append(rows, row)
	}
	if c.output == "json" {
		return c.json(rows)
	}
	fmt.Fprintf(c.stdout, "topic %s: %s\n", c.topic, plural(len(rows), "partition"))
	tw := c.table()
	fmt.Fprintln(tw, "PARTITION\tLEADER\tLEADER_EPOCH\tREPLICAS\tISR\tLOG_START\tHIGH_WATERMARK")
	for _, r := range rows {
		hw := dashInt(r.HighWatermark)
		if r.Error != "" {
			hw += " (" + r.Error + ")"
		}
		fmt.Fprintf(tw, "%d\t%d\t%d\t%s\t%s\t%s\t%s\n", r.Partition, r.Leader, r.LeaderEpoch,
			ints(r.Replicas), ints(r.ISR), dashInt(r.LogStartOffset), hw)
	}
	return tw.Flush()
}

func nonNil(s []int32) []int32 {
	if s == nil {
		return []int32{}
	}
	return s
}

func ints(s []int32) string {
	if len(s) == 0 {
		return "-"
	}
	parts := make([]string, len(s))
	for i, v := range s {
		parts[i] = fmt.Sprint(v)
	}
	return strings.Join(parts, ",")
}

// groupRow is one row of `tenure admin groups`.
type groupRow struct {
	Group        string `json:"group"`
	Type         string `json:"type"` // classic or consumer (KIP-848)
	State        string `json:"state"`
	ProtocolType string `json:"protocol_type"`
	Protocol     string `json:"protocol"` // classic: the assignor; KIP-848: the server assignor
	Members      int    `json:"members"`
}

// brokerListing is what the listings that read the brokers alone share:
// --brokers and --output, and no checks of their own.
type brokerListing struct{ admin }

func (c *brokerListing) define(f *flagSet) {
	c.withKafka(f, brokersUsage, required)
	c.withTableOutput(f)
}

func (c *brokerListing) check([]string) error { return nil }

// groupsList is `tenure admin groups`.
type groupsList struct{ brokerListing }

func (c *groupsList) run(ctx context.Context) error {
	cl, err := c.client()
	if err != nil {
		return err
	}
	adm := kadm.NewClient(cl)
	listed, err := adm.ListGroups(ctx)
	if err != nil {
		return c.kafkaError("listing groups", err)
	}
	var classic, next []string
	for _, g := range listed.Sorted() {
		if g.GroupType == "consumer" {
			next = append(next, g.Group)
		} else if g.GroupType == "" || g.GroupType == "classic" {
			classic = append(classic, g.Group)
		}
	}
	rows := []groupRow{}
	for _, g := range listed.Sorted() {
		typ := g.GroupType
		if typ == "" {
			typ = "classic" // brokers before Kafka 3.8 do not say; KIP-848 groups need 4.0
		}
		rows = append(rows, groupRow{Group: g.Group, Type: typ, State: g.State, ProtocolType: g.ProtocolType})
	}
	byName := map[string]*groupRow{}
	for i := range rows {
		byName[rows[i].Group] = &rows[i]
	}
	if len(classic) > 0 {
		dg, err := adm.DescribeGroups(ctx, classic...)
		if err != nil {
			return c.kafkaError("describing groups", err)
		}
		for _, d := range dg {
			if r := byName[d.Group]; r != nil && d.Err == nil {
				r.State, r.ProtocolType, r.Protocol, r.Members = d.State, d.ProtocolType, d.Protocol, len(d.Members)
			}
		}
	}
	if len(next) > 0 {
		cg, err := adm.DescribeConsumerGroups(ctx, next...)
		if err != nil {
			return c.kafkaError("describing consumer groups", err)
		}
		for _, d := range cg {
			if r := byName[d.Group]; r != nil && d.Err == nil {
				r.State, r.Protocol, r.Members = d.State, d.AssignorName, len(d.Members)
				if r.ProtocolType == "" {
					r.ProtocolType = "consumer"
				}
			}
		}
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].Group < rows[j].Group })
	if c.output == "json" {
		return c.json(rows)
	}
	tw := c.table()
	fmt.Fprintln(tw, "GROUP\tTYPE\tSTATE\tPROTOCOL_TYPE\tPROTOCOL\tMEMBERS")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\n", printableString(r.Group), r.Type, dash(r.State), dash(r.ProtocolType), dash(r.Protocol), r.Members)
	}
	return tw.Flush()
}

// topicRow is one row of `tenure admin topic list`.
type topicRow struct {
	Topic      string `json:"topic"`
	ID         string `json:"topic_id"`
	Partitions int    `json:"partitions"`
	// ReplicationFactor is the number of replicas of the partitions (the
	// largest, should they differ).
	ReplicationFactor int    `json:"replication_factor"`
	Internal          bool   `json:"internal"`
	Error             string `json:"error,omitempty"`
}

// topicList is `tenure admin topic list`: the topics on the brokers, like
// the topic part of `kcat -L`.
type topicList struct{ brokerListing }

func (c *topicList) run(ctx context.Context) error {
	cl, err := c.client()
	if err != nil {
		return err
	}
	td, err := kadm.NewClient(cl).ListTopicsWithInternal(ctx)
	if err != nil {
		return c.kafkaError("listing topics", err)
	}
	rows := []topicRow{}
	for _, d := range td.Sorted() {
		r := topicRow{Topic: d.Topic, Partitions: len(d.Partitions), Internal: d.IsInternal}
		if d.ID != [16]byte{} {
			r.ID = base64.RawURLEncoding.EncodeToString(d.ID[:]) // as Kafka's tools show it
		}
		for _, p := range d.Partitions {
			r.ReplicationFactor = max(r.ReplicationFactor, len(p.Replicas))
		}
		if d.Err != nil {
			r.Error = d.Err.Error()
		}
		rows = append(rows, r)
	}
	if c.output == "json" {
		return c.json(rows)
	}
	tw := c.table()
	fmt.Fprintln(tw, "TOPIC\tPARTITIONS\tREPLICATION_FACTOR\tINTERNAL\tTOPIC_ID")
	for _, r := range rows {
		internal := "no"
		if r.Internal {
			internal = "yes"
		}
		id := dash(r.ID)
		if r.Error != "" {
			id += " (" + r.Error + ")"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\n", printableString(r.Topic), r.Partitions, r.ReplicationFactor, internal, id)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(rows) == 0 {
		fmt.Fprintf(c.stderr, "no topics on the brokers %s\n", strings.Join(c.brokers(), ","))
	}
	return nil
}
