package consumer

import (
	"strings"
	"testing"

	"github.com/tenure-dev/tenure/sink"
)

func TestIdentityHold(t *testing.T) {
	key := sink.Partition{Group: "g", Topic: "t", Partition: 0}
	id, other := [16]byte{1}, [16]byte{2}
	tl := &topicLog{id: id, partitions: 1, start: map[int32]int64{0: 5}, end: map[int32]int64{0: 20}}
	for _, c := range []struct {
		name    string
		claimed sink.Claimed
		want    sink.HoldKind
		says    string
	}{
		{"fits", sink.Claimed{NextOffset: 10, TopicID: id}, "", ""},
		{"fits at the log's end", sink.Claimed{NextOffset: 20, TopicID: id}, "", ""},
		{"no id recorded yet", sink.Claimed{NextOffset: 10}, "", ""},
		{"another topic id", sink.Claimed{NextOffset: 10, TopicID: other}, sink.HoldTopicRecreated, "deleted and re-created"},
		{"above the log's end", sink.Claimed{NextOffset: 25, TopicID: id}, sink.HoldAheadOfLog, "above the log's end 20"},
		{"below the log's start", sink.Claimed{NextOffset: 2, TopicID: id}, sink.HoldLogTruncated, "3 jobs (offsets 2 to 4)"},
	} {
		h := identityHold(key, "m", c.claimed, tl)
		switch {
		case c.want == "" && h != nil:
			t.Errorf("%s: held (%s: %s)", c.name, h.Kind, h.Reason)
		case c.want != "" && (h == nil || h.Kind != c.want || !strings.Contains(h.Reason, c.says)):
			t.Errorf("%s: hold %+v, want %s saying %q", c.name, h, c.want, c.says)
		}
	}
}
