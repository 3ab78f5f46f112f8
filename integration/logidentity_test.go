package integration

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/internal/history"
	"github.com/tenure-dev/tenure/sink"
)

// The log's identity: offsets stored in Postgres belong to one log.
// A topic deleted and re-created under the same name, or a log whose start
// moved above the stored offset (retention, DeleteRecords), must not be
// carried on silently: the partition is held, with the cause and the offsets
// at stake, until an operator acknowledges it, which moves the offset to
// where the log now is.

// The topic is deleted and re-created while its worker runs.
func TestTopicRecreatedIsHeldUntilAcknowledged(t *testing.T) {
	t.Parallel()
	e, w := oneWorkerCaughtUp(t, "deletes and re-creates a topic; kept to the development broker")

	e.recreateTopic()
	e.produceTo(0, jobsFor(keys, 100, 3)...) // offsets 0-2 of the new log (a fresh client: the old one knows the old topic id)

	held := w.waitLog(60*time.Second, map[string]any{"msg": "partition held: its stored offsets do not fit the log; waiting for an operator to run `tenure admin holds acknowledge --group " + e.group + " --topic " + e.topic + " --partition 0`", "hold": "topic-recreated"})
	t.Logf("held: %v", held["reason"])
	if fenceRow(t, e, 0).next != 10 {
		t.Fatalf("the stored offset moved while held: %+v", fenceRow(t, e, 0))
	}
	// `admin assignments` says so, with the reason.
	r := runCLI(t, 30*time.Second, "", "admin", "assignments", "--brokers", strings.Join(e.brokers, ","), "--group", e.group,
		"--database-url", e.dbURL, "--schema", e.schema, "--output", "json")
	var rows []map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &rows); err != nil || len(rows) != 1 || rows[0]["state"] != "topic-recreated" ||
		!strings.Contains(rows[0]["reason"].(string), "deleted and re-created") {
		t.Fatalf("admin assignments: %v %v\n%s", rows, err, r)
	}
	ack := []string{"admin", "holds", "acknowledge", "--brokers", strings.Join(e.brokers, ","), "--database-url", e.dbURL,
		"--schema", e.schema, "--group", e.group, "--topic", e.topic, "--partition", "0", "--actor", "ops@example"}
	r = runCLI(t, 30*time.Second, "", ack...)
	if r.code != 0 || !strings.Contains(r.stdout, "next offset moved from 10 to 0 in the new log") {
		t.Fatalf("acknowledge: %s", r)
	}
	waitFor(t, 60*time.Second, "the new log's jobs to be committed", func() bool {
		f := fenceRow(t, e, 0)
		return f.next == 3
	})
	w.waitLog(10*time.Second, map[string]any{"msg": consumer.MsgRecovered})
	e.produceTo(0, jobsFor(keys, 103, 2)...)
	waitCommitted(t, e, 0, 5, "")
	w.stop(30 * time.Second)

	h := loadHistory(t, e)
	var reset *history.Entry
	for i, en := range h.Log {
		if en.Kind == "reset" {
			reset = &h.Log[i]
		}
	}
	if reset == nil || reset.From != 10 || reset.To != 0 || reset.Owner != "ops@example" {
		t.Fatalf("the fence log has no reset from 10 to 0 by ops@example: %+v", reset)
	}
	for _, v := range history.CheckLog(h.Log, h.Fences) {
		t.Errorf("violation: %s", v)
	}
}

// Jobs are deleted from the front of the log (DeleteRecords) past the stored
// offset while no worker runs: the next worker holds the partition, says
// how many jobs were lost, and goes on from the log's start once
// acknowledged.
func TestTruncatedLogIsHeldAndCounted(t *testing.T) {
	t.Parallel()
	e, w := oneWorkerCaughtUp(t, "deletes records; kept to the development broker")
	w.stop(30 * time.Second)

	e.produce(jobsFor(keys, 10, 10)...) // offsets 10-19
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var o kadm.Offsets
	o.Add(kadm.Offset{Topic: e.topic, Partition: 0, At: 15})
	if _, err := kadm.NewClient(e.cl).DeleteRecords(ctx, o); err != nil {
		t.Fatal(err)
	}

	w2 := e.startWorker("W2", "--http-addr", "127.0.0.1:0")
	held := w2.waitLog(60*time.Second, map[string]any{"hold": "log-truncated", "held": true})
	if !strings.Contains(held["reason"].(string), "5 jobs (offsets 10 to 14) were deleted") {
		t.Errorf("the hold does not say which jobs were lost: %v", held["reason"])
	}
	if fenceRow(t, e, 0).next != 10 {
		t.Fatalf("the stored offset moved while held")
	}
	store := e.store()
	hold, err := store.OpenHold(ctx, sink.Partition{Group: e.group, Topic: e.topic, Partition: 0})
	if err != nil || hold.Kind != sink.HoldLogTruncated || hold.NextOffset != 10 || hold.LogStart != 15 || hold.HighWatermark != 20 {
		t.Fatalf("recorded hold: %+v %v", hold, err)
	}
	if m := scrapeMetric(t, w2, "tenure_jobs_lost_total"); m != 5 {
		t.Errorf("tenure_jobs_lost_total = %d, want 5", m)
	}
	r := runCLI(t, 30*time.Second, "", "admin", "holds", "acknowledge", "--brokers", strings.Join(e.brokers, ","),
		"--database-url", e.dbURL, "--schema", e.schema, "--group", e.group, "--topic", e.topic, "--partition", "0")
	if r.code != 0 || !strings.Contains(r.stdout, "next offset moved from 10 to 15") {
		t.Fatalf("acknowledge: %s", r)
	}
	waitCommitted(t, e, 0, 20, "")
	w2.stop(30 * time.Second)
	h := loadHistory(t, e)
	produced := map[history.TopicPartition][]int64{{Topic: e.topic, Partition: 0}: {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 17, 18, 19}}
	for _, v := range h.Check(produced) {
		t.Errorf("violation: %s", v)
	}
}
