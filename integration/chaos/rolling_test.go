package chaos

// The rolling-restart fault: every worker in turn stopped gracefully
// (SIGTERM, and its exit awaited) and started again, the next one only once
// the restarted one has rejoined (it logged a claimed partition), as a
// deployment rolls a new version out. In a strict run (-chaos.strict) each
// restarted worker comes back with --strict toggled, so that for the
// length of the roll the group mixes strict and plain workers: a plain
// worker must resolve the batch a strict one left prepared (it holds the
// fencing row's lock until someone commits or rolls it back), and a strict
// one what a plain one left. The next roll toggles them back.

import (
	"fmt"
	"strings"
	"time"
)

const kindRolling = "rolling-restart"

// Modes of rolling-restart.
const (
	rollPlain  = "plain"         // the same flags again
	rollToggle = "toggle-strict" // -chaos.strict: --strict toggled on each restarted worker
)

// roll is one rolling restart: per worker, how long it took to rejoin.
type roll struct {
	fault    *fault
	rejoined []time.Duration // from its start to its first claimed partition
	missed   []string        // the workers that did not rejoin within B
}

// rollingRestart is the rolling-restart fault.
func (w *world) rollingRestart() {
	mode := rollPlain
	if w.cfg.strict {
		mode = rollToggle
	}
	first := w.rng.IntN(len(w.slots))
	f := w.begin(kindRolling, mode, "")
	r := &roll{fault: f}
	w.mu.Lock()
	w.rolls = append(w.rolls, r)
	w.mu.Unlock()
	var did []string
	for i := range w.slots {
		s := w.slots[(first+i)%len(w.slots)]
		if err := s.p.stop(45 * time.Second); err != nil {
			w.note("rolling-restart: %v", err)
		}
		if i == 0 {
			w.mark(f) // once the roll is in effect
		}
		if mode == rollToggle {
			s.strict = !s.strict
		}
		name := s.nextName()
		claimed := w.book.awaitLine(name, msgClaimed)
		started := time.Now()
		if err := w.startWorker(s); err != nil {
			w.t.Fatalf("rolling-restart: starting %s: %v", name, err)
		}
		flags := "plain"
		if s.strict {
			flags = "--strict"
		}
		did = append(did, name+" "+flags)
		if w.awaitClosed(claimed, w.live.bound.total()) {
			r.rejoined = append(r.rejoined, time.Since(started))
		} else {
			r.missed = append(r.missed, name)
			w.note("rolling-restart: %s claimed no partition within B = %s of its start; the roll goes on", name, w.live.bound.total())
		}
	}
	w.mu.Lock()
	f.Target = strings.Join(did, ", ")
	w.mu.Unlock()
	w.end(f)
}

// awaitClosed waits, supervising, until ch is closed or timeout passes.
func (w *world) awaitClosed(ch <-chan struct{}, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		select {
		case <-ch:
			return true
		default:
		}
		w.sleep(50 * time.Millisecond)
	}
	return false
}

// rollsSummary is the rolling restarts' line of the summary.
func (w *world) rollsSummary() string {
	w.mu.Lock()
	rolls := append([]*roll(nil), w.rolls...)
	w.mu.Unlock()
	if len(rolls) == 0 {
		return "rolls:       no rolling restart in this run\n"
	}
	var took []time.Duration
	missed := 0
	for _, r := range rolls {
		took = append(took, r.rejoined...)
		missed += len(r.missed)
	}
	return fmt.Sprintf("rolls:       %d rolling restarts (%s); a restarted worker claimed its first partition after p50/max %s; not within B: %d\n",
		len(rolls), rolls[0].fault.Mode, p50max(took), missed)
}
