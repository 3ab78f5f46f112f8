package integration

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/tenure-dev/tenure/sink"
)

// An operator finds a halted partition with `tenure admin halts` and lets
// the workers go on with `tenure admin halts resume`; resuming a partition
// that is not halted changes nothing and says so.
func TestCLIHalts(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	store, err := sink.NewStore(e.pool, e.schema)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	p := sink.Partition{Group: e.group, Topic: e.topic, Partition: 0}
	if err := store.HaltPartition(ctx, sink.Halt{Partition: p, From: 5, To: 7, FirstJob: e.topic + "/0/5", LastJob: e.topic + "/0/6",
		Reason: "handler bug", Owner: "tenure-w-1", Token: sink.Token{Epoch: 3}}); err != nil {
		t.Fatal(err)
	}
	db := []string{"--database-url", e.dbURL, "--schema", e.schema}
	r := runCLI(t, 30*time.Second, "", append([]string{"admin", "halts", "--group", e.group}, db...)...)
	if r.code != 0 || !strings.Contains(r.stdout, e.topic+"/0/5 to "+e.topic+"/0/6") || !strings.Contains(r.stdout, "tenure-w-1") {
		t.Fatalf("admin halts: %s", r)
	}
	r = runCLI(t, 30*time.Second, "", append([]string{"admin", "halts", "--output", "json"}, db...)...)
	var rows []map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &rows); err != nil || len(rows) != 1 || rows[0]["first_job"] != e.topic+"/0/5" || rows[0]["token"] != "0.3" {
		t.Fatalf("admin halts --output json: %v %v\n%s", rows, err, r)
	}
	resume := append([]string{"admin", "halts", "resume", "--group", e.group, "--topic", e.topic, "--partition", "0"}, db...)
	r = runCLI(t, 30*time.Second, "", resume...)
	if r.code != 0 || !strings.Contains(r.stdout, "resumed partition "+p.String()) || !strings.Contains(r.stdout, "starting again at offset 5") {
		t.Fatalf("admin halts resume: %s", r)
	}
	if _, halted, err := store.HaltOf(ctx, p); halted || err != nil {
		t.Fatalf("still halted after resume: %v %v", halted, err)
	}
	wantFailure(t, runCLI(t, 30*time.Second, "", resume...), 1, "is not halted", "nothing was changed")
	wantFailure(t, runCLI(t, 30*time.Second, "", append([]string{"admin", "halts", "resume", "--group", e.group, "--topic", e.topic}, db...)...),
		2, "--partition is required")
}
