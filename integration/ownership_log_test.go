package integration

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/twmb/franz-go/pkg/kadm"
)

// ownershipEvents are the messages of a partition's ownership events and
// the fields each must carry besides topic, partition and member (the
// owner Postgres records): a token (or, where there is none yet, the epoch),
// and offsets.
var ownershipEvents = []struct {
	name, msg string
	fields    []string
}{
	{"assigned", consumer.MsgClaiming, []string{"claim_id", "member_epoch", "start_offset"}},
	{"claimed", consumer.MsgClaimed, []string{"claim_id", "token", "next_offset"}},
	{"revoked", consumer.MsgRevoked, []string{"claim_id", "token", "next_offset"}},
	{"released", "partition released: worker stopping", []string{"claim_id", "token", "next_offset"}},
	{"fenced", consumer.MsgBatchFenced, []string{"claim_id", "token", "from", "to"}},
	{"lost", consumer.MsgLost, []string{"claim_id", "token", "next_offset"}},
	{"reset", consumer.IncarnationMovedOn, []string{"claim_id", "epoch", "from", "to", "next_offset"}},
	{"stalled", "partition stalled: this member holds it but cannot claim it; trying again", []string{"claim_id", "token", "next_offset"}},
	{"claimed again", consumer.MsgRecovered, []string{"claim_id", "token", "next_offset"}},
}

// Every ownership event of a partition is logged with its topic,
// partition, owner, token and offsets, by the lane's logger, so that one
// grep of the workers' logs for `"topic":"T","partition":P,` tells the
// partition's history. Here a partition goes through all of them: claimed,
// revoked when a second worker joins, released when that worker stops, an
// operator's change that stalls it and its recovery, a group reset, and a
// pause that gets the paused worker's batch fenced and its partitions lost.
func TestOwnershipEventsTellAPartitionsHistory(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	if e.real {
		t.Skip("deletes the group and pauses workers past kfake's short session timeout")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	produceAndWait := func(n int) {
		t.Helper()
		e.produce(jobsFor(keys, 0, n)...)
		for p := int32(0); p < 2; p++ {
			waitCommitted(t, e, p, e.highWatermark(p), "")
		}
	}

	// claimed; then revoked from A when B joins; released when B stops.
	a := e.startWorker("A")
	produceAndWait(20)
	b := e.startWorker("B")
	a.waitLog(60*time.Second, map[string]any{"msg": consumer.MsgRevoked})
	b.waitLog(60*time.Second, map[string]any{"msg": consumer.MsgClaimed})
	produceAndWait(20)
	b.stop(30 * time.Second)
	b.waitLog(time.Second, map[string]any{"msg": "partition released: worker stopping"})
	waitFor(t, 60*time.Second, "A to hold both partitions again", func() bool {
		return a.countLogs(map[string]any{"msg": consumer.MsgClaimed}) >= 3
	})

	// stalled: an operator raises the stored epoch of partition 0 above
	// A's token; A's next commit is fenced and its claims are rejected
	// while the coordinator says A holds the partition. Lowering it lets A
	// claim again.
	if _, err := e.pool.Exec(ctx, `UPDATE "`+e.schema+`".fences SET epoch = epoch + 100 WHERE consumer_group = $1 AND topic = $2 AND partition = 0`, e.group, e.topic); err != nil {
		t.Fatal(err)
	}
	e.produce(jobsFor(keys, 0, 20)...)
	a.waitLog(60*time.Second, map[string]any{"msg": ownershipEvents[7].msg, "partition": 0})
	if _, err := e.pool.Exec(ctx, `UPDATE "`+e.schema+`".fences SET epoch = 0 WHERE consumer_group = $1 AND topic = $2 AND partition = 0`, e.group, e.topic); err != nil {
		t.Fatal(err)
	}
	a.waitLog(60*time.Second, map[string]any{"msg": ownershipEvents[8].msg, "partition": 0})
	for p := int32(0); p < 2; p++ {
		waitCommitted(t, e, p, e.highWatermark(p), "")
	}

	// reset: the group is deleted behind tenure's back (not by `tenure
	// admin group delete`, which would move the incarnation on itself);
	// the next worker's claims find that its epochs restarted.
	a.stop(30 * time.Second)
	if _, err := kadm.NewClient(e.cl).DeleteGroup(ctx, e.group); err != nil {
		t.Fatalf("deleting the group: %v", err)
	}
	c := e.startWorker("C", "--hold-once", "before-batch")
	c.waitLog(60*time.Second, map[string]any{"msg": consumer.IncarnationMovedOn})
	c.waitLog(60*time.Second, map[string]any{"msg": consumer.MsgClaimed})

	// fenced and lost: C is frozen holding a batch; D joins, and past C's
	// session timeout takes its partitions and commits; C wakes, its batch
	// is rejected and kgo says its partitions were lost. (D joins after the
	// pause: had it joined before, the rebalance could revoke C's
	// partitions instead.)
	e.produce(jobsFor(keys, 0, 20)...)
	c.waitLog(60*time.Second, map[string]any{"msg": "holding"})
	c.pause()
	d := e.startWorker("D")
	waitFor(t, 60*time.Second, "D to hold both partitions", func() bool {
		return d.countLogs(map[string]any{"msg": consumer.MsgClaimed}) >= 2
	})
	for p := int32(0); p < 2; p++ {
		waitCommitted(t, e, p, e.highWatermark(p), "")
	}
	c.resume()
	c.waitLog(60*time.Second, map[string]any{"msg": ownershipEvents[4].msg})
	// kgo usually reports the partitions of an evicted member lost; on kfake
	// it sometimes rejoins first and reports them revoked. Either line
	// carries the same fields (both are logReleased's).
	c.waitLogAny(60*time.Second, map[string]any{"msg": consumer.MsgLost},
		map[string]any{"msg": consumer.MsgRevoked, "member": c.findLog(map[string]any{"msg": consumer.MsgClaimed})["member"]})
	d.stop(30 * time.Second)
	c.stop(30 * time.Second)

	ws := []*worker{a, b, c, d}
	// Every event, on every worker, carries its fields.
	t.Run("Fields", func(t *testing.T) { checkOwnershipFields(t, ws) })
	// One grep per partition: the raw lines that contain its topic and
	// partition, from all workers, hold every event that happened to it.
	t.Run("GrepPerPartition", func(t *testing.T) { checkOwnershipGrep(t, e, ws) })
}

// checkOwnershipFields: every ownership event the workers logged carries
// its fields, and every kind was logged.
func checkOwnershipFields(t *testing.T, ws []*worker) {
	seen := map[string]int{}
	for _, w := range ws {
		for _, m := range w.logs() {
			for _, ev := range ownershipEvents {
				if m["msg"] != ev.msg {
					continue
				}
				seen[ev.name]++
				for _, f := range append([]string{"group", "topic", "partition", "member"}, ev.fields...) {
					if v, ok := m[f]; !ok || fmt.Sprint(v) == "" {
						t.Errorf("%s: %s event lacks %q: %v", w.name, ev.name, f, m)
					}
				}
				if tok, ok := m["token"]; ok && !regexp.MustCompile(`^\d+\.\d+$`).MatchString(fmt.Sprint(tok)) {
					t.Errorf("%s: %s event's token %v is not incarnation.epoch", w.name, ev.name, tok)
				}
			}
		}
	}
	for _, ev := range ownershipEvents {
		if seen[ev.name] == 0 && ev.name != "lost" {
			t.Errorf("no %s event was logged", ev.name)
		}
	}
	if seen["lost"] == 0 {
		t.Log("kgo reported C's partitions revoked rather than lost this time")
	}

}

// checkOwnershipGrep: grepping the workers' lines for a partition finds
// every event of the scenario that happened to it.
func checkOwnershipGrep(t *testing.T, e *env, ws []*worker) {
	for p := 0; p < 2; p++ {
		needle := fmt.Sprintf(`"topic":%q,"partition":%d,`, e.topic, p)
		got := map[string]bool{}
		for _, w := range ws {
			for _, line := range w.raw() {
				if !strings.Contains(line, needle) {
					continue
				}
				for _, ev := range ownershipEvents {
					if strings.Contains(line, `"msg":"`+ev.msg+`"`) {
						got[ev.name] = true
					}
				}
			}
		}
		want := []string{"assigned", "claimed", "reset"}
		if p == 0 {
			want = append(want, "stalled", "claimed again")
		}
		for _, name := range want {
			if !got[name] {
				t.Errorf("grep %s: no %s line", needle, name)
			}
		}
		if !got["lost"] && !got["revoked"] {
			t.Errorf("grep %s: no lost or revoked line", needle)
		}
		t.Logf("grep %s: %v", needle, got)
	}
}
