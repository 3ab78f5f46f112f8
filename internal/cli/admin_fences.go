package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/sink"
)

// assignments is `tenure admin assignments`.
type assignments struct {
	admin
	group, topic string
}

func (c *assignments) define(f *flagSet) {
	c.withKafka(f, brokersUsage, required)
	f.String(&c.group, "group", "", "consumer group to describe", arg("G"), required)
	c.withDB(f)
	f.String(&c.topic, "topic", "", "topics, comma separated (default: those the group's members consume plus those in its fencing rows)", arg("T[,T2]"))
	c.withTableOutput(f)
}

func (c *assignments) check([]string) error {
	if err := validGroup("group", c.group); err != nil {
		return err
	}
	return validTopics("topic", splitList(c.topic))
}

func (c *assignments) run(ctx context.Context) error {
	topics := splitList(c.topic)
	cl, err := c.client()
	if err != nil {
		return err
	}
	store, err := c.Store()
	if err != nil {
		return err
	}
	if len(topics) > 0 {
		if _, err := checkTopics(c.ctx, cl, c.brokers(), topics); err != nil {
			return err
		}
	}
	// Read the fencing rows once up front, so that a database problem is
	// reported as one, not as a failed describe.
	if _, _, err := c.fencingRows(ctx, c.group); err != nil {
		return err
	}
	rows, err := consumer.Describe(ctx, cl, store, c.group, topics)
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) || pgconn.Timeout(err) {
			return c.dbError("reading the fencing rows", err)
		}
		return c.kafkaError("describing group "+c.group, err)
	}
	if len(rows) == 0 {
		return fmt.Errorf("nothing to show: group %q has no members, no fencing rows in schema %q, and no --topic was given", c.group, c.schema)
	}
	if c.output == "json" {
		return c.json(rows)
	}
	// The table: one line per partition, the member id once and
	// abbreviated (--output json has every field in full). FOR is how long
	// the state has held, where that can be known.
	tw := c.table()
	fmt.Fprintln(tw, "GROUP\tTOPIC\tPARTITION\tMEMBER\tEPOCH\tTOKEN\tFENCE_OWNER\tNEXT_OFFSET\tHIGH_WATERMARK\tLAG\tSTATE\tFOR")
	for _, r := range rows {
		owner := dash(printableString(shortMember(r.FenceOwner)))
		if r.FenceOwner != "" && r.FenceOwner == r.MemberID {
			owner = "(member)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", printableString(r.Group), printableString(r.Topic), r.Partition,
			dash(printableString(shortMember(r.MemberID))), dashInt(r.Epoch), dash(r.FenceEpoch), owner, dashInt(r.NextOffset),
			dashInt(r.HighWatermark), dashInt(r.Lag), r.State, forText(r.ForSeconds))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	// The reasons, once for the partitions of a topic that share one (a
	// changed partition count holds the whole topic).
	type said struct {
		topic  string
		state  consumer.State
		reason string
	}
	var order []said
	parts := map[said][]string{}
	for _, r := range rows {
		if r.Reason == "" {
			continue
		}
		k := said{r.Topic, r.State, r.Reason}
		if parts[k] == nil {
			order = append(order, k)
		}
		parts[k] = append(parts[k], fmt.Sprint(r.Partition))
	}
	for _, k := range order {
		fmt.Fprintf(c.stdout, "%s/%s %s: %s\n", printableString(k.topic), strings.Join(parts[k], ","), k.state, printableString(k.reason))
	}
	return nil
}

// forText renders how long a state has held: "42s", "3m10s", "2h05m",
// "3d"; "-" when unknown.
func forText(sec *int64) string {
	if sec == nil {
		return "-"
	}
	s := *sec
	switch {
	case s < 60:
		return fmt.Sprintf("%ds", s)
	case s < 3600:
		return fmt.Sprintf("%dm%02ds", s/60, s%60)
	case s < 48*3600:
		return fmt.Sprintf("%dh%02dm", s/3600, s%3600/60)
	}
	return fmt.Sprintf("%dd", s/86400)
}

// shortMember abbreviates a member id for a table: kgo's classic member
// ids are the client id, a dash and 32 hex digits, of which 8 tell the
// members apart ("tenure-worker-1-f3f463fc"); other ids (KIP-848's are
// 22 to 24 characters) are shown whole up to 24 characters, longer ones as
// their first 23 and a "+". JSON has them whole.
func shortMember(id string) string {
	if i := strings.LastIndexByte(id, '-'); i >= 0 && len(id)-i-1 >= 16 && strings.Trim(id[i+1:], "0123456789abcdef") == "" {
		return id[:i+9]
	}
	if len(id) > 24 {
		return id[:23] + "+"
	}
	return id
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

// groupFilter is what the commands that read one group or every group
// share: an optional --group, checked when given.
type groupFilter struct {
	admin
	group string
}

// groupFlag adds --group, narrowing the command to that group's what.
func (c *groupFilter) groupFlag(f *flagSet, what string) {
	f.String(&c.group, "group", "", "only this consumer group's "+what+" (default: every group)", arg("G"))
}

func (c *groupFilter) check([]string) error { return optionalGroup(c.group) }

// fences is `tenure admin fences`.
type fences struct{ groupFilter }

func (c *fences) define(f *flagSet) {
	c.withDB(f)
	c.groupFlag(f, "rows")
	c.withTableOutput(f)
}

func (c *fences) run(ctx context.Context) error {
	_, fences, err := c.fencingRows(ctx, c.group)
	if err != nil {
		return err
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
	if c.output == "json" {
		return c.json(rows)
	}
	const ts = "2006-01-02 15:04:05.000Z"
	tw := c.table()
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
		where := "schema " + c.schema
		if c.group != "" {
			where += " for group " + printableString(c.group)
		}
		fmt.Fprintf(c.stderr, "no fencing rows in %s\n", where)
	}
	return nil
}

// fencingRows opens the store and reads group's fencing rows (every
// group's for ""); a failed read is said in one sentence.
func (a *admin) fencingRows(ctx context.Context, group string) (*sink.Store, []sink.Fence, error) {
	store, err := a.Store()
	if err != nil {
		return nil, nil, err
	}
	fences, err := store.List(ctx, group)
	if err != nil {
		return nil, nil, a.dbError("reading the fencing rows", err)
	}
	return store, fences, nil
}

// fencesPrune is `tenure admin fences prune`.
type fencesPrune struct {
	groupFilter
	maxAge     time.Duration
	maxEntries int
}

func (c *fencesPrune) define(f *flagSet) {
	// Pruning a long log takes a while: no adminTimeout here, only the
	// command's own context (a signal stops it; what was pruned stays, each
	// partition in its own transaction).
	c.ownTimeouts = true
	c.withDB(f)
	c.groupFlag(f, "partitions")
	f.Duration(&c.maxAge, "max-age", consumer.DefaultFenceLogMaxAge, "remove entries older than this (0: the default; negative: no age limit)")
	f.Int(&c.maxEntries, "max-entries", consumer.DefaultFenceLogMaxEntries, "keep at most this many entries per partition (0: the default; negative: no count limit)")
}

func (c *fencesPrune) check([]string) error {
	if err := optionalGroup(c.group); err != nil {
		return err
	}
	if !c.retention().Enabled() {
		return usagef("a negative --max-age and --max-entries keep everything: nothing to prune")
	}
	return nil
}

// retention is what the flags ask for. As in the worker's flags and
// consumer.Config, 0 is the default and a negative value no limit.
func (c *fencesPrune) retention() sink.FenceLogRetention {
	r := sink.FenceLogRetention{MaxAge: c.maxAge, MaxEntries: c.maxEntries}
	if r.MaxAge == 0 {
		r.MaxAge = consumer.DefaultFenceLogMaxAge
	}
	if r.MaxEntries == 0 {
		r.MaxEntries = consumer.DefaultFenceLogMaxEntries
	}
	return r
}

func (c *fencesPrune) run(ctx context.Context) error {
	store, err := c.Store()
	if err != nil {
		return err
	}
	removed, parts, err := store.PruneFenceLogs(ctx, c.group, c.retention())
	if err != nil {
		return c.dbError("pruning the fence log", err)
	}
	where := "every group"
	if c.group != "" {
		where = "group " + printableString(c.group)
	}
	fmt.Fprintf(c.stdout, "pruned %d fence log entries of %d partitions (%s, schema %s); each partition keeps the claim that holds it and every entry after the cut, which is recorded in fence_log_pruned\n",
		removed, parts, where, c.schema)
	return nil
}
