package netfault

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tenure-dev/tenure/internal/childproc"
)

// These tests use the real kernel: namespaces, nftables, TCP. They need
// root; they fail, not skip, without it, so CI cannot pass by skipping.
func TestMain(m *testing.M) {
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	err := EnsureNftables(ctx)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "netfault tests:", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// cutWait is how long a test waits to decide that nothing arrives. On
// loopback anything that can arrive does so in well under a millisecond,
// and the first retransmission comes after 200 ms.
const cutWait = 2 * time.Second

// echoServer is a TCP echo server on the root namespace's loopback. It
// reports every chunk it receives on got, so a test can tell whether a
// request arrived even when the answer does not.
type echoServer struct {
	port int
	got  chan string
	ln   net.Listener

	mu   sync.Mutex
	open int // connections not yet ended
}

func newEchoServer(t *testing.T) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &echoServer{port: ln.Addr().(*net.TCPAddr).Port, got: make(chan string, 100), ln: ln}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.open++
			s.mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { s.mu.Lock(); s.open--; s.mu.Unlock() }()
				defer c.Close()
				buf := make([]byte, 4096)
				for {
					// Bounded: a test ends within this anyway.
					_ = c.SetReadDeadline(time.Now().Add(2 * time.Minute))
					k, err := c.Read(buf)
					if k > 0 {
						select {
						case s.got <- string(buf[:k]):
						default:
						}
						if _, err := c.Write(buf[:k]); err != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return s
}

func (s *echoServer) openConns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.open
}

// received waits up to d for the next chunk the server got.
func (s *echoServer) received(d time.Duration) (string, bool) {
	select {
	case m := <-s.got:
		return m, true
	case <-time.After(d):
		return "", false
	}
}

func newNS(t *testing.T, ports ...int) *Namespace {
	t.Helper()
	ns, err := NewT(t, ports...)
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

// dialIn connects from inside the namespace to 127.0.0.1:port, as the
// worker would; userTimeout, if not zero, is set as TCP_USER_TIMEOUT.
func dialIn(ns *Namespace, port int, timeout, userTimeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	if userTimeout > 0 {
		d.Control = func(_, _ string, rc syscall.RawConn) error {
			var serr error
			err := rc.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(userTimeout/time.Millisecond))
			})
			return errors.Join(err, serr)
		}
	}
	var c net.Conn
	err := ns.Do(func() error {
		var err error
		c, err = d.Dial("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		return err
	})
	return c, err
}

func mustDialIn(t *testing.T, ns *Namespace, port int) net.Conn {
	t.Helper()
	c, err := dialIn(ns, port, 5*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// halfOpen dials port from inside ns as dialIn does, checks that msg makes
// the round trip, and cuts the port: the connection is left half-open. It
// is closed when the test ends.
func halfOpen(t *testing.T, ns *Namespace, port int, userTimeout time.Duration, msg string) net.Conn {
	t.Helper()
	c, err := dialIn(ns, port, 5*time.Second, userTimeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	roundTrip(t, c, msg)
	if err := ns.Inject(Cut(port)); err != nil {
		t.Fatal(err)
	}
	return c
}

// readN reads len(want) bytes within d.
func readN(c net.Conn, n int, d time.Duration) (string, error) {
	if err := c.SetReadDeadline(time.Now().Add(d)); err != nil {
		return "", err
	}
	buf := make([]byte, n)
	k, err := io.ReadFull(c, buf)
	return string(buf[:k]), err
}

func roundTrip(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatalf("write: %v", err)
	}
	got, err := readN(c, len(msg), 5*time.Second)
	if err != nil || got != msg {
		t.Fatalf("echo of %q: got %q, %v", msg, got, err)
	}
}

// requireSilentTimeout fails unless err is a read deadline: not data, not
// EOF, not a reset. That is the difference between a dropped packet and a
// closed or refused connection.
func requireSilentTimeout(t *testing.T, what, got string, err error) {
	t.Helper()
	switch {
	case err == nil:
		t.Fatalf("%s: got %q; the fault let it through", what, got)
	case errors.Is(err, os.ErrDeadlineExceeded):
		// Silence, as from a vanished host.
	default:
		t.Fatalf("%s: got %q and %v; want nothing at all until the deadline (no EOF, no reset)", what, got, err)
	}
}

func requireDialTimeout(t *testing.T, ns *Namespace, port int) {
	t.Helper()
	start := time.Now()
	c, err := dialIn(ns, port, cutWait, 0)
	if err == nil {
		c.Close()
		t.Fatalf("new connection to %d succeeded through the fault", port)
	}
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("new connection to %d: %v after %s; want a timeout (SYN or SYN-ACK dropped), not a refusal", port, err, time.Since(start).Round(time.Millisecond))
	}
}

func TestEcho(t *testing.T) {
	t.Parallel()
	srv := newEchoServer(t)
	ns := newNS(t, srv.port)
	c := mustDialIn(t, ns, srv.port)
	roundTrip(t, c, "hello")
	if m, ok := srv.received(time.Second); !ok || m != "hello" {
		t.Fatalf("server got %q, %v", m, ok)
	}
	// The connection is the namespace's: its local end is not any socket
	// of the root namespace, whose 127.0.0.1:port is the echo server.
	if fc := ns.fwd.active(); fc != 2 {
		t.Fatalf("forwarder carries %d sockets, want 2 (one each side)", fc)
	}
}

// TestDoRestoresThreads: after Do, no thread of this process is left in
// the namespace (a thread left there would run other goroutines in it, or,
// for the main thread, make the whole process look as if it were inside).
func TestDoRestoresThreads(t *testing.T) {
	t.Parallel()
	srv := newEchoServer(t)
	ns := newNS(t, srv.port)
	var ins, outs unix.Stat_t
	if err := unix.Fstat(int(ns.fd.Fd()), &ins); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 50; i++ {
		err := ns.Do(func() error {
			if err := unix.Stat("/proc/thread-self/ns/net", &outs); err != nil {
				return err
			}
			if outs.Ino != ins.Ino {
				return errors.New("fn does not run in the namespace")
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		var st unix.Stat_t
		if err := unix.Stat("/proc/self/task/"+task.Name()+"/ns/net", &st); err != nil {
			continue // thread ended meanwhile
		}
		if st.Dev == ins.Dev && st.Ino == ins.Ino {
			t.Fatalf("thread %s of this process is still in %s", task.Name(), ns.Name())
		}
	}
}

// TestDirections cuts an established connection in each direction and
// checks what crosses, what does not, and that nothing resets it; then
// heals and checks that the same connection recovers.
func TestDirections(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		drop          Direction
		serverGetsReq bool
	}{
		{Both, false},
		{Requests, false},
		{Answers, true},
	} {
		t.Run(tc.drop.String(), func(t *testing.T) {
			t.Parallel()
			srv := newEchoServer(t)
			ns := newNS(t, srv.port)
			c := mustDialIn(t, ns, srv.port)
			roundTrip(t, c, "before")
			<-srv.got

			if err := ns.Inject(Fault{Ports: []int{srv.port}, Drop: tc.drop}); err != nil {
				t.Fatal(err)
			}
			cutAt := time.Now()
			if _, err := c.Write([]byte("during")); err != nil {
				t.Fatalf("write during the cut: %v; a drop must not fail the write (it is only buffered)", err)
			}
			got, err := readN(c, len("during"), cutWait)
			requireSilentTimeout(t, "read during the cut", got, err)
			m, arrived := srv.received(100 * time.Millisecond)
			switch {
			case tc.serverGetsReq && (!arrived || m != "during"):
				t.Fatalf("server got %q, %v; the request should arrive when only answers are dropped", m, arrived)
			case !tc.serverGetsReq && arrived:
				t.Fatalf("server got %q; the request should not arrive", m)
			}
			requireDialTimeout(t, ns, srv.port)

			if err := ns.Heal(); err != nil {
				t.Fatal(err)
			}
			healedAt := time.Now()
			got, err = readN(c, len("during"), 20*time.Second)
			if err != nil || got != "during" {
				t.Fatalf("after Heal the same connection should deliver the echo: got %q, %v", got, err)
			}
			t.Logf("drop %s: recovered %s after Heal (%s after the write), by retransmission",
				tc.drop, time.Since(healedAt).Round(time.Millisecond), time.Since(cutAt).Round(time.Millisecond))
			if !tc.serverGetsReq {
				if m, ok := srv.received(time.Second); !ok || m != "during" {
					t.Fatalf("server got %q, %v after Heal", m, ok)
				}
			}
			if m, ok := srv.received(200 * time.Millisecond); ok {
				t.Fatalf("server got %q more: retransmissions must not duplicate data", m)
			}
			roundTrip(t, c, "after")
			roundTrip(t, mustDialIn(t, ns, srv.port), "new")
		})
	}
}

// TestUserTimeout shows what ends a half-open connection: not the cut
// itself (TestDirections' reads only time out at their own deadline), but
// a bounded timeout on unacknowledged data, here TCP_USER_TIMEOUT.
func TestUserTimeout(t *testing.T) {
	t.Parallel()
	srv := newEchoServer(t)
	ns := newNS(t, srv.port)
	c := halfOpen(t, ns, srv.port, time.Second, "before")
	start := time.Now()
	if _, err := c.Write([]byte("during")); err != nil {
		t.Fatalf("first write: %v", err)
	}
	_, err := readN(c, 1, 10*time.Second)
	took := time.Since(start)
	if !errors.Is(err, syscall.ETIMEDOUT) {
		t.Fatalf("read after %s: %v; want ETIMEDOUT from TCP_USER_TIMEOUT", took.Round(time.Millisecond), err)
	}
	if took > 5*time.Second {
		t.Fatalf("TCP_USER_TIMEOUT of 1s ended the connection only after %s", took)
	}
	if _, err := c.Write([]byte("x")); err == nil {
		t.Fatal("write on the timed-out connection succeeded")
	}
	t.Logf("TCP_USER_TIMEOUT=1s: connection failed with %v %s after the write", err, took.Round(time.Millisecond))
}

// TestKinds injects each chaos kind on a namespace forwarding two services
// and checks, with new connections, which of them stay reachable.
func TestKinds(t *testing.T) {
	t.Parallel()
	kafka, pg := newEchoServer(t), newEchoServer(t)
	svc := Services{Kafka: []int{kafka.port}, Postgres: []int{pg.port}}
	ns := newNS(t, svc.Ports()...)
	reachable := func(port int) bool {
		c, err := dialIn(ns, port, 2*time.Second, 0)
		if err != nil {
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				t.Fatalf("dial %d: %v; want success or a timeout", port, err)
			}
			return false
		}
		defer c.Close()
		if _, err := c.Write([]byte("k")); err != nil {
			t.Fatal(err)
		}
		_, err = readN(c, 1, 2*time.Second)
		return err == nil
	}
	for _, k := range Kinds() {
		if err := ns.Inject(svc.Faults(k)...); err != nil {
			t.Fatal(err)
		}
		kafkaUp, pgUp := reachable(kafka.port), reachable(pg.port)
		wantKafka := k == PostgresCut || k == PostgresOneWay
		wantPG := k == KafkaCut || k == KafkaOneWay
		if kafkaUp != wantKafka || pgUp != wantPG {
			t.Errorf("%s (%v): kafka reachable %v, postgres %v; want %v, %v", k, ns.Faults(), kafkaUp, pgUp, wantKafka, wantPG)
		}
		if err := ns.Heal(); err != nil {
			t.Fatal(err)
		}
		if !reachable(kafka.port) || !reachable(pg.port) {
			t.Fatalf("after healing %s a service is unreachable", k)
		}
	}
	if len(ns.Faults()) != 0 {
		t.Fatalf("faults after Heal: %v", ns.Faults())
	}
}

func TestRuleset(t *testing.T) {
	s, err := ruleset(nil, []Fault{Cut(1, 2), DropAnswers(3), DropRequests(4)})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"delete table inet tenure_netfault",
		"hook input",
		"tcp dport { 1, 2 } drop", "tcp sport { 1, 2 } drop",
		"tcp sport { 3 } drop", "tcp dport { 4 } drop",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("ruleset lacks %q:\n%s", want, s)
		}
	}
	for _, bad := range [][]Fault{{Cut()}, {Cut(0)}, {Cut(70000)}, {{Ports: []int{1}}}} {
		if _, err := ruleset(nil, bad); err == nil {
			t.Errorf("ruleset(%v) accepted", bad)
		}
	}
	s, err = ruleset([]netip.Addr{netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("127.0.0.3")}, nil)
	if err != nil || !strings.Contains(s, "ip daddr { 127.0.0.2, 127.0.0.3 } drop") || !strings.Contains(s, "hook input") {
		t.Errorf("blackholes alone: %v\n%s", err, s)
	}
	if (Services{Kafka: []int{1}}).Faults(PostgresCut)[0].Ports != nil {
		t.Error("PostgresCut without Postgres ports should have no ports (and Inject then fails)")
	}
}

// TestBlackhole: a blackholed address swallows connection attempts (a
// timeout, where the same address without the rule refuses at once), and
// stays blackholed across faults and their healing; the services stay
// reachable.
func TestBlackhole(t *testing.T) {
	t.Parallel()
	srv := newEchoServer(t)
	ns := newNS(t, srv.port)
	hole := netip.MustParseAddr("127.0.0.2")
	dialHole := func() error {
		d := net.Dialer{Timeout: cutWait}
		return ns.Do(func() error {
			c, err := d.Dial("tcp4", net.JoinHostPort(hole.String(), strconv.Itoa(srv.port)))
			if err == nil {
				c.Close()
			}
			return err
		})
	}
	// Without the rule nothing listens there: refused at once.
	if err := dialHole(); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("before Blackhole: %v; want a refusal", err)
	}
	for _, bad := range []string{"127.0.0.1", "10.0.0.1", "::1"} {
		if err := ns.Blackhole(netip.MustParseAddr(bad)); err == nil {
			t.Errorf("Blackhole(%s) accepted", bad)
		}
	}
	if err := ns.Blackhole(hole); err != nil {
		t.Fatal(err)
	}
	requireHole := func(when string) {
		t.Helper()
		start := time.Now()
		err := dialHole()
		var ne net.Error
		if err == nil || !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("%s: connecting to %s: %v after %s; want a timeout", when, hole, err, time.Since(start).Round(time.Millisecond))
		}
	}
	requireHole("blackholed")
	roundTrip(t, mustDialIn(t, ns, srv.port), "through")
	if err := ns.Inject(Cut(srv.port)); err != nil {
		t.Fatal(err)
	}
	requireDialTimeout(t, ns, srv.port)
	if err := ns.Heal(); err != nil {
		t.Fatal(err)
	}
	requireHole("after a fault and its heal")
	roundTrip(t, mustDialIn(t, ns, srv.port), "healed")
	if got := ns.Blackholes(); len(got) != 1 || got[0] != hole || len(ns.Faults()) != 0 {
		t.Fatalf("blackholes %v, faults %v", got, ns.Faults())
	}
}

// TestServiceDown: when nothing listens in the root namespace, the client
// inside sees its connection reset at once, as from a closed port, not a
// hang or an orderly EOF. The forwarder's listener completes the handshake
// before the forwarder learns the service is down, so the reset comes
// either as connect's result (when it arrives before connect returns, as on
// loopback it often does) or at the first read; never a refusal.
func TestServiceDown(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	ns := newNS(t, port)
	for i := 0; i < 10; i++ {
		c, err := dialIn(ns, port, 5*time.Second, 0)
		if err == nil {
			var got string
			got, err = readN(c, 1, 5*time.Second)
			c.Close()
			if err == nil {
				t.Fatalf("read %q from a service that is down", got)
			}
		}
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("attempt %d: %v; want ECONNRESET", i, err)
		}
	}
}

// TestChild runs real programs inside the namespace with Command: they
// reach the service through it, the fault applies to them, and the PID
// returned is the program's own (ip execs it), so signals by PID work.
func TestChild(t *testing.T) {
	t.Parallel()
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatal("bash (for /dev/tcp) not found:", err)
	}
	srv := newEchoServer(t)
	ns := newNS(t, srv.port)

	// 1. A child that talks through the namespace and prints its own PID.
	cmd := ns.Command(bash, "-c", fmt.Sprintf(
		`echo "$$"; exec 3<>/dev/tcp/127.0.0.1/%d; printf 'child-hello\n' >&3; IFS= read -r -t 5 line <&3; echo "$line"`, srv.port))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child: %v: %s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 2 || lines[0] != strconv.Itoa(cmd.Process.Pid) || lines[1] != "child-hello" {
		t.Fatalf("child printed %q; want its PID %d (the one we hold) and the echo", out, cmd.Process.Pid)
	}
	if m, ok := srv.received(time.Second); !ok || m != "child-hello\n" {
		t.Fatalf("server got %q, %v", m, ok)
	}

	// 2. The fault applies to children: a connection attempt times out
	// (timeout's exit 124), where a refusal would fail at once (exit 1).
	if err := ns.Inject(Cut(srv.port)); err != nil {
		t.Fatal(err)
	}
	cmd = ns.Command("timeout", "2", bash, "-c", fmt.Sprintf(`exec 3<>/dev/tcp/127.0.0.1/%d`, srv.port))
	out, err = cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 124 {
		t.Fatalf("connect during the cut: %v (%s); want exit 124, timed out", err, out)
	}
	if err := ns.Heal(); err != nil {
		t.Fatal(err)
	}

	// 3. A long-running child: inside the namespace, stoppable and
	// killable by the PID we hold.
	cmd = ns.Command(bash, "-c", "echo ready; exec sleep 60")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	// One goroutine reads stdout (the "ready" line, then the rest) and
	// then reaps the child; the deferred SIGKILL bounds both.
	ready := make(chan string, 1)
	waited := make(chan error, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		ready <- line
		_, _ = io.Copy(io.Discard, stdout)
		waited <- cmd.Wait()
	}()
	defer func() {
		_ = syscall.Kill(pid, syscall.SIGKILL) // ours: started above
	}()
	select {
	case line := <-ready:
		if line != "ready\n" {
			t.Fatalf("child said %q", line)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("child not ready after 10s")
	}
	if in, err := ns.Contains(pid); err != nil || !in {
		t.Fatalf("pid %d in namespace: %v, %v", pid, in, err)
	}
	if in, err := ns.Contains(os.Getpid()); err != nil || in {
		t.Fatalf("the test process itself in the namespace: %v, %v", in, err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if st := waitState(pid, 'T', 5*time.Second); st != 'T' {
		t.Fatalf("pid %d state %q after SIGSTOP; want T", pid, st)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-waited:
		if !errors.As(err, &ee) || ee.ProcessState.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("child ended with %v; want killed by SIGKILL", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("child not reaped 10s after SIGKILL")
	}
}

// waitState polls /proc/pid/stat (bounded) until the process is in state
// want, and returns the last state seen.
func waitState(pid int, want byte, d time.Duration) byte {
	var st byte
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		s, err := childproc.ReadStat(pid)
		if err != nil {
			return 0
		}
		st = s.State
		if st == want {
			break
		}
	}
	return st
}

// TestClose: no namespace, no forwarder goroutine and no forwarded
// connection survive Close, even a connection that was cut (half-open).
// Not parallel: the parallel tests wait until it is done, so every
// forwarder goroutine and namespace of this process is its own.
func TestClose(t *testing.T) {
	srv := newEchoServer(t)
	ns, err := New(srv.port)
	if err != nil {
		t.Fatal(err)
	}
	name := ns.Name()
	halfOpen(t, ns, srv.port, 0, "x")
	if n := srv.openConns(); n != 1 {
		t.Fatalf("server has %d connections, want 1", n)
	}
	if err := ns.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ns.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := os.Stat(netnsDir + "/" + name); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s/%s after Close: %v", netnsDir, name, err)
	}
	out, err := exec.Command("ip", "netns", "list").CombinedOutput()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out)+"\n", name+" ") || strings.Contains(string(out)+"\n", name+"\n") {
		t.Fatalf("ip netns list still shows %s:\n%s", name, out)
	}
	if n := openNamespaces(); n != 0 {
		t.Fatalf("%d namespaces of this process after Close", n)
	}
	if stacks := forwarderStacks(); stacks != "" {
		t.Fatalf("forwarder goroutines after Close:\n%s", stacks)
	}
	if n := ns.fwd.active(); n != 0 {
		t.Fatalf("forwarder tracks %d connections after Close", n)
	}
	// The root side of the cut connection was closed by Close.
	for deadline := time.Now().Add(5 * time.Second); srv.openConns() > 0 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if n := srv.openConns(); n != 0 {
		t.Fatalf("server still has %d connections after Close", n)
	}
	if err := ns.Inject(Cut(srv.port)); err == nil {
		t.Fatal("Inject after Close succeeded")
	}
}

// forwarderStacks returns the stacks of goroutines in forwarder code.
func forwarderStacks() string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "netfault.(*forwarder)") {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}

// openNamespaces counts this process's namespaces still named.
func openNamespaces() int {
	entries, _ := os.ReadDir(netnsDir)
	prefix := fmt.Sprintf("%s%d-", namePrefix, os.Getpid())
	n := 0
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			n++
		}
	}
	return n
}

// TestCloseReportsProcesses: Close does not kill a child left inside, but
// says so.
func TestCloseReportsProcesses(t *testing.T) {
	t.Parallel()
	srv := newEchoServer(t)
	ns, err := New(srv.port)
	if err != nil {
		t.Fatal(err)
	}
	cmd := ns.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		ns.Close()
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Kill() // ours
		_ = cmd.Wait()
	}()
	// Until ip has called setns, the child is not in the namespace yet.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if in, _ := ns.Contains(cmd.Process.Pid); in {
			break
		}
	}
	err = ns.Close()
	if err == nil || !strings.Contains(err.Error(), strconv.Itoa(cmd.Process.Pid)) {
		t.Fatalf("Close with pid %d inside: %v; want an error naming it", cmd.Process.Pid, err)
	}
	if err := syscall.Kill(cmd.Process.Pid, 0); err != nil {
		t.Fatalf("Close killed the child: %v", err)
	}
}

// TestSweep: a namespace left by a test process that is gone is deleted by
// the next New.
func TestSweep(t *testing.T) {
	t.Parallel()
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	stale := fmt.Sprintf("%s%d-1", namePrefix, dead.Process.Pid)
	if out, err := exec.Command("ip", "netns", "add", stale).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", stale).Run() })
	srv := newEchoServer(t)
	newNS(t, srv.port)
	if _, err := os.Stat(netnsDir + "/" + stale); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stale namespace %s of dead pid %d not swept: %v", stale, dead.Process.Pid, err)
	}
}

// TestUnsupported: without ip, New fails with ErrUnsupported, so that a
// caller can tell "cannot run here" from a bug.
func TestUnsupported(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	if _, err := New(1); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("New without ip on PATH: %v; want ErrUnsupported", err)
	}
}
