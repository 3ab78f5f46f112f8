package cli

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tenure-dev/tenure/internal/devbroker"
	"github.com/tenure-dev/tenure/internal/testinfra/testdb"
)

// namesFixture is a schema that knows groups readme-workers (topic
// readme-jobs) and billing (topic invoices), and a broker that has both
// topics and a group kafka-only, which has committed offsets and no rows.
type namesFixture struct {
	db, brokers []string
	url, schema string
	brokerList  string
}

func newNamesFixture(t *testing.T) namesFixture {
	t.Helper()
	pool := testdb.Pool(t)
	schema := testdb.Schema(t, pool)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := pool.Exec(ctx, `INSERT INTO "`+schema+`".fences (consumer_group, topic, partition, incarnation, epoch, owner, next_offset, partition_count)
		VALUES ('readme-workers', 'readme-jobs', 0, 0, 1, 'm', 0, 1), ('billing', 'invoices', 0, 0, 1, 'm', 0, 1)`); err != nil {
		t.Fatal(err)
	}
	br := startBroker(t, devbroker.Config{Partitions: 1, Topics: []string{"readme-jobs", "invoices"}})
	cl, err := kgo.NewClient(kgo.SeedBrokers(br.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var offs kadm.Offsets
	offs.Add(kadm.Offset{Topic: "readme-jobs", Partition: 0, At: 0, LeaderEpoch: -1})
	if err := kadm.NewClient(cl).CommitAllOffsets(ctx, "kafka-only", offs); err != nil {
		t.Fatal(err)
	}
	list := strings.Join(br.ListenAddrs(), ",")
	return namesFixture{db: []string{"--database-url", testdb.URL(), "--schema", schema}, brokers: []string{"--brokers", list},
		url: testdb.URL(), schema: schema, brokerList: list}
}

// Every admin command whose --group or --topic names rows of the database
// refuses a name the schema has never seen (and the brokers, when given,
// do not know): one sentence naming the ones it has, closest first, exit 1.
// A name the schema knows, or the brokers do, gets the command's own
// answer. Every command that takes --group or --topic is either here or
// in namesNotChecked, with the reason.
func TestUnknownNamesRefused(t *testing.T) {
	f := newNamesFixture(t)
	s := f.schema
	dbGroups := `no group "readme-wrokers" in schema ` + s + `; groups it has: readme-workers, billing`
	brGroups := `no group "readme-wrokers" in schema ` + s + ` nor on the brokers; groups the schema has: readme-workers, billing`
	typo := []string{"--group", "readme-wrokers"}
	cases := []struct {
		args []string
		code int
		want string // the whole of stderr (exit 1), or a part of it (exit 0)
	}{
		{cat([]string{"admin", "holds"}, typo, f.db), 1, "tenure admin holds: " + dbGroups},
		{cat([]string{"admin", "holds"}, typo, f.db, f.brokers), 1, "tenure admin holds: " + brGroups},
		{cat([]string{"admin", "fences"}, typo, f.db), 1, "tenure admin fences: " + dbGroups},
		{cat([]string{"admin", "fences", "prune", "--max-entries", "5"}, typo, f.db), 1, "tenure admin fences prune: " + dbGroups},
		{cat([]string{"admin", "dlq", "list"}, typo, f.db), 1, "tenure admin dlq list: " + dbGroups},
		{cat([]string{"admin", "dlq", "list", "--topic", "readme-jbos"}, f.db), 1,
			`tenure admin dlq list: no topic "readme-jbos" in schema ` + s + `; topics it has: readme-jobs, invoices`},
		{cat([]string{"admin", "dlq", "list", "--group", "billing", "--topic", "readme-jobs"}, f.db), 1,
			`tenure admin dlq list: no topic "readme-jobs" for group "billing" in schema ` + s + `; its topics there: invoices`},
		{cat([]string{"admin", "exports", "list"}, typo, f.db), 1, "tenure admin exports list: " + dbGroups},
		{cat([]string{"admin", "job", "readme-jobs/0/5"}, typo, f.db), 1, "tenure admin job: " + dbGroups},
		{cat([]string{"admin", "job", "readme-jbos/0/5", "--group", "readme-workers"}, f.db), 1,
			`tenure admin job: no topic "readme-jbos" for group "readme-workers" in schema ` + s + `; its topics there: readme-jobs`},
		{cat([]string{"admin", "holds", "acknowledge", "--topic", "readme-jobs", "--partition", "0"}, typo, f.db), 1, "tenure admin holds acknowledge: " + dbGroups},
		{cat([]string{"admin", "holds", "acknowledge", "--group", "readme-workers", "--topic", "readme-jbos", "--partition", "0"}, f.db), 1,
			`tenure admin holds acknowledge: no topic "readme-jbos" for group "readme-workers" in schema ` + s + `; its topics there: readme-jobs`},
		{cat([]string{"admin", "assignments"}, typo, f.db, f.brokers), 1, "tenure admin assignments: " + brGroups},
		{cat([]string{"admin", "offsets", "reset", "--topic", "readme-jobs", "--partition", "0", "--to-earliest"}, typo, f.db, f.brokers), 1,
			"tenure admin offsets reset: " + brGroups + "; nothing was changed (a group's first claim of a partition starts at the offset the group committed in Kafka, " +
				"else at the log's start: to choose where a new group starts, commit that offset for it before any worker runs, e.g. with kafka-consumer-groups --reset-offsets)"},
		{cat([]string{"admin", "offsets", "reset", "--group", "readme-workers", "--topic", "readme-jbos", "--partition", "0", "--to-earliest"}, f.db, f.brokers), 1,
			`tenure admin offsets reset: no topic "readme-jbos" for group "readme-workers" in schema ` + s + ` nor on the brokers; its topics there: readme-jobs`},
		{cat([]string{"admin", "topic", "acknowledge-partitions", "--topic", "readme-jobs"}, typo, f.db, f.brokers), 1, "tenure admin topic acknowledge-partitions: " + brGroups},
		{cat([]string{"admin", "group", "delete"}, typo, f.db, f.brokers), 1, "tenure admin group delete: " + brGroups},

		// Names the schema knows, and a group only the brokers know: the
		// commands' own answers.
		{cat([]string{"admin", "holds", "--group", "readme-workers"}, f.db), 0, "no held partitions in schema " + s},
		{cat([]string{"admin", "holds", "--group", "kafka-only"}, f.db, f.brokers), 0, "no held partitions in schema " + s},
		{cat([]string{"admin", "dlq", "list", "--group", "billing", "--topic", "invoices"}, f.db), 0, "no dead letters with status dead of group billing on topic invoices"},
		{cat([]string{"admin", "job", "readme-jobs/0/0", "--group", "kafka-only"}, f.db, f.brokers), 0, ""},
		{cat([]string{"admin", "offsets", "reset", "--group", "kafka-only", "--topic", "readme-jobs", "--partition", "0", "--to-earliest"}, f.db, f.brokers), 1,
			"partition 0 of topic readme-jobs has no fencing row for group kafka-only"},
	}
	covered := map[string]bool{}
	tr := newTree(&env{getenv: func(string) string { return "" }})
	for _, c := range cases {
		code, stdout, stderr := runIn(t, c.args...)
		if code != c.code {
			t.Errorf("%q: exit %d, want %d\nstdout %q\nstderr %q", c.args, code, c.code, stdout, stderr)
			continue
		}
		if c.code == 1 && strings.HasPrefix(c.want, "tenure ") {
			if stderr != c.want+"\n" || stdout != "" {
				t.Errorf("%q: stdout %q, stderr\n%q, want\n%q", c.args, stdout, stderr, c.want)
			}
		} else if !strings.Contains(stderr, c.want) {
			t.Errorf("%q: stderr %q, want %q in it", c.args, stderr, c.want)
		}
		if cmd, _, err := tr.root.Find(c.args); err == nil {
			covered[cmd.CommandPath()] = true
		}
	}

	// The ownership page is started beside the workers: a group it does
	// not know yet is a warning, and the page is served.
	var out, errb bytes.Buffer
	e := &env{stdin: strings.NewReader(""), stdout: &out, stderr: &errb, getenv: func(string) string { return "" }}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	code := run(ctx, e, cat([]string{"admin", "serve", "--http-addr", "127.0.0.1:0"}, typo, f.db, f.brokers))
	cancel()
	if !strings.HasPrefix(errb.String(), "tenure: warning: "+brGroups+"; serving the page all the same: it shows the group once its workers have run\n") || !strings.Contains(out.String(), "serving the ownership page") {
		t.Errorf("admin serve with a group it does not know: exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
	}
	covered["tenure admin serve"] = true

	walk(tr.root, func(c *cobra.Command) {
		if c.Flags().Lookup("group") == nil && c.Flags().Lookup("topic") == nil {
			return
		}
		p := c.CommandPath()
		_, exempt := namesNotChecked[p]
		switch {
		case exempt && covered[p]:
			t.Errorf("%s is in namesNotChecked and checks its names", p)
		case !exempt && !covered[p]:
			t.Errorf("%s takes --group or --topic: test its refusal of a name the database has never seen, or say in namesNotChecked why it has none", p)
		}
	})
}

// A refusal lists the known names closest to the given one first, at most
// maxNamesShown of them.
func TestUnknownNameSentence(t *testing.T) {
	if got := closest("readme-wrokers", []string{"billing", "readme", "readme-workers", "README-WORKERS-2"}); !slices.Equal(got, []string{"readme-workers", "README-WORKERS-2", "readme", "billing"}) {
		t.Errorf("closest: %q", got)
	}
	var many []string
	for _, c := range "abcdefghijkl" {
		many = append(many, "g"+string(c))
	}
	got := unknownName("group", "gz", "", "tenure", false, many)
	if want := `no group "gz" in schema tenure; groups it has: ga, gb, gc, gd, ge, gf, gg, gh, gi, gj and 2 more`; got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
	for _, c := range []struct {
		group string
		want  string
	}{
		{"", `no topic "t" in schema s, which has none yet`},
		{"g", `no topic "t" for group "g" in schema s, where the group has none yet`},
	} {
		if got := unknownName("topic", "t", c.group, "s", false, nil); got != c.want {
			t.Errorf("got %q, want %q", got, c.want)
		}
	}
	if got, want := unknownName("group", "g", "", "s", true, nil), `no group "g" in schema s, which has none yet, nor on the brokers`; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := unknownName("group", "a\x01b", "", "s", false, []string{"ab"}); got != `no group "a\x01b" in schema s; groups it has: ab` {
		t.Errorf("a control character: %q", got)
	}
}

// A mistyped flag gets the flags it may have meant, as a mistyped command
// does; a hidden flag is never suggested.
func TestFlagSuggestions(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string // stderr's first line
	}{
		{[]string{"admin", "holds", "--gruop", "g"}, `tenure admin holds: flag provided but not defined: --gruop; did you mean --group?`},
		{[]string{"admin", "dlq", "list", "--grop=g"}, `tenure admin dlq list: flag provided but not defined: --grop; did you mean --group?`},
		{[]string{"worker", "--bathc-max", "3"}, `tenure worker: flag provided but not defined: --bathc-max; did you mean --batch-max?`},
		{[]string{"admin", "fences", "--database", "postgres://x"}, `tenure admin fences: flag provided but not defined: --database; did you mean --database-url?`},
		{[]string{"admin", "offsets", "reset", "--exectue"}, `tenure admin offsets reset: flag provided but not defined: --exectue; did you mean --execute?`},
		{[]string{"produce", "--bogus"}, `tenure produce: flag provided but not defined: --bogus`},
		// --hold-once is hidden (tests only).
		{[]string{"worker", "--hold-onc"}, `tenure worker: flag provided but not defined: --hold-onc`},
	} {
		code, stdout, stderr := runIn(t, c.args...)
		lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
		if code != 2 || stdout != "" || len(lines) != 2 || lines[0] != c.want || !strings.HasPrefix(lines[1], "usage: ") {
			t.Errorf("%q: exit %d, stdout %q, stderr\n%s\nwant first line\n%s", c.args, code, stdout, stderr, c.want)
		}
	}
}

// --group and --topic complete with the names the database (--database-url
// or TENURE_DATABASE_URL, and --schema) and the brokers (--brokers) know,
// through cobra's hidden __complete command; nothing, quickly, when neither
// answers.
func TestNameCompletion(t *testing.T) {
	f := newNamesFixture(t)
	const noFiles = ":4" // cobra.ShellCompDirectiveNoFileComp
	for _, c := range []struct {
		vars      map[string]string
		args      []string
		want, not []string
	}{
		{nil, cat([]string{"admin", "holds"}, f.db, []string{"--group", ""}), []string{"billing", "readme-workers"}, []string{"kafka-only"}},
		{nil, cat([]string{"admin", "holds"}, f.db, []string{"--group", "read"}), []string{"readme-workers"}, []string{"billing"}},
		{map[string]string{"TENURE_DATABASE_URL": f.url, "TENURE_SCHEMA": f.schema}, []string{"admin", "fences", "--group", ""},
			[]string{"billing", "readme-workers"}, nil},
		{nil, cat([]string{"admin", "dlq", "list"}, f.db, []string{"--topic", ""}), []string{"invoices", "readme-jobs"}, nil},
		{nil, cat([]string{"admin", "dlq", "list", "--group", "billing"}, f.db, []string{"--topic", ""}), []string{"invoices"}, []string{"readme-jobs"}},
		{nil, cat([]string{"admin", "assignments"}, f.db, f.brokers, []string{"--group", ""}), []string{"billing", "kafka-only", "readme-workers"}, nil},
		{nil, cat([]string{"worker"}, f.brokers, []string{"--topic", ""}), []string{"invoices", "readme-jobs"}, nil},
		{nil, cat([]string{"worker"}, f.brokers, []string{"--group", "k"}), []string{"kafka-only"}, []string{"billing"}},
		// Neither flag given, or a database that does not answer: nothing.
		{nil, []string{"admin", "holds", "--group", ""}, nil, []string{"billing"}},
		{nil, []string{"admin", "holds", "--database-url", "postgres://postgres@127.0.0.1:1/x", "--group", ""}, nil, []string{"billing"}},
		// A topic to create completes with nothing.
		{nil, cat([]string{"admin", "topic", "create"}, f.brokers, []string{"--topic", ""}), nil, []string{"invoices"}},
	} {
		start := time.Now()
		code, stdout, stderr := runInEnv(t, c.vars, append([]string{cobra.ShellCompRequestCmd}, c.args...)...)
		lines := strings.Split(strings.TrimSpace(stdout), "\n")
		if code != 0 || !slices.Contains(lines, noFiles) || time.Since(start) > completionTimeout+time.Second {
			t.Errorf("__complete %q: exit %d after %s, stdout %q, stderr %q", c.args, code, time.Since(start), stdout, stderr)
			continue
		}
		wantAndNot(t, fmt.Sprintf("__complete %q", c.args), fmt.Sprintf("%q", lines), func(s string) bool { return slices.Contains(lines, s) }, c.want, c.not)
	}
}

func cat(parts ...[]string) []string { return slices.Concat(parts...) }
