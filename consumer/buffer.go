package consumer

// A lane's buffer: the records the poll loop hands it (push), checked to
// continue the partition's fetch position, and the batches the lane takes
// from them (take). Fetching the partition pauses when the buffer is full,
// or the worker's buffers as a whole are, and resumes below half.
//
// The worker's budget (Config.WorkerBufferBytes, Consumer.buffered) counts
// a record from the poll that hands it to a lane until the lane is done
// with its batch (batchDone), not only while it waits in the buffer: with
// hundreds of lanes and a few dozen connections, most taken batches wait
// for a transaction slot, and a budget that forgot them let every lane
// refill behind its waiting batch (at 1,000 partitions that was most of a
// worker's memory).

import (
	"errors"
	"fmt"
	"time"
	"unsafe"

	"github.com/twmb/franz-go/pkg/kgo"
)

func (l *lane) pauseFetch() {
	l.mu.Lock()
	l.pauseLocked()
	l.mu.Unlock()
}

// full reports whether the lane's buffer has reached its bounds
// (Config.PartitionBufferBytes, and a record count that keeps the buffer's
// slice in proportion): fetching the partition pauses there, and resumes
// below half (drained), so that a resumed partition still has work
// buffered while its next fetch is on the way.
func (l *lane) full() bool {
	return l.queueBytes >= l.c.cfg.PartitionBufferBytes || len(l.queue) >= 4*l.c.cfg.BatchMax
}

func (l *lane) drained() bool {
	return l.queueBytes < l.c.cfg.PartitionBufferBytes/2 && len(l.queue) < 2*l.c.cfg.BatchMax
}

// recordOverhead is what a record costs beside its key, value and
// headers: kgo's Record (160 bytes on 64-bit platforms) and the buffer's pointer to it.
const recordOverhead = int64(unsafe.Sizeof(kgo.Record{}) + unsafe.Sizeof(&kgo.Record{}))

// recordSize is what a buffered record costs: its key, value and headers,
// and the record itself.
func recordSize(r *kgo.Record) int64 {
	n := int64(len(r.Key)+len(r.Value)) + recordOverhead
	for _, h := range r.Headers {
		n += int64(len(h.Key) + len(h.Value) + 32)
	}
	return n
}

// setQueueLocked replaces the buffer, keeping the lane's and the worker's
// byte counts right.
func (l *lane) setQueueLocked(q []*kgo.Record, bytes int64) {
	if d := bytes - l.queueBytes; d > 0 {
		l.c.noteBuffered(l.c.buffered.Add(d))
	} else {
		l.c.buffered.Add(d)
	}
	l.queue, l.queueBytes = q, bytes
}

// noteBuffered raises the high-water mark of the lanes' holdings
// (Stats.BufferedBytesPeak) to n.
func (c *Consumer) noteBuffered(n int64) {
	for {
		peak := c.bufferedPeak.Load()
		if n <= peak || c.bufferedPeak.CompareAndSwap(peak, n) {
			return
		}
	}
}

func (l *lane) pauseLocked() {
	if !l.paused && !l.removed {
		l.cl.PauseFetchPartitions(map[string][]int32{l.key.Topic: {l.key.Partition}})
		l.paused = true
	}
}

// push appends the records of one fetch of the partition; logStart is the
// log's start as that fetch reported it (-1: not reported).
//
// The broker serves a fetch from the position kgo asks for, so the records
// must continue from the lane's fetch position. Records below it mean kgo
// moved the position down without the lane (its data-loss reset does: the
// log went back below the lane). A gap above it is a log's ordinary shape
// (transaction markers, aborted or compacted records) only while the log
// still starts at or below the position; a log that starts above it lost
// records before they were fetched. Either way nothing more is taken from
// the partition until the lane has checked the log (checkLogMoved): a job
// is never skipped, nor one at a reused offset dropped, in silence.
func (l *lane) push(recs []*kgo.Record, logStart int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended || l.logMoved {
		return
	}
	switch first := recs[0].Offset; {
	case first < l.fetchPos:
		l.logMovedLocked(first, fmt.Sprintf("records from offset %d arrived while the fetch position was %d: the log went back below it", first, l.fetchPos))
		return
	case first > l.fetchPos && logStart > l.fetchPos:
		l.logMovedLocked(-1, fmt.Sprintf("the log starts at %d, above the fetch position %d: records were deleted before they were fetched", logStart, l.fetchPos))
		return
	}
	l.fetchPos = recs[len(recs)-1].Offset + 1
	l.fedLocked()
	var n int64
	for _, r := range recs {
		n += recordSize(r)
	}
	l.setQueueLocked(append(l.queue, recs...), l.queueBytes+n)
	if l.full() {
		l.pauseLocked()
	} else if l.c.buffered.Load() >= l.c.cfg.WorkerBufferBytes {
		// The worker as a whole holds enough: this partition waits until
		// the lanes have drained half of it (Consumer.resumeDrained).
		l.pauseForWorkerLocked()
	}
	l.wakeUp()
}

// pauseForWorkerLocked pauses the partition until the worker's buffers
// have drained (Consumer.resumeDrained), and tells resumeDrained to look.
// The flag is raised after the field, under the lane's lock, so that a
// sweep that cleared it before this lane was paused still meets the lane.
func (l *lane) pauseForWorkerLocked() {
	l.pauseLocked()
	l.pausedForWorker = true
	l.c.forWorker.Store(true)
}

// holdFetches pauses the fetching of every partition of this worker once
// the lanes together hold Config.WorkerBufferBytes, after a poll's records
// were handed out. Pausing only the partitions that received records let
// each of the others bring one fetch's worth more (a partition's share of
// the next fetches), so the worker's memory grew with its partition count;
// with every partition paused, the next fetch asks for nothing and the
// lanes hold at most the budget plus the poll that crossed it.
//
// The lanes are paused in one call to kgo (a pause copies kgo's whole set
// of paused partitions) while holding every one of their locks: a lane
// marked paused must be paused in kgo before it can look at the mark
// (take resumes a drained lane it finds paused). Nothing else holds two
// lane locks, so taking them all here cannot deadlock.
func (c *Consumer) holdFetches() {
	if c.buffered.Load() < c.cfg.WorkerBufferBytes {
		return
	}
	lanes := c.snapshotLanes()
	held := lanes[:0]
	pause := map[*kgo.Client]map[string][]int32{}
	for _, l := range lanes {
		l.mu.Lock()
		if l.paused || l.ended || l.removed {
			l.mu.Unlock()
			continue
		}
		held = append(held, l)
		m := pause[l.cl]
		if m == nil {
			m = map[string][]int32{}
			pause[l.cl] = m
		}
		m[l.key.Topic] = append(m[l.key.Topic], l.key.Partition)
	}
	for cl, m := range pause {
		cl.PauseFetchPartitions(m)
	}
	for _, l := range held {
		l.paused, l.pausedForWorker = true, true
		c.forWorker.Store(true)
		l.mu.Unlock()
	}
}

func (l *lane) wakeUp() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// fetchFailed is told of a fetch of the partition that failed with
// OFFSET_OUT_OF_RANGE or a data loss kgo detected (fp: that fetch's
// partition, with the log's start and end as the broker reported them).
// kgo does not move the position past a log that changed (the consumer
// runs with kgo.NoResetOffset), and says so here instead: the lane checks
// the log once it has committed what it had fetched before.
func (l *lane) fetchFailed(fp kgo.FetchPartition) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return
	}
	evidence := int64(-1)
	var dl *kgo.ErrDataLoss
	switch {
	case errors.As(fp.Err, &dl):
		evidence = dl.ResetTo
	case fp.HighWatermark >= 0 && fp.HighWatermark < l.fetchPos:
		evidence = fp.HighWatermark
	}
	l.logMovedLocked(evidence, fmt.Sprintf("fetching from offset %d failed: %v (log start %d, high watermark %d)",
		l.fetchPos, fp.Err, fp.LogStartOffset, fp.HighWatermark))
}

// logMovedLocked stops the lane's intake after the log moved under it:
// fetching pauses, what is buffered (records that do continue the
// lane's position) is still processed, and then the lane checks the log.
// evidence is an offset the log was seen to end at below the lane, or -1.
func (l *lane) logMovedLocked(evidence int64, why string) {
	if !l.logMoved {
		l.logWhy = why
	}
	l.logMoved = true
	if evidence >= 0 && (l.logEvidence < 0 || evidence < l.logEvidence) {
		l.logEvidence = evidence
	}
	l.pauseLocked()
	l.wakeUp()
}

// logMovedPending reports whether the lane must check the log before it
// takes anything more.
func (l *lane) logMovedPending() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.logMoved
}

// end stops accepting records, drops the buffer and pauses the partition so
// that nothing more is fetched for it on this member.
func (l *lane) end() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ended = true
	l.fedLocked()
	l.setQueueLocked(nil, 0)
	l.pauseLocked()
}

// release is called when the lane leaves the consumer's map (revoke, loss,
// shutdown, or a new claim of the same partition). It undoes the lane's
// pause, since kgo keeps partitions paused across rebalances and a later
// assignment must fetch again, and stops the lane from touching the
// partition's fetch state from then on. A fenced lane stays in the map, and
// its partition paused, until then.
func (l *lane) release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ended = true
	l.fedLocked()
	l.setQueueLocked(nil, 0)
	if l.paused && !l.removed {
		l.cl.ResumeFetchPartitions(map[string][]int32{l.key.Topic: {l.key.Partition}})
	}
	l.paused = false
	l.removed = true
}

// take waits for records and returns the next batch, or nil when the lane
// must stop.
func (l *lane) take() *Batch {
	lingered := false
	var lingerUntil time.Time
	for {
		if l.stopping() || l.layoutHold.Load() != 0 || l.rowMoved.Load() {
			return nil
		}
		l.mu.Lock()
		if l.logMoved && len(l.queue) == 0 {
			// Everything fetched before the log moved is committed: the
			// lane checks the log now (run, checkLogMoved).
			l.mu.Unlock()
			return nil
		}
		// Records below the next offset were committed already (a batch
		// requeued after part of it committed).
		i := 0
		var skipped int64
		for i < len(l.queue) && l.queue[i].Offset < l.next {
			skipped += recordSize(l.queue[i])
			i++
		}
		if i > 0 {
			clear(l.queue[:i]) // see below: the array must not keep them
			l.setQueueLocked(l.queue[i:], l.queueBytes-skipped)
		}
		// A batch closes on BatchMax records or BatchMaxBytes bytes (one
		// record at least), or, when fewer are buffered, once BatchLinger
		// has passed since the lane started waiting for them.
		n, size := 0, int64(0)
		for n < len(l.queue) && n < l.c.cfg.BatchMax {
			rs := recordSize(l.queue[n])
			if n > 0 && size+rs > l.c.cfg.BatchMaxBytes {
				break
			}
			size += rs
			n++
		}
		full := n == l.c.cfg.BatchMax || (n < len(l.queue))
		if n > 0 && (full || lingered || l.c.cfg.BatchLinger <= 0) {
			recs := make([]*kgo.Record, n)
			copy(recs, l.queue[:n])
			// The buffer's array outlives this batch (push appends to
			// what is left of it), and the collector keeps every record
			// any of its slots points to, in front of the slice or not.
			// Without the clear each lane kept records it had handed out
			// alive until its array was replaced: at 1,000 partitions a
			// worker's heap held half again the records its budget
			// counted (docs/operations.md, "Memory").
			clear(l.queue[:n])
			rest := l.queue[n:]
			if len(rest) == 0 {
				rest = nil // let the backing array go
			}
			// The batch leaves the buffer but not the worker's count: its
			// records live until it is committed (batchDone).
			l.queue, l.queueBytes = rest, l.queueBytes-size
			l.taken += size
			if l.drained() {
				l.resumeLocked()
			}
			l.mu.Unlock()
			return l.batch(recs, l.next)
		}
		l.mu.Unlock()
		var linger <-chan time.Time
		var t *time.Timer
		if n > 0 {
			if lingerUntil.IsZero() {
				lingerUntil = time.Now().Add(l.c.cfg.BatchLinger)
			}
			t = time.NewTimer(time.Until(lingerUntil))
			linger = t.C
		}
		select {
		case <-l.wake:
		case <-linger:
			lingered = true
		case <-l.quit:
			if t != nil {
				t.Stop()
			}
			return nil
		}
		if t != nil {
			t.Stop()
		}
	}
}

// batchDone gives the worker's budget back what the batch taken last
// held, once the lane is done with it (committed, fenced, abandoned or
// requeued: requeue counts what it puts back), and resumes the partitions
// that waited for it.
func (l *lane) batchDone() {
	l.mu.Lock()
	n := l.taken
	l.taken = 0
	l.mu.Unlock()
	if n != 0 {
		l.c.buffered.Add(-n)
		l.c.resumeDrained()
	}
}

func (l *lane) batch(recs []*kgo.Record, from int64) *Batch {
	return &Batch{
		Group: l.key.Group, Topic: l.key.Topic, Partition: l.key.Partition,
		Token: l.token, Owner: l.owner,
		From: from, To: recs[len(recs)-1].Offset + 1, Records: recs,
	}
}

// requeue puts records taken for a batch back at the front of the buffer
// and pauses fetching; take drops what was committed meanwhile.
func (l *lane) requeue(recs []*kgo.Record) {
	var n int64
	for _, r := range recs {
		n += recordSize(r)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return
	}
	l.setQueueLocked(append(append(make([]*kgo.Record, 0, len(recs)+len(l.queue)), recs...), l.queue...), l.queueBytes+n)
	l.pauseLocked()
}

// heldForWorker reports whether the worker's buffers as a whole are still
// too full for a partition paused for that reason to resume.
func (l *lane) heldForWorker() bool {
	return l.pausedForWorker && l.c.buffered.Load() >= l.c.cfg.WorkerBufferBytes/2
}

func (l *lane) resumeFetch() {
	l.mu.Lock()
	l.resumeLocked()
	l.mu.Unlock()
}

// resumeLocked resumes fetching the partition, unless the worker's buffers
// are too full: then the lane waits for resumeDrained like a lane paused
// for the worker. Every way a lane resumes goes through here (a drained
// buffer, a claim's or recovery's seek, an acknowledged partition count),
// because each resumed partition brings a fetch more: a claim's seek that
// resumed regardless let the partitions claimed while the worker was full
// take it past its bound, one poll after another, at 1,000 partitions.
func (l *lane) resumeLocked() {
	if !l.paused || l.ended || l.removed {
		return
	}
	if l.heldForWorker() || l.c.buffered.Load() >= l.c.cfg.WorkerBufferBytes {
		l.pausedForWorker = true
		l.c.forWorker.Store(true)
		return
	}
	l.cl.ResumeFetchPartitions(map[string][]int32{l.key.Topic: {l.key.Partition}})
	l.paused, l.pausedForWorker = false, false
}
