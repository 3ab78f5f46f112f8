package sink_test

import (
	"slices"
	"testing"

	"github.com/tenure-dev/tenure/sink"
)

// Groups and Topics name what has rows in the schema: a group is known from
// its fencing rows, its recorded partition counts, its holds, its
// incarnation or its workers' heartbeats; a topic from the first three, per
// group or for every group.
func TestGroupsAndTopics(t *testing.T) {
	t.Parallel()
	e := setup(t)
	groups, err := e.store.KnownGroups(e.ctx)
	if err != nil || len(groups) != 0 {
		t.Fatalf("an empty schema: %q, %v", groups, err)
	}
	if topics, err := e.store.KnownTopics(e.ctx, ""); err != nil || len(topics) != 0 {
		t.Fatalf("an empty schema's topics: %q, %v", topics, err)
	}
	for _, sql := range []string{
		`INSERT INTO ` + e.q() + `.fences (consumer_group, topic, partition, incarnation, epoch, owner, next_offset, partition_count)
			VALUES ('fenced', 'jobs', 0, 0, 1, 'm', 0, 1), ('fenced', 'jobs', 1, 0, 1, 'm', 0, 2), ('fenced', 'more-jobs', 0, 0, 1, 'm', 0, 1)`,
		`INSERT INTO ` + e.q() + `.topic_layouts (consumer_group, topic, partition_count) VALUES ('laid-out', 'layout-topic', 3)`,
		`INSERT INTO ` + e.q() + `.partition_holds (consumer_group, topic, partition, kind, reason, needs_ack, owner)
			VALUES ('held', 'held-topic', 0, 'stalled', 'r', false, 'm')`,
		`INSERT INTO ` + e.q() + `.group_incarnations (consumer_group, incarnation, bumped_by, reason) VALUES ('bumped', 2, 'ops', 'r')`,
	} {
		if _, err := e.pool.Exec(e.ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.store.Heartbeat(e.ctx, sink.Worker{Group: "beating", MemberID: "m", ClientID: "c", Host: "h", PID: 1}); err != nil {
		t.Fatal(err)
	}
	groups, err = e.store.KnownGroups(e.ctx)
	if want := []string{"beating", "bumped", "fenced", "held", "laid-out"}; err != nil || !slices.Equal(groups, want) {
		t.Errorf("Groups: %q, %v; want %q", groups, err, want)
	}
	for group, want := range map[string][]string{
		"":         {"held-topic", "jobs", "layout-topic", "more-jobs"},
		"fenced":   {"jobs", "more-jobs"},
		"laid-out": {"layout-topic"},
		"held":     {"held-topic"},
		"beating":  nil,
		"nobody":   nil,
	} {
		if topics, err := e.store.KnownTopics(e.ctx, group); err != nil || !slices.Equal(topics, want) {
			t.Errorf("Topics(%q): %q, %v; want %q", group, topics, err, want)
		}
	}
}
