package consumer

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/tenure-dev/tenure/internal/tick"
)

// groupWatchEvery is how often each worker describes its own group (its
// topics): Stuck, and package metrics' tenure_partition_stuck_seconds.
// Every worker does, so that a dead worker's partitions are reported by
// the others. A variable, so that tests can shorten it.
var groupWatchEvery = 10 * time.Second

// stuckLogAfter: the group watch logs a partition that has been stuck for
// this long (shorter ones are mostly hand-offs in progress).
const stuckLogAfter = 30 * time.Second

// Stuck is a partition of the worker's group (of its topics) that has jobs
// waiting and is in a state other than ok, as the worker's last group
// watch saw it.
type Stuck struct {
	Assignment
	// For is how long it has been in its state, as of the call to
	// Consumer.Stuck: from Assignment.Since where that is known, else from
	// when this worker's watch first saw it so.
	For time.Duration
}

// groupWatch is what the last group watch found.
type groupWatch struct {
	mu    sync.Mutex
	rows  []Assignment // not ok, jobs waiting
	read  time.Time    // this process's clock when rows were read
	first map[stuckKey]time.Time
	said  string // the entries last logged

	errors atomic.Int64 // watches that failed
}

type stuckKey struct {
	tp
	state State
}

// Stuck returns the partitions of the worker's group, of its topics, that
// have jobs waiting and are not ok (Assignment.State: unowned,
// owner-silent, not-progressing, a hold...), as the worker's group watch
// last saw them; it describes the group every 10 s while the worker is a
// member. Every worker reports the same partitions, its own and the
// others'. Empty while the worker is not in the group, and before its
// first watch.
func (c *Consumer) Stuck() []Stuck {
	w := &c.watch
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	out := make([]Stuck, 0, len(w.rows))
	for _, a := range w.rows {
		var d time.Duration
		if a.ForSeconds != nil {
			d = time.Duration(*a.ForSeconds)*time.Second + now.Sub(w.read)
		} else {
			d = now.Sub(w.first[stuckKey{tp{a.Topic, a.Partition}, a.State}])
		}
		out = append(out, Stuck{Assignment: a, For: max(d, 0)})
	}
	return out
}

// set records a watch's rows (nil clears), and returns the stuck
// partitions to log when what is worth logging changed ("" otherwise).
func (w *groupWatch) set(rows []Assignment, now time.Time) (log string, stuck int) {
	var keep []Assignment
	for _, a := range rows {
		if a.State != StateOK && waiting(&a) {
			keep = append(keep, a)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	first := map[stuckKey]time.Time{}
	var long []string
	for _, a := range keep {
		k := stuckKey{tp{a.Topic, a.Partition}, a.State}
		first[k] = now
		if at, ok := w.first[k]; ok {
			first[k] = at
		}
		d := now.Sub(first[k])
		if a.ForSeconds != nil {
			d = time.Duration(*a.ForSeconds) * time.Second
		}
		if d >= stuckLogAfter {
			long = append(long, fmt.Sprintf("%s/%d %s", a.Topic, a.Partition, a.State))
		}
	}
	w.rows, w.read, w.first = keep, now, first
	slices.Sort(long)
	said := strings.Join(long, ", ")
	if said == w.said {
		return "", len(long)
	}
	w.said = said
	if said == "" {
		return "none", 0
	}
	return said, len(long)
}

// watchGroup describes the worker's group every groupWatchEvery until ctx
// ends (the session), for Stuck. It logs the partitions stuck for
// stuckLogAfter when that list changes.
func (c *Consumer) watchGroup(ctx context.Context, cl *kgo.Client) {
	defer c.watch.set(nil, time.Now()) // out of the group: nothing to report
	failing := false
	tick.Every(ctx, groupWatchEvery, func() {
		dctx, cancel := context.WithTimeout(ctx, groupWatchEvery)
		rows, err := Describe(dctx, cl, c.cfg.Store, c.cfg.Group, c.cfg.Topics)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return // the session ended: not a failure to report
			}
			c.watch.errors.Add(1)
			if !failing {
				failing = true
				c.log.Warn("describing the group for its stuck partitions failed; the last answer stands until one succeeds", zap.Error(err))
			}
			return
		}
		failing = false
		switch said, n := c.watch.set(rows, time.Now()); said {
		case "":
		case "none":
			c.log.Info("no partition of the group with jobs waiting is stuck any more")
		default:
			c.log.Warn("partitions of the group have jobs waiting and make no progress (tenure admin assignments says why)",
				zap.Int("partitions", n), zap.String("stuck", said))
		}
	})
}
