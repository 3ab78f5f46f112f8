package netfault

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// ErrUnsupported is wrapped by New's error when this machine cannot make
// namespaces or faults (not root, no ip, no nft, no nf_tables).
var ErrUnsupported = errors.New("netfault: network namespaces with nftables not available")

const (
	namePrefix = "tnf-"
	netnsDir   = "/run/netns" // where `ip netns add` mounts named namespaces
	// cmdTimeout bounds every ip and nft command: they take milliseconds,
	// and a hung one must not hang the test.
	cmdTimeout = 10 * time.Second
	// closeTimeout bounds how long Close waits for forwarder goroutines.
	closeTimeout = 5 * time.Second
)

// forwarderKeepAlive is set on the forwarder's end of each worker
// connection, explicitly, at Go's defaults: it plays the server's
// keepalive. A worker silent for about Idle + Count*Interval (2.5 min) under
// a cut, or one that died during it, is declared gone, and the forwarder
// closes its connection to the service, which then sees the client leave,
// as a real server with keepalive would (later: Linux's default is 2 h).
// Cuts shorter than that leave the connection half-open throughout. While
// the forwarder has answers in flight to the worker, keepalive does not
// run: TCP's retransmission limit applies instead (tcp_retries2, about
// 15 min), as it would on the server.
var forwarderKeepAlive = net.KeepAliveConfig{Enable: true, Idle: 15 * time.Second, Interval: 15 * time.Second, Count: 9}

var nsCounter atomic.Int64

// Namespace is a network namespace with forwarders from its 127.0.0.1:<port>
// to the root namespace's 127.0.0.1:<port>, for each port given to New.
type Namespace struct {
	name  string
	ports []int
	fd    *os.File // the namespace, open for setns(2)

	fwd *forwarder

	applyMu sync.Mutex // one nftables change at a time (Inject, Blackhole)
	mu      sync.Mutex
	faults  []Fault      // installed now; nil when healed
	holes   []netip.Addr // Blackhole's addresses: dropped whatever the faults
	closed  bool
}

// NewT is New for tests: the namespace is closed by t.Cleanup, and Close's
// error fails the test.
func NewT(t testing.TB, ports ...int) (*Namespace, error) {
	n, err := New(ports...)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Errorf("%v", err)
		}
	})
	return n, nil
}

// New makes a namespace, brings its loopback up, checks that nftables works
// in it, and listens on 127.0.0.1:<port> inside it for each port, forwarding
// to 127.0.0.1:<port> in the root namespace. The caller must Close it.
func New(ports ...int) (n *Namespace, err error) {
	if len(ports) == 0 {
		return nil, errors.New("netfault: New needs at least one port to forward")
	}
	for _, p := range ports {
		if p <= 0 || p > 65535 {
			return nil, fmt.Errorf("netfault: bad port %d", p)
		}
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("%w: must run as root to create network namespaces", ErrUnsupported)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, fmt.Errorf("%w: iproute2's ip not found (apt-get install iproute2): %v", ErrUnsupported, err)
	}
	if _, err := nftPath(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnsupported, err)
	}
	sweepStale()

	name := fmt.Sprintf("%s%d-%d", namePrefix, os.Getpid(), nsCounter.Add(1))
	if out, err := run(nil, "ip", "netns", "add", name); err != nil {
		return nil, fmt.Errorf("%w: ip netns add %s: %v: %s", ErrUnsupported, name, err, out)
	}
	n = &Namespace{name: name, ports: append([]int(nil), ports...)}
	defer func() {
		if err != nil {
			n.Close()
		}
	}()
	if out, err := run(nil, "ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"); err != nil {
		return nil, fmt.Errorf("netfault: bringing lo up in %s: %v: %s", name, err, out)
	}
	// Probe nftables now rather than at the first fault, mid-run.
	if err := n.Heal(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnsupported, err)
	}
	if n.fd, err = os.Open(filepath.Join(netnsDir, name)); err != nil {
		return nil, fmt.Errorf("%v", err)
	}
	n.fwd = newForwarder()
	for _, p := range n.ports {
		var ln net.Listener
		err := n.Do(func() error {
			var err error
			lc := net.ListenConfig{KeepAliveConfig: forwarderKeepAlive}
			ln, err = lc.Listen(context.Background(), "tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("netfault: listening on 127.0.0.1:%d in %s: %v", p, name, err)
		}
		n.fwd.serve(ln, p)
	}
	return n, nil
}

// Name is the namespace's name, as `ip netns list` shows it.
func (n *Namespace) Name() string { return n.name }

// Ports are the forwarded ports.
func (n *Namespace) Ports() []int { return append([]int(nil), n.ports...) }

// Do runs fn on an OS thread inside the namespace, so that sockets fn
// creates (net.Listen, net.Dial) belong to it; they keep it after fn
// returns, whichever thread uses them. Goroutines fn starts run in the root
// namespace.
//
// The thread is switched back before it is unlocked. Letting it die
// instead (return while still locked) looks simpler but is wrong: if the
// goroutine happens to run on the main thread, the runtime cannot end that
// thread and parks it forever, still in the namespace, so the process
// itself appears to be in it (/proc/<pid>/ns/net is the main thread's) and
// the namespace is never freed. Only if switching back fails is the thread
// left locked, to be discarded.
func (n *Namespace) Do(fn func() error) error {
	if n.fd == nil {
		return errors.New("netfault: namespace not open")
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		home, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("netfault: %w", err)
			return
		}
		defer home.Close()
		if err := unix.Setns(int(n.fd.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("netfault: setns into %s: %w", n.name, err)
			return
		}
		ferr := fn()
		if err := unix.Setns(int(home.Fd()), unix.CLONE_NEWNET); err != nil {
			// Stay locked: the goroutine ends and the thread with it (or,
			// on the main thread, is parked), never serving another one.
			errc <- errors.Join(ferr, fmt.Errorf("netfault: setns back from %s: %w", n.name, err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// Command returns `ip netns exec <ns> name args...`. ip execs name without
// forking, so cmd.Process.Pid is name's own PID once started (for the
// first milliseconds it is still ip, not yet in the namespace; name only
// runs once inside). Stdin, stdout, stderr and Env are the caller's to
// set, as for exec.Command.
func (n *Namespace) Command(name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", n.name, name}, args...)...)
}

// CommandContext is Command with exec.CommandContext's kill on ctx's end.
func (n *Namespace) CommandContext(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.name, name}, args...)...)
}

// Contains reports whether process pid runs inside the namespace.
func (n *Namespace) Contains(pid int) (bool, error) {
	if n.fd == nil {
		return false, errors.New("netfault: namespace not open")
	}
	var ns, p unix.Stat_t
	if err := unix.Fstat(int(n.fd.Fd()), &ns); err != nil {
		return false, err
	}
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &p); err != nil {
		return false, err
	}
	return ns.Dev == p.Dev && ns.Ino == p.Ino, nil
}

// Close stops the forwarders, closes the connections they carry and
// deletes the namespace. It kills nothing: if processes still run inside,
// it deletes the namespace's name anyway (the kernel keeps the namespace
// until they exit, unreachable) and reports their PIDs. Safe to call twice.
func (n *Namespace) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	n.mu.Unlock()

	var errs []error
	if n.fwd != nil {
		if err := n.fwd.close(closeTimeout); err != nil {
			errs = append(errs, err)
		}
	}
	if out, err := run(nil, "ip", "netns", "pids", n.name); err == nil && len(strings.TrimSpace(string(out))) > 0 {
		errs = append(errs, fmt.Errorf("netfault: processes still in %s at Close (stop them first): %s",
			n.name, strings.Join(strings.Fields(string(out)), " ")))
	}
	if n.fd != nil {
		n.fd.Close()
	}
	if out, err := run(nil, "ip", "netns", "del", n.name); err != nil {
		errs = append(errs, fmt.Errorf("netfault: ip netns del %s: %v: %s", n.name, err, out))
	}
	return errors.Join(errs...)
}

// sweepStale deletes tnf-<pid>-<n> namespaces whose test process is gone
// (SIGKILLed, timed out), so that they do not pile up. A namespace whose
// pid is alive, or reused, is left alone.
func sweepStale() {
	entries, err := os.ReadDir(netnsDir)
	if err != nil {
		return
	}
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), namePrefix)
		if !ok {
			continue
		}
		pidStr, _, ok := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if !ok || err != nil || pid <= 0 {
			continue
		}
		if err := syscall.Kill(pid, 0); err == nil || errors.Is(err, syscall.EPERM) {
			continue // alive
		}
		_, _ = run(nil, "ip", "netns", "del", e.Name())
	}
}

// run runs a short command with cmdTimeout and stdin, returning its
// combined output.
func run(stdin *strings.Reader, name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	if stdin != nil {
		cmd.Stdin = stdin
	}
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		err = fmt.Errorf("%s %s: timed out after %s", name, strings.Join(args, " "), cmdTimeout)
	}
	return out, err
}
