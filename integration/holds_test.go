package integration

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	protocol "github.com/tenure-dev/tenure/internal/fence"
	"github.com/tenure-dev/tenure/sink"
)

// An operator finds a partition halted for a handler bug with `tenure admin
// holds` and lets the workers go on with `tenure admin holds acknowledge`;
// acknowledging a partition that is not held changes nothing and says so.
func TestCLIHolds(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	store := e.store()
	ctx := context.Background()
	p := sink.Partition{Group: e.group, Topic: e.topic, Partition: 0}
	if _, err := e.pool.Exec(ctx, `INSERT INTO "`+e.schema+`".fences (consumer_group, topic, partition, incarnation, epoch, owner, next_offset, partition_count)
		VALUES ($1, $2, 0, 0, 3, 'tenure-w-1', 5, 1)`, e.group, e.topic); err != nil {
		t.Fatal(err)
	}
	if err := protocol.Of(store).HoldPartition(ctx, sink.Hold{Partition: p, Kind: sink.HoldHandlerBug, From: 5, To: 7, FirstJob: e.topic + "/0/5", LastJob: e.topic + "/0/6",
		Reason: "handler bug", Owner: "tenure-w-1", Token: sink.Token{Epoch: 3}, NextOffset: 5, LogStart: -1, HighWatermark: -1}); err != nil {
		t.Fatal(err)
	}
	db := []string{"--database-url", e.dbURL, "--schema", e.schema}
	r := runCLI(t, 30*time.Second, "", append([]string{"admin", "holds", "--group", e.group}, db...)...)
	if r.code != 0 || !strings.Contains(r.stdout, e.topic+"/0/5 to "+e.topic+"/0/6") || !strings.Contains(r.stdout, "tenure-w-1") ||
		!strings.Contains(r.stdout, "handler-bug") {
		t.Fatalf("admin holds: %s", r)
	}
	r = runCLI(t, 30*time.Second, "", append([]string{"admin", "holds", "--output", "json"}, db...)...)
	var rows []map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &rows); err != nil || len(rows) != 1 || rows[0]["first_job"] != e.topic+"/0/5" ||
		rows[0]["token"] != "0.3" || rows[0]["kind"] != "handler-bug" {
		t.Fatalf("admin holds --output json: %v %v\n%s", rows, err, r)
	}
	ack := append([]string{"admin", "holds", "acknowledge", "--group", e.group, "--topic", e.topic, "--partition", "0", "--actor", "ops@example"}, db...)
	r = runCLI(t, 30*time.Second, "", ack...)
	if r.code != 0 || !strings.Contains(r.stdout, "acknowledged the handler-bug hold of partition "+p.String()) ||
		!strings.Contains(r.stdout, "processing goes on at offset 5") || !strings.Contains(r.stdout, "by ops@example") {
		t.Fatalf("admin holds acknowledge: %s", r)
	}
	if _, held, err := protocol.Of(store).OpenHoldNeedingAck(ctx, p); held || err != nil {
		t.Fatalf("still held after the acknowledgement: %v %v", held, err)
	}
	wantFailure(t, runCLI(t, 30*time.Second, "", ack...), 1, "has no hold that waits for an acknowledgement", "nothing was changed")
	wantFailure(t, runCLI(t, 30*time.Second, "", append([]string{"admin", "holds", "acknowledge", "--group", e.group, "--topic", e.topic}, db...)...),
		2, "--partition is required")
}
