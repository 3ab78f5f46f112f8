package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"image/png"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	protocol "github.com/tenure-dev/tenure/internal/fence"
	"github.com/tenure-dev/tenure/sink"
)

// handoffWindow is the page's: short, so that the hand-offs of the start
// have aged out before the one the test makes.
const handoffWindow = 20 * time.Second

// pagePassword is the database password the page's server is given: it
// must appear nowhere on the page, in its JSON or in the server's output.
const pagePassword = "page-pw-5e1d9c3a"

// The live ownership page (`tenure admin serve`) in a real browser:
// headless Chromium loads it once and reads it over time, so what changes
// on it comes from the page's own refresh, never from a reload. Two
// workers share four partitions; one is frozen with SIGSTOP past its
// session timeout and the page shows its partitions handed off to the
// other (coordinator and Postgres agreeing, the rows highlighted, the
// claims that fenced it); then a held partition shows its reason and the
// exact `tenure admin holds acknowledge` command, which, run as shown,
// resolves it. The page, its JSON and the server's output carry no
// password. A screenshot goes to TENURE_TEST_SCREENSHOT (or the test's
// temporary directory). Without Chromium the test fails: it is installed
// by scripts/test.sh.
func TestOwnershipPageInBrowser(t *testing.T) {
	t.Parallel()
	chromium := chromiumPath(t)
	e := newEnv(t, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	// Two healthy workers, a few jobs, and one that is dead-lettered.
	a := e.startWorker("A", "--inject-faults", "--max-attempts", "2")
	e.startWorker("B", "--inject-faults", "--max-attempts", "2")
	waitForMembers(t, e, 2)
	e.produce(jobsFor(keys, 0, 40)...)
	e.produce([2]string{"acme", `{"seq":900,"tenure-fault":"error"}`})
	for p := int32(0); p < 4; p++ {
		waitCommitted(t, e, p, e.highWatermark(p), "")
	}

	srv := startPageServer(t, e, ctx)
	br := startBrowser(t, chromium)
	br.navigate(ctx, srv.url)
	br.eval(ctx, `window.__tenureLoaded = 1`, nil)
	pt := &pageTest{t: t, e: e, ctx: ctx, srv: srv, br: br}

	aMember, aParts, refreshesBefore := pt.ownersBefore()
	// A is frozen past its session timeout: B takes its partitions, and the
	// page shows the hand-off.
	a.pause()
	bMember := pt.handOff(aMember, aParts, refreshesBefore)
	held, wantCmd := pt.holdOne(aParts, bMember)
	pt.saveScreenshot()
	pt.acknowledge(held, wantCmd)
	body := pt.checkAPI(bMember)
	pt.checkHostRefused()
	pt.checkNoPassword(body)
	a.resume()
}

// pageTest is TestOwnershipPageInBrowser's setup, shared by its steps.
type pageTest struct {
	t   *testing.T
	e   *env
	ctx context.Context
	srv *pageServer
	br  *browser
}

// ownersBefore waits until both workers own partitions, by both sides'
// account, and the hand-offs of the start (A had them all until B joined)
// are older than the page's hand-off window. It returns A's member id, its
// partitions and the page's refreshes so far.
func (pt *pageTest) ownersBefore() (aMember string, aParts []int, refreshes int) {
	t := pt.t
	var before pageState
	pt.br.waitPage(pt.ctx, 60*time.Second, "the page to show four partitions owned by two members, and no recent hand-off", func(s pageState) bool {
		before = s
		owners := map[string]bool{}
		for _, r := range s.Rows {
			if r.State != "ok" || r.Owner == "" || r.Owner != r.Member || strings.Contains(r.Class, "handoff") {
				return false
			}
			owners[r.Owner] = true
		}
		return len(s.Rows) == 4 && len(owners) == 2
	})
	for _, r := range before.Rows {
		if strings.HasPrefix(r.Owner, "tenure-A") {
			aMember = r.Owner
		}
	}
	if aMember == "" {
		t.Fatalf("no partition of A's (a member id starting with tenure-A) on the page: %+v", before.Rows)
	}
	for _, r := range before.Rows {
		if r.Owner == aMember {
			aParts = append(aParts, r.Partition)
		}
	}
	t.Logf("before the freeze: A (%s) owns partitions %v", aMember, aParts)
	return aMember, aParts, before.Refreshes
}

// handOff waits until the page, by its own refresh, shows A's partitions
// handed off to B and says why; it returns B's member id.
func (pt *pageTest) handOff(aMember string, aParts []int, refreshesBefore int) string {
	t := pt.t
	frozen := time.Now()
	var after pageState
	pt.br.waitPage(pt.ctx, 90*time.Second, "the page to show A's partitions handed off to B", func(s pageState) bool {
		after = s
		if len(s.Rows) != 4 {
			return false
		}
		for _, r := range s.Rows {
			if r.State != "ok" || r.Owner == aMember || r.Owner != r.Member || !strings.HasPrefix(r.Owner, "tenure-B") {
				return false
			}
			// A's partitions are highlighted; B's own are not: they did
			// not move.
			if contains(aParts, r.Partition) != strings.Contains(r.Class, "handoff") {
				return false
			}
		}
		return true
	})
	t.Logf("the page showed the hand-off %s after the freeze", time.Since(frozen).Round(100*time.Millisecond))
	if after.Loaded != 1 {
		t.Errorf("the page was reloaded (its marker is gone): the refresh must fetch, not navigate")
	}
	if after.Refreshes <= refreshesBefore {
		t.Errorf("the page's own refresh did not run: %d refreshes before, %d after", refreshesBefore, after.Refreshes)
	}
	for _, want := range []string{
		"hand-off", "from " + aMember, // the hand-off line names the old owner
		"its commits are now rejected",      // the claims that fenced A
		"1 dead letter", "injected failure", // the dead-lettered job
	} {
		if !strings.Contains(after.Text, want) {
			t.Errorf("the page does not say %q:\n%s", want, after.Text)
		}
	}
	return after.Rows[0].Owner
}

// holdOne holds the first of A's partitions and waits until the page shows
// its reason and the command that resolves it; it returns the partition
// and the command.
func (pt *pageTest) holdOne(aParts []int, bMember string) (int32, string) {
	t, e, ctx := pt.t, pt.e, pt.ctx
	store := e.store()
	held := int32(aParts[0])
	f, err := store.Get(ctx, sink.Partition{Group: e.group, Topic: e.topic, Partition: held})
	if err != nil {
		t.Fatal(err)
	}
	reason := fmt.Sprintf("the log starts at %d, above the stored next offset %d: 3 jobs (offsets %d to %d) were deleted (retention, DeleteRecords) before they were processed; "+
		"acknowledging moves the next offset up to the log's start", f.NextOffset+3, f.NextOffset, f.NextOffset, f.NextOffset+2)
	if err := protocol.Of(store).HoldPartition(ctx, sink.Hold{Partition: sink.Partition{Group: e.group, Topic: e.topic, Partition: held},
		Kind: sink.HoldLogTruncated, Reason: reason, NextOffset: f.NextOffset, LogStart: f.NextOffset + 3, HighWatermark: f.NextOffset + 3,
		From: -1, To: -1, AckedOffset: -1, Owner: bMember, Token: f.Token}); err != nil {
		t.Fatal(err)
	}
	wantCmd := fmt.Sprintf("tenure admin holds acknowledge --group %s --topic %s --partition %d --schema %s --brokers %s",
		e.group, e.topic, held, e.schema, strings.Join(e.brokers, ","))
	var withHold pageState
	pt.br.waitPage(ctx, 30*time.Second, "the page to show the hold, its reason and its command", func(s pageState) bool {
		withHold = s
		for _, r := range s.Rows {
			if r.Partition == int(held) {
				return r.State == "log-truncated" && strings.Contains(r.Class, "held") &&
					strings.Contains(s.Text, reason) && strings.Contains(s.Text, wantCmd)
			}
		}
		return false
	})
	if !strings.Contains(withHold.Text, "1 held") || !strings.Contains(withHold.Text, fmt.Sprintf("%d hand-offs", len(aParts))) {
		t.Errorf("the group's summary does not count the held partition and the %d hand-offs:\n%s", len(aParts), withHold.Text)
	}
	return held, wantCmd
}

// saveScreenshot saves the page, a PNG, to TENURE_TEST_SCREENSHOT or the
// test's temporary directory.
func (pt *pageTest) saveScreenshot() {
	t := pt.t
	shot := pt.br.screenshot(pt.ctx)
	path := os.Getenv("TENURE_TEST_SCREENSHOT")
	if path == "" {
		path = filepath.Join(t.TempDir(), "ownership-page.png")
	}
	if err := os.WriteFile(path, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(shot))
	if err != nil {
		t.Fatalf("the screenshot is not a PNG: %v", err)
	}
	t.Logf("screenshot (%dx%d) saved to %s", img.Bounds().Dx(), img.Bounds().Dy(), path)
}

// acknowledge runs the command as the page shows it (the database URL from
// TENURE_DATABASE_URL, as the page says) and waits until the page drops
// the hold.
func (pt *pageTest) acknowledge(held int32, wantCmd string) {
	t := pt.t
	args := strings.Fields(wantCmd)[1:]
	cmd := exec.CommandContext(pt.ctx, tenureBin, args...)
	cmd.Env = append(os.Environ(), "TENURE_DATABASE_URL="+pt.e.dbURL)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the page's command %q: %v\n%s", wantCmd, err, out)
	}
	pt.br.waitPage(pt.ctx, 30*time.Second, "the page to drop the acknowledged hold", func(s pageState) bool {
		for _, r := range s.Rows {
			if r.Partition == int(held) {
				return r.State != "log-truncated" && !strings.Contains(r.Class, "held") && !strings.Contains(s.Text, wantCmd)
			}
		}
		return false
	})
}

// checkAPI: the JSON says the same (every partition B's, one dead letter);
// it returns the body.
func (pt *pageTest) checkAPI(bMember string) []byte {
	t := pt.t
	resp, err := http.Get(pt.srv.url + "api/ownership")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var snap struct {
		Groups []struct {
			Name       string `json:"name"`
			Partitions []struct {
				Partition int    `json:"partition"`
				Owner     string `json:"fence_owner"`
				Member    string `json:"member_id"`
			} `json:"partitions"`
			DeadLetters struct {
				Dead int `json:"dead"`
			} `json:"dead_letters"`
		} `json:"groups"`
	}
	if err := json.Unmarshal(body, &snap); err != nil || resp.StatusCode != 200 {
		t.Fatalf("/api/ownership: %d, %v\n%s", resp.StatusCode, err, body)
	}
	if len(snap.Groups) != 1 || snap.Groups[0].Name != pt.e.group || len(snap.Groups[0].Partitions) != 4 || snap.Groups[0].DeadLetters.Dead != 1 {
		t.Errorf("/api/ownership: %s", body)
	}
	for _, p := range snap.Groups[0].Partitions {
		if p.Owner != bMember || p.Member != bMember {
			t.Errorf("/api/ownership: partition %d owned by %q (coordinator: %q), want B", p.Partition, p.Owner, p.Member)
		}
	}
	return body
}

// checkHostRefused: a request that names another host (DNS rebinding) is
// refused.
func (pt *pageTest) checkHostRefused() {
	req, _ := http.NewRequest(http.MethodGet, pt.srv.url, nil)
	req.Host = "tenure.example.com"
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusMisdirectedRequest {
		pt.t.Errorf("Host tenure.example.com: %v, %v; want 421", resp, err)
	} else {
		resp.Body.Close()
	}
}

// checkNoPassword: nothing anywhere carries the password, and the page
// logged no error.
func (pt *pageTest) checkNoPassword(body []byte) {
	t := pt.t
	final := pt.br.state(pt.ctx)
	for what, s := range map[string]string{"the page's HTML": final.HTML, "/api/ownership": string(body), "the server's output": pt.srv.output()} {
		if strings.Contains(s, pagePassword) {
			t.Errorf("%s carries the database password", what)
		}
	}
	if errs := pt.br.errors(); len(errs) > 0 {
		t.Errorf("the page logged errors: %v", errs)
	}
}

func contains(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// chromiumPath finds Chromium (TENURE_TEST_CHROMIUM, else chromium on the
// PATH); without it the test fails, saying how to install it.
func chromiumPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("TENURE_TEST_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("this test needs Chromium: apt-get install chromium (scripts/test.sh installs it), or set TENURE_TEST_CHROMIUM")
	return ""
}

// pageServer is a running `tenure admin serve`.
type pageServer struct {
	url string
	mu  sync.Mutex
	out bytes.Buffer
}

func (s *pageServer) output() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.out.String()
}

func (s *pageServer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.out.Write(p)
}

// withPassword is the test database's URL with pagePassword in it (the
// test server trusts loopback connections, so any password is accepted).
func withPassword(t *testing.T, dbURL string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") || u.User == nil {
		t.Fatalf("TENURE_TEST_DATABASE_URL %q is not a postgres:// URL with a user: this test puts a password into it", dbURL)
	}
	if _, has := u.User.Password(); has {
		t.Fatalf("TENURE_TEST_DATABASE_URL has a password already: this test puts its own into it")
	}
	u.User = url.UserPassword(u.User.Username(), pagePassword)
	return u.String()
}

func startPageServer(t *testing.T, e *env, ctx context.Context) *pageServer {
	t.Helper()
	s := &pageServer{}
	cmd := exec.Command(tenureBin, "admin", "serve", "--brokers", strings.Join(e.brokers, ","),
		"--database-url", withPassword(t, e.dbURL), "--schema", e.schema, "--http-addr", "127.0.0.1:0", "--log-entries", "8", "--handoff-window", handoffWindow.String())
	cmd.Env = os.Environ()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = s
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	urls := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			s.Write([]byte(line + "\n"))
			if i := strings.Index(line, "http://"); i >= 0 {
				select {
				case urls <- strings.Fields(line[i:])[0]:
				default:
				}
			}
		}
		_ = cmd.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Errorf("tenure admin serve did not stop within 10s of SIGTERM")
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("---- tenure admin serve output ----\n%s", s.output())
		}
	})
	select {
	case s.url = <-urls:
	case <-done:
		t.Fatalf("tenure admin serve exited:\n%s", s.output())
	case <-time.After(30 * time.Second):
		t.Fatalf("tenure admin serve did not say where it serves within 30s:\n%s", s.output())
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	if !strings.HasPrefix(s.url, "http://127.0.0.1:") || !strings.HasSuffix(s.url, "/") {
		t.Fatalf("tenure admin serve serves at %q", s.url)
	}
	return s
}

// browser is headless Chromium driven with the DevTools protocol over
// --remote-debugging-pipe: JSON messages separated by NUL bytes on file
// descriptors 3 (to the browser) and 4 (from it). No WebSocket needed.
type browser struct {
	t       *testing.T
	cmd     *exec.Cmd
	toPipe  io.WriteCloser
	session string
	done    chan struct{}

	mu      sync.Mutex
	nextID  int64
	pending map[int64]chan cdpMessage
	errs    []string
	stderr  bytes.Buffer
}

type cdpMessage struct {
	ID        int64           `json:"id,omitempty"`
	Method    string          `json:"method,omitempty"`
	Params    json.RawMessage `json:"params,omitempty"`
	Result    json.RawMessage `json:"result,omitempty"`
	SessionID string          `json:"sessionId,omitempty"`
	Error     *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error,omitempty"`
}

// pageWidth is the browser's viewport width: the screenshot's.
const pageWidth = 1360

func startBrowser(t *testing.T, chromium string) *browser {
	t.Helper()
	toR, toW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	fromR, fromW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
		"--user-data-dir="+t.TempDir(), "--remote-debugging-pipe", "--hide-scrollbars",
		fmt.Sprintf("--window-size=%d,900", pageWidth), "--force-device-scale-factor=1", "about:blank")
	cmd.ExtraFiles = []*os.File{toR, fromW} // fd 3: what the browser reads; fd 4: what it writes
	// Its own process group: the browser's helpers (renderer, zygote) are
	// ended with it, by its PID.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	b := &browser{t: t, cmd: cmd, toPipe: toW, done: make(chan struct{}), pending: map[int64]chan cdpMessage{}}
	cmd.Stdout, cmd.Stderr = &browserLog{mu: &b.mu, w: &b.stderr}, &browserLog{mu: &b.mu, w: &b.stderr}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting Chromium (%s): %v", chromium, err)
	}
	toR.Close()
	fromW.Close()
	go b.read(fromR)
	t.Cleanup(b.close)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var target struct {
		TargetID string `json:"targetId"`
	}
	if err := b.call(ctx, "", "Target.createTarget", map[string]any{"url": "about:blank"}, &target); err != nil {
		t.Fatalf("Chromium does not answer the DevTools protocol: %v\n%s", err, b.stderrText())
	}
	var attached struct {
		SessionID string `json:"sessionId"`
	}
	if err := b.call(ctx, "", "Target.attachToTarget", map[string]any{"targetId": target.TargetID, "flatten": true}, &attached); err != nil {
		t.Fatal(err)
	}
	b.session = attached.SessionID
	for _, m := range []string{"Page.enable", "Runtime.enable", "Log.enable"} {
		if err := b.call(ctx, b.session, m, nil, nil); err != nil {
			t.Fatalf("%s: %v", m, err)
		}
	}
	if err := b.call(ctx, b.session, "Emulation.setDeviceMetricsOverride",
		map[string]any{"width": pageWidth, "height": 900, "deviceScaleFactor": 1, "mobile": false}, nil); err != nil {
		t.Fatal(err)
	}
	return b
}

type browserLog struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *browserLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.w.Len() < 1<<20 {
		l.w.Write(p)
	}
	return len(p), nil
}

func (b *browser) stderrText() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stderr.String()
}

// read delivers answers to their callers and keeps the page's errors
// (exceptions, console errors, blocked loads).
func (b *browser) read(r io.ReadCloser) {
	defer close(b.done)
	defer r.Close()
	br := bufio.NewReader(r)
	for {
		raw, err := br.ReadBytes(0)
		if err != nil {
			return
		}
		var m cdpMessage
		if json.Unmarshal(bytes.TrimSuffix(raw, []byte{0}), &m) != nil {
			continue
		}
		b.mu.Lock()
		if m.ID != 0 {
			if ch := b.pending[m.ID]; ch != nil {
				ch <- m
				delete(b.pending, m.ID)
			}
		} else {
			switch m.Method {
			case "Runtime.exceptionThrown", "Log.entryAdded", "Runtime.consoleAPICalled":
				s := string(m.Params)
				if m.Method == "Runtime.exceptionThrown" || strings.Contains(s, `"level":"error"`) || strings.Contains(s, `"type":"error"`) {
					b.errs = append(b.errs, m.Method+": "+s)
				}
			}
		}
		b.mu.Unlock()
	}
}

func (b *browser) errors() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.errs...)
}

// call sends one command and waits for its answer (bounded by ctx).
func (b *browser) call(ctx context.Context, session, method string, params, out any) error {
	b.mu.Lock()
	b.nextID++
	id := b.nextID
	ch := make(chan cdpMessage, 1)
	b.pending[id] = ch
	b.mu.Unlock()
	msg := map[string]any{"id": id, "method": method}
	if params != nil {
		msg["params"] = params
	}
	if session != "" {
		msg["sessionId"] = session
	}
	raw, err := json.Marshal(msg)
	if err != nil {
		return err
	}
	if _, err := b.toPipe.Write(append(raw, 0)); err != nil {
		return fmt.Errorf("%s: writing to Chromium: %v", method, err)
	}
	select {
	case m := <-ch:
		if m.Error != nil {
			return fmt.Errorf("%s: %s (%d)", method, m.Error.Message, m.Error.Code)
		}
		if out != nil {
			return json.Unmarshal(m.Result, out)
		}
		return nil
	case <-b.done:
		return fmt.Errorf("%s: Chromium exited\n%s", method, b.stderrText())
	case <-ctx.Done():
		b.mu.Lock()
		delete(b.pending, id)
		b.mu.Unlock()
		return fmt.Errorf("%s: %w", method, ctx.Err())
	}
}

// eval evaluates expr in the page and decodes its value into out.
func (b *browser) eval(ctx context.Context, expr string, out any) {
	b.t.Helper()
	if err := b.evalErr(ctx, expr, out); err != nil {
		b.t.Fatal(err)
	}
}

func (b *browser) evalErr(ctx context.Context, expr string, out any) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var res struct {
		Result struct {
			Value json.RawMessage `json:"value"`
		} `json:"result"`
		ExceptionDetails *struct {
			Text      string `json:"text"`
			Exception struct {
				Description string `json:"description"`
			} `json:"exception"`
		} `json:"exceptionDetails"`
	}
	if err := b.call(ctx, b.session, "Runtime.evaluate", map[string]any{"expression": expr, "returnByValue": true}, &res); err != nil {
		return err
	}
	if d := res.ExceptionDetails; d != nil {
		return fmt.Errorf("evaluating %q: %s %s", expr, d.Text, d.Exception.Description)
	}
	if out != nil {
		return json.Unmarshal(res.Result.Value, out)
	}
	return nil
}

// navigate loads url and waits until the document is complete.
func (b *browser) navigate(ctx context.Context, url string) {
	b.t.Helper()
	var nav struct {
		ErrorText string `json:"errorText"`
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := b.call(cctx, b.session, "Page.navigate", map[string]any{"url": url}, &nav); err != nil || nav.ErrorText != "" {
		b.t.Fatalf("loading %s: %v %s", url, err, nav.ErrorText)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var ready string
		if err := b.evalErr(ctx, `document.readyState`, &ready); err == nil && ready == "complete" {
			return
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("%s did not finish loading within 30s", url)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// pageState is what the test reads of the page.
type pageState struct {
	Rows []struct {
		Topic     string `json:"topic"`
		Partition int    `json:"partition"`
		State     string `json:"state"`
		Owner     string `json:"owner"`
		Member    string `json:"member"`
		Class     string `json:"cls"`
	} `json:"rows"`
	Text      string `json:"text"`
	HTML      string `json:"html"`
	Refreshes int    `json:"refreshes"`
	Loaded    int    `json:"loaded"`
	Generated string `json:"generated"`
}

const readPage = `(() => {
	const rows = [...document.querySelectorAll("tr.part")].map(r => ({topic: r.dataset.topic, partition: +r.dataset.partition,
		state: r.dataset.state, owner: r.dataset.owner, member: r.dataset.member, cls: r.className}));
	const snap = document.querySelector(".snapshot");
	return {rows, text: document.body.innerText, html: document.documentElement.outerHTML,
		refreshes: +(document.body.dataset.refreshes || 0), loaded: window.__tenureLoaded || 0,
		generated: snap ? snap.dataset.generated : ""};
})()`

func (b *browser) state(ctx context.Context) pageState {
	b.t.Helper()
	var s pageState
	b.eval(ctx, readPage, &s)
	return s
}

// waitPage re-reads the page (never reloading it) until cond holds.
func (b *browser) waitPage(ctx context.Context, timeout time.Duration, what string, cond func(pageState) bool) {
	b.t.Helper()
	deadline := time.Now().Add(timeout)
	var last pageState
	for {
		last = b.state(ctx)
		if cond(last) {
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			b.t.Fatalf("timed out after %s waiting for %s; the page (read at %s, %d refreshes) says:\n%s",
				timeout, what, last.Generated, last.Refreshes, last.Text)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// screenshot is a PNG of the whole page.
func (b *browser) screenshot(ctx context.Context) []byte {
	b.t.Helper()
	var height int
	b.eval(ctx, `Math.ceil(document.documentElement.scrollHeight)`, &height)
	height = min(max(height, 400), 6000)
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := b.call(cctx, b.session, "Emulation.setDeviceMetricsOverride",
		map[string]any{"width": pageWidth, "height": height, "deviceScaleFactor": 1, "mobile": false}, nil); err != nil {
		b.t.Fatal(err)
	}
	var shot struct {
		Data string `json:"data"`
	}
	if err := b.call(cctx, b.session, "Page.captureScreenshot", map[string]any{"format": "png"}, &shot); err != nil {
		b.t.Fatal(err)
	}
	png, err := base64.StdEncoding.DecodeString(shot.Data)
	if err != nil {
		b.t.Fatal(err)
	}
	return png
}

// close asks the browser to quit, then ends its process group (the
// browser's own PID) if it has not.
func (b *browser) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = b.call(ctx, "", "Browser.close", nil, nil)
	b.toPipe.Close()
	exited := make(chan error, 1)
	go func() { exited <- b.cmd.Wait() }()
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-b.cmd.Process.Pid, syscall.SIGKILL)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			b.t.Errorf("Chromium (pid %d) did not exit after SIGKILL", b.cmd.Process.Pid)
		}
	}
	// Helpers left in its process group, if any.
	if err := syscall.Kill(-b.cmd.Process.Pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		b.t.Logf("ending Chromium's process group %d: %v", b.cmd.Process.Pid, err)
	}
}
