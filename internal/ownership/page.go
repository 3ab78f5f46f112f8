package ownership

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"html/template"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// The page: / is the whole page, /fragment its live part (what the page's
// script fetches every Refresh and swaps in), /api/ownership the snapshot
// as JSON, /static/* the script and the style sheet. Everything is
// rendered by html/template (escaped); the script only fetches the
// fragment. Without JavaScript a <noscript> meta refresh reloads the page.

//go:embed static/ownership.js
var pageJS []byte

//go:embed static/ownership.css
var pageCSS []byte

//go:embed static/favicon.svg
var favicon []byte

// Server serves the page.
type Server struct {
	cfg Config
	// Refresh is how often the page fetches its live part.
	refresh time.Duration
	// timeout bounds one snapshot.
	timeout time.Duration
	// hostOK says whether a request's Host header is acceptable (nil: any).
	hostOK func(host string) bool

	mu   sync.Mutex
	last Snapshot
	at   time.Time
}

// ServerConfig is what NewServer takes besides the data's Config.
type ServerConfig struct {
	// Refresh: how often the page re-reads its data (default 2s).
	Refresh time.Duration
	// Timeout bounds the reads of one snapshot (default 15s).
	Timeout time.Duration
	// LoopbackOnly refuses requests whose Host header is not a loopback
	// address or localhost: a page bound to loopback is not to be read
	// through a DNS name that a web page rebinds to 127.0.0.1.
	LoopbackOnly bool
}

// NewServer returns the page's handler.
func NewServer(cfg Config, sc ServerConfig) *Server {
	if sc.Refresh <= 0 {
		sc.Refresh = 2 * time.Second
	}
	if sc.Timeout <= 0 {
		sc.Timeout = 15 * time.Second
	}
	s := &Server{cfg: cfg.withDefaults(), refresh: sc.Refresh, timeout: sc.Timeout}
	if sc.LoopbackOnly {
		s.hostOK = LoopbackHost
	}
	return s
}

// LoopbackHost reports whether host (a Host header: name or address, with
// or without a port) is localhost or a loopback address.
func LoopbackHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// snapshot returns a snapshot at most half a refresh old: viewers share
// one read of the database and the coordinator.
func (s *Server) snapshot(ctx context.Context) Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.at.IsZero() && time.Since(s.at) < min(s.refresh/2, time.Second) {
		return s.last
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	s.last, s.at = Collect(ctx, s.cfg), time.Now()
	return s.last
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		h.Set("Allow", "GET, HEAD")
		http.Error(w, "read-only: GET and HEAD only", http.StatusMethodNotAllowed)
		return
	}
	if s.hostOK != nil && !s.hostOK(r.Host) {
		http.Error(w, "this page answers only to localhost or a loopback address (tenure admin serve --listen-any serves other names)", http.StatusMisdirectedRequest)
		return
	}
	switch r.URL.Path {
	case "/":
		s.page(w, r, pageTmpl)
	case "/fragment":
		s.page(w, r, fragmentTmpl)
	case "/api/ownership":
		snap := s.snapshot(r.Context())
		b, err := json.MarshalIndent(snap, "", "  ")
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		h.Set("Content-Type", "application/json; charset=utf-8")
		if snap.Error != "" {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_, _ = w.Write(s.redactBytes(append(b, '\n')))
	case "/static/ownership.js":
		h.Set("Content-Type", "text/javascript; charset=utf-8")
		_, _ = w.Write(pageJS)
	case "/static/ownership.css":
		h.Set("Content-Type", "text/css; charset=utf-8")
		_, _ = w.Write(pageCSS)
	case "/static/favicon.svg", "/favicon.ico":
		h.Set("Content-Type", "image/svg+xml")
		_, _ = w.Write(favicon)
	default:
		http.NotFound(w, r)
	}
}

// redactBytes is the last line: whatever was not redacted where it was
// read is redacted in the answer as a whole.
func (s *Server) redactBytes(b []byte) []byte { return []byte(s.cfg.Redact(string(b))) }

func (s *Server) page(w http.ResponseWriter, r *http.Request, t *template.Template) {
	snap := s.snapshot(r.Context())
	var buf bytes.Buffer
	if err := t.Execute(&buf, view{Snapshot: snap, RefreshMS: s.refresh.Milliseconds()}); err != nil {
		http.Error(w, "rendering the page: "+s.cfg.Redact(err.Error()), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = w.Write(s.redactBytes(buf.Bytes()))
}

// view is what the templates get.
type view struct {
	Snapshot
	RefreshMS int64
}

// duration renders whole seconds: "42s", "3m10s", "2h05m", "3d".
func duration(sec int64) string {
	d := time.Duration(sec) * time.Second
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", sec)
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", sec/60, sec%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", sec/3600, sec%3600/60)
	}
	return fmt.Sprintf("%dd", sec/86400)
}

var funcs = template.FuncMap{
	"ago":      func(sec int64) string { return duration(sec) + " ago" },
	"duration": duration,
	"clock":    func(t time.Time) string { return t.UTC().Format("15:04:05") },
	"stamp":    func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000Z") },
	"i32": func(p *int32) string {
		if p == nil {
			return "–"
		}
		return fmt.Sprint(*p)
	},
	"i64": func(p *int64) string {
		if p == nil {
			return "–"
		}
		return fmt.Sprint(*p)
	},
	"deref": func(p *int64) int64 { return *p },
	"plural": func(n any, word string) string {
		if fmt.Sprint(n) == "1" {
			return "1 " + word
		}
		return fmt.Sprint(n) + " " + word + "s"
	},
	"dash": func(s string) string {
		if s == "" {
			return "–"
		}
		return s
	},
	"rowClass": func(p Partition) string {
		var c []string
		if p.Held {
			c = append(c, "held")
		}
		if p.Stalled {
			c = append(c, "stalled")
		}
		if p.Handoff != nil {
			c = append(c, "handoff")
		}
		if p.Stuck {
			c = append(c, "stuck")
		} else if p.Transition {
			c = append(c, "transition")
		}
		return strings.Join(c, " ")
	},
	"stateClass": func(p Partition) string {
		switch p.State {
		case "ok":
			return "s-ok"
		case "stalled":
			return "s-stalled"
		case "owner-silent", "not-progressing":
			return "s-stuck"
		case "stale-owner", "claim-pending", "rebalancing":
			return "s-transition"
		case "unowned", "unknown":
			if p.Stuck {
				return "s-stuck"
			}
			return "s-idle"
		}
		return "s-held"
	},
}

var pageTmpl = template.Must(template.New("page").Funcs(funcs).Parse(pageHTML))
var fragmentTmpl = template.Must(template.Must(pageTmpl.Clone()).Parse(`{{template "live" .}}`))

const pageHTML = `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>tenure: partition ownership</title>
<link rel="stylesheet" href="/static/ownership.css">
<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">
<noscript><meta http-equiv="refresh" content="5"></noscript>
<script src="/static/ownership.js" defer></script>
</head>
<body data-refresh-ms="{{.RefreshMS}}">
<header>
<h1>tenure <span class="sub">partition ownership</span></h1>
<p class="meta">schema <b>{{.Schema}}</b> · {{if .Group}}group <b>{{.Group}}</b>{{else}}every group with fencing rows{{end}} ·
<span id="status" class="ok">live: refreshes every {{.RefreshMS}} ms</span></p>
<p class="legend"><span class="key handoff">hand-off: owner changed in the last {{.HandoffWindowSeconds}}s</span>
<span class="key held">held: waits for an operator</span>
<span class="key stalled">stalled: the worker recovers by itself</span>
<span class="key transition">the coordinator and Postgres do not agree yet</span>
<span class="key stuck">jobs waiting, no progress: no owner, a silent owner, or no commit</span></p>
</header>
<main id="live">{{template "live" .}}</main>
<footer>Read-only. The coordinator is Kafka's group coordinator (who is assigned the partition, at which epoch);
Postgres is the fencing row (the token a commit must carry, the owner that claimed it, the next offset). JSON: <a href="/api/ownership">/api/ownership</a>.</footer>
</body>
</html>
{{define "live"}}<div class="snapshot" data-generated="{{stamp .GeneratedAt}}">
<p class="generated">read at <time datetime="{{stamp .GeneratedAt}}">{{stamp .GeneratedAt}}</time> (database clock)</p>
{{if .Error}}<p class="error">{{.Error}}</p>{{end}}
{{if and (not .Error) (not .Groups)}}<p class="empty">No fencing rows in schema {{.Schema}}: no group has claimed a partition yet.</p>{{end}}
{{range .Groups}}{{template "group" .}}{{end}}
<p class="note">{{.CommandNote}}</p>
</div>{{end}}
{{define "group"}}<section class="group" data-group="{{.Name}}">
<h2>group <span class="name">{{.Name}}</span></h2>
<p class="summary">{{plural .Summary.Partitions "partition"}} ·
<span class="{{if .Summary.Handoffs}}count handoff{{end}}">{{plural .Summary.Handoffs "hand-off"}}</span> ·
<span class="{{if .Summary.Held}}count held{{end}}">{{.Summary.Held}} held</span> ·
<span class="{{if .Summary.Stalled}}count stalled{{end}}">{{.Summary.Stalled}} stalled</span> ·
<span class="{{if .Summary.Stuck}}count stuck{{end}}">{{.Summary.Stuck}} with jobs waiting not progressing</span> ·
lag {{.Summary.Lag}} · <span class="{{if .DeadLetters.Dead}}count held{{end}}">{{plural .DeadLetters.Dead "dead letter"}}</span></p>
{{if .Error}}<p class="error">{{.Error}}</p>{{end}}
{{if .CoordinatorError}}<p class="error">{{.CoordinatorError}}</p>{{end}}
<table class="partitions">
<thead><tr><th rowspan="2">partition</th><th colspan="2" class="side">coordinator (Kafka)</th><th colspan="2" class="side">fencing row (Postgres)</th>
<th rowspan="2" class="num">next offset</th><th rowspan="2" class="num">lag</th><th rowspan="2">state</th></tr>
<tr><th>member</th><th class="num">epoch</th><th>owner</th><th>token</th></tr></thead>
<tbody>
{{range .Partitions}}<tr class="part {{rowClass .}}" data-topic="{{.Topic}}" data-partition="{{.Partition}}" data-state="{{.State}}" data-owner="{{.Owner}}" data-member="{{.Member}}">
<td class="tp">{{.Topic}}/<b>{{.Partition}}</b></td>
<td class="id">{{dash .Member}}{{if .Host}}<div class="small">{{.Host}}</div>{{end}}</td>
<td class="num">{{i32 .Epoch}}</td>
<td class="id">{{dash .Owner}}{{if .ClaimedAgo}}<div class="small">claimed {{ago (deref .ClaimedAgo)}}</div>{{end}}</td>
<td class="tok">{{dash .Token}}</td>
<td class="num">{{i64 .NextOffset}}</td>
<td class="num">{{i64 .Lag}}</td>
<td><span class="state {{stateClass .}}">{{.State}}</span>{{if .For}}<div class="small">for {{duration (deref .For)}}</div>{{end}}</td>
</tr>
{{if .Handoff}}<tr class="detail handoff"><td></td><td colspan="7"><b>hand-off {{ago .Handoff.Ago}}</b> ({{clock .Handoff.At}}): from <span class="id">{{.Handoff.From}}</span> (token {{.Handoff.FromToken}}) to <span class="id">{{.Handoff.To}}</span> (token {{.Handoff.Token}}); Postgres rejects the old owner's commits from the claim on</td></tr>{{end}}
{{range .Holds}}<tr class="detail {{if .NeedsAck}}held{{else}}stalled{{end}}"><td></td><td colspan="7"><b>{{.Kind}}</b> since {{clock .Since}} ({{ago .Ago}}): <span class="reason">{{.Reason}}</span>
{{if .Command}}<div class="cmd"><span class="small">resolve with</span> <code>{{.Command}}</code></div>{{end}}<div class="small">{{.Resolution}}</div></td></tr>{{end}}
{{if .ShowReason}}<tr class="detail {{rowClass .}}"><td></td><td colspan="7"><b>{{.State}}</b>{{if .Since}} since {{clock .Since}}{{end}}{{if .For}} ({{duration (deref .For)}}){{end}}: <span class="reason">{{.Reason}}</span></td></tr>{{end}}
{{else}}<tr><td colspan="8" class="empty">no partitions: the coordinator assigns none and Postgres has no fencing rows</td></tr>
{{end}}</tbody></table>
<div class="columns">
<div class="col">
<h3>recent claims (fence log)</h3>
<table class="claims"><thead><tr><th>at</th><th>partition</th><th>token</th><th>claimed by</th><th>fenced</th></tr></thead><tbody>
{{range .Claims}}<tr class="{{if .Fenced}}took{{end}}"><td title="{{stamp .At}}">{{clock .At}} <span class="small">{{ago .Ago}}</span></td>
<td>{{.Topic}}/{{.Partition}}</td><td class="tok">{{.Token}}</td>
{{if eq .Kind "reset"}}<td colspan="2">reset by {{.Owner}}: offset {{.From}} → {{.To}}</td>{{else}}<td class="id">{{.Owner}} <span class="small">from offset {{.From}}</span></td>
<td class="id">{{if .Fenced}}{{.Fenced}} <span class="small">(token {{.FencedToken}}): its commits are now rejected</span>{{else}}<span class="small">–</span>{{end}}</td>{{end}}</tr>
{{else}}<tr><td colspan="5" class="empty">no claims in the fence log</td></tr>{{end}}
</tbody></table>
<p class="note">{{.ClaimsNote}}</p>
</div>
<div class="col">
<h3>dead letters: {{.DeadLetters.Dead}} dead <span class="small">({{.DeadLetters.Total}} in all)</span></h3>
<table class="dlq"><thead><tr><th>id</th><th>job</th><th>status</th><th>error</th><th>at</th></tr></thead><tbody>
{{range .DeadLetters.Newest}}<tr><td class="num">{{.ID}}</td><td class="tok">{{.Job}}</td><td>{{.Status}}</td><td class="err">{{.Error}} <span class="small">({{.Attempts}} attempts)</span></td><td title="{{stamp .DeadAt}}">{{ago .Ago}}</td></tr>
{{else}}<tr><td colspan="5" class="empty">none</td></tr>{{end}}
</tbody></table>
<p class="note">tenure admin dlq list / show / replay / discard</p>
</div>
</div>
</section>{{end}}`
