// Package pgha runs a throwaway pg_auto_failover formation for tests: a
// monitor, a primary and a standby, each its own PostgreSQL server on its own
// loopback port, in a temp dir, managed by pg_autoctl (Debian's
// postgresql-N-auto-failover). Tests kill the primary and watch the
// formation fail over; nothing of the machine's own servers is touched.
//
// As in internal/testinfra/pgtest, initdb refuses to run as root, so when the test
// runs as root every pg_autoctl process runs as the "postgres" OS user (its
// credentials set on the process, no runuser in between: the harness knows
// the PID of every process it started). Authentication is trust on
// loopback, TLS is off (--no-ssl), and pg_autoctl's own files (config,
// state, PID files) live under the formation's temp dir (XDG_* variables),
// not in the postgres user's home.
//
// The standby is synchronous by default (pg_auto_failover's
// replication-quorum true: the primary runs with synchronous_standby_names
// 'ANY 1 (...)' and the default synchronous_commit on, so a COMMIT is
// acknowledged only once the standby has it). Config.Async, or
// SetReplicationQuorum, makes it asynchronous; FreezeReplication stops the
// primary's WAL sender (SIGSTOP) so that the standby falls behind.
//
// The monitor's and the keepers' timeouts are shortened (TestTimeouts) so
// that a failover after the primary's death takes seconds, not the default
// half minute or more, while keeping the order that makes pg_auto_failover's
// failover safe: the monitor waits longer before promoting (primary demote
// timeout) than a primary cut off from the monitor and its standby waits
// before demoting itself (network partition timeout).
package pgha

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tenure-dev/tenure/internal/childproc"
	"github.com/tenure-dev/tenure/internal/testinfra/freeport"
)

// ErrUnavailable is returned by New when pg_autoctl or the pgautofailover
// extension is not installed on the machine.
var ErrUnavailable = errors.New("pg_auto_failover is not installed (pg_autoctl and the pgautofailover extension: Debian's postgresql-N-auto-failover package; scripts/test.sh installs it)")

// Timeouts are the formation's failover timings: the monitor's settings
// (pgautofailover.* in the monitor's postgresql.conf) and the keepers'
// ([timeout] in each data node's pg_autoctl.cfg).
type Timeouts struct {
	// Monitor: how often and how patiently it checks each node's Postgres.
	HealthCheckPeriod     time.Duration // pgautofailover.health_check_period
	HealthCheckTimeout    time.Duration // pgautofailover.health_check_timeout (connect timeout)
	HealthCheckMaxRetries int           // pgautofailover.health_check_max_retries
	HealthCheckRetryDelay time.Duration // pgautofailover.health_check_retry_delay
	// Monitor: a node whose keeper has not reported for this long, and whose
	// Postgres fails its health check, is unhealthy: failover starts.
	NodeConsideredUnhealthy time.Duration // pgautofailover.node_considered_unhealthy_timeout
	// Monitor: how long it waits for a failed primary to acknowledge its
	// demotion before the standby becomes writable. Must be longer than
	// NetworkPartition, so that a primary that is alive but cut off has
	// demoted itself before the standby takes writes.
	PrimaryDemote time.Duration // pgautofailover.primary_demote_timeout
	// Monitor: no failover in the first moments after the monitor starts.
	StartupGrace time.Duration // pgautofailover.startup_grace_period

	// Keeper: a primary that can reach neither the monitor nor a standby
	// for this long demotes itself (whole seconds).
	NetworkPartition time.Duration // timeout.network_partition_timeout
	// Keeper: how long a standby being promoted waits for its WAL receiver
	// to stop, and to catch up, before it promotes (whole seconds).
	PreparePromotionWalreceiver time.Duration // timeout.prepare_promotion_walreceiver
	PreparePromotionCatchup     time.Duration // timeout.prepare_promotion_catchup
}

// DefaultTimeouts are pg_auto_failover 2.0's own defaults (the monitor's
// GUCs and the keeper's [timeout] section): with them a primary's death is
// followed by a writable standby after about 50 seconds.
func DefaultTimeouts() Timeouts {
	return Timeouts{
		HealthCheckPeriod: 5 * time.Second, HealthCheckTimeout: 5 * time.Second,
		HealthCheckMaxRetries: 2, HealthCheckRetryDelay: 2 * time.Second,
		NodeConsideredUnhealthy: 20 * time.Second, PrimaryDemote: 30 * time.Second,
		StartupGrace:     10 * time.Second,
		NetworkPartition: 20 * time.Second, PreparePromotionWalreceiver: 5 * time.Second,
		PreparePromotionCatchup: 30 * time.Second,
	}
}

// TestTimeouts are the shortened timings the harness uses by default. On
// loopback a health check answers in milliseconds and a keeper reports every
// second, so detection can be quick; PrimaryDemote stays 2s above
// NetworkPartition. A primary killed outright is followed by a writable
// standby after about 8 seconds (docs/fencing.md has the measured times).
func TestTimeouts() Timeouts {
	return Timeouts{
		HealthCheckPeriod: time.Second, HealthCheckTimeout: time.Second,
		HealthCheckMaxRetries: 1, HealthCheckRetryDelay: 500 * time.Millisecond,
		NodeConsideredUnhealthy: 3 * time.Second, PrimaryDemote: 4 * time.Second,
		StartupGrace:     3 * time.Second,
		NetworkPartition: 2 * time.Second, PreparePromotionWalreceiver: 2 * time.Second,
		PreparePromotionCatchup: 10 * time.Second,
	}
}

func (t Timeouts) validate() error {
	if t.PrimaryDemote <= t.NetworkPartition+time.Second {
		return fmt.Errorf("pgha: primary demote timeout %s must exceed the keepers' network partition timeout %s by more than a keeper round (1s), or a primary cut off from the monitor could still take writes after its standby was promoted",
			t.PrimaryDemote, t.NetworkPartition)
	}
	for _, d := range []time.Duration{t.NetworkPartition, t.PreparePromotionWalreceiver, t.PreparePromotionCatchup} {
		if d < time.Second || d%time.Second != 0 {
			return fmt.Errorf("pgha: keeper timeouts are whole seconds, got %s", d)
		}
	}
	return nil
}

// Config says how to build the formation. The zero value is a synchronous
// formation with TestTimeouts.
type Config struct {
	// Timeouts; nil means TestTimeouts().
	Timeouts *Timeouts
	// Async starts the standby outside the replication quorum
	// (--replication-quorum false): the primary does not wait for it.
	Async bool
	// StartTimeout bounds the whole start (default 3 minutes).
	StartTimeout time.Duration
	// Logf, if set, gets a line per step (t.Logf).
	Logf func(format string, args ...any)
}

// Node is one server of the formation: the monitor or a data node.
type Node struct {
	Name string
	Port int
	Dir  string // PGDATA

	f       *Formation
	logPath string

	mu     sync.Mutex
	cmd    *exec.Cmd // the `pg_autoctl run` (or `create ... --run`) process, nil once gone
	done   chan struct{}
	killed bool
}

// Formation is a running pg_auto_failover formation: Monitor, and Nodes[0]
// (created first, the first primary) and Nodes[1] (its standby).
type Formation struct {
	Monitor *Node
	Nodes   []*Node

	root     string
	bin      string // PostgreSQL's bin dir (pg_ctl)
	autoctl  string
	cred     *syscall.Credential // nil: run as ourselves
	uid      int
	user     string // the database superuser tests connect as
	env      []string
	timeouts Timeouts
	logf     func(string, ...any)

	mu     sync.Mutex
	frozen []int // PIDs we stopped (SIGSTOP) and have not resumed
	closed bool
}

// Available says whether pg_auto_failover can run here, and if not, why.
func Available() error {
	_, _, err := locate()
	return err
}

// locate finds pg_autoctl and the bin dir of the PostgreSQL major version
// that has the pgautofailover extension.
func locate() (autoctl, bin string, err error) {
	autoctl, err = exec.LookPath("pg_autoctl")
	if err != nil {
		return "", "", ErrUnavailable
	}
	libs, _ := filepath.Glob("/usr/lib/postgresql/*/lib/pgautofailover.so")
	sort.Slice(libs, func(i, j int) bool { return major(libs[i]) > major(libs[j]) })
	for _, l := range libs {
		b := filepath.Join(filepath.Dir(filepath.Dir(l)), "bin")
		if _, err := os.Stat(filepath.Join(b, "pg_ctl")); err == nil {
			return autoctl, b, nil
		}
	}
	return "", "", fmt.Errorf("%w: pg_autoctl is at %s but no PostgreSQL version here has the pgautofailover extension and its server", ErrUnavailable, autoctl)
}

func major(lib string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(lib))))
	return v
}

// Start runs a formation for the test and removes it when the test ends. It
// skips the test if pg_auto_failover is not installed, unless
// TENURE_TEST_REQUIRE_PGHA is set (scripts/test.sh sets it once it has
// installed the package), and fails it if the formation does not start.
func Start(t testing.TB, cfg Config) *Formation {
	t.Helper()
	if err := Available(); err != nil {
		if os.Getenv("TENURE_TEST_REQUIRE_PGHA") != "" {
			t.Fatalf("TENURE_TEST_REQUIRE_PGHA is set: %v", err)
		}
		t.Skipf("skipping: %v", err)
	}
	if cfg.Logf == nil {
		cfg.Logf = t.Logf
	}
	timeout := cfg.StartTimeout
	if timeout == 0 {
		timeout = 3 * time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	f, err := New(ctx, cfg)
	if err != nil {
		t.Fatalf("pg_auto_failover formation: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pg_auto_failover formation at failure:\n%s\n%s", f.stateOrErr(), f.logTails(40))
		}
		if err := f.Close(); err != nil {
			t.Logf("removing the pg_auto_failover formation: %v", err)
		}
	})
	return f
}

// New creates and starts a formation under a new temp dir, within ctx.
// Close stops it and removes everything. The error wraps ErrUnavailable
// when pg_auto_failover is not installed.
func New(ctx context.Context, cfg Config) (_ *Formation, err error) {
	autoctl, bin, err := locate()
	if err != nil {
		return nil, err
	}
	to := TestTimeouts()
	if cfg.Timeouts != nil {
		to = *cfg.Timeouts
	}
	if err := to.validate(); err != nil {
		return nil, err
	}
	if cfg.StartTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.StartTimeout)
		defer cancel()
	}
	root, err := os.MkdirTemp("", "tenure-pgha-")
	if err != nil {
		return nil, err
	}
	f := &Formation{root: root, bin: bin, autoctl: autoctl, timeouts: to, logf: cfg.Logf, uid: os.Geteuid()}
	if f.logf == nil {
		f.logf = func(string, ...any) {}
	}
	defer func() {
		if err != nil {
			err = fmt.Errorf("%w\n%s", err, f.logTails(30))
			_ = f.Close()
		}
	}()
	if err := f.setUser(); err != nil {
		return nil, err
	}
	for _, d := range []string{"config", "share", "run", "home"} {
		if err := f.mkdir(filepath.Join(root, d)); err != nil {
			return nil, err
		}
	}
	f.env = []string{
		"PATH=" + bin + ":/usr/local/bin:/usr/bin:/bin",
		"HOME=" + filepath.Join(root, "home"),
		"XDG_CONFIG_HOME=" + filepath.Join(root, "config"),
		"XDG_DATA_HOME=" + filepath.Join(root, "share"),
		"XDG_RUNTIME_DIR=" + filepath.Join(root, "run"),
		"TMPDIR=" + filepath.Join(root, "run"),
		"LC_ALL=C.UTF-8", "LANG=C.UTF-8",
		"PGCONNECT_TIMEOUT=5",
	}
	// Below the ephemeral range (freeport): the nodes bind their ports
	// seconds after this, and again after every kill and restart.
	base, err := freeport.Block(3)
	if err != nil {
		return nil, err
	}
	ports := []int{base, base + 1, base + 2}
	f.Monitor = f.newNode("monitor", ports[0])
	f.Nodes = []*Node{f.newNode("node1", ports[1]), f.newNode("node2", ports[2])}
	start := time.Now()

	// The monitor: create, listen on loopback only, run, shorten its timeouts.
	if err := f.autoctlLogged(ctx, f.Monitor, "create", "monitor", "--pgdata", f.Monitor.Dir, "--pgport", strconv.Itoa(f.Monitor.Port),
		"--pgctl", filepath.Join(bin, "pg_ctl"), "--hostname", "127.0.0.1", "--auth", "trust", "--no-ssl"); err != nil {
		return nil, err
	}
	if _, err := f.autoctlCmd(ctx, "config", "set", "--pgdata", f.Monitor.Dir, "postgresql.listen_addresses", "127.0.0.1"); err != nil {
		return nil, err
	}
	if err := f.Monitor.run("run", "--pgdata", f.Monitor.Dir); err != nil {
		return nil, err
	}
	if err := f.waitConnect(ctx, f.MonitorURL()); err != nil {
		return nil, fmt.Errorf("the monitor did not accept connections: %w", err)
	}
	if err := f.setMonitorTimeouts(ctx); err != nil {
		return nil, err
	}
	f.logf("pgha: monitor up on port %d (%s)", f.Monitor.Port, time.Since(start).Round(time.Millisecond))

	// The first data node becomes the primary ("single" until a standby joins).
	if err := f.createDataNode(ctx, f.Nodes[0], true); err != nil {
		return nil, err
	}
	if err := f.waitStates(ctx, map[string]string{"node1": "single"}); err != nil {
		return nil, err
	}
	if err := f.waitConnect(ctx, f.NodeURL(f.Nodes[0])); err != nil {
		return nil, fmt.Errorf("node1 did not accept connections: %w", err)
	}
	// Process crashes, not power losses, are what the tests inject: the
	// standby's copy in the OS page cache survives them, so fsync buys
	// nothing here but time. pg_basebackup carries the setting to the standby.
	if err := f.exec(ctx, f.NodeURL(f.Nodes[0]), `ALTER SYSTEM SET fsync = off`, `SELECT pg_reload_conf()`,
		`CREATE TABLE IF NOT EXISTS public.pgha_probe (at timestamptz NOT NULL DEFAULT now(), port int)`); err != nil {
		return nil, err
	}
	f.logf("pgha: primary node1 up on port %d (%s)", f.Nodes[0].Port, time.Since(start).Round(time.Millisecond))

	// The standby: a base backup of the primary, then streaming.
	if err := f.createDataNode(ctx, f.Nodes[1], !cfg.Async); err != nil {
		return nil, err
	}
	if err := f.waitStates(ctx, map[string]string{"node1": "primary", "node2": "secondary"}); err != nil {
		return nil, err
	}
	if err := f.waitSyncNames(ctx, f.Nodes[0], !cfg.Async); err != nil {
		return nil, err
	}
	mode := "synchronous"
	if cfg.Async {
		mode = "asynchronous"
	}
	f.logf("pgha: formation ready in %s: primary node1 on port %d, %s standby node2 on port %d, monitor on port %d",
		time.Since(start).Round(time.Millisecond), f.Nodes[0].Port, mode, f.Nodes[1].Port, f.Monitor.Port)
	return f, nil
}

func (f *Formation) setUser() error {
	if f.uid != 0 {
		u, err := user.Current()
		if err != nil {
			return err
		}
		f.user = u.Username
		return nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return fmt.Errorf("running as root needs the postgres OS user: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	f.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}
	f.uid = uid
	f.user = "postgres"
	return os.Chown(f.root, uid, gid)
}

func (f *Formation) mkdir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if f.cred != nil {
		return os.Chown(dir, int(f.cred.Uid), int(f.cred.Gid))
	}
	return nil
}

func (f *Formation) newNode(name string, port int) *Node {
	return &Node{Name: name, Port: port, Dir: filepath.Join(f.root, name), f: f,
		logPath: filepath.Join(f.root, name+".log")}
}

// createDataNode registers n with the monitor, shortens its keeper's
// timeouts and runs its keeper.
func (f *Formation) createDataNode(ctx context.Context, n *Node, quorum bool) error {
	if err := f.autoctlLogged(ctx, n, "create", "postgres", "--pgdata", n.Dir, "--pgport", strconv.Itoa(n.Port),
		"--pgctl", filepath.Join(f.bin, "pg_ctl"), "--hostname", "127.0.0.1", "--listen", "127.0.0.1",
		"--auth", "trust", "--no-ssl", "--monitor", f.monitorNodeURL(), "--name", n.Name,
		"--replication-quorum", strconv.FormatBool(quorum)); err != nil {
		return err
	}
	t := f.timeouts
	for _, kv := range [][2]string{
		{"timeout.network_partition_timeout", secs(t.NetworkPartition)},
		{"timeout.prepare_promotion_walreceiver", secs(t.PreparePromotionWalreceiver)},
		{"timeout.prepare_promotion_catchup", secs(t.PreparePromotionCatchup)},
	} {
		if _, err := f.autoctlCmd(ctx, "config", "set", "--pgdata", n.Dir, kv[0], kv[1]); err != nil {
			return err
		}
	}
	return n.run("run", "--pgdata", n.Dir)
}

func secs(d time.Duration) string { return strconv.Itoa(int(d / time.Second)) }

func (f *Formation) setMonitorTimeouts(ctx context.Context) error {
	t := f.timeouts
	ms := func(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }
	stmts := []string{}
	for _, kv := range [][2]string{
		{"health_check_period", ms(t.HealthCheckPeriod)},
		{"health_check_timeout", ms(t.HealthCheckTimeout)},
		{"health_check_max_retries", strconv.Itoa(t.HealthCheckMaxRetries)},
		{"health_check_retry_delay", ms(t.HealthCheckRetryDelay)},
		{"node_considered_unhealthy_timeout", ms(t.NodeConsideredUnhealthy)},
		{"primary_demote_timeout", ms(t.PrimaryDemote)},
		{"startup_grace_period", ms(t.StartupGrace)},
	} {
		stmts = append(stmts, fmt.Sprintf("ALTER SYSTEM SET pgautofailover.%s = %s", kv[0], kv[1]))
	}
	stmts = append(stmts, "SELECT pg_reload_conf()")
	return f.exec(ctx, f.MonitorURL(), stmts...)
}

// URL is the formation's connection URL as an application should use it:
// both data nodes, and target_session_attrs=read-write so that a connection
// lands on whichever is the writable primary.
func (f *Formation) URL() string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write",
		f.user, f.Nodes[0].Port, f.Nodes[1].Port)
}

// NodeURL connects to one data node, whatever its role.
func (f *Formation) NodeURL(n *Node) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/postgres?sslmode=disable", f.user, n.Port)
}

// MonitorURL connects to the monitor's database as the superuser.
func (f *Formation) MonitorURL() string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/pg_auto_failover?sslmode=disable", f.user, f.Monitor.Port)
}

func (f *Formation) monitorNodeURL() string {
	return fmt.Sprintf("postgres://autoctl_node@127.0.0.1:%d/pg_auto_failover?sslmode=disable", f.Monitor.Port)
}

// Timeouts are the timings the formation runs with.
func (f *Formation) Timeouts() Timeouts { return f.timeouts }

// NodeState is one data node as the monitor sees it.
type NodeState struct {
	Name      string
	Port      int
	Reported  string // the state its keeper last reported
	Assigned  string // the goal state the monitor assigned
	LSN       string // the last LSN its keeper reported
	Healthy   bool   // the monitor's last health check
	Timeline  int
	ReportAge time.Duration
}

// States reads the data nodes' states from the monitor.
func (f *Formation) States(ctx context.Context) ([]NodeState, error) {
	conn, err := f.connect(ctx, f.MonitorURL())
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `SELECT nodename, nodeport, reportedstate::text, goalstate::text, reportedlsn::text,
		health = 1, reportedtli, now() - reporttime FROM pgautofailover.node ORDER BY nodeid`)
	if err != nil {
		return nil, err
	}
	var out []NodeState
	var s NodeState
	_, err = pgx.ForEachRow(rows, []any{&s.Name, &s.Port, &s.Reported, &s.Assigned, &s.LSN, &s.Healthy, &s.Timeline, &s.ReportAge}, func() error {
		out = append(out, s)
		return nil
	})
	return out, err
}

// State is `pg_autoctl show state`: the formation as the monitor sees it.
func (f *Formation) State(ctx context.Context) (string, error) {
	return f.autoctlCmd(ctx, "show", "state", "--pgdata", f.Monitor.Dir)
}

func (f *Formation) stateOrErr() string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := f.State(ctx)
	if err != nil {
		return "pg_autoctl show state: " + err.Error()
	}
	return s
}

// Node returns the data node called name (node1 or node2).
func (f *Formation) Node(name string) *Node {
	for _, n := range f.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// Primary is the data node the monitor has assigned a primary role (primary,
// wait_primary or single), or an error if there is none.
func (f *Formation) Primary(ctx context.Context) (*Node, error) {
	ss, err := f.States(ctx)
	if err != nil {
		return nil, err
	}
	for _, s := range ss {
		switch s.Assigned {
		case "primary", "wait_primary", "single":
			return f.Node(s.Name), nil
		}
	}
	return nil, fmt.Errorf("the monitor assigns no primary: %v", ss)
}

// Standby is the data node that is not the primary.
func (f *Formation) Standby(ctx context.Context) (*Node, error) {
	p, err := f.Primary(ctx)
	if err != nil {
		return nil, err
	}
	for _, n := range f.Nodes {
		if n != p {
			return n, nil
		}
	}
	return nil, errors.New("no standby")
}

// waitStates waits until every named node reports, and is assigned, the
// given state.
func (f *Formation) waitStates(ctx context.Context, want map[string]string) error {
	var last []NodeState
	var lastErr error
	for {
		ss, err := f.States(ctx)
		if err == nil {
			last = ss
			ok := 0
			for _, s := range ss {
				if w, in := want[s.Name]; in && s.Reported == w && s.Assigned == w {
					ok++
				}
			}
			if ok == len(want) {
				return nil
			}
		} else {
			lastErr = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the formation to reach %v: %w (monitor: %v, last error: %v)", want, ctx.Err(), last, lastErr)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// WaitHealthy waits until the formation has a primary and a streaming
// secondary again (after Restart, for instance).
func (f *Formation) WaitHealthy(ctx context.Context) error {
	var last []NodeState
	for {
		ss, err := f.States(ctx)
		if err == nil {
			last = ss
			var primary, secondary bool
			for _, s := range ss {
				primary = primary || (s.Reported == "primary" && s.Assigned == "primary")
				secondary = secondary || (s.Reported == "secondary" && s.Assigned == "secondary")
			}
			if primary && secondary {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for a primary and a secondary: %w (monitor: %v)", ctx.Err(), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// waitSyncNames waits until the primary n runs with a non-empty
// synchronous_standby_names (sync) or an empty one.
func (f *Formation) waitSyncNames(ctx context.Context, n *Node, sync bool) error {
	var last string
	for {
		conn, err := f.connect(ctx, f.NodeURL(n))
		if err == nil {
			err = conn.QueryRow(ctx, `SELECT current_setting('synchronous_standby_names')`).Scan(&last)
			conn.Close(context.Background())
			if err == nil && (last != "") == sync {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s's synchronous_standby_names to be %s: %w (it is %q)", n.Name,
				map[bool]string{true: "set", false: "empty"}[sync], ctx.Err(), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// SyncStandbyNames is the primary's synchronous_standby_names.
func (f *Formation) SyncStandbyNames(ctx context.Context) (string, error) {
	p, err := f.Primary(ctx)
	if err != nil {
		return "", err
	}
	conn, err := f.connect(ctx, f.NodeURL(p))
	if err != nil {
		return "", err
	}
	defer conn.Close(context.Background())
	var s string
	err = conn.QueryRow(ctx, `SELECT current_setting('synchronous_standby_names')`).Scan(&s)
	return s, err
}

// SetReplicationQuorum puts the standby in the replication quorum (the
// primary waits for it at every COMMIT) or takes it out (asynchronous), and
// waits until the primary runs with it.
func (f *Formation) SetReplicationQuorum(ctx context.Context, quorum bool) error {
	s, err := f.Standby(ctx)
	if err != nil {
		return err
	}
	p, _ := f.Primary(ctx)
	if _, err := f.autoctlCmd(ctx, "set", "node", "replication-quorum", strconv.FormatBool(quorum), "--pgdata", s.Dir); err != nil {
		return err
	}
	return f.waitSyncNames(ctx, p, quorum)
}

// Frozen is replication stopped by FreezeReplication.
type Frozen struct {
	f   *Formation
	PID int // the primary's WAL sender
}

// FreezeReplication stops (SIGSTOP) the current primary's WAL sender, so
// that the standby receives nothing more: with an asynchronous standby the
// primary goes on acknowledging commits the standby does not have; with a
// synchronous one, every COMMIT waits. The process is checked to be a child
// of the primary's postmaster, which this formation started. Thaw resumes
// it; killing the primary ends it.
func (f *Formation) FreezeReplication(ctx context.Context) (*Frozen, error) {
	p, err := f.Primary(ctx)
	if err != nil {
		return nil, err
	}
	conn, err := f.connect(ctx, f.NodeURL(p))
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	var pids []int
	rows, err := conn.Query(ctx, `SELECT pid FROM pg_stat_replication`)
	if err != nil {
		return nil, err
	}
	if pids, err = pgx.CollectRows(rows, pgx.RowTo[int]); err != nil {
		return nil, err
	}
	if len(pids) != 1 {
		return nil, fmt.Errorf("%s has %d WAL senders, want 1", p.Name, len(pids))
	}
	pm, err := p.postmasterPID()
	if err != nil {
		return nil, err
	}
	if ppid, _, _, err := procStat(pids[0]); err != nil || ppid != pm {
		return nil, fmt.Errorf("WAL sender %d is not a child of %s's postmaster %d (parent %d, %v)", pids[0], p.Name, pm, ppid, err)
	}
	if err := syscall.Kill(pids[0], syscall.SIGSTOP); err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.frozen = append(f.frozen, pids[0])
	f.mu.Unlock()
	if err := waitStopped(pids[0], 5*time.Second); err != nil {
		return nil, err
	}
	f.logf("pgha: %s's WAL sender (pid %d) stopped: the standby receives nothing more", p.Name, pids[0])
	return &Frozen{f: f, PID: pids[0]}, nil
}

// Thaw resumes the WAL sender (a no-op if it is gone).
func (z *Frozen) Thaw() {
	z.f.mu.Lock()
	defer z.f.mu.Unlock()
	for i, p := range z.f.frozen {
		if p == z.PID {
			_ = syscall.Kill(p, syscall.SIGCONT)
			z.f.frozen = append(z.f.frozen[:i], z.f.frozen[i+1:]...)
			return
		}
	}
}

// KillPrimary kills the current primary outright, like the death of its
// host: SIGKILL to its keeper (pg_autoctl and its services) and its Postgres
// (postmaster and every backend), all frozen first so that none of them
// reacts. Only a process this formation started, or a descendant of one, is
// signalled. Killing Postgres alone would not do: its keeper restarts it
// within a second and no failover happens. It returns the node and when the
// kill was done.
func (f *Formation) KillPrimary(ctx context.Context) (*Node, time.Time, error) {
	p, err := f.Primary(ctx)
	if err != nil {
		return nil, time.Time{}, err
	}
	at, err := f.KillNode(p)
	return p, at, err
}

// KillNode kills n as KillPrimary does, waits until its processes are gone
// and removes the System V semaphore and shared memory segment they left.
func (f *Formation) KillNode(n *Node) (time.Time, error) {
	n.mu.Lock()
	cmd, done := n.cmd, n.done
	n.mu.Unlock()
	if cmd == nil {
		return time.Time{}, fmt.Errorf("%s is not running", n.Name)
	}
	sem := n.semaphoreID()
	shm, pm := n.sharedMemory()
	pids := freezeTree(cmd.Process.Pid, f.uid, pm)
	for _, p := range pids {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
	at := time.Now()
	n.mu.Lock()
	n.killed = true
	n.mu.Unlock()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		return at, fmt.Errorf("%s's pg_autoctl (pid %d) did not exit after SIGKILL", n.Name, cmd.Process.Pid)
	}
	if err := waitGone(pids, 10*time.Second); err != nil {
		return at, fmt.Errorf("%s: %w", n.Name, err)
	}
	f.logf("pgha: killed %s (%d processes: pg_autoctl, postmaster %d and their children)", n.Name, len(pids), pm)
	removeIPC(sem, shm, pm, f.uid)
	return at, nil
}

// Restart runs a killed node's keeper again: it rejoins the formation (as a
// standby, rewinding its divergent WAL if needed). It does not wait; see
// WaitHealthy.
func (f *Formation) Restart(n *Node) error {
	n.mu.Lock()
	running := n.cmd != nil
	n.mu.Unlock()
	if running {
		return fmt.Errorf("%s is running", n.Name)
	}
	return n.run("run", "--pgdata", n.Dir)
}

// WaitWritable waits until the formation's URL reaches a server that takes
// a write (an INSERT into public.pgha_probe) and returns that node. Each
// attempt is bounded by a 1s connect timeout.
func (f *Formation) WaitWritable(ctx context.Context, timeout time.Duration) (*Node, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var lastErr error
	for {
		port, err := f.probeWrite(ctx)
		if err == nil {
			for _, n := range f.Nodes {
				if n.Port == port {
					return n, nil
				}
			}
			return nil, fmt.Errorf("written on unknown port %d", port)
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("the formation did not take a write within %s: %v\n%s", timeout, lastErr, f.stateOrErr())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (f *Formation) probeWrite(ctx context.Context) (int, error) {
	actx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, err := f.connect(actx, f.URL())
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.Background())
	var port int
	err = conn.QueryRow(actx, `INSERT INTO public.pgha_probe (port) VALUES (inet_server_port()) RETURNING port`).Scan(&port)
	return port, err
}

// Close stops every server (SIGTERM to the keepers: a fast shutdown), kills
// what does not stop, and removes the formation's files.
func (f *Formation) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	f.closed = true
	for _, p := range f.frozen {
		_ = syscall.Kill(p, syscall.SIGCONT)
	}
	f.frozen = nil
	f.mu.Unlock()
	var errs []error
	nodes := append(append([]*Node{}, f.Nodes...), f.Monitor)
	for _, n := range nodes {
		if n == nil {
			continue
		}
		if err := n.stop(30 * time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.RemoveAll(f.root); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// stop sends SIGTERM to n's keeper and waits; if it does not stop, it is
// killed like KillNode does.
func (n *Node) stop(timeout time.Duration) error {
	n.mu.Lock()
	cmd, done := n.cmd, n.done
	n.mu.Unlock()
	if cmd == nil {
		return nil
	}
	sem := n.semaphoreID()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
		// pg_autoctl removes its semaphore as it exits, but not always.
		removeIPC(sem, 0, 0, n.f.uid)
		return nil
	case <-time.After(timeout):
	}
	_, err := n.f.KillNode(n)
	if err != nil {
		return err
	}
	return fmt.Errorf("%s did not stop within %s of SIGTERM; killed", n.Name, timeout)
}

// run starts a long-running pg_autoctl process for n (create --run, or run).
func (n *Node) run(args ...string) error {
	lf, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer lf.Close()
	cmd := n.f.command(args...)
	cmd.Stdout, cmd.Stderr = lf, lf
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting pg_autoctl %s for %s: %w", strings.Join(args, " "), n.Name, err)
	}
	done := make(chan struct{})
	n.mu.Lock()
	n.cmd, n.done, n.killed = cmd, done, false
	n.mu.Unlock()
	go func() {
		_ = cmd.Wait()
		n.mu.Lock()
		if n.cmd == cmd {
			n.cmd = nil
		}
		n.mu.Unlock()
		close(done)
	}()
	return nil
}

// Running says whether n's keeper process is alive.
func (n *Node) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cmd != nil
}

func (f *Formation) command(args ...string) *exec.Cmd {
	cmd := exec.Command(f.autoctl, args...)
	cmd.Dir = f.root
	cmd.Env = f.env
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: f.cred, Setpgid: true}
	return cmd
}

// autoctlLogged runs a short pg_autoctl command about n, its output
// appended to n's log.
func (f *Formation) autoctlLogged(ctx context.Context, n *Node, args ...string) error {
	out, err := f.autoctlCmd(ctx, args...)
	if lf, ferr := os.OpenFile(n.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); ferr == nil {
		fmt.Fprintf(lf, "==== pg_autoctl %s\n%s\n", strings.Join(args, " "), out)
		lf.Close()
	}
	return err
}

// autoctlCmd runs a short pg_autoctl command and returns its output.
func (f *Formation) autoctlCmd(ctx context.Context, args ...string) (string, error) {
	cmd := f.command(args...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("pg_autoctl %s: %w", strings.Join(args, " "), err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	select {
	case err := <-waited:
		if err != nil {
			return out.String(), fmt.Errorf("pg_autoctl %s: %v:\n%s", strings.Join(args, " "), err, tailLines(out.String(), 30))
		}
		return out.String(), nil
	case <-ctx.Done():
		// Our own child and its process group (Setpgid).
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-waited
		return out.String(), fmt.Errorf("pg_autoctl %s: %w:\n%s", strings.Join(args, " "), ctx.Err(), tailLines(out.String(), 30))
	}
}

func (f *Formation) connect(ctx context.Context, url string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.ConnectTimeout = time.Second
	return pgx.ConnectConfig(ctx, cfg)
}

func (f *Formation) exec(ctx context.Context, url string, stmts ...string) error {
	conn, err := f.connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	return nil
}

func (f *Formation) waitConnect(ctx context.Context, url string) error {
	for {
		conn, err := f.connect(ctx, url)
		if err == nil {
			conn.Close(context.Background())
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// logTails is the end of each node's pg_autoctl log (n lines each).
func (f *Formation) logTails(n int) string {
	var b strings.Builder
	for _, node := range append([]*Node{f.Monitor}, f.Nodes...) {
		if node == nil {
			continue
		}
		data, err := os.ReadFile(node.logPath)
		if err != nil {
			continue
		}
		fmt.Fprintf(&b, "---- pg_autoctl log of %s (last %d lines) ----\n%s\n", node.Name, n, tailLines(string(data), n))
	}
	return b.String()
}

// Log is the whole pg_autoctl log of n (its keeper and Postgres).
func (n *Node) Log() string {
	data, _ := os.ReadFile(n.logPath)
	return string(data)
}

func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// postmasterPID reads n's postmaster.pid.
func (n *Node) postmasterPID() (int, error) {
	pid, _, err := n.readPostmasterPid()
	return pid, err
}

func (n *Node) readPostmasterPid() (pid, shmid int, err error) {
	data, err := os.ReadFile(filepath.Join(n.Dir, "postmaster.pid"))
	if err != nil {
		return 0, 0, err
	}
	lines := strings.Split(string(data), "\n")
	pid, err = strconv.Atoi(strings.TrimSpace(lines[0]))
	if err != nil {
		return 0, 0, fmt.Errorf("%s/postmaster.pid: %w", n.Dir, err)
	}
	// Line 7: the shared memory key and id.
	if len(lines) > 6 {
		if fs := strings.Fields(lines[6]); len(fs) == 2 {
			shmid, _ = strconv.Atoi(fs[1])
		}
	}
	return pid, shmid, nil
}

// sharedMemory is n's System V shared memory id and postmaster PID (0 if
// unknown).
func (n *Node) sharedMemory() (shmid, postmaster int) {
	pm, shm, err := n.readPostmasterPid()
	if err != nil {
		return 0, 0
	}
	// Only a postmaster serving this data dir is ours.
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pm))
	if !strings.Contains(string(cmdline), n.Dir) {
		return 0, 0
	}
	return shm, pm
}

// semaphoreID is the System V semaphore pg_autoctl's supervisor created for
// its logs (line 5 of its PID file), or -1.
func (n *Node) semaphoreID() int {
	data, err := os.ReadFile(filepath.Join(n.f.root, "run", "pg_autoctl", strings.TrimPrefix(n.Dir, "/"), "pg_autoctl.pid"))
	if err != nil {
		return -1
	}
	lines := strings.Split(string(data), "\n")
	if len(lines) < 5 {
		return -1
	}
	id, err := strconv.Atoi(strings.TrimSpace(lines[4]))
	if err != nil {
		return -1
	}
	return id
}

// procStat reads a process's parent, owner and state letter.
func procStat(pid int) (ppid, uid int, state byte, err error) {
	st, err := childproc.ReadStat(pid)
	if err != nil {
		return 0, 0, 0, err
	}
	var fi syscall.Stat_t
	if err := syscall.Stat(fmt.Sprintf("/proc/%d", pid), &fi); err != nil {
		return 0, 0, 0, err
	}
	return st.PPID, int(fi.Uid), st.State, nil
}

// children maps every process to its children, for the processes owned by
// uid.
func children(uid int) map[int][]int {
	out := map[int][]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ppid, owner, _, err := procStat(pid)
		if err != nil || owner != uid {
			continue
		}
		out[ppid] = append(out[ppid], pid)
	}
	return out
}

// freezeTree stops (SIGSTOP) root, extra (if non-zero) and all their
// descendants owned by uid, over and over until no new process appears,
// and returns them all.
func freezeTree(root, uid, extra int) []int {
	seen := map[int]bool{}
	for range 10 {
		kids := children(uid)
		queue := []int{root}
		if extra > 0 {
			queue = append(queue, extra)
		}
		added := false
		for len(queue) > 0 {
			p := queue[0]
			queue = queue[1:]
			if !seen[p] {
				seen[p] = true
				added = true
				_ = syscall.Kill(p, syscall.SIGSTOP)
			}
			queue = append(queue, kids[p]...)
		}
		if !added {
			break
		}
	}
	out := make([]int, 0, len(seen))
	for p := range seen {
		out = append(out, p)
	}
	sort.Ints(out)
	return out
}

func waitStopped(pid int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		_, _, st, err := procStat(pid)
		if err != nil {
			return err
		}
		if st == 'T' || st == 't' {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("process %d did not stop within %s", pid, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitGone waits until none of pids is alive (gone, or a zombie).
func waitGone(pids []int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		var alive []int
		for _, p := range pids {
			if _, _, st, err := procStat(p); err == nil && st != 'Z' && st != 'X' {
				alive = append(alive, p)
			}
		}
		if len(alive) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v still alive %s after SIGKILL", alive, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// removeIPC removes what a killed node left in System V IPC: pg_autoctl's
// log semaphore (if it still exists and belongs to uid) and the postmaster's
// shared memory segment (if the killed postmaster created it and nothing is
// attached). A clean stop removes both itself.
func removeIPC(sem, shm, postmaster, uid int) {
	if sem >= 0 && ipcRow("/proc/sysvipc/sem", sem, func(fs []string) bool { return len(fs) > 4 && fs[4] == strconv.Itoa(uid) }) {
		_ = exec.Command("ipcrm", "-s", strconv.Itoa(sem)).Run()
	}
	// /proc/sysvipc/shm: key shmid perms size cpid lpid nattch uid ...
	if shm > 0 && postmaster > 0 && ipcRow("/proc/sysvipc/shm", shm, func(fs []string) bool {
		return len(fs) > 7 && fs[4] == strconv.Itoa(postmaster) && fs[6] == "0" && fs[7] == strconv.Itoa(uid)
	}) {
		_ = exec.Command("ipcrm", "-m", strconv.Itoa(shm)).Run()
	}
}

func ipcRow(path string, id int, ok func([]string) bool) bool {
	fh, err := os.Open(path)
	if err != nil {
		return false
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) > 1 && fs[1] == strconv.Itoa(id) {
			return ok(fs)
		}
	}
	return false
}
