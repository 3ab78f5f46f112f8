package chaos

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tenure-dev/tenure/internal/netfault"
)

// proc is one process the run started: a worker or the broker. Every
// process is ended by its PID, and a process stopped with SIGSTOP always
// gets SIGCONT before anything else is sent to it.
type proc struct {
	name    string
	cmd     *exec.Cmd
	started time.Time
	done    chan struct{} // closed when the process has exited and its output is read

	mu       sync.Mutex
	stopped  bool // SIGSTOP sent, SIGCONT not yet
	expected bool // we ended it (kill, stop): its exit is not news
	tail     []string
	exitErr  error
	exitedAt time.Time
}

const tailLines = 200

// startProc starts tenure with args, inside network namespace ns unless it
// is nil (ns.Command: the PID is still tenure's own); every line of its
// stdout and stderr goes to logPath and, for stderr, to onLine.
func startProc(name, logPath string, ns *netfault.Namespace, args []string, onLine func(p *proc, line string)) (*proc, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(tenureBin, args...)
	where := ""
	if ns != nil {
		cmd = ns.Command(tenureBin, args...)
		where = " in network namespace " + ns.Name()
	}
	cmd.Env = os.Environ()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		f.Close()
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		f.Close()
		return nil, err
	}
	fmt.Fprintf(f, "---- %s started at %s%s: %s %s\n", name, time.Now().Format(time.RFC3339Nano), where, filepath.Base(tenureBin), strings.Join(args, " "))
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, err
	}
	p := &proc{name: name, cmd: cmd, started: time.Now(), done: make(chan struct{})}
	var fileMu sync.Mutex
	var readers sync.WaitGroup
	read := func(r io.Reader, parse bool) {
		defer readers.Done()
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			fileMu.Lock()
			fmt.Fprintln(f, line)
			fileMu.Unlock()
			p.mu.Lock()
			p.tail = append(p.tail, line)
			if len(p.tail) > 2*tailLines {
				p.tail = append([]string(nil), p.tail[len(p.tail)-tailLines:]...)
			}
			p.mu.Unlock()
			if parse && onLine != nil {
				onLine(p, line)
			}
		}
		_, _ = io.Copy(io.Discard, r)
	}
	readers.Add(2)
	go read(stdout, false)
	go read(stderr, true)
	go func() {
		readers.Wait()
		err := cmd.Wait()
		p.mu.Lock()
		p.exitErr, p.exitedAt = err, time.Now()
		p.mu.Unlock()
		fmt.Fprintf(f, "---- %s exited at %s: %v\n", name, time.Now().Format(time.RFC3339Nano), exitString(err))
		f.Close()
		close(p.done)
	}()
	return p, nil
}

func exitString(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// exitTime is when the process exited (its output read), or zero.
func (p *proc) exitTime() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exitedAt
}

func (p *proc) signal(sig syscall.Signal) {
	if p.exited() {
		return
	}
	_ = p.cmd.Process.Signal(sig) // by PID: the process we started
}

// pause sends SIGSTOP and waits (bounded) until the kernel reports the
// process stopped.
func (p *proc) pause() error {
	p.mu.Lock()
	p.stopped = true
	p.mu.Unlock()
	p.signal(syscall.SIGSTOP)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if p.exited() {
			return fmt.Errorf("%s exited instead of stopping", p.name)
		}
		if p.state() == 'T' {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("%s (pid %d) not stopped 5s after SIGSTOP (state %q)", p.name, p.pid(), p.state())
}

func (p *proc) resume() {
	p.signal(syscall.SIGCONT)
	p.mu.Lock()
	p.stopped = false
	p.mu.Unlock()
}

// state is the process's state letter in /proc/PID/stat ('T' when stopped).
func (p *proc) state() byte {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.pid()))
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return 0
	}
	return s[i+2]
}

// kill resumes the process if it is stopped, sends SIGKILL and waits
// (bounded) for it to exit.
func (p *proc) kill() error {
	p.mu.Lock()
	p.expected = true
	stopped := p.stopped
	p.mu.Unlock()
	if stopped {
		p.resume()
	}
	p.signal(syscall.SIGKILL)
	select {
	case <-p.done:
		return nil
	case <-time.After(15 * time.Second):
		return fmt.Errorf("%s (pid %d) did not exit 15s after SIGKILL", p.name, p.pid())
	}
}

// stop asks for a graceful stop (SIGTERM) and waits up to timeout; past it
// the process gets SIGQUIT (a goroutine dump), then SIGKILL, and stop
// reports that it had to.
func (p *proc) stop(timeout time.Duration) error {
	p.mu.Lock()
	p.expected = true
	stopped := p.stopped
	p.mu.Unlock()
	if stopped {
		p.resume()
	}
	p.signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(timeout):
	}
	// A Go process prints every goroutine's stack on SIGQUIT and exits:
	// the log then shows where the stop hung.
	p.signal(syscall.SIGQUIT)
	select {
	case <-p.done:
		return fmt.Errorf("%s (pid %d) did not stop within %s of SIGTERM: SIGQUIT, its goroutine dump is at the end of its log", p.name, p.pid(), timeout)
	case <-time.After(5 * time.Second):
	}
	err := fmt.Errorf("%s (pid %d) did not stop within %s of SIGTERM, nor on SIGQUIT: killed", p.name, p.pid(), timeout)
	if kerr := p.kill(); kerr != nil {
		err = fmt.Errorf("%v; %v", err, kerr)
	}
	return err
}

// unexpectedExit reports whether the process ended without being asked to.
func (p *proc) unexpectedExit() (bool, error) {
	if !p.exited() {
		return false, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.expected, p.exitErr
}

func (p *proc) lastLines(n int) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.tail) > n {
		return append([]string(nil), p.tail[len(p.tail)-n:]...)
	}
	return append([]string(nil), p.tail...)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitListening waits until addr accepts TCP connections.
func waitListening(addr string, timeout time.Duration, p *proc) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		if p != nil && p.exited() {
			return fmt.Errorf("%s exited before listening on %s: %s", p.name, addr, strings.Join(p.lastLines(10), "\n"))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nothing listening on %s after %s: %v", addr, timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
