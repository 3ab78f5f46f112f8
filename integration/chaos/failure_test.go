package chaos

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

// failT is the run's *testing.T, keeping the first failure's message. A
// failed run's output ends with pages of logs (the workers', a formation's
// pg_autoctl tails, the timeline), so the reason, logged where it
// happened, is easily out of sight by the end; the run repeats it in its
// last line (see TestChaos).
type failT struct {
	*testing.T
	mu    sync.Mutex
	first string
	more  int
}

func (t *failT) record(msg string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.first == "" {
		t.first = strings.TrimSpace(msg)
		return
	}
	t.more++
}

func (t *failT) Errorf(format string, args ...any) {
	t.Helper()
	t.record(fmt.Sprintf(format, args...))
	t.T.Errorf(format, args...)
}

func (t *failT) Error(args ...any) {
	t.Helper()
	t.record(fmt.Sprint(args...))
	t.T.Error(args...)
}

// Fatalf is Errorf followed by FailNow, as for a *testing.T.
func (t *failT) Fatalf(format string, args ...any) {
	t.Helper()
	t.Errorf(format, args...)
	t.FailNow()
}

// Fatal is Error followed by FailNow, as for a *testing.T.
func (t *failT) Fatal(args ...any) {
	t.Helper()
	t.Error(args...)
	t.FailNow()
}

// reason is the first failure's message, its first line only (a message
// may carry a formation's state or a log tail), and how many followed.
func (t *failT) reason() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.first == "" {
		return "no message recorded (a failure outside the run's own checks: see above)"
	}
	r, _, cut := strings.Cut(t.first, "\n")
	if cut {
		r += " [...]"
	}
	if t.more > 0 {
		r += fmt.Sprintf(" (and %d more failures above)", t.more)
	}
	return r
}
