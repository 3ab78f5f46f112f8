package chaos

// The rolling-restart fault: every worker in turn stopped gracefully
// (SIGTERM, and its exit awaited) and started again, the next one only once
// the restarted one has rejoined (it logged a claimed partition), as a
// deployment rolls a new version out. In a strict run (-chaos.strict) each
// restarted worker comes back with --strict toggled, so that for the
// length of the roll the group mixes strict and plain workers; the next
// roll toggles them back.
//
// What a mixed group must get right is a batch a strict worker left
// prepared: PREPARE TRANSACTION keeps the fencing row's lock until someone
// commits or rolls the batch back, and whoever claims the partition next,
// plain or strict, must decide it first. A graceful stop decides its
// batches (so does a worker frozen and then stopped: it wakes and decides),
// so a strict worker that is to come back plain leaves one the way a roll
// meets it when a worker's grace period runs out: it is restarted holding
// its first prepared batch before the batch's offset commit (--hold-once
// strict-before-offset-commit) and then killed (SIGKILL) instead of
// stopped. The batch outlives it, and the partition goes to the members
// left, or to the plain worker started in its place.

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
	prepared int             // strict workers that left a batch prepared (held, then killed)
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
		if mode == rollToggle && s.strict && w.restartHolding(s, kindRolling+" "+mode, "--hold-once", "strict-before-offset-commit") {
			// Its batch is prepared: killed, it leaves it so.
			if err := s.p.kill(); err != nil {
				w.note("rolling-restart: %v", err)
			} else {
				r.prepared++
			}
		}
		if !s.p.exited() {
			if err := s.p.stop(45 * time.Second); err != nil {
				w.note("rolling-restart: %v", err)
			}
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
	missed, prepared := 0, 0
	for _, r := range rolls {
		took = append(took, r.rejoined...)
		missed += len(r.missed)
		prepared += r.prepared
	}
	w.book.mu.Lock()
	resolved := w.book.strictResolved
	w.book.mu.Unlock()
	return fmt.Sprintf("rolls:       %d rolling restarts (%s); a restarted worker claimed its first partition after p50/max %s; not within B: %d; "+
		"batches strict workers left prepared on their way out %d, prepared batches of older claims resolved by a claim (any fault) %d\n",
		len(rolls), rolls[0].fault.Mode, p50max(took), missed, prepared, resolved)
}
