package cli

import (
	"fmt"
	"os"
	"regexp"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// `tenure version` and `tenure --version` say the module version and,
// when the build recorded them, the commit, its time and whether the tree
// had changes.
func TestVersion(t *testing.T) {
	code, out, errs := runIn(t, "version")
	if code != 0 || errs != "" || !strings.HasPrefix(out, "tenure ") {
		t.Fatalf("version: exit %d, %q, %q", code, out, errs)
	}
	code, out2, errs := runIn(t, "--version")
	if code != 0 || errs != "" || out2 != out {
		t.Errorf("--version: exit %d, %q, %q; want %q", code, out2, errs, out)
	}
	for _, c := range []struct {
		bi   *debug.BuildInfo
		want []string
		not  []string
	}{
		{nil, []string{"tenure (devel)\n", "go        go"}, []string{"revision"}},
		{&debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "13d203a5"}, {Key: "vcs.time", Value: "2026-12-04T17:47:00Z"}, {Key: "vcs.modified", Value: "true"}}},
			[]string{"tenure (devel)\n", "revision  13d203a5\n", "time      2026-12-04T17:47:00Z\n", "modified  true\n"}, nil},
		{&debug.BuildInfo{Main: debug.Module{Version: "v1.4.0"}}, []string{"tenure v1.4.0\n"}, []string{"revision", "modified"}},
	} {
		got := formatVersion(c.bi) + "\n"
		wantAndNot(t, "formatVersion", fmt.Sprintf("%q", got), func(s string) bool { return strings.Contains(got, s) }, c.want, c.not)
	}
}

// `tenure completion SHELL` prints a script that completes through the
// binary's hidden __complete command, which knows the commands, the admin
// subcommands and the flags, and not the hidden ones.
func TestCompletion(t *testing.T) {
	for shell, want := range map[string]string{"bash": "__start_tenure", "zsh": "#compdef tenure", "fish": "complete -c tenure"} {
		code, out, errs := runIn(t, "completion", shell)
		if code != 0 || errs != "" || !strings.Contains(out, want) {
			t.Errorf("completion %s: exit %d, stderr %q, script lacks %q", shell, code, errs, want)
		}
	}
	if code, _, errs := runIn(t, "completion", "tcsh"); code != 2 || !strings.Contains(errs, `shell "tcsh" is not bash, zsh or fish`) {
		t.Errorf("completion tcsh: exit %d, %q", code, errs)
	}
	for _, c := range []struct {
		args      []string
		want, not []string
	}{
		{[]string{"wor"}, []string{"worker"}, []string{"bench-child"}},
		{[]string{"admin", "dlq", ""}, []string{"list", "show", "replay", "discard"}, nil},
		{[]string{"migrate", ""}, []string{"up", "down", "status"}, nil},
		{[]string{"worker", "--"}, []string{"--brokers", "--batch-max", "--tls-ca-file"}, []string{"--hold-once", "--inject-faults", "--unsafe-no-fence"}},
	} {
		code, out, errs := runIn(t, append([]string{cobra.ShellCompRequestCmd}, c.args...)...)
		if code != 0 {
			t.Errorf("__complete %q: exit %d, %q", c.args, code, errs)
		}
		wantAndNot(t, fmt.Sprintf("__complete %q", c.args), "\n"+out, func(s string) bool { return strings.Contains(out, s) }, c.want, c.not)
	}
}

// `tenure admin help` and `tenure admin topic help` list the subcommands,
// as --help does.
func TestHelpWord(t *testing.T) {
	for _, args := range [][]string{{"admin", "help"}, {"admin", "topic", "help"}, {"help", "admin", "topic"}} {
		code, stdout, stderr := runIn(t, args...)
		if code != 0 || stderr != "" || !strings.Contains(stdout, "topic create") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q", args, code, stdout, stderr)
		}
	}
}

// A mistyped command or subcommand is bad usage: one sentence that says
// which was meant, then the usage line.
func TestSuggestions(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"wroker"}, `tenure: unknown command "wroker"; did you mean`},
		{[]string{"wroker"}, `"worker"`},
		{[]string{"prodcue", "--topic", "t"}, `did you mean "produce"?`},
		{[]string{"admin", "dlq", "lsit"}, `tenure admin dlq: unknown subcommand "dlq lsit"; did you mean "dlq list"?`},
		{[]string{"admin", "asignments"}, `did you mean "assignments"?`},
		{[]string{"help", "wroker"}, `did you mean`},
		// Nothing close: the choices.
		{[]string{"bogus"}, `unknown command "bogus" (commands: admin, bench, broker, completion, demo, help, migrate, probe, produce, version, worker)`},
		{[]string{"admin", "topic", "bogus"}, `unknown subcommand "topic bogus" (subcommands: topic create, topic describe, topic add-partitions, topic acknowledge-partitions, topic list)`},
	} {
		code, stdout, stderr := runIn(t, c.args...)
		if code != 2 || stdout != "" || !strings.Contains(stderr, c.want) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2 and %q", c.args, code, stdout, stderr, c.want)
		}
	}
}

// A usage error is two lines: the sentence, and the usage in one line with
// where to find the rest; never the whole usage block.
func TestUsageErrorIsOneSentence(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"admin"},
		{"admin", "topic"},
		{"produce", "--bogus"},
		{"worker", "--brokers", "h:1", "--group", "g", "--topic", "t", "--handler", "noop", "--database-url", "postgres://x", "--batch-max", "0"},
		{"admin", "dlq", "replay", "--database-url", "postgres://x", "--brokers", "h:1"},
		{"migrate", "sideways", "--database-url", "postgres://x"},
	} {
		code, stdout, stderr := runIn(t, args...)
		lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
		if code != 2 || stdout != "" || len(lines) != 2 || !strings.HasPrefix(lines[0], "tenure") || !strings.HasPrefix(lines[1], "usage: tenure") ||
			!strings.Contains(lines[1], "--help") {
			t.Errorf("%q: exit %d, stdout %q, stderr:\n%s", args, code, stdout, stderr)
		}
	}
}

// An ordinary flag reads its TENURE_* variable when it is not given; the
// flag wins.
func TestOrdinaryFlagsReadTheEnvironment(t *testing.T) {
	vars := map[string]string{"TENURE_BROKERS": "h:1", "TENURE_TOPIC": "a b", "TENURE_PARTITIONS": "2"}
	code, _, stderr := runInEnv(t, vars, "admin", "topic", "create")
	if code != 2 || !strings.Contains(stderr, `--topic: topic name "a b" is not valid`) {
		t.Errorf("TENURE_TOPIC: exit %d, %q", code, stderr)
	}
	code, _, stderr = runInEnv(t, vars, "admin", "topic", "create", "--topic", "c d")
	if code != 2 || !strings.Contains(stderr, `"c d"`) || strings.Contains(stderr, `"a b"`) {
		t.Errorf("--topic beside TENURE_TOPIC: exit %d, %q", code, stderr)
	}
	code, _, stderr = runInEnv(t, map[string]string{"TENURE_BATCH_MAX": "0"}, "worker", "--brokers", "h:1", "--group", "g", "--topic", "t",
		"--handler", "noop", "--database-url", "postgres://127.0.0.1:1/x")
	if code != 2 || !strings.Contains(stderr, "--batch-max must be from 1") {
		t.Errorf("TENURE_BATCH_MAX=0: exit %d, %q", code, stderr)
	}
	_, help, _ := runInEnv(t, map[string]string{"TENURE_BATCH_MAX": "250"}, "worker", "--help")
	if !strings.Contains(help, "[TENURE_BATCH_MAX] (default 250)") {
		t.Errorf("--help does not show TENURE_BATCH_MAX as the default:\n%s", help)
	}
}

// Destructive and test-only switches are never read from the environment:
// a variable left set cannot arm them. The test-only ones are hidden from
// the usage and --help too.
func TestSwitchesNotFromTheEnvironment(t *testing.T) {
	vars := map[string]string{"TENURE_FORCE": "true", "TENURE_UNSAFE_NO_FENCE": "true", "TENURE_HOLD_ONCE": "before-batch", "TENURE_INJECT_FAULTS": "true"}
	tr := newTree(&env{getenv: func(k string) string { return vars[k] }, secrets: &secrets{}})
	for _, c := range []struct {
		cmd, flag, unset string
		hidden           bool
	}{
		{"migrate", "force", "false", true},
		{"worker", "unsafe-no-fence", "false", true},
		{"worker", "hold-once", "", true},
		{"worker", "inject-faults", "false", true},
	} {
		cmd, _, err := tr.root.Find([]string{c.cmd})
		if err != nil {
			t.Fatal(err)
		}
		f := tr.flags[cmd]
		if err := f.fromEnv(); err != nil {
			t.Fatal(err)
		}
		fl := f.fs.Lookup(c.flag)
		if got := fl.Value.String(); got != c.unset {
			t.Errorf("%s --%s is %q with %s set", c.cmd, c.flag, got, envName(c.flag))
		}
		_, help, _ := runInEnv(t, vars, c.cmd, "--help")
		if strings.Contains(help, envName(c.flag)) {
			t.Errorf("%s --help names %s", c.cmd, envName(c.flag))
		}
		// A flag's own line in the flag list (a description may still name it).
		if shown := regexp.MustCompile(`(?m)^\s+(-\w, )?--` + regexp.QuoteMeta(c.flag) + `\b`).MatchString(help); shown == c.hidden {
			t.Errorf("%s --help shows --%s: %v, want %v", c.cmd, c.flag, shown, !c.hidden)
		}
	}
	// With TENURE_FORCE set, `migrate up` is not taken for a forced one
	// ("--force goes with down"): it goes on to the database.
	code, _, stderr := runInEnv(t, vars, "migrate", "up", "--database-url", "postgres://postgres@127.0.0.1:1/x?connect_timeout=2")
	if code != 1 || !strings.Contains(stderr, "cannot reach the database") {
		t.Errorf("migrate up with TENURE_FORCE: exit %d, %q", code, stderr)
	}
	// With TENURE_HOLD_ONCE set to nonsense, a worker is not refused for it.
	code, _, stderr = runInEnv(t, map[string]string{"TENURE_HOLD_ONCE": "nonsense"}, "worker", "--brokers", "h:1", "--group", "g", "--topic", "t",
		"--handler", "noop", "--database-url", "postgres://postgres@127.0.0.1:1/x?connect_timeout=2")
	if code != 1 || strings.Contains(stderr, "hold-once") {
		t.Errorf("worker with TENURE_HOLD_ONCE: exit %d, %q", code, stderr)
	}
	// Given on the command line, they work.
	code, _, stderr = runIn(t, "worker", "--brokers", "h:1", "--group", "g", "--topic", "t", "--handler", "noop",
		"--database-url", "postgres://127.0.0.1:1/x", "--hold-once", "nonsense")
	if code != 2 || !strings.Contains(stderr, `--hold-once "nonsense" is not before-claim`) {
		t.Errorf("--hold-once nonsense: exit %d, %q", code, stderr)
	}
}

// consumer.New's own checks refuse a bad configuration before anything
// connects, as bad usage in its words: the worker does not repeat them.
func TestWorkerConfigCheckedByConsumer(t *testing.T) {
	code, _, stderr := runIn(t, "worker", "--brokers", "h:1", "--group", "g", "--topic", "t", "--handler", "noop",
		"--database-url", "postgres://127.0.0.1:1/x", "--protocol", "next")
	if code != 2 || !strings.Contains(stderr, `protocol "next" is not "classic" or "consumer"`) || strings.Contains(stderr, "database") {
		t.Errorf("--protocol next: exit %d, %q", code, stderr)
	}
	code, _, stderr = runIn(t, "worker", "--brokers", "nohostport", "--group", "g", "--topic", "t", "--handler", "noop",
		"--database-url", "postgres://127.0.0.1:1/x")
	if code != 2 || !strings.Contains(stderr, `broker "nohostport" is not host:port`) {
		t.Errorf("--brokers nohostport: exit %d, %q", code, stderr)
	}
}

// cmd/tenure's package comment names every command and admin subcommand.
func TestPackageCommentListsEveryCommand(t *testing.T) {
	b, err := os.ReadFile("../../cmd/tenure/main.go")
	if err != nil {
		t.Fatal(err)
	}
	doc, _, _ := strings.Cut(string(b), "package main")
	tr := newTree(&env{getenv: func(string) string { return "" }})
	walk(tr.root, func(c *cobra.Command) {
		if c == tr.root || c.Hidden || isGroup(c) && c.Name() != "admin" {
			return
		}
		name := listName(c)
		if !c.Parent().HasParent() {
			name = "tenure " + name
		}
		if !strings.Contains(doc, name) {
			t.Errorf("cmd/tenure/main.go's package comment does not name %q", name)
		}
	})
}
