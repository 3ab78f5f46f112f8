package consumer

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tenure-dev/tenure/internal/devbroker"
	"github.com/tenure-dev/tenure/internal/testinfra/testdb"
	"github.com/tenure-dev/tenure/sink"
)

// shortLiveness shortens the liveness timings for one test. The tests that
// call it do not run in parallel: the timings are the package's.
func shortLiveness(t *testing.T) {
	t.Helper()
	hb, silent, stuck, watch := heartbeatEvery, silentAfter, stuckAfter, groupWatchEvery
	heartbeatEvery, silentAfter, stuckAfter, groupWatchEvery = 200*time.Millisecond, 2*time.Second, 2*time.Second, 300*time.Millisecond
	t.Cleanup(func() { heartbeatEvery, silentAfter, stuckAfter, groupWatchEvery = hb, silent, stuck, watch })
}

// liveWorld is a broker, a schema and a client for the liveness tests.
type liveWorld struct {
	t       *testing.T
	c       *kfake.Cluster
	store   *sink.Store
	cl      *kgo.Client
	adm     *kadm.Client
	group   string
	ctx     context.Context
	brokers []string
}

func newLiveWorld(t *testing.T, topics map[string]int32) *liveWorld {
	t.Helper()
	c, err := devbroker.Start(devbroker.Config{ConsumerSessionTimeout: 3 * time.Second, ConsumerHeartbeat: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	pool := testdb.Pool(t)
	schema := testdb.Schema(t, pool)
	store, err := sink.NewStore(pool, schema)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	w := &liveWorld{t: t, c: c, store: store, cl: cl, adm: kadm.NewClient(cl), group: "g-" + schema, ctx: ctx, brokers: c.ListenAddrs()}
	for topic, n := range topics {
		if _, err := w.adm.CreateTopic(ctx, n, 1, nil, topic); err != nil {
			t.Fatal(err)
		}
	}
	return w
}

func (w *liveWorld) produce(topic string, p int32, values ...string) {
	w.t.Helper()
	recs := make([]*kgo.Record, len(values))
	for i, v := range values {
		recs[i] = &kgo.Record{Topic: topic, Partition: p, Value: []byte(v)}
	}
	if err := w.cl.ProduceSync(w.ctx, recs...).FirstErr(); err != nil {
		w.t.Fatal(err)
	}
}

// run starts a worker of the group on topics; it stops when the test ends.
func (w *liveWorld) run(h Handler, topics ...string) *Consumer {
	w.t.Helper()
	return w.start(Config{Topics: topics, Handler: h, ClientID: "live"})
}

// start starts a worker of the group with cfg (its topics, handler, and
// what else the test sets), on the world's broker and store with short
// session and rebalance timeouts; it stops when the test ends.
func (w *liveWorld) start(cfg Config) *Consumer {
	w.t.Helper()
	cfg.Brokers, cfg.Group, cfg.Store = w.brokers, w.group, w.store
	cfg.SessionTimeout, cfg.RebalanceTimeout = 3*time.Second, 5*time.Second
	cons, err := New(cfg)
	if err != nil {
		w.t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cons.Run(ctx) }()
	w.t.Cleanup(func() {
		stop()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			w.t.Error("consumer did not stop")
		}
	})
	return cons
}

func (w *liveWorld) describe(topics ...string) map[string]map[int32]Assignment {
	w.t.Helper()
	rows, err := Describe(w.ctx, w.cl, w.store, w.group, topics)
	if err != nil {
		w.t.Fatal(err)
	}
	out := map[string]map[int32]Assignment{}
	for _, r := range rows {
		if out[r.Topic] == nil {
			out[r.Topic] = map[int32]Assignment{}
		}
		out[r.Topic][r.Partition] = r
	}
	return out
}

// waitRows describes the group until cond holds of its rows, for up to
// timeout; an error of Describe on the way is one more try (the group is
// still forming), and the last one is reported if cond never holds.
func (w *liveWorld) waitRows(timeout time.Duration, what string, cond func([]Assignment) bool) []Assignment {
	w.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		rows, err := Describe(w.ctx, w.cl, w.store, w.group, nil)
		if err == nil && cond(rows) {
			return rows
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("no %s within %s: err %v, rows %+v", what, timeout, err, rows)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (w *liveWorld) waitDescribe(timeout time.Duration, what string, cond func(map[string]map[int32]Assignment) bool, topics ...string) map[string]map[int32]Assignment {
	w.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		rows := w.describe(topics...)
		if cond(rows) {
			return rows
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("no %s within %s: %+v", what, timeout, rows)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func stuckIn(c *Consumer, topic string, p int32, state State) *Stuck {
	for _, s := range c.Stuck() {
		if s.Topic == topic && s.Partition == p && s.State == state {
			return &s
		}
	}
	return nil
}

// A live owner whose lane does not commit while jobs wait (its handler
// blocks) is not-progressing once nothing has moved for stuckAfter and
// its oldest waiting job is that old; the worker's own group watch
// reports it (Stuck). A partition whose owner was idle for longer than
// stuckAfter and has just been given a job is ok: its oldest job is
// young.
func TestDescribeNotProgressing(t *testing.T) {
	shortLiveness(t)
	w := newLiveWorld(t, map[string]int32{"jobs": 2})
	release := make(chan struct{})
	h := HandlerFunc(func(ctx context.Context, _ Tx, b *Batch) error {
		for _, r := range b.Records {
			switch string(r.Value) {
			case "block":
				select {
				case <-release:
				case <-ctx.Done():
				}
			case "slow":
				select {
				case <-time.After(3 * time.Second):
				case <-ctx.Done():
				}
			}
		}
		return nil
	})
	cons := w.run(h, "jobs")
	t.Cleanup(func() { close(release) }) // before the worker stops: its lane waits for the handler
	w.produce("jobs", 0, "a", "b")
	w.produce("jobs", 1, "a")
	w.waitDescribe(60*time.Second, "both partitions claimed and done", func(r map[string]map[int32]Assignment) bool {
		return r["jobs"][0].State == StateOK && *r["jobs"][0].Lag == 0 && r["jobs"][1].State == StateOK && r["jobs"][1].Lag != nil && *r["jobs"][1].Lag == 0
	}, "jobs")

	// Partition 0's handler blocks on its next batch; jobs pile up behind.
	w.produce("jobs", 0, "block", "c", "d")
	start := time.Now()
	rows := w.waitDescribe(stuckAfter+15*time.Second, "partition 0 not-progressing", func(r map[string]map[int32]Assignment) bool {
		return r["jobs"][0].State == StateNotProgressing
	}, "jobs")
	if took := time.Since(start); took < stuckAfter {
		t.Errorf("not-progressing after %s, before stuckAfter (%s)", took, stuckAfter)
	}
	p0 := rows["jobs"][0]
	for _, want := range []string{"no commit for ", "with 3 jobs waiting, the oldest for ", "owner " + p0.MemberID + " is alive (heartbeat "} {
		if !strings.Contains(p0.Reason, want) {
			t.Errorf("reason %q lacks %q", p0.Reason, want)
		}
	}
	if p0.Since == nil || p0.ForSeconds == nil || *p0.ForSeconds < int64(stuckAfter/time.Second) {
		t.Errorf("since %v for %v", p0.Since, p0.ForSeconds)
	}
	if rows["jobs"][1].State != StateOK {
		t.Errorf("partition 1 is idle with nothing waiting: %+v", rows["jobs"][1])
	}
	waitForStuck(t, cons, "jobs", 0, StateNotProgressing)

	// Partition 1 has been idle for longer than stuckAfter; its new job
	// takes its handler 3 s. While it runs, the fencing row has not moved
	// for long, but the job waiting is young: ok.
	time.Sleep(stuckAfter)
	w.produce("jobs", 1, "slow")
	r := w.describe("jobs")["jobs"][1]
	if r.Lag == nil || *r.Lag != 1 {
		t.Fatalf("the slow job should still be waiting: %+v", r)
	}
	if r.State != StateOK || r.Reason != "" || r.Since != nil {
		t.Errorf("an idle owner just given a job is ok: %+v", r)
	}
}

func waitForStuck(t *testing.T, c *Consumer, topic string, p int32, state State) *Stuck {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if s := stuckIn(c, topic, p, state); s != nil {
			if s.For <= 0 || s.Lag == nil || *s.Lag <= 0 || s.Group == "" {
				t.Errorf("stuck entry: %+v", s)
			}
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("the worker's group watch did not report %s/%d %s within 30s: %+v", topic, p, state, c.Stuck())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A partition no member is assigned, with jobs waiting, shows unowned with
// a lag, even without a fencing row (from the log's start, or from the
// group's committed offset in Kafka), the reason and how long (since the
// oldest waiting job). A partition added to the running group's topic is
// reported by the worker's group watch with its lag.
func TestDescribeUnownedWithJobs(t *testing.T) {
	shortLiveness(t)
	w := newLiveWorld(t, map[string]int32{"jobs": 1, "other": 2})
	w.produce("other", 0, "1", "2", "3", "4", "5")
	produced := time.Now()
	w.produce("other", 1, "1", "2")

	// Nobody in the group yet: no members.
	rows := w.describe("other")["other"]
	r := rows[0]
	if r.State != StateUnowned || r.Lag == nil || *r.Lag != 5 || r.NextOffset != nil {
		t.Fatalf("never claimed, nobody in the group: %+v", r)
	}
	if !strings.Contains(r.Reason, "no member of the group is assigned the partition; 5 jobs waiting, the oldest for ") ||
		!strings.Contains(r.Reason, "the group has no members") {
		t.Errorf("reason: %q", r.Reason)
	}
	if r.Since == nil || r.Since.Before(produced.Add(-2*time.Second)) || r.Since.After(time.Now().Add(time.Second)) {
		t.Errorf("since %v: the oldest job was produced at %v", r.Since, produced)
	}
	// The group committed offset 3 in Kafka (a group moving to tenure):
	// its first claim would start there.
	if err := w.adm.CommitAllOffsets(w.ctx, w.group, kadm.Offsets{"other": {0: {Topic: "other", Partition: 0, At: 3, LeaderEpoch: -1}}}); err != nil {
		t.Fatal(err)
	}
	if r := w.describe("other")["other"][0]; r.Lag == nil || *r.Lag != 2 {
		t.Errorf("with a committed offset of 3 of 5: %+v", r)
	}

	// A worker that consumes "jobs" only: "other" is unowned because no
	// member consumes it.
	cons := w.run(HandlerFunc(func(context.Context, Tx, *Batch) error { return nil }), "jobs")
	w.waitDescribe(60*time.Second, "jobs/0 claimed", func(r map[string]map[int32]Assignment) bool {
		return r["jobs"][0].State == StateOK
	}, "jobs")
	r = w.describe("jobs", "other")["other"][1]
	if r.State != StateUnowned || *r.Lag != 2 || !strings.Contains(r.Reason, "no member of the group consumes topic other") {
		t.Errorf("other/1 with a member that consumes jobs only: %+v", r)
	}

	// A partition added to jobs, with jobs on it: the worker's watch
	// reports it, unowned (until the members see it) or held (the topic's
	// count changed), with a lag either way.
	if _, err := w.adm.CreatePartitions(w.ctx, 1, "jobs"); err != nil {
		t.Fatal(err)
	}
	w.produce("jobs", 1, "x", "y", "z")
	deadline := time.Now().Add(30 * time.Second)
	for {
		var s *Stuck
		for _, st := range cons.Stuck() {
			if st.Topic == "jobs" && st.Partition == 1 {
				s = &st
			}
		}
		if s != nil && s.Lag != nil && *s.Lag == 3 && (s.State == StateUnowned || s.State == StateHeldPartitions) {
			t.Logf("the new partition: %s for %s, %q", s.State, s.For, s.Reason)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the new partition was not reported with its lag: %+v", cons.Stuck())
		}
		time.Sleep(50 * time.Millisecond)
	}

	// A schema from before the heartbeats (a newer admin binary than the
	// workers' schema): Describe goes on without them.
	if _, err := w.store.Pool().Exec(w.ctx, `DROP TABLE `+pgx.Identifier{w.store.Schema()}.Sanitize()+`.workers`); err != nil {
		t.Fatal(err)
	}
	if r := w.describe("other")["other"][0]; r.State != StateUnowned || r.Lag == nil {
		t.Errorf("without the workers table: %+v", r)
	}
}
