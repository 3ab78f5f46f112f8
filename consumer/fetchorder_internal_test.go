package consumer

import (
	"reflect"
	"testing"
)

// A partition assigned to this worker goes first in its fetch requests
// until its first records come, or its lane stops; then kgo's own order
// applies again.
func TestUnfedPartitionsFetchFirst(t *testing.T) {
	t.Parallel()
	c := testConsumer(t)
	lane := func(topic string, p int32) *lane { return c.testLane(topic, p, 10) }
	// The request as kgo built it: its topics and, per topic, its
	// partitions in kgo's rotating order.
	topics := []string{"a", "t"}
	parts := map[string][]int32{"a": {0, 1}, "t": {9, 0, 1, 2, 3, 7}}
	want := func(step string, wantTopics []string, wantParts map[string][]int32) {
		t.Helper()
		gotTopics, gotParts := c.unfed.prefer(nil, topics, parts)
		if !reflect.DeepEqual(gotTopics, wantTopics) || !reflect.DeepEqual(gotParts, wantParts) {
			t.Fatalf("%s: prefer gives %v %v, want %v %v", step, gotTopics, gotParts, wantTopics, wantParts)
		}
	}

	want("no lane", nil, nil)
	l7, l3 := lane("t", 7), lane("t", 3)
	other := lane("b", 4) // a topic this request does not fetch
	want("two new lanes of t", []string{"t"}, map[string][]int32{"t": {3, 7}})

	l7.push(recs(10, 11), 0)
	want("after 7's first records", []string{"t"}, map[string][]int32{"t": {3}})
	l7.push(recs(12), 0)
	want("after 7's next records", []string{"t"}, map[string][]int32{"t": {3}})

	// A lane that stops before any record came loses its place.
	l3.end()
	want("after 3's lane ended", nil, nil)

	// A partition assigned again: the old lane, released after the new
	// one exists, must not take the new one's place away.
	old := lane("t", 2)
	fresh := lane("t", 2)
	old.release()
	want("after the old lane of 2 left", []string{"t"}, map[string][]int32{"t": {2}})
	fresh.release()
	other.release()
	want("every lane gone", nil, nil)

	// What prefer returns is kgo's to change.
	l9 := lane("t", 9)
	_, got := c.unfed.prefer(nil, topics, parts)
	got["t"][0] = 42
	want("after kgo changed an answer", []string{"t"}, map[string][]int32{"t": {9}})
	l9.release()
}
