package consumer

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"

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
	// fence columns show the last owner, if any.
	StateUnowned State = "unowned"
	// StateRebalancing: a classic group is mid-rebalance
	// (PreparingRebalance or CompletingRebalance); the coordinator does not
	// reveal assignments until the group is Stable again.
	StateRebalancing State = "rebalancing"
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
	// is one more than the highest generation a member reports. It is null
	// when every member joined fresh (G cannot be known then).
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
	// deleted and recreated, or truncated.
	Lag *int64 `json:"lag"`

	// State compares the two views; first rule that applies:
	//
	//   - rebalancing: classic group mid-rebalance, no member is shown
	//     assigned (assignments are hidden until the group is Stable);
	//   - unowned: no member assigned;
	//   - ok: fence_owner == member_id;
	//   - stale-owner: there is a fencing row, its owner differs and is not
	//     a member of the group any more;
	//   - claim-pending: otherwise (no fencing row yet, or its owner is
	//     another current member).
	State State `json:"state"`
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
// members' current, reconciled assignment). kfake names the topics of a
// KIP-848 assignment by topic ID only, which kadm drops: the partitions are
// then attributed to the member's one subscribed topic, and Describe fails
// for a member subscribed to several.
//
// The coordinator, Postgres and the log are read one after the other, not
// atomically: a hand-off between the reads can show as claim-pending or
// stale-owner for a moment. Describe bounds nothing itself: give ctx a
// deadline.
func Describe(ctx context.Context, adm *kadm.Client, store *sink.Store, group string, topics []string) ([]Assignment, error) {
	if adm == nil || store == nil {
		return nil, errors.New("consumer: Describe needs a kadm client and a sink store")
	}
	if group == "" {
		return nil, errors.New("consumer: Describe needs a group")
	}
	view, err := describeGroup(ctx, adm, group)
	if err != nil {
		return nil, err
	}
	fences, err := store.List(ctx, group)
	if err != nil {
		return nil, fmt.Errorf("reading the fencing rows of group %q: %w", group, err)
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
	return join(view, fences, ends, topics), nil
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
func describeGroup(ctx context.Context, adm *kadm.Client, group string) (groupView, error) {
	cg, err := adm.DescribeConsumerGroups(ctx, group)
	if err == nil {
		if d, ok := cg[group]; ok && d.Err == nil {
			return consumerView(d)
		}
	}
	if ctx.Err() != nil {
		return groupView{}, fmt.Errorf("describing group %q: %w", group, err)
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

func consumerView(d kadm.DescribedConsumerGroup) (groupView, error) {
	g := groupView{protocol: "consumer", state: d.State}
	for _, m := range d.Members {
		epoch := m.MemberEpoch
		mv := memberView{id: m.MemberID, clientID: m.ClientID, host: m.ClientHost, epoch: &epoch,
			subscribed: m.SubscribedTopics, assigned: map[string][]int32{}}
		for t, ps := range m.Assignment {
			if t == "" {
				// The broker sent topic IDs without names (kfake does;
				// Apache Kafka sends both) and kadm keeps only names. The
				// partitions can be attributed only if the member consumes
				// a single topic.
				if len(m.SubscribedTopics) != 1 {
					return groupView{}, fmt.Errorf("the broker named the topics of member %s's assignment by ID only (kfake does; Apache Kafka also sends names) and the member subscribes to %d topics, so its partitions cannot be told apart", m.MemberID, len(m.SubscribedTopics))
				}
				t = m.SubscribedTopics[0]
			}
			for p := range ps {
				mv.assigned[t] = append(mv.assigned[t], p)
			}
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
// unknown), and applies the state rules documented on Assignment.
func join(g groupView, fences []sink.Fence, ends map[string]map[int32]int64, topics []string) []Assignment {
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
	out := make([]Assignment, 0, len(rows))
	for _, a := range rows {
		a.State = stateOf(g, members, a)
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

func stateOf(g groupView, members map[string]bool, a *Assignment) State {
	switch {
	case a.MemberID == "" && g.rebalancing:
		return StateRebalancing
	case a.MemberID == "":
		return StateUnowned
	case a.FenceOwner == a.MemberID:
		return StateOK
	case a.FenceOwner != "" && !members[a.FenceOwner]:
		return StateStaleOwner
	default:
		return StateClaimPending
	}
}

func ptr[T any](v T) *T { return &v }
