package sink_test

import (
	"strings"
	"testing"

	"github.com/tenure-dev/tenure/internal/fence"
	"github.com/tenure-dev/tenure/sink"
)

// A GID names its batch, parses back, stays within Postgres's 200 bytes
// whatever the names' lengths, and keeps schemas, groups, topics and
// partitions apart by its prefix.
func TestStrictGID(t *testing.T) {
	long := strings.Repeat("g", 10_000)
	p := sink.Partition{Group: long, Topic: strings.Repeat("t", 249), Partition: 2147483647}
	b := fence.StrictBatch{Partition: p, Token: sink.Token{Incarnation: 1<<63 - 1, Epoch: 2147483647}, ClaimID: 1<<63 - 1,
		From: 1<<63 - 2, To: 1<<63 - 1}
	gid := fence.GID("tenure", b)
	if len(gid) > 200 {
		t.Fatalf("GID of %d bytes: %s", len(gid), gid)
	}
	got, err := fence.ParseGID("tenure", p, gid)
	if err != nil || got != b {
		t.Fatalf("ParseGID(%q) = %+v, %v; want %+v", gid, got, err, b)
	}
	if !strings.HasPrefix(gid, fence.StrictPrefix("tenure", p)) {
		t.Errorf("%q lacks its partition's prefix", gid)
	}
	for _, other := range []struct {
		schema string
		p      sink.Partition
	}{
		{"other", p},
		{"tenure", sink.Partition{Group: "g", Topic: p.Topic, Partition: p.Partition}},
		{"tenure", sink.Partition{Group: long, Topic: "t", Partition: p.Partition}},
		{"tenure", sink.Partition{Group: long, Topic: p.Topic, Partition: 214748364}},
	} {
		if strings.HasPrefix(gid, fence.StrictPrefix(other.schema, other.p)) {
			t.Errorf("%q also has the prefix of %s in %s", gid, other.p, other.schema)
		}
		if _, err := fence.ParseGID(other.schema, other.p, gid); err == nil {
			t.Errorf("%q parsed as a batch of %s in %s", gid, other.p, other.schema)
		}
	}
	for _, bad := range []string{gid + ".1", strings.Replace(gid, ".", ".0", 1), fence.StrictPrefix("tenure", p) + "1.2.3.4.x"} {
		if _, err := fence.ParseGID("tenure", p, bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}
