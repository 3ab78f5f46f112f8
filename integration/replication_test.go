package integration

import (
	"strings"
	"testing"
	"time"
)

// A worker says at start when its database acknowledges commits
// without a synchronous standby, and refuses to start with
// --require-sync-standby. The test database is a single server.
func TestWorkerSaysWhetherCommitsAreOnASynchronousStandby(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	w := e.startWorker("W")
	warn := w.waitLog(30*time.Second, map[string]any{"level": "warn", "standbys": 0})
	if !strings.HasPrefix(warn["msg"].(string), "no synchronous standby: the database has no standby") {
		t.Errorf("warning: %v", warn["msg"])
	}
	w.stop(30 * time.Second)
	r := runCLI(t, 60*time.Second, "", "worker", "--brokers", strings.Join(e.brokers, ","), "--group", e.group, "--topic", e.topic,
		"--database-url", e.dbURL, "--schema", e.schema, "--handler", "noop", "--require-sync-standby")
	wantFailure(t, r, 1, "--require-sync-standby", "no standby")
}
