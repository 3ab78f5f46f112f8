package ownership

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenure-dev/tenure/sink"
)

const secret = "s3cret-pw-91ab"

// testServer serves a fixed snapshot: no database is asked (the pool never
// connects).
func testServer(t *testing.T, schema string, snap Snapshot, loopbackOnly bool) (*Server, Config) {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), "postgres://127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := sink.NewStore(pool, schema)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Store: store, Brokers: []string{"k1:9092", "k2:9092"},
		Redact: func(s string) string { return strings.ReplaceAll(s, secret, "[redacted]") }}
	s := NewServer(cfg, ServerConfig{Refresh: time.Hour, LoopbackOnly: loopbackOnly})
	s.last, s.at = snap, time.Now()
	return s, s.cfg
}

func get(t *testing.T, h http.Handler, method, target, host string) (*http.Response, string) {
	t.Helper()
	req := httptest.NewRequest(method, target, nil)
	if host == "" {
		host = "127.0.0.1:8080"
	}
	req.Host = host
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	res := rec.Result()
	b, _ := io.ReadAll(res.Body)
	return res, string(b)
}

func hostileSnapshot() Snapshot {
	lag, next := int64(3), int64(7)
	return Snapshot{GeneratedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Schema: "tenure", HandoffWindowSeconds: 60,
		CommandNote: "note",
		Groups: []Group{{Name: `<script>alert("g")</script>`,
			Partitions: []Partition{{Topic: "t", Partition: 1, Member: `m"><img src=x onerror=alert(1)>`, Owner: "o",
				NextOffset: &next, Lag: &lag, State: "handler-bug", Held: true,
				Holds: []Hold{{Kind: "handler-bug", NeedsAck: true, Reason: "password " + secret + " in an error </td>",
					Command: "tenure admin holds acknowledge --group 'a b' --topic t --partition 1"}},
				Handoff: &Handoff{From: "old", To: "o", Ago: 5}}},
			Claims:      []Claim{{Kind: "claim", Topic: "t", Owner: "<b>x</b>", Fenced: "old", FencedToken: "1.2"}},
			DeadLetters: DeadLetterSummary{Dead: 1, Total: 1, Newest: []DeadLetter{{ID: 1, Job: "t/1/5", Error: "<iframe>"}}}}}}
}

// Everything shown is escaped, no secret is shown, and the page carries the
// headers of a read-only page that runs only its own script.
func TestPageEscapesAndRedacts(t *testing.T) {
	s, _ := testServer(t, "tenure", hostileSnapshot(), true)
	for _, path := range []string{"/", "/fragment", "/api/ownership"} {
		res, body := get(t, s, http.MethodGet, path, "127.0.0.1:8080")
		if res.StatusCode != 200 {
			t.Fatalf("%s: %d %s", path, res.StatusCode, body)
		}
		for _, bad := range []string{"<script>alert", "<img src=x", "<iframe>", "<b>x</b>", secret} {
			if strings.Contains(body, bad) {
				t.Errorf("%s carries %q", path, bad)
			}
		}
		if path != "/api/ownership" {
			for _, want := range []string{"&lt;script&gt;", "handler-bug", "hand-off 5s ago", "[redacted]", "tenure admin holds acknowledge --group &#39;a b&#39;"} {
				if !strings.Contains(body, want) {
					t.Errorf("%s lacks %q:\n%s", path, want, body)
				}
			}
		}
		if csp := res.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "default-src 'none'") {
			t.Errorf("%s: Content-Security-Policy %q", path, csp)
		}
		if res.Header.Get("Cache-Control") != "no-store" {
			t.Errorf("%s: Cache-Control %q", path, res.Header.Get("Cache-Control"))
		}
	}
	_, page := get(t, s, http.MethodGet, "/", "")
	if !strings.Contains(page, `<script src="/static/ownership.js" defer></script>`) || strings.Count(page, "<script") != 1 {
		t.Errorf("the page should have exactly one script, its own file:\n%s", page)
	}
	_, js := get(t, s, http.MethodGet, "/static/ownership.js", "")
	if !strings.Contains(js, `fetch("/fragment"`) {
		t.Errorf("the script does not fetch the fragment")
	}
}

// A loopback page answers only to loopback names (no DNS rebinding), and
// only GET and HEAD.
func TestPageRefusals(t *testing.T) {
	s, _ := testServer(t, "tenure", hostileSnapshot(), true)
	for host, want := range map[string]int{"127.0.0.1:8080": 200, "localhost:8080": 200, "[::1]:8080": 200, "127.0.0.2": 200,
		"evil.example:8080": http.StatusMisdirectedRequest, "10.0.0.1:8080": http.StatusMisdirectedRequest, "localhost.evil.example": http.StatusMisdirectedRequest} {
		if res, body := get(t, s, http.MethodGet, "/", host); res.StatusCode != want {
			t.Errorf("Host %s: %d, want %d (%s)", host, res.StatusCode, want, body)
		}
	}
	if res, _ := get(t, s, http.MethodPost, "/", "127.0.0.1"); res.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d", res.StatusCode)
	}
	if res, _ := get(t, s, http.MethodGet, "/nothing", "127.0.0.1"); res.StatusCode != http.StatusNotFound {
		t.Errorf("/nothing: %d", res.StatusCode)
	}
	open, _ := testServer(t, "tenure", hostileSnapshot(), false)
	if res, _ := get(t, open, http.MethodGet, "/", "tenure.internal:8080"); res.StatusCode != 200 {
		t.Errorf("--listen-any: Host tenure.internal: %d", res.StatusCode)
	}
}

// A snapshot that could not be read is a 503 for scripts, and the page
// says why.
func TestPageError(t *testing.T) {
	s, _ := testServer(t, "tenure", Snapshot{Schema: "tenure", Error: "reading the database: no answer " + secret}, true)
	res, body := get(t, s, http.MethodGet, "/api/ownership", "")
	var snap Snapshot
	if res.StatusCode != http.StatusServiceUnavailable || json.Unmarshal([]byte(body), &snap) != nil || !strings.Contains(snap.Error, "no answer [redacted]") {
		t.Errorf("/api/ownership: %d %s", res.StatusCode, body)
	}
	if _, page := get(t, s, http.MethodGet, "/", ""); !strings.Contains(page, `<p class="error">reading the database: no answer [redacted]</p>`) {
		t.Errorf("the page does not say why:\n%s", page)
	}
}

// The suggested commands are exact: quoted for a shell, with --schema when
// it is not the default, and the brokers and TLS/SASL flags when the
// command reads the log.
func TestCommands(t *testing.T) {
	_, cfg := testServer(t, "app_fences", Snapshot{}, true)
	cfg.KafkaArgs = []string{"--tls-ca-file", "/etc/ca.pem", "--sasl-mechanism", "scram-sha-512", "--sasl-username", "tenure"}
	p := sink.Partition{Group: "billing run's", Topic: "jobs", Partition: 3}
	for kind, want := range map[sink.HoldKind]string{
		sink.HoldHandlerBug: `tenure admin holds acknowledge --group 'billing run'\''s' --topic jobs --partition 3 --schema app_fences`,
		sink.HoldLogTruncated: `tenure admin holds acknowledge --group 'billing run'\''s' --topic jobs --partition 3 --schema app_fences ` +
			`--brokers k1:9092,k2:9092 --tls-ca-file /etc/ca.pem --sasl-mechanism scram-sha-512 --sasl-username tenure`,
		"partition-count": `tenure admin topic acknowledge-partitions --group 'billing run'\''s' --topic jobs --schema app_fences ` +
			`--brokers k1:9092,k2:9092 --tls-ca-file /etc/ca.pem --sasl-mechanism scram-sha-512 --sasl-username tenure`,
		sink.HoldStalled: "",
	} {
		h := holdOf(cfg, p.Group, sink.Hold{Partition: p, Kind: kind}, time.Now())
		if h.Command != want {
			t.Errorf("%s:\n got %s\nwant %s", kind, h.Command, want)
		}
		if h.Resolution == "" {
			t.Errorf("%s: no resolution", kind)
		}
	}
	if got := shellQuote(""); got != "''" {
		t.Errorf("shellQuote(\"\") = %s", got)
	}
}

// Text from the database or the coordinator cannot break lines or reorder
// the page: control and invisible characters are escaped.
func TestText(t *testing.T) {
	cfg := Config{}.withDefaults()
	if got, want := text(cfg, "a\x1b[31mb\u202ec\nd é"), `a\x1b[31mb\u202ec\nd é`; got != want {
		t.Errorf("text = %q, want %q", got, want)
	}
}

// A partition with jobs waiting that makes no progress stands out: its
// state with how long, its reason on a line of its own, and the group's
// count; a hold's reason is not said twice.
func TestPageShowsStuckPartitions(t *testing.T) {
	since := time.Date(2026, 1, 2, 3, 3, 23, 0, time.UTC)
	lag, zero, forSec := int64(12), int64(0), int64(42)
	reason := "owner m1 silent for 42 s (no heartbeat for 42 s); 12 jobs waiting"
	snap := Snapshot{GeneratedAt: since.Add(42 * time.Second), Schema: "tenure", CommandNote: "note",
		Groups: []Group{{Name: "g", Summary: Summary{Partitions: 2, Stuck: 1, Lag: 12},
			Partitions: []Partition{
				{Topic: "t", Partition: 0, Member: "m1", Owner: "m1", Lag: &lag, State: "owner-silent", Reason: reason,
					Since: &since, For: &forSec, Stuck: true, ShowReason: true},
				{Topic: "t", Partition: 1, Member: "m2", Owner: "m2", Lag: &zero, State: "ok"},
			}}}}
	s, _ := testServer(t, "tenure", snap, true)
	_, body := get(t, s, http.MethodGet, "/fragment", "")
	for _, want := range []string{
		`<span class="state s-stuck">owner-silent</span><div class="small">for 42s</div>`,
		`<b>owner-silent</b> since 03:03:23 (42s): <span class="reason">` + reason,
		`<span class="count stuck">1 with jobs waiting not progressing</span>`,
		`class="part stuck"`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("the page lacks %q:\n%s", want, body)
		}
	}
	if strings.Count(body, "s-stuck") != 1 || !strings.Contains(body, `<span class="state s-ok">ok</span></td>`) {
		t.Errorf("only partition 0 is stuck:\n%s", body)
	}
}
