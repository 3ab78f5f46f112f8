package demo

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// child is a `tenure worker` process started by the demo, and the JSON
// log lines it wrote to stderr (a pipe the demo reads; never the terminal).
type child struct {
	name string
	cmd  *exec.Cmd
	pid  int

	mu      sync.Mutex
	lines   []logLine
	changed chan struct{} // closed and replaced on every new line

	done    chan struct{} // closed once the process is reaped
	exitErr error         // cmd.Wait's error; read after done
}

type logLine struct {
	at     time.Time
	raw    string
	fields map[string]any // nil when the line is not JSON
}

// ErrInterrupted ends the demo when its context is cancelled (Ctrl-C).
var ErrInterrupted = errors.New("interrupted; the demo's worker processes were killed")

// startChild starts the running binary again with args. The child gets
// its own process group, so that the terminal's Ctrl-C reaches only the demo,
// which then kills it by PID; on Linux the kernel also kills it if the demo
// dies without cleaning up (see sysProcAttr). echo, when not nil,
// receives every line the child logs.
func startChild(name string, env []string, echo func(string), args ...string) (*child, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("finding the tenure binary to start worker %s: %w", name, err)
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = env
	cmd.SysProcAttr = sysProcAttr()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting worker %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, pid: cmd.Process.Pid, changed: make(chan struct{}), done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			raw := sc.Text()
			if echo != nil {
				echo(raw)
			}
			var m map[string]any
			if json.Unmarshal([]byte(raw), &m) != nil {
				m = nil
			}
			c.mu.Lock()
			c.lines = append(c.lines, logLine{at: time.Now(), raw: raw, fields: m})
			close(c.changed)
			c.changed = make(chan struct{})
			c.mu.Unlock()
		}
		// Wait only after the pipe is drained (os/exec's rule); it reaps
		// the process.
		c.exitErr = cmd.Wait()
		close(c.done)
	}()
	return c, nil
}

// count is the number of lines logged so far: pass it to waitLog as since
// to consider only what comes next.
func (c *child) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.lines)
}

// find returns the first line from index since that match accepts.
func (c *child) find(since int, match func(map[string]any) bool) (logLine, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := since; i < len(c.lines); i++ {
		if l := c.lines[i]; l.fields != nil && match(l.fields) {
			return l, true
		}
	}
	return logLine{}, false
}

// waitLog waits up to timeout for a line (from index since) that match
// accepts. what completes the sentence "waiting for ...".
func (c *child) waitLog(ctx context.Context, timeout time.Duration, since int, what string, match func(map[string]any) bool) (logLine, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		c.mu.Lock()
		ch := c.changed
		c.mu.Unlock()
		if l, ok := c.find(since, match); ok {
			return l, nil
		}
		select {
		case <-ch:
		case <-c.done:
			if l, ok := c.find(since, match); ok {
				return l, nil
			}
			return logLine{}, fmt.Errorf("worker %s (pid %d) exited (%v) while the demo was waiting for %s; its last words: %s",
				c.name, c.pid, c.exitErr, what, c.lastWords())
		case <-t.C:
			return logLine{}, fmt.Errorf("timed out after %s waiting for %s (run with --verbose to see the workers' logs)", timeout, what)
		case <-ctx.Done():
			return logLine{}, ErrInterrupted
		}
	}
}

// lastWords is the child's last log message, or its last plain line (the
// one-sentence error a failing command prints).
func (c *child) lastWords() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(c.lines) - 1; i >= 0; i-- {
		l := c.lines[i]
		if l.fields == nil {
			if s := strings.TrimSpace(l.raw); s != "" {
				return s
			}
			continue
		}
		if lvl := fmt.Sprint(l.fields["level"]); lvl == "error" || lvl == "fatal" || lvl == "warn" {
			msg := fmt.Sprint(l.fields["msg"])
			if e, ok := l.fields["error"]; ok {
				msg += ": " + fmt.Sprint(e)
			}
			return msg
		}
	}
	return "(nothing logged)"
}

func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// signal sends sig to this child, by its PID, if it still runs.
func (c *child) signal(sig syscall.Signal) error {
	if c.exited() {
		return fmt.Errorf("worker %s (pid %d) has already exited (%v): %s", c.name, c.pid, c.exitErr, c.lastWords())
	}
	if err := c.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("sending %s to worker %s (pid %d): %w", sig, c.name, c.pid, err)
	}
	return nil
}

// kill ends the child with SIGKILL (which also ends a stopped process) and
// waits until it is reaped.
func (c *child) kill() {
	if c.exited() {
		return
	}
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		// Cannot happen short of an unkillable process (D state); do not
		// hang the demo on it.
	}
}

// stop asks for a graceful stop (SIGTERM) and waits up to timeout, then
// kills. It reports whether the stop was graceful.
func (c *child) stop(timeout time.Duration) bool {
	if c.exited() {
		return true
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
		return true
	case <-time.After(timeout):
		c.kill()
		return false
	}
}

// frozen waits until the kernel reports the process stopped (state T in
// /proc/PID/stat). Where /proc does not exist it waits a moment instead.
func (c *child) frozen(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.pid))
		if err != nil {
			if c.exited() {
				return fmt.Errorf("worker %s (pid %d) exited (%v): %s", c.name, c.pid, c.exitErr, c.lastWords())
			}
			if errors.Is(err, os.ErrNotExist) {
				time.Sleep(200 * time.Millisecond)
				return nil
			}
			return err
		}
		s := string(b)
		if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) && (s[i+2] == 'T' || s[i+2] == 't') {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("worker %s (pid %d) did not stop within %s of SIGSTOP", c.name, c.pid, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// logMsg matches a log line whose msg is msg (or starts with it when msg
// ends in "*") and whose other fields, given as key, value pairs, print as
// the values given.
func logMsg(msg string, kv ...string) func(map[string]any) bool {
	return func(m map[string]any) bool {
		got, _ := m["msg"].(string)
		if p, ok := strings.CutSuffix(msg, "*"); ok {
			if !strings.HasPrefix(got, p) {
				return false
			}
		} else if got != msg {
			return false
		}
		for i := 0; i+1 < len(kv); i += 2 {
			v, ok := m[kv[i]]
			if !ok || fmt.Sprint(v) != kv[i+1] {
				return false
			}
		}
		return true
	}
}

// anyOf matches a line that any of ms matches.
func anyOf(ms ...func(map[string]any) bool) func(map[string]any) bool {
	return func(m map[string]any) bool {
		for _, f := range ms {
			if f(m) {
				return true
			}
		}
		return false
	}
}

// str reads a log field as a string ("" when absent).
func str(m map[string]any, k string) string {
	v, ok := m[k]
	if !ok || v == nil {
		return ""
	}
	if f, ok := v.(float64); ok && f == float64(int64(f)) {
		return fmt.Sprint(int64(f))
	}
	return fmt.Sprint(v)
}

// intField reads a numeric log field.
func intField(m map[string]any, k string) (int64, bool) {
	f, ok := m[k].(float64)
	return int64(f), ok
}
