// Package childproc runs a child process for tests, the demo and the bench:
// it reads the child's stderr as lines (zap JSON log lines, parsed; other
// lines kept as raw text), waits for a line that matches, freezes and thaws
// the child (SIGSTOP, SIGCONT), reads its kernel state, CPU time and peak
// memory, and ends it. Every signal goes to the child's own PID, never to a
// process group or a name, and every wait is bounded.
package childproc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// DefaultKeep is how many lines a Proc keeps when Options.Keep is 0.
const DefaultKeep = 1000

// KeepAll, as Options.Keep, keeps every line: for callers that search the
// whole log (tests, the demo), whose children live minutes, not days.
const KeepAll = -1

// maxLine bounds one line: a longer one is cut there (and the rest is the
// next line) rather than held in memory without limit.
const maxLine = 4 << 20

var (
	// ErrExited is wrapped by the errors of calls that need a running
	// process and found it gone.
	ErrExited = errors.New("childproc: process exited")
	// ErrTimeout is wrapped by the errors of waits that ran out of time.
	ErrTimeout = errors.New("childproc: timed out")
)

// Options say where a child's lines also go and how it is stopped. The zero
// value is usable.
type Options struct {
	// Name names the process in error messages ("worker A", "broker").
	Name string
	// Output, if set, receives every line (stderr, and stdout with
	// ReadStdout) followed by "\n", one line at a time: a log file.
	Output io.Writer
	// OnLine, if set, is called with every line, one at a time, from the
	// goroutine that reads the child's output: it must return quickly, or
	// the child blocks on a full pipe.
	OnLine func(Line)
	// ReadStdout reads stdout as lines too (Line.Stdout set). Otherwise
	// cmd.Stdout is left as the caller set it (nil: /dev/null).
	ReadStdout bool
	// Keep is how many of the latest lines are kept for Lines, Find,
	// WaitLine and Tail (0: DefaultKeep; KeepAll: every line). Up to twice
	// as many are held: the oldest are dropped in bulk.
	Keep int
	// OwnGroup starts the child in a process group of its own, so that the
	// terminal's Ctrl-C reaches only the parent, which ends the child by
	// its PID; on Linux the kernel also SIGKILLs the child if the parent
	// dies first (Pdeathsig).
	OwnGroup bool
	// StopSignal is what Stop sends first (nil: SIGTERM).
	StopSignal os.Signal
	// QuitGrace, when positive, makes Stop send SIGQUIT to a child that
	// outlived its timeout, and wait this long before SIGKILL: a Go program
	// prints every goroutine's stack on SIGQUIT, which shows where it hung.
	QuitGrace time.Duration
	// KillWait bounds how long Kill waits for the child to be reaped after
	// SIGKILL (0: 10s). Only an unkillable process (D state) takes long.
	KillWait time.Duration
	// OnExit, if set, is called once with cmd.Wait's error when the child
	// has been reaped and its output read, before Done is closed.
	OnExit func(err error)
}

// Line is one line the child wrote.
type Line struct {
	N      int            // its index: 0 for the first line, across both streams
	At     time.Time      // when it was read
	Raw    string         // the text, without its newline
	Fields map[string]any // the JSON object; nil when the line is not one
	Stdout bool           // read from stdout rather than stderr
}

// Proc is a running (or exited) child process. Its methods are safe for
// concurrent use.
type Proc struct {
	cmd  *exec.Cmd
	opts Options
	pid  int
	done chan struct{} // closed once reaped and its output read

	outMu sync.Mutex // serializes Output and OnLine

	mu       sync.Mutex
	lines    []Line        // the kept lines; lines[0].N == count-len(lines)
	count    int           // lines read so far
	changed  chan struct{} // closed and replaced on every new line
	frozen   bool          // SIGSTOP sent, SIGCONT not yet
	ending   bool          // Stop or Kill called: the exit was asked for
	exitErr  error
	exitedAt time.Time
}

// Start starts cmd, which the caller built (path, args, Env, Dir; a wrapper
// such as `ip netns exec` is fine as long as it execs the program, so that
// the PID stays the program's). cmd.Stderr must be nil (and cmd.Stdout too
// with ReadStdout): the Proc reads them.
func Start(cmd *exec.Cmd, opts Options) (*Proc, error) {
	if cmd.Stderr != nil || (opts.ReadStdout && cmd.Stdout != nil) {
		return nil, errors.New("childproc: cmd.Stderr (and cmd.Stdout with ReadStdout) must be nil: the Proc reads them")
	}
	if opts.Keep == 0 {
		opts.Keep = DefaultKeep
	}
	if opts.StopSignal == nil {
		opts.StopSignal = syscall.SIGTERM
	}
	if opts.KillWait <= 0 {
		opts.KillWait = 10 * time.Second
	}
	p := &Proc{cmd: cmd, opts: opts, done: make(chan struct{}), changed: make(chan struct{})}
	stderr := &lineWriter{p: p}
	cmd.Stderr = stderr
	var stdout *lineWriter
	if opts.ReadStdout {
		stdout = &lineWriter{p: p, stdout: true}
		cmd.Stdout = stdout
	}
	if opts.OwnGroup {
		if cmd.SysProcAttr == nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{}
		}
		ownGroup(cmd.SysProcAttr)
	}
	if cmd.WaitDelay == 0 {
		// A grandchild that inherited the pipes could keep them open after
		// the child exits: read them at most this long after that.
		cmd.WaitDelay = 10 * time.Second
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p.pid = cmd.Process.Pid
	go func() {
		// Wait returns once the child exited and os/exec copied all of its
		// output into the lineWriters (bounded by WaitDelay); it reaps it.
		err := cmd.Wait()
		stderr.flush()
		if stdout != nil {
			stdout.flush()
		}
		p.mu.Lock()
		p.exitErr, p.exitedAt = err, time.Now()
		p.mu.Unlock()
		if opts.OnExit != nil {
			opts.OnExit(err)
		}
		close(p.done)
	}()
	return p, nil
}

// Name is Options.Name.
func (p *Proc) Name() string { return p.opts.Name }

// PID is the child's process id.
func (p *Proc) PID() int { return p.pid }

// Done is closed once the child has exited, been reaped and its output read.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited reports whether Done is closed.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// ExitErr is cmd.Wait's error (nil for exit status 0, or while running).
func (p *Proc) ExitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exitErr
}

// ExitedAt is when the child was reaped and its output read (zero while
// running).
func (p *Proc) ExitedAt() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exitedAt
}

// ProcessState is the exited child's state (exit code, rusage); nil while
// it runs.
func (p *Proc) ProcessState() *os.ProcessState {
	if !p.Exited() {
		return nil
	}
	return p.cmd.ProcessState
}

// StopRequested reports whether Stop or Kill was called: an exit after that
// was asked for, one before it is the child's own.
func (p *Proc) StopRequested() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ending
}

// exitedError wraps ErrExited with the process's name, pid and exit.
func (p *Proc) exitedError(format string, args ...any) error {
	return &procError{msg: fmt.Sprintf(format, args...), is: ErrExited}
}

// procError is an error with its own message that still matches a sentinel
// (errors.Is), so that callers can word their own message where they must.
type procError struct {
	msg string
	is  error
}

func (e *procError) Error() string        { return e.msg }
func (e *procError) Is(target error) bool { return target == e.is }

// Signal sends sig to the child by its PID; it fails with ErrExited if the
// child has exited. SIGSTOP and SIGCONT are tracked (Frozen), so that Stop
// and Kill thaw a child stopped this way too.
func (p *Proc) Signal(sig os.Signal) error {
	if p.Exited() {
		return p.exitedError("%s (pid %d) has already exited (%v)", p.opts.Name, p.pid, p.ExitErr())
	}
	switch sig {
	case syscall.SIGSTOP:
		p.setFrozen(true)
	case syscall.SIGCONT:
		defer p.setFrozen(false)
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		if errors.Is(err, os.ErrProcessDone) {
			return p.exitedError("%s (pid %d) has already exited", p.opts.Name, p.pid)
		}
		return err
	}
	return nil
}

func (p *Proc) setFrozen(f bool) {
	p.mu.Lock()
	p.frozen = f
	p.mu.Unlock()
}

// Frozen reports whether the child was sent SIGSTOP and not SIGCONT since.
func (p *Proc) Frozen() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.frozen
}

// Freeze sends SIGSTOP and waits, up to timeout, until the kernel reports
// the child stopped: a signal is delivered asynchronously, and a test that
// means "while it is frozen" must not race it. Where the state cannot be
// read (no /proc), it waits a moment instead.
func (p *Proc) Freeze(timeout time.Duration) error {
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	for {
		st, err := ReadStat(p.pid)
		switch {
		case p.Exited():
			return p.exitedError("%s (pid %d) exited (%v) instead of stopping", p.opts.Name, p.pid, p.ExitErr())
		case errors.Is(err, errors.ErrUnsupported):
			time.Sleep(200 * time.Millisecond)
			return nil
		case err == nil && (st.State == 'T' || st.State == 't'):
			return nil
		case time.Now().After(deadline):
			return &procError{msg: fmt.Sprintf("%s (pid %d) not stopped %s after SIGSTOP (state %q)", p.opts.Name, p.pid, timeout, p.State()), is: ErrTimeout}
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Thaw sends SIGCONT.
func (p *Proc) Thaw() error { return p.Signal(syscall.SIGCONT) }

// State is the child's state letter in /proc/PID/stat ('R', 'S', 'T' when
// stopped, 'Z' ...), or 0 when it cannot be read (exited, no /proc).
func (p *Proc) State() byte {
	st, err := ReadStat(p.pid)
	if err != nil {
		return 0
	}
	return st.State
}

// beginEnd marks the exit as asked for (StopRequested) and thaws a frozen
// child, so that it can act on what comes next; it reports whether the
// child has exited already.
func (p *Proc) beginEnd() (exited bool) {
	p.mu.Lock()
	p.ending = true
	p.mu.Unlock()
	if p.Exited() {
		return true
	}
	if p.Frozen() {
		_ = p.Thaw()
	}
	return false
}

// Kill sends SIGKILL (SIGCONT first if frozen, harmless and symmetric with
// Stop) and waits up to Options.KillWait for the child to be reaped.
func (p *Proc) Kill() error {
	if p.beginEnd() {
		return nil
	}
	_ = p.Signal(syscall.SIGKILL)
	select {
	case <-p.done:
		return nil
	case <-time.After(p.opts.KillWait):
		return &procError{msg: fmt.Sprintf("%s (pid %d) did not exit %s after SIGKILL", p.opts.Name, p.pid, p.opts.KillWait), is: ErrTimeout}
	}
}

// StopError is Stop's error: the child outlived its timeout.
type StopError struct {
	Name    string
	PID     int
	Timeout time.Duration
	Signal  os.Signal // Options.StopSignal
	// QuitSent: it got SIGQUIT (Options.QuitGrace); Quit: and exited on
	// it, its goroutine dump at the end of its output. Otherwise it was
	// killed.
	QuitSent, Quit bool
	// KillErr is Kill's error when even SIGKILL did not end it in time.
	KillErr error
}

func (e *StopError) Error() string {
	s := fmt.Sprintf("%s (pid %d) did not stop within %s of %s", e.Name, e.PID, e.Timeout, SignalName(e.Signal))
	switch {
	case e.Quit:
		return s + ": SIGQUIT, its goroutine dump is at the end of its log"
	case e.QuitSent:
		s += ", nor on SIGQUIT: killed"
	default:
		s += ": killed"
	}
	if e.KillErr != nil {
		s += "; " + e.KillErr.Error()
	}
	return s
}

// Is makes a StopError match ErrTimeout.
func (e *StopError) Is(target error) bool { return target == ErrTimeout }

// Stop asks the child to stop (Options.StopSignal, SIGCONT first if frozen:
// a stopped process cannot act on it) and waits up to timeout; past it the
// child gets SIGQUIT if Options.QuitGrace is set, then SIGKILL. It returns
// nil if the child stopped in time (or had exited), else a *StopError.
func (p *Proc) Stop(timeout time.Duration) error {
	if p.beginEnd() {
		return nil
	}
	_ = p.Signal(p.opts.StopSignal)
	select {
	case <-p.done:
		return nil
	case <-time.After(timeout):
	}
	e := &StopError{Name: p.opts.Name, PID: p.pid, Timeout: timeout, Signal: p.opts.StopSignal}
	if p.opts.QuitGrace > 0 {
		e.QuitSent = true
		_ = p.Signal(syscall.SIGQUIT)
		select {
		case <-p.done:
			e.Quit = true
			return e
		case <-time.After(p.opts.QuitGrace):
		}
	}
	e.KillErr = p.Kill()
	return e
}

// SignalName is a signal's name as people write it ("SIGTERM"), not its
// description ("terminated").
func SignalName(sig os.Signal) string {
	switch sig {
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGINT:
		return "SIGINT"
	case syscall.SIGKILL:
		return "SIGKILL"
	case syscall.SIGQUIT:
		return "SIGQUIT"
	case syscall.SIGSTOP:
		return "SIGSTOP"
	case syscall.SIGCONT:
		return "SIGCONT"
	case syscall.SIGHUP:
		return "SIGHUP"
	}
	if s, ok := sig.(interface{ String() string }); ok {
		return s.String()
	}
	return fmt.Sprint(sig)
}

// Count is how many lines the child has written so far: a cursor to pass
// as since to Lines, Find and WaitLine, to consider only what comes next.
func (p *Proc) Count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.count
}

// Lines returns a copy of the kept lines from index since on.
func (p *Proc) Lines(since int) []Line {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Line(nil), p.linesFrom(since)...)
}

// linesFrom is the kept lines from index since; p.mu held.
func (p *Proc) linesFrom(since int) []Line {
	first := p.count - len(p.lines)
	if since < first {
		since = first
	}
	if since > p.count {
		since = p.count
	}
	return p.lines[since-first:]
}

// Find returns the first kept JSON line from index since that match
// accepts.
func (p *Proc) Find(since int, match func(map[string]any) bool) (Line, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.linesFrom(since) {
		if l.Fields != nil && match(l.Fields) {
			return l, true
		}
	}
	return Line{}, false
}

// WaitLine waits for a JSON line from index since that match accepts. It
// returns ctx's error when ctx ends first (give it a deadline), and an
// error wrapping ErrExited when the child exits without writing one.
func (p *Proc) WaitLine(ctx context.Context, since int, match func(map[string]any) bool) (Line, error) {
	for {
		p.mu.Lock()
		ch := p.changed
		p.mu.Unlock()
		if l, ok := p.Find(since, match); ok {
			return l, nil
		}
		select {
		case <-ch:
		case <-p.done:
			// Every line is read before done is closed: one last look.
			if l, ok := p.Find(since, match); ok {
				return l, nil
			}
			return Line{}, p.exitedError("%s (pid %d) exited (%v) before writing the line waited for", p.opts.Name, p.pid, p.ExitErr())
		case <-ctx.Done():
			return Line{}, ctx.Err()
		}
	}
}

// HasFields matches a line that has every field of want, the values
// compared as printed (fmt.Sprint): JSON numbers are float64, and a test
// writes 3 or "3".
func HasFields(want map[string]any) func(map[string]any) bool {
	return func(m map[string]any) bool {
		for k, v := range want {
			got, ok := m[k]
			if !ok || fmt.Sprint(got) != fmt.Sprint(v) {
				return false
			}
		}
		return true
	}
}

// Tail is the last n kept lines, raw.
func (p *Proc) Tail(n int) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	ls := p.lines
	if len(ls) > n {
		ls = ls[len(ls)-n:]
	}
	out := make([]string, len(ls))
	for i, l := range ls {
		out[i] = l.Raw
	}
	return out
}

// add records one line, then hands it to Output and OnLine.
func (p *Proc) add(raw string, stdout bool) {
	var m map[string]any
	if json.Unmarshal([]byte(raw), &m) != nil {
		m = nil
	}
	p.mu.Lock()
	l := Line{N: p.count, At: time.Now(), Raw: raw, Fields: m, Stdout: stdout}
	p.lines = append(p.lines, l)
	p.count++
	if k := p.opts.Keep; k > 0 && len(p.lines) >= 2*k {
		p.lines = append([]Line(nil), p.lines[len(p.lines)-k:]...)
	}
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
	if p.opts.Output == nil && p.opts.OnLine == nil {
		return
	}
	p.outMu.Lock()
	defer p.outMu.Unlock()
	if p.opts.Output != nil {
		_, _ = io.WriteString(p.opts.Output, raw+"\n")
	}
	if p.opts.OnLine != nil {
		p.opts.OnLine(l)
	}
}

// lineWriter splits what os/exec copies from one of the child's pipes into
// lines. os/exec calls Write from one goroutine per pipe, and flush only
// after Wait has returned.
type lineWriter struct {
	p      *Proc
	stdout bool
	buf    []byte
}

func (w *lineWriter) Write(b []byte) (int, error) {
	n := len(b)
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			w.buf = append(w.buf, b...)
			if len(w.buf) >= maxLine {
				w.emit()
			}
			break
		}
		w.buf = append(w.buf, b[:i]...)
		b = b[i+1:]
		w.emit()
	}
	return n, nil
}

func (w *lineWriter) emit() {
	line := bytes.TrimSuffix(w.buf, []byte("\r"))
	w.p.add(string(line), w.stdout)
	w.buf = w.buf[:0]
}

// flush emits a last line that had no newline.
func (w *lineWriter) flush() {
	if len(w.buf) > 0 {
		w.emit()
	}
}
