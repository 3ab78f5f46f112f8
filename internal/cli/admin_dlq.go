package cli

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tenure-dev/tenure/partition"
	"github.com/tenure-dev/tenure/sink"
)

// replayTimeout bounds one replay: producing the job (kgo gives up after its
// 30s delivery timeout) and recording it.
const replayTimeout = 60 * time.Second

// deadLetterRow is a dead letter as `tenure admin dlq list|show --output
// json` prints it. Key and value are text, with every byte that is not
// UTF-8 written as \xNN; the _base64 fields are the exact bytes. Absent key
// or value: null.
type deadLetterRow struct {
	ID          int64       `json:"id"`
	Status      string      `json:"status"`
	Group       string      `json:"consumer_group"`
	Topic       string      `json:"topic"`
	Partition   int32       `json:"partition"`
	Offset      int64       `json:"offset"`
	Job         string      `json:"job"` // topic/partition/offset, as the worker logs it
	Key         *string     `json:"key"`
	KeyBase64   *string     `json:"key_base64"`
	Value       *string     `json:"value"`
	ValueBase64 *string     `json:"value_base64"`
	Headers     []headerRow `json:"headers"`
	Error       string      `json:"error"`
	Attempts    int         `json:"attempts"`
	Token       string      `json:"token"`
	Owner       string      `json:"owner"`
	DeadAt      time.Time   `json:"dead_at"`
	// Actions are the replays and discards of this dead letter (show only).
	Actions []actionRow `json:"actions,omitempty"`
}

type headerRow struct {
	Key         string  `json:"key"`
	Value       *string `json:"value"`
	ValueBase64 *string `json:"value_base64"`
}

// actionRow is one row of dead_letter_actions.
type actionRow struct {
	Action    string    `json:"action"` // replay or discard
	Actor     string    `json:"actor"`
	At        time.Time `json:"at"`
	Topic     *string   `json:"topic,omitempty"` // replay: where the job went
	Partition *int32    `json:"partition,omitempty"`
	Offset    *int64    `json:"offset,omitempty"`
}

func newDeadLetterRow(d sink.DeadLetter) deadLetterRow {
	r := deadLetterRow{ID: d.ID, Status: d.Status, Group: d.Partition.Group, Topic: d.Partition.Topic,
		Partition: d.Partition.Partition, Offset: d.Offset,
		Job:   d.Partition.Topic + "/" + strconv.FormatInt(int64(d.Partition.Partition), 10) + "/" + strconv.FormatInt(d.Offset, 10),
		Error: d.Error, Attempts: d.Attempts, Token: d.Token.String(), Owner: d.Owner, DeadAt: d.DeadAt.UTC(),
		Headers: []headerRow{}}
	r.Key, r.KeyBase64 = textAndBase64(d.Key)
	r.Value, r.ValueBase64 = textAndBase64(d.Value)
	for _, h := range d.Headers {
		hr := headerRow{Key: h.Key}
		hr.Value, hr.ValueBase64 = textAndBase64(h.Value)
		r.Headers = append(r.Headers, hr)
	}
	return r
}

func textAndBase64(b []byte) (*string, *string) {
	if b == nil {
		return nil, nil
	}
	t, e := escapeInvalid(b), base64.StdEncoding.EncodeToString(b)
	return &t, &e
}

// escapeInvalid returns b as text, each byte that is not part of valid UTF-8
// written as \xNN.
func escapeInvalid(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	var sb strings.Builder
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n == 1 {
			fmt.Fprintf(&sb, `\x%02x`, b[0])
		} else {
			sb.WriteString(string(b[:n]))
		}
		b = b[n:]
	}
	return sb.String()
}

// printable renders bytes for a terminal: printable characters as they are;
// control characters, other invisible ones and bytes that are not UTF-8
// escaped Go-style (\n, \x1b, \u200b, \xff), so that a job can neither break
// a table's lines nor send escape sequences to the terminal.
func printable(b []byte) string {
	var sb strings.Builder
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&sb, `\x%02x`, b[0])
		case r == ' ' || (unicode.IsPrint(r) && r != '\\'):
			sb.WriteRune(r)
		default:
			q := strconv.QuoteRuneToASCII(r) // '\n', '\x1b', '\u200b', '\\'
			sb.WriteString(q[1 : len(q)-1])
		}
		b = b[n:]
	}
	return sb.String()
}

func printableString(s string) string { return printable([]byte(s)) }

// clip shortens s to at most n runes for a table cell.
func clip(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// parseIDs parses the dead-letter IDs given as arguments (`replay 4 7
// --brokers ...`: flags may come before, between or after them).
func parseIDs(args []string) ([]int64, error) {
	if len(args) == 0 {
		return nil, usagef("give the ID of at least one dead letter (see `tenure admin dlq list`)")
	}
	seen := map[int64]bool{}
	ids := make([]int64, 0, len(args))
	for _, p := range args {
		id, err := strconv.ParseInt(p, 10, 64)
		if err != nil || id <= 0 {
			return nil, usagef("dead letter ID %q is not a positive integer", p)
		}
		if seen[id] {
			return nil, usagef("dead letter %d is given twice", id)
		}
		seen[id] = true
		ids = append(ids, id)
	}
	return ids, nil
}

// deadLetterActions reads what was done to dead letter id, oldest first.
func (a *admin) deadLetterActions(ctx context.Context, id int64) ([]actionRow, error) {
	store, err := a.Store()
	if err != nil {
		return nil, err
	}
	acts, err := store.DeadLetterActions(ctx, id)
	if err != nil {
		return nil, err
	}
	var out []actionRow
	for _, x := range acts {
		out = append(out, actionRow{Action: x.Action, Actor: x.Actor, At: x.At, Topic: x.Topic, Partition: x.Partition, Offset: x.Offset})
	}
	return out, nil
}

// describeAction says in a few words what an action did.
func describeAction(a actionRow) string {
	s := fmt.Sprintf("%s by %s at %s", pastTense(a.Action), printableString(a.Actor), a.At.Format(time.RFC3339))
	if a.Topic != nil && a.Partition != nil && a.Offset != nil {
		s += fmt.Sprintf(" (to %s/%d at offset %d)", *a.Topic, *a.Partition, *a.Offset)
	}
	return s
}

func pastTense(action string) string {
	switch action {
	case "replay":
		return "replayed"
	case "discard":
		return "discarded"
	}
	return action
}

// loadDead reads the dead letters ids, each of which must exist and still
// be dead; otherwise one sentence says why none is touched.
func (a *admin) loadDead(ctx context.Context, ids []int64, verb string) ([]sink.DeadLetter, error) {
	store, err := a.Store()
	if err != nil {
		return nil, err
	}
	out := make([]sink.DeadLetter, 0, len(ids))
	for _, id := range ids {
		d, err := store.DeadLetterByID(ctx, id)
		if errors.Is(err, sink.ErrNoDeadLetter) {
			return nil, fmt.Errorf("there is no dead letter %d in schema %q (see `tenure admin dlq list --status all`); nothing was %s", id, a.schema, verb)
		}
		if err != nil {
			return nil, a.dbError(fmt.Sprintf("reading dead letter %d", id), err)
		}
		if d.Status != "dead" {
			return nil, fmt.Errorf("%s; nothing was %s", a.alreadyDone(ctx, d), verb)
		}
		out = append(out, d)
	}
	return out, nil
}

// alreadyDone says who dealt with dead letter d, which is no longer dead.
func (a *admin) alreadyDone(ctx context.Context, d sink.DeadLetter) string {
	s := fmt.Sprintf("dead letter %d was already %s", d.ID, d.Status)
	if acts, err := a.deadLetterActions(ctx, d.ID); err == nil && len(acts) > 0 {
		s = fmt.Sprintf("dead letter %d was already %s", d.ID, describeAction(acts[len(acts)-1]))
	}
	return s
}

// dlqList is `tenure admin dlq list`.
type dlqList struct {
	groupFilter
	topic, status string
	limit         int
}

func (c *dlqList) define(f *flagSet) {
	c.withDB(f)
	c.groupFlag(f, "dead letters")
	f.String(&c.topic, "topic", "", "only this topic's dead letters (default: every topic)", arg("T"))
	f.String(&c.status, "status", "dead", "dead (waiting for a decision), replayed, discarded, or all", arg("dead|replayed|discarded|all"))
	f.Int(&c.limit, "limit", 1000, "show at most this many, oldest first")
	c.withTableOutput(f)
}

func (c *dlqList) check([]string) error {
	if err := optionalGroup(c.group); err != nil {
		return err
	}
	if err := optional(c.topic, func() error { return validTopic("topic", c.topic) }); err != nil {
		return err
	}
	switch c.status {
	case "dead", "replayed", "discarded", "all":
	default:
		return usagef("--status %q is not dead, replayed, discarded or all", c.status)
	}
	return checkLimit(c.limit)
}

func (c *dlqList) run(ctx context.Context) error {
	store, err := c.Store()
	if err != nil {
		return err
	}
	status := c.status
	if status == "all" {
		status = ""
	}
	dls, err := store.DeadLetters(ctx, sink.DeadLetterFilter{Group: c.group, Topic: c.topic, Status: status, Limit: c.limit})
	if err != nil {
		return c.dbError("reading the dead letters", err)
	}
	rows := make([]deadLetterRow, len(dls))
	for i, d := range dls {
		rows[i] = newDeadLetterRow(d)
	}
	if c.output == "json" {
		if err := c.json(rows); err != nil {
			return err
		}
	} else {
		tw := c.table()
		fmt.Fprintln(tw, "ID\tSTATUS\tGROUP\tJOB\tKEY\tATTEMPTS\tDEAD_AT\tERROR")
		for i, r := range rows {
			key := "-"
			if dls[i].Key != nil {
				key = clip(printable(dls[i].Key), 32)
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", r.ID, r.Status, clip(printableString(r.Group), 32), printableString(r.Job), key,
				r.Attempts, r.DeadAt.Format("2006-01-02 15:04:05Z"), clip(printableString(r.Error), 80))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(rows) == c.limit {
		fmt.Fprintf(c.stderr, "showing the oldest %d; there may be more (--limit)\n", c.limit)
	}
	if len(rows) == 0 {
		c.nothingListed(describeFilter(c.status, c.group, c.topic), "")
	}
	return nil
}
func describeFilter(status, group, topic string) string {
	s := "dead letters"
	if status != "all" {
		s = "dead letters with status " + status
	}
	if group != "" {
		s += " of group " + printableString(group)
	}
	if topic != "" {
		s += " on topic " + printableString(topic)
	}
	return s
}

// dlqShow is `tenure admin dlq show ID`.
type dlqShow struct {
	admin
	id int64
}

func (c *dlqShow) define(f *flagSet) {
	c.withDB(f)
	c.withTableOutput(f)
}

func (c *dlqShow) check(args []string) error {
	ids, err := parseIDs(args)
	if err != nil {
		return err
	}
	if len(ids) != 1 {
		return usagef("show takes one dead letter ID")
	}
	c.id = ids[0]
	return nil
}

func (c *dlqShow) run(ctx context.Context) error {
	store, err := c.Store()
	if err != nil {
		return err
	}
	d, err := store.DeadLetterByID(ctx, c.id)
	if errors.Is(err, sink.ErrNoDeadLetter) {
		return fmt.Errorf("there is no dead letter %d in schema %q (see `tenure admin dlq list --status all`)", c.id, c.schema)
	}
	if err != nil {
		return c.dbError(fmt.Sprintf("reading dead letter %d", c.id), err)
	}
	acts, err := c.deadLetterActions(ctx, d.ID)
	if err != nil {
		return c.dbError(fmt.Sprintf("reading what was done to dead letter %d", d.ID), err)
	}
	row := newDeadLetterRow(d)
	row.Actions = acts
	if c.output == "json" {
		return c.json(row)
	}
	return printDeadLetter(c.stdout, d, row)
}
func printDeadLetter(w io.Writer, d sink.DeadLetter, r deadLetterRow) error {
	bytesField := func(b []byte) string {
		switch {
		case b == nil:
			return "(none)"
		case !utf8.Valid(b):
			return printable(b) + fmt.Sprintf("   (%d bytes, not UTF-8: shown with \\xNN escapes)", len(b))
		}
		return printable(b)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 1, ' ', 0)
	fmt.Fprintf(tw, "dead letter\t%d\n", r.ID)
	fmt.Fprintf(tw, "status\t%s\n", r.Status)
	fmt.Fprintf(tw, "group\t%s\n", printableString(r.Group))
	fmt.Fprintf(tw, "topic\t%s\n", printableString(r.Topic))
	fmt.Fprintf(tw, "partition\t%d\n", r.Partition)
	fmt.Fprintf(tw, "offset\t%d\n", r.Offset)
	fmt.Fprintf(tw, "job\t%s\n", printableString(r.Job))
	fmt.Fprintf(tw, "key\t%s\n", bytesField(d.Key))
	fmt.Fprintf(tw, "value\t%s\n", bytesField(d.Value))
	if len(d.Headers) == 0 {
		fmt.Fprintf(tw, "headers\t(none)\n")
	} else {
		fmt.Fprintf(tw, "headers\t%d\n", len(d.Headers))
		for _, h := range d.Headers {
			fmt.Fprintf(tw, "  %s\t%s\n", printableString(h.Key), bytesField(h.Value))
		}
	}
	fmt.Fprintf(tw, "error\t%s\n", printableString(r.Error))
	fmt.Fprintf(tw, "attempts\t%d\n", r.Attempts)
	fmt.Fprintf(tw, "token\t%s\n", r.Token)
	fmt.Fprintf(tw, "owner\t%s\n", printableString(r.Owner))
	fmt.Fprintf(tw, "dead at\t%s\n", r.DeadAt.Format(time.RFC3339Nano))
	if len(r.Actions) == 0 {
		fmt.Fprintf(tw, "actions\t(none)\n")
	} else {
		fmt.Fprintf(tw, "actions\t%d\n", len(r.Actions))
		for i, a := range r.Actions {
			fmt.Fprintf(tw, "  #%d\t%s\n", i+1, describeAction(a))
		}
	}
	return tw.Flush()
}

// dlqAction is what replay and discard share: the dead letters' IDs (the
// arguments) and --actor.
type dlqAction struct {
	admin
	actor string
	ids   []int64
}

func (c *dlqAction) check(args []string) (err error) {
	if c.ids, err = parseIDs(args); err != nil {
		return err
	}
	return checkActor(c.actor)
}

// dlqReplay is `tenure admin dlq replay ID [ID...]`.
type dlqReplay struct{ dlqAction }

func (c *dlqReplay) define(f *flagSet) {
	// Loading the dead letters gets adminTimeout, each replay replayTimeout.
	c.ownTimeouts = true
	c.withKafka(f, brokersUsage, required)
	c.withDB(f)
	c.actorFlag(f, &c.actor)
}

func (c *dlqReplay) run(ctx context.Context) error {
	lctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	dls, err := c.loadDead(lctx, c.ids, "replayed")
	if err != nil {
		return err
	}
	largest := 0
	var topics []string
	seen := map[string]bool{}
	for _, d := range dls {
		largest = max(largest, len(d.Key)+len(d.Value))
		if !seen[d.Partition.Topic] {
			seen[d.Partition.Topic] = true
			topics = append(topics, d.Partition.Topic)
		}
	}
	cl, err := producerClient(c.kafka, c.brokers(), largest)
	if err != nil {
		return err
	}
	defer cl.Close()
	counts, err := checkTopics(ctx, cl, c.brokers(), topics)
	if err != nil {
		return fmt.Errorf("%s; nothing was replayed", strings.TrimSuffix(err.Error(), "."))
	}
	produce := func(ctx context.Context, d sink.DeadLetter) (string, int32, int64, error) {
		rec := &kgo.Record{Topic: d.Partition.Topic, Key: d.Key, Value: d.Value}
		for _, h := range d.Headers {
			rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
		}
		r, err := cl.ProduceSync(ctx, rec).First()
		if err != nil {
			return "", 0, 0, err
		}
		return r.Topic, r.Partition, r.Offset, nil
	}
	for i, d := range dls {
		rctx, cancel := context.WithTimeout(ctx, replayTimeout)
		_, err := c.store.Replay(rctx, d.ID, c.actor, produce)
		cancel()
		if err != nil {
			done := ""
			if i > 0 {
				done = fmt.Sprintf(" (%d of %d replayed before it, listed above)", i, len(dls))
			}
			return fmt.Errorf("%s%s", c.replayError(ctx, d, err), done)
		}
		fmt.Fprintf(c.stdout, "replayed dead letter %d (job %s/%d/%d, key %s) to %s\n",
			d.ID, d.Partition.Topic, d.Partition.Partition, d.Offset, keyOf(d), c.whereReplayed(ctx, d, counts[d.Partition.Topic]))
	}
	return nil
}

// whereReplayed says where the replay of d went, and why when that is not
// the partition it was dead-lettered from.
func (c *dlqReplay) whereReplayed(ctx context.Context, d sink.DeadLetter, count int32) string {
	acts, err := c.deadLetterActions(ctx, d.ID)
	if err != nil || len(acts) == 0 {
		return "recorded"
	}
	a := acts[len(acts)-1]
	if a.Topic == nil || a.Partition == nil || a.Offset == nil {
		return "recorded"
	}
	where := fmt.Sprintf("%s/%d at offset %d", printableString(*a.Topic), *a.Partition, *a.Offset)
	if *a.Partition != d.Partition.Partition {
		rctx, cancel := context.WithTimeout(ctx, adminTimeout)
		recorded, _ := recordedCount(rctx, c.store, d.Partition.Group, d.Partition.Topic)
		cancel()
		where += " (" + whyMoved(d, count, recorded) + ")"
	}
	return where
}

// keyOf renders a dead letter's key for a sentence.
func keyOf(d sink.DeadLetter) string {
	if d.Key == nil {
		return "(none)"
	}
	return `"` + printable(d.Key) + `"`
}

// whyMoved says why a replayed job landed on another partition than the
// one it was dead-lettered from: the producer of a keyless job picks any
// partition; a keyed job goes where murmur2 of its key says for the topic's
// partition count now (count), so either that count differs from the one the
// group recorded (recorded, 0 if unknown) and explains the old partition, or
// the job's original producer did not partition by murmur2 of the key.
func whyMoved(d sink.DeadLetter, count, recorded int32) string {
	was := d.Partition.Partition
	switch {
	case d.Key == nil:
		return fmt.Sprintf("it was on partition %d: the job has no key, so the producer picks a partition for it, this time another one", was)
	case recorded > 0 && recorded != count && partition.For(d.Key, recorded) == was:
		return fmt.Sprintf("it was on partition %d: the topic has %d partitions now, %d when the group recorded it, and its key hashes to another one", was, count, recorded)
	}
	return fmt.Sprintf("it was on partition %d, not the one murmur2 of its key gives for %s: its original producer chose the partition itself or hashes keys differently",
		was, plural(int(count), "partition"))
}

// replayError says why store.Replay refused or failed dead letter d.
func (a *admin) replayError(ctx context.Context, d sink.DeadLetter, err error) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), adminTimeout)
	defer cancel()
	if errors.Is(err, sink.ErrNoDeadLetter) {
		return fmt.Errorf("dead letter %d no longer exists; it was not replayed", d.ID)
	}
	// Another operator may have replayed or discarded it meanwhile.
	if now, rerr := a.store.DeadLetterByID(rctx, d.ID); rerr == nil && now.Status != "dead" {
		return fmt.Errorf("%s; it was not replayed again", a.alreadyDone(rctx, now))
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) || errors.Is(err, context.DeadlineExceeded) {
		return a.dbErrorWithin(fmt.Sprintf("replaying dead letter %d (it stays dead; if the job was produced before the failure it may now be in Kafka twice)", d.ID), err, replayTimeout)
	}
	return fmt.Errorf("replaying dead letter %d failed, it stays dead: %v", d.ID, err)
}

// dlqDiscard is `tenure admin dlq discard ID [ID...]`.
type dlqDiscard struct{ dlqAction }

func (c *dlqDiscard) define(f *flagSet) {
	c.withDB(f)
	c.actorFlag(f, &c.actor)
}

func (c *dlqDiscard) run(ctx context.Context) error {
	dls, err := c.loadDead(ctx, c.ids, "discarded")
	if err != nil {
		return err
	}
	for i, d := range dls {
		if err := c.store.Discard(ctx, d.ID, c.actor); err != nil {
			done := ""
			if i > 0 {
				done = fmt.Sprintf(" (%d of %d discarded before it, listed above)", i, len(dls))
			}
			if now, rerr := c.store.DeadLetterByID(ctx, d.ID); rerr == nil && now.Status != "dead" {
				return fmt.Errorf("%s; it was not discarded%s", c.alreadyDone(ctx, now), done)
			}
			return fmt.Errorf("%s%s", c.dbError(fmt.Sprintf("discarding dead letter %d", d.ID), err), done)
		}
		fmt.Fprintf(c.stdout, "discarded dead letter %d (job %s/%d/%d), recorded as done by %s\n",
			d.ID, d.Partition.Topic, d.Partition.Partition, d.Offset, printableString(c.actor))
	}
	return nil
}
