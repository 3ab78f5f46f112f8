package integration

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// Through the built binary, after a worker ran: a mistyped group or topic
// is refused in one sentence naming the ones the schema has (exit 1), the
// right one is answered, a mistyped flag gets a suggestion, and --group and
// --topic complete with the names the database and the brokers know.
func TestUnknownNamesThroughTheBinary(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	e.produceTo(0, jobsFor(keys, 0, 3)...)
	e.ledgerCaughtUp(3).stop(30 * time.Second)

	db := []string{"--database-url", e.dbURL, "--schema", e.schema}
	typo := strings.Replace(e.group, "workers", "wrokers", 1)
	groups := fmt.Sprintf("no group %q in schema %s; groups it has: %s", typo, e.schema, e.group)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"admin", "holds", "--group", typo}, "tenure admin holds: " + groups},
		{[]string{"admin", "fences", "--group", typo}, "tenure admin fences: " + groups},
		{[]string{"admin", "dlq", "list", "--group", typo}, "tenure admin dlq list: " + groups},
		{[]string{"admin", "job", e.topic + "/0/1", "--group", typo}, "tenure admin job: " + groups},
		{[]string{"admin", "dlq", "list", "--topic", e.topic + "x"}, fmt.Sprintf("tenure admin dlq list: no topic %q in schema %s; topics it has: %s", e.topic+"x", e.schema, e.topic)},
	} {
		r := runCLI(t, 30*time.Second, "", append(c.args, db...)...)
		wantFailure(t, r, 1)
		if r.stderr != c.want+"\n" || r.stdout != "" {
			t.Errorf("%q: %s\nwant stderr %q", c.args, r, c.want)
		}
	}
	if r := runCLI(t, 30*time.Second, "", append([]string{"admin", "job", e.topic + "/0/1", "--group", e.group}, db...)...); r.code != 0 || !strings.Contains(r.stdout, "committed") {
		t.Errorf("admin job of the right group: %s", r)
	}

	r := runCLI(t, 30*time.Second, "", append([]string{"admin", "holds", "--gruop", e.group}, db...)...)
	wantFailure(t, r, 2, "tenure admin holds: flag provided but not defined: --gruop; did you mean --group?", "usage: tenure admin holds")

	for _, c := range []struct {
		args []string
		want string
	}{
		{append(append([]string{"__complete", "admin", "fences"}, db...), "--group", ""), e.group},
		{append(append([]string{"__complete", "admin", "dlq", "list"}, db...), "--topic", ""), e.topic},
		{[]string{"__complete", "worker", "--brokers", strings.Join(e.brokers, ","), "--topic", ""}, e.topic},
	} {
		r := runCLI(t, 30*time.Second, "", c.args...)
		if lines := strings.Split(strings.TrimSpace(r.stdout), "\n"); r.code != 0 || !slices.Contains(lines, c.want) || !slices.Contains(lines, ":4") {
			t.Errorf("%q: want %q offered (and no file completion): %s", c.args, c.want, r)
		}
	}
}
