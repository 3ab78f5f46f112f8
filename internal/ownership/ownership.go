// Package ownership is the live ownership page of `tenure admin serve`:
// per consumer group and partition, the group coordinator's owner and epoch
// beside Postgres's fencing token and owner, the next offset, the lag, the
// state with its reason and how long it has held (a partition with jobs
// waiting that makes no progress stands out), and any hold (with the exact
// command that resolves it); the recent
// claims of the fence log, each naming the owner it fenced; and the dead
// letters. Collect reads it all into a Snapshot; Handler serves it as a page
// that refreshes itself and as JSON (/api/ownership).
//
// It only reads: everything it runs is a SELECT (the admin role of `tenure
// migrate roles` is enough) or a describe request to the coordinator.
package ownership

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/sink"
)

// Defaults of Config.
const (
	DefaultLogEntries    = 20
	DefaultDeadLetters   = 5
	DefaultHandoffWindow = time.Minute
	// fenceLogScan bounds the fence log read for the recent claims: only
	// the newest fenceLogScan entries of the schema (commits included) are
	// looked at, so that a refresh costs the same however long the log is.
	fenceLogScan = 100_000
)

// Config says what to read and how to word it.
type Config struct {
	Store *sink.Store
	// Client reaches the group coordinator; nil shows Postgres's side only.
	Client *kgo.Client
	// Group limits the page to one consumer group; "" means every group
	// with fencing rows in the store's schema.
	Group string
	// Brokers and KafkaArgs (the TLS and SASL flags, never a password) go
	// into the commands the page suggests.
	Brokers   []string
	KafkaArgs []string
	// LogEntries is how many recent claims are shown per group;
	// DeadLetters how many of the newest dead letters.
	LogEntries, DeadLetters int
	// HandoffWindow: a partition whose owner changed within it is
	// highlighted as a hand-off.
	HandoffWindow time.Duration
	// Redact removes secrets from any text shown (nil: none).
	Redact func(string) string
}

func (c Config) withDefaults() Config {
	if c.LogEntries <= 0 {
		c.LogEntries = DefaultLogEntries
	}
	if c.DeadLetters <= 0 {
		c.DeadLetters = DefaultDeadLetters
	}
	if c.HandoffWindow <= 0 {
		c.HandoffWindow = DefaultHandoffWindow
	}
	if c.Redact == nil {
		c.Redact = func(s string) string { return s }
	}
	return c
}

// Snapshot is the page's data at one moment; it is also /api/ownership.
type Snapshot struct {
	// GeneratedAt is the database's clock when the snapshot was read; ages
	// (seconds ago) are measured against it.
	GeneratedAt time.Time `json:"generated_at"`
	Schema      string    `json:"schema"`
	// Group is the --group filter ("" for every group with fencing rows).
	Group string `json:"group_filter"`
	// HandoffWindowSeconds: a hand-off younger than this is highlighted.
	HandoffWindowSeconds int     `json:"handoff_window_seconds"`
	Groups               []Group `json:"groups"`
	// Error says why nothing could be read (the database did not answer).
	Error string `json:"error,omitempty"`
	// CommandNote says what the suggested commands leave out.
	CommandNote string `json:"command_note"`
}

// Group is one consumer group.
type Group struct {
	Name string `json:"name"`
	// CoordinatorError says why the coordinator's side is missing (the
	// partitions then show Postgres's side only).
	CoordinatorError string `json:"coordinator_error,omitempty"`
	// Error says why the group could not be read at all.
	Error       string            `json:"error,omitempty"`
	Summary     Summary           `json:"summary"`
	Partitions  []Partition       `json:"partitions"`
	Claims      []Claim           `json:"recent_claims"`
	DeadLetters DeadLetterSummary `json:"dead_letters"`
	ClaimsNote  string            `json:"recent_claims_note"`
	byPart      map[partKey]*Partition
}

// Summary counts what needs a look.
type Summary struct {
	Partitions int `json:"partitions"`
	Handoffs   int `json:"handoffs"`
	Held       int `json:"held"`
	Stalled    int `json:"stalled"`
	// Stuck counts the partitions with jobs waiting whose state is not ok
	// (unowned, owner-silent, not-progressing, a hold...).
	Stuck int `json:"stuck"`
	// Lag is the jobs waiting on every partition, those no worker holds
	// included.
	Lag int64 `json:"lag"`
}

// Partition is one partition seen from both sides.
type Partition struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`

	// The coordinator's side: the member assigned the partition.
	Member   string `json:"member_id"`
	ClientID string `json:"client_id"`
	Host     string `json:"host"`
	Epoch    *int32 `json:"epoch"`

	// Postgres's side: the fencing row.
	Token      string     `json:"fence_token"`
	Owner      string     `json:"fence_owner"`
	ClaimedAt  *time.Time `json:"claimed_at"`
	ClaimedAgo *int64     `json:"claimed_seconds_ago"`
	NextOffset *int64     `json:"next_offset"`

	HighWatermark *int64 `json:"high_watermark"`
	Lag           *int64 `json:"lag"`
	State         string `json:"state"`
	Reason        string `json:"reason"`
	// Since is when the state began, where that can be known, and For how
	// long before the read that was (consumer.Assignment).
	Since *time.Time `json:"since"`
	For   *int64     `json:"for_seconds"`
	// Stuck: jobs wait and the state is not ok.
	Stuck bool `json:"stuck"`
	// ShowReason: Reason is not a hold's, shown on a line of its own.
	ShowReason bool `json:"-"`

	// Handoff is set when the owner changed within the hand-off window.
	Handoff *Handoff `json:"handoff"`
	Holds   []Hold   `json:"holds"`

	// Held: a hold waits for an operator; Stalled: the worker recovers by
	// itself; Transition: the two sides do not agree yet.
	Held       bool `json:"held"`
	Stalled    bool `json:"stalled"`
	Transition bool `json:"transition"`
}

// Handoff is a change of owner.
type Handoff struct {
	From      string    `json:"from"`
	FromToken string    `json:"from_token"`
	To        string    `json:"to"`
	Token     string    `json:"token"`
	At        time.Time `json:"at"`
	Ago       int64     `json:"seconds_ago"`
}

// Hold is an open hold of a partition and what resolves it.
type Hold struct {
	Kind     string    `json:"kind"`
	NeedsAck bool      `json:"needs_ack"`
	Reason   string    `json:"reason"`
	Owner    string    `json:"recorded_by"`
	Since    time.Time `json:"since"`
	Ago      int64     `json:"seconds_ago"`
	// Command resolves it ("" for a stall, which clears by itself).
	Command string `json:"command"`
	// Resolution says what the command does, or why there is none.
	Resolution string `json:"resolution"`
}

// Claim is an entry of the fence log: an accepted claim (which fences the
// previous owner: from it on, that owner's commits are rejected) or an
// operator's reset.
type Claim struct {
	ID        int64     `json:"id"`
	Kind      string    `json:"kind"` // claim or reset
	At        time.Time `json:"at"`
	Ago       int64     `json:"seconds_ago"`
	Topic     string    `json:"topic"`
	Partition int32     `json:"partition"`
	Token     string    `json:"token"`
	// Owner is the claimant (the operator for a reset).
	Owner string `json:"owner"`
	// From is the offset the claim starts at (a reset: the offset it moved
	// from; To where it moved to).
	From int64 `json:"from_offset"`
	To   int64 `json:"to_offset"`
	// Fenced is the owner this claim took the partition from ("" when the
	// previous entry was the claimant's own, or there was none), and
	// FencedToken its token: its commits are rejected from this claim on.
	Fenced      string `json:"fenced_owner"`
	FencedToken string `json:"fenced_token"`
}

// DeadLetterSummary counts a group's dead letters and lists the newest.
type DeadLetterSummary struct {
	Dead   int64        `json:"dead"`
	Total  int64        `json:"total"`
	Newest []DeadLetter `json:"newest"`
}

// DeadLetter is one dead letter, without its key, value or headers (the
// job's data is not the page's to show: `tenure admin dlq show` has it).
type DeadLetter struct {
	ID       int64     `json:"id"`
	Job      string    `json:"job"`
	Status   string    `json:"status"`
	Error    string    `json:"error"`
	Attempts int       `json:"attempts"`
	Owner    string    `json:"owner"`
	DeadAt   time.Time `json:"dead_at"`
	Ago      int64     `json:"seconds_ago"`
}

type partKey struct {
	topic string
	p     int32
}

// Collect reads a snapshot. It never fails: what could not be read is said
// in the snapshot's and the groups' Error fields. Give ctx a deadline.
func Collect(ctx context.Context, cfg Config) Snapshot {
	cfg = cfg.withDefaults()
	s := Snapshot{Schema: cfg.Store.Schema(), Group: cfg.Group,
		HandoffWindowSeconds: int(cfg.HandoffWindow / time.Second), CommandNote: commandNote(cfg)}
	var err error
	if s.GeneratedAt, err = cfg.Store.Now(ctx); err != nil {
		s.GeneratedAt = time.Now()
		s.Error = cfg.Redact("reading the database: " + errText(err))
		return s
	}
	s.GeneratedAt = s.GeneratedAt.UTC()
	groups := []string{cfg.Group}
	if cfg.Group == "" {
		if groups, err = cfg.Store.Groups(ctx); err != nil {
			s.Error = cfg.Redact("listing the groups with fencing rows: " + errText(err))
			return s
		}
	}
	for _, g := range groups {
		s.Groups = append(s.Groups, collectGroup(ctx, cfg, g, s.GeneratedAt))
	}
	return s
}

func commandNote(cfg Config) string {
	note := "The commands read the database URL from TENURE_DATABASE_URL (or add --database-url URL)"
	if len(cfg.KafkaArgs) > 0 {
		note += " and the SASL password from --sasl-password-file or TENURE_SASL_PASSWORD, as this server does"
	}
	return note + "."
}

func collectGroup(ctx context.Context, cfg Config, name string, now time.Time) Group {
	g := Group{Name: text(cfg, name), byPart: map[partKey]*Partition{}}
	fences, err := cfg.Store.List(ctx, name)
	if err != nil {
		g.Error = text(cfg, "reading the fencing rows: "+errText(err))
		return g
	}
	var rows []consumer.Assignment
	if cfg.Client != nil {
		rows, err = consumer.Describe(ctx, cfg.Client, cfg.Store, name, nil)
		if err != nil {
			g.CoordinatorError = text(cfg, "the coordinator's side is missing: "+errText(err))
		}
	} else {
		err = errors.New("no Kafka client")
		g.CoordinatorError = "the coordinator's side is missing: no brokers were given"
	}
	if err != nil {
		rows = postgresOnly(fences)
	}
	claimed := map[partKey]time.Time{}
	for _, f := range fences {
		claimed[partKey{f.Topic, f.Partition.Partition}] = f.ClaimedAt
	}
	for _, a := range rows {
		g.Partitions = append(g.Partitions, partitionOf(cfg, a, claimed, now))
	}
	for i := range g.Partitions {
		p := &g.Partitions[i]
		g.byPart[partKey{p.Topic, p.Partition}] = p
	}

	holds, err := cfg.Store.OpenHolds(ctx, name)
	if err != nil {
		g.Error = text(cfg, "reading the holds: "+errText(err))
	}
	for _, h := range holds {
		k := partKey{h.Partition.Topic, h.Partition.Partition}
		p := g.byPart[k]
		if p == nil { // a hold of a partition neither side lists (a deleted topic)
			g.Partitions = append(g.Partitions, Partition{Topic: text(cfg, k.topic), Partition: k.p, State: string(h.Kind), Reason: text(cfg, h.Reason)})
			g.reindex()
			p = g.byPart[k]
		}
		p.Holds = append(p.Holds, holdOf(cfg, name, h, now))
	}
	// The whole topic is held for its partition count (no hold row):
	// acknowledged per topic.
	for i := range g.Partitions {
		p := &g.Partitions[i]
		if p.State != string(consumer.StateHeldPartitions) || len(p.Holds) > 0 {
			continue
		}
		h := Hold{Kind: p.State, NeedsAck: true, Reason: p.Reason}
		if strings.Contains(p.Reason, "never acknowledged") {
			// Fewer partitions than recorded: the topic was re-created,
			// and no command accepts that (consumer.PartitionsChangedReason).
			h.Resolution = "no command accepts a decrease: the reason says what happened"
		} else {
			h.Command = command(cfg, "topic", "acknowledge-partitions", "--group", name, "--topic", p.Topic)
			h.Resolution = "accepts the topic's new partition count for this group; its workers then resume the whole topic"
		}
		p.Holds = append(p.Holds, h)
	}

	if err := collectClaims(ctx, cfg, &g, name, now); err != nil && g.Error == "" {
		g.Error = text(cfg, "reading the fence log: "+errText(err))
	}
	if err := collectDeadLetters(ctx, cfg, &g, name, now); err != nil && g.Error == "" {
		g.Error = text(cfg, "reading the dead letters: "+errText(err))
	}

	for i := range g.Partitions {
		p := &g.Partitions[i]
		for _, h := range p.Holds {
			if h.NeedsAck {
				p.Held = true
			} else {
				p.Stalled = true
			}
		}
		switch consumer.State(p.State) {
		case consumer.StateStalled:
			p.Stalled = true
		case consumer.StateStaleOwner, consumer.StateClaimPending, consumer.StateRebalancing:
			p.Transition = true
		}
		p.ShowReason = p.Reason != "" && !slices.ContainsFunc(p.Holds, func(h Hold) bool { return h.Reason == p.Reason })
		g.Summary.Partitions++
		if p.Stuck {
			g.Summary.Stuck++
		}
		if p.Handoff != nil {
			g.Summary.Handoffs++
		}
		if p.Held {
			g.Summary.Held++
		}
		if p.Stalled {
			g.Summary.Stalled++
		}
		if p.Lag != nil && *p.Lag > 0 {
			g.Summary.Lag += *p.Lag
		}
	}
	return g
}

func (g *Group) reindex() {
	g.byPart = map[partKey]*Partition{}
	for i := range g.Partitions {
		p := &g.Partitions[i]
		g.byPart[partKey{p.Topic, p.Partition}] = p
	}
}

// postgresOnly are the partitions of the fencing rows, when the
// coordinator could not be asked.
func postgresOnly(fences []sink.Fence) []consumer.Assignment {
	out := make([]consumer.Assignment, 0, len(fences))
	for _, f := range fences {
		next := f.NextOffset
		out = append(out, consumer.Assignment{Topic: f.Topic, Partition: f.Partition.Partition,
			FenceEpoch: f.Token.String(), FenceOwner: f.Owner, NextOffset: &next, State: "unknown"})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Topic != out[j].Topic {
			return out[i].Topic < out[j].Topic
		}
		return out[i].Partition < out[j].Partition
	})
	return out
}

func partitionOf(cfg Config, a consumer.Assignment, claimed map[partKey]time.Time, now time.Time) Partition {
	p := Partition{Topic: text(cfg, a.Topic), Partition: a.Partition,
		Member: text(cfg, a.MemberID), ClientID: text(cfg, a.ClientID), Host: text(cfg, a.Host), Epoch: a.Epoch,
		Token: a.FenceEpoch, Owner: text(cfg, a.FenceOwner), NextOffset: a.NextOffset,
		HighWatermark: a.HighWatermark, Lag: a.Lag, State: string(a.State), Reason: text(cfg, a.Reason),
		Since: a.Since, For: a.ForSeconds}
	p.Stuck = a.State != consumer.StateOK && a.State != "unknown" && a.Lag != nil && *a.Lag > 0
	if at, ok := claimed[partKey{a.Topic, a.Partition}]; ok && a.FenceOwner != "" {
		at = at.UTC()
		ago := secondsAgo(now, at)
		p.ClaimedAt, p.ClaimedAgo = &at, &ago
	}
	return p
}

func holdOf(cfg Config, group string, h sink.Hold, now time.Time) Hold {
	out := Hold{Kind: text(cfg, string(h.Kind)), NeedsAck: h.Kind.NeedsAck(), Reason: text(cfg, h.Reason), Owner: text(cfg, h.Owner),
		Since: h.Since.UTC(), Ago: secondsAgo(now, h.Since)}
	p := h.Partition
	part := strconv.Itoa(int(p.Partition))
	switch {
	case !h.Kind.NeedsAck():
		out.Resolution = "clears by itself once the worker claims the partition again; if it persists, look at the database and the coordinator"
	case isPartitionCount(h.Kind):
		out.Command = command(cfg, "topic", "acknowledge-partitions", "--group", group, "--topic", p.Topic)
		out.Resolution = "accepts the topic's new partition count for this group; its workers then resume the whole topic"
	case h.Kind == sink.HoldHandlerBug:
		out.Command = command(cfg, "holds", "acknowledge", "--group", group, "--topic", p.Topic, "--partition", part)
		out.Resolution = "after the handler is fixed: the batch runs again from its first job"
	default:
		out.Command = command(cfg, "holds", "acknowledge", "--group", group, "--topic", p.Topic, "--partition", part, "--brokers")
		out.Resolution = "moves the partition's offset to where the log now is (the reason says what is at stake), then the workers go on"
	}
	return out
}

// isPartitionCount reports whether a hold is about a topic's partition
// count, which `tenure admin topic acknowledge-partitions` resolves.
func isPartitionCount(k sink.HoldKind) bool {
	return string(k) == string(consumer.StateHeldPartitions) || strings.Contains(string(k), "partition-count")
}

// command is a `tenure admin` command line, its arguments quoted for a
// POSIX shell. A trailing "--brokers" gets the brokers and the TLS and SASL
// flags; every command gets --schema when it is not the default.
func command(cfg Config, args ...string) string {
	words := []string{"tenure", "admin"}
	kafka := false
	if len(args) > 0 && args[len(args)-1] == "--brokers" {
		args, kafka = args[:len(args)-1], true
	}
	words = append(words, args...)
	if s := cfg.Store.Schema(); s != sink.DefaultSchema {
		words = append(words, "--schema", s)
	}
	// acknowledge-partitions reads the count from Kafka as well.
	if kafka || (len(args) > 1 && args[1] == "acknowledge-partitions") {
		words = append(words, "--brokers", strings.Join(cfg.Brokers, ","))
		words = append(words, cfg.KafkaArgs...)
	}
	for i, w := range words {
		words[i] = shellQuote(w)
	}
	return cfg.Redact(strings.Join(words, " "))
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r < 128 && (unicode.IsLetter(r) || unicode.IsDigit(r) || strings.ContainsRune("-_.,:/@%+=", r)))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// collectClaims reads the group's recent claims and resets, each with the
// entry before it (the owner it fenced), and marks the partitions whose
// owner changed within the hand-off window.
func collectClaims(ctx context.Context, cfg Config, g *Group, group string, now time.Time) error {
	read := func(cq sink.ClaimQuery) ([]Claim, error) {
		cq.Group, cq.Scan = group, fenceLogScan
		entries, err := cfg.Store.Claims(ctx, cq)
		if err != nil {
			return nil, err
		}
		out := make([]Claim, 0, len(entries))
		for _, e := range entries {
			cl := Claim{ID: e.ID, Kind: e.Kind, At: e.At.UTC(), Ago: secondsAgo(now, e.At), Topic: e.Partition.Topic, Partition: e.Partition.Partition,
				Token: e.Token.String(), Owner: e.Owner, From: e.From, To: e.To}
			if e.Kind == "claim" && e.Previous != "" && e.Previous != e.Owner {
				cl.Fenced = e.Previous
				cl.FencedToken = e.PreviousToken.String()
			}
			out = append(out, cl)
		}
		return out, nil
	}
	var recent []Claim
	if cfg.LogEntries > 0 {
		var err error
		if recent, err = read(sink.ClaimQuery{Limit: cfg.LogEntries}); err != nil {
			return err
		}
	}
	window, err := read(sink.ClaimQuery{Since: now.Add(-cfg.HandoffWindow)})
	if err != nil {
		return err
	}
	for _, c := range recent {
		g.Claims = append(g.Claims, textClaim(cfg, c))
	}
	g.ClaimsNote = fmt.Sprintf("the newest %d claims and resets among the schema's last %d fence log entries. "+
		"A claim fences the owner before it: from the claim on, Postgres rejects that owner's commits. "+
		"A rejected commit leaves no row (its transaction is rolled back): the workers count them (tenure_batches_fenced_total) and log them.",
		cfg.LogEntries, fenceLogScan)
	// Newest first: the first hand-off seen of a partition is its latest.
	for _, c := range window {
		p := g.byPart[partKey{c.Topic, c.Partition}]
		if p == nil || p.Handoff != nil || c.Fenced == "" {
			continue
		}
		c = textClaim(cfg, c)
		p.Handoff = &Handoff{From: c.Fenced, FromToken: c.FencedToken, To: c.Owner, Token: c.Token, At: c.At, Ago: c.Ago}
	}
	return nil
}

func textClaim(cfg Config, c Claim) Claim {
	c.Topic, c.Owner, c.Fenced = text(cfg, c.Topic), text(cfg, c.Owner), text(cfg, c.Fenced)
	return c
}

func collectDeadLetters(ctx context.Context, cfg Config, g *Group, group string, now time.Time) error {
	var err error
	if g.DeadLetters.Dead, g.DeadLetters.Total, err = cfg.Store.DeadLetterCounts(ctx, group); err != nil {
		return err
	}
	if cfg.DeadLetters <= 0 {
		return nil
	}
	dls, err := cfg.Store.DeadLetters(ctx, sink.DeadLetterFilter{Group: group, Limit: cfg.DeadLetters, NewestFirst: true})
	if err != nil {
		return err
	}
	for _, d := range dls {
		g.DeadLetters.Newest = append(g.DeadLetters.Newest, DeadLetter{ID: d.ID,
			Job:    text(cfg, fmt.Sprintf("%s/%d/%d", d.Partition.Topic, d.Partition.Partition, d.Offset)),
			Status: d.Status, Error: clip(text(cfg, d.Error), 300), Attempts: d.Attempts, Owner: text(cfg, d.Owner),
			DeadAt: d.DeadAt.UTC(), Ago: secondsAgo(now, d.DeadAt)})
	}
	return nil
}

func secondsAgo(now, t time.Time) int64 {
	d := now.Sub(t)
	if d < 0 {
		return 0
	}
	return int64(d / time.Second)
}

// text makes a value from the database or the coordinator fit to show:
// secrets redacted, control and other invisible characters escaped
// (\n, \x1b, \u202e), so that none can break the page's lines or reorder
// its text. HTML escaping is html/template's.
func text(cfg Config, s string) string {
	s = cfg.Redact(s)
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == unicode.ReplacementChar:
			b.WriteRune(r)
		case r == ' ' || (unicode.IsPrint(r) && r != '\\'):
			b.WriteRune(r)
		default:
			q := strconv.QuoteRuneToASCII(r)
			b.WriteString(q[1 : len(q)-1])
		}
	}
	return b.String()
}

func clip(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// errText is an error in one line.
func errText(err error) string {
	s := strings.ReplaceAll(strings.TrimSpace(err.Error()), "\n", "; ")
	if errors.Is(err, context.DeadlineExceeded) {
		s += " (no answer in time)"
	}
	return s
}
