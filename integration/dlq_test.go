package integration

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
)

// dlqRow is what the integration test reads back from dead_letters.
type dlqRow struct {
	id        int64
	partition int32
	offset    int64
	key       []byte
	value     []byte
	headers   string
	err       string
	attempts  int
	token     string
	owner     string
	status    string
}

func deadLetterRows(t *testing.T, e *env) []dlqRow {
	t.Helper()
	return queryRows(t, e, func(row pgx.CollectableRow) (r dlqRow, err error) {
		err = row.Scan(&r.id, &r.partition, &r.offset, &r.key, &r.value, &r.headers, &r.err, &r.attempts, &r.token, &r.owner, &r.status)
		return r, err
	}, `SELECT id, partition, job_offset, job_key, job_value, headers::text, error, attempts,
		incarnation || '.' || epoch, owner, status FROM "`+e.schema+`".dead_letters WHERE consumer_group = $1 AND topic = $2 ORDER BY id`,
		e.group, e.topic)
}

// exportsAt counts the export writes of one job.
func exportsAt(t *testing.T, e *env, partition int32, offset int64) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM "`+e.schema+`".export_versions
		WHERE topic = $1 AND partition = $2 AND job_offset = $3`, e.topic, partition, offset).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A worker with injected faults: jobs that fail, panic, outlive the handler
// timeout, or have a key the handler refuses land in dead_letters exactly
// once, in the fenced transaction that moves past them; every other job is
// exported exactly once; the worker never exits. Then the operator works
// the dead letters with `tenure admin dlq`: each step below reads what the
// ones before it left.
func TestDLQWorkerAndCLI(t *testing.T) {
	t.Parallel()
	const partitions = 2
	e := newEnv(t, partitions)
	d := &dlqWorld{t: t, e: e, brokers: strings.Join(e.brokers, ","), db: []string{"--database-url", e.dbURL, "--schema", e.schema}}
	where := d.produce()

	w := e.startWorker("W", "--inject-faults", "--max-attempts", "2", "--handler-timeout", "500ms")
	for p := range int32(partitions) {
		waitCommitted(t, e, p, e.highWatermark(p), "")
	}
	d.checkDeadLettered(where)
	// Every other job exported exactly once, over every partition (G1-G3).
	checkRun(t, e, expect{partitions: allPartitions(partitions), deadLetters: true, atEnd: true})

	d.listAndShow()
	d.replay()
	d.discardAndRefusals()
	d.badUsage()
	d.statusAll()

	// The worker never exited, and the history still holds with the
	// replayed job in it.
	select {
	case <-w.done:
		t.Fatalf("the worker exited")
	default:
	}
	for p := range int32(partitions) {
		waitCommitted(t, e, p, e.highWatermark(p), "")
	}
	w.stop(30 * time.Second)
	checkRun(t, e, expect{partitions: allPartitions(partitions), deadLetters: true, atEnd: true})
	if n := w.countLogs(map[string]any{"msg": "job dead-lettered"}); n != len(d.faulty)+1 {
		t.Errorf("the worker logged %d dead letters, want %d", n, len(d.faulty)+1)
	}
}

type dlqJob struct {
	key, value string
	headers    []kgo.RecordHeader
}

// dlqWorld is TestDLQWorkerAndCLI's state: the faulty jobs by name and,
// once dead-lettered, their rows.
type dlqWorld struct {
	t       *testing.T
	e       *env
	brokers string
	db      []string // the admin commands' database flags
	faulty  map[string]dlqJob
	byFault map[string]dlqRow
}

// cli runs `tenure` with args and the database flags.
func (d *dlqWorld) cli(args ...string) cliResult {
	d.t.Helper()
	return runCLI(d.t, 60*time.Second, "", append(args, d.db...)...)
}

// produce produces good jobs with faulty ones in between, on both
// partitions, and returns where each faulty one landed (partition, offset).
func (d *dlqWorld) produce() map[string][2]int64 {
	t, e := d.t, d.e
	var jobs []dlqJob
	for i := range 40 {
		jobs = append(jobs, dlqJob{key: keys[i%len(keys)], value: fmt.Sprintf(`{"seq":%d}`, i)})
	}
	d.faulty = map[string]dlqJob{
		"error": {key: "acme", value: `{"seq":100,"tenure-fault":"error"}`,
			headers: []kgo.RecordHeader{{Key: "trace-id", Value: []byte("t-100")}, {Key: "bin", Value: []byte{0, 0xff}}}},
		"panic":  {key: "globex", value: `{"seq":101,"tenure-fault":"panic"}`},
		"slow":   {key: "initech", value: `{"seq":102,"tenure-fault":"slow"}`},
		"binkey": {key: "\xffbad\x1b[31m", value: `{"seq":103}`}, // the export handler refuses a key that is not UTF-8
	}
	faulty := d.faulty
	jobs = append(jobs[:10], append([]dlqJob{faulty["error"]}, jobs[10:]...)...)
	jobs = append(jobs[:20], append([]dlqJob{faulty["panic"], faulty["binkey"]}, jobs[20:]...)...)
	jobs = append(jobs[:30], append([]dlqJob{faulty["slow"]}, jobs[30:]...)...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	where := map[string][2]int64{} // fault -> partition, offset
	for _, j := range jobs {
		r, err := e.cl.ProduceSync(ctx, &kgo.Record{Topic: e.topic, Key: []byte(j.key), Value: []byte(j.value), Headers: j.headers}).First()
		if err != nil {
			t.Fatal(err)
		}
		for name, f := range faulty {
			if f.value == j.value && f.key == j.key {
				where[name] = [2]int64{int64(r.Partition), r.Offset}
			}
		}
	}
	return where
}

// checkDeadLettered: each faulty job is dead-lettered exactly once, with
// what happened.
func (d *dlqWorld) checkDeadLettered(where map[string][2]int64) {
	t, e, faulty := d.t, d.e, d.faulty
	dead := deadLetterRows(t, e)
	if len(dead) != len(faulty) {
		t.Fatalf("%d dead letters, want %d: %+v", len(dead), len(faulty), dead)
	}
	byFault := map[string]dlqRow{}
	d.byFault = byFault
	for _, dl := range dead {
		for name, at := range where {
			if int64(dl.partition) == at[0] && dl.offset == at[1] {
				if _, dup := byFault[name]; dup {
					t.Fatalf("job %s dead-lettered twice", name)
				}
				byFault[name] = dl
			}
		}
	}
	for name, want := range map[string]struct {
		attempts int
		err      string
	}{
		"error":  {2, "injected failure"},
		"panic":  {1, "handler panicked"}, // a panic is final at once
		"slow":   {2, "handler timed out after 500ms"},
		"binkey": {1, "not valid UTF-8"}, // permanent: no retry
	} {
		dl, ok := byFault[name]
		switch {
		case !ok:
			t.Errorf("job %s is not in dead_letters: %+v", name, dead)
			continue
		case dl.attempts != want.attempts || !strings.Contains(dl.err, want.err) || dl.status != "dead":
			t.Errorf("job %s: attempts %d, error %q, status %q; want %d attempts and an error saying %q", name, dl.attempts, dl.err, dl.status, want.attempts, want.err)
		case string(dl.key) != faulty[name].key || string(dl.value) != faulty[name].value:
			t.Errorf("job %s: key %q value %q", name, dl.key, dl.value)
		case !regexp.MustCompile(`^\d+\.\d+$`).MatchString(dl.token) || dl.owner == "" || dl.owner != fenceRow(t, e, dl.partition).owner:
			t.Errorf("job %s: token %q owner %q (fence owner %q)", name, dl.token, dl.owner, fenceRow(t, e, dl.partition).owner)
		}
		if n := exportsAt(t, e, dl.partition, dl.offset); n != 0 {
			t.Errorf("dead-lettered job %s also has %d export writes", name, n)
		}
	}
	if h := byFault["error"].headers; !strings.Contains(h, "trace-id") {
		t.Errorf("headers of the error job: %s", h)
	}
}

// listAndShow: `dlq list` (JSON and table) and `dlq show`.
func (d *dlqWorld) listAndShow() {
	t, e, faulty, byFault := d.t, d.e, d.faulty, d.byFault
	// tenure admin dlq list --output json: every dead letter, binary bytes
	// escaped in "key" and exact in "key_base64".
	r := d.cli("admin", "dlq", "list", "--output", "json", "--group", e.group, "--topic", e.topic)
	var listed []map[string]any
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &listed) != nil || len(listed) != len(faulty) {
		t.Fatalf("dlq list --output json: %s", r)
	}
	for _, l := range listed {
		d := byFault[faultOf(byFault, int64(l["id"].(float64)))]
		if l["status"] != "dead" || int(l["attempts"].(float64)) != d.attempts || l["token"] != d.token || l["owner"] != d.owner ||
			int64(l["offset"].(float64)) != d.offset || l["error"] != d.err {
			t.Errorf("listed %v, stored %+v", l, d)
		}
		if kb, _ := base64.StdEncoding.DecodeString(fmt.Sprint(l["key_base64"])); string(kb) != string(d.key) {
			t.Errorf("key_base64 %v is not the exact key %q", l["key_base64"], d.key)
		}
	}
	for _, l := range listed {
		if int64(l["id"].(float64)) == byFault["binkey"].id && l["key"] != "\\xffbad\x1b[31m" {
			t.Errorf("a key that is not UTF-8 should be listed with \\xNN escapes: %q", l["key"])
		}
	}
	t.Logf("dlq list --output json (first row):\n%s", firstJSONObject(r.stdout))

	// The table: one line per dead letter, control characters escaped.
	r = d.cli("admin", "dlq", "list")
	lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
	if r.code != 0 || len(lines) != len(faulty)+1 || !strings.HasPrefix(lines[0], "ID") || strings.Contains(r.stdout, "\x1b") {
		t.Fatalf("dlq list (table): %s", r)
	}
	if !strings.Contains(r.stdout, `\xffbad\x1b[31m`) {
		t.Errorf("the binary key should show escaped: %s", r.stdout)
	}
	t.Logf("dlq list:\n%s", r.stdout)

	// show: the full record.
	errJob := byFault["error"]
	r = d.cli("admin", "dlq", "show", fmt.Sprint(errJob.id))
	if r.code != 0 {
		t.Fatalf("dlq show: %s", r)
	}
	for _, want := range []string{"status      dead", "trace-id", "t-100", `\x00\xff`, "injected failure", "attempts    2",
		"token       " + errJob.token, "owner       " + errJob.owner, fmt.Sprintf("%s/%d/%d", e.topic, errJob.partition, errJob.offset),
		`{"seq":100,"tenure-fault":"error"}`, "actions     (none)"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("dlq show should print %q:\n%s", want, r.stdout)
		}
	}
	t.Logf("dlq show:\n%s", r.stdout)
	r = d.cli("admin", "dlq", "show", fmt.Sprint(byFault["binkey"].id))
	if r.code != 0 || !strings.Contains(r.stdout, `\xffbad\x1b[31m`) || !strings.Contains(r.stdout, "not UTF-8") || strings.Contains(r.stdout, "\x1b") {
		t.Errorf("dlq show of a binary key: %s", r)
	}
}

// replay: `dlq replay` of the error job.
func (d *dlqWorld) replay() {
	var r cliResult
	t, e, byFault, brokers := d.t, d.e, d.byFault, d.brokers
	errJob := byFault["error"]
	// replay: the job goes back to its topic, same key (so the same
	// partition), value and headers, at a new offset. It still carries its
	// fault, so the worker dead-letters it again: a new row.
	hwBefore := e.highWatermark(errJob.partition)
	r = d.cli("admin", "dlq", "replay", fmt.Sprint(errJob.id), "--brokers", brokers, "--actor", "ops@test")
	m := regexp.MustCompile(`to (\S+)/(\d+) at offset (\d+)`).FindStringSubmatch(r.stdout)
	if r.code != 0 || m == nil {
		t.Fatalf("dlq replay: %s", r)
	}
	t.Logf("dlq replay: %s", strings.TrimSpace(r.stdout))
	newPart, _ := strconv.Atoi(m[2])
	newOff, _ := strconv.ParseInt(m[3], 10, 64)
	if m[1] != e.topic || int32(newPart) != errJob.partition || newOff != hwBefore {
		t.Fatalf("replayed to %s/%d@%d, want %s/%d@%d", m[1], newPart, newOff, e.topic, errJob.partition, hwBefore)
	}
	var again dlqRow
	waitFor(t, 60*time.Second, "the replayed job to be dead-lettered again", func() bool {
		for _, dl := range deadLetterRows(t, e) {
			if dl.partition == errJob.partition && dl.offset == newOff {
				again = dl
				return true
			}
		}
		return false
	})
	if again.id == errJob.id || string(again.key) != string(errJob.key) || string(again.value) != string(errJob.value) ||
		again.headers != errJob.headers || again.attempts != 2 || again.status != "dead" {
		t.Errorf("the replayed job's new dead letter %+v should repeat %+v at a new offset", again, errJob)
	}
	var action string
	if err := e.pool.QueryRow(context.Background(), `SELECT action || ' ' || topic || '/' || partition || '@' || job_offset || ' by ' || actor
		FROM "`+e.schema+`".dead_letter_actions WHERE dead_letter_id = $1`, errJob.id).Scan(&action); err != nil ||
		action != fmt.Sprintf("replay %s/%d@%d by ops@test", e.topic, errJob.partition, newOff) {
		t.Errorf("replay action %q, %v", action, err)
	}
	r = d.cli("admin", "dlq", "show", fmt.Sprint(errJob.id))
	if r.code != 0 || !strings.Contains(r.stdout, "status      replayed") || !strings.Contains(r.stdout, "replayed by ops@test") {
		t.Errorf("dlq show after the replay: %s", r)
	}
}

// discardAndRefusals: `dlq discard`, then what is refused in one sentence
// (exit 1), with nothing produced or recorded.
func (d *dlqWorld) discardAndRefusals() {
	var r cliResult
	t, e, faulty, byFault, brokers := d.t, d.e, d.faulty, d.byFault, d.brokers
	errJob := byFault["error"]
	// discard, recorded.
	panicJob := byFault["panic"]
	r = d.cli("admin", "dlq", "discard", fmt.Sprint(panicJob.id), "--actor", "ops@test")
	if r.code != 0 || !strings.Contains(r.stdout, fmt.Sprintf("discarded dead letter %d", panicJob.id)) {
		t.Fatalf("dlq discard: %s", r)
	}
	t.Logf("dlq discard: %s", strings.TrimSpace(r.stdout))

	// Refusals: one sentence, exit 1, nothing produced or recorded.
	hw := e.highWatermark(errJob.partition)
	r = d.cli("admin", "dlq", "replay", fmt.Sprint(errJob.id), "--brokers", brokers)
	wantFailure(t, r, 1, fmt.Sprintf("dead letter %d was already replayed by ops@test", errJob.id), "nothing was replayed")
	t.Logf("second replay: %s", strings.TrimSpace(r.stderr))
	r = d.cli("admin", "dlq", "replay", fmt.Sprint(panicJob.id), "--brokers", brokers)
	wantFailure(t, r, 1, fmt.Sprintf("dead letter %d was already discarded by ops@test", panicJob.id))
	r = d.cli("admin", "dlq", "discard", fmt.Sprint(panicJob.id))
	wantFailure(t, r, 1, "already discarded")
	// Several ids, one of them unknown: none is touched.
	slowJob := byFault["slow"]
	r = d.cli("admin", "dlq", "replay", fmt.Sprint(slowJob.id), "999999", "--brokers", brokers)
	wantFailure(t, r, 1, "no dead letter 999999", "nothing was replayed")
	r = d.cli("admin", "dlq", "show", "999999")
	wantFailure(t, r, 1, "no dead letter 999999")
	if got := e.highWatermark(errJob.partition); got != hw {
		t.Errorf("a refused replay produced: high watermark %d -> %d", hw, got)
	}
	if d := deadLetterRows(t, e); len(d) != len(faulty)+1 {
		t.Errorf("%d dead letters after the refusals, want %d", len(d), len(faulty)+1)
	}
	var actions int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM "`+e.schema+`".dead_letter_actions`).Scan(&actions); err != nil || actions != 2 {
		t.Errorf("%d actions recorded (%v), want 2: the replay and the discard", actions, err)
	}
}

// badUsage: exit 2.
func (d *dlqWorld) badUsage() {
	t, db, brokers := d.t, d.db, d.brokers
	for _, args := range [][]string{
		{"admin", "dlq", "replay", "--brokers", brokers},
		{"admin", "dlq", "replay", "abc", "--brokers", brokers},
		{"admin", "dlq", "replay", "1", "1", "--brokers", brokers},
		{"admin", "dlq", "replay", "1"}, // no --brokers
		{"admin", "dlq", "show", "1", "2"},
		{"admin", "dlq", "list", "--status", "bogus"},
		{"admin", "dlq", "list", "--output", "yaml"},
		{"admin", "dlq", "discard", "0"},
		{"admin", "dlq"},
	} {
		r := runCLI(t, 30*time.Second, "", append(args, db...)...)
		wantFailure(t, r, 2)
	}
}

// statusAll: `dlq list --status all` shows the whole story.
func (d *dlqWorld) statusAll() {
	var r cliResult
	t := d.t
	var listed []map[string]any
	r = d.cli("admin", "dlq", "list", "--status", "all", "--output", "json")
	statuses := map[string]int{}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &listed) != nil {
		t.Fatalf("dlq list --status all: %s", r)
	}
	for _, l := range listed {
		statuses[fmt.Sprint(l["status"])]++
	}
	if statuses["dead"] != 3 || statuses["replayed"] != 1 || statuses["discarded"] != 1 {
		t.Errorf("statuses %v, want 3 dead, 1 replayed, 1 discarded", statuses)
	}
	r = d.cli("admin", "dlq", "list", "--status", "all")
	t.Logf("dlq list --status all:\n%s", r.stdout)
}

func faultOf(byFault map[string]dlqRow, id int64) string {
	for name, d := range byFault {
		if d.id == id {
			return name
		}
	}
	return ""
}

func firstJSONObject(s string) string {
	var v []json.RawMessage
	if json.Unmarshal([]byte(s), &v) != nil || len(v) == 0 {
		return s
	}
	var out bytes.Buffer
	_ = json.Indent(&out, v[0], "", "  ")
	return out.String()
}
