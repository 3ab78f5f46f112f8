package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/tenure-dev/tenure/partition"
)

func runTopicCreate(ctx context.Context, e *env, f *flagSet, args []string) error {
	kafka := addKafkaFlags(f, "Kafka seed brokers, comma separated")
	brokers := kafka.brokers
	topic := f.String("topic", "", "topic to create")
	partitions := f.Count("partitions", 0, "partition count, from 1 to 10000; it bounds the number of workers that can share the work")
	rf := f.Int("replication-factor", 1, "replicas per partition; -1 means the broker's default (default.replication.factor)")
	ifNotExists := f.Bool("if-not-exists", false, "succeed if the topic exists already with --partitions partitions (set-up steps that run more than once)")
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
		return usagef("--partitions is required: a whole number from 1 to %d", partition.MaxCount)
	}
	if *rf == 0 || *rf < -1 || *rf > 32767 {
		return usagef("--replication-factor must be from 1 to 32767, or -1 for the broker's default")
	}
	brokerList := splitList(*brokers)
	cl, err := kafka.client(brokerList)
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	resp, err := kadm.NewClient(cl).CreateTopic(ctx, *partitions, int16(*rf), nil, *topic)
	if err == nil {
		err = resp.Err
	}
	var ke *kerr.Error
	switch {
	case err == nil:
	case errors.Is(err, kerr.TopicAlreadyExists) && *ifNotExists:
		counts, err := checkTopics(ctx, cl, brokerList, []string{*topic})
		if err != nil {
			return err
		}
		if n := counts[*topic]; n != *partitions {
			return fmt.Errorf("topic %q exists with %s, not %d: see `tenure admin topic add-partitions`", *topic, plural(int(n), "partition"), *partitions)
		}
		fmt.Fprintf(e.stdout, "topic %s exists already with %s\n", *topic, plural(int(*partitions), "partition"))
		return nil
	case errors.Is(err, kerr.TopicAlreadyExists):
		return fmt.Errorf("topic %q already exists: see `tenure admin topic describe --brokers %s --topic %s`", *topic, strings.Join(brokerList, ","), *topic)
	case errors.As(err, &ke):
		msg := ke.Message + ": " + ke.Description
		if resp.ErrMessage != "" {
			msg = ke.Message + ": " + resp.ErrMessage
		}
		return fmt.Errorf("the broker refused to create topic %q: %s", *topic, msg)
	default:
		return kafkaError("creating topic "+*topic, brokerList, err)
	}
	n, r := resp.NumPartitions, resp.ReplicationFactor
	if n <= 0 { // brokers before Kafka 2.4 do not say
		n = *partitions
	}
	rfs := fmt.Sprint(r)
	if r <= 0 {
		rfs = "broker default"
		if *rf > 0 {
			rfs = fmt.Sprint(*rf)
		}
	}
	fmt.Fprintf(e.stdout, "created topic %s with %s (replication factor %s)\n", *topic, plural(int(n), "partition"), rfs)
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

func runTopicDescribe(ctx context.Context, e *env, f *flagSet, args []string) error {
	kafka := addKafkaFlags(f, "Kafka seed brokers, comma separated")
	brokers := kafka.brokers
	topic := f.String("topic", "", "topic to describe")
	output := outputFlag(f)
	if err := f.parse(args, 0); err != nil {
		return err
	}
	if err := required("brokers", *brokers, "topic", *topic); err != nil {
		return err
	}
	if err := validTopic("topic", *topic); err != nil {
		return err
	}
	out, err := output()
	if err != nil {
		return err
	}
	brokerList := splitList(*brokers)
	cl, err := kafka.client(brokerList)
	if err != nil {
		return err
	}
	defer cl.Close()
	if _, err := checkTopics(ctx, cl, brokerList, []string{*topic}); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	adm := kadm.NewClient(cl)
	td, err := adm.ListTopics(ctx, *topic)
	if err != nil {
		return kafkaError("describing topic "+*topic, brokerList, err)
	}
	starts, err := adm.ListStartOffsets(ctx, *topic)
	if err != nil {
		return kafkaError("listing the start offsets of "+*topic, brokerList, err)
	}
	ends, err := adm.ListEndOffsets(ctx, *topic)
	if err != nil {
		return kafkaError("listing the high watermarks of "+*topic, brokerList, err)
	}
	d := td[*topic]
	rows := make([]topicPartition, 0, len(d.Partitions))
	for _, p := range d.Partitions.Sorted() {
		row := topicPartition{Topic: *topic, Partition: p.Partition, Leader: p.Leader, LeaderEpoch: p.LeaderEpoch,
			Replicas: nonNil(p.Replicas), ISR: nonNil(p.ISR)}
		if p.Err != nil {
			row.Error = p.Err.Error()
		}
		if o, ok := starts.Lookup(*topic, p.Partition); ok && o.Err == nil {
			row.LogStartOffset = &o.Offset
		}
		if o, ok := ends.Lookup(*topic, p.Partition); ok && o.Err == nil {
			row.HighWatermark = &o.Offset
		}
		rows = append(rows, row)
	}
	if out == "json" {
		return writeJSON(e.stdout, rows)
	}
	fmt.Fprintf(e.stdout, "topic %s: %s\n", *topic, plural(len(rows), "partition"))
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
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

func runGroups(ctx context.Context, e *env, f *flagSet, args []string) error {
	kafka := addKafkaFlags(f, "Kafka seed brokers, comma separated")
	brokers := kafka.brokers
	output := outputFlag(f)
	if err := f.parse(args, 0); err != nil {
		return err
	}
	if err := required("brokers", *brokers); err != nil {
		return err
	}
	out, err := output()
	if err != nil {
		return err
	}
	brokerList := splitList(*brokers)
	cl, err := kafka.client(brokerList)
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	adm := kadm.NewClient(cl)
	listed, err := adm.ListGroups(ctx)
	if err != nil {
		return kafkaError("listing groups", brokerList, err)
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
			return kafkaError("describing groups", brokerList, err)
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
			return kafkaError("describing consumer groups", brokerList, err)
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
	if out == "json" {
		return writeJSON(e.stdout, rows)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GROUP\tTYPE\tSTATE\tPROTOCOL_TYPE\tPROTOCOL\tMEMBERS")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\n", printableString(r.Group), r.Type, dash(r.State), dash(r.ProtocolType), dash(r.Protocol), r.Members)
	}
	return tw.Flush()
}
