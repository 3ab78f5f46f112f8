package integration

import (
	"strings"
	"syscall"
	"testing"
	"time"
)

// SIGTERM asks for a graceful stop, which waits for the batch in flight; a
// second signal exits at once. The worker here is held inside its batch, so
// only the second signal can end it quickly.
func TestSecondSignalStopsAtOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	e.produce(jobsFor(keys, 0, 5)...)
	w := e.startWorker("S", "--hold-once", "before-batch")
	w.waitLog(30*time.Second, map[string]any{"msg": "holding"})

	w.signal(syscall.SIGTERM)
	select {
	case <-w.done:
		t.Fatal("the worker stopped on the first signal although its batch was still in flight")
	case <-time.After(time.Second):
	}
	start := time.Now()
	w.signal(syscall.SIGINT)
	select {
	case <-w.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the worker did not exit on the second signal")
	}
	if code := w.p.ProcessState().ExitCode(); code != 130 {
		t.Errorf("exit code %d after the second signal, want 130", code)
	}
	// The first signal is logged with what a second one does; the second
	// says on stderr that it ends the process, and with which status.
	if w.findLog(map[string]any{"msg": "stopping gracefully (a second signal stops at once)", "signal": "SIGTERM"}) == nil {
		t.Errorf("the first signal was not logged as a graceful stop")
	}
	said := strings.Join(w.raw(), "\n")
	if !strings.Contains(said, "tenure: second signal (SIGINT): exiting at once with status 130") {
		t.Errorf("stderr does not say what the second signal did:\n%s", said)
	}
	t.Logf("exited %s after the second signal", time.Since(start).Round(time.Millisecond))
	if n := committedLogCount(t, e); n != 0 {
		t.Errorf("the held batch must not have committed: %d commits", n)
	}
}
