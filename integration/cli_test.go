package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tenure-dev/tenure/internal/testdb"
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
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, tenureBin, args...)
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "TENURE_") && !strings.HasPrefix(kv, "TENURE_TEST_") {
			continue
		}
		cmd.Env = append(cmd.Env, kv)
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
var assignmentFields = []string{"client_id", "epoch", "fence_epoch", "fence_owner", "high_watermark", "host",
	"lag", "member_id", "next_offset", "partition", "state", "topic"}

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
	for _, proto := range []string{"classic", "consumer"} {
		t.Run(proto, func(t *testing.T) {
			t.Parallel()
			testCLIProduceAndAssignments(t, proto)
		})
	}
}

func testCLIProduceAndAssignments(t *testing.T, proto string) {
	const partitions = 3
	e := newEnv(t, partitions)
	if proto == "consumer" && e.real {
		t.Skip("KIP-848 session timeouts are broker settings; this test needs kfake's short ones")
	}
	brokers := strings.Join(e.brokers, ",")

	r := runCLI(t, 60*time.Second, "", "produce", "--brokers", brokers, "--topic", e.topic, "--generate", "300", "--key-count", "12")
	if r.code != 0 || !strings.Contains(r.stdout, "produced 300 jobs") {
		t.Fatalf("produce --generate: %s", r)
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

	a := e.startWorker("A", "--protocol", proto)
	b := e.startWorker("B", "--protocol", proto)
	waitForMembers(t, e, 2)

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

	// The table form: a header and one row per partition, state last.
	r = runCLI(t, 60*time.Second, "", "admin", "assignments", "--brokers", brokers, "--group", e.group,
		"--database-url", e.dbURL, "--schema", e.schema, "--topic", e.topic)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != 0 || len(lines) != partitions+1 || !strings.HasPrefix(lines[0], "TOPIC") {
		t.Fatalf("admin assignments (table): %s", r)
	}
	for _, l := range lines[1:] {
		if !strings.HasSuffix(l, " ok") {
			t.Errorf("table row not ok: %q", l)
		}
	}
	t.Logf("admin assignments:\n%s", r.stdout)

	r = runCLI(t, 60*time.Second, "", "admin", "fences", "--database-url", e.dbURL, "--schema", e.schema,
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

	r = runCLI(t, 60*time.Second, "", "admin", "groups", "--brokers", brokers, "--output", "json")
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

	r = runCLI(t, 60*time.Second, "", "admin", "topic", "describe", "--brokers", brokers, "--topic", e.topic)
	if r.code != 0 || !strings.Contains(r.stdout, fmt.Sprintf("topic %s: %d partitions", e.topic, partitions)) {
		t.Fatalf("admin topic describe: %s", r)
	}

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

// closedPort returns a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
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
	closed, silent := closedPort(t), silentBroker(t)
	closedDB := "postgres://postgres@" + closedPort(t) + "/postgres?sslmode=disable&connect_timeout=5"
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
		{"fences, bad database URL", []string{"admin", "fences", "--database-url", "postgres://%zz"}, []string{"database URL is not valid"}},
		{"fences, schema without tables", []string{"admin", "fences", "--database-url", goodDB, "--schema", "tenure_never_migrated"}, []string{"tenure migrate up"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := runCLI(t, bound, "", c.args...)
			wantFailure(t, r, 1, c.want...)
			t.Logf("%s: %s", r.took.Round(time.Millisecond), strings.TrimSpace(r.stderr))
		})
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
	for _, proto := range []string{"classic", "consumer"} {
		t.Run(proto, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 2)
			if proto == "consumer" && e.real {
				t.Skip("KIP-848 session timeouts are broker settings; this test needs kfake's short ones")
			}
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
}

// The owner in Postgres was evicted (paused past its session timeout); the
// coordinator gave its partition to B, which has not claimed yet:
// stale-owner. Once B claims: ok, with B as the fence owner.
func TestCLIAssignmentsStaleOwner(t *testing.T) {
	for _, proto := range []string{"classic", "consumer"} {
		t.Run(proto, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			if proto == "consumer" && e.real {
				t.Skip("KIP-848 session timeouts are broker settings; this test needs kfake's short ones")
			}
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
}
