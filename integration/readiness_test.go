package integration

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tenure-dev/tenure/sink"
)

// /readyz follows the database: ready once the worker has joined its group
// with Postgres up and the schema current; not ready (saying why) while
// Postgres is stopped, and ready again once it is back; not ready while the
// schema lacks a migration. /healthz stays ok throughout: a restart would
// not bring the database back.
func TestReadinessFollowsPostgres(t *testing.T) {
	t.Parallel()
	e, pg := newOutageEnv(t, 2)
	e.produce(jobsFor(keys, 0, 20)...)
	w := e.startWorker("R", "--http-addr", "127.0.0.1:0")
	ready := func() (bool, string) {
		code, body := w.get("/readyz")
		return code == http.StatusOK, body
	}
	e.waitWorking(60*time.Second, "/readyz to say ready", []*worker{w}, ready)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := pg.Stop(ctx, "fast"); err != nil {
		t.Fatal(err)
	}
	var body string
	e.waitWorking(30*time.Second, "/readyz to say not ready while Postgres is stopped", []*worker{w}, func() (bool, string) {
		var ok bool
		ok, body = ready()
		return !ok, body
	})
	if code, b := w.get("/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(b, "not ready: database: ") {
		t.Errorf("/readyz with Postgres stopped: %d %q", code, b)
	}
	if code, b := w.get("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz with Postgres stopped: %d %q", code, b)
	}
	if err := pg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	e.waitWorking(60*time.Second, "/readyz to say ready once Postgres is back", []*worker{w}, ready)

	// A schema that lacks a migration (reverted under the running worker).
	// The test's pool still holds connections from before the restart: the
	// first statements may meet them closed.
	var v int
	var err error
	for range 10 {
		if v, err = sink.MigrateDown(ctx, e.pool, e.schema, sink.MigrateDownOptions{Force: true}); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	e.waitWorking(30*time.Second, "/readyz to say the schema is not current", []*worker{w}, func() (bool, string) {
		code, b := w.get("/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(b, "schema: ") && strings.Contains(b, "lacks migration"), b
	})
	if _, err := sink.Migrate(ctx, e.pool, e.schema); err != nil {
		t.Fatalf("migrating %d back up: %v", v, err)
	}
	e.waitWorking(30*time.Second, "/readyz to say ready once the schema is current", []*worker{w}, ready)
	w.waitLog(5*time.Second, map[string]any{"msg": "not ready"})
	w.stop(30 * time.Second)
}
