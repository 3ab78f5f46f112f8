package consumer

import (
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tenure-dev/tenure/sink"
)

// lagged is dFence's row with its lag and high watermark.
func lagged(a Assignment, hwm, lag int64) Assignment {
	a.HighWatermark, a.Lag = ptr(hwm), ptr(lag)
	return a
}

// liveBundle is TestJudgeLiveness's group at one instant: four members,
// their heartbeats, the fencing rows and the partitions' rows.
type liveBundle struct {
	now     time.Time
	view    groupView
	workers []sink.Worker
	fences  []sink.Fence
}

func newLiveBundle() *liveBundle {
	b := &liveBundle{now: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}
	fence := func(p int32, owner string, committed int) sink.Fence {
		f := dFence("jobs", p, 0, 1, owner, 10)
		f.ClaimedAt = b.ago(3600)
		c := b.ago(committed)
		f.CommittedAt = &c
		return f
	}
	b.view = groupView{protocol: "classic", state: "Stable", members: []memberView{
		dMember("A", 3, map[string][]int32{"jobs": {0, 1, 2, 3, 4, 5, 6}}),
		dMember("B", 3, map[string][]int32{"jobs": {7, 8}}),
		dMember("C", 3, map[string][]int32{"jobs": {9, 10}}),
		dMember("D", 3, map[string][]int32{"jobs": {11}}),
	}}
	b.workers = []sink.Worker{
		{MemberID: "A", ClientID: "tenure-a", Host: "host-a", PID: 7, SeenAt: b.ago(15)}, // dead 15 s ago
		{MemberID: "B", ClientID: "tenure-b", Host: "host-b", PID: 8, SeenAt: b.ago(1)},  // alive
		{MemberID: "D", ClientID: "tenure-d", Host: "host-d", PID: 9, SeenAt: b.ago(30)}, // silent, yet committing
		// C has no heartbeat row (a worker without heartbeats)
	}
	b.fences = []sink.Fence{
		fence(0, "A", 16), fence(1, "A", 3600),
		fence(7, "B", 30), fence(8, "B", 3600),
		fence(9, "C", 15), fence(10, "C", 3600),
		fence(11, "D", 1),
		fence(12, "A", 40), // nobody is assigned 12
		fence(13, "A", 50), // assigned to B, not claimed yet (hand-off between live members)
		fence(14, "B", 50), // assigned to A (silent), not claimed yet
	}
	return b
}

func (b *liveBundle) ago(s int) time.Time { return b.now.Add(-time.Duration(s) * time.Second) }

func (b *liveBundle) facts() facts { return newFacts(b.now, b.view, b.workers, b.fences) }

// owned is partition p's row, owned by member m.
func owned(p int32, m string) Assignment {
	return Assignment{Topic: "jobs", Partition: p, MemberID: m, FenceOwner: m, State: StateOK}
}

// rows are the partitions' rows before judge, fresh for each use.
func (b *liveBundle) rows() []Assignment {
	return []Assignment{
		lagged(owned(0, "A"), 15, 5), // silent owner, jobs waiting
		lagged(owned(1, "A"), 10, 0), // silent owner, nothing waiting
		lagged(owned(7, "B"), 13, 3), // alive, no commit for 30 s, oldest 25 s: not progressing
		lagged(owned(8, "B"), 11, 1), // alive, idle for an hour, the job arrived 2 s ago: ok
		lagged(owned(9, "C"), 12, 2), // no heartbeat row, no commit for 15 s, jobs waiting: silent
		lagged(owned(10, "C"), 10, 0),
		lagged(owned(11, "D"), 14, 4), // heartbeat stale, but it committed 1 s ago: not silent
		lagged(Assignment{Topic: "jobs", Partition: 12, FenceOwner: "A", State: StateUnowned}, 18, 8),
		lagged(Assignment{Topic: "jobs", Partition: 13, MemberID: "B", FenceOwner: "A", State: StateClaimPending}, 12, 2),
		lagged(Assignment{Topic: "jobs", Partition: 14, MemberID: "A", FenceOwner: "B", State: StateClaimPending}, 12, 2),
	}
}

// judged is the bundle's facts, with the oldest waiting jobs that reading
// the suspects' logs found.
func (b *liveBundle) judged() facts {
	f := b.facts()
	f.waiting = map[tp]waitingJob{
		{"jobs", 7}: {at: b.ago(25)}, {"jobs", 8}: {at: b.ago(2)}, {"jobs", 12}: {at: b.ago(20)}, {"jobs", 13}: {at: b.ago(5)},
	}
	return f
}

// The liveness rules on their own: who is silent, what is not
// progressing, and what is ok although it looks idle.
func TestJudgeLiveness(t *testing.T) {
	b := newLiveBundle()
	t.Run("suspects", func(t *testing.T) {
		sus := b.facts().suspects(b.rows())
		for _, p := range []int32{7, 8, 12, 13, 14} {
			if _, ok := sus[tp{"jobs", p}]; !ok {
				t.Errorf("partition %d should be read from the log: %v", p, sus)
			}
		}
		for _, p := range []int32{1, 9, 10, 11} { // nothing waiting, or a commit within stuckAfter
			if _, ok := sus[tp{"jobs", p}]; ok {
				t.Errorf("partition %d needs no read: %v", p, sus)
			}
		}
		if sus[tp{"jobs", 7}] != 10 {
			t.Errorf("partition 7 is read at its next offset: %v", sus)
		}
	})
	t.Run("states", func(t *testing.T) { testJudgedStates(t, b) })

	// Mid-rebalance, the partition's last commit says nothing about when
	// the rebalance began: no since (the group watch counts from when it
	// first saw it).
	t.Run("rebalancing", func(t *testing.T) {
		reb := []Assignment{lagged(Assignment{Topic: "jobs", Partition: 7, FenceOwner: "B", State: StateRebalancing}, 13, 3)}
		b.judged().judge(reb)
		if reb[0].State != StateRebalancing || reb[0].Since != nil {
			t.Errorf("rebalancing: %+v", reb[0])
		}
	})

	// The oldest job's age decides: unknown counts as old; none waiting
	// for the lane (a transaction marker, an open transaction) is ok.
	t.Run("oldest job", func(t *testing.T) {
		for _, c := range []struct {
			w    waitingJob
			want State
		}{
			{waitingJob{}, StateNotProgressing},
			{waitingJob{none: true}, StateOK},
			{waitingJob{at: b.ago(19)}, StateOK},
			{waitingJob{at: b.ago(21)}, StateNotProgressing},
		} {
			rows := []Assignment{lagged(owned(7, "B"), 13, 3)}
			f := b.facts()
			f.waiting = map[tp]waitingJob{{"jobs", 7}: c.w}
			f.judge(rows)
			if rows[0].State != c.want {
				t.Errorf("oldest job %+v: %q, want %q (%s)", c.w, rows[0].State, c.want, rows[0].Reason)
			}
		}
	})

	// Why a partition is unowned: no members, or none consumes the topic.
	t.Run("unowned", func(t *testing.T) {
		for _, c := range []struct {
			view groupView
			want string
		}{
			{groupView{}, "the group has no members"},
			{groupView{members: []memberView{{id: "Z", subscribed: []string{"other"}, assigned: map[string][]int32{}}}}, "no member of the group consumes topic jobs"},
		} {
			rows := []Assignment{lagged(Assignment{Topic: "jobs", Partition: 3, State: StateUnowned}, 4, 4)}
			f := newFacts(b.now, c.view, nil, nil)
			f.waiting = map[tp]waitingJob{{"jobs", 3}: {at: b.ago(100)}}
			f.judge(rows)
			if !strings.Contains(rows[0].Reason, c.want) || !strings.Contains(rows[0].Reason, "4 jobs waiting, the oldest for 100 s") {
				t.Errorf("unowned: %q lacks %q", rows[0].Reason, c.want)
			}
			since := b.ago(100)
			if rows[0].Since == nil || !rows[0].Since.Equal(since) {
				t.Errorf("never claimed: since the oldest job, %v; got %v", since, rows[0].Since)
			}
		}
	})
}

// testJudgedStates checks each of the bundle's rows after judge: its state,
// its reason and since when.
func testJudgedStates(t *testing.T, b *liveBundle) {
	rows := b.rows()
	b.judged().judge(rows)
	byP := dByPartition(rows)
	state := func(p int32, want State, reason ...string) Assignment {
		t.Helper()
		r := byP[p]
		if r.State != want {
			t.Errorf("partition %d: %q, want %q (%s)", p, r.State, want, r.Reason)
		}
		for _, w := range reason {
			if !strings.Contains(r.Reason, w) {
				t.Errorf("partition %d: reason %q lacks %q", p, r.Reason, w)
			}
		}
		return r
	}
	since := func(p int32, at time.Time) {
		t.Helper()
		r := byP[p]
		if r.Since == nil || !r.Since.Equal(at) || r.ForSeconds == nil || *r.ForSeconds != int64(b.now.Sub(at)/time.Second) {
			t.Errorf("partition %d: since %v for %v, want %v", p, r.Since, r.ForSeconds, at)
		}
	}
	state(0, StateOwnerSilent, "owner A silent for 15 s (no heartbeat for 15 s, no commit for 16 s; it was client tenure-a on host host-a, pid 7)",
		"5 jobs waiting", "the coordinator moves the partition when the member's session times out")
	since(0, b.ago(15))
	state(1, StateOwnerSilent, "no jobs waiting")
	state(7, StateNotProgressing, "no commit for 30 s with 3 jobs waiting, the oldest for 25 s; owner B is alive (heartbeat 1 s ago")
	since(7, b.ago(25))
	if r := state(8, StateOK); r.Since != nil || r.Reason != "" {
		t.Errorf("an ok partition has no since and no reason: %+v", r)
	}
	state(9, StateOwnerSilent, "owner C silent for 15 s (no heartbeat recorded, no commit or claim); 2 jobs waiting")
	since(9, b.ago(15))
	state(10, StateOK) // no heartbeat row and nothing waiting: nothing to say
	state(11, StateOK)
	state(12, StateUnowned, "no member of the group is assigned the partition; 8 jobs waiting, the oldest for 20 s",
		"the members consume the topic, but the coordinator has not assigned this partition")
	since(12, b.ago(20)) // the oldest job came after the last commit
	if r := state(13, StateClaimPending); r.Reason != "" {
		t.Errorf("claim-pending has no reason: %q", r.Reason)
	}
	since(13, b.ago(5))
	state(14, StateOwnerSilent, "member A, assigned the partition and yet to claim it, silent for 15 s")
}

// A stall recorded by an owner that has gone silent does not hide that it
// is silent; a hold that waits for an operator does; every hold says since
// when.
func TestHoldsOverLiveness(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	hold := func(p int32, kind sink.HoldKind) sink.Hold {
		return sink.Hold{Partition: sink.Partition{Group: "g", Topic: "jobs", Partition: p}, Kind: kind, Reason: string(kind) + " because",
			Since: now.Add(-42 * time.Second)}
	}
	rows := []Assignment{
		{Topic: "jobs", Partition: 0, State: StateOwnerSilent, Reason: "silent"},
		{Topic: "jobs", Partition: 1, State: StateOwnerSilent, Reason: "silent"},
		{Topic: "jobs", Partition: 2, State: StateOK},
	}
	applyHolds(rows, []sink.Hold{hold(0, sink.HoldStalled), hold(1, sink.HoldHandlerBug), hold(2, sink.HoldStalled)}, now)
	if rows[0].State != StateOwnerSilent || rows[0].Reason != "silent" {
		t.Errorf("a silent owner's stall: %+v", rows[0])
	}
	if rows[1].State != StateHandlerBug || *rows[1].ForSeconds != 42 {
		t.Errorf("a handler bug of a silent owner: %+v", rows[1])
	}
	if rows[2].State != StateStalled || rows[2].Since == nil || *rows[2].ForSeconds != 42 {
		t.Errorf("a stall: %+v", rows[2])
	}
}

func TestSecondsWording(t *testing.T) {
	for d, want := range map[time.Duration]string{
		-time.Second: "0 s", 0: "0 s", 14500 * time.Millisecond: "14 s", 119 * time.Second: "119 s", 2 * time.Minute: "2 min",
		90 * time.Minute: "90 min", 3 * time.Hour: "3 h", 50 * time.Hour: "2 days",
	} {
		if got := seconds(d); got != want {
			t.Errorf("seconds(%v) = %q, want %q", d, got, want)
		}
	}
}

// coveredEnd reads the offsets the whole batches of a fetch response
// cover, and stops at a batch the response cut short.
func TestCoveredEnd(t *testing.T) {
	batch := func(base int64, n int32) []byte {
		b := kmsg.RecordBatch{FirstOffset: base, Magic: 2, LastOffsetDelta: n - 1, NumRecords: n, Records: make([]byte, 20)}
		raw := b.AppendTo(nil)
		// AppendTo does not compute Length: the bytes after the length field.
		b.Length = int32(len(raw) - 12)
		return b.AppendTo(nil)
	}
	two := append(batch(5, 3), batch(8, 1)...) // offsets 5..7, then a marker at 8
	if got := coveredEnd(two); got != 9 {
		t.Errorf("two batches: %d, want 9", got)
	}
	if got := coveredEnd(two[:len(two)-4]); got != 8 {
		t.Errorf("the second cut short: %d, want 8", got)
	}
	if got := coveredEnd(nil); got != -1 {
		t.Errorf("nothing: %d", got)
	}
}
