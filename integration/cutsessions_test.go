package integration

import (
	"context"
	"fmt"
	"maps"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/tenure-dev/tenure/internal/devbroker"
	"github.com/tenure-dev/tenure/internal/testinfra/netfault"
	"github.com/tenure-dev/tenure/internal/testinfra/pgtest"
	"github.com/tenure-dev/tenure/internal/testinfra/testdb"
	"github.com/tenure-dev/tenure/sink"
)

// A worker cut off from Postgres gives its connections up (a statement's
// deadline, TCP_USER_TIMEOUT, its keepalives), and its kernel's resets are
// dropped like everything else: the server is left with sessions whose
// client is gone. A session that had nothing to send learns it only from a
// keepalive, and the server's default (tcp_keepalives_idle 0: the OS's two
// hours) kept them, idle, each holding a connection slot and a backend,
// long after the network healed: the chaos run found two still open once
// every worker had stopped. The worker now asks the server for its own
// keepalives on each of its sessions (sink.SetNetworkTimeouts).
//
// The network namespace's forwarders cannot show this: the server's client
// would be the forwarder, which is never cut. So the server runs inside the
// worker's namespace (pgtest.NewIn) and the cut drops the packets between
// them; the test reads pg_stat_activity through the Unix socket.
func TestSessionsOfAWorkerCutOffFromPostgresEnd(t *testing.T) {
	t.Parallel()
	e, ns, pg := newCutSessionsEnv(t)
	w := e.startWorkerIn(ns, "CUT")
	waitForMembers(t, e, 1)
	prod := e.produceInRounds(1000, 10, 100*time.Millisecond)
	e.waitForMoreCommits(100, 60*time.Second, w)

	sessions := func() map[cutSession]string { return workerSessions(t, e) }
	before := sessions()
	if len(before) == 0 {
		t.Fatal("the worker has no sessions")
	}

	// Longer than the worker's own bounds (TCP_USER_TIMEOUT 10s, keepalives
	// 11s, the database timeout 10s): it gives every one of them up.
	const cut = 15 * time.Second
	if err := ns.Inject(netfault.Cut(pg.Port)); err != nil {
		t.Fatal(err)
	}
	cutAt := time.Now()
	ended := map[cutSession]time.Duration{}
	for time.Since(cutAt) < cut {
		time.Sleep(500 * time.Millisecond)
		now := sessions()
		for s := range before {
			if _, ok := now[s]; !ok {
				if _, seen := ended[s]; !seen {
					ended[s] = time.Since(cutAt).Round(100 * time.Millisecond)
				}
			}
		}
	}
	var left []string
	for s, what := range sessions() {
		if _, ok := before[s]; ok {
			left = append(left, what)
		}
	}
	t.Logf("of the worker's %d sessions from before the cut, %d ended during the %s cut (after %v), %d still open: %v",
		len(before), len(ended), cut, slices.Sorted(maps.Values(ended)), len(left), left)
	if len(left) > 0 {
		// The server's sockets: their keepalive timer says when it would look.
		out, _ := exec.Command("ip", "netns", "exec", ns.Name(), "ss", "-tnoH", "state", "established", fmt.Sprintf("( sport = :%d )", pg.Port)).CombinedOutput()
		t.Logf("the server's sockets at the end of the cut:\n%s", out)
	}
	if err := ns.Heal(); err != nil {
		t.Fatal(err)
	}
	healed := time.Now()

	// With the worker's keepalives the server ends each within about 11s
	// of its last packet, or at the first probe after the heal (the
	// worker's kernel answers it with a reset); a session whose answer was
	// in flight ends by TCP_USER_TIMEOUT, or at the first retransmission
	// after the heal. Without them, an idle one stays for two hours.
	const within = 20 * time.Second
	for {
		left = left[:0]
		for s, what := range sessions() {
			if _, ok := before[s]; ok {
				left = append(left, what)
			}
		}
		if len(left) == 0 {
			t.Logf("every session from before the cut ended by %s after the heal", time.Since(healed).Round(100*time.Millisecond))
			break
		}
		if time.Since(healed) > within {
			t.Fatalf("%d of the worker's sessions from before the cut are still open %s after the %s cut healed: %v",
				len(left), within, cut, left)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The worker itself came back: its new sessions commit again.
	w.waitLog(30*time.Second, map[string]any{"msg": "the database answers again: joining the group"})
	e.waitForMoreCommits(50, 60*time.Second, w)
	prod.stop()
}

// newCutSessionsEnv is newEnv with the worker's network namespace, and a
// throwaway PostgreSQL inside it.
func newCutSessionsEnv(t *testing.T) (*env, *netfault.Namespace, *pgtest.Cluster) {
	t.Helper()
	br := startBroker(t, devbroker.Config{})
	e := &env{t: t, brokers: br.ListenAddrs(), cluster: br}
	ns, err := netfault.NewT(t, e.services().Kafka...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pg, err := pgtest.NewIn(ctx, ns.Name())
	if err != nil {
		t.Fatalf("throwaway PostgreSQL in %s: %v", ns.Name(), err)
	}
	t.Cleanup(func() {
		if err := pg.Close(); err != nil {
			t.Logf("removing throwaway PostgreSQL: %v", err)
		}
	})
	e.pool = testPool(t, ctx, pg.SocketURL()) // closed before the cluster is removed
	e.schema = testdb.NewSchemaName("tenure_cutsess")
	if _, err := sink.Migrate(ctx, e.pool, e.schema); err != nil {
		t.Fatal(err)
	}
	e.dbURL = pg.URL() // inside the namespace, 127.0.0.1 is the server's
	e.createTopic(3)
	return e, ns, pg
}

// cutSession is a server session, by its backend's pid and start.
type cutSession struct {
	pid     int32
	started time.Time
}

// workerSessions describes the server's TCP sessions: every TCP client of
// the server is the worker (the test's own connections use the Unix
// socket).
func workerSessions(t *testing.T, e *env) map[cutSession]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rows, err := e.pool.Query(ctx, `SELECT a.pid, a.backend_start, coalesce(a.state, ''), a.backend_xid IS NOT NULL,
		(SELECT count(*) FROM pg_locks l WHERE l.pid = a.pid), round(extract(epoch FROM now() - a.state_change)::numeric, 1)
		FROM pg_stat_activity a WHERE a.backend_type = 'client backend' AND a.client_addr IS NOT NULL`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[cutSession]string{}
	for rows.Next() {
		var s cutSession
		var state string
		var xid bool
		var locks int64
		var idleFor float64
		if err := rows.Scan(&s.pid, &s.started, &state, &xid, &locks, &idleFor); err != nil {
			t.Fatal(err)
		}
		out[s] = fmt.Sprintf("pid %d %s for %.1fs, xid %v, %d locks", s.pid, state, idleFor, xid, locks)
	}
	return out
}
