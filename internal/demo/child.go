package demo

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/tenure-dev/tenure/internal/childproc"
)

// child is a `tenure worker` process started by the demo, and the JSON
// log lines it wrote to stderr (a pipe the demo reads; never the terminal).
// The mechanics are childproc's; the methods here word the demo's messages.
type child struct {
	*childproc.Proc
	name string
	pid  int
}

// ErrInterrupted ends the demo when its context is cancelled (Ctrl-C).
var ErrInterrupted = errors.New("interrupted; the demo's worker processes were killed")

// startChild starts the running binary again with args. The child gets
// its own process group, so that the terminal's Ctrl-C reaches only the demo,
// which then kills it by PID; on Linux the kernel also kills it if the demo
// dies without cleaning up (childproc.Options.OwnGroup). echo, when not nil,
// receives every line the child logs.
func startChild(name string, env []string, echo func(string), args ...string) (*child, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("finding the tenure binary to start worker %s: %w", name, err)
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = env
	// Every line kept: the demo looks back to the first (find(0, ...)).
	opts := childproc.Options{Name: "worker " + name, Keep: childproc.KeepAll, OwnGroup: true}
	if echo != nil {
		opts.OnLine = func(l childproc.Line) { echo(l.Raw) }
	}
	p, err := childproc.Start(cmd, opts)
	if err != nil {
		return nil, fmt.Errorf("starting worker %s: %w", name, err)
	}
	return &child{Proc: p, name: name, pid: p.PID()}, nil
}

// waitLog waits up to timeout for a line (from index since, a Count) that
// match accepts. what completes the sentence "waiting for ...".
func (c *child) waitLog(ctx context.Context, timeout time.Duration, since int, what string, match func(map[string]any) bool) (childproc.Line, error) {
	tctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	l, err := c.WaitLine(tctx, since, match)
	switch {
	case err == nil:
		return l, nil
	case errors.Is(err, childproc.ErrExited):
		return l, c.exitedWhile(what)
	case ctx.Err() != nil:
		return l, ErrInterrupted
	}
	return l, fmt.Errorf("timed out after %s waiting for %s (run with --verbose to see the workers' logs)", timeout, what)
}

// exitedWhile says that the child exited while the demo was waiting for
// what, with its last words.
func (c *child) exitedWhile(what string) error {
	return fmt.Errorf("worker %s (pid %d) exited (%v) while the demo was waiting for %s; its last words: %s",
		c.name, c.pid, c.ExitErr(), what, c.lastWords())
}

// lastWords is the child's last log message, or its last plain line (the
// one-sentence error a failing command prints).
func (c *child) lastWords() string {
	lines := c.Lines(0)
	for i := len(lines) - 1; i >= 0; i-- {
		l := lines[i]
		if l.Fields == nil {
			if s := strings.TrimSpace(l.Raw); s != "" {
				return s
			}
			continue
		}
		if lvl := fmt.Sprint(l.Fields["level"]); lvl == "error" || lvl == "fatal" || lvl == "warn" {
			msg := fmt.Sprint(l.Fields["msg"])
			if e, ok := l.Fields["error"]; ok {
				msg += ": " + fmt.Sprint(e)
			}
			return msg
		}
	}
	return "(nothing logged)"
}

// signal sends sig to this child, by its PID, if it still runs.
func (c *child) signal(sig syscall.Signal) error {
	err := c.Signal(sig)
	switch {
	case errors.Is(err, childproc.ErrExited):
		return fmt.Errorf("worker %s (pid %d) has already exited (%v): %s", c.name, c.pid, c.ExitErr(), c.lastWords())
	case err != nil:
		return fmt.Errorf("sending %s to worker %s (pid %d): %w", sig, c.name, c.pid, err)
	}
	return nil
}

// freeze sends SIGSTOP and waits until the kernel reports the process
// stopped (where /proc does not exist, a moment).
func (c *child) freeze(timeout time.Duration) error {
	if c.Exited() {
		return c.signal(syscall.SIGSTOP) // says that it has exited
	}
	err := c.Freeze(timeout)
	switch {
	case errors.Is(err, childproc.ErrExited):
		return fmt.Errorf("worker %s (pid %d) exited (%v): %s", c.name, c.pid, c.ExitErr(), c.lastWords())
	case errors.Is(err, childproc.ErrTimeout):
		return fmt.Errorf("worker %s (pid %d) did not stop within %s of SIGSTOP", c.name, c.pid, timeout)
	}
	return err
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
