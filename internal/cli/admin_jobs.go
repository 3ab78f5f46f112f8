package cli

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// jobsRead is `tenure admin jobs peek` (follow false: K jobs from an offset,
// then exit) and `tenure admin jobs tail` (follow: new jobs as they arrive,
// until interrupted or --count). It reads what the workers read: records of
// committed Kafka transactions only (read_committed), and shows each job's
// key, headers and value with the bytes escaped (printable), or exactly in
// base64 with --output json.
type jobsRead struct {
	admin
	follow     bool
	topic      string
	partitions partitionList
	offset     string
	count      int
}

// peekDefaultCount is how many jobs per partition peek shows by default.
const peekDefaultCount = 10

func (c *jobsRead) define(f *flagSet) {
	// tail runs until interrupted; peek bounds its own waits.
	c.ownTimeouts = true
	c.withKafka(f, brokersUsage, required)
	f.String(&c.topic, "topic", "", "the topic to read", arg("T"), required)
	f.fs.Var(&c.partitions, "partition", "a partition to read; repeat it (or give a comma-separated list) for several (default: every partition)")
	f.annotate("partition", []flagOpt{arg("P")})
	if c.follow {
		f.String(&c.offset, "offset", "", "start at offset N of each partition read, and follow from there (default: the log's end: new jobs only)", arg("N"))
		f.Int(&c.count, "count", 0, "stop after K jobs in all (default: until interrupted)", arg("K"))
		c.withOutput(f, "output format: table, or json (one JSON object per line)", "table", "json")
	} else {
		f.String(&c.offset, "offset", "", "start at offset N of each partition read (default: the log's start)", arg("N"))
		f.Int(&c.count, "count", peekDefaultCount, "read at most K jobs from each partition", arg("K"))
		c.withTableOutput(f)
	}
}

func (c *jobsRead) check([]string) error {
	if err := validTopic("topic", c.topic); err != nil {
		return err
	}
	if c.offset != "" {
		if n, err := strconv.ParseInt(c.offset, 10, 64); err != nil || n < 0 {
			return usagef("--offset %q is not an offset (a whole number, 0 or more)", c.offset)
		}
	}
	if c.count < 0 || (!c.follow && c.count == 0) {
		return usagef("--count must be at least 1")
	}
	return nil
}

// jobRow is one job as `admin jobs` prints it with --output json: key,
// value and header values as text, each byte that is not UTF-8 written as
// \xNN, and exactly in the _base64 fields (the dead letters' convention);
// an absent key or value is null.
type jobRow struct {
	Job         string         `json:"job"`
	Topic       string         `json:"topic"`
	Partition   int32          `json:"partition"`
	Offset      int64          `json:"offset"`
	Timestamp   time.Time      `json:"timestamp"`
	Key         *string        `json:"key"`
	KeyBase64   *string        `json:"key_base64"`
	Value       *string        `json:"value"`
	ValueBase64 *string        `json:"value_base64"`
	Headers     []jobHeaderRow `json:"headers"`
}

type jobHeaderRow struct {
	Key         string  `json:"key"`
	KeyBase64   string  `json:"key_base64"`
	Value       *string `json:"value"`
	ValueBase64 *string `json:"value_base64"`
}

func newJobRow(r *kgo.Record) jobRow {
	row := jobRow{Job: r.Topic + "/" + strconv.Itoa(int(r.Partition)) + "/" + strconv.FormatInt(r.Offset, 10),
		Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Timestamp: r.Timestamp.UTC(), Headers: []jobHeaderRow{}}
	row.Key, row.KeyBase64 = textAndBase64(r.Key)
	row.Value, row.ValueBase64 = textAndBase64(r.Value)
	for _, h := range r.Headers {
		hr := jobHeaderRow{Key: escapeInvalid([]byte(h.Key)), KeyBase64: base64.StdEncoding.EncodeToString([]byte(h.Key))}
		hr.Value, hr.ValueBase64 = textAndBase64(h.Value)
		row.Headers = append(row.Headers, hr)
	}
	return row
}

// jobLine is a job as one table line: nothing in it can break the line or
// reach the terminal as a control sequence (printable).
func jobLine(r *kgo.Record) string {
	key := "-"
	if r.Key != nil {
		key = quoteEmpty(printable(r.Key))
	}
	value := "-"
	if r.Value != nil {
		value = quoteEmpty(printable(r.Value))
	}
	headers := "-"
	if len(r.Headers) > 0 {
		hs := make([]string, len(r.Headers))
		for i, h := range r.Headers {
			hs[i] = printableString(h.Key) + "=" + printable(h.Value)
		}
		headers = strings.Join(hs, ", ")
	}
	return fmt.Sprintf("%s/%d/%d\t%s\t%s\t%s\t%s", printableString(r.Topic), r.Partition, r.Offset,
		r.Timestamp.UTC().Format("2006-01-02T15:04:05.000Z"), key, headers, value)
}

func quoteEmpty(s string) string {
	if s == "" {
		return `""`
	}
	return s
}

const jobsHeader = "JOB\tTIMESTAMP\tKEY\tHEADERS\tVALUE"

// readRange is where reading a partition starts and, for peek, ends.
type readRange struct {
	from, end int64 // end: the log's last stable offset when the command started
	want      int   // peek: jobs still to show
	pos       int64 // the next offset to read
}

func (c *jobsRead) run(ctx context.Context) error {
	mctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	cl, err := c.client()
	if err != nil {
		return err
	}
	counts, err := checkTopics(mctx, cl, c.brokers(), []string{c.topic})
	if err != nil {
		return err
	}
	parts := append([]int32(nil), c.partitions...)
	if len(parts) == 0 {
		for p := range counts[c.topic] {
			parts = append(parts, p)
		}
	}
	slices.Sort(parts)
	for _, p := range parts {
		if p >= counts[c.topic] {
			return usagef("topic %s has %d partitions: there is no partition %d", c.topic, counts[c.topic], p)
		}
	}
	starts, err := kadm.NewClient(cl).ListStartOffsets(mctx, c.topic)
	if err != nil {
		return c.kafkaError("listing the log start offsets of "+c.topic, err)
	}
	ends, err := stableEnds(mctx, cl, c.topic, parts)
	if err != nil {
		return c.kafkaError("listing the end offsets of "+c.topic, err)
	}
	ranges := map[int32]*readRange{}
	offsets := map[int32]kgo.Offset{}
	var empty []string
	for _, p := range parts {
		s, ok := starts.Lookup(c.topic, p)
		if !ok || s.Err != nil {
			return fmt.Errorf("the brokers did not say where partition %d of topic %s starts: %v", p, c.topic, s.Err)
		}
		r := &readRange{end: ends[p], want: c.count}
		switch {
		case c.offset != "":
			r.from, _ = strconv.ParseInt(c.offset, 10, 64)
			if r.from < s.Offset {
				return fmt.Errorf("partition %d of topic %s starts at offset %d: the jobs below it were deleted, offset %d among them", p, c.topic, s.Offset, r.from)
			}
		case c.follow:
			r.from = r.end
		default:
			r.from = s.Offset
		}
		r.pos = r.from
		if !c.follow && r.from >= r.end {
			empty = append(empty, fmt.Sprintf("partition %d has no jobs at or after offset %d (its log ends at %d)", p, r.from, r.end))
			continue
		}
		ranges[p] = r
		offsets[p] = kgo.NewOffset().At(r.from)
	}
	for _, e := range empty {
		fmt.Fprintf(c.stderr, "%s\n", e)
	}
	if len(ranges) == 0 {
		if c.output == "json" {
			return c.json([]jobRow{})
		}
		return nil
	}
	reader, err := c.client(
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{c.topic: offsets}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(),
		kgo.ConsumeResetOffset(kgo.NoResetOffset()),
		kgo.FetchMaxWait(500*time.Millisecond),
	)
	if err != nil {
		return err
	}
	if c.follow {
		return c.tail(ctx, reader, ranges)
	}
	return c.peek(ctx, reader, ranges)
}

// stableEnds lists the partitions' last stable offsets: the end of what a
// read_committed reader (a worker) gets.
func stableEnds(ctx context.Context, cl *kgo.Client, topic string, parts []int32) (map[int32]int64, error) {
	req := kmsg.NewPtrListOffsetsRequest()
	req.IsolationLevel = 1
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = topic
	for _, p := range parts {
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition = p
		rp.Timestamp = -1
		rp.CurrentLeaderEpoch = -1
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, err
	}
	out := map[int32]int64{}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				return nil, fmt.Errorf("partition %d: %w", p.Partition, err)
			}
			out[p.Partition] = p.Offset
		}
	}
	for _, p := range parts {
		if _, ok := out[p]; !ok {
			return nil, fmt.Errorf("partition %d: no end offset in the answer", p)
		}
	}
	return out, nil
}

// peek reads each partition's range, then prints the jobs in partition and
// offset order.
func (c *jobsRead) peek(ctx context.Context, cl *kgo.Client, ranges map[int32]*readRange) error {
	pctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	var got []*kgo.Record
	open := len(ranges)
	for open > 0 {
		fs := cl.PollFetches(pctx)
		if err := fetchError(fs); err != nil {
			if pctx.Err() != nil {
				if ctx.Err() != nil {
					return fmt.Errorf("stopped (%s) before the jobs were read", dash(stopSignal(ctx)))
				}
				return fmt.Errorf("the brokers %s did not return the jobs of topic %s within %s", strings.Join(c.brokers(), ","), c.topic, adminTimeout)
			}
			return c.kafkaError("reading topic "+c.topic, err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			rr := ranges[r.Partition]
			if rr == nil || rr.pos >= rr.end || rr.want == 0 || r.Offset < rr.pos {
				return
			}
			rr.pos = r.Offset + 1
			if !r.Attrs.IsControl() {
				got = append(got, r)
				rr.want--
			}
			if rr.want == 0 || rr.pos >= rr.end {
				open--
				cl.PauseFetchPartitions(map[string][]int32{c.topic: {r.Partition}})
			}
		})
	}
	slices.SortFunc(got, func(a, b *kgo.Record) int {
		if a.Partition != b.Partition {
			return int(a.Partition - b.Partition)
		}
		return int(a.Offset - b.Offset)
	})
	if c.output == "json" {
		rows := make([]jobRow, len(got))
		for i, r := range got {
			rows[i] = newJobRow(r)
		}
		return c.json(rows)
	}
	tw := c.table()
	fmt.Fprintln(tw, jobsHeader)
	for _, r := range got {
		fmt.Fprintln(tw, jobLine(r))
	}
	return tw.Flush()
}

// tail prints jobs as they arrive, until ctx ends (a signal) or --count.
func (c *jobsRead) tail(ctx context.Context, cl *kgo.Client, ranges map[int32]*readRange) error {
	var parts []string
	for p, r := range ranges {
		parts = append(parts, fmt.Sprintf("%d from offset %d", p, r.from))
	}
	slices.Sort(parts)
	fmt.Fprintf(c.stderr, "following topic %s (partition %s); interrupt to stop\n", c.topic, strings.Join(parts, ", partition "))
	if c.output != "json" {
		fmt.Fprintln(c.stdout, strings.ReplaceAll(jobsHeader, "\t", "  "))
	}
	n := 0
	enc := json.NewEncoder(c.stdout)
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			break
		}
		if err := fetchError(fs); err != nil {
			return c.kafkaError("reading topic "+c.topic, err)
		}
		var err error
		fs.EachRecord(func(r *kgo.Record) {
			if err != nil || r.Attrs.IsControl() || (c.count > 0 && n >= c.count) {
				return
			}
			n++
			if c.output == "json" {
				err = enc.Encode(newJobRow(r))
			} else {
				_, err = fmt.Fprintln(c.stdout, strings.ReplaceAll(jobLine(r), "\t", "  "))
			}
		})
		if err != nil {
			return err
		}
		if c.count > 0 && n >= c.count {
			return nil
		}
	}
	fmt.Fprintf(c.stderr, "stopped (%s) after %s\n", dash(stopSignal(ctx)), countJobs(int64(n)))
	return nil
}

// fetchError is the first error of a poll that is not the end of the
// poll's context.
func fetchError(fs kgo.Fetches) error {
	for _, e := range fs.Errors() {
		if errors.Is(e.Err, context.Canceled) || errors.Is(e.Err, context.DeadlineExceeded) {
			return e.Err
		}
		if errors.Is(e.Err, kerr.OffsetOutOfRange) {
			return fmt.Errorf("partition %d: the offset to read is outside the log (deleted meanwhile?): %w", e.Partition, e.Err)
		}
		return e.Err
	}
	return nil
}
