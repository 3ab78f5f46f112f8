package integration

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tenure-dev/tenure/internal/testinfra/netfault"
)

// shortFaultBound is how soon after a fault shorter than the session
// timeout ends the worker must commit each of its partitions again. What
// it waits for is TCP's retransmission timer, which doubles from 200ms
// while packets are lost: a connection carries data again at its first
// retransmission after the heal (measured: 0.3s to 1.7s after cuts of 1s
// to 2.5s; docs/fencing.md, "A network that drops").
const shortFaultBound = 5 * time.Second

// A fault shorter than the session timeout moves nothing: the coordinator
// keeps the member, the fencing rows keep its claims, and once the fault
// ends the worker commits each of its partitions again within
// shortFaultBound, with the claim it had. (The chaos soak listed two
// partitions committed again only 19.5s and 20.2s after a pause; those
// pauses, 4.2s and 4.3s, were longer than the 3s session timeout, and the
// time was kfake's: docs/fencing.md, "In-flight work".)
func TestShortFaultsMoveNothing(t *testing.T) {
	t.Parallel()
	e, ns, svc := newNamespacedEnv(t, 4)
	common := []string{"--fence-log-max-age", "-1s", "--fence-log-max-entries", "-1"}
	w := e.startWorkerIn(ns, "SHORT", common...)
	e.startWorker("OTHER", common...)
	waitForMembers(t, e, 2)
	stop := e.produceSteadily(t, 4, 50*time.Millisecond)
	defer stop()
	member := memberOf(t, w)
	waitFor(t, 30*time.Second, "both workers to hold partitions", func() bool {
		n := len(e.claimsOf(t, member))
		return n > 0 && n < 4
	})

	// Under the 3s session timeout with heartbeats every second: a fault
	// that stops the worker's heartbeats lasts at most 1.5s.
	for _, f := range []struct {
		name string
		d    time.Duration
		kind netfault.Kind // 0: SIGSTOP
	}{
		{"SIGSTOP", 1500 * time.Millisecond, 0},
		{"cut from Postgres", 2500 * time.Millisecond, netfault.PostgresCut},
		{"Postgres's answers dropped", 2500 * time.Millisecond, netfault.PostgresOneWay},
		{"cut from the broker", 1500 * time.Millisecond, netfault.KafkaCut},
		{"the broker's answers dropped", 1500 * time.Millisecond, netfault.KafkaOneWay},
		{"cut from both", 1500 * time.Millisecond, netfault.FullCut},
	} {
		held := e.claimsOf(t, member)
		if len(held) == 0 {
			t.Fatalf("before the %s the worker holds no partition", f.name)
		}
		if f.kind == 0 {
			w.pause()
		} else if err := ns.Inject(svc.Faults(f.kind)...); err != nil {
			t.Fatal(err)
		}
		time.Sleep(f.d)
		if f.kind == 0 {
			w.resume()
		} else if err := ns.Heal(); err != nil {
			t.Fatal(err)
		}
		end := time.Now()
		var took []string
		for _, p := range slices.Sorted(maps.Keys(held)) {
			var at time.Time
			var claim int64
			waitFor(t, shortFaultBound+10*time.Second, fmt.Sprintf("a commit of partition %d after the %s", p, f.name), func() bool {
				var ok bool
				at, claim, ok = e.firstCommitAfter(t, p, end)
				return ok
			})
			if claim != held[p] {
				t.Errorf("%s of %s: partition %d was next committed by claim %d, not by the worker's claim %d: it moved", f.name, f.d, p, claim, held[p])
			}
			if d := at.Sub(end); d > shortFaultBound {
				t.Errorf("%s of %s: partition %d committed again only %s after the fault ended (bound %s)", f.name, f.d, p, d.Round(time.Millisecond), shortFaultBound)
			}
			took = append(took, fmt.Sprintf("%d +%s", p, at.Sub(end).Round(time.Millisecond)))
		}
		t.Logf("%s of %s: each partition committed again after the end: %v", f.name, f.d, took)
		time.Sleep(2 * time.Second)
	}
}

// claimsOf maps the partitions whose fencing row names member to their
// claim ids.
func (e *env) claimsOf(t *testing.T, member string) map[int32]int64 {
	t.Helper()
	return queryMap[int32, int64](t, e, `SELECT partition, claim_id FROM "`+e.schema+`".fences WHERE consumer_group = $1 AND owner = $2`, e.group, member)
}

// firstCommitAfter is the time and claim id of the first commit of
// partition p after since (the fence log).
func (e *env) firstCommitAfter(t *testing.T, p int32, since time.Time) (time.Time, int64, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var at time.Time
	var claim int64
	err := e.pool.QueryRow(ctx, `SELECT at, claim_id FROM "`+e.schema+`".fence_log
		WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND kind = 'commit' AND at > $4 ORDER BY id LIMIT 1`,
		e.group, e.topic, p, since).Scan(&at, &claim)
	if err != nil {
		return time.Time{}, 0, false
	}
	return at, claim, true
}

// produceSteadily writes a job to each of the partitions every interval
// until the returned function is called.
func (e *env) produceSteadily(t *testing.T, partitions int32, every time.Duration) func() {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for seq := 0; ; seq++ {
			select {
			case <-quit:
				return
			case <-tick.C:
			}
			recs := make([]*kgo.Record, partitions)
			for p := range partitions {
				recs[p] = &kgo.Record{Topic: e.topic, Partition: p, Key: []byte(keys[seq%len(keys)]), Value: fmt.Appendf(nil, `{"seq":%d}`, seq)}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_ = cl.ProduceSync(ctx, recs...).FirstErr() // a failed round is a gap in the load, nothing more
			cancel()
		}
	}()
	var once bool
	stop := func() {
		if !once {
			once = true
			close(quit)
			<-done
			cl.Close()
		}
	}
	t.Cleanup(stop)
	return stop
}
