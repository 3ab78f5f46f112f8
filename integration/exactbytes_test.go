package integration

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// A job produced with `tenure produce --value $'\xff\xfe'` and run by the
// built-in export handler is stored with its exact bytes (it used to come
// back as two U+FFFD).
func TestExportKeepsTheJobsExactBytes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	r := runCLI(t, 30*time.Second, "", "produce", "--brokers", e.brokers[0], "--topic", e.topic, "--key", "acme", "--value", "\xff\xfe")
	if r.code != 0 {
		t.Fatalf("produce: %s", r)
	}
	w := e.startWorker("X") // the export handler
	waitCommitted(t, e, 0, 1, "X")
	w.stop(30 * time.Second)
	var v []byte
	var payload *string
	if err := e.pool.QueryRow(context.Background(), `SELECT job_value, document->>'payload_base64' FROM `+
		pgx.Identifier{e.schema, "exports"}.Sanitize()+` WHERE job_key = 'acme'`).Scan(&v, &payload); err != nil {
		t.Fatal(err)
	}
	if string(v) != "\xff\xfe" || payload == nil || *payload != "//4=" {
		t.Errorf("stored %q (document payload_base64 %v), want the bytes ff fe", v, payload)
	}
}
