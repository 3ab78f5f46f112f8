package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tenure-dev/tenure/sink"
)

func dFence(topic string, p int32, inc int64, epoch int32, owner string, next int64) sink.Fence {
	return sink.Fence{
		Partition: sink.Partition{Group: "g", Topic: topic, Partition: p},
		Token:     sink.Token{Incarnation: inc, Epoch: epoch},
		Owner:     owner, NextOffset: next, PartitionCount: 3,
	}
}

func dMember(id string, epoch int32, assigned map[string][]int32) memberView {
	return memberView{id: id, clientID: "client-" + id, host: "/10.0.0." + id, epoch: &epoch,
		subscribed: []string{"jobs"}, assigned: assigned}
}

func dByPartition(rows []Assignment) map[int32]Assignment {
	m := map[int32]Assignment{}
	for _, r := range rows {
		m[r.Partition] = r
	}
	return m
}

func TestJoinStates(t *testing.T) {
	ends := map[string]map[int32]int64{"jobs": {0: 10, 1: 20, 2: 30, 3: 40, 4: 50}}
	g := groupView{protocol: "consumer", state: "Stable", members: []memberView{
		dMember("A", 7, map[string][]int32{"jobs": {0, 1}}),
		dMember("B", 9, map[string][]int32{"jobs": {2, 3}}),
	}}
	fences := []sink.Fence{
		dFence("jobs", 0, 0, 5, "A", 10), // A holds what A is assigned
		// 1: A is assigned, no row yet
		dFence("jobs", 2, 0, 7, "A", 25), // B is assigned, A (still a member) holds the row
		dFence("jobs", 3, 0, 4, "Z", 31), // B is assigned, Z has left the group
		dFence("jobs", 4, 1, 2, "A", 50), // nobody is assigned
	}
	rows := join(g, fences, ends, nil, []string{"jobs"})
	if len(rows) != 5 {
		t.Fatalf("want 5 rows, got %d: %+v", len(rows), rows)
	}
	for i, r := range rows {
		if r.Partition != int32(i) {
			t.Fatalf("rows not sorted by partition: %+v", rows)
		}
	}
	want := map[int32]State{0: StateOK, 1: StateClaimPending, 2: StateClaimPending, 3: StateStaleOwner, 4: StateUnowned}
	for p, s := range want {
		if got := rows[p].State; got != s {
			t.Errorf("partition %d: state %q, want %q (%+v)", p, got, s, rows[p])
		}
	}

	ok := rows[0]
	if ok.MemberID != "A" || ok.ClientID != "client-A" || ok.Host != "/10.0.0.A" || ok.Epoch == nil || *ok.Epoch != 7 {
		t.Errorf("coordinator columns of partition 0: %+v", ok)
	}
	if ok.FenceEpoch != "0.5" || ok.FenceOwner != "A" || *ok.NextOffset != 10 || *ok.HighWatermark != 10 || *ok.Lag != 0 {
		t.Errorf("fence columns of partition 0: %+v", ok)
	}
	if r := rows[1]; r.FenceEpoch != "" || r.FenceOwner != "" || r.NextOffset != nil || r.Lag != nil || *r.HighWatermark != 20 {
		t.Errorf("partition 1 has no fencing row, so no fence columns and no lag: %+v", r)
	}
	if r := rows[3]; *r.Lag != 9 || r.MemberID != "B" || r.FenceOwner != "Z" {
		t.Errorf("partition 3: %+v", r)
	}
	if r := rows[4]; r.MemberID != "" || r.Epoch != nil || r.FenceEpoch != "1.2" || r.FenceOwner != "A" || *r.Lag != 0 {
		t.Errorf("unowned partition 4 keeps its fence columns and no member: %+v", r)
	}
}

func TestJoinEmptyGroupIsUnowned(t *testing.T) {
	// The coordinator does not know the group (all workers stopped long
	// ago): every partition is unowned, and the fencing rows still show the
	// last owner and its progress.
	ends := map[string]map[int32]int64{"jobs": {0: 5, 1: 0}}
	rows := join(groupView{}, []sink.Fence{dFence("jobs", 0, 0, 3, "A", 4)}, ends, nil, []string{"jobs"})
	if len(rows) != 2 {
		t.Fatalf("rows: %+v", rows)
	}
	for _, r := range rows {
		if r.State != StateUnowned {
			t.Errorf("partition %d: %q, want unowned", r.Partition, r.State)
		}
	}
	if *rows[0].Lag != 1 || rows[0].FenceOwner != "A" {
		t.Errorf("partition 0: %+v", rows[0])
	}
}

func TestJoinClassicRebalancing(t *testing.T) {
	// Mid-rebalance a classic coordinator shows members but no assignment:
	// that is not "unowned".
	g := groupView{protocol: "classic", state: "PreparingRebalance", rebalancing: true,
		members: []memberView{{id: "A"}, {id: "B"}}}
	rows := join(g, []sink.Fence{dFence("jobs", 0, 0, 3, "A", 4)}, map[string]map[int32]int64{"jobs": {0: 4, 1: 0}}, nil, []string{"jobs"})
	for _, r := range rows {
		if r.State != StateRebalancing {
			t.Errorf("partition %d: %q, want rebalancing", r.Partition, r.State)
		}
	}
}

func TestJoinUnknownEndsAndDeletedTopics(t *testing.T) {
	// -1: the partition exists but its end offset could not be listed.
	// "gone" has a fencing row but no partitions any more.
	ends := map[string]map[int32]int64{"jobs": {0: -1}}
	fences := []sink.Fence{dFence("jobs", 0, 0, 1, "A", 3), dFence("gone", 2, 0, 1, "A", 8)}
	rows := join(groupView{}, fences, ends, nil, []string{"gone", "jobs"})
	if len(rows) != 2 || rows[0].Topic != "gone" || rows[1].Topic != "jobs" {
		t.Fatalf("rows should be sorted by topic: %+v", rows)
	}
	for _, r := range rows {
		if r.HighWatermark != nil || r.Lag != nil || r.NextOffset == nil {
			t.Errorf("%s/%d: high watermark and lag must be null, next offset known: %+v", r.Topic, r.Partition, r)
		}
	}
}

func TestJoinHeldPartitions(t *testing.T) {
	// The group recorded 2 partitions of "jobs"; Kafka has 4 now (or an
	// operator recorded 5 where Kafka has 4): its workers hold the topic, so
	// an assigned partition is held-partitions, not ok. "other" matches its
	// record; unassigned partitions stay unowned.
	g := groupView{protocol: "consumer", state: "Stable", members: []memberView{
		dMember("A", 3, map[string][]int32{"jobs": {0, 1, 2}, "other": {0}}),
	}}
	fences := []sink.Fence{dFence("jobs", 0, 0, 3, "A", 0), dFence("jobs", 1, 0, 3, "A", 0), dFence("other", 0, 0, 3, "A", 0)}
	ends := map[string]map[int32]int64{"jobs": {0: 0, 1: 0, 2: 0, 3: 0}, "other": {0: 0}}
	for _, recorded := range []int32{2, 5} {
		rows := join(g, fences, ends, map[string]int32{"jobs": recorded, "other": 1}, []string{"jobs", "other"})
		want := []State{StateHeldPartitions, StateHeldPartitions, StateHeldPartitions, StateUnowned, StateOK}
		if len(rows) != len(want) {
			t.Fatalf("rows: %+v", rows)
		}
		for i, r := range rows {
			if r.State != want[i] {
				t.Errorf("recorded %d: %s/%d is %q, want %q", recorded, r.Topic, r.Partition, r.State, want[i])
			}
		}
	}
	// Acknowledged: the record matches Kafka again.
	rows := join(g, fences, ends, map[string]int32{"jobs": 4, "other": 1}, []string{"jobs"})
	if rows[0].State != StateOK || rows[2].State != StateClaimPending {
		t.Errorf("after the acknowledgement: %+v", rows)
	}
}

func TestJoinTopicFilter(t *testing.T) {
	g := groupView{protocol: "consumer", state: "Stable", members: []memberView{
		dMember("A", 3, map[string][]int32{"jobs": {0}, "other": {0}}),
	}}
	fences := []sink.Fence{dFence("jobs", 0, 0, 3, "A", 0), dFence("other", 0, 0, 3, "A", 0)}
	ends := map[string]map[int32]int64{"jobs": {0: 0}, "other": {0: 0}}
	rows := join(g, fences, ends, nil, []string{"jobs"})
	if len(rows) != 1 || rows[0].Topic != "jobs" || rows[0].State != StateOK {
		t.Fatalf("only the asked topic: %+v", rows)
	}
}

func TestJoinNegativeLag(t *testing.T) {
	// The topic was recreated: Postgres is ahead of the new log.
	rows := join(groupView{}, []sink.Fence{dFence("jobs", 0, 0, 3, "A", 100)},
		map[string]map[int32]int64{"jobs": {0: 7}}, nil, []string{"jobs"})
	if *dByPartition(rows)[0].Lag != -93 {
		t.Fatalf("lag: %+v", rows)
	}
}

func TestDefaultTopics(t *testing.T) {
	g := groupView{members: []memberView{
		{id: "A", subscribed: []string{"b", "a"}},
		{id: "B", assigned: map[string][]int32{"c": {0}}},
	}}
	got := g.topics([]sink.Fence{dFence("d", 0, 0, 1, "A", 0), dFence("a", 1, 0, 1, "A", 0)})
	if want := []string{"a", "b", "c", "d"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("topics %v, want %v", got, want)
	}
}

func TestInferGeneration(t *testing.T) {
	for _, c := range []struct {
		state  string
		joined []int32
		want   int32 // 0: unknown
	}{
		{"Stable", []int32{2, 2}, 3},
		{"Stable", []int32{1, -1}, 2}, // B joined fresh, A came from generation 1
		{"Stable", []int32{-1, -1}, 0},
		{"Stable", nil, 0},
		{"PreparingRebalance", []int32{4}, 0},
		{"Empty", nil, 0},
	} {
		got := inferGeneration(c.state, c.joined)
		switch {
		case c.want == 0 && got != nil:
			t.Errorf("%s %v: got %d, want unknown", c.state, c.joined, *got)
		case c.want != 0 && (got == nil || *got != c.want):
			t.Errorf("%s %v: got %v, want %d", c.state, c.joined, got, c.want)
		}
	}
}

func TestAssignmentJSONFields(t *testing.T) {
	b, err := json.Marshal(Assignment{})
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	var got []string
	for k := range m {
		got = append(got, k)
	}
	sort.Strings(got)
	want := []string{"client_id", "consumer_group", "epoch", "fence_epoch", "fence_owner", "for_seconds", "high_watermark", "host", "lag",
		"member_id", "next_offset", "partition", "reason", "since", "state", "topic"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("JSON fields %v, want %v", got, want)
	}
	for _, k := range []string{"epoch", "next_offset", "high_watermark", "lag", "since", "for_seconds"} {
		if m[k] != nil {
			t.Errorf("%s of an empty assignment should be null, got %v", k, m[k])
		}
	}
}

// cgMember builds a ConsumerGroupDescribe member whose assignment names its
// topics as given: by ID only when the name is "".
func cgMember(id string, epoch int32, subscribed []string, assigned ...kmsg.AssignmentTopicPartition) kmsg.ConsumerGroupDescribeResponseGroupMember {
	m := kmsg.NewConsumerGroupDescribeResponseGroupMember()
	m.MemberID, m.ClientID, m.ClientHost, m.MemberEpoch = id, "client-"+id, "/127.0.0.1", epoch
	m.SubscribedTopics = subscribed
	m.Assignment.TopicPartitions = assigned
	return m
}

func cgAssigned(id byte, name string, parts ...int32) kmsg.AssignmentTopicPartition {
	tp := kmsg.NewAssignmentTopicPartition()
	tp.TopicID = [16]byte{id}
	tp.Topic = name
	tp.Partitions = parts
	return tp
}

// kfake names a KIP-848 assignment's topics by ID only; the view must map
// every ID to its name, whatever the number of topics a member consumes.
func TestConsumerViewNamesTopicsByID(t *testing.T) {
	g := kmsg.NewConsumerGroupDescribeResponseGroup()
	g.State = "Stable"
	g.Members = []kmsg.ConsumerGroupDescribeResponseGroupMember{
		cgMember("A", 4, []string{"alpha", "beta"}, cgAssigned(1, "", 1, 0), cgAssigned(2, "", 2)),
		cgMember("B", 5, []string{"beta", "alpha"}, cgAssigned(1, "", 2), cgAssigned(2, "", 0, 1),
			cgAssigned(9, "", 0)), // a topic deleted since: unknown to the metadata
		cgMember("C", 6, []string{"gamma"}, cgAssigned(3, "gamma", 0)), // named by the broker
	}
	var asked map[kadm.TopicID]bool
	var hint []string
	resolve := func(ids map[kadm.TopicID]bool, h []string) (map[kadm.TopicID]string, error) {
		asked, hint = ids, h
		return map[kadm.TopicID]string{{1}: "alpha", {2}: "beta"}, nil
	}
	v, err := consumerView(g, resolve)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[kadm.TopicID]bool{{1}: true, {2}: true, {9}: true}; !reflect.DeepEqual(asked, want) {
		t.Errorf("asked to name %v, want exactly the unnamed IDs %v", asked, want)
	}
	sort.Strings(hint)
	if want := []string{"alpha", "beta", "gamma"}; !reflect.DeepEqual(hint, want) {
		t.Errorf("hint %v, want the subscriptions %v", hint, want)
	}
	want := map[string]map[string][]int32{
		"A": {"alpha": {0, 1}, "beta": {2}},
		"B": {"alpha": {2}, "beta": {0, 1}},
		"C": {"gamma": {0}},
	}
	if len(v.members) != 3 {
		t.Fatalf("members: %+v", v.members)
	}
	for _, m := range v.members {
		if !reflect.DeepEqual(m.assigned, want[m.id]) {
			t.Errorf("member %s assigned %v, want %v", m.id, m.assigned, want[m.id])
		}
		if m.epoch == nil || m.clientID != "client-"+m.id {
			t.Errorf("member %s: %+v", m.id, m)
		}
	}
	if v.protocol != "consumer" || v.state != "Stable" {
		t.Errorf("view %+v", v)
	}

	// Nothing to name: the resolver is not called.
	g.Members = g.Members[2:]
	if _, err := consumerView(g, func(map[kadm.TopicID]bool, []string) (map[kadm.TopicID]string, error) {
		t.Error("resolver called although every topic is named")
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}

	// The metadata cannot be read: Describe fails rather than guess.
	g.Members = []kmsg.ConsumerGroupDescribeResponseGroupMember{cgMember("A", 1, []string{"alpha"}, cgAssigned(1, "", 0))}
	if _, err := consumerView(g, func(map[kadm.TopicID]bool, []string) (map[kadm.TopicID]string, error) {
		return nil, errors.New("metadata unavailable")
	}); err == nil {
		t.Error("a failed metadata read must fail the view")
	}
}

// Describe against kfake: a group of two workers consuming two topics, with
// each protocol. Every partition of both topics must be shown assigned to
// the member that holds its fencing row; for KIP-848 this needs the topic
// IDs of the assignment mapped to names.
func TestDescribeMultiTopicGroup(t *testing.T) {
	for _, proto := range []Protocol{Classic, NextGen} {
		t.Run(string(proto), func(t *testing.T) {
			t.Parallel()
			testDescribeMultiTopicGroup(t, proto)
		})
	}
}

func testDescribeMultiTopicGroup(t *testing.T, proto Protocol) {
	parts := map[string]int32{"alpha": 2, "beta": 3}
	w := newLiveWorld(t, parts)
	noop := HandlerFunc(func(context.Context, Tx, *Batch) error { return nil })
	for i := range 2 {
		w.start(Config{Topics: []string{"alpha", "beta"}, Handler: noop, Protocol: proto, ClientID: fmt.Sprintf("w%d", i)})
	}
	// Both members must own partitions: the first one to join holds
	// everything for a moment.
	rows := w.waitRows(60*time.Second, "stable view of both topics, fully claimed by both members", func(rows []Assignment) bool {
		return allOK(rows, parts) && len(memberIDs(rows)) == 2
	})
	for _, r := range rows {
		if r.Epoch == nil && proto == NextGen {
			t.Errorf("%s/%d: KIP-848 member epoch missing", r.Topic, r.Partition)
		}
	}

	// Asking for one topic gives that topic only.
	rows, err := Describe(w.ctx, w.cl, w.store, w.group, []string{"beta"})
	if err != nil {
		t.Fatal(err)
	}
	if !allOK(rows, map[string]int32{"beta": 3}) {
		t.Errorf("--topic beta: %+v", rows)
	}
}

func memberIDs(rows []Assignment) map[string]bool {
	m := map[string]bool{}
	for _, r := range rows {
		m[r.MemberID] = true
	}
	return m
}

// allOK reports whether rows are exactly the partitions of parts, each
// assigned to the member that holds its fencing row.
func allOK(rows []Assignment, parts map[string]int32) bool {
	want := 0
	for _, n := range parts {
		want += int(n)
	}
	if len(rows) != want {
		return false
	}
	for _, r := range rows {
		if r.Partition >= parts[r.Topic] || r.State != StateOK || r.MemberID == "" {
			return false
		}
	}
	return true
}

// A Stable classic group whose members all joined it fresh has no
// generation in its join metadata: the heartbeats' (migration 018) stand
// in, the highest of the current members' rows; rows of members no longer
// in the group, a generation already inferred, and groups mid-rebalance
// are left alone.
func TestWithHeartbeatEpochs(t *testing.T) {
	e := func(v int32) *int32 { return &v }
	fresh := groupView{protocol: "classic", state: "Stable", members: []memberView{{id: "A"}, {id: "B"}}}
	workers := []sink.Worker{{MemberID: "A", Epoch: e(4)}, {MemberID: "B", Epoch: e(5)}, {MemberID: "gone", Epoch: e(9)}, {MemberID: "C"}}
	got := fresh.withHeartbeatEpochs(workers)
	for _, m := range got.members {
		if m.epoch == nil || *m.epoch != 5 {
			t.Errorf("member %s: epoch %v, want 5", m.id, m.epoch)
		}
	}
	if fresh.members[0].epoch != nil {
		t.Error("withHeartbeatEpochs changed the view it was given")
	}
	inferred := groupView{protocol: "classic", state: "Stable", members: []memberView{{id: "A", epoch: e(7)}}}
	if m := inferred.withHeartbeatEpochs(workers).members[0]; *m.epoch != 7 {
		t.Errorf("an inferred generation was replaced: %d", *m.epoch)
	}
	rebalancing := groupView{protocol: "classic", state: "PreparingRebalance", rebalancing: true, members: []memberView{{id: "A"}}}
	if m := rebalancing.withHeartbeatEpochs(workers).members[0]; m.epoch != nil {
		t.Errorf("a rebalancing group got epoch %d", *m.epoch)
	}
	if m := fresh.withHeartbeatEpochs([]sink.Worker{{MemberID: "A"}}).members[0]; m.epoch != nil {
		t.Errorf("a row without an epoch (a worker before 018) gave %d", *m.epoch)
	}
}

// A healthy single-member classic group: its member joined fresh, so
// DescribeGroups and the join metadata do not give the generation, and
// EPOCH used to be "-" beside token 0.N. The worker's heartbeat records
// it: Describe shows the generation the partitions were claimed at.
func TestDescribeSingleMemberClassicGroupEpoch(t *testing.T) {
	t.Parallel()
	solo := map[string]int32{"solo": 2}
	w := newLiveWorld(t, solo)
	w.start(Config{Topics: []string{"solo"}, Protocol: Classic, ClientID: "solo",
		Handler: HandlerFunc(func(context.Context, Tx, *Batch) error { return nil })})
	rows := w.waitRows(60*time.Second, "epoch for the single member", func(rows []Assignment) bool {
		return allOK(rows, solo) && rows[0].Epoch != nil && rows[1].Epoch != nil
	})
	for _, r := range rows {
		// One member, one generation: the one it claimed the partitions at.
		if want := fmt.Sprintf("0.%d", *r.Epoch); r.FenceEpoch != want {
			t.Errorf("solo/%d: epoch %d beside token %s, want token %s", r.Partition, *r.Epoch, r.FenceEpoch, want)
		}
	}
}
