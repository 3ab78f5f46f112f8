package consumer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tenure-dev/tenure/sink"
)

// State says whether the group coordinator and Postgres agree on who owns a
// partition. See Assignment.State for the rules.
type State string

const (
	// StateOK: the partition is assigned to a member and that member holds
	// the fencing row (fence_owner == member_id).
	StateOK State = "ok"
	// StateClaimPending: the partition is assigned to a member but Postgres
	// has no fencing row for it yet, or the row is held by another member
	// that is still in the group (a hand-off between live members). The new
	// owner has not claimed yet; it does before it processes anything.
	StateClaimPending State = "claim-pending"
	// StateStaleOwner: the partition is assigned to a member, but the fencing
	// row is held by a member that is no longer in the group (evicted,
	// crashed, or paused past its session timeout). Until the assigned
	// member claims, that departed owner's in-flight commit can still be
	// accepted; from the claim on it is rejected (G3). Persisting, it means
	// the assigned member cannot claim (database unreachable, fenced claim).
	StateStaleOwner State = "stale-owner"
	// StateUnowned: no member is assigned the partition (the group is empty
	// or unknown to the coordinator, or no member consumes the topic). The
	// fence columns show the last owner, if any. With jobs waiting, Reason
	// says so, how many, and which of those it is; Since is the later of
	// the last claim or commit and the oldest waiting job's timestamp.
	StateUnowned State = "unowned"
	// StateRebalancing: a classic group is mid-rebalance
	// (PreparingRebalance or CompletingRebalance); the coordinator does not
	// reveal assignments until the group is Stable again.
	StateRebalancing State = "rebalancing"
	// StateHeldPartitions: the partition is assigned, but the topic's
	// partition count in Kafka differs from the count the group recorded
	// (sink's topic_layouts), so the group's workers hold the whole topic
	// and process none of it until an operator acknowledges the count
	// (tenure admin topic acknowledge-partitions).
	StateHeldPartitions State = "held-partitions"
	// StateOwnerSilent: the member the coordinator assigns the partition
	// has stopped: its heartbeat row (fence.Store.Heartbeat, every 2 s) is
	// older than 10 s, and its fencing row has not moved for as long; or it
	// has no heartbeat row (a worker without heartbeats) while it holds the
	// fencing row, jobs wait, and the row has not moved for 10 s. The
	// coordinator keeps such a member until its session times out (45 s by
	// default), and then moves the partition. Reason says who, since when,
	// and how many jobs wait; Since is its last sign of life. Shown with or
	// without jobs waiting when the heartbeat says so.
	StateOwnerSilent State = "owner-silent"
	// StateNotProgressing: the partition's owner is alive (heartbeat) but
	// jobs wait, its fencing row shows no commit or claim for 20 s, and its
	// oldest waiting job is older than 20 s too: a batch running long (a
	// slow or blocked handler), a batch failing and retried, or a stuck
	// lane. An owner that was idle and has just been given a job is not
	// this. Since is the later of the last commit and the oldest waiting
	// job's timestamp.
	StateNotProgressing State = "not-progressing"
	// StateStalled: the worker that holds the partition cannot claim or
	// commit it and is recovering by itself (sink.HoldStalled); Reason says
	// why. Persisting, it needs a look (the database, the coordinator).
	StateStalled State = "stalled"
	// StateHandlerBug, StateTopicRecreated, StateLogTruncated,
	// StateAheadOfLog, StateDiverged: the partition is held until an operator acknowledges
	// it (`tenure admin holds acknowledge`); Reason says why and what the
	// acknowledgement does (sink.HoldKind).
	StateHandlerBug     State = State(sink.HoldHandlerBug)
	StateTopicRecreated State = State(sink.HoldTopicRecreated)
	StateLogTruncated   State = State(sink.HoldLogTruncated)
	StateAheadOfLog     State = State(sink.HoldAheadOfLog)
	StateDiverged       State = State(sink.HoldDiverged)
)

// Assignment is one partition of a consumer group seen from both sides: the
// group coordinator's assignment (member_id .. epoch), Postgres's fencing row
// (fence_epoch .. next_offset), and the log's high watermark.
//
// Absent values are "" for strings and null (nil) for numbers: a partition
// no member is assigned has no member_id and no epoch; a partition never
// claimed has no fence_epoch, fence_owner or next_offset; lag needs both a
// fencing row and a high watermark.
type Assignment struct {
	// Group is the consumer group described.
	Group     string `json:"consumer_group"`
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`

	// MemberID, ClientID and Host describe the member the coordinator has
	// assigned the partition to.
	MemberID string `json:"member_id"`
	ClientID string `json:"client_id"`
	Host     string `json:"host"`
	// Epoch is that member's epoch as the coordinator reports it. KIP-848:
	// the member epoch (it can be higher than the epoch the partition was
	// claimed at; it rises without the partition moving). Classic: the group
	// generation. DescribeGroups does not report the generation, so it is
	// inferred from the members' join metadata (KIP-792): every member of a
	// Stable generation G joined it either fresh or from generation G-1, so G
	// is one more than the highest generation a member reports. When every
	// member joined fresh (a single-member group, usually), it is the
	// generation the members' workers recorded with their heartbeats
	// (migration 018). It is null when neither tells (a group mid-rebalance,
	// workers from before 018, a member whose first heartbeat is not
	// written yet).
	Epoch *int32 `json:"epoch"`

	// FenceEpoch is the token of the fencing row, "incarnation.epoch"; the
	// token the owner claimed the partition with.
	FenceEpoch string `json:"fence_epoch"`
	// FenceOwner is the member id that claimed the partition.
	FenceOwner string `json:"fence_owner"`
	// NextOffset is the next offset to process according to Postgres, the
	// source of truth for progress (Kafka's committed offsets are at most a
	// mirror).
	NextOffset *int64 `json:"next_offset"`

	// HighWatermark is the partition's end offset.
	HighWatermark *int64 `json:"high_watermark"`
	// Lag is HighWatermark - NextOffset: jobs not yet committed in Postgres.
	// Lag tools that read Kafka's committed offsets cannot see it. A
	// negative lag means Postgres is ahead of the log: the topic was
	// deleted and recreated, or truncated. A partition without a fencing
	// row (never claimed: a new partition, a new group) counts from where
	// its first claim would start: the log's start, or the group's
	// committed offset in Kafka if that is higher. It counts transaction
	// markers too: a transactional producer leaves a lag of at least 1.
	Lag *int64 `json:"lag"`

	// State compares the two views; first rule that applies:
	//
	//   - rebalancing: classic group mid-rebalance, no member is shown
	//     assigned (assignments are hidden until the group is Stable);
	//   - unowned: no member assigned;
	//   - held-partitions: the topic's partition count in Kafka is not the
	//     one the group recorded: its workers process none of the topic
	//     until the new count is acknowledged;
	//   - ok: fence_owner == member_id;
	//   - stale-owner: there is a fencing row, its owner differs and is not
	//     a member of the group any more;
	//   - claim-pending: otherwise (no fencing row yet, or its owner is
	//     another current member);
	//
	// then, whether the partition makes progress (ok, stale-owner and
	// claim-pending only):
	//
	//   - owner-silent: the assigned member has stopped (StateOwnerSilent);
	//   - not-progressing: ok by the rules above, but jobs wait and nothing
	//     is committed (StateNotProgressing);
	//
	// and then, unless rebalancing, an open hold of the partition
	// (tenure admin holds) overrides it: stalled (but not owner-silent: a
	// stall its silent owner recorded clears at the next claim),
	// handler-bug, topic-recreated, log-truncated, ahead-of-log or
	// diverged.
	//
	// ok is exactly a partition that is owned and progressing, or has no
	// jobs waiting.
	State State `json:"state"`
	// Reason says why a held partition is held, and what resolves it
	// (held-partitions: PartitionsChangedReason; an open hold: its own
	// reason), and why a partition with jobs waiting does not progress
	// (owner-silent, not-progressing, unowned: who, how many jobs, for how
	// long); "" otherwise.
	Reason string `json:"reason"`
	// Since is when the state began, as well as it can be known (the
	// database's clock): a hold's since; a silent owner's last heartbeat or
	// commit; for the other states other than ok with jobs waiting, the
	// later of the last claim or commit and the oldest waiting job's
	// timestamp. Null when it cannot be known, and for ok.
	Since *time.Time `json:"since"`
	// ForSeconds is how long before the read Since was, in whole seconds.
	ForSeconds *int64 `json:"for_seconds"`
}

// PartitionsChangedReason says why the workers of group process none of
// topic, whose partition count in Kafka (now) is not the one the group
// recorded, and what resolves it: `tenure admin topic
// acknowledge-partitions` for a topic that grew; a topic with fewer
// partitions was re-created, and a decrease is never acknowledged.
func PartitionsChangedReason(group, topic string, recorded, now int32) string {
	if now < recorded {
		return fmt.Sprintf("topic %s has %d partitions in Kafka, fewer than the %d group %s recorded: the topic was deleted and re-created, "+
			"so the offsets in Postgres belong to the old one; a decrease is never acknowledged, and the group's workers process none of the topic",
			topic, now, recorded, group)
	}
	return fmt.Sprintf("topic %s has %d partitions in Kafka but group %s recorded %d: keys now hash to other partitions, so the group's workers "+
		"process none of the topic until `tenure admin topic acknowledge-partitions --group %s --topic %s` accepts the new count "+
		"(if per-key order matters, drain the old partitions first)", topic, now, group, recorded, group, topic)
}

// Describe joins the group coordinator's view of group with the fencing rows
// of store and the topics' high watermarks: one Assignment per partition,
// sorted by topic and partition.
//
// topics limits the answer; when it is empty the topics are those the
// group's members subscribe to or are assigned, plus the topics of the
// group's fencing rows. Partitions come from the topics' metadata; a fencing
// row of a partition the broker no longer has (a deleted topic) is shown
// with a null high watermark. With no topics given, a group the coordinator
// does not know and that has no fencing rows yields no rows and no error.
//
// Classic groups are read with DescribeGroups and the members' consumer
// protocol assignment; KIP-848 groups with ConsumerGroupDescribe (the
// members' current, reconciled assignment). A KIP-848 assignment names its
// topics by ID (Apache Kafka also sends names, kfake does not): Describe
// sends ConsumerGroupDescribe itself and maps the IDs to names with the
// topics' metadata, so members consuming several topics are described
// correctly. Partitions of a topic ID the metadata does not know (the topic
// was deleted since) are left out.
//
// Whether each partition makes progress (owner-silent, not-progressing,
// and the reason and Since of the other states) comes from the group's
// heartbeat rows (sink.Store.Workers) and the fencing rows' last claim or
// commit, compared on the database's clock, and, for the partitions whose
// jobs wait while nothing moves, from the timestamp of the oldest waiting
// job: one Fetch request per partition leader, of at most 64 KiB per
// partition, sent only when there are such partitions. A partition
// without a fencing row gets its lag from the log's start offsets and the
// group's committed offsets, read only when there is such a partition.
//
// The coordinator, Postgres and the log are read one after the other, not
// atomically: a hand-off between the reads can show as claim-pending or
// stale-owner for a moment. Describe bounds nothing itself: give ctx a
// deadline.
func Describe(ctx context.Context, cl *kgo.Client, store *sink.Store, group string, topics []string) ([]Assignment, error) {
	if cl == nil || store == nil {
		return nil, errors.New("consumer: Describe needs a kgo client and a sink store")
	}
	if group == "" {
		return nil, errors.New("consumer: Describe needs a group")
	}
	adm := kadm.NewClient(cl)
	view, err := describeGroup(ctx, cl, adm, group)
	if err != nil {
		return nil, err
	}
	fences, err := store.List(ctx, group)
	if err != nil {
		return nil, fmt.Errorf("reading the fencing rows of group %q: %w", group, err)
	}
	recorded, err := recordedCounts(ctx, store, group)
	if err != nil {
		return nil, fmt.Errorf("reading the partition counts group %q recorded: %w", group, err)
	}
	if len(topics) == 0 {
		topics = view.topics(fences)
	}
	if len(topics) == 0 {
		return nil, nil
	}
	// ListEndOffsets lists every topic when given none; topics is not empty.
	listed, err := adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		return nil, fmt.Errorf("listing the high watermarks of %v: %w", topics, err)
	}
	ends := map[string]map[int32]int64{}
	listed.Each(func(o kadm.ListedOffset) {
		if o.Partition < 0 { // kadm's marker for a topic that does not exist
			return
		}
		if ends[o.Topic] == nil {
			ends[o.Topic] = map[int32]int64{}
		}
		if o.Err != nil {
			ends[o.Topic][o.Partition] = -1 // the partition exists, its end is unknown
			return
		}
		ends[o.Topic][o.Partition] = o.Offset
	})
	holds, err := store.OpenHolds(ctx, group)
	if err != nil {
		return nil, fmt.Errorf("reading the holds of group %q: %w", group, err)
	}
	workers, now, err := store.Workers(ctx, group)
	if sink.IsMissingTables(err) {
		// A schema before migration 016: no heartbeats to read.
		now, err = store.Now(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("reading the heartbeats of group %q: %w", group, err)
	}
	view = view.withHeartbeatEpochs(workers)
	rows := join(view, fences, ends, recorded, topics)
	startLags(ctx, adm, group, topics, rows)
	for i := range rows {
		rows[i].Group = group
		if t := rows[i].Topic; rows[i].State == StateHeldPartitions {
			rows[i].Reason = PartitionsChangedReason(group, t, recorded[t], int32(len(ends[t])))
		}
	}
	f := newFacts(now, view, workers, fences)
	f.waiting = oldestWaiting(ctx, cl, adm, f.suspects(rows))
	f.judge(rows)
	return applyHolds(rows, holds, now), nil
}

// startLags gives the partitions without a fencing row a lag: from their
// high watermark to where a first claim would start, the log's start or
// the group's committed offset in Kafka if that is higher. Nothing is
// read when every partition has a fencing row; what cannot be read leaves
// the lag null.
func startLags(ctx context.Context, adm *kadm.Client, group string, topics []string, rows []Assignment) {
	var need []int
	for i := range rows {
		if rows[i].NextOffset == nil && rows[i].HighWatermark != nil {
			need = append(need, i)
		}
	}
	if len(need) == 0 {
		return
	}
	starts, err := adm.ListStartOffsets(ctx, topics...)
	if err != nil {
		return
	}
	committed, _ := adm.FetchOffsets(ctx, group) // none: the log's start
	for _, i := range need {
		a := &rows[i]
		s, ok := starts.Lookup(a.Topic, a.Partition)
		if !ok || s.Err != nil {
			continue
		}
		start := s.Offset
		if c, ok := committed.Lookup(a.Topic, a.Partition); ok && c.Err == nil {
			start = max(start, c.At)
		}
		a.Lag = ptr(*a.HighWatermark - start)
	}
}

// applyHolds shows each partition's open hold on its row (see
// Assignment.State): the oldest that waits for an operator (holds come in
// id order), saying how many more wait behind it, since when (the
// database's clock is now).
func applyHolds(rows []Assignment, holds []sink.Hold, now time.Time) []Assignment {
	type key struct {
		topic string
		p     int32
	}
	byPart := map[key]sink.Hold{}
	more := map[key]int{}
	for _, h := range holds {
		k := key{h.Partition.Topic, h.Partition.Partition}
		if first, ok := byPart[k]; ok && (first.Kind.NeedsAck() || !h.Kind.NeedsAck()) {
			more[k]++
			continue
		}
		byPart[k] = h
	}
	for i := range rows {
		k := key{rows[i].Topic, rows[i].Partition}
		h, ok := byPart[k]
		if !ok || rows[i].State == StateRebalancing || (rows[i].State == StateOwnerSilent && !h.Kind.NeedsAck()) {
			continue
		}
		rows[i].State, rows[i].Reason = State(h.Kind), h.Reason
		rows[i].setSince(h.Since, now)
		if n := more[k]; n > 0 {
			rows[i].Reason += fmt.Sprintf(" (and %d more open hold(s): tenure admin holds)", n)
		}
	}
	return rows
}

// recordedCounts reads the partition count the group recorded for each
// topic it consumed (the layout check's record).
func recordedCounts(ctx context.Context, store *sink.Store, group string) (map[string]int32, error) {
	layouts, err := store.Layouts(ctx, group)
	if err != nil {
		return nil, err
	}
	out := map[string]int32{}
	for _, l := range layouts {
		out[l.Topic] = l.Partitions
	}
	return out, nil
}

// groupView is the coordinator's view of a group.
type groupView struct {
	// protocol is "classic", "consumer" (KIP-848), or "" for a group the
	// coordinator does not know.
	protocol string
	state    string
	// rebalancing: a classic group between generations; assignments are
	// not visible.
	rebalancing bool
	members     []memberView
}

type memberView struct {
	id, clientID, host string
	epoch              *int32
	subscribed         []string
	assigned           map[string][]int32
}

// topics is the default topic set: subscriptions, assignments and fencing
// rows, sorted.
func (g groupView) topics(fences []sink.Fence) []string {
	set := map[string]bool{}
	for _, m := range g.members {
		for _, t := range m.subscribed {
			set[t] = true
		}
		for t := range m.assigned {
			set[t] = true
		}
	}
	for _, f := range fences {
		set[f.Topic] = true
	}
	out := make([]string, 0, len(set))
	for t := range set {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

// describeGroup asks the coordinator about group: first as a KIP-848 group,
// then (if the broker does not support that API, or the group is not a
// KIP-848 group) as a classic one. An unknown group is an empty view, not an
// error.
func describeGroup(ctx context.Context, cl *kgo.Client, adm *kadm.Client, group string) (groupView, error) {
	// Sent by hand rather than with kadm.DescribeConsumerGroups: kadm keeps
	// only topic names, and kfake names a KIP-848 assignment's topics by ID
	// alone.
	req := kmsg.NewPtrConsumerGroupDescribeRequest()
	req.Groups = []string{group}
	resp, err := req.RequestWith(ctx, cl)
	if err == nil && len(resp.Groups) == 1 && resp.Groups[0].ErrorCode == 0 {
		return consumerView(resp.Groups[0], func(ids map[kadm.TopicID]bool, hint []string) (map[kadm.TopicID]string, error) {
			return topicNames(ctx, adm, ids, hint)
		})
	}
	if ctx.Err() != nil {
		return groupView{}, fmt.Errorf("describing group %q: %w", group, ctx.Err())
	}
	dg, err := adm.DescribeGroups(ctx, group)
	if err != nil {
		return groupView{}, fmt.Errorf("describing group %q: %w", group, err)
	}
	d, ok := dg[group]
	if !ok || errors.Is(d.Err, kerr.GroupIDNotFound) || (d.Err == nil && d.State == "Dead") {
		return groupView{}, nil
	}
	if d.Err != nil {
		return groupView{}, fmt.Errorf("describing group %q: %w", group, d.Err)
	}
	return classicView(d), nil
}

// nameResolver maps topic IDs to names. hint lists topics likely to hold
// them (the members' subscriptions), to be asked about first.
type nameResolver func(ids map[kadm.TopicID]bool, hint []string) (map[kadm.TopicID]string, error)

// topicNames asks the metadata for the names of ids: first for the hinted
// topics only, then, if some IDs are still unknown, for every topic.
func topicNames(ctx context.Context, adm *kadm.Client, ids map[kadm.TopicID]bool, hint []string) (map[kadm.TopicID]string, error) {
	names := map[kadm.TopicID]string{}
	lookup := func(topics ...string) error {
		td, err := adm.ListTopics(ctx, topics...)
		if err != nil {
			return fmt.Errorf("reading topic metadata to name the topic IDs of a KIP-848 assignment: %w", err)
		}
		for _, d := range td {
			if d.Err == nil && ids[d.ID] {
				names[d.ID] = d.Topic
			}
		}
		return nil
	}
	if len(hint) > 0 {
		if err := lookup(hint...); err != nil {
			return nil, err
		}
	}
	if len(names) < len(ids) {
		if err := lookup(); err != nil { // every topic
			return nil, err
		}
	}
	return names, nil
}

func consumerView(d kmsg.ConsumerGroupDescribeResponseGroup, resolve nameResolver) (groupView, error) {
	g := groupView{protocol: "consumer", state: d.State}
	// Topic IDs sent without a name, and the topics the members subscribe
	// to (where those IDs most likely belong).
	unnamed := map[kadm.TopicID]bool{}
	var hint []string
	seen := map[string]bool{}
	for _, m := range d.Members {
		for _, t := range m.Assignment.TopicPartitions {
			if t.Topic == "" {
				unnamed[kadm.TopicID(t.TopicID)] = true
			}
		}
		for _, t := range m.SubscribedTopics {
			if !seen[t] {
				seen[t] = true
				hint = append(hint, t)
			}
		}
	}
	names := map[kadm.TopicID]string{}
	if len(unnamed) > 0 {
		var err error
		if names, err = resolve(unnamed, hint); err != nil {
			return groupView{}, err
		}
	}
	for _, m := range d.Members {
		epoch := m.MemberEpoch
		mv := memberView{id: m.MemberID, clientID: m.ClientID, host: m.ClientHost, epoch: &epoch,
			subscribed: m.SubscribedTopics, assigned: map[string][]int32{}}
		for _, t := range m.Assignment.TopicPartitions {
			name := t.Topic
			if name == "" {
				name = names[kadm.TopicID(t.TopicID)]
			}
			if name == "" {
				continue // a topic deleted since it was assigned: nothing to show for it
			}
			mv.assigned[name] = append(mv.assigned[name], t.Partitions...)
		}
		for _, ps := range mv.assigned {
			slices.Sort(ps)
		}
		g.members = append(g.members, mv)
	}
	return g, nil
}

func classicView(d kadm.DescribedGroup) groupView {
	g := groupView{protocol: "classic", state: d.State,
		rebalancing: d.State == "PreparingRebalance" || d.State == "CompletingRebalance"}
	var joined []int32
	for _, m := range d.Members {
		mv := memberView{id: m.MemberID, clientID: m.ClientID, host: m.ClientHost, assigned: map[string][]int32{}}
		if meta, ok := m.Join.AsConsumer(); ok {
			mv.subscribed = meta.Topics
			if meta.Version >= 2 { // KIP-792's generation field
				joined = append(joined, meta.Generation)
			}
		}
		if a, ok := m.Assigned.AsConsumer(); ok {
			for _, t := range a.Topics {
				mv.assigned[t.Topic] = append(mv.assigned[t.Topic], t.Partitions...)
			}
		}
		g.members = append(g.members, mv)
	}
	if gen := inferGeneration(d.State, joined); gen != nil {
		for i := range g.members {
			g.members[i].epoch = gen
		}
	}
	return g
}

// withHeartbeatEpochs gives the members of a Stable classic group whose
// generation could not be inferred (every member joined it fresh: a
// single-member group, usually) the generation their workers' heartbeats
// recorded (sink.Worker.Epoch, migration 018): the highest among the
// current members' rows, since every member of a Stable group is in the
// same generation. A member that joined fresh wrote its row only after
// joining, so that row holds the current generation, or none yet (the
// first beat comes within a moment of the join). Other views are
// returned as they are.
func (g groupView) withHeartbeatEpochs(workers []sink.Worker) groupView {
	if g.protocol != "classic" || g.state != "Stable" || len(g.members) == 0 {
		return g
	}
	for _, m := range g.members {
		if m.epoch != nil {
			return g // inferred from the join metadata
		}
	}
	current := map[string]bool{}
	for _, m := range g.members {
		current[m.id] = true
	}
	var gen *int32
	for _, w := range workers {
		if current[w.MemberID] && w.Epoch != nil && (gen == nil || *w.Epoch > *gen) {
			gen = w.Epoch
		}
	}
	if gen == nil {
		return g
	}
	members := slices.Clone(g.members)
	for i := range members {
		members[i].epoch = ptr(*gen)
	}
	g.members = members
	return g
}

// inferGeneration returns the generation of a Stable classic group from the
// generations its members reported when they joined it (KIP-792), or nil if
// it cannot be known. In the classic protocol every member sends JoinGroup
// for every generation; the one that formed generation G carried the
// member's previous generation, G-1, or -1 if the member joined fresh (kgo,
// like the Java client, forgets its generation when it is fenced out).
func inferGeneration(state string, joined []int32) *int32 {
	if state != "Stable" {
		return nil
	}
	best := int32(-1)
	for _, g := range joined {
		best = max(best, g)
	}
	if best < 0 {
		return nil
	}
	gen := best + 1
	return &gen
}

// join is the pure part of Describe: it lines up, per partition of topics,
// the coordinator's assignment, the fencing row and the high watermark
// (ends[topic][partition]; -1 means the partition exists but its end is
// unknown), and applies the state rules documented on Assignment; recorded
// are the partition counts the group recorded per topic (ends has the
// topics' partitions as Kafka has them now).
func join(g groupView, fences []sink.Fence, ends map[string]map[int32]int64, recorded map[string]int32, topics []string) []Assignment {
	type key struct {
		topic     string
		partition int32
	}
	wanted := map[string]bool{}
	for _, t := range topics {
		wanted[t] = true
	}
	rows := map[key]*Assignment{}
	row := func(t string, p int32) *Assignment {
		k := key{t, p}
		if rows[k] == nil {
			rows[k] = &Assignment{Topic: t, Partition: p}
		}
		return rows[k]
	}
	for t, ps := range ends {
		if !wanted[t] {
			continue
		}
		for p, end := range ps {
			a := row(t, p)
			if end >= 0 {
				a.HighWatermark = ptr(end)
			}
		}
	}
	members := map[string]bool{}
	for _, m := range g.members {
		members[m.id] = true
		for t, ps := range m.assigned {
			if !wanted[t] {
				continue
			}
			for _, p := range ps {
				a := row(t, p)
				if a.MemberID != "" {
					// Two members with the same partition: the coordinator
					// should never say so; keep the first in member order.
					continue
				}
				a.MemberID, a.ClientID, a.Host, a.Epoch = m.id, m.clientID, m.host, m.epoch
			}
		}
	}
	for _, f := range fences {
		if !wanted[f.Topic] {
			continue
		}
		a := row(f.Topic, f.Partition.Partition)
		a.FenceEpoch = f.Token.String()
		a.FenceOwner = f.Owner
		a.NextOffset = ptr(f.NextOffset)
		if a.HighWatermark != nil {
			a.Lag = ptr(*a.HighWatermark - f.NextOffset)
		}
	}
	held := map[string]bool{}
	for t, n := range recorded {
		held[t] = len(ends[t]) > 0 && int32(len(ends[t])) != n
	}
	out := make([]Assignment, 0, len(rows))
	for _, a := range rows {
		a.State = stateOf(g, members, held[a.Topic], a)
		out = append(out, *a)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Topic != out[j].Topic {
			return out[i].Topic < out[j].Topic
		}
		return out[i].Partition < out[j].Partition
	})
	return out
}

func stateOf(g groupView, members map[string]bool, held bool, a *Assignment) State {
	switch {
	case a.MemberID == "" && g.rebalancing:
		return StateRebalancing
	case a.MemberID == "":
		return StateUnowned
	case held:
		return StateHeldPartitions
	case a.FenceOwner == a.MemberID:
		return StateOK
	case a.FenceOwner != "" && !members[a.FenceOwner]:
		return StateStaleOwner
	default:
		return StateClaimPending
	}
}

func ptr[T any](v T) *T { return &v }
