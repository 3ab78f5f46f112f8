package cli

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/internal/devbroker"
	"github.com/tenure-dev/tenure/sink"
)

// runIn runs the command in-process with no TENURE_* variables, and
// returns its exit status, stdout and stderr.
func runIn(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	return runInEnv(t, nil, args...)
}

func runInEnv(t *testing.T, vars map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	e := &env{stdin: strings.NewReader(""), stdout: &out, stderr: &errb, getenv: func(k string) string { return vars[k] }}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	code := run(ctx, e, args)
	return code, out.String(), errb.String()
}

// startBroker starts a development broker, closed when the test ends.
func startBroker(t *testing.T, cfg devbroker.Config) *kfake.Cluster {
	t.Helper()
	c, err := devbroker.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// wantAndNot reports each of want that has does not find, and each of not
// it finds; what names the output, shown is it as the messages print it.
func wantAndNot(t *testing.T, what, shown string, has func(string) bool, want, not []string) {
	t.Helper()
	for _, w := range want {
		if !has(w) {
			t.Errorf("%s lacks %q: %s", what, w, shown)
		}
	}
	for _, n := range not {
		if has(n) {
			t.Errorf("%s has %q: %s", what, n, shown)
		}
	}
}

// every command line that has flags: the commands and the admin
// subcommands.
func commandLines() [][]string {
	tr := newTree(&env{getenv: func(string) string { return "" }})
	var out [][]string
	walk(tr.root, func(c *cobra.Command) {
		f := tr.flags[c]
		if f == nil || !f.fs.HasFlags() || c.Name() == "version" || c.Name() == "completion" {
			return
		}
		out = append(out, strings.Fields(relPath(c)))
	})
	return out
}

// recorder is a command that records what it was given.
type recorder struct {
	base
	schema, url string
	v           bool
	kafka       kafkaFlags
	args        []string
}

func (r *recorder) define(f *flagSet) {
	f.String(&r.schema, "schema", "", "")
	f.String(&r.url, "database-url", "", "")
	f.Bool(&r.v, "v", false, "")
	r.kafka.define(f, "")
}

func (r *recorder) check(args []string) error {
	r.args = args
	return nil
}

func (r *recorder) run(context.Context) error { return nil }

// runRecorder runs `tenure x args...`, x a recorder taking at most one
// argument, and returns its exit status and stderr.
func runRecorder(r *recorder, args ...string) (int, string) {
	var errb bytes.Buffer
	e := &env{stdout: io.Discard, stderr: &errb, getenv: func(string) string { return "" }, secrets: &secrets{}}
	tr := newTree(e)
	tr.root.AddCommand(tr.leaf(spec{name: "x", maxArgs: 1}, r))
	tr.root.SetArgs(oneDashFlags(tr.root, append([]string{"x"}, args...)))
	c, err := tr.root.ExecuteC()
	return tr.exit(c, err), errb.String()
}

var flagLine = regexp.MustCompile(`^  --([a-z0-9-]+)(?: (.*))?$`)

// --help goes to stdout with exit 0; its usage names every flag the command
// has, and every flag shows a readable argument name.
func TestHelpListsEveryFlag(t *testing.T) {
	for _, cl := range commandLines() {
		name := strings.Join(cl, " ")
		t.Run(name, func(t *testing.T) {
			code, stdout, stderr := runIn(t, append(cl, "--help")...)
			if code != 0 || stderr != "" || !strings.HasPrefix(stdout, "usage: tenure "+name+" ") {
				t.Fatalf("--help: exit %d, stdout %q, stderr %q", code, stdout, stderr)
			}
			usage, flags, ok := strings.Cut(stdout, "\nflags (environment variable in brackets):\n")
			if !ok {
				t.Fatalf("no flag list:\n%s", stdout)
			}
			n := 0
			for _, line := range strings.Split(flags, "\n") {
				m := flagLine.FindStringSubmatch(line)
				if m == nil {
					continue
				}
				n++
				if !regexp.MustCompile(`--` + regexp.QuoteMeta(m[1]) + `\b`).MatchString(usage) {
					t.Errorf("the usage does not list --%s:\n%s", m[1], usage)
				}
				if strings.Contains(m[2], " ") || strings.Contains(m[2], "`") {
					t.Errorf("--%s shows the argument name %q", m[1], m[2])
				}
			}
			if n == 0 {
				t.Errorf("no flags listed:\n%s", stdout)
			}
		})
	}
}

func TestHelpForGroupsOfCommands(t *testing.T) {
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"--help"}, []string{"usage: tenure <command>", "worker", "produce"}},
		{[]string{"help"}, []string{"usage: tenure <command>"}},
		{[]string{"help", "produce"}, []string{"usage: tenure produce"}},
		{[]string{"admin", "--help"}, []string{"usage: tenure admin <subcommand>", "topic add-partitions", "dlq replay"}},
		{[]string{"admin", "topic", "--help"}, []string{"usage: tenure admin topic <subcommand>", "topic create", "topic add-partitions", "topic acknowledge-partitions"}},
		{[]string{"admin", "dlq", "-h"}, []string{"usage: tenure admin dlq <subcommand>", "dlq list", "dlq discard"}},
	} {
		code, stdout, stderr := runIn(t, c.args...)
		if code != 0 || stderr != "" {
			t.Errorf("%v: exit %d, stderr %q", c.args, code, stderr)
		}
		wantAndNot(t, fmt.Sprintf("%v: stdout", c.args), "\n"+stdout, func(s string) bool { return strings.Contains(stdout, s) }, c.want, nil)
		if len(c.args) == 3 && c.args[1] == "topic" && strings.Contains(stdout, "dlq") {
			t.Errorf("admin topic --help lists the dlq subcommands:\n%s", stdout)
		}
	}
	// Without a subcommand: the same list on stderr, exit 2.
	code, stdout, stderr := runIn(t, "admin", "topic")
	if code != 2 || stdout != "" || !strings.Contains(stderr, "topic create") || !strings.Contains(stderr, "needs a subcommand") {
		t.Errorf("admin topic: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	code, _, stderr = runIn(t)
	if code != 2 || !strings.Contains(stderr, "usage: tenure") {
		t.Errorf("no command: exit %d, stderr %q", code, stderr)
	}
}

// Flags may follow the positional arguments: `migrate up --schema s` is
// `migrate --schema s up`.
func TestFlagsAfterPositionals(t *testing.T) {
	for _, args := range [][]string{
		{"up", "--schema", "s1", "--database-url", "postgres://x"},
		{"--schema", "s1", "up", "--database-url", "postgres://x"},
		{"--database-url", "postgres://x", "--schema", "s1", "up"},
		{"-database-url", "postgres://x", "-schema=s1", "up"},
	} {
		r := &recorder{}
		if code, stderr := runRecorder(r, args...); code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, stderr)
		}
		if r.schema != "s1" || r.url != "postgres://x" || len(r.args) != 1 || r.args[0] != "up" {
			t.Errorf("%v: schema %q url %q positional %v", args, r.schema, r.url, r.args)
		}
	}
	if code, stderr := runRecorder(&recorder{}, "up", "down"); code != 2 || !strings.Contains(stderr, `unexpected argument "down"`) {
		t.Errorf("two positionals where one is allowed: exit %d, %q", code, stderr)
	}
	r := &recorder{}
	if code, stderr := runRecorder(r, "--", "-v"); code != 0 || len(r.args) != 1 || r.args[0] != "-v" || r.v {
		t.Errorf("after --, -v is an argument: exit %d, %q, %v", code, stderr, r.args)
	}
}

// Bad input refused before anything happens: exit 2 and one line saying
// what is wrong (then the line pointing at --help).
func TestRefusedAtTheDoor(t *testing.T) {
	db := []string{"--database-url", "postgres://127.0.0.1:1/x"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"admin", "topic", "create", "--brokers", "h:1", "--topic", "t", "--partitions", "2147483647"}, `--partitions "2147483647" is not a partition count: a whole number from 1 to 10000`},
		{[]string{"admin", "topic", "create", "--brokers", "h:1", "--topic", "t", "--partitions", "4294967297"}, "from 1 to 10000"},
		{[]string{"admin", "topic", "create", "--brokers", "h:1", "--topic", "t", "--partitions", "0"}, "from 1 to 10000"},
		{[]string{"admin", "topic", "create", "--brokers", "h:1", "--topic", "t"}, "--partitions is required"},
		{[]string{"admin", "topic", "add-partitions", "--brokers", "h:1", "--topic", "t", "--partitions", "99999"}, "from 1 to 10000"},
		{append([]string{"admin", "topic", "acknowledge-partitions", "--brokers", "h:1", "--group", "g", "--topic", "t", "--partitions", "4294967298"}, db...), "from 1 to 10000"},
		{append([]string{"admin", "topic", "acknowledge-partitions", "--group", "g", "--topic", "t", "--partitions", "2"}, db...), "--brokers is required"},
		{[]string{"broker", "--partitions", "4294967297"}, "from 1 to 10000"},
		{[]string{"broker", "--broker-config", "offsets.retention.check.interval.ms"}, `--broker-config "offsets.retention.check.interval.ms": want KEY=VALUE`},
		{[]string{"admin", "topic", "create", "--brokers", "h:1", "--topic", "a b", "--partitions", "1"}, `--topic: topic name "a b" is not valid`},
		{[]string{"admin", "topic", "create", "--brokers", "h:1", "--topic", "..", "--partitions", "1"}, `"." or ".."`},
		{[]string{"admin", "topic", "create", "--brokers", "h:1", "--topic", strings.Repeat("t", 250), "--partitions", "1"}, "at most 249"},
		{append([]string{"worker", "--brokers", "h:1", "--group", "g\xff", "--topic", "t", "--handler", "noop"}, db...), "not valid UTF-8"},
		{append([]string{"worker", "--brokers", "h:1", "--group", "g", "--topic", "t,bad\x1b", "--handler", "noop"}, db...), `'\x1b'`},
		{append([]string{"worker", "--brokers", "h:1", "--group", "g", "--topic", "t", "--handler", "noop", "--name", "w\n1"}, db...), "--name: worker name"},
		{append([]string{"worker", "--brokers", "h:1", "--group", "g", "--topic", "t", "--handler", "noop", "--session-timeout", "1ms"}, db...), "--session-timeout 1ms is out of range"},
		{append([]string{"worker", "--brokers", "h:1", "--group", "g", "--topic", "t", "--handler", "noop", "--rebalance-timeout", "1000h"}, db...), "--rebalance-timeout"},
		{append([]string{"worker", "--brokers", "h:1", "--group", "g", "--topic", "t", "--handler", "noop", "--handler-timeout", "1000h"}, db...), "--handler-timeout"},
		// Postgres would end the session of a job still within its time.
		{append([]string{"worker", "--brokers", "h:1", "--group", "g", "--topic", "t", "--handler", "noop", "--idle-in-tx-timeout", "30s"}, db...),
			"--idle-in-tx-timeout 30s must be longer than --handler-timeout 1m0s"},
		{append([]string{"worker", "--brokers", "h:1", "--group", "g", "--topic", "t", "--handler", "noop", "--handler-timeout", "5s", "--idle-in-tx-timeout", "5s"}, db...),
			"(leave it unset to derive it: 6.25s)"},
		{append([]string{"admin", "assignments", "--brokers", "h:1", "--group", "g\x00"}, db...), "control character"},
		{append([]string{"admin", "fences", "--group", "g\xfe"}, db...), "not valid UTF-8"},
		{append([]string{"admin", "fences", "prune", "--max-age", "-1s", "--max-entries", "-1"}, db...), "nothing to prune"},
		{append([]string{"admin", "dlq", "list", "--topic", "no/slash"}, db...), `'/'`},
		{[]string{"produce", "--brokers", "h:1", "--topic", "t", "--key", "", "--value", "v"}, "--key is empty"},
		{[]string{"produce", "--brokers", "h:1", "--topic", "t", "--value", "v"}, "--value needs --key"},
		{[]string{"produce", "--brokers", "h:1", "--topic", "t", "--key", "k"}, "--key needs --value"},
		{[]string{"produce", "--brokers", "h:1", "--topic", "t", "--key-count", "3", "--key", "k", "--value", "v"}, "--key-count goes with --generate"},
		{[]string{"produce", "--brokers", "h:1", "--topic", "t", "--generate", "0"}, "--generate must be at least 1"},
		{[]string{"produce", "--brokers", "h:1", "--topic", "t", "--generate", "3", "--max-bytes", "4294967297"}, "--max-bytes must be from 1 to"},
		{[]string{"produce", "--brokers", "h:1", "--topic", "jobs:1", "--key", "k", "--value", "v"}, `':'`},
		{append([]string{"migrate", "down", "--grant-roles"}, db...), "--grant-roles goes with up"},
		{[]string{"migrate", "--print-roles", "--grant-roles"}, "--print-roles prints the SQL that --grant-roles runs"},
		{append([]string{"migrate", "--grant-roles", "--worker-role", "pg_x"}, db...), "--worker-role: a role name"},
		{append([]string{"migrate", "--grant-roles", "--worker-role", "r", "--admin-role", "r"}, db...), "must differ"},
	} {
		code, stdout, stderr := runIn(t, c.args...)
		if code != 2 || stdout != "" || !strings.Contains(stderr, c.want) {
			t.Errorf("%q: exit %d, stdout %q, stderr:\n%s\nwant exit 2 and %q", c.args, code, stdout, stderr, c.want)
			continue
		}
		// The reason is one line; nothing else but usage text around it.
		said := 0
		for _, l := range strings.Split(stderr, "\n") {
			if strings.HasPrefix(l, "tenure ") {
				said++
			}
			if strings.ContainsAny(l, "\x1b\x00\xff\xfe") {
				t.Errorf("%q: stderr carries a control or invalid byte: %q", c.args, l)
			}
		}
		if said != 1 {
			t.Errorf("%q: want one line saying what is wrong:\n%s", c.args, stderr)
		}
	}
	// The environment goes through the same parser.
	code, _, stderr := runInEnv(t, map[string]string{"TENURE_PARTITIONS": "4294967297"}, "broker")
	if code != 2 || !strings.Contains(stderr, "TENURE_PARTITIONS") {
		t.Errorf("TENURE_PARTITIONS=4294967297: exit %d, %q", code, stderr)
	}
}

func TestParseJobLine(t *testing.T) {
	for _, c := range []struct{ line, key, value string }{
		{`{"key":"a","value":{"n": 1}}`, "a", `{"n":1}`},
		{`{"value":"plain","key":"b"}`, "b", "plain"},
		{`{"key":"c","value":""}`, "c", ""},
		{`{"key":"d","value":null}`, "d", "null"},
	} {
		j, err := parseJobLine([]byte(c.line), 100)
		if err != nil || string(j.key) != c.key || string(j.value) != c.value {
			t.Errorf("%s: key %q value %q, %v", c.line, j.key, j.value, err)
		}
	}
	for line, want := range map[string]string{
		`{"key":"a","key":"b","value":1}`:  `"key" is given twice`,
		`{"key":"a","value":1,"value":2}`:  `"value" is given twice`,
		`{"Key":"a","value":1}`:            `unknown field "Key"`,
		`{"key":"a"}`:                      `no "value"`,
		`{"value":1}`:                      `no "key"`,
		`{"key":null,"value":1}`:           `no "key"`,
		`{"key":"","value":1}`:             "no key",
		`{"key":1,"value":1}`:              "must be a JSON string",
		`{"key":"a","value":1} {}`:         "unexpected data after",
		`[1,2]`:                            "the line is a JSON array",
		`"x"`:                              "the line is a JSON string",
		`{"key":"a","value":`:              "not a JSON object",
		"{\"key\":\"\xff\",\"value\":1}":   "not valid UTF-8 (byte 9 is 0xff)",
		`{"key":"a","value":1,}`:           "not a JSON object",
		`{"key":"a","value":"` + "\xff\"}": "not valid UTF-8",
	} {
		_, err := parseJobLine([]byte(line), 100)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", line, err, want)
		}
	}
}

func TestWaitReason(t *testing.T) {
	row := func(p int32, member string, state consumer.State) consumer.Assignment {
		return consumer.Assignment{Topic: "jobs", Partition: p, MemberID: member, State: state}
	}
	for _, c := range []struct {
		name     string
		rows     []consumer.Assignment
		protocol string
		session  time.Duration
		why      string
		atMost   string
	}{
		{"classic rebalance", []consumer.Assignment{row(0, "", consumer.StateRebalancing)}, "classic", 45 * time.Second,
			"the group is rebalancing", "one session timeout: 45s (this worker's --session-timeout"},
		{"a member holds both", []consumer.Assignment{row(0, "A", consumer.StateOK), row(1, "A", consumer.StateOK)}, "consumer", 3 * time.Second,
			"must give some up to this worker first (2 of 2 partitions are held by 1 other member)", "one session timeout: 3s (the broker's group.consumer.session.timeout.ms)"},
		{"more members than partitions", []consumer.Assignment{row(0, "A", consumer.StateOK), row(1, "B", consumer.StateOK)}, "classic", time.Minute,
			"the other members hold every partition", "1m0s"},
		{"unknown broker setting", []consumer.Assignment{row(0, "A", consumer.StateOK), row(1, "A", consumer.StateOK)}, "consumer", 0,
			"must give some up", "the broker's group.consumer.session.timeout.ms"},
	} {
		why, atMost, _ := waitReason(c.rows, "ME", c.protocol, c.session)
		if !strings.Contains(why, c.why) || !strings.Contains(atMost, c.atMost) {
			t.Errorf("%s: why %q at most %q; want %q and %q", c.name, why, atMost, c.why, c.atMost)
		}
	}
	// Assigned already (claiming), or nothing known: nothing to say.
	if why, _, _ := waitReason([]consumer.Assignment{row(0, "ME", consumer.StateClaimPending)}, "ME", "classic", time.Second); why != "" {
		t.Errorf("assigned to this worker: %q", why)
	}
	if why, _, _ := waitReason(nil, "ME", "classic", time.Second); why != "" {
		t.Errorf("no rows: %q", why)
	}
}

func TestWhyMoved(t *testing.T) {
	d := func(key []byte, p int32) sink.DeadLetter {
		return sink.DeadLetter{Partition: sink.Partition{Group: "g", Topic: "jobs", Partition: p}, Key: key}
	}
	// "acme" hashes to partition 0 of 2 and partition 3 of 4 (murmur2).
	for _, c := range []struct {
		name              string
		dl                sink.DeadLetter
		count, recorded   int32
		want, wantNotSaid string
	}{
		{"keyless", d(nil, 1), 3, 3, "the job has no key", "partition count"},
		{"count changed", d([]byte("acme"), 0), 4, 2, "the topic has 4 partitions now, 2 when the group recorded it", "producer"},
		{"explicit partition", d([]byte("acme"), 1), 2, 2, "its original producer chose the partition itself", "changed"},
		{"explicit partition, count unknown", d([]byte("acme"), 1), 2, 0, "its original producer chose the partition itself", "changed"},
	} {
		got := whyMoved(c.dl, c.count, c.recorded)
		if !strings.Contains(got, c.want) || strings.Contains(got, c.wantNotSaid) {
			t.Errorf("%s: %q", c.name, got)
		}
	}
}

// A KIP-848 group's session timeout is a broker setting: the waiting log
// reads it from the broker's configuration.
func TestBrokerSessionTimeout(t *testing.T) {
	c := startBroker(t, devbroker.Config{ConsumerSessionTimeout: 7 * time.Second, ConsumerHeartbeat: time.Second})
	cl, err := kafkaClient(c.ListenAddrs())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if got := brokerSessionTimeout(ctx, cl); got != 7*time.Second {
		t.Errorf("brokerSessionTimeout = %s, want 7s", got)
	}
}
