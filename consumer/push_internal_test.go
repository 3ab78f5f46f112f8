package consumer

import (
	"runtime"
	"testing"
	"weak"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/tenure-dev/tenure/sink"
)

// testLane is a lane whose fetch position is at, with a client that
// connects nowhere (pausing and resuming only touch its state).
func testLane(t *testing.T, at int64) *lane {
	t.Helper()
	return testConsumer(t).testLane("t", 0, at)
}

// testConsumer is a consumer for lanes made by hand, with a client that
// connects nowhere.
func testConsumer(t *testing.T) *Consumer {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	c := &Consumer{cfg: Config{PartitionBufferBytes: 1 << 20, WorkerBufferBytes: 1 << 30, BatchMax: 100}, lanes: map[tp]*lane{}, log: zap.NewNop()}
	c.cl.Store(cl)
	c.claimBase = 1
	return c
}

// testLane is a lane of c for topic's partition p, its fetch position at.
func (c *Consumer) testLane(topic string, p int32, at int64) *lane {
	l := newLane(c, c.cl.Load(), sink.Partition{Group: "g", Topic: topic, Partition: p}, "m", 1, 1, zap.NewNop())
	l.fetchPos, l.next = at, at
	return l
}

func recs(offsets ...int64) []*kgo.Record {
	out := make([]*kgo.Record, len(offsets))
	for i, o := range offsets {
		out[i] = &kgo.Record{Topic: "t", Offset: o}
	}
	return out
}

// What the poll loop hands a lane must continue from its fetch position;
// anything else is the log moving under it, and the lane takes nothing more
// until it has checked the log.
func TestPushChecksThatRecordsContinueTheFetchPosition(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name         string
		first        []*kgo.Record
		logStart     int64
		then         []*kgo.Record
		thenStart    int64
		moved        bool
		evidence     int64
		queued       int
		wantFetchPos int64
	}{
		{name: "contiguous", first: recs(10, 11), then: recs(12), queued: 3, wantFetchPos: 13, evidence: -1},
		{name: "a gap the broker served: transaction markers, aborted or compacted records", first: recs(10, 11), then: recs(14, 15),
			thenStart: 0, queued: 4, wantFetchPos: 16, evidence: -1},
		{name: "the log's start passed the position: records deleted before they were fetched", first: recs(10, 11), then: recs(30, 31),
			thenStart: 30, moved: true, queued: 2, wantFetchPos: 12, evidence: -1},
		{name: "records below the position: the log went back below it", first: recs(10, 11), then: recs(5, 6),
			moved: true, queued: 2, wantFetchPos: 12, evidence: 5},
		{name: "the first fetch after the claim already starts elsewhere", first: recs(40), logStart: 40, moved: true, queued: 0, wantFetchPos: 10, evidence: -1},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			l := testLane(t, 10)
			l.push(c.first, c.logStart)
			if c.then != nil {
				l.push(c.then, c.thenStart)
			}
			l.push(recs(99), 0) // ignored once the log moved
			l.mu.Lock()
			defer l.mu.Unlock()
			if c.moved {
				if !l.logMoved || l.logEvidence != c.evidence || !l.paused {
					t.Errorf("logMoved %v evidence %d paused %v, want true %d true", l.logMoved, l.logEvidence, l.paused, c.evidence)
				}
				if len(l.queue) != c.queued || l.fetchPos != c.wantFetchPos {
					t.Errorf("queued %d fetchPos %d, want %d %d", len(l.queue), l.fetchPos, c.queued, c.wantFetchPos)
				}
				return
			}
			if l.logMoved || len(l.queue) != c.queued+1 || l.fetchPos != 100 {
				t.Errorf("logMoved %v queued %d fetchPos %d, want false %d 100", l.logMoved, len(l.queue), l.fetchPos, c.queued+1)
			}
		})
	}
}

// A fetch that fails because the log moved: the broker's high watermark, or
// the offset kgo's data-loss check moved to, is the evidence of where the
// log ended below the lane.
func TestFetchFailedRecordsWhereTheLogEnded(t *testing.T) {
	t.Parallel()
	l := testLane(t, 20)
	l.fetchFailed(kgo.FetchPartition{Err: kerr.OffsetOutOfRange, LogStartOffset: 0, HighWatermark: 12})
	if !l.logMovedPending() || l.logEvidence != 12 {
		t.Fatalf("out of range below the high watermark: moved %v evidence %d", l.logMoved, l.logEvidence)
	}
	l.fetchFailed(kgo.FetchPartition{Err: &kgo.ErrDataLoss{Topic: "t", ConsumedTo: 20, ResetTo: 9}})
	if l.logEvidence != 9 {
		t.Fatalf("data loss: evidence %d, want 9 (the lowest seen)", l.logEvidence)
	}
	l = testLane(t, 20)
	l.fetchFailed(kgo.FetchPartition{Err: kerr.OffsetOutOfRange, LogStartOffset: 30, HighWatermark: 50})
	if !l.logMovedPending() || l.logEvidence != -1 {
		t.Fatalf("out of range below the log start: moved %v evidence %d", l.logMoved, l.logEvidence)
	}
}

// The lane judges its next offset against the log read again, with what it
// saw: a log that went back below it (the reverse of a truncation) holds the
// partition as ahead-of-log even if it has grown past the next offset again,
// because new jobs were appended at offsets the lane had already processed.
func TestMovedLogHold(t *testing.T) {
	t.Parallel()
	key := sink.Partition{Group: "g", Topic: "t", Partition: 0}
	log := func(start, end int64) *topicLog {
		return &topicLog{partitions: 1, start: map[int32]int64{0: start}, end: map[int32]int64{0: end}}
	}
	for _, c := range []struct {
		name     string
		next     int64
		tl       *topicLog
		evidence int64
		kind     sink.HoldKind // "" for none
		hwm      int64
	}{
		{"the log still fits", 16, log(0, 30), -1, "", 0},
		{"the log's start passed the next offset", 16, log(20, 30), -1, sink.HoldLogTruncated, 30},
		{"the log ends below the next offset", 16, log(0, 12), -1, sink.HoldAheadOfLog, 12},
		{"the log went back to 5 and has grown past the next offset again", 16, log(0, 30), 5, sink.HoldAheadOfLog, 5},
		{"evidence at the next offset: nothing was lost", 16, log(0, 30), 16, "", 0},
	} {
		h := movedLogHold(key, "m", c.next, [16]byte{}, c.tl, c.evidence)
		switch {
		case c.kind == "" && h != nil:
			t.Errorf("%s: hold %+v, want none", c.name, h)
		case c.kind != "" && (h == nil || h.Kind != c.kind || h.HighWatermark != c.hwm || h.NextOffset != c.next):
			t.Errorf("%s: hold %+v, want %s with high watermark %d", c.name, h, c.kind, c.hwm)
		}
	}
	if tl := log(0, 30); movedLogHold(key, "m", 16, [16]byte{}, tl, 5) != nil && tl.end[0] != 30 {
		t.Error("movedLogHold changed the log it was given")
	}
}

// Every way a lane resumes its partition waits while the worker's buffers
// are full: a claim's seek that resumed regardless let each partition
// claimed meanwhile bring a fetch more past the worker's bound (seen at
// 1,000 partitions, where claims run while the first polls fill the
// worker). Once the lanes drain below half, resumeDrained resumes them.
func TestResumeWaitsWhileTheWorkerIsFull(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		resume func(l *lane)
	}{
		{"a claim's seek", func(l *lane) {
			l.seek(10)
			l.applySeek(l.cl)
		}},
		{"an acknowledged partition count", func(l *lane) { l.resumeFetch() }},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			l := testLane(t, 10)
			l.c.cfg.WorkerBufferBytes = 1000
			l.c.lanes[tp{"t", 0}] = l
			l.pauseFetch()
			l.c.buffered.Store(1000) // other lanes' batches fill the worker
			c.resume(l)
			if !pausedInKgo(l) || !l.pausedForWorker {
				t.Fatalf("resumed with the worker full (paused in kgo %v, for the worker %v): the partition brings a fetch more past the bound",
					pausedInKgo(l), l.pausedForWorker)
			}
			l.c.buffered.Store(499)
			l.c.resumeDrained()
			if pausedInKgo(l) || l.paused || l.pausedForWorker {
				t.Fatalf("still paused (kgo %v, lane %v, for the worker %v) once the worker drained below half", pausedInKgo(l), l.paused, l.pausedForWorker)
			}
		})
	}
}

func pausedInKgo(l *lane) bool {
	return len(l.cl.PauseFetchPartitions(nil)[l.key.Topic]) == 1
}

// A record handed out in a batch, or skipped because it was committed
// already, must not stay reachable through the buffer once the batch is
// done: the buffer's array outlives both (push appends to what is left of
// it), and a slot in front of the slice still keeps its record alive. With
// hundreds of lanes that was a third more memory than the worker's budget
// counts.
func TestTakenRecordsAreNotKeptByTheBuffer(t *testing.T) {
	t.Parallel()
	l := testLane(t, 0)
	l.c.cfg.BatchMaxBytes = 1 << 20
	// weakRecs pushes records at offsets [from, to) and returns weak
	// pointers to them; the test keeps no other reference.
	weakRecs := func(from, to int64) []weak.Pointer[kgo.Record] {
		rs := make([]*kgo.Record, 0, to-from)
		ws := make([]weak.Pointer[kgo.Record], 0, to-from)
		for o := from; o < to; o++ {
			r := &kgo.Record{Topic: "t", Offset: o, Value: make([]byte, 64)}
			rs = append(rs, r)
			ws = append(ws, weak.Make(r))
		}
		l.push(rs, 0)
		return ws
	}
	kept := func(ws []weak.Pointer[kgo.Record]) int {
		runtime.GC()
		n := 0
		for _, w := range ws {
			if w.Value() != nil {
				n++
			}
		}
		return n
	}

	taken := weakRecs(0, 100)
	rest := weakRecs(100, 350)
	b := l.take() // BatchMax 100: offsets [0, 100), 250 stay buffered
	if b == nil || b.From != 0 || b.To != 100 {
		t.Fatalf("took %+v, want offsets [0, 100)", b)
	}
	b = nil
	l.batchDone()
	if n := kept(taken); n != 0 {
		t.Errorf("%d of the 100 records of a done batch are still reachable", n)
	}

	// A requeued batch committed meanwhile: take skips what is below next
	// and hands out [160, 260), and 90 records stay in the array.
	l.mu.Lock()
	l.next = 160
	l.mu.Unlock()
	if b := l.take(); b == nil || b.From != 160 || b.To != 260 {
		t.Fatalf("took %+v, want offsets [160, 260)", b)
	}
	if n := kept(rest[:60]); n != 0 {
		t.Errorf("%d of the 60 skipped records are still reachable", n)
	}
	runtime.KeepAlive(l)
}
