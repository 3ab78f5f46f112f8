package integration

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tenure-dev/tenure/internal/testinfra/freeport"
	"github.com/tenure-dev/tenure/internal/testinfra/testdb"
)

// `tenure demo` is the README's "run it": it must tell the story end to end
// (A frozen, B claims with a higher token, A's late commit rejected) and
// exit 0 only with a clean history.
func TestDemo(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	schema := testdb.FreshSchema(t, pool, "tenure_demo_test")

	stdout := runDemoStory(t, testdb.URL(), []string{
		"SIGSTOP worker A — frozen inside the check-then-act window",
		"SIGCONT worker A — it wakes up believing it still owns partition 0",
		"Postgres rejects A's commit: commit of ",
		"Ownership in Postgres (fences):",
		"Export pointers (one per key: the visible object):",
		"A's staged objects stay unpublished",
		"objects staged, none published",
		"$ tenure admin exports get ",
		"\"sha256\": ",
		"verdict: PASS",
	}, "--schema", schema)
	// The tokens in the timeline: B's claim is above A's, and the rejection
	// names both.
	aTok := regexp.MustCompile(`worker A \(pid \d+\) claims partition 0 with token (\d+\.\d+)`).FindStringSubmatch(stdout)
	bTok := regexp.MustCompile(`worker B claims partition 0 with token (\d+\.\d+) \(higher than A's`).FindStringSubmatch(stdout)
	if aTok == nil || bTok == nil {
		t.Fatalf("stdout lacks A's or B's claim line\n%s", stdout)
	}
	if !tokenLess(t, aTok[1], bTok[1]) {
		t.Errorf("B's token %s is not above A's %s", bTok[1], aTok[1])
	}
	if !regexp.MustCompile(`rejects A's commit: .*with token ` + regexp.QuoteMeta(aTok[1]) + ` .*rejected: token ` + regexp.QuoteMeta(bTok[1])).MatchString(stdout) {
		t.Errorf("the rejection line should name A's token %s and B's %s\n%s", aTok[1], bTok[1], stdout)
	}
	// Timeline lines are stamped with the time since the start.
	if !regexp.MustCompile(`(?m)^\+\d+\.\ds\s+SIGSTOP worker A`).MatchString(stdout) {
		t.Errorf("timeline lines should start with +N.Ns\n%s", stdout)
	}
	// The admin commands it shows work as printed, copied into a shell
	// without the demo's environment: they name its schema and database.
	m := regexp.MustCompile(`(?m)^\$ (tenure admin exports get \S+ --schema ` + regexp.QuoteMeta(schema) + ` --database-url \S+)\n(.*)\n`).FindStringSubmatch(stdout)
	if m == nil {
		t.Fatalf("stdout lacks `$ tenure admin exports get KEY --schema %s --database-url URL`\n%s", schema, stdout)
	}
	sh := exec.Command("bash", "-c", m[1])
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PATH=") {
			kv = "PATH=" + filepath.Dir(tenureBin) + ":" + strings.TrimPrefix(kv, "PATH=")
		}
		if !strings.HasPrefix(kv, "TENURE_") {
			sh.Env = append(sh.Env, kv)
		}
	}
	if out, err := sh.CombinedOutput(); err != nil || string(out) != m[2] {
		t.Errorf("`%s`: %v\n%s\nthe demo printed\n%s", m[1], err, out, m[2])
	}
	// The workers' JSON logs stay out of stdout.
	if strings.Contains(stdout, `"level":`) {
		t.Errorf("worker logs leaked into stdout\n%s", stdout)
	}
	// The lines the README shows are the demo's.
	checkREADMEDemoExcerpt(t, stdout)
	t.Logf("demo output:\n%s", stdout)
}

// Without a database the demo says what to do in one sentence, exit 1.
func TestDemoWithoutDatabase(t *testing.T) {
	t.Parallel()
	addr := freeport.Closed(t)
	url := "postgres://postgres@" + addr + "/postgres?sslmode=disable&connect_timeout=5"

	stdout, stderr, code := runDemoBin(t, 30*time.Second, url, "--schema", testdb.NewSchemaName("tenure_demo_test"))
	if code != 1 {
		t.Fatalf("exit status %d, want 1\n---- stdout ----\n%s\n---- stderr ----\n%s", code, stdout, stderr)
	}
	msg := strings.TrimSpace(stderr)
	if strings.Contains(msg, "\n") || !strings.HasPrefix(msg, "tenure demo: ") {
		t.Errorf("stderr should be one line starting with \"tenure demo: \":\n%s", stderr)
	}
	for _, want := range []string{addr, "TENURE_DATABASE_URL", "PostgreSQL"} {
		if !strings.Contains(msg, want) {
			t.Errorf("stderr should mention %q: %s", want, msg)
		}
	}
	for _, bad := range []string{"goroutine ", "panic", ".go:"} {
		if strings.Contains(stderr, bad) {
			t.Errorf("stderr looks like a stack trace (%q): %s", bad, stderr)
		}
	}
	if stdout != "" {
		t.Errorf("stdout should be empty, got:\n%s", stdout)
	}
}

// runDemoStory runs `tenure demo` with args against dbURL, wants it to exit
// 0 and to tell each line of story, and returns its stdout.
func runDemoStory(t *testing.T, dbURL string, story []string, args ...string) string {
	t.Helper()
	stdout, stderr, code := runDemoBin(t, 2*time.Minute, dbURL, args...)
	if code != 0 {
		t.Fatalf("tenure demo %s exited %d\n---- stdout ----\n%s\n---- stderr ----\n%s", strings.Join(args, " "), code, stdout, stderr)
	}
	for _, want := range story {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q\n%s", want, stdout)
		}
	}
	return stdout
}

// runDemoBin runs `tenure demo args...` with TENURE_DATABASE_URL set to
// dbURL, within timeout (past it the process is killed and the test fails).
func runDemoBin(t *testing.T, timeout time.Duration, dbURL string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, tenureBin, append([]string{"demo"}, args...)...)
	// Interrupt first, as Ctrl-C would: the demo then kills and reaps its
	// own workers.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 15 * time.Second
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TENURE_") || strings.HasPrefix(kv, "TENURE_TEST_") {
			env = append(env, kv)
		}
	}
	cmd.Env = append(env, "TENURE_DATABASE_URL="+dbURL)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	start := time.Now()
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("tenure demo did not finish within %s\n---- stdout ----\n%s\n---- stderr ----\n%s", timeout, out.String(), errb.String())
	}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("running tenure demo: %v", err)
	}
	t.Logf("tenure demo %s: exit %d after %s", strings.Join(args, " "), code, time.Since(start).Round(100*time.Millisecond))
	return out.String(), errb.String(), code
}
