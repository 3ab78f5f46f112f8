package cli

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// wantSentence checks an exit status and that stderr is the command's one
// line (then, for usage errors, the usage line) holding every want.
func wantSentence(t *testing.T, what string, code, wantCode int, stderr string, want ...string) {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
	n := 1
	if wantCode == 2 {
		n = 2
	}
	if code != wantCode || len(lines) != n || !strings.HasPrefix(lines[0], "tenure") {
		t.Errorf("%s: exit %d, want %d with %d line(s); stderr:\n%s", what, code, wantCode, n, stderr)
		return
	}
	for _, w := range want {
		if !strings.Contains(lines[0], w) {
			t.Errorf("%s: stderr lacks %q:\n%s", what, w, stderr)
		}
	}
	for _, raw := range []string{"strconv.", "parse error", "invalid argument", "expected at most", "invalid large response size", "BrokerMaxReadBytes"} {
		if strings.Contains(stderr, raw) {
			t.Errorf("%s: stderr carries a library's own words %q:\n%s", what, raw, stderr)
		}
	}
}

// A value a flag cannot take is refused in one sentence that names the
// flag, the value and what the flag takes: never the parser's words.
func TestFlagParseErrors(t *testing.T) {
	db := []string{"--database-url", "postgres://127.0.0.1:1/x"}
	reset := func(more ...string) []string {
		return append(append([]string{"admin", "offsets", "reset", "--brokers", "h:1", "--group", "g", "--topic", "t", "--to-latest"}, db...), more...)
	}
	for _, c := range []struct {
		args []string
		vars map[string]string
		want string
	}{
		{append([]string{"admin", "holds", "acknowledge", "--group", "g", "--topic", "t", "--partition", "abc"}, db...), nil, `--partition "abc" is not a whole number`},
		{append([]string{"admin", "holds", "acknowledge", "--group", "g", "--topic", "t", "--partition=99999999999999999999"}, db...), nil, `--partition "99999999999999999999" is too large a number`},
		{[]string{"admin", "jobs", "peek", "--brokers", "h:1", "--topic", "t", "--count", "ten"}, nil, `--count "ten" is not a whole number`},
		{append([]string{"worker", "--brokers", "h:1", "--group", "g", "--topic", "t", "--handler", "noop", "--session-timeout", "30"}, db...), nil,
			`--session-timeout "30" is not a duration: a number with a unit, such as 500ms, 30s, 2m or 1h30m`},
		{[]string{"admin", "groups", "--brokers", "h:1", "--tls=maybe"}, nil, `--tls "maybe" is not true or false`},
		{append([]string{"worker", "--brokers", "h:1", "--group", "g", "--topic", "t", "--handler", "noop", "--batch-max-bytes", "4MB"}, db...), nil,
			`--batch-max-bytes "4MB" is not a size: a whole number of bytes, or one with KiB, MiB or GiB ("4MiB")`},
		{[]string{"admin", "topic", "create", "--brokers", "h:1", "--topic", "t", "--partitions", "abc"}, nil, `--partitions "abc" is not a partition count: a whole number from 1 to 10000`},
		{reset("--partition", "x"), nil, `--partition "x" is not a partition number: a whole number from 0 to 9999`},
		{reset("--partition", "0,x"), nil, `--partition "0,x": "x" is not a partition number: a whole number from 0 to 9999`},
		{reset("--partition", "1,1"), nil, `--partition "1,1": partition 1 is given twice`},
		// The variables a flag reads, the same way.
		{[]string{"broker"}, map[string]string{"TENURE_PARTITIONS": "abc"}, `TENURE_PARTITIONS="abc" is not a partition count: a whole number from 1 to 10000`},
		{append([]string{"worker", "--brokers", "h:1", "--group", "g", "--topic", "t", "--handler", "noop"}, db...), map[string]string{"TENURE_BATCH_MAX": "x"}, `TENURE_BATCH_MAX="x" is not a whole number`},
		{append([]string{"worker", "--brokers", "h:1", "--group", "g", "--topic", "t", "--handler", "noop"}, db...), map[string]string{"TENURE_SESSION_TIMEOUT": "1"}, `TENURE_SESSION_TIMEOUT="1" is not a duration`},
		// Job references and IDs given as arguments.
		{append([]string{"admin", "job", "--group", "g", "t/x/0"}, db...), nil, `job "t/x/0": the partition "x" is not a whole number from 0 to 9999`},
		{append([]string{"admin", "job", "--group", "g", "t/0/-1"}, db...), nil, `job "t/0/-1": the offset "-1" is not a whole number, 0 or more`},
		{append([]string{"admin", "job", "--group", "g", "t/0"}, db...), nil, `job "t/0" is not TOPIC/PARTITION/OFFSET`},
		{append([]string{"admin", "dlq", "show", "x"}, db...), nil, `dead letter ID "x" is not a positive integer`},
		// The bench's modes that do not go together.
		{[]string{"bench", "--dimension-only", "--latency-only"}, nil, `--dimension-only runs the partition dimension alone: it goes with neither --latency-only nor --partitions-dimension=false`},
		{[]string{"bench", "--dimension-repeat", "0"}, nil, `--dimension-repeat must be at least 1`},
		{[]string{"bench-child", "alo", "--per-poll", "--batch-max", "10"}, nil, `--per-poll writes a whole poll in one COPY, for kind alo only: it takes no --batch-max`},
		{[]string{"bench-child", "naive", "--per-poll"}, nil, `--per-poll writes a whole poll in one COPY, for kind alo only: it takes no --batch-max`},
	} {
		code, stdout, stderr := runInEnv(t, c.vars, c.args...)
		if stdout != "" {
			t.Errorf("%q: stdout %q", c.args, stdout)
		}
		wantSentence(t, strings.Join(c.args, " "), code, 2, stderr, c.want)
	}
}

// Every typed flag of every command, given a value it cannot take, names
// itself and the value.
func TestEveryTypedFlagNamesItsBadValue(t *testing.T) {
	n := 0
	for _, cl := range commandLines() {
		tr := newTree(&env{getenv: func(string) string { return "" }})
		cmd, _, err := tr.root.Find(cl)
		if err != nil {
			t.Fatal(err)
		}
		tr.flags[cmd].fs.VisitAll(func(fl *pflag.Flag) {
			if fl.Value.Type() == "string" || fl.Name == "help" {
				return
			}
			n++
			args := append(append([]string{}, cl...), "--"+fl.Name+"=x7")
			code, _, stderr := runIn(t, args...)
			wantSentence(t, strings.Join(args, " "), code, 2, stderr, `--`+fl.Name+` "x7" is not `)
		})
	}
	if n < 40 {
		t.Errorf("only %d typed flags checked", n)
	}
}
