package integration

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tenure-dev/tenure/internal/testinfra/freeport"
	"github.com/tenure-dev/tenure/internal/testinfra/mdtest"
	"github.com/tenure-dev/tenure/internal/testinfra/testdb"
)

// tourStep is one command of the README's tour and the output shown for
// it.
type tourStep struct {
	cmd  string   // as written after "$ ", heredoc included
	want []string // the lines shown after it
}

// readmeSection returns the README.md section under the level-2 heading
// title, up to the next level-2 heading.
func readmeSection(t *testing.T, title string) string {
	t.Helper()
	return mdtest.Section(t, filepath.Join("..", "README.md"), title)
}

// readmeTour reads the commands of README.md's tour, in order.
func readmeTour(t *testing.T) []tourStep {
	t.Helper()
	s := readmeSection(t, "A tour with a development broker")
	var steps []tourStep
	inBlock, heredoc := false, ""
	for _, line := range strings.Split(s, "\n") {
		switch {
		case strings.HasPrefix(line, "```"):
			inBlock = !inBlock
		case !inBlock:
		case heredoc != "":
			steps[len(steps)-1].cmd += "\n" + line
			if line == heredoc {
				heredoc = ""
			}
		case strings.HasPrefix(line, "$ "):
			steps = append(steps, tourStep{cmd: strings.TrimPrefix(line, "$ ")})
			if m := regexp.MustCompile(`<<'(\w+)'$`).FindStringSubmatch(line); m != nil {
				heredoc = m[1]
			}
		case len(steps) > 0:
			steps[len(steps)-1].want = append(steps[len(steps)-1].want, line)
		}
	}
	if len(steps) < 10 {
		t.Fatalf("found only %d commands in the tour", len(steps))
	}
	return steps
}

var (
	hexID = regexp.MustCompile(`[0-9a-f]{32}`)
	// shortID is a member id as the assignments table abbreviates it.
	shortID = regexp.MustCompile(`-[0-9a-f]{8}\b`)
	digits  = regexp.MustCompile(`[0-9]+`)
)

// normalize keeps what a run of the tour must reproduce: every word, column
// and state, but not the numbers that differ from run to run (times,
// ports, member ids, epochs) nor the column widths. A lone "-" (a value
// not known, such as a classic group's generation when every member joined
// it fresh) counts as a number.
func normalize(lines []string) []string {
	var out []string
	for _, l := range lines {
		l = hexID.ReplaceAllString(l, "H")
		l = shortID.ReplaceAllString(l, "-H")
		l = digits.ReplaceAllString(l, "N")
		f := strings.Fields(l)
		for i := range f {
			if f[i] == "-" {
				f[i] = "N"
			}
		}
		l = strings.Join(f, " ")
		if l != "" {
			out = append(out, l)
		}
	}
	return out
}

// readOnly commands may be run again until the state they show settles
// (workers joining, jobs being dead-lettered); the others run once.
var readOnly = regexp.MustCompile(`^tenure admin (assignments|groups|fences|holds|dlq list|dlq show|topic describe)\b`)

// The README's tour, run command by command in its order, against a
// broker it starts itself (`tenure broker`, on a free port) and a schema of
// its own: every command must work and print what the README shows, up to
// the numbers that differ between runs.
func TestREADMETour(t *testing.T) {
	t.Parallel()
	steps := readmeTour(t)
	pool := testdb.Pool(t)
	// A schema that does not exist yet: the tour migrates it, as a first
	// run on a new database does (a worker does not create it).
	schema := testdb.FreshSchema(t, pool, "tenure_readme")
	dir := t.TempDir()
	addr := freeport.Closed(t)
	subst := strings.NewReplacer("127.0.0.1:9092", addr,
		"postgres://postgres@127.0.0.1:5432/postgres", testdb.URL())

	vars := map[string]string{"TENURE_SCHEMA": schema}
	environ := func() []string {
		var env []string
		for _, kv := range os.Environ() {
			if strings.HasPrefix(kv, "TENURE_") && !strings.HasPrefix(kv, "TENURE_TEST_") {
				continue
			}
			if strings.HasPrefix(kv, "PATH=") {
				kv = "PATH=" + filepath.Dir(tenureBin) + ":" + strings.TrimPrefix(kv, "PATH=")
			}
			env = append(env, kv)
		}
		for k, v := range vars {
			env = append(env, k+"="+v)
		}
		return env
	}

	// Background commands (workers, the broker), stopped at the end by PID.
	var background []*exec.Cmd
	t.Cleanup(func() {
		for i := len(background) - 1; i >= 0; i-- {
			_ = background[i].Process.Signal(syscall.SIGTERM)
		}
		for _, c := range background {
			done := make(chan struct{})
			go func() { _ = c.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				_ = c.Process.Kill()
				<-done
				t.Errorf("%s did not stop on SIGTERM", c.Args)
			}
		}
		if t.Failed() {
			for _, name := range []string{"worker-1.log", "worker-2.log", "faulty.log"} {
				if b, err := os.ReadFile(filepath.Join(dir, name)); err == nil {
					lines := strings.Split(strings.TrimSpace(string(b)), "\n")
					t.Logf("---- %s (last 30 lines)\n%s", name, strings.Join(tail(lines, 30), "\n"))
				}
			}
		}
	})

	for i, st := range steps {
		cmd := subst.Replace(st.cmd)
		switch {
		case strings.HasPrefix(cmd, "export "):
			for _, kv := range strings.Fields(strings.TrimPrefix(cmd, "export ")) {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					t.Fatalf("step %d: cannot read %q", i, kv)
				}
				vars[k] = v
			}
		case strings.HasSuffix(cmd, " &"):
			c := exec.Command("bash", "-c", "exec "+strings.TrimSuffix(cmd, " &"))
			c.Dir, c.Env = dir, environ()
			if err := c.Start(); err != nil {
				t.Fatalf("step %d `%s`: %v", i, st.cmd, err)
			}
			background = append(background, c)
			if strings.HasPrefix(cmd, "tenure broker") {
				waitFor(t, 30*time.Second, "the tour's broker to listen", func() bool {
					conn, err := net.DialTimeout("tcp", addr, time.Second)
					if err == nil {
						conn.Close()
					}
					return err == nil
				})
			}
		default:
			// The README's schema is the default one, tenure.
			runTourStep(t, i, st, cmd, dir, environ(), strings.NewReplacer(schema, "tenure"))
		}
	}
}

// runTourStep runs one foreground command of the tour and compares what it
// printed (stdout and stderr, as a terminal shows them) with the README.
func runTourStep(t *testing.T, i int, st tourStep, cmd, dir string, env []string, out2readme *strings.Replacer) {
	t.Helper()
	wantCode := 0
	if len(st.want) > 0 && regexp.MustCompile(`^tenure [a-z -]+: `).MatchString(st.want[0]) {
		wantCode = 1
	}
	want := normalize(st.want)
	deadline := time.Now().Add(90 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		c := exec.CommandContext(ctx, "bash", "-c", cmd)
		c.Dir, c.Env = dir, env
		var out bytes.Buffer
		c.Stdout, c.Stderr = &out, &out
		err := c.Run()
		cancel()
		code := 0
		var ee *exec.ExitError
		switch {
		case errors.As(err, &ee):
			code = ee.ExitCode()
		case err != nil:
			t.Fatalf("step %d `%s`: %v", i, st.cmd, err)
		}
		got := normalize(strings.Split(out2readme.Replace(out.String()), "\n"))
		if code == wantCode && strings.Join(got, "\n") == strings.Join(want, "\n") {
			t.Logf("step %d ok: %s", i, strings.SplitN(st.cmd, "\n", 2)[0])
			return
		}
		if !readOnly.MatchString(cmd) || time.Now().After(deadline) {
			t.Fatalf("step %d of the README's tour, `%s`: exit %d (README implies %d), and it printed\n%s\nwhere the README shows\n%s",
				i, st.cmd, code, wantCode, out.String(), strings.Join(st.want, "\n"))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// The README's two commands are the ones `make demo` and `make test` run
// (the README says `make help` lists them), and the scripts they name
// exist.
func TestREADMETwoCommands(t *testing.T) {
	t.Parallel()
	sec := readmeSection(t, "Two commands")
	blocks := mdtest.CodeBlocks(sec, "```sh")
	if len(blocks) != 2 {
		t.Fatalf("README's \"Two commands\" shows %d sh blocks, want 2: run it, run the tests", len(blocks))
	}
	run, test := strings.Join(blocks[0], "\n"), strings.Join(blocks[1], "\n")
	if run != "bash scripts/ensure-postgres.sh && go run ./cmd/tenure demo" {
		t.Errorf("the run command is %q", run)
	}
	if test != "bash scripts/test.sh" {
		t.Errorf("the test command is %q", test)
	}
	mk, err := os.ReadFile(filepath.Join("..", "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	target := func(name string) []string {
		m := regexp.MustCompile(`(?ms)^` + name + `:[^\n]*\n((?:\t[^\n]*\n)+)`).FindSubmatch(mk)
		if m == nil {
			t.Fatalf("Makefile has no %s target", name)
		}
		var cmds []string
		for _, l := range strings.Split(strings.TrimSpace(string(m[1])), "\n") {
			cmds = append(cmds, strings.ReplaceAll(strings.TrimSpace(l), "$(GO)", "go"))
		}
		return cmds
	}
	if got := strings.Join(target("demo"), " && "); got != run {
		t.Errorf("make demo runs %q, the README %q", got, run)
	}
	if got := strings.Join(target("test"), " && "); got != test {
		t.Errorf("make test runs %q, the README %q", got, test)
	}
	for _, script := range regexp.MustCompile(`scripts/[\w.-]+`).FindAllString(run+" "+test, -1) {
		if _, err := os.Stat(filepath.Join("..", script)); err != nil {
			t.Errorf("the README's command names %s: %v", script, err)
		}
	}
}

// readmeDemoExcerpt returns the lines of the demo's output the README
// shows under "Two commands" ("..." marks lines left out).
func readmeDemoExcerpt(t *testing.T) []string {
	t.Helper()
	blocks := mdtest.CodeBlocks(readmeSection(t, "Two commands"), "```")
	if len(blocks) != 1 {
		t.Fatalf("README's \"Two commands\" shows %d plain blocks, want 1: the demo's output", len(blocks))
	}
	return blocks[0]
}

// checkREADMEDemoExcerpt fails t unless every line of the README's demo
// excerpt is a line of out, in the same order, up to the numbers that
// differ between runs (normalize).
func checkREADMEDemoExcerpt(t *testing.T, out string) {
	t.Helper()
	got := normalize(strings.Split(out, "\n"))
	i := 0
	for _, line := range readmeDemoExcerpt(t) {
		if strings.TrimSpace(line) == "..." {
			continue
		}
		want := normalize([]string{line})
		if len(want) == 0 {
			continue
		}
		for i < len(got) && got[i] != want[0] {
			i++
		}
		if i == len(got) {
			t.Errorf("the README's demo excerpt shows a line the demo did not print (in that order):\n%s", line)
			return
		}
		i++
	}
}
