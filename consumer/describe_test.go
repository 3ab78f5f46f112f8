package consumer

import (
	"encoding/json"
	"reflect"
	"sort"
	"testing"

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
	rows := join(g, fences, ends, []string{"jobs"})
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
	rows := join(groupView{}, []sink.Fence{dFence("jobs", 0, 0, 3, "A", 4)}, ends, []string{"jobs"})
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
	rows := join(g, []sink.Fence{dFence("jobs", 0, 0, 3, "A", 4)}, map[string]map[int32]int64{"jobs": {0: 4, 1: 0}}, []string{"jobs"})
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
	rows := join(groupView{}, fences, ends, []string{"gone", "jobs"})
	if len(rows) != 2 || rows[0].Topic != "gone" || rows[1].Topic != "jobs" {
		t.Fatalf("rows should be sorted by topic: %+v", rows)
	}
	for _, r := range rows {
		if r.HighWatermark != nil || r.Lag != nil || r.NextOffset == nil {
			t.Errorf("%s/%d: high watermark and lag must be null, next offset known: %+v", r.Topic, r.Partition, r)
		}
	}
}

func TestJoinTopicFilter(t *testing.T) {
	g := groupView{protocol: "consumer", state: "Stable", members: []memberView{
		dMember("A", 3, map[string][]int32{"jobs": {0}, "other": {0}}),
	}}
	fences := []sink.Fence{dFence("jobs", 0, 0, 3, "A", 0), dFence("other", 0, 0, 3, "A", 0)}
	ends := map[string]map[int32]int64{"jobs": {0: 0}, "other": {0: 0}}
	rows := join(g, fences, ends, []string{"jobs"})
	if len(rows) != 1 || rows[0].Topic != "jobs" || rows[0].State != StateOK {
		t.Fatalf("only the asked topic: %+v", rows)
	}
}

func TestJoinNegativeLag(t *testing.T) {
	// The topic was recreated: Postgres is ahead of the new log.
	rows := join(groupView{}, []sink.Fence{dFence("jobs", 0, 0, 3, "A", 100)},
		map[string]map[int32]int64{"jobs": {0: 7}}, []string{"jobs"})
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
	want := []string{"client_id", "epoch", "fence_epoch", "fence_owner", "high_watermark", "host", "lag",
		"member_id", "next_offset", "partition", "state", "topic"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("JSON fields %v, want %v", got, want)
	}
	for _, k := range []string{"epoch", "next_offset", "high_watermark", "lag"} {
		if m[k] != nil {
			t.Errorf("%s of an empty assignment should be null, got %v", k, m[k])
		}
	}
}
