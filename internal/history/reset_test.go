package history

import (
	"slices"
	"strings"
	"testing"

	"github.com/tenure-dev/tenure/sink"
)

// An operator's reset re-bases a partition: the checker accepts the
// operator's record (from where the log had reached, under the holder's
// token and claim, followed by a claim before any commit) and the jobs it
// repeats or skips, and nothing else.

func reset(id int64, p int32, t sink.Token, by string, from, to int64) Entry {
	return Entry{ID: id, Kind: "reset", Partition: part(p), Token: t, Owner: by, From: from, To: to}
}

// resetHistory is a legal history of partition 0 with resets both ways:
//
//   - A commits 0-19 (job 12 is dead-lettered), an operator resets 20 -> 5
//     (jobs 5-19 run again; job 12 succeeds this time), A claims again
//     and commits 5-19;
//   - B takes over at 20 and commits 20-24, the operator skips 25-29
//     (25 -> 30), B claims again and commits 30-34;
//   - with nobody committing, 35 -> 40 (skip) and 40 -> 35 (back): jobs
//     35-39 are never skipped in the end, and run once.
//
// One export write per job and run, versions in commit order: key k0-1's
// version after the first reset goes back from offset 19 to 5.
func resetHistory() *History {
	h := &History{
		Log: []Entry{
			claim(10, 0, tok(0, 3), "A", 0),
			commit(20, 0, tok(0, 3), "A", 0, 10),
			commit(30, 0, tok(0, 3), "A", 10, 20),
			reset(40, 0, tok(0, 3), "ops", 20, 5),
			claim(50, 0, tok(0, 3), "A", 5),
			commit(60, 0, tok(0, 3), "A", 5, 20),
			claim(70, 0, tok(0, 5), "B", 20),
			commit(80, 0, tok(0, 5), "B", 20, 25),
			reset(90, 0, tok(0, 5), "ops", 25, 30),
			claim(100, 0, tok(0, 5), "B", 30),
			commit(110, 0, tok(0, 5), "B", 30, 35),
			reset(120, 0, tok(0, 5), "ops", 35, 40),
			reset(130, 0, tok(0, 5), "ops", 40, 35),
			claim(140, 0, tok(0, 5), "B", 35),
			commit(150, 0, tok(0, 5), "B", 35, 40),
		},
		Fences:      []sink.Fence{{Partition: part(0), Token: tok(0, 5), Owner: "B", NextOffset: 40, PartitionCount: 1}},
		DeadLetters: []Write{{Key: keyOf(0, 12), Topic: topic, Partition: 0, Offset: 12, Token: tok(0, 3)}},
	}
	// Job 12 is dead-lettered in the first run only.
	addWrites(h, func(e Entry, off int64) bool { return e.ID == 30 && off == 12 })
	return h
}

func producedTo(n int64) map[TopicPartition][]int64 {
	return map[TopicPartition][]int64{{Topic: topic, Partition: 0}: offsets(n)}
}

func TestResetHistoryPasses(t *testing.T) {
	h := resetHistory()
	if vs := h.Check(producedTo(40)); len(vs) != 0 {
		t.Fatalf("a legal history with resets was reported as broken:\n%s", joinViolations(vs))
	}
	// A partition without resets beside it is checked as before.
	c := cleanHistory()
	h.Log = append(h.Log, slices.DeleteFunc(c.Log, func(e Entry) bool { return e.Partition.Partition == 0 })...)
	h.Fences = append(h.Fences, c.Fences[1])
	for _, w := range c.Writes {
		if w.Partition == 1 {
			w.Key += "-p1"
			h.Writes = append(h.Writes, w)
		}
	}
	h.DeadLetters = append(h.DeadLetters, c.DeadLetters[1])
	prod := producedTo(40)
	prod[TopicPartition{Topic: topic, Partition: 1}] = offsets(6)
	if vs := h.Check(prod); len(vs) != 0 {
		t.Fatalf("two partitions, one with resets:\n%s", joinViolations(vs))
	}
	if got := ResetPartitions(h.Log); len(got) != 1 || !got[TopicPartition{Topic: topic, Partition: 0}] {
		t.Fatalf("ResetPartitions = %v", got)
	}
}

func TestResetViolationsAreDetected(t *testing.T) {
	t.Run("Records", func(t *testing.T) { checkPlanted(t, resetHistory, producedTo(40), resetRecordViolations()) })
	t.Run("Jobs", func(t *testing.T) { checkPlanted(t, resetHistory, producedTo(40), resetJobViolations()) })
}

// resetRecordViolations are resets and commits the log does not allow:
// from elsewhere than the log had reached, before a claim, under another
// token, or a batch that straddles a reset.
func resetRecordViolations() []plantCase {
	return []plantCase{
		// The repeat of 5-19 then no longer explains key versions
		// going back from offsets 18 and 19.
		plantFunc("reset that does not start where the log had reached", func(t *testing.T, h *History) {
			// A reset from 18 while the commits had reached 20: jobs
			// 18-19 would be unaccounted for.
			logEntry(t, h, 40).From = 18
		}, "reset #40 moved the offset from 18 but the log had reached 20", "G1", "export-regressed"),
		plantFunc("commit that straddles a reset and fits by offset", func(t *testing.T, h *History) {
			// A's batch [35,40) was begun before the resets 35->40 and
			// 40->35; it lands after them without a claim. Its range
			// fits the offsets exactly: only the log epoch forbids it.
			h.Log = slices.DeleteFunc(h.Log, func(e Entry) bool { return e.ID == 140 })
		}, "commit #150 [35,40) by \"B\" straddles reset #130 (from 40 to 35)", "G1"),
		plantFunc("commit that straddles a reset and does not fit", func(t *testing.T, h *History) {
			// A's batch [20,25), begun before the reset 20->5, lands
			// right after it.
			insertLog(h, commit(45, 0, tok(0, 3), "A", 20, 25))
			for off := int64(20); off < 25; off++ {
				h.Writes = append(h.Writes, Write{Key: "late", Topic: topic, Partition: 0, Offset: off, Token: tok(0, 3)})
			}
		}, "commit #45 [20,25) by \"A\" straddles reset #40", "G1"),
		plantLog("reset before any claim", reset(5, 0, tok(0, 3), "ops", 0, 0),
			"reset #5 from 0 to 0 before any claim", "G1"),
		plantFunc("reset under another token than the holder's", func(t *testing.T, h *History) {
			logEntry(t, h, 90).Token = tok(0, 3)
		}, "reset #90 by \"ops\" carries token 0.3 (claim 0) but the partition was held with token 0.5", "G1"),
	}
}

// resetJobViolations are jobs whose effects do not add up with the resets:
// a repeat that ran once, a skip that ran, a run too many, and exports
// that go back without a reset.
func resetJobViolations() []plantCase {
	return []plantCase{
		plantFunc("job a reset repeated that ran only once", func(t *testing.T, h *History) {
			// The repeat of job 7 left no effect.
			n := 0
			h.Writes = slices.DeleteFunc(h.Writes, func(w Write) bool {
				if w.Offset == 7 {
					n++
					return n == 2
				}
				return false
			})
		}, "job at offset 7 is covered by 2 commits with token 0.3 but has 1 effects or dead letters with it", "missing"),
		plantEffect("job a reset skipped that has an effect", effect("k-27", 0, 27, tok(0, 5)),
			"job at offset 27 has a committed effect or dead letter but no commit covers it", "G1"),
		plantEffect("job run three times where two commits cover it", effect("k-8", 0, 8, tok(0, 3)),
			"job at offset 8 has 3 effects or dead letters with token 0.3 but 2 commits with that token cover it", "duplicate"),
		plantFunc("effect of a repeated job under another token", func(t *testing.T, h *History) {
			for i := range h.Writes {
				if h.Writes[i].Offset == 9 {
					h.Writes[i].Token = tok(0, 5) // both runs were A's, at 0.3
				}
			}
		}, "job at offset 9 has an effect or dead letter with token 0.5 but no commit with that token covers it", "G1", "missing"),
		plantFunc("job below the next offset that no commit covered and no reset skipped", func(t *testing.T, h *History) {
			// The skip 25->30 recorded as 26->30, and B's commit
			// [20,26): job 25 claims to be done, and has no effect.
			logEntry(t, h, 80).To = 26
			logEntry(t, h, 90).From = 26
			h.Writes = slices.DeleteFunc(h.Writes, func(w Write) bool { return w.Offset == 25 })
		}, "job at offset 25 is covered by 1 commits with token 0.5 but has 0 effects", "missing"),
		plantFunc("export that goes back without a reset", func(t *testing.T, h *History) {
			// Key k0-0's versions of offsets 20 and 22 swap.
			var a, b *Write
			for i := range h.Writes {
				switch h.Writes[i].Offset {
				case 20:
					a = &h.Writes[i]
				case 22:
					b = &h.Writes[i]
				}
			}
			a.Version, b.Version = b.Version, a.Version
		}, "key \"k0-0\": version", "export-regressed"),
	}
}

// A pruned partition with resets: the cut may fall before or after a
// reset; the reset after it is checked against the cut's offset and the
// kept claim's token.
func TestResetAfterPrunedCut(t *testing.T) {
	cut := sink.FenceLogCut{Partition: part(0), ThroughID: 30, KeptClaimID: 10, NextOffset: 20, MaxToken: tok(0, 3)}
	h := resetHistory()
	h.Log = slices.DeleteFunc(h.Log, func(e Entry) bool { return e.ID > 10 && e.ID <= 30 })
	h.Cuts = []sink.FenceLogCut{cut}
	if vs := h.Check(producedTo(40)); len(vs) != 0 {
		t.Fatalf("a pruned history with resets:\n%s", joinViolations(vs))
	}
	logEntry(t, h, 40).From = 19
	if vs := CheckLog(h.Log, h.Fences, cut); !slices.ContainsFunc(vs, func(v Violation) bool {
		return strings.Contains(v.Detail, "reset #40 moved the offset from 19 but the log had reached 20")
	}) {
		t.Fatalf("a reset that does not start at the cut's offset passed: %v", vs)
	}
}
