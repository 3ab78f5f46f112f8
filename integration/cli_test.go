package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tenure-dev/tenure/internal/testinfra/freeport"
	"github.com/tenure-dev/tenure/internal/testinfra/testdb"
	"github.com/tenure-dev/tenure/partition"
)

// cliResult is what one run of the tenure binary did.
type cliResult struct {
	stdout, stderr string
	code           int
	took           time.Duration
}

func (r cliResult) String() string {
	return fmt.Sprintf("exit %d after %s\nstdout:\n%s\nstderr:\n%s", r.code, r.took.Round(time.Millisecond), r.stdout, r.stderr)
}

// runCLI runs `tenure args...` with stdin and fails the test if it does not
// exit within timeout. TENURE_* variables of the test's own environment are
// removed (TENURE_TEST_* kept), so that only the flags given count.
func runCLI(t *testing.T, timeout time.Duration, stdin string, args ...string) cliResult {
	t.Helper()
	return runCLIWith(t, timeout, stdin, nil, args...)
}

// runCLIWith is runCLI with the TENURE_* variables vars set.
func runCLIWith(t *testing.T, timeout time.Duration, stdin string, vars map[string]string, args ...string) cliResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, tenureBin, args...)
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "TENURE_") && !strings.HasPrefix(kv, "TENURE_TEST_") {
			continue
		}
		cmd.Env = append(cmd.Env, kv)
	}
	for k, v := range vars {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	r := cliResult{stdout: stdout.String(), stderr: stderr.String(), took: time.Since(start)}
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Fatalf("tenure %s did not exit within %s\n%s", strings.Join(args, " "), timeout, r)
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		t.Fatalf("running tenure: %v", err)
	}
	return r
}

// wantFailure checks an exit with code whose stderr is one sentence on one
// line, containing each of want; never a stack trace or a panic.
func wantFailure(t *testing.T, r cliResult, code int, want ...string) {
	t.Helper()
	if r.code != code {
		t.Errorf("want exit %d, got %s", code, r)
		return
	}
	noCrash(t, r)
	if code == 1 {
		if s := strings.TrimSpace(r.stderr); s == "" || strings.Contains(s, "\n") {
			t.Errorf("want one line on stderr, got %q", r.stderr)
		}
	}
	for _, w := range want {
		if !strings.Contains(r.stderr, w) {
			t.Errorf("stderr should mention %q: %q", w, r.stderr)
		}
	}
}

func noCrash(t *testing.T, r cliResult) {
	t.Helper()
	if strings.Contains(r.stderr, "goroutine ") || strings.Contains(r.stderr, "panic") {
		t.Errorf("stderr looks like a crash:\n%s", r.stderr)
	}
}

func (e *env) totalHighWatermark(partitions int32) int64 {
	var n int64
	for p := range partitions {
		n += e.highWatermark(p)
	}
	return n
}

// assignmentFields are the JSON fields of `tenure admin assignments`.
var assignmentFields = []string{"client_id", "consumer_group", "epoch", "fence_epoch", "fence_owner", "for_seconds", "high_watermark", "host",
	"lag", "member_id", "next_offset", "partition", "reason", "since", "state", "topic"}

// assignmentsJSON runs `tenure admin assignments --output json` and checks
// that every object has exactly the documented fields.
func assignmentsJSON(t *testing.T, e *env) []map[string]any {
	t.Helper()
	r := runCLI(t, 60*time.Second, "", "admin", "assignments", "--brokers", strings.Join(e.brokers, ","),
		"--group", e.group, "--database-url", e.dbURL, "--schema", e.schema, "--output", "json")
	if r.code != 0 {
		t.Fatalf("admin assignments: %s", r)
	}
	var rows []map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &rows); err != nil {
		t.Fatalf("admin assignments --output json is not a JSON array of objects: %v\n%s", err, r.stdout)
	}
	for _, row := range rows {
		var keys []string
		for k := range row {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		if !reflect.DeepEqual(keys, assignmentFields) {
			t.Fatalf("fields %v, want exactly %v", keys, assignmentFields)
		}
	}
	return rows
}

// Jobs produced with `tenure produce`, two workers, and `tenure admin
// assignments` showing the coordinator and Postgres agreeing on every
// partition, with the lag Postgres sees going to zero.
func TestCLIProduceAndAssignments(t *testing.T) {
	eachProtocol(t, assignmentsPartitions, testCLIProduceAndAssignments)
}

// assignmentsPartitions is the topic's partition count in
// TestCLIProduceAndAssignments.
const assignmentsPartitions = 3

func testCLIProduceAndAssignments(t *testing.T, e *env, proto string) {
	const partitions = assignmentsPartitions
	brokers := strings.Join(e.brokers, ",")

	checkProduceCLI(t, e, partitions)

	a := e.startWorker("A", "--protocol", proto)
	b := e.startWorker("B", "--protocol", proto)
	waitForMembers(t, e, 2)

	rows := waitAssignmentsOK(t, e, partitions)
	checkAssignmentRows(t, e, rows, proto)
	// The table form: a header and one row per partition, the state and
	// how long it has held last ("-": ok has no since).
	t.Run("AssignmentsTable", func(t *testing.T) {
		r := runCLI(t, 60*time.Second, "", "admin", "assignments", "--brokers", brokers, "--group", e.group,
			"--database-url", e.dbURL, "--schema", e.schema, "--topic", e.topic)
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		if r.code != 0 || len(lines) != partitions+1 || !strings.HasPrefix(lines[0], "GROUP ") || !strings.HasPrefix(lines[1], e.group+" ") {
			t.Fatalf("admin assignments (table): %s", r)
		}
		for _, l := range lines[1:] {
			if f := strings.Fields(l); f[len(f)-2] != "ok" || f[len(f)-1] != "-" {
				t.Errorf("table row not ok: %q", l)
			}
		}
		t.Logf("admin assignments:\n%s", r.stdout)
	})
	t.Run("Fences", func(t *testing.T) {
		r := runCLI(t, 60*time.Second, "", "admin", "fences", "--database-url", e.dbURL, "--schema", e.schema,
			"--group", e.group, "--output", "json")
		var fences []map[string]any
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &fences) != nil || len(fences) != partitions {
			t.Fatalf("admin fences: %s", r)
		}
		for _, f := range fences {
			if f["owner"] != rows[int(f["partition"].(float64))]["fence_owner"] {
				t.Errorf("fence row %v disagrees with assignments", f)
			}
		}
	})
	t.Run("Groups", func(t *testing.T) {
		r := runCLI(t, 60*time.Second, "", "admin", "groups", "--brokers", brokers, "--output", "json")
		var groups []map[string]any
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &groups) != nil {
			t.Fatalf("admin groups: %s", r)
		}
		found := false
		for _, g := range groups {
			if g["group"] == e.group {
				found = true
				if g["members"] != float64(2) || g["type"] != map[string]string{"classic": "classic", "consumer": "consumer"}[proto] {
					t.Errorf("group row %v", g)
				}
			}
		}
		if !found {
			t.Errorf("admin groups does not list %s: %s", e.group, r.stdout)
		}
	})
	t.Run("TopicDescribe", func(t *testing.T) {
		r := runCLI(t, 60*time.Second, "", "admin", "topic", "describe", "--brokers", brokers, "--topic", e.topic)
		if r.code != 0 || !strings.Contains(r.stdout, fmt.Sprintf("topic %s: %d partitions", e.topic, partitions)) {
			t.Fatalf("admin topic describe: %s", r)
		}
	})

	// With both workers gone, nobody is assigned; Postgres still shows the
	// last owners and their progress.
	a.stop(30 * time.Second)
	b.stop(30 * time.Second)
	waitFor(t, 60*time.Second, "every partition unowned", func() bool {
		rows = assignmentsJSON(t, e)
		for _, row := range rows {
			if row["state"] != "unowned" || row["fence_owner"] == "" || row["member_id"] != "" {
				return false
			}
		}
		return len(rows) == partitions
	})
}

// checkProduceCLI: tenure produce generates jobs, and reports a small
// input key by key on partition.For's partitions.
func checkProduceCLI(t *testing.T, e *env, partitions int32) {
	t.Helper()
	brokers := strings.Join(e.brokers, ",")
	r := runCLI(t, 60*time.Second, "", "produce", "--brokers", brokers, "--topic", e.topic, "--generate", "300", "--key-count", "12")
	if r.code != 0 || !strings.Contains(r.stdout, "produced 300 jobs") {
		t.Fatalf("produce --generate: %s", r)
	}
	if r.stderr != "" {
		t.Errorf("produce --generate wrote to stderr, which is not a terminal (progress goes to terminals only): %q", r.stderr)
	}
	t.Logf("produce --generate:\n%s", r.stdout)

	// A small input is reported key by key; the partitions printed are
	// partition.For's.
	input := `{"key": "acme", "value": {"n": 1}}
{"key": "globex", "value": "plain text"}

{"key": "initech", "value": [1, 2, 3]}
{"key": "acme", "value": null}
`
	r = runCLI(t, 60*time.Second, input, "produce", "--brokers", brokers, "--topic", e.topic, "--input", "-")
	if r.code != 0 {
		t.Fatalf("produce --input: %s", r)
	}
	t.Logf("produce --input:\n%s", r.stdout)
	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n")[2:] {
		f := strings.Fields(line)
		if len(f) != 4 {
			t.Fatalf("per-key line %q", line)
		}
		p, err := strconv.Atoi(f[1])
		if err != nil || int32(p) != partition.For([]byte(f[0]), partitions) {
			t.Errorf("key %s reported on partition %s, partition.For says %d", f[0], f[1], partition.For([]byte(f[0]), partitions))
		}
		seen[f[0]] = true
		if f[0] == "acme" && f[2] != "2" {
			t.Errorf("acme has 2 jobs: %q", line)
		}
	}
	if len(seen) != 3 {
		t.Errorf("want 3 keys reported, got %v", seen)
	}
	if got := e.totalHighWatermark(partitions); got != 304 {
		t.Fatalf("%d jobs in the topic, want 304", got)
	}
}

// waitAssignmentsOK waits until admin assignments shows every partition
// ok with lag 0, and returns its rows.
func waitAssignmentsOK(t *testing.T, e *env, partitions int) []map[string]any {
	t.Helper()
	var rows []map[string]any
	var last string
	waitFor(t, 90*time.Second, "every partition ok with lag 0", func() bool {
		rows = assignmentsJSON(t, e)
		b, _ := json.Marshal(rows)
		last = string(b)
		if len(rows) != partitions {
			return false
		}
		for _, row := range rows {
			if row["state"] != "ok" || row["lag"] != float64(0) {
				return false
			}
		}
		return true
	})
	t.Logf("assignments: %s", last)
	return rows
}

// checkAssignmentRows: admin assignments' rows, one per partition, agree
// with the fencing rows and the topic, and both workers own some.
func checkAssignmentRows(t *testing.T, e *env, rows []map[string]any, proto string) {
	t.Helper()
	members := map[string]bool{}
	for i, row := range rows {
		if row["topic"] != e.topic || row["partition"] != float64(i) {
			t.Errorf("row %d is %v/%v", i, row["topic"], row["partition"])
		}
		if row["member_id"] == "" || row["member_id"] != row["fence_owner"] {
			t.Errorf("partition %d: member %v, fence owner %v", i, row["member_id"], row["fence_owner"])
		}
		members[fmt.Sprint(row["member_id"])] = true
		if c := fmt.Sprint(row["client_id"]); c != "tenure-A" && c != "tenure-B" {
			t.Errorf("partition %d: client id %q", i, c)
		}
		hw := e.highWatermark(int32(i))
		if row["high_watermark"] != float64(hw) || row["next_offset"] != float64(hw) {
			t.Errorf("partition %d: high watermark %v, next offset %v, want both %d", i, row["high_watermark"], row["next_offset"], hw)
		}
		// The token's epoch is the epoch the partition was claimed at: at
		// most the member's epoch now. KIP-848 always reports one; classic
		// groups only when it can be inferred.
		tok := fmt.Sprint(row["fence_epoch"])
		var inc, claimed int64
		if _, err := fmt.Sscanf(tok, "%d.%d", &inc, &claimed); err != nil {
			t.Errorf("partition %d: fence_epoch %q is not incarnation.epoch", i, tok)
		}
		switch ep := row["epoch"].(type) {
		case float64:
			if int64(ep) < claimed {
				t.Errorf("partition %d: member epoch %v below the claimed token %s", i, ep, tok)
			}
		case nil:
			if proto == "consumer" {
				t.Errorf("partition %d: KIP-848 member epoch missing", i)
			}
		default:
			t.Errorf("partition %d: epoch %v", i, ep)
		}
	}
	if len(members) != 2 {
		t.Errorf("both workers should own partitions, got %v", members)
	}
}

// Bad input is refused whole: one sentence, exit 1, nothing produced.
func TestCLIProduceRejectsBadInput(t *testing.T) {
	t.Parallel()
	const partitions = 3
	e := newEnv(t, partitions)
	brokers := strings.Join(e.brokers, ",")
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := `{"key":"a","value":1}` + "\n" + `{"key":"b","value":"two"}` + "\n"
	huge := `{"key":"big","value":"` + strings.Repeat("x", 1<<20) + `"}` + "\n"
	for _, c := range []struct {
		name  string
		stdin string
		args  []string
		want  []string
	}{
		{"malformed line", "", []string{"--input", file("bad.jsonl", good+`{"key":"c","value":`+"\n")}, []string{"line 3 of", "nothing was produced"}},
		{"malformed line on stdin", good + "{nope}\n", []string{"--input", "-"}, []string{"line 3 of standard input"}},
		{"missing key", good + `{"value":3}` + "\n", []string{"--input", "-"}, []string{"line 3", "no \"key\""}},
		{"empty key", `{"key":"","value":3}` + "\n" + good, []string{"--input", "-"}, []string{"line 1", "no key"}},
		{"key not a string", `{"key":7,"value":3}` + "\n", []string{"--input", "-"}, []string{"line 1", "JSON string"}},
		{"missing value", good + `{"key":"c"}` + "\n", []string{"--input", "-"}, []string{"line 3", "no \"value\""}},
		{"unknown field", `{"key":"c","vaule":1}` + "\n", []string{"--input", "-"}, []string{"line 1", "vaule"}},
		{"oversized (1 MiB default)", good + huge, []string{"--input", "-"}, []string{"line 3", "--max-bytes 1048576"}},
		{"oversized --key", "", []string{"--key", "k", "--value", strings.Repeat("v", 200), "--max-bytes", "100"}, []string{"--max-bytes 100"}},
		{"empty input", "\n\n", []string{"--input", "-"}, []string{"no jobs"}},
		{"missing file", "", []string{"--input", filepath.Join(dir, "absent.jsonl")}, []string{"absent.jsonl"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"produce", "--brokers", brokers, "--topic", e.topic}, c.args...)
			r := runCLI(t, 60*time.Second, c.stdin, args...)
			wantFailure(t, r, 1, c.want...)
			if got := e.totalHighWatermark(partitions); got != 0 {
				t.Fatalf("%d jobs were produced", got)
			}
		})
	}

	t.Run("unknown topic", func(t *testing.T) {
		r := runCLI(t, 60*time.Second, "", "produce", "--brokers", brokers, "--topic", e.topic+"-absent", "--key", "k", "--value", "v")
		wantFailure(t, r, 1, "does not exist", "tenure admin topic create")
	})

	// The same inputs minus the bad line go through.
	r := runCLI(t, 60*time.Second, good, "produce", "--brokers", brokers, "--topic", e.topic, "--input", "-")
	if r.code != 0 || e.totalHighWatermark(partitions) != 2 {
		t.Fatalf("good input: %s", r)
	}
}

// Bad usage exits 2 with a usage line, before connecting to anything.
func TestCLIUsageErrors(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"admin"}, []string{"usage: tenure admin", "topic create", "topic describe", "groups", "assignments", "fences"}},
		{[]string{"admin", "bogus"}, []string{"unknown subcommand", "usage: tenure admin"}},
		{[]string{"admin", "topic"}, []string{"needs a subcommand", "topic create", "topic add-partitions"}},
		{[]string{"admin", "topic", "bogus"}, []string{`unknown subcommand "topic bogus"`, "topic create"}},
		{[]string{"admin", "topic", "create", "--brokers", "h:1", "--topic", "t"}, []string{"--partitions is required", "usage: tenure admin topic create"}},
		{[]string{"admin", "topic", "create", "--brokers", "h:1", "--topic", "t", "--partitions", "3", "--replication-factor", "0"}, []string{"--replication-factor"}},
		{[]string{"admin", "topic", "describe", "--brokers", "h:1"}, []string{"--topic is required"}},
		{[]string{"admin", "groups", "--bogus"}, []string{"flag provided but not defined", "usage: tenure admin groups"}},
		{[]string{"admin", "assignments", "--brokers", "h:1", "--database-url", "postgres://x"}, []string{"--group is required", "TENURE_GROUP"}},
		{[]string{"admin", "assignments", "--brokers", "h:1", "--group", "g", "--database-url", "postgres://x", "--output", "yaml"}, []string{"--output \"yaml\""}},
		{[]string{"admin", "fences"}, []string{"--database-url is required"}},
		{[]string{"admin", "fences", "--database-url", "postgres://x", "--schema", "Bad-Name"}, []string{"schema name"}},
		{[]string{"produce", "--bogus"}, []string{"flag provided but not defined", "usage: tenure produce"}},
		{[]string{"produce", "--brokers", "h:1"}, []string{"--topic is required"}},
		{[]string{"produce", "--brokers", "h:1", "--topic", "t"}, []string{"exactly one of"}},
		{[]string{"produce", "--brokers", "h:1", "--topic", "t", "--key", "k", "--value", "v", "--generate", "3"}, []string{"exactly one of"}},
		{[]string{"produce", "--brokers", "h:1", "--topic", "t", "--value", "v"}, []string{"--value needs --key"}},
		{[]string{"produce", "--brokers", "h:1", "--topic", "t", "--generate", "3", "--key-count", "0"}, []string{"--key-count must be at least 1"}},
		{[]string{"produce", "--brokers", "h:1", "--topic", "t", "--generate", "3", "--keys", "2"}, []string{"flag provided but not defined: --keys"}},
		{[]string{"produce", "--brokers", "nohostport", "--topic", "t", "--key", "k", "--value", "v"}, []string{"not host:port"}},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			r := runCLI(t, 30*time.Second, "", c.args...)
			wantFailure(t, r, 2, c.want...)
		})
	}
}

// silentBroker returns a loopback address that accepts connections (the
// kernel completes the handshake) and never answers.
func silentBroker(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l.Addr().String()
}

// Unreachable servers and bad URLs: exit 1, one sentence, within a bound.
func TestCLIUnreachable(t *testing.T) {
	t.Parallel()
	closed, silent := freeport.Closed(t), silentBroker(t)
	closedDB := "postgres://postgres@" + freeport.Closed(t) + "/postgres?sslmode=disable&connect_timeout=5"
	goodDB, schema := testdb.URL(), testdb.Schema(t, testdb.Pool(t))
	const bound = 30 * time.Second // the commands give up after 15s
	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"produce, closed broker", []string{"produce", "--brokers", closed, "--topic", "t", "--key", "k", "--value", "v"}, []string{"cannot reach the Kafka brokers " + closed}},
		{"groups, closed broker", []string{"admin", "groups", "--brokers", closed}, []string{"cannot reach the Kafka brokers " + closed}},
		{"groups, silent broker", []string{"admin", "groups", "--brokers", silent}, []string{"cannot reach the Kafka brokers " + silent, "no answer within"}},
		{"topic create, closed broker", []string{"admin", "topic", "create", "--brokers", closed, "--topic", "t", "--partitions", "1"}, []string{"cannot reach the Kafka brokers"}},
		{"topic describe, closed broker", []string{"admin", "topic", "describe", "--brokers", closed, "--topic", "t"}, []string{"cannot reach the Kafka brokers"}},
		{"assignments, closed broker", []string{"admin", "assignments", "--brokers", closed, "--group", "g", "--database-url", goodDB, "--schema", schema}, []string{"cannot reach the Kafka brokers"}},
		{"assignments, closed database", []string{"admin", "assignments", "--brokers", closed, "--group", "g", "--database-url", closedDB}, []string{"cannot reach the database"}},
		{"fences, closed database", []string{"admin", "fences", "--database-url", closedDB}, []string{"cannot reach the database"}},
		{"fences, schema without tables", []string{"admin", "fences", "--database-url", goodDB, "--schema", "tenure_never_migrated"}, []string{"tenure migrate up"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := runCLI(t, bound, "", c.args...)
			wantFailure(t, r, 1, c.want...)
			t.Logf("%s: %s", r.took.Round(time.Millisecond), strings.TrimSpace(r.stderr))
		})
	}
	// A database URL that is not one is bad usage, said before anything
	// connects, in every command.
	for _, args := range [][]string{
		{"admin", "fences", "--database-url", "postgres://%zz"},
		{"admin", "fences", "--database-url", "http://foo"},
		{"migrate", "up", "--database-url", "http://foo"},
		{"worker", "--brokers", closed, "--group", "g", "--topic", "t", "--handler", "noop", "--database-url", "http://foo"},
		{"admin", "assignments", "--brokers", closed, "--group", "g", "--database-url", "localhost"},
		{"demo", "--database-url", "https://db.example"},
	} {
		r := runCLI(t, bound, "", args...)
		wantFailure(t, r, 2, "tenure "+args[0], "the database URL (--database-url) is not", "usage: tenure")
		if r.took > 5*time.Second {
			t.Errorf("%v: refused after %s", args, r.took)
		}
	}
}

// rowsByPartition indexes `admin assignments` rows.
func rowsByPartition(rows []map[string]any) map[int]map[string]any {
	m := map[int]map[string]any{}
	for _, r := range rows {
		if p, ok := r["partition"].(float64); ok {
			m[int(p)] = r
		}
	}
	return m
}

// A new member has been given a partition but has not claimed it yet (it is
// held before its claim) while the previous owner is still in the group:
// claim-pending. Once it claims: ok.
func TestCLIAssignmentsClaimPending(t *testing.T) {
	eachProtocol(t, 2, func(t *testing.T, e *env, proto string) {
		e.produce(jobsFor(keys, 0, 20)...)
		a := e.startWorker("A", "--protocol", proto)
		waitFor(t, 60*time.Second, "A to own both partitions", func() bool {
			return fenceRow(t, e, 0).owner != "" && fenceRow(t, e, 1).owner != ""
		})
		owner := fenceRow(t, e, 0).owner
		b := e.startWorker("B", "--protocol", proto, "--hold-once", "before-claim")
		b.waitLog(60*time.Second, map[string]any{"msg": "holding", "point": "before-claim"})

		var last []map[string]any
		waitFor(t, 60*time.Second, "one partition claim-pending for B, the other ok for A", func() bool {
			last = assignmentsJSON(t, e)
			var pending, ok int
			for _, r := range last {
				switch {
				case r["state"] == "claim-pending" && r["client_id"] == "tenure-B" && r["fence_owner"] == owner:
					pending++
				case r["state"] == "ok" && r["client_id"] == "tenure-A" && r["member_id"] == owner:
					ok++
				}
			}
			return pending == 1 && ok == 1
		})
		t.Logf("during the hand-off: %v", last)

		b.resume() // releases the hold: B claims
		waitFor(t, 60*time.Second, "both partitions ok, one per worker", func() bool {
			last = assignmentsJSON(t, e)
			clients := map[any]bool{}
			for _, r := range last {
				if r["state"] != "ok" || r["member_id"] != r["fence_owner"] {
					return false
				}
				clients[r["client_id"]] = true
			}
			return len(last) == 2 && len(clients) == 2
		})
		b.stop(30 * time.Second)
		a.stop(30 * time.Second)
	})
}

// The owner in Postgres was evicted (paused past its session timeout); the
// coordinator gave its partition to B, which has not claimed yet:
// stale-owner. Once B claims: ok, with B as the fence owner.
func TestCLIAssignmentsStaleOwner(t *testing.T) {
	eachProtocol(t, 1, func(t *testing.T, e *env, proto string) {
		e.produce(jobsFor(keys, 0, 20)...)
		a := e.startWorker("A", "--protocol", proto)
		waitCommitted(t, e, 0, 20, "A")
		owner := fenceRow(t, e, 0).owner
		b := e.startWorker("B", "--protocol", proto, "--hold-once", "before-claim")
		b.waitLog(30*time.Second, map[string]any{"msg": "worker starting"})
		waitForMembers(t, e, 2)
		a.pause()
		b.waitLog(60*time.Second, map[string]any{"msg": "holding", "point": "before-claim"})

		var row map[string]any
		waitFor(t, 30*time.Second, "stale-owner: assigned to B, fenced by the evicted A", func() bool {
			row = rowsByPartition(assignmentsJSON(t, e))[0]
			return row["state"] == "stale-owner"
		})
		if row["client_id"] != "tenure-B" || row["fence_owner"] != owner || row["member_id"] == owner {
			t.Errorf("stale-owner row: %v (A was %s)", row, owner)
		}
		t.Logf("stale owner: %v", row)

		b.resume()
		waitFor(t, 60*time.Second, "B to claim: ok", func() bool {
			row = rowsByPartition(assignmentsJSON(t, e))[0]
			return row["state"] == "ok" && row["client_id"] == "tenure-B"
		})
		a.resume()
		b.stop(30 * time.Second)
		a.stop(30 * time.Second)
	})
}

// suggested returns the tenure commands a message suggests (`tenure ...`
// in backquotes), as argument lists, placeholders replaced by subst.
func suggested(t *testing.T, msg string, subst map[string]string) [][]string {
	t.Helper()
	var out [][]string
	for _, m := range regexp.MustCompile("`tenure ([^`]+)`").FindAllStringSubmatch(msg, -1) {
		args := strings.Fields(m[1])
		for i, a := range args {
			if v, ok := subst[a]; ok {
				args[i] = v
			}
		}
		out = append(out, args)
	}
	if len(out) == 0 {
		t.Fatalf("no command suggested in %q", msg)
	}
	return out
}

// runSuggested runs every command msg suggests, with vars set, and wants
// each to succeed.
func runSuggested(t *testing.T, msg string, vars, subst map[string]string) {
	t.Helper()
	for _, args := range suggested(t, msg, subst) {
		// The variables stand for the connection settings the operator
		// (or the worker that logged the message) already has.
		r := runCLIWith(t, 60*time.Second, "", vars, args...)
		if r.code != 0 {
			t.Errorf("the message %q suggests `tenure %s`, which fails: %s", msg, strings.Join(args, " "), r)
		} else {
			t.Logf("ran the suggested `tenure %s`: %s", strings.Join(args, " "), strings.TrimSpace(r.stdout+r.stderr))
		}
	}
}

// Every command a message suggests works as written (flags after the
// subcommand word included), given the same connection settings.
func TestCLISuggestedCommandsWork(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	brokers := strings.Join(e.brokers, ",")
	vars := map[string]string{"TENURE_DATABASE_URL": e.dbURL, "TENURE_BROKERS": brokers}

	// A schema without tables: fences and dlq say to migrate it; a worker
	// with --no-migrate says so too.
	for _, args := range [][]string{{"admin", "fences"}, {"admin", "dlq", "list"},
		{"worker", "--brokers", brokers, "--group", e.group, "--topic", e.topic, "--handler", "noop", "--no-migrate"}} {
		fresh := testdb.FreshSchema(t, e.pool, "tenure_cli_fresh")
		r := runCLI(t, 30*time.Second, "", append(args, "--database-url", e.dbURL, "--schema", fresh)...)
		wantFailure(t, r, 1, "`tenure migrate up --schema "+fresh+"`")
		runSuggested(t, r.stderr, vars, nil)
		r = runCLI(t, 30*time.Second, "", "admin", "fences", "--database-url", e.dbURL, "--schema", fresh)
		if r.code != 0 {
			t.Fatalf("after the suggested migration: %s", r)
		}
	}

	// A missing topic, and one that exists.
	r := runCLI(t, 30*time.Second, "", "produce", "--brokers", brokers, "--topic", e.topic+"-new", "--key", "k", "--value", "v")
	wantFailure(t, r, 1, "does not exist")
	runSuggested(t, r.stderr, vars, map[string]string{"N": "2"})
	r = runCLI(t, 30*time.Second, "", "admin", "topic", "create", "--brokers", brokers, "--topic", e.topic, "--partitions", "2")
	wantFailure(t, r, 1, "already exists")
	runSuggested(t, r.stderr, vars, nil)

	// Dead letters: the list to look in.
	db := []string{"--database-url", e.dbURL, "--schema", e.schema}
	r = runCLI(t, 30*time.Second, "", append([]string{"admin", "dlq", "show", "999"}, db...)...)
	wantFailure(t, r, 1, "no dead letter 999")
	runSuggested(t, r.stderr, map[string]string{"TENURE_DATABASE_URL": e.dbURL, "TENURE_SCHEMA": e.schema}, nil)
	r = runCLI(t, 30*time.Second, "", append([]string{"admin", "dlq", "replay", "--brokers", brokers}, db...)...)
	wantFailure(t, r, 2, "give the ID")
	runSuggested(t, r.stderr, map[string]string{"TENURE_DATABASE_URL": e.dbURL, "TENURE_SCHEMA": e.schema}, nil)
}

// Absurd partition counts are refused at the door with the limit, quickly,
// and nothing is created; values beyond 32 bits do not wrap.
func TestCLIPartitionCountsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	brokers := strings.Join(e.brokers, ",")
	db := []string{"--database-url", e.dbURL, "--schema", e.schema}
	for _, args := range [][]string{
		{"admin", "topic", "create", "--brokers", brokers, "--topic", e.topic + "-huge", "--partitions", "2147483647"},
		{"admin", "topic", "create", "--brokers", brokers, "--topic", e.topic + "-wrap", "--partitions", "4294967297"},
		{"admin", "topic", "add-partitions", "--brokers", brokers, "--topic", e.topic, "--partitions", "4294967298"},
		append([]string{"admin", "topic", "acknowledge-partitions", "--brokers", brokers, "--group", e.group, "--topic", e.topic, "--partitions", "4294967298"}, db...),
	} {
		r := runCLI(t, 30*time.Second, "", args...)
		wantFailure(t, r, 2, "is not a partition count: a whole number from 1 to 10000")
		if r.took > 5*time.Second {
			t.Errorf("%v took %s", args, r.took)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	td, err := kadm.NewClient(e.cl).ListTopics(ctx, e.topic, e.topic+"-huge", e.topic+"-wrap")
	if err != nil {
		t.Fatal(err)
	}
	if td.Has(e.topic+"-huge") || td.Has(e.topic+"-wrap") || len(td[e.topic].Partitions) != 2 {
		t.Errorf("topics after the refusals: %v", td.Names())
	}
	// One partition, said in the singular.
	r := runCLI(t, 30*time.Second, "", "admin", "topic", "create", "--brokers", brokers, "--topic", e.topic+"-one", "--partitions", "1")
	if r.code != 0 || strings.TrimSpace(r.stdout) != "created topic "+e.topic+"-one with 1 partition (replication factor 1)" {
		t.Errorf("topic create: %s", r)
	}
}

// A `tenure broker` process refuses absurd requests from any client and
// keeps serving; it used to grow to gigabytes and stop answering.
func TestCLIBrokerRefusesAbsurdRequests(t *testing.T) {
	t.Parallel()
	addr := freeport.Closed(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := exec.CommandContext(ctx, tenureBin, "broker", "--listen", addr)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); _ = cmd.Wait() }()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	rctx, rcancel := context.WithTimeout(ctx, 20*time.Second)
	defer rcancel()
	waitFor(t, 10*time.Second, "the broker to answer", func() bool { _, err := adm.ListTopics(rctx); return err == nil })
	resp, err := adm.CreateTopic(rctx, 1<<31-1, 1, nil, "huge")
	if err == nil {
		err = resp.Err
	}
	if !errors.Is(err, kerr.InvalidPartitions) || !strings.Contains(resp.ErrMessage, "10000") {
		t.Fatalf("creating 2^31-1 partitions: %v %q", err, resp.ErrMessage)
	}
	if rss := processRSS(t, cmd.Process.Pid); rss > 512<<20 {
		t.Errorf("the broker uses %d MiB after the refusal", rss>>20)
	}
	r := runCLI(t, 30*time.Second, "", "admin", "topic", "create", "--brokers", addr, "--topic", "after", "--partitions", "3")
	if r.code != 0 {
		t.Errorf("the broker stopped serving: %s", r)
	}
}

// processRSS reads a process's resident set size from /proc.
func processRSS(t *testing.T, pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// Adding partitions holds the topic, and `assignments` says so; the
// acknowledgement needs --brokers, takes Kafka's count, and never accepts a
// decrease. The refusal the workers log suggests a command that works.
func TestCLIAddAndAcknowledgePartitions(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	if e.real {
		t.Skip("adds partitions to a topic")
	}
	brokers := strings.Join(e.brokers, ",")
	db := []string{"--database-url", e.dbURL, "--schema", e.schema}
	e.produce(jobsFor(keys, 0, 20)...)
	w := e.startWorker("A")
	for p := range int32(2) {
		waitCommitted(t, e, p, e.highWatermark(p), "")
	}

	r := runCLI(t, 60*time.Second, "", "admin", "topic", "add-partitions", "--brokers", brokers, "--topic", e.topic, "--partitions", "3")
	if r.code != 0 || !strings.Contains(r.stdout, "now has 3 partitions (was 2)") || !strings.Contains(r.stdout, "ordering hazard") {
		t.Fatalf("add-partitions: %s", r)
	}
	refusal := w.waitLog(60*time.Second, map[string]any{"msg": "topic partitions changed: not processing it"})
	held := func(state string) func() bool {
		return func() bool {
			rows := assignmentsJSON(t, e)
			for _, row := range rows {
				if row["state"] != state {
					return false
				}
			}
			return len(rows) == 3
		}
	}
	waitFor(t, 60*time.Second, "every partition held-partitions", held("held-partitions"))
	// assignments gives the reason, and admin holds lists the topic.
	reason := "topic " + e.topic + " has 3 partitions in Kafka but group " + e.group + " recorded 2"
	for _, row := range assignmentsJSON(t, e) {
		if row["consumer_group"] != e.group || !strings.Contains(fmt.Sprint(row["reason"]), reason) ||
			!strings.Contains(fmt.Sprint(row["reason"]), "`tenure admin topic acknowledge-partitions --group "+e.group+" --topic "+e.topic+"`") {
			t.Errorf("a held-partitions row: %v", row)
		}
	}
	tab := runCLI(t, 60*time.Second, "", append([]string{"admin", "assignments", "--brokers", brokers, "--group", e.group}, db...)...)
	lines := strings.Split(strings.TrimSpace(tab.stdout), "\n")
	if tab.code != 0 || len(lines) != 5 || strings.Join(strings.Fields(lines[0]), " ") != "GROUP TOPIC PARTITION MEMBER EPOCH TOKEN FENCE_OWNER NEXT_OFFSET HIGH_WATERMARK LAG STATE FOR" ||
		!strings.HasPrefix(lines[1], e.group+" ") || !regexp.MustCompile(`\btenure-A-[0-9a-f]{8}\s`).MatchString(lines[1]) ||
		regexp.MustCompile(`[0-9a-f]{32}`).MatchString(tab.stdout) || !strings.Contains(lines[4], e.topic+"/0,1,2 held-partitions: "+reason) {
		t.Errorf("admin assignments (table): %s", tab)
	}
	for _, l := range lines[1:4] {
		if len(l) > 160 {
			t.Errorf("a line of %d characters: %q", len(l), l)
		}
	}
	hr := runCLI(t, 60*time.Second, "", append([]string{"admin", "holds", "--brokers", brokers}, db...)...)
	if hl := strings.Split(hr.stdout, "\n"); hr.code != 0 || len(hl) < 2 || !strings.HasPrefix(strings.Join(strings.Fields(hl[1]), " "), e.group+" "+e.topic+" all partitions-changed yes") ||
		!strings.Contains(hr.stdout, reason) {
		t.Errorf("admin holds --brokers: %s", hr)
	}

	ack := append([]string{"admin", "topic", "acknowledge-partitions", "--group", e.group, "--topic", e.topic}, db...)
	wantFailure(t, runCLI(t, 30*time.Second, "", ack...), 2, "--brokers is required")
	wantFailure(t, runCLI(t, 30*time.Second, "", append(ack, "--brokers", brokers, "--partitions", "5")...), 1, "has 3 partitions in Kafka, not 5")

	// add-partitions and the worker's refusal name the command that
	// accepts the count; with the connection settings the operator (or the
	// worker) has, it works. The second run finds nothing to change.
	vars := map[string]string{"TENURE_BROKERS": brokers, "TENURE_DATABASE_URL": e.dbURL, "TENURE_SCHEMA": e.schema}
	runSuggested(t, r.stdout, vars, map[string]string{"G": e.group})
	runSuggested(t, fmt.Sprint(refusal["error"]), vars, nil)
	waitFor(t, 60*time.Second, "every partition ok", held("ok"))

	hr = runCLI(t, 60*time.Second, "", append([]string{"admin", "holds", "--brokers", brokers}, db...)...)
	if hr.code != 0 || strings.Contains(hr.stdout, "partitions-changed") {
		t.Errorf("admin holds --brokers once acknowledged: %s", hr)
	}

	// A count recorded above Kafka's (what acknowledge-partitions without
	// a broker used to accept): the topic is held, assignments and holds
	// say so, and a decrease is refused.
	if _, err := e.pool.Exec(context.Background(), `UPDATE "`+e.schema+`".topic_layouts SET partition_count = 5 WHERE consumer_group = $1`, e.group); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "every partition held-partitions", held("held-partitions"))
	wantFailure(t, runCLI(t, 30*time.Second, "", append(ack, "--brokers", brokers)...), 1, "fewer than the 5", "a decrease is never accepted", "nothing was changed")
	hr = runCLI(t, 60*time.Second, "", append([]string{"admin", "holds", "--brokers", brokers, "--output", "json"}, db...)...)
	if hr.code != 0 || !strings.Contains(hr.stdout, `"kind": "partitions-changed"`) || !strings.Contains(hr.stdout, `"needs_ack": false`) ||
		!strings.Contains(hr.stdout, "fewer than the 5 group "+e.group+" recorded") {
		t.Errorf("admin holds --brokers after a decrease: %s", hr)
	}
	w.stop(30 * time.Second)
}

// A worker refuses bad names and durations before it says it is starting.
func TestCLIWorkerRefusesAtStart(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	for _, c := range []struct {
		extra []string
		want  string
	}{
		{[]string{"--group", "g\xff"}, "not valid UTF-8"},
		{[]string{"--group", "g\x1b[2J"}, "control character"},
		{[]string{"--topic", e.topic + "/x"}, "is not valid"},
		{[]string{"--name", "w\xfe"}, "worker name"},
		{[]string{"--session-timeout", "1ms"}, "--session-timeout 1ms is out of range"},
		{[]string{"--session-timeout", "1000h"}, "--session-timeout"},
	} {
		args := append([]string{"worker", "--brokers", strings.Join(e.brokers, ","), "--group", e.group, "--topic", e.topic,
			"--database-url", e.dbURL, "--schema", e.schema, "--handler", "export"}, c.extra...)
		r := runCLI(t, 30*time.Second, "", args...)
		wantFailure(t, r, 2, c.want)
		if strings.Contains(r.stderr, "worker starting") || r.took > 5*time.Second {
			t.Errorf("%v: refused after %s, stderr %q", c.extra, r.took, r.stderr)
		}
	}
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM "`+e.schema+`".fence_log`).Scan(&n); err == nil && n != 0 {
		t.Errorf("%d fence log rows after refused starts", n)
	}
}

// Help goes to stdout with exit 0; groups of subcommands list themselves.
func TestCLIHelp(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"--help"}, {"admin", "--help"}, {"admin", "topic", "--help"}, {"admin", "dlq", "--help"},
		{"produce", "--help"}, {"broker", "--help"}, {"migrate", "--help"}, {"admin", "topic", "add-partitions", "--help"}} {
		r := runCLI(t, 30*time.Second, "", args...)
		if r.code != 0 || r.stderr != "" || !strings.HasPrefix(r.stdout, "usage: tenure") {
			t.Errorf("%v: %s", args, r)
		}
	}
	r := runCLI(t, 30*time.Second, "", "broker", "--help")
	if first := strings.SplitN(r.stdout, "\n", 2)[0]; !strings.Contains(r.stdout, "--topic T") || !strings.Contains(first, "--topic") {
		t.Errorf("broker --help: %s", r.stdout)
	}
	r = runCLI(t, 30*time.Second, "", "produce", "--help")
	if strings.Contains(r.stdout, "--topic tenure") {
		t.Errorf("produce --help shows a sentence as the argument name:\n%s", r.stdout)
	}
}

// produce's messages name what is wrong, and its table escapes keys.
func TestCLIProduceMessages(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	brokers := strings.Join(e.brokers, ",")
	base := []string{"produce", "--brokers", brokers, "--topic", e.topic}
	wantFailure(t, runCLI(t, 30*time.Second, "", append(base, "--key", "", "--value", "v")...), 2, "--key is empty")
	wantFailure(t, runCLI(t, 30*time.Second, "", append(base, "--value", "v")...), 2, "--value needs --key")
	wantFailure(t, runCLI(t, 30*time.Second, `{"key":"a","key":"b","value":1}`+"\n", append(base, "--input", "-")...), 1, `line 1`, `"key" is given twice`, "nothing was produced")
	if n := e.totalHighWatermark(2); n != 0 {
		t.Fatalf("%d jobs produced by refused commands", n)
	}
	// An empty value is a value.
	r := runCLI(t, 30*time.Second, "", append(base, "--key", "k", "--value", "")...)
	if r.code != 0 || !strings.Contains(r.stdout, "produced 1 job to topic "+e.topic+" (2 partitions)") {
		t.Errorf("--value '': %s", r)
	}
	r = runCLI(t, 30*time.Second, "", append(base, "--key", "red\x1b[31m\nline", "--value", "v")...)
	if r.code != 0 || strings.ContainsAny(r.stdout, "\x1b") || !strings.Contains(r.stdout, `red\x1b[31m\nline`) {
		t.Errorf("a key with escape sequences reached the terminal: %s", r)
	}
}

// A database that answers and refuses is not "unreachable".
func TestCLIDatabaseRefusals(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(testdb.URL())
	if err != nil {
		t.Fatal(err)
	}
	role := *u
	role.User = url.User("tenure_no_such_role")
	nodb := *u
	nodb.Path = "/tenure_no_such_database"
	for _, c := range []struct {
		url  string
		want []string
	}{
		{role.String(), []string{"refused user \"tenure_no_such_role\"", "does not exist"}},
		{nodb.String(), []string{"has no database \"tenure_no_such_database\""}},
	} {
		r := runCLI(t, 30*time.Second, "", "admin", "fences", "--database-url", c.url)
		wantFailure(t, r, 1, c.want...)
		if strings.Contains(r.stderr, "cannot reach") {
			t.Errorf("a refusal reported as unreachable: %s", r.stderr)
		}
	}
}

// A replayed job that its producer had put on a partition of its choosing
// goes where its key hashes; the message says that, not that the count
// changed.
func TestCLIReplayOfExplicitPartition(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	brokers := strings.Join(e.brokers, ",")
	db := []string{"--database-url", e.dbURL, "--schema", e.schema}
	key := "acme"
	other := 1 - partition.For([]byte(key), 2)
	e.produceTo(other, [2]string{key, `{"seq":1,"tenure-fault":"error"}`})
	w := e.startWorker("W", "--inject-faults", "--max-attempts", "1")
	waitCommitted(t, e, other, 1, "")
	dead := deadLetterRows(t, e)
	if len(dead) != 1 {
		t.Fatalf("dead letters: %+v", dead)
	}
	r := runCLI(t, 60*time.Second, "", append([]string{"admin", "dlq", "replay", fmt.Sprint(dead[0].id), "--brokers", brokers}, db...)...)
	if r.code != 0 || !strings.Contains(r.stdout, fmt.Sprintf("it was on partition %d, not the one murmur2 of its key gives for 2 partitions: its original producer chose the partition itself", other)) ||
		strings.Contains(r.stdout, "count changed") {
		t.Errorf("replay: %s", r)
	}
	t.Logf("replay: %s", strings.TrimSpace(r.stdout))
	w.stop(30 * time.Second)
}

// A worker that holds no partition because a stopped member still holds
// them says what it waits for and how long at most; a first signal logs
// the graceful stop. Classic: the worker's session timeout; KIP-848: the
// broker's, read from its configuration.
func TestCLIWorkerSaysWhatItWaitsFor(t *testing.T) {
	for _, proto := range []string{"classic", "consumer"} {
		t.Run(proto, func(t *testing.T) {
			t.Parallel()
			const session = 10 * time.Second // longer than the 3s after which a waiting worker speaks
			e := newEnvWith(t, 1, map[string]string{"group.consumer.session.timeout.ms": "10000"})
			if e.real {
				t.Skip("needs the development broker's session settings")
			}
			e.produce(jobsFor(keys, 0, 5)...)
			a := e.startWorker("A", "--session-timeout", session.String(), "--protocol", proto)
			waitCommitted(t, e, 0, 5, "A")
			ownerA := fenceRow(t, e, 0).owner
			a.pause()
			b := e.startWorker("B", "--session-timeout", session.String(), "--protocol", proto)
			line := b.waitLog(30*time.Second, map[string]any{"msg": "waiting for partitions"})
			want := map[string]string{"classic": "one session timeout: 10s (this worker's --session-timeout",
				"consumer": "one session timeout: 10s (the broker's group.consumer.session.timeout.ms)"}[proto]
			if at := fmt.Sprint(line["at_most"]); !strings.Contains(at, want) {
				t.Errorf("at_most %q should say %q", at, want)
			}
			t.Logf("B: %v", line)
			waitFor(t, 60*time.Second, "B to claim the partition", func() bool {
				f := fenceRow(t, e, 0)
				return f.owner != "" && f.owner != ownerA
			})
			a.resume()
			b.signal(syscall.SIGTERM)
			b.waitLog(30*time.Second, map[string]any{"msg": "stopping gracefully (a second signal stops at once)", "signal": "SIGTERM"})
			select {
			case <-b.done:
			case <-time.After(30 * time.Second):
				t.Errorf("B did not stop")
			}
			a.stop(30 * time.Second)
		})
	}
}

// An interrupted `produce --generate` says so and prints, per partition,
// what was acknowledged: exactly what the topic holds.
func TestCLIProduceInterrupted(t *testing.T) {
	t.Parallel()
	const partitions = 3
	e := newEnv(t, partitions)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, tenureBin, "produce", "--brokers", strings.Join(e.brokers, ","), "--topic", e.topic, "--generate", "50000000")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "some jobs to be acknowledged", func() bool { return e.totalHighWatermark(partitions) > 1000 })
	_ = cmd.Process.Signal(os.Interrupt)
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("exit: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	r := cliResult{stdout: stdout.String(), stderr: stderr.String(), code: 1}
	wantFailure(t, r, 1, "interrupted after", "of 50000000 jobs were acknowledged", "where they are is on stdout")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	m := regexp.MustCompile(`^interrupted by SIGINT: (\d+) of 50000000 jobs were acknowledged by topic `).FindStringSubmatch(lines[0])
	if m == nil || len(lines) != partitions+2 || !strings.HasPrefix(lines[1], "PARTITION ") {
		t.Fatalf("stdout:\n%s", r.stdout)
	}
	acked, _ := strconv.ParseInt(m[1], 10, 64)
	var sum int64
	for p, l := range lines[2:] {
		f := strings.Fields(l)
		jobs, _ := strconv.ParseInt(f[1], 10, 64)
		sum += jobs
		// A gap-free prefix of each partition: offsets 0 to jobs-1.
		if hw := e.highWatermark(int32(p)); hw != jobs || (jobs > 0 && f[3] != fmt.Sprintf("0-%d", jobs-1)) {
			t.Errorf("partition %d: %q, high watermark %d", p, l, hw)
		}
	}
	if sum != acked || acked != e.totalHighWatermark(partitions) {
		t.Errorf("acknowledged %d, table sums to %d, the topic holds %d", acked, sum, e.totalHighWatermark(partitions))
	}
	t.Logf("stdout:\n%sstderr: %s", r.stdout, r.stderr)
}
