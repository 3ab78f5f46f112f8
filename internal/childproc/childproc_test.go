package childproc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The test binary is its own child: run with childEnv=MODE, TestMain plays
// that child instead of running the tests.
const childEnv = "CHILDPROC_TEST_CHILD"

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		child(mode)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// child is the child's side: what each mode writes and does.
func child(mode string) {
	switch {
	case mode == "log":
		// JSON lines, a plain one, a ready line; then logs every tick until
		// SIGTERM, which it answers with a goodbye line.
		term := make(chan os.Signal, 1)
		signal.Notify(term, syscall.SIGTERM)
		fmt.Fprintln(os.Stdout, "to stdout")
		fmt.Fprintln(os.Stderr, `{"level":"info","msg":"starting","n":1}`)
		fmt.Fprintln(os.Stderr, "not json at all")
		fmt.Fprintln(os.Stderr, `{"level":"info","msg":"ready","n":2}`)
		for i := 3; ; i++ {
			select {
			case <-term:
				fmt.Fprintln(os.Stderr, `{"level":"info","msg":"bye"}`)
				return
			case <-time.After(20 * time.Millisecond):
				fmt.Fprintf(os.Stderr, `{"level":"debug","msg":"tick","n":%d}`+"\n", i)
			}
		}
	case mode == "ignoreterm":
		signal.Ignore(syscall.SIGTERM)
		fmt.Fprintln(os.Stderr, `{"msg":"ready"}`)
		time.Sleep(time.Minute)
	case mode == "busy":
		// Burns CPU and touches 64 MB, then says so and waits.
		buf := make([]byte, 64<<20)
		for i := range buf {
			buf[i] = byte(i)
		}
		for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); {
		}
		fmt.Fprintf(os.Stderr, `{"msg":"busy done","b":%d}`+"\n", buf[len(buf)-1])
		if os.Getenv("CHILDPROC_EXIT") == "" {
			time.Sleep(time.Minute)
		}
	case strings.HasPrefix(mode, "lines "):
		n, _ := strconv.Atoi(strings.TrimPrefix(mode, "lines "))
		for i := range n {
			fmt.Fprintf(os.Stderr, "line %d\n", i)
		}
		fmt.Fprint(os.Stderr, "no newline at the end")
		os.Exit(3)
	}
}

// start runs the test binary as a child in mode.
func start(t *testing.T, mode string, opts Options, env ...string) *Proc {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(append(os.Environ(), childEnv+"="+mode), env...)
	if opts.Name == "" {
		opts.Name = "child " + mode
	}
	p, err := Start(cmd, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Kill(); err != nil {
			t.Error(err)
		}
	})
	return p
}

func waitLine(t *testing.T, p *Proc, since int, match func(map[string]any) bool) Line {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, err := p.WaitLine(ctx, since, match)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestWaitLineAndOutput(t *testing.T) {
	var mu sync.Mutex
	var out strings.Builder
	var onLine []Line
	p := start(t, "log", Options{
		Output:     writerFunc(func(b []byte) { mu.Lock(); out.Write(b); mu.Unlock() }),
		OnLine:     func(l Line) { mu.Lock(); onLine = append(onLine, l); mu.Unlock() },
		ReadStdout: true,
		Keep:       KeepAll,
	})
	ready := waitLine(t, p, 0, HasFields(map[string]any{"msg": "ready", "n": 2}))
	if ready.Fields["level"] != "info" {
		t.Errorf("ready line %+v", ready)
	}
	// A line since the cursor: a tick after ready, not ready itself.
	since := p.Count()
	tick := waitLine(t, p, since, HasFields(map[string]any{"msg": "tick"}))
	if tick.N < since {
		t.Errorf("tick line %d is before the cursor %d", tick.N, since)
	}
	if _, ok := p.Find(since, HasFields(map[string]any{"msg": "ready"})); ok {
		t.Error("Find found the ready line after the cursor")
	}
	var plain, stdout bool
	for _, l := range p.Lines(0) {
		if l.Raw == "not json at all" {
			plain = l.Fields == nil
		}
		if l.Raw == "to stdout" {
			stdout = l.Stdout
		}
	}
	if !plain || !stdout {
		t.Errorf("the plain line kept raw: %v; the stdout line marked: %v", plain, stdout)
	}
	if err := p.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if !p.StopRequested() || p.ExitErr() != nil || p.ExitedAt().IsZero() {
		t.Errorf("after Stop: requested %v, exit %v, at %v", p.StopRequested(), p.ExitErr(), p.ExitedAt())
	}
	// The goodbye is read before Done: nothing is lost at exit.
	if _, ok := p.Find(0, HasFields(map[string]any{"msg": "bye"})); !ok {
		t.Error("the last line before the exit was not read")
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(out.String(), "not json at all\n") || !strings.Contains(out.String(), `"msg":"bye"`) {
		t.Errorf("Output got %q", out.String())
	}
	if len(onLine) != p.Count() {
		t.Errorf("OnLine called %d times for %d lines", len(onLine), p.Count())
	}
}

type writerFunc func([]byte)

func (f writerFunc) Write(b []byte) (int, error) { f(b); return len(b), nil }

func TestWaitLineExitAndTimeout(t *testing.T) {
	p := start(t, "lines 3", Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := p.WaitLine(ctx, 0, HasFields(map[string]any{"msg": "never"}))
	if !errors.Is(err, ErrExited) {
		t.Fatalf("WaitLine on a child that exits: %v, want ErrExited", err)
	}
	var ee *exec.ExitError
	if !errors.As(p.ExitErr(), &ee) || ee.ExitCode() != 3 || p.ProcessState().ExitCode() != 3 {
		t.Errorf("exit %v, want status 3", p.ExitErr())
	}
	// The last line had no newline: still a line.
	if tail := p.Tail(2); len(tail) != 2 || tail[0] != "line 2" || tail[1] != "no newline at the end" {
		t.Errorf("tail %q", tail)
	}
	if err := p.Signal(syscall.SIGTERM); !errors.Is(err, ErrExited) {
		t.Errorf("Signal after exit: %v, want ErrExited", err)
	}

	q := start(t, "ignoreterm", Options{})
	ctx, cancel = context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := q.WaitLine(ctx, 0, HasFields(map[string]any{"msg": "never"})); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WaitLine past its deadline: %v", err)
	}
}

func TestTailBounded(t *testing.T) {
	p := start(t, "lines 5000", Options{Keep: 100})
	<-p.Done()
	if n := p.Count(); n != 5001 {
		t.Errorf("count %d, want 5001", n)
	}
	kept := p.Lines(0)
	if len(kept) < 100 || len(kept) >= 200 {
		t.Errorf("%d lines kept, want 100 to 199", len(kept))
	}
	if kept[0].N != 5001-len(kept) || kept[len(kept)-1].Raw != "no newline at the end" {
		t.Errorf("kept lines %d..%d", kept[0].N, kept[len(kept)-1].N)
	}
	if tail := p.Tail(3); len(tail) != 3 || tail[0] != "line 4998" {
		t.Errorf("tail %q", tail)
	}
	if got := p.Lines(4990); len(got) != 11 || got[0].Raw != "line 4990" {
		t.Errorf("Lines(4990): %d lines from %q", len(got), got[0].Raw)
	}
}

func TestFreezeThawAndStopFrozen(t *testing.T) {
	p := start(t, "log", Options{})
	waitLine(t, p, 0, HasFields(map[string]any{"msg": "ready"}))
	if err := p.Freeze(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if s := p.State(); s != 'T' && s != 't' {
		t.Fatalf("state %q after Freeze, want T", s)
	}
	// Frozen, it writes nothing.
	n := p.Count()
	time.Sleep(200 * time.Millisecond)
	if p.Count() != n {
		t.Errorf("a frozen child wrote %d lines", p.Count()-n)
	}
	if err := p.Thaw(); err != nil {
		t.Fatal(err)
	}
	waitLine(t, p, n, HasFields(map[string]any{"msg": "tick"}))
	if s := p.State(); s == 'T' {
		t.Errorf("still stopped after Thaw")
	}
	// Stop of a frozen child: thawed first, so it stops gracefully (it
	// logs its goodbye) well within the timeout.
	if err := p.Freeze(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := p.Stop(10 * time.Second); err != nil {
		t.Fatalf("Stop of a frozen child: %v", err)
	}
	if _, ok := p.Find(0, HasFields(map[string]any{"msg": "bye"})); !ok {
		t.Error("the frozen child did not stop gracefully")
	}
}

func TestKillIgnoringSIGTERM(t *testing.T) {
	p := start(t, "ignoreterm", Options{Name: "stubborn"})
	waitLine(t, p, 0, HasFields(map[string]any{"msg": "ready"}))
	started := time.Now()
	err := p.Stop(300 * time.Millisecond)
	var se *StopError
	if !errors.As(err, &se) || !errors.Is(err, ErrTimeout) || se.Quit || se.KillErr != nil {
		t.Fatalf("Stop of a child that ignores SIGTERM: %v", err)
	}
	if want := fmt.Sprintf("stubborn (pid %d) did not stop within 300ms of SIGTERM: killed", p.PID()); err.Error() != want {
		t.Errorf("error %q, want %q", err, want)
	}
	if !p.Exited() || time.Since(started) > 10*time.Second {
		t.Errorf("exited %v after %s", p.Exited(), time.Since(started))
	}
	var ee *exec.ExitError
	if !errors.As(p.ExitErr(), &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("exit %v, want killed by SIGKILL", p.ExitErr())
	}

	q := start(t, "ignoreterm", Options{})
	waitLine(t, q, 0, HasFields(map[string]any{"msg": "ready"}))
	if err := q.Freeze(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := q.Kill(); err != nil || !q.Exited() || !q.StopRequested() {
		t.Fatalf("Kill of a frozen child: %v, exited %v", err, q.Exited())
	}
}

func TestStopQuitGrace(t *testing.T) {
	// SIGQUIT kills a Go program that does not catch it (with a goroutine
	// dump); ignoring SIGTERM leaves the stop to it.
	p := start(t, "ignoreterm", Options{Name: "w1", QuitGrace: 5 * time.Second})
	waitLine(t, p, 0, HasFields(map[string]any{"msg": "ready"}))
	err := p.Stop(200 * time.Millisecond)
	var se *StopError
	if !errors.As(err, &se) || !se.Quit {
		t.Fatalf("Stop: %v, want ended by SIGQUIT", err)
	}
	if !strings.HasSuffix(err.Error(), "of SIGTERM: SIGQUIT, its goroutine dump is at the end of its log") {
		t.Errorf("error %q", err)
	}
	if !strings.Contains(strings.Join(p.Tail(DefaultKeep), "\n"), "goroutine ") {
		t.Error("no goroutine dump in the child's output")
	}
}

func TestUsage(t *testing.T) {
	p := start(t, "busy", Options{})
	waitLine(t, p, 0, HasFields(map[string]any{"msg": "busy done"}))
	u, err := p.Usage()
	if err != nil {
		t.Fatal(err)
	}
	if u.CPU < 100*time.Millisecond || u.PeakRSS < 64<<20 {
		t.Errorf("while running: %+v, want >= 100ms CPU and 64 MB", u)
	}
	// After exit: wait(2)'s figures.
	q := start(t, "busy", Options{}, "CHILDPROC_EXIT=1")
	<-q.Done()
	u, err = q.Usage()
	if err != nil {
		t.Fatal(err)
	}
	if u.CPU < 100*time.Millisecond || u.PeakRSS < 64<<20 {
		t.Errorf("after exit: %+v, want >= 100ms CPU and 64 MB", u)
	}
}

func TestParseStat(t *testing.T) {
	// proc(5): the comm is in parentheses and may hold both spaces and
	// parentheses; fields 14-17 are utime, stime, cutime, cstime.
	line := "4242 (a) b) S 17 4242 4242 0 -1 4194560 100 0 0 0 250 31 7 2 20 0 1 0 12345 1000 10 18446744073709551615\n"
	st, err := ParseStat([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	want := Stat{PID: 4242, Comm: "a) b", State: 'S', PPID: 17, UTime: 250, STime: 31, CUTime: 7, CSTime: 2}
	if st != want {
		t.Errorf("got %+v, want %+v", st, want)
	}
	if st.CPU() != 2810*time.Millisecond {
		t.Errorf("CPU %s", st.CPU())
	}
	st, err = ParseStat([]byte("7 (tenure worker) T 1 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0"))
	if err != nil || st.Comm != "tenure worker" || st.State != 'T' {
		t.Errorf("got %+v, %v", st, err)
	}
	for _, bad := range []string{"", "1 (x", "1 (x) S 1 2", "x (y) S 1 1 1 0 -1 0 0 0 0 0 1 1 1 1", "1 (y) S 1 1 1 0 -1 0 0 0 0 0 a 1 1 1"} {
		if _, err := ParseStat([]byte(bad)); err == nil {
			t.Errorf("ParseStat(%q) accepted", bad)
		}
	}
	// Our own: running, and our parent.
	self, err := ReadStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if self.PID != os.Getpid() || self.PPID != os.Getppid() || !strings.ContainsRune("RS", rune(self.State)) {
		t.Errorf("own stat %+v", self)
	}
}

func TestStartRefusesTakenStderr(t *testing.T) {
	cmd := exec.Command(os.Args[0])
	cmd.Stderr = os.Stderr
	if _, err := Start(cmd, Options{}); err == nil {
		t.Fatal("Start took a cmd whose Stderr was set")
	}
}
