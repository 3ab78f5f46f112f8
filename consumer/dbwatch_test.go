package consumer_test

import (
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/internal/testinfra/pgproxy"
)

// A worker whose database stops answering without a reset (here a proxy
// that stops forwarding bytes in both directions and closes nothing: a
// vanished host, a dropping firewall) still heartbeats to Kafka, so before
// the database watch the coordinator left its partitions with it for as long
// as the cut lasted, idle beside a healthy worker. Now it gives them up
// after DatabaseTimeout, the healthy worker processes them, and the cut-off
// worker joins again once its database answers.
func TestWorkerCutOffFromItsDatabaseGivesItsPartitionsUp(t *testing.T) {
	t.Parallel()
	b, key, proxy, cfg := watchedSetup(t, 6, 4*time.Second, 2*time.Second)
	cutCfg := cfg
	cutCfg.ClientID = "cut"
	cut, stopCut := runNew(t, cutCfg)
	cfg.Store = b.store // the healthy worker's database answers throughout
	healthy, _ := runNew(t, cfg)
	b.waitDone(60 * time.Second)
	waitForCond(t, 30*time.Second, "both workers to hold partitions", func() bool {
		return cut.Stats().Lanes > 0 && healthy.Stats().Lanes > 0
	})

	proxy.Stall(true)
	cutAt := time.Now()
	b.produce(120, key) // jobs for every partition, the cut-off worker's included
	b.waitDone(60 * time.Second)
	took := time.Since(cutAt)
	t.Logf("every partition processed %s after the cut (database timeout %s)", took.Round(time.Millisecond), cfg.DatabaseTimeout)
	if st := cut.Stats(); st.StepDowns != 1 || st.SteppedDown != 1 || st.Lanes != 0 {
		t.Errorf("cut-off worker: %d step-downs, stepped down %d, %d lanes; want 1, 1, 0", st.StepDowns, st.SteppedDown, st.Lanes)
	}
	// The time a member needs to rejoin after another leaves, beside the
	// database timeout, bounds it (session timeout 3s here).
	if limit := cfg.DatabaseTimeout + 15*time.Second; took > limit {
		t.Errorf("the cut-off worker's partitions took %s to be processed, want within %s", took, limit)
	}

	proxy.Stall(false)
	waitRejoined(t, cut, 30*time.Second, "the worker to join again and hold partitions")
	b.produce(120, key)
	b.waitDone(60 * time.Second)
	if err := stopCut(); err != nil {
		t.Fatal(err)
	}
	b.check()
}

// A database down for everyone: every worker steps down once, none flaps
// (joins and leaves again) while it is down, and they all join again and
// process everything once it answers.
func TestDatabaseDownForEveryoneDoesNotFlap(t *testing.T) {
	t.Parallel()
	b, key, proxy, cfg := watchedSetup(t, 4, 3*time.Second, 2*time.Second)
	var ws []*consumer.Consumer
	for i := range 2 {
		cfg.ClientID = fmt.Sprintf("w%d", i)
		c, _ := runNew(t, cfg)
		ws = append(ws, c)
	}
	b.waitDone(60 * time.Second)
	proxy.Stall(true)
	b.produce(80, key)
	waitForCond(t, 30*time.Second, "both workers to step down", func() bool {
		return ws[0].Stats().SteppedDown == 1 && ws[1].Stats().SteppedDown == 1
	})
	time.Sleep(3 * cfg.DatabaseTimeout) // long enough to flap a few times, were it to
	for i, w := range ws {
		if st := w.Stats(); st.StepDowns != 1 || st.SteppedDown != 1 {
			t.Errorf("worker %d while the database is down: %d step-downs, stepped down %d; want 1 and 1", i, st.StepDowns, st.SteppedDown)
		}
	}
	proxy.Stall(false)
	// Each worker's probe finds the database back on its own schedule: the
	// first to rejoin may process everything before the other notices, so
	// the jobs being done says nothing of the other worker (CI saw it).
	for i, w := range ws {
		waitRejoined(t, w, 30*time.Second, fmt.Sprintf("worker %d to join again and hold partitions", i))
	}
	b.waitDone(60 * time.Second)
	for i, w := range ws {
		if st := w.Stats(); st.StepDowns != 1 || st.SteppedDown != 0 {
			t.Errorf("worker %d after the database is back: %d step-downs, stepped down %d; want 1 and 0", i, st.StepDowns, st.SteppedDown)
		}
	}
	b.check()
}

// watchConfig is the config of a worker on the ledger that logs warnings,
// whose database watch steps down after database and whose commits give
// up after commit.
func (b *bundle) watchConfig(database, commit time.Duration) consumer.Config {
	cfg := b.config(ledger(b.t, b.schema), zaptest.NewLogger(b.t, zaptest.Level(zap.WarnLevel)))
	cfg.DatabaseTimeout = database
	cfg.CommitTimeout = commit
	return cfg
}

// watchedSetup is a bundle of partitions with ten keys a partition (key)
// and two jobs a key produced, and the watchConfig (database and commit
// timeouts) of a worker whose store reaches the database through proxy,
// listed after the hosts before (proxiedStoreAfter).
func watchedSetup(t *testing.T, partitions int32, database, commit time.Duration, before ...string) (b *bundle, key func(i int) string, proxy *pgproxy.Proxy, cfg consumer.Config) {
	t.Helper()
	b = setup(t, partitions)
	keys := 10 * int(partitions)
	key = func(i int) string { return fmt.Sprintf("k%d", i%keys) }
	b.produce(2*keys, key)
	proxy, store := proxiedStoreAfter(t, b, before...)
	cfg = b.watchConfig(database, commit)
	cfg.Store = store
	return b, key, proxy, cfg
}

// waitRejoined waits, within timeout, for w to be stepped down no more and
// hold partitions (what, if it does not).
func waitRejoined(t *testing.T, w *consumer.Consumer, timeout time.Duration, what string) {
	t.Helper()
	waitForCond(t, timeout, what, func() bool {
		st := w.Stats()
		return st.SteppedDown == 0 && st.Lanes > 0
	})
}

// The derivation of the default: the session timeout, at least 10s.
func TestDefaultDatabaseTimeout(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ session, want time.Duration }{
		{0, 45 * time.Second}, {6 * time.Second, 10 * time.Second}, {30 * time.Second, 30 * time.Second},
	} {
		if got := consumer.DefaultDatabaseTimeout(c.session); got != c.want {
			t.Errorf("DefaultDatabaseTimeout(%s) = %s, want %s", c.session, got, c.want)
		}
	}
}

// A multi-host URL (postgres://db1,db2/...?connect_timeout=2) whose first
// host is gone without a reset, as an old primary's host after a failover:
// every new connection spends connect_timeout on it before it reaches the
// second. The database watch's probe once counted its dial in its 2s
// answer budget, so it never got past the first host: a worker that had
// stepped down never joined the group again, while its own pool reached
// the second host. Here the worker is cut off (the second host stalls),
// steps down, and must join again once the second host answers.
func TestWorkerRejoinsThroughAMultiHostURL(t *testing.T) {
	t.Parallel()
	b, key, proxy, cfg := watchedSetup(t, 4, 5*time.Second, 3*time.Second, tarpit(t))
	w, _ := runNew(t, cfg)
	b.waitDone(60 * time.Second)
	proxy.Stall(true)
	waitForCond(t, 30*time.Second, "the worker to step down", func() bool { return w.Stats().SteppedDown == 1 })
	proxy.Stall(false)
	waitRejoined(t, w, 40*time.Second, "the worker to join the group again through the second host")
	b.produce(80, key)
	b.waitDone(60 * time.Second)
	b.check()
}

// tarpit returns the address of a listener that accepts connections and
// never answers on them: a host whose packets are dropped, as a client
// past its TCP handshake sees it (waiting for the server's first message).
func tarpit(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return ln.Addr().String()
}
