package consumer

// A newly assigned partition fetches first, until its first records come.
//
// kgo fills a fetch response in the order the request names partitions,
// up to the response's limit (a 128th of the worker's buffer: a few
// partitions' shares), and rotates that order by one partition per
// request. A worker that takes over hundreds of partitions while it
// drains hundreds of its own could put a new one behind the old ones for
// many requests, after it had already waited a session timeout for the
// group to hand it over. The order decides nothing about ownership and
// nothing about memory (a partition fetched first still counts against
// the worker's bound, and one paused for it is not in the request at
// all); it only decides who waits. Measured with tenure bench at 1,000
// partitions, four rounds each: the hand-off's part after the claims (its
// longest time to a first commit minus its longest time to a claim) was
// 1.0-1.2 s, against 1.2-1.6 s in kgo's order (docs/throughput.md).

import (
	"slices"
	"sync"
	"sync/atomic"
)

// unfedLanes are the lanes that have not received a record yet, and the
// order kgo's fetch requests put them in (prefer).
type unfedLanes struct {
	mu    sync.Mutex
	lanes map[*lane]struct{}
	// order is what prefer reads, rebuilt on every change: each topic's
	// unfed partitions in ascending order; nil when no lane is unfed
	// (prefer then answers with one load and kgo keeps its order). A
	// partition with no records to fetch stays unfed, at the front, where
	// it takes nothing from the response.
	order atomic.Pointer[map[string][]int32]
}

// add marks l unfed. A lane is keyed by itself, not by its partition, so
// that an old lane of the same partition that leaves late never unmarks
// the new one.
func (f *unfedLanes) add(l *lane) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.lanes == nil {
		f.lanes = map[*lane]struct{}{}
	}
	f.lanes[l] = struct{}{}
	f.publishLocked()
}

func (f *unfedLanes) remove(l *lane) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.lanes[l]; !ok {
		return
	}
	delete(f.lanes, l)
	f.publishLocked()
}

func (f *unfedLanes) publishLocked() {
	if len(f.lanes) == 0 {
		f.order.Store(nil)
		return
	}
	o := map[string][]int32{}
	for l := range f.lanes {
		o[l.key.Topic] = append(o[l.key.Topic], l.key.Partition)
	}
	for _, ps := range o {
		slices.Sort(ps)
	}
	f.order.Store(&o)
}

// prefer is the consumer's kgo.PreferLagFn: the unfed partitions of a
// fetch request go first, the rest after them in kgo's own rotating order.
// kgo drops what the request does not fetch and may change the slices
// returned, so they are copies.
//
// What the option costs is mostly kgo's, not prefer's: once a
// PreferLagFn is set, kgo builds a map of every fetched partition's lag
// and copies the request's partition order before each fetch request,
// whether or not prefer changes it (its adjustPreferringLag). That is
// work per request, not per record: a few hundred map entries for a
// worker with 334 partitions, a few for one with 12. Measured, the
// worker's CPU per job did not rise at either count (docs/throughput.md).
func (f *unfedLanes) prefer(_ map[string]map[int32]int64, topics []string, _ map[string][]int32) ([]string, map[string][]int32) {
	o := f.order.Load()
	if o == nil {
		return nil, nil
	}
	var first []string
	parts := map[string][]int32{}
	for _, t := range topics {
		if ps, ok := (*o)[t]; ok {
			first = append(first, t)
			parts[t] = slices.Clone(ps)
		}
	}
	if len(first) == 0 {
		return nil, nil
	}
	// The topics with unfed partitions, in the request's order, go first;
	// kgo appends the others after them.
	return first, parts
}

// fedLocked ends l's priority: its first records came, or it stopped
// taking any. l.mu is held (lock order: a lane's, then unfedLanes').
func (l *lane) fedLocked() {
	if l.unfed {
		l.unfed = false
		l.c.unfed.remove(l)
	}
}
