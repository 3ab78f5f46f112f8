package history

import (
	"slices"
	"testing"

	"github.com/tenure-dev/tenure/sink"
)

// A transaction that commits several partitions at once (one fence
// statement over all of them) leaves one ordinary commit entry per
// partition, each with its own claim and range: the checker sees each
// partition's part as that partition's commit, and a refused transaction
// leaves nothing at all. So the checks need nothing of their own for it;
// what they must do is report a fence that commits a refused partition's
// output with the others' (docs/model/joint.pml's -DPERROW), which shows
// as output no commit of its partition covers.

// jointHistory: A holds partitions 0 and 1 and commits both in one
// transaction (#30, #40: one statement); B claims 1; A's next transaction
// over both is refused (nothing logged) and A goes again with 0 alone
// (#60); B commits 1 (#70).
func jointHistory() *History {
	h := &History{
		Log: []Entry{
			claim(10, 0, tok(0, 3), "A", 0),
			claim(20, 1, tok(0, 3), "A", 0),
			commit(30, 0, tok(0, 3), "A", 0, 2),
			commit(40, 1, tok(0, 3), "A", 0, 3),
			claim(50, 1, tok(0, 5), "B", 3),
			commit(60, 0, tok(0, 3), "A", 2, 4),
			commit(70, 1, tok(0, 5), "B", 3, 5),
		},
		Fences: []sink.Fence{
			{Partition: part(0), Token: tok(0, 3), Owner: "A", NextOffset: 4, PartitionCount: 2},
			{Partition: part(1), Token: tok(0, 5), Owner: "B", NextOffset: 5, PartitionCount: 2},
		},
	}
	addWrites(h, func(Entry, int64) bool { return false })
	return h
}

func jointProduced() map[TopicPartition][]int64 {
	return map[TopicPartition][]int64{
		{Topic: topic, Partition: 0}: offsets(4),
		{Topic: topic, Partition: 1}: offsets(5),
	}
}

func TestJointTransactionPasses(t *testing.T) {
	h := jointHistory()
	if vs := h.Check(jointProduced()); len(vs) != 0 {
		t.Fatalf("a legal history with a transaction over two partitions was reported as broken:\n%s", joinViolations(vs))
	}
}

// The refused transaction of jointHistory committed row by row: partition
// 0's part (#60, now A's only commit of [2,4)) and partition 1's output at
// offsets 3 and 4 under A's token, with no commit of partition 1.
func TestJointTransactionRowByRowIsCaught(t *testing.T) {
	// A's output rows of partition 1, each key's next export version.
	refusedOutput := func(h *History) {
		for _, off := range []int64{3, 4} {
			k, v := keyOf(1, off), int64(1)
			for _, w := range h.Writes {
				if w.Key == k && w.Version >= v {
					v = w.Version + 1
				}
			}
			h.Writes = append(h.Writes, Write{Key: k, Version: v, Topic: topic, Partition: 1, Offset: off, Token: tok(0, 3)})
		}
	}
	t.Run("before the new owner commits", func(t *testing.T) {
		h := jointHistory()
		h.Log = slices.DeleteFunc(h.Log, func(e Entry) bool { return e.ID == 70 })
		h.Writes = slices.DeleteFunc(h.Writes, func(w Write) bool { return w.Partition == 1 && w.Offset >= 3 })
		h.Fences[1].NextOffset = 3
		refusedOutput(h)
		vs := h.Check(jointProduced())
		if got := rulesOf(vs); !slices.Equal(got, []string{"G1"}) {
			t.Fatalf("rules %v, want [G1]; violations:\n%s", got, joinViolations(vs))
		}
	})
	t.Run("after the new owner commits", func(t *testing.T) {
		h := jointHistory()
		refusedOutput(h)
		vs := h.Check(jointProduced())
		// The same jobs' rows twice (duplicate), a key's export version at
		// an offset it already had (export-regressed), and A's token where
		// B's commit covers them (G1).
		if got := rulesOf(vs); !slices.Equal(got, []string{"G1", "duplicate", "export-regressed"}) {
			t.Fatalf("rules %v, want [G1 duplicate export-regressed]; violations:\n%s", got, joinViolations(vs))
		}
	})
}
