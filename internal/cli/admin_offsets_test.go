package cli

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The plan of `admin offsets reset`: where each target takes a partition's
// offset, what that skips or repeats, and which targets are refused.
func TestPlanReset(t *testing.T) {
	log := partLog{start: 10, end: 50, atTime: 30}
	for _, c := range []struct {
		name     string
		target   resetTarget
		next     int64
		to       int64
		skipped  *offsetSpan
		repeated *offsetSpan
		effect   string
	}{
		{"earliest repeats everything below the stored offset", resetTarget{kind: "earliest"}, 40, 10, nil, &offsetSpan{10, 39, 30}, "repeats 30 (offsets 10 to 39)"},
		{"latest skips the backlog", resetTarget{kind: "latest"}, 40, 50, &offsetSpan{40, 49, 10}, nil, "skips 10 (offsets 40 to 49)"},
		{"to an offset ahead", resetTarget{kind: "offset", offset: 41}, 40, 41, &offsetSpan{40, 40, 1}, nil, "skips 1 (offset 40)"},
		{"to an offset behind", resetTarget{kind: "offset", offset: 12}, 40, 12, nil, &offsetSpan{12, 39, 28}, "repeats 28 (offsets 12 to 39)"},
		{"to the log's end exactly", resetTarget{kind: "offset", offset: 50}, 40, 50, &offsetSpan{40, 49, 10}, nil, "skips 10 (offsets 40 to 49)"},
		{"to the log's start exactly", resetTarget{kind: "offset", offset: 10}, 40, 10, nil, &offsetSpan{10, 39, 30}, "repeats 30 (offsets 10 to 39)"},
		{"shift back", resetTarget{kind: "shift", offset: -5}, 40, 35, nil, &offsetSpan{35, 39, 5}, "repeats 5 (offsets 35 to 39)"},
		{"shift forward", resetTarget{kind: "shift", offset: 3}, 40, 43, &offsetSpan{40, 42, 3}, nil, "skips 3 (offsets 40 to 42)"},
		{"datetime", resetTarget{kind: "datetime"}, 40, 30, nil, &offsetSpan{30, 39, 10}, "repeats 10 (offsets 30 to 39)"},
		{"already there", resetTarget{kind: "offset", offset: 40}, 40, 40, nil, nil, "none (already there)"},
		// A stored offset below the log's start (the log was truncated
		// under it): to the start skips what was deleted.
		{"stored offset below the log", resetTarget{kind: "earliest"}, 4, 10, &offsetSpan{4, 9, 6}, nil, "skips 6 (offsets 4 to 9)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := planReset(c.target, 3, c.next, log)
			if err != nil {
				t.Fatal(err)
			}
			if r.Partition != 3 || r.NextOffset != c.next || r.NewOffset != c.to || r.LogStart != 10 || r.LogEnd != 50 ||
				!reflect.DeepEqual(r.Skipped, c.skipped) || !reflect.DeepEqual(r.Repeated, c.repeated) {
				t.Errorf("plan %+v (skipped %v, repeated %v), want to %d, skipped %v, repeated %v", r, r.Skipped, r.Repeated, c.to, c.skipped, c.repeated)
			}
			if got := r.effect(); got != c.effect {
				t.Errorf("effect %q, want %q", got, c.effect)
			}
		})
	}
	for _, c := range []struct {
		target resetTarget
		next   int64
		want   string
	}{
		{resetTarget{kind: "offset", offset: 51}, 40, "partition 3: offset 51 is outside the log, which holds offsets 10 to 49 (a next offset may be from 10 to 50)"},
		{resetTarget{kind: "offset", offset: 9}, 40, "offset 9 is outside the log"},
		{resetTarget{kind: "shift", offset: -31}, 40, "offset 9 (40 -31) is outside the log"},
		{resetTarget{kind: "shift", offset: 11}, 40, "offset 51 (40 +11) is outside the log"},
	} {
		_, err := planReset(c.target, 3, c.next, log)
		var oe *resetOutOfLog
		if !errors.As(err, &oe) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v from %d: %v, want a refusal saying %q", c.target, c.next, err, c.want)
		}
	}
	// An empty log: the only next offset is its end.
	if r, err := planReset(resetTarget{kind: "earliest"}, 0, 7, partLog{start: 7, end: 7}); err != nil || r.Skipped != nil || r.Repeated != nil {
		t.Errorf("empty log: %+v %v", r, err)
	}
}

// Bad usage of `admin offsets reset` is refused before anything connects.
func TestOffsetsResetUsage(t *testing.T) {
	base := []string{"admin", "offsets", "reset", "--brokers", "127.0.0.1:1", "--database-url", "postgres://127.0.0.1:1/x", "--group", "g", "--topic", "t"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--to-earliest"}, "give the partitions to reset: --partition P (repeatable) or --all-partitions"},
		{[]string{"--partition", "0", "--all-partitions", "--to-earliest"}, "--partition and --all-partitions do not go together"},
		{[]string{"--partition", "0"}, "say where the offsets go: one of --to-earliest"},
		{[]string{"--partition", "0", "--to-earliest", "--to-offset", "3"}, "--to-earliest and --to-offset do not go together"},
		{[]string{"--partition", "0", "--to-offset", "-3"}, `--to-offset "-3" is not an offset`},
		{[]string{"--partition", "0", "--shift-by", "x"}, `--shift-by "x" is not a whole number`},
		{[]string{"--partition", "0", "--shift-by", "0"}, "--shift-by 0 moves nothing"},
		{[]string{"--partition", "0", "--to-datetime", "yesterday"}, `--to-datetime "yesterday" is not an RFC3339 time`},
		{[]string{"--partition", "0", "--to-latest", "--dry-run", "--execute"}, "--dry-run and --execute do not go together"},
		{[]string{"--partition", "0,0", "--to-latest"}, "partition 0 is given twice"},
		{[]string{"--partition", "x", "--to-latest"}, `--partition "x" is not a partition number: a whole number from 0 to 9999`},
		{[]string{"--partition", "0", "--to-latest", "--actor", " "}, "--actor must not be empty"},
	} {
		code, stdout, stderr := runIn(t, append(append([]string{}, base...), c.args...)...)
		if code != 2 || stdout != "" || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 and %q", c.args, code, stderr, c.want)
		}
	}
	// The targets and switches never come from the environment: a
	// TENURE_EXECUTE left set must not arm a reset.
	code, _, stderr := runInEnv(t, map[string]string{"TENURE_EXECUTE": "true", "TENURE_TO_EARLIEST": "true"}, append(base, "--partition", "0")...)
	if code != 2 || !strings.Contains(stderr, "say where the offsets go") {
		t.Errorf("targets from the environment: exit %d, %q", code, stderr)
	}
	// A negative shift is a value, not a flag.
	code, _, stderr = runIn(t, append(append([]string{}, base...), "--partition", "1", "--partition", "2,3", "--shift-by", "-5")...)
	if code == 2 {
		t.Errorf("--shift-by -5 was refused as usage: %q", stderr)
	}
}

func TestParseJobID(t *testing.T) {
	topic, p, o, err := parseJobID("jobs.v2/3/1234")
	if err != nil || topic != "jobs.v2" || p != 3 || o != 1234 {
		t.Fatalf("parseJobID: %q %d %d %v", topic, p, o, err)
	}
	// What a handler gets is what the command takes.
	if _, _, _, err := parseJobID(jobRowID(&kgo.Record{Topic: "t", Partition: 2, Offset: 9})); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"t/0", "t/0/1/2", "t/-1/0", "t/0/-1", "t/x/0", "bad topic/0/0", "/0/0", "t/0/"} {
		if _, _, _, err := parseJobID(bad); err == nil {
			t.Errorf("%q was accepted", bad)
		}
	}
	code, _, stderr := runIn(t, "admin", "job", "--group", "g", "--database-url", "postgres://127.0.0.1:1/x", "t/0")
	if code != 2 || !strings.Contains(stderr, `job "t/0" is not TOPIC/PARTITION/OFFSET`) {
		t.Errorf("admin job t/0: exit %d, %q", code, stderr)
	}
	code, _, stderr = runIn(t, "admin", "job", "--database-url", "postgres://127.0.0.1:1/x", "t/0/1")
	if code != 2 || !strings.Contains(stderr, "--group is required") {
		t.Errorf("admin job without --group: exit %d, %q", code, stderr)
	}
}

func jobRowID(r *kgo.Record) string { return newJobRow(r).Job }

// A job's line escapes whatever its bytes hold, so that one job is one
// line and nothing reaches the terminal as a control sequence; JSON keeps
// the exact bytes in base64.
func TestJobLineEscapes(t *testing.T) {
	r := &kgo.Record{Topic: "t", Partition: 1, Offset: 7, Timestamp: time.Date(2026, 12, 3, 7, 46, 25, 0, time.UTC),
		Key: []byte("a\tb\n"), Value: []byte("\x1b[31mred\xff\\"), Headers: []kgo.RecordHeader{{Key: "id", Value: []byte("x\ny")}}}
	line := jobLine(r)
	want := "t/1/7\t2026-12-03T07:46:25.000Z\ta\\tb\\n\tid=x\\ny\t\\x1b[31mred\\xff\\\\"
	if line != want {
		t.Errorf("jobLine:\n got %q\nwant %q", line, want)
	}
	if l := jobLine(&kgo.Record{Topic: "t", Key: nil, Value: []byte{}}); !strings.Contains(l, "\t-\t-\t\"\"") {
		t.Errorf("absent key and empty value: %q", l)
	}
	row := newJobRow(r)
	if *row.ValueBase64 != "G1szMW1yZWT/XA==" || *row.Value != "\x1b[31mred\\xff\\" || row.Headers[0].Key != "id" || *row.Headers[0].Value != "x\ny" {
		t.Errorf("json row: %+v", row)
	}
}
