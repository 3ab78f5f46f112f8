package chaos

// The add-partitions fault: the harness as an operator who grows the topic
// by one or two partitions (`tenure admin topic add-partitions`) and then
// acknowledges the new count for the group (`tenure admin topic
// acknowledge-partitions`, docs/fencing.md "Partition count changes"),
// either at once, before any worker can have noticed (ack-first), or once
// a worker has logged that it noticed (ack-after). The producer moves to
// the new count as soon as its client has the new partitions' metadata,
// with partition.For (what the workers compute). Until the
// acknowledgement the topic is held, by reason: the fault lasts until it.
// From then on, the liveness check wants the new partitions owned and
// moving within B, like every other partition: a worker that never learns
// of the new partitions (kgo refreshes its metadata every 5 minutes unless
// told to) leaves them unowned, a wedge. At most maxAddPartitions per run,
// so that the count stays within reach of the workers.

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

const kindAddParts = "add-partitions"

// Modes of add-partitions: when the operator acknowledges.
const (
	addAckFirst = "ack-first" // at once: before the workers notice the new count
	addAckAfter = "ack-after" // once a worker logged that it noticed
)

var addModes = []string{addAckFirst, addAckAfter}

const maxAddPartitions = 2

// addition is one add-partitions the harness made.
type addition struct {
	fault         *fault
	was, now      int32
	acked         time.Duration // from the change to the acknowledgement
	moving        time.Duration // from the acknowledgement to every new partition moving; -1: not within B
	noticedBefore bool          // a worker had logged that it noticed (msgLayoutChanged, msgCountChanged) before the acknowledgement
}

// addPartitions is the add-partitions fault.
func (w *world) addPartitions() {
	mode := addModes[w.rng.IntN(len(addModes))]
	was := w.nparts()
	n := was + int32(1+w.rng.IntN(2))
	held, counted := w.book.awaitLine("", msgLayoutChanged), w.book.awaitLine("", msgCountChanged)
	noticed := make(chan struct{}) // closed at the first worker line that says it noticed
	go func() {
		select {
		case <-held:
		case <-counted:
		case <-time.After(10 * time.Minute): // the run is over by then
		}
		close(noticed)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f := w.begin(kindAddParts, mode, fmt.Sprintf("%d to %d partitions", was, n))
	a := &addition{fault: f, was: was, now: n}
	w.mu.Lock()
	w.added = append(w.added, a)
	w.mu.Unlock()
	if out, err := w.adminCLI(ctx, "topic", "add-partitions", "--brokers", w.brokerAddr, "--topic", topicName, "--partitions", strconv.Itoa(int(n))); err != nil {
		w.t.Fatalf("add-partitions: %v", err)
	} else {
		w.t.Logf("add-partitions: %s", out)
	}
	if err := w.prod.grow(ctx, n); err != nil {
		w.t.Fatalf("add-partitions: %v", err)
	}
	w.mark(f)
	switch mode {
	case addAckFirst:
		// At once: the acknowledgement is in Postgres before the workers'
		// next metadata refresh.
	case addAckAfter:
		select {
		case <-noticed:
			w.sleep(w.between(0, time.Second))
		case <-time.After(w.live.bound.total()):
			w.note("add-partitions: no worker logged %q or %q within B = %s of the change to %d partitions: acknowledged anyway", msgLayoutChanged, msgCountChanged, w.live.bound.total(), n)
		}
	}
	select {
	case <-noticed:
		a.noticedBefore = true
	default:
	}
	out, err := w.adminCLI(ctx, "topic", "acknowledge-partitions", "--brokers", w.brokerAddr, "--database-url", w.dbURL(), "--schema", schemaName,
		"--group", groupName, "--topic", topicName, "--partitions", strconv.Itoa(int(n)), "--actor", chaosActor)
	if err != nil {
		w.t.Fatalf("add-partitions: %v", err)
	}
	w.t.Logf("add-partitions: %s", out)
	w.end(f)
	w.mu.Lock()
	a.acked = f.Ended.Sub(f.Injected)
	w.mu.Unlock()
	// The quiet tail: nothing else happens until every new partition is
	// owned and moving (a fencing row whose next offset is past the
	// partition's first job), or the liveness check has had B of quiet
	// time to judge it.
	at, ok := w.quietTail(func() bool {
		next, err := w.fences(ctx)
		if err != nil {
			return false
		}
		for p := was; p < n; p++ {
			if next[p] == 0 {
				return false
			}
		}
		return true
	})
	w.mu.Lock()
	a.moving = -1
	if ok {
		a.moving = at.Sub(f.Ended)
	}
	w.mu.Unlock()
}

// adminCLI runs `tenure admin args...` and returns its output.
func (w *world) adminCLI(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, tenureBin, append([]string{"admin"}, args...)...).CombinedOutput()
	s := strings.TrimSpace(string(out))
	if err != nil {
		return s, fmt.Errorf("tenure admin %s: %v: %s", strings.Join(args[:2], " "), err, s)
	}
	return s, nil
}

// additionsSummary is the add-partitions line of the summary: when the
// workers noticed each change (their first msgLayoutChanged line), from
// the logbook.
func (w *world) additionsSummary() string {
	w.mu.Lock()
	adds := append([]*addition(nil), w.added...)
	w.mu.Unlock()
	if len(adds) == 0 {
		return "partitions:  the topic kept its " + strconv.Itoa(initialPartitions) + " partitions\n"
	}
	w.book.mu.Lock()
	seen := append([]batchEvent(nil), w.book.layoutChanged...)
	w.book.mu.Unlock()
	var parts []string
	for _, a := range adds {
		f := a.fault
		noticed := "no worker noticed"
		for _, e := range seen {
			if !e.At.Before(f.Injected.Truncate(time.Millisecond)) {
				noticed = fmt.Sprintf("first noticed by %s after %s", e.Worker, e.At.Sub(f.Injected).Round(time.Millisecond))
				break
			}
		}
		when := "before any worker noticed"
		if a.noticedBefore {
			when = "after a worker noticed"
		}
		moving := "not within B"
		if a.moving >= 0 {
			moving = a.moving.Round(time.Millisecond).String()
		}
		parts = append(parts, fmt.Sprintf("%d to %d (%s: acknowledged after %s, %s; %s; the new partitions moving %s after the acknowledgement)",
			a.was, a.now, f.Mode, a.acked.Round(time.Millisecond), when, noticed, moving))
	}
	return fmt.Sprintf("partitions:  grown %s\n", strings.Join(parts, "; "))
}
