package integration

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/internal/testinfra/pgproxy"
)

// Tokens must stay ordered across group lifetimes. A worker Z is
// assigned a partition at a high epoch, confirmed by the coordinator, and
// stopped just before its claim reaches Postgres. The group is then deleted
// (its epochs restart at 1) and a new worker N takes the partition at epoch
// 1 without any claim of N being rejected. When Z's claim finally arrives,
// its old epoch is above N's; it must be rejected all the same, and N must
// go on.
//
//   - no-row: the partition has no fencing row before Z (its earlier
//     assignees never claimed it), so nothing rejects N's first claim;
//   - other-partition-bumped: Z claimed partition 0 and stopped before
//     partition 1; N's claim of partition 0 is rejected and bumps the
//     incarnation, and partition 1 (no row) must not be claimed under the
//     incarnation N read before that bump.
//
// Both fail on the protocol before group lifetimes were registered (incarnation read once, bumped
// only on a rejection): Z's claim with the old incarnation and epoch 3 beats
// N's 0.1, and N's lane is fenced.
func TestZombieOfDeletedGroupCannotClaim(t *testing.T) {
	t.Parallel()
	for _, proto := range []string{"classic", "consumer"} {
		for _, path := range []string{"no-row", "other-partition-bumped"} {
			t.Run(proto+"/"+path, func(t *testing.T) {
				t.Parallel()
				testZombieOfDeletedGroup(t, proto, path)
			})
		}
	}
}

func testZombieOfDeletedGroup(t *testing.T, proto, path string) {
	parts, held := int32(1), int32(0)
	if path == "other-partition-bumped" {
		parts, held = 2, 1
	}
	e := newEnv(t, parts)
	if e.real {
		t.Skip("slows the coordinator's answers to one member (kfake's ControlKey)")
	}
	for p := range parts {
		e.produceTo(p, jobsFor(keys, int(p)*100, 10)...)
	}
	// Epochs above what a new group starts at, with no fencing row yet.
	raiseEpochs(t, e, proto, 2)

	z := e.startWorker("Z", "--protocol", proto, "--hold-once", fmt.Sprintf("before-claim:%d", held))
	hold := z.waitLog(60*time.Second, map[string]any{"msg": "holding", "point": "before-claim"})
	zombie := z.waitLog(5*time.Second, map[string]any{"msg": consumer.MsgClaiming, "partition": held})["member"].(string)
	if held > 0 {
		// The claims of an assignment run at once: partition 0's may
		// still be on its way when partition 1's is held.
		z.waitLog(30*time.Second, map[string]any{"msg": consumer.MsgClaimed, "member": zombie, "partition": int32(0)})
	}
	t.Logf("Z (%s) confirmed and about to claim partition %d with token %v", zombie, held, hold["token"])
	z.pause()
	deleteGroupWhenEmpty(t, e)

	n := e.startWorker("N", "--protocol", proto)
	for p := range parts {
		waitCommitted(t, e, p, e.highWatermark(p), "")
	}
	nClaim := n.waitLog(5*time.Second, map[string]any{"msg": consumer.MsgClaimed, "partition": held})
	t.Logf("N claimed partition %d with token %v", held, nClaim["token"])

	// Z wakes. The coordinator answers its heartbeats late, so that it
	// does not learn of its eviction before its claim goes out: the claim
	// must be refused by Postgres, not saved by kgo winning a race.
	slow := e.slowHeartbeats(zombie, 2*time.Second)
	z.resume()
	z.waitLogAny(30*time.Second,
		map[string]any{"msg": consumer.MsgClaimFenced},
		map[string]any{"msg": consumer.MsgClaimFailed},
		map[string]any{"msg": consumer.MsgClaimed, "member": zombie, "partition": held})
	slow.Store(false)
	if m := z.findLog(map[string]any{"msg": consumer.MsgClaimed, "member": zombie, "partition": held}); m != nil {
		t.Errorf("the zombie's claim was accepted after the reset: token %v (N has %v)", m["token"], nClaim["token"])
	}

	// N goes on, unfenced.
	for p := range parts {
		e.produceTo(p, jobsFor(keys, int(p)*100+10, 5)...)
		waitCommitted(t, e, p, e.highWatermark(p), "")
	}
	if m := n.findLog(map[string]any{"fenced": true}); m != nil {
		t.Errorf("N was fenced: %v", m["error"])
	}
	n.stop(30 * time.Second)
	z.stop(30 * time.Second)
	all := []int32{0}
	if parts == 2 {
		all = append(all, 1)
	}
	h := checkRun(t, e, expect{partitions: all})
	after := false
	for _, en := range h.Log {
		after = after || (en.Owner == nClaim["member"] && en.Kind == "claim" && en.Partition.Partition == held)
		if after && en.Owner == zombie && en.Partition.Partition == held {
			t.Errorf("fence log #%d: %s by the zombie with token %s after N's claim", en.ID, en.Kind, en.Token)
		}
	}
}

// The same window without a paused process: Z's claim is slow in the
// network to Postgres (held by a proxy) while Z's heartbeats do not reach
// the coordinator, so Z is evicted while its claim is on the way. The
// group is deleted, N claims, and only then does Z's claim reach the
// server, which runs it although Z may have given up on it long ago. It
// must be rejected.
func TestZombieClaimDelayedInTheNetwork(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	if e.real {
		t.Skip("holds one member's heartbeats (kfake's ControlKey)")
	}
	e.produce(jobsFor(keys, 0, 10)...)
	raiseEpochs(t, e, "classic", 2)

	proxy, u := pgproxy.InFront(t, e.dbURL)
	q := u.Query()
	q.Set("default_query_exec_mode", "simple_protocol") // the claim's SQL in one message
	u.RawQuery = q.Encode()
	// The claim statement, and nothing else, inserts into the fencing table.
	// Z may give up on it; its cancel request is best-effort, and dropped
	// here so that the test does not depend on whether it comes in time.
	proxy.DropCancelRequests(true)
	claim := proxy.HoldMatching(`.fences AS f`)
	stall := e.holdHeartbeatsOnce()

	z := e.startWorker("Z", "--database-url", u.String())
	select {
	case <-claim.Held():
	case <-time.After(60 * time.Second):
		t.Fatal("Z's claim never reached the proxy")
	}
	zombie := z.waitLog(5*time.Second, map[string]any{"msg": consumer.MsgClaiming})["member"].(string)
	stall.hold(zombie)
	t.Logf("Z (%s) confirmed; its claim is held on the way to Postgres, its heartbeats at the coordinator", zombie)
	deleteGroupWhenEmpty(t, e)

	n := e.startWorker("N")
	waitCommitted(t, e, 0, e.highWatermark(0), "")
	nClaim := n.waitLog(5*time.Second, map[string]any{"msg": consumer.MsgClaimed})

	claim.Release()
	select {
	case <-claim.Forwarded():
	case <-time.After(10 * time.Second):
		t.Fatal("the held claim was not forwarded")
	}
	// Wait for the server to have run it, then end Z before it learns of
	// its eviction and joins the new group as a new member.
	waitFor(t, 10*time.Second, "the zombie's claim to have run", func() bool {
		var n int
		err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE query LIKE '%.fences AS f%' AND state <> 'idle' AND pid <> pg_backend_pid()`).Scan(&n)
		return err == nil && n == 0
	})
	z.kill()
	stall.release()
	e.produce(jobsFor(keys, 10, 5)...)
	waitCommitted(t, e, 0, e.highWatermark(0), "")
	if m := n.findLog(map[string]any{"fenced": true}); m != nil {
		t.Errorf("N was fenced: %v", m["error"])
	}
	h := checkStopped(t, e, n)
	for _, en := range h.Log {
		if en.Owner == zombie {
			t.Errorf("fence log #%d: %s by the zombie with token %s (N claimed with %v)", en.ID, en.Kind, en.Token, nClaim["token"])
		}
	}
}

// produceTo writes jobs to one partition.
func (e *env) produceTo(p int32, jobs ...[2]string) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	recs := make([]*kgo.Record, len(jobs))
	for i, j := range jobs {
		recs[i] = &kgo.Record{Topic: e.topic, Partition: p, Key: []byte(j[0]), Value: []byte(j[1])}
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		e.t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		e.t.Fatalf("producing to partition %d: %v", p, err)
	}
}

// raiseEpochs has n members join the group and leave it, one after the
// other, on a topic of their own: the group's epochs rise while none of the
// test topic's partitions is claimed.
func raiseEpochs(t *testing.T, e *env, proto string, n int) {
	t.Helper()
	other := e.topic + "-other"
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := kadm.NewClient(e.cl).CreateTopic(ctx, 1, 1, nil, other); err != nil {
		t.Fatalf("creating %s: %v", other, err)
	}
	for i := range n {
		opts := []kgo.Opt{kgo.SeedBrokers(e.brokers...), kgo.ConsumerGroup(e.group), kgo.ConsumeTopics(other),
			kgo.SessionTimeout(sessionTimeout), kgo.HeartbeatInterval(500 * time.Millisecond)}
		if proto == "consumer" {
			opts = append(opts, kgo.ServerSideBalancer())
		}
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			pctx, pcancel := context.WithTimeout(ctx, 200*time.Millisecond)
			cl.PollFetches(pctx)
			pcancel()
			if _, epoch := cl.GroupMetadata(); epoch > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("member %d of %d never joined the group", i+1, n)
			}
		}
		cl.Close() // leaves the group
	}
}

// slowHeartbeats delays the coordinator's answers to member's heartbeats
// (classic and KIP-848) by d while the returned switch is on.
func (e *env) slowHeartbeats(member string, d time.Duration) *atomic.Bool {
	on := new(atomic.Bool)
	on.Store(true)
	c := e.cluster
	for _, key := range []int16{int16(kmsg.Heartbeat), int16(kmsg.ConsumerGroupHeartbeat)} {
		c.ControlKey(key, func(req kmsg.Request) (kmsg.Response, error, bool) {
			c.KeepControl()
			if on.Load() && heartbeatOf(req) == member {
				c.SleepControl(func() { time.Sleep(d) })
			}
			return nil, nil, false
		})
	}
	return on
}

// heartbeatStall holds one member's heartbeats at the coordinator (it never
// sees them, and evicts the member) until released.
type heartbeatStall struct {
	member  atomic.Value // string
	release func()
}

func (e *env) holdHeartbeatsOnce() *heartbeatStall {
	s := &heartbeatStall{}
	s.member.Store("")
	released := make(chan struct{})
	var once atomic.Bool
	s.release = func() {
		if once.CompareAndSwap(false, true) {
			close(released)
		}
	}
	e.t.Cleanup(s.release)
	c := e.cluster
	for _, key := range []int16{int16(kmsg.Heartbeat), int16(kmsg.ConsumerGroupHeartbeat)} {
		c.ControlKey(key, func(req kmsg.Request) (kmsg.Response, error, bool) {
			c.KeepControl()
			if m := s.member.Load().(string); m != "" && heartbeatOf(req) == m {
				c.SleepControl(func() { <-released })
			}
			return nil, nil, false
		})
	}
	return s
}

func (s *heartbeatStall) hold(member string) { s.member.Store(member) }

// heartbeatOf is the member id a heartbeat request carries.
func heartbeatOf(req kmsg.Request) string {
	switch r := req.(type) {
	case *kmsg.HeartbeatRequest:
		return r.MemberID
	case *kmsg.ConsumerGroupHeartbeatRequest:
		return r.MemberID
	}
	return ""
}

// `tenure admin group delete` refuses a group with members, and for an empty
// one moves the incarnation on before deleting it: the next lifetime's first
// claim is already in the new incarnation.
func TestAdminGroupDelete(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	e.produce(jobsFor(keys, 0, 10)...)
	w := e.startWorker("W")
	waitCommitted(t, e, 0, 10, "")
	del := func() cliResult {
		return runCLI(t, 30*time.Second, "", "admin", "group", "delete", "--brokers", strings.Join(e.brokers, ","),
			"--database-url", e.dbURL, "--schema", e.schema, "--group", e.group, "--actor", "ops@example")
	}
	if r := del(); r.code != 1 || !strings.Contains(r.stderr, "has 1 member") || !strings.Contains(r.stderr, "nothing was changed") {
		t.Fatalf("deleting a group with a member: %s", r)
	}
	w.stop(30 * time.Second)
	r := del()
	if r.code != 0 || !strings.Contains(r.stdout, "its incarnation moved from 0 to 1, recorded as done by ops@example") {
		t.Fatalf("deleting the empty group: %s", r)
	}
	var by string
	if err := e.pool.QueryRow(context.Background(), `SELECT bumped_by FROM "`+e.schema+`".group_incarnations WHERE consumer_group = $1`, e.group).Scan(&by); err != nil || by != "ops@example" {
		t.Fatalf("incarnation row: bumped_by %q, %v", by, err)
	}
	e.produce(jobsFor(keys, 10, 5)...)
	n := e.startWorker("N")
	claimed := n.waitLog(60*time.Second, map[string]any{"msg": consumer.MsgClaimed})
	if claimed["token"] != "1.1" {
		t.Errorf("the new lifetime's first claim has token %v, want 1.1", claimed["token"])
	}
	waitCommitted(t, e, 0, 15, "")
	if m := n.findLog(map[string]any{"msg": consumer.IncarnationMovedOn}); m != nil {
		t.Errorf("N moved the incarnation on again: %v", m["reason"])
	}
	checkStopped(t, e, n)
}
