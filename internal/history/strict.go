package history

import (
	"fmt"
	"sort"
	"time"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/internal/fence"
	"github.com/tenure-dev/tenure/sink"
)

// StrictEvent is one line of a strict worker's log that the strict check
// reads: a lane sent its batch's offset commit (Kind "sent"), heard the
// coordinator's answer ("answered"), or its assignment ended ("ended": the
// group revoked the partition from it, or its member lost it).
type StrictEvent struct {
	Kind      string // "sent", "answered", "ended"
	GID       string // sent, answered
	ClaimID   int64
	Partition sink.Partition
	At        time.Time // when the line was logged
	// SentAt (sent, answered) is when the request was sent: for an answer,
	// the request it answers.
	SentAt     time.Time
	Generation int32
	Accepted   bool   // answered
	Why        string // ended: "revoked" or "lost"
}

// ParseStrictEvent reads a StrictEvent from a worker's JSON log line, as
// decoded into a map; ok is false for any other line.
func ParseStrictEvent(group string, line map[string]any) (ev StrictEvent, ok bool) {
	switch line["msg"] {
	case consumer.MsgStrictSent:
		ev.Kind = "sent"
	case consumer.MsgStrictAnswered:
		ev.Kind = "answered"
	case consumer.MsgAssignmentEnded:
		ev.Kind = "ended"
	default:
		return ev, false
	}
	if ev.Partition, ev.ClaimID, ev.At, ok = parseClaimLine(group, line); !ok {
		return ev, false
	}
	ev.GID, _ = line["gid"].(string)
	ev.Why, _ = line["why"].(string)
	ev.Accepted, _ = line["accepted"].(bool)
	if g, ok := line["generation"].(float64); ok {
		ev.Generation = int32(g)
	}
	if ms, ok := line["sent_at_ms"].(float64); ok {
		ev.SentAt = time.UnixMilli(int64(ms))
	}
	return ev, true
}

// CheckStrict checks strict hand-off (G3-strict) over a history, the
// coordinator's timeline (assignments: the workers' "claiming partition"
// lines, as CheckOwnership reads them) and the strict lanes' lines:
//
//   - G3-strict: a batch that became visible (its commit entry, which
//     carries its GID, is in the fence log) did so on an offset commit the
//     coordinator accepted while the batch's assignment was the
//     partition's current one. The acceptance came after the accepted
//     request was sent, so a request sent after the assignment ended (the
//     partition's next assignment, or, classic only, the lane's own
//     revocation or loss) cannot have been accepted in time: such a
//     batch is reported, and so is a visible batch with no offset commit
//     its lane logged.
//   - strict-record: the decisions recorded agree with the fence log (a
//     batch recorded committed has its commit entry, one recorded rolled
//     back has none), and a batch whose offset commit the coordinator
//     accepted was not rolled back (G3-record; a group deletion or an
//     offset expiry between the two excuses it: pass wiped for histories
//     that had one).
//   - strict-END: no batch is left prepared (call it once the partitions
//     were last claimed after every worker that could leave one stopped).
//
// classic says the ended lines mark the end of an assignment in the
// coordinator's timeline: under the classic protocol a revocation is
// announced after the new generation's SyncGroup; under KIP-848 the
// coordinator moves the partition only after the member acknowledged it,
// later than the callback's line.
func CheckStrict(h *History, assignments []Assignment, events []StrictEvent, classic, wiped bool) []Violation {
	byClaim := map[int64]Assignment{}
	byPart := map[sink.Partition][]Assignment{}
	for _, a := range assignments {
		byClaim[a.ClaimID] = a
		byPart[a.Partition] = append(byPart[a.Partition], a)
	}
	for _, as := range byPart {
		sort.Slice(as, func(i, j int) bool { return as[i].At.Before(as[j].At) })
	}
	ended := map[int64]time.Time{}
	sends := map[string][]StrictEvent{}
	answers := map[string][]StrictEvent{}
	for _, ev := range events {
		switch ev.Kind {
		case "ended":
			if classic || ev.Why == "lost" {
				if t, ok := ended[ev.ClaimID]; !ok || ev.At.Before(t) {
					ended[ev.ClaimID] = ev.At
				}
			}
		case "sent":
			sends[ev.GID] = append(sends[ev.GID], ev)
		case "answered":
			answers[ev.GID] = append(answers[ev.GID], ev)
		}
	}
	var out []Violation
	visible := map[string]bool{}
	for _, e := range h.Log {
		if e.Kind != "commit" || e.GID == "" {
			continue
		}
		visible[e.GID] = true
		a, ok := byClaim[e.ClaimID]
		if !ok {
			out = append(out, Violation{"G3-strict", fmt.Sprintf("%s: batch %s [%d,%d) became visible but no worker logged the assignment of claim %d", e.Partition, e.GID, e.From, e.To, e.ClaimID)})
			continue
		}
		end, endWhy := time.Time{}, ""
		for _, n := range byPart[e.Partition] {
			if n.At.After(a.At) {
				end, endWhy = n.At, fmt.Sprintf("the partition was assigned to %s (claim %d)", n.Member, n.ClaimID)
				break
			}
		}
		if t, ok := ended[e.ClaimID]; ok && (end.IsZero() || t.Before(end)) {
			end, endWhy = t, "its lane's assignment ended (revoked or lost)"
		}
		sent, how := acceptedSend(sends[e.GID], answers[e.GID])
		switch {
		case sent.IsZero():
			out = append(out, Violation{"G3-strict", fmt.Sprintf("%s: batch %s [%d,%d) of claim %d became visible but its lane logged no offset commit",
				e.Partition, e.GID, e.From, e.To, e.ClaimID)})
		case !end.IsZero() && sent.After(end):
			out = append(out, Violation{"G3-strict", fmt.Sprintf("%s: batch %s [%d,%d) of claim %d (member %s) became visible on an offset commit sent at %s (%s), after its assignment ended at %s: %s",
				e.Partition, e.GID, e.From, e.To, e.ClaimID, a.Member, sent.Format("15:04:05.000"), how, end.Format("15:04:05.000"), endWhy)})
		}
	}
	for _, d := range h.StrictDecisions {
		switch {
		case d.Committed && !visible[d.GID]:
			out = append(out, Violation{"strict-record", fmt.Sprintf("%s: batch %s is recorded committed (by %s) but its commit is not in the fence log", d.Batch.Partition, d.GID, decider(d))})
		case !d.Committed && visible[d.GID]:
			out = append(out, Violation{"strict-record", fmt.Sprintf("%s: batch %s is recorded rolled back (by %s) but its commit is in the fence log", d.Batch.Partition, d.GID, decider(d))})
		case !d.Committed && !wiped && accepted(answers[d.GID]):
			out = append(out, Violation{"strict-record", fmt.Sprintf("%s: batch %s was rolled back (by %s: %s) although the coordinator had accepted its offset commit (G3-record)",
				d.Batch.Partition, d.GID, decider(d), d.Evidence)})
		}
	}
	for _, g := range h.Prepared {
		out = append(out, Violation{"strict-END", fmt.Sprintf("prepared batch %s was never committed or rolled back", g)})
	}
	sortViolations(out)
	return out
}

func decider(d fence.StrictDecision) string {
	if d.ByResolver {
		return fmt.Sprintf("the claim %d of %s", d.DeciderClaimID, d.Decider)
	}
	return "its lane"
}

func accepted(answers []StrictEvent) bool {
	for _, a := range answers {
		if a.Accepted {
			return true
		}
	}
	return false
}

// acceptedSend is when the accepted offset commit of a batch was sent, as
// early as the lines allow: the accepted answer's request if the lane
// heard it; otherwise (its lane was frozen or killed before it heard, and a
// claim committed the batch on the group's committed offset) the first
// send of the last member and generation the lane tried, since it resends
// only identical requests there.
func acceptedSend(sends, answers []StrictEvent) (time.Time, string) {
	for _, a := range answers {
		if a.Accepted && !a.SentAt.IsZero() {
			return a.SentAt, fmt.Sprintf("accepted at generation %d", a.Generation)
		}
	}
	if len(sends) == 0 {
		return time.Time{}, ""
	}
	sort.Slice(sends, func(i, j int) bool { return sends[i].SentAt.Before(sends[j].SentAt) })
	last := sends[len(sends)-1]
	first := last.SentAt
	for _, s := range sends {
		if s.Generation == last.Generation && s.SentAt.Before(first) {
			first = s.SentAt
		}
	}
	return first, fmt.Sprintf("at generation %d; its lane never heard the answer", last.Generation)
}
