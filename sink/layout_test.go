package sink_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tenure-dev/tenure/sink"
)

// recordedLayout reads topic_layouts for (group, topic); -1 when absent.
func (e *env) recordedLayout(t testing.TB, group, topic string) (count int32, ackBy *string, ackAt *time.Time) {
	t.Helper()
	err := e.pool.QueryRow(e.ctx, `SELECT partition_count, acknowledged_by, acknowledged_at FROM `+e.q()+`.topic_layouts
		WHERE consumer_group = $1 AND topic = $2`, group, topic).Scan(&count, &ackBy, &ackAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return -1, nil, nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return count, ackBy, ackAt
}

func TestCheckLayout(t *testing.T) {
	t.Parallel()
	e := setup(t)

	// First sight records the count.
	if err := e.store.CheckLayout(e.ctx, "g", "jobs", 2); err != nil {
		t.Fatalf("first sight: %v", err)
	}
	if n, by, at := e.recordedLayout(t, "g", "jobs"); n != 2 || by != nil || at != nil {
		t.Fatalf("recorded %d (acknowledged by %v at %v), want 2, never acknowledged", n, by, at)
	}
	// The same count passes, again and again.
	for range 3 {
		if err := e.store.CheckLayout(e.ctx, "g", "jobs", 2); err != nil {
			t.Fatalf("equal count: %v", err)
		}
	}

	// A different count is a *LayoutError that says everything an operator
	// needs, and the recorded count stays.
	err := e.store.CheckLayout(e.ctx, "g", "jobs", 4)
	if !errors.Is(err, sink.ErrPartitionsChanged) {
		t.Fatalf("changed count: %v, want an error matching ErrPartitionsChanged", err)
	}
	if errors.Is(err, sink.ErrFenced) {
		t.Fatalf("a layout change is not a fence: %v", err)
	}
	var le *sink.LayoutError
	if !errors.As(err, &le) {
		t.Fatalf("error %v (%T) is not a *LayoutError", err, err)
	}
	if le.Group != "g" || le.Topic != "jobs" || le.Recorded != 2 || le.Now != 4 {
		t.Fatalf("LayoutError %+v", le)
	}
	msg := err.Error()
	for _, want := range []string{
		`"jobs"`, `"g"`, "now has 4 partitions", "recorded 2", // both counts, the group, the topic
		"keys now map to different partitions", "two owners", "out of order", // the per-key ordering hazard
		"tenure admin topic acknowledge-partitions", "--group g", "--topic jobs", "--partitions 4", // the way out
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("message lacks %q: %s", want, msg)
		}
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("message is not one line: %q", msg)
	}
	if n, _, _ := e.recordedLayout(t, "g", "jobs"); n != 2 {
		t.Fatalf("a refused count overwrote the record: %d", n)
	}
	// Fewer partitions (a topic recreated smaller) is a change too.
	if err := e.store.CheckLayout(e.ctx, "g", "jobs", 1); !errors.Is(err, sink.ErrPartitionsChanged) {
		t.Fatalf("fewer partitions: %v", err)
	}

	// Layouts are per group and per topic.
	if err := e.store.CheckLayout(e.ctx, "other", "jobs", 4); err != nil {
		t.Fatalf("another group's first sight of 4: %v", err)
	}
	if err := e.store.CheckLayout(e.ctx, "g", "more-jobs", 4); err != nil {
		t.Fatalf("another topic's first sight of 4: %v", err)
	}

	// Nonsense counts are errors, not records.
	for _, n := range []int32{0, -1} {
		err := e.store.CheckLayout(e.ctx, "g", "fresh", n)
		if err == nil || errors.Is(err, sink.ErrPartitionsChanged) {
			t.Errorf("count %d: %v", n, err)
		}
	}
	if n, _, _ := e.recordedLayout(t, "g", "fresh"); n != -1 {
		t.Errorf("a nonsense count was recorded: %d", n)
	}
}

// Names are bind parameters: quotes and semicolons are just characters.
func TestCheckLayoutOddNames(t *testing.T) {
	t.Parallel()
	e := setup(t)
	group, topic := `g'; DROP TABLE x; --`, `t"; DELETE FROM y`
	if err := e.store.CheckLayout(e.ctx, group, topic, 3); err != nil {
		t.Fatal(err)
	}
	if n, _, _ := e.recordedLayout(t, group, topic); n != 3 {
		t.Fatalf("recorded %d", n)
	}
	var le *sink.LayoutError
	if err := e.store.CheckLayout(e.ctx, group, topic, 5); !errors.As(err, &le) || le.Group != group || le.Topic != topic {
		t.Fatalf("%v", err)
	}
}

// Replicas starting together all see the topic for the first time at once:
// each must get an answer (the count is recorded once), not a spurious error.
func TestCheckLayoutConcurrentFirstSight(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const n = 8
	for round := range 20 {
		topic := "t" + string(rune('a'+round))
		errs := make([]error, n)
		atOnce(n, func(i int) { errs[i] = e.store.CheckLayout(e.ctx, "g", topic, 3) })
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d, caller %d: %v", round, i, err)
			}
		}
	}
}

func TestAcknowledgePartitions(t *testing.T) {
	t.Parallel()
	e := setup(t)
	claim := func(p sink.Partition, count int32) {
		t.Helper()
		if _, err := e.store.Claim(e.ctx, sink.ClaimRequest{Partition: p, Token: tok(0, 3), Owner: "a", PartitionCount: count}); err != nil {
			t.Fatal(err)
		}
	}
	// Group g consumes jobs (2 partitions) and other (2 partitions); group
	// h consumes jobs too.
	for _, c := range []struct{ group, topic string }{{"g", "jobs"}, {"g", "other"}, {"h", "jobs"}} {
		if err := e.store.CheckLayout(e.ctx, c.group, c.topic, 2); err != nil {
			t.Fatal(err)
		}
		claim(sink.Partition{Group: c.group, Topic: c.topic, Partition: 0}, 2)
		claim(sink.Partition{Group: c.group, Topic: c.topic, Partition: 1}, 2)
	}
	if err := e.store.CheckLayout(e.ctx, "g", "jobs", 4); !errors.Is(err, sink.ErrPartitionsChanged) {
		t.Fatalf("before acknowledging: %v", err)
	}

	old, err := e.store.AcknowledgePartitions(e.ctx, "g", "jobs", 4, "ops@host")
	if err != nil || old != 2 {
		t.Fatalf("AcknowledgePartitions = %d, %v; want 2, nil", old, err)
	}
	n, by, at := e.recordedLayout(t, "g", "jobs")
	if n != 4 || by == nil || *by != "ops@host" || at == nil {
		t.Fatalf("topic_layouts after acknowledging: %d, by %v, at %v", n, by, at)
	}
	// The fencing rows of that group and topic carry the new count; no one
	// else's do.
	for _, c := range []struct {
		group, topic string
		want         int32
	}{{"g", "jobs", 4}, {"g", "other", 2}, {"h", "jobs", 2}} {
		for p := range int32(2) {
			if f := e.mustGet(t, sink.Partition{Group: c.group, Topic: c.topic, Partition: p}); f.PartitionCount != c.want {
				t.Errorf("%s/%s/%d partition_count %d, want %d", c.group, c.topic, p, f.PartitionCount, c.want)
			}
		}
	}
	if n, _, _ := e.recordedLayout(t, "h", "jobs"); n != 2 {
		t.Errorf("group h's layout moved to %d", n)
	}
	// Workers that see 4 pass now; one still seeing 2 is the one refused.
	if err := e.store.CheckLayout(e.ctx, "g", "jobs", 4); err != nil {
		t.Fatalf("after acknowledging: %v", err)
	}
	var le *sink.LayoutError
	if err := e.store.CheckLayout(e.ctx, "g", "jobs", 2); !errors.As(err, &le) || le.Recorded != 4 || le.Now != 2 {
		t.Fatalf("a worker with stale metadata: %v", err)
	}
	// Acknowledging the count already recorded changes nothing and says so.
	if old, err := e.store.AcknowledgePartitions(e.ctx, "g", "jobs", 4, "ops@host"); err != nil || old != 4 {
		t.Fatalf("acknowledging again = %d, %v", old, err)
	}

	// A group that never consumed the topic has nothing to acknowledge.
	if _, err := e.store.AcknowledgePartitions(e.ctx, "g", "never-seen", 4, "ops"); err == nil ||
		!strings.Contains(err.Error(), "never-seen") {
		t.Fatalf("unknown topic: %v", err)
	}
	if _, err := e.store.AcknowledgePartitions(e.ctx, "nobody", "jobs", 4, "ops"); err == nil {
		t.Fatal("unknown group: accepted")
	}
	if n, _, _ := e.recordedLayout(t, "g", "never-seen"); n != -1 {
		t.Fatalf("acknowledging an unknown topic recorded %d", n)
	}
	if n, _, _ := e.recordedLayout(t, "nobody", "jobs"); n != -1 {
		t.Fatalf("acknowledging for an unknown group recorded %d", n)
	}
	for _, bad := range []int32{0, -3} {
		if _, err := e.store.AcknowledgePartitions(e.ctx, "g", "jobs", bad, "ops"); err == nil {
			t.Errorf("count %d accepted", bad)
		}
	}
	if n, _, _ := e.recordedLayout(t, "g", "jobs"); n != 4 {
		t.Fatalf("a refused acknowledgement changed the record to %d", n)
	}
}
