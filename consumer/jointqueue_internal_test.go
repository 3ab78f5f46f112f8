package consumer

import (
	"slices"
	"sync"
	"testing"
)

// The joint queue: first come, first served, except that a lane's first
// batch since its claim goes ahead of the batches of lanes that have
// committed since theirs (behind the other such batches), and a batch
// taken out of the queue before it ran leaves the order of the rest.
func TestJointQueueFreshLanesFirst(t *testing.T) {
	c := &Consumer{cfg: Config{CommitTransactions: 1}}
	c.txSlots = sync.OnceValue(func() chan struct{} { return make(chan struct{}, 4) })
	// runners at the limit: take starts none of its own.
	j := &jointCommitter{c: c, span: 64, runners: 1}
	named := map[*jointEntry]string{}
	add := func(name string, fresh bool) *jointEntry {
		e := &jointEntry{}
		named[e] = name
		j.enqueue(e, fresh)
		return e
	}
	order := func(es []*jointEntry) []string {
		var out []string
		for _, e := range es {
			out = append(out, named[e])
		}
		return out
	}
	add("a", false)
	add("b", false)
	add("new1", true)
	add("c", false)
	gone := add("new2", true)
	add("new3", true)
	j.dequeue(gone)
	add("d", false)
	add("new4", true)
	if got, want := order(j.take()), []string{"new1", "new3", "new4", "a", "b", "c", "d"}; !slices.Equal(got, want) {
		t.Errorf("taken in the order %q, want %q", got, want)
	}
	if j.fresh != 0 || len(j.queue) != 0 {
		t.Errorf("after taking everything: %d fresh, %d queued; want 0 and 0", j.fresh, len(j.queue))
	}

	// A take of part of the queue leaves the fresh batches it did not
	// take at the head.
	c.cfg.CommitTransactions, j.runners = 2, 2
	add("e", false)
	add("new5", true)
	add("new6", true)
	add("f", false)
	if got, want := order(j.take()), []string{"new5", "new6"}; !slices.Equal(got, want) {
		t.Errorf("the first of two shares: %q, want %q", got, want)
	}
	add("new7", true)
	if got, want := order(j.take()), []string{"new7", "e"}; !slices.Equal(got, want) {
		t.Errorf("the second share: %q, want %q", got, want)
	}
}
