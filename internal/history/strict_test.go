package history

import (
	"strings"
	"testing"
	"time"

	"github.com/tenure-dev/tenure/internal/fence"
	"github.com/tenure-dev/tenure/sink"
)

func TestCheckStrict(t *testing.T) {
	p := sink.Partition{Group: "g", Topic: "t", Partition: 0}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	asg := []Assignment{{ClaimID: 1, Member: "a", Partition: p, At: at(0)}, {ClaimID: 2, Member: "b", Partition: p, At: at(1000)}}
	log := []Entry{
		{ID: 1, Kind: "claim", Partition: p, ClaimID: 1},
		{ID: 2, Kind: "commit", Partition: p, ClaimID: 1, From: 0, To: 10, GID: "x1"},
		{ID: 3, Kind: "claim", Partition: p, ClaimID: 2, From: 10, To: 10},
	}
	sent := func(gid string, ms int, gen int32) StrictEvent {
		return StrictEvent{Kind: "sent", GID: gid, ClaimID: 1, Partition: p, At: at(ms), SentAt: at(ms), Generation: gen}
	}
	answered := func(gid string, ms int, ok bool) StrictEvent {
		return StrictEvent{Kind: "answered", GID: gid, ClaimID: 1, Partition: p, At: at(ms + 1), SentAt: at(ms), Accepted: ok}
	}
	rules := func(vs []Violation) string {
		var s []string
		for _, v := range vs {
			s = append(s, v.Rule)
		}
		return strings.Join(s, ",")
	}
	for _, c := range []struct {
		name    string
		events  []StrictEvent
		classic bool
		h       History
		want    string
	}{
		{"accepted before the next assignment", []StrictEvent{sent("x1", 500, 1), answered("x1", 500, true)}, true, History{Log: log}, ""},
		{"sent after the next assignment", []StrictEvent{sent("x1", 1500, 3), answered("x1", 1500, true)}, true, History{Log: log}, "G3-strict"},
		{"sent after its own revocation (classic)", []StrictEvent{{Kind: "ended", ClaimID: 1, Partition: p, At: at(400), Why: "revoked"},
			sent("x1", 500, 2), answered("x1", 500, true)}, true, History{Log: log}, "G3-strict"},
		{"a KIP-848 revocation line is not the coordinator's end", []StrictEvent{{Kind: "ended", ClaimID: 1, Partition: p, At: at(400), Why: "revoked"},
			sent("x1", 500, 2), answered("x1", 500, true)}, false, History{Log: log}, ""},
		{"answer never heard: the first identical send counts", []StrictEvent{sent("x1", 900, 1), sent("x1", 1200, 1)}, true, History{Log: log}, ""},
		{"no offset commit logged", nil, true, History{Log: log}, "G3-strict"},
		{"recorded rolled back but visible", []StrictEvent{sent("x1", 500, 1), answered("x1", 500, true)}, true,
			History{Log: log, StrictDecisions: []fence.StrictDecision{{GID: "x1"}}}, "strict-record"},
		{"accepted, then rolled back", []StrictEvent{sent("x2", 500, 1), answered("x2", 500, true)}, true,
			History{Log: log[:1], StrictDecisions: []fence.StrictDecision{{GID: "x2"}}}, "strict-record"},
		{"left prepared", nil, true, History{Log: log[:1], Prepared: []string{"x3"}}, "strict-END"},
	} {
		t.Run(c.name, func(t *testing.T) {
			vs := CheckStrict(&c.h, asg, c.events, c.classic, false)
			if got := rules(vs); got != c.want {
				t.Errorf("got %q, want %q: %v", got, c.want, vs)
			}
		})
	}
}
