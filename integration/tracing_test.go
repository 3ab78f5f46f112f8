package integration

import (
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"

	"github.com/tenure-dev/tenure/consumer"
)

// otlpSpan is a span as an OTLP/HTTP receiver decoded it.
type otlpSpan struct {
	service, scope        string
	trace, id, parent     string
	name, kind            string
	attrs                 map[string]string
	status, statusMessage string
	events                []otlpEvent
	links                 []otlpLink
	start                 time.Time
}

type otlpEvent struct {
	name  string
	attrs map[string]string
}

type otlpLink struct {
	trace, span string
	attrs       map[string]string
}

// receiver is a small OTLP/HTTP trace receiver: POST /v1/traces, protobuf
// (gzip or not), decoded with the collector's pdata.
type receiver struct {
	srv *httptest.Server

	mu    sync.Mutex
	spans []otlpSpan
	posts int
}

func newReceiver(t *testing.T) *receiver {
	t.Helper()
	r := &receiver{}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" {
		http.Error(w, "not an OTLP traces request", http.StatusNotFound)
		return
	}
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		gz, err := gzip.NewReader(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = gz
	}
	data, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if ct := req.Header.Get("Content-Type"); ct != "application/x-protobuf" {
		http.Error(w, "content type "+ct+", want application/x-protobuf", http.StatusUnsupportedMediaType)
		return
	}
	exp := ptraceotlp.NewExportRequest()
	if err := exp.UnmarshalProto(data); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.add(exp.Traces())
	resp, _ := ptraceotlp.NewExportResponse().MarshalProto()
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(resp)
}

func attrMap(m pcommon.Map) map[string]string {
	out := map[string]string{}
	m.Range(func(k string, v pcommon.Value) bool {
		out[k] = v.AsString()
		return true
	})
	return out
}

func (r *receiver) add(td ptrace.Traces) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.posts++
	for _, rs := range td.ResourceSpans().All() {
		svc, _ := rs.Resource().Attributes().Get("service.name")
		for _, ss := range rs.ScopeSpans().All() {
			for _, sp := range ss.Spans().All() {
				s := otlpSpan{service: svc.AsString(), scope: ss.Scope().Name(),
					trace: sp.TraceID().String(), id: sp.SpanID().String(), parent: sp.ParentSpanID().String(),
					name: sp.Name(), kind: sp.Kind().String(), attrs: attrMap(sp.Attributes()),
					status: sp.Status().Code().String(), statusMessage: sp.Status().Message(),
					start: sp.StartTimestamp().AsTime()}
				for _, ev := range sp.Events().All() {
					s.events = append(s.events, otlpEvent{name: ev.Name(), attrs: attrMap(ev.Attributes())})
				}
				for _, l := range sp.Links().All() {
					s.links = append(s.links, otlpLink{trace: l.TraceID().String(), span: l.SpanID().String(), attrs: attrMap(l.Attributes())})
				}
				r.spans = append(r.spans, s)
			}
		}
	}
}

func (r *receiver) all() []otlpSpan {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := append([]otlpSpan(nil), r.spans...)
	sort.Slice(out, func(i, j int) bool { return out[i].start.Before(out[j].start) })
	return out
}

func (r *receiver) find(pred func(otlpSpan) bool) []otlpSpan {
	var out []otlpSpan
	for _, s := range r.all() {
		if pred(s) {
			out = append(out, s)
		}
	}
	return out
}

func (r *receiver) children(parent otlpSpan) []otlpSpan {
	return r.find(func(s otlpSpan) bool { return s.trace == parent.trace && s.parent == parent.id })
}

func (r *receiver) child(t *testing.T, parent otlpSpan, name string) otlpSpan {
	t.Helper()
	var names []string
	for _, c := range r.children(parent) {
		if c.name == name {
			return c
		}
		names = append(names, c.name)
	}
	t.Fatalf("span %s (%s) has no child %q: its children are %v", parent.name, parent.id, name, names)
	return otlpSpan{}
}

// tree renders the spans under root as the receiver decoded them.
func (r *receiver) tree(root otlpSpan) string {
	var sb strings.Builder
	var walk func(s otlpSpan, depth int)
	walk = func(s otlpSpan, depth int) {
		fmt.Fprintf(&sb, "%s%s [%s %s", strings.Repeat("  ", depth), s.name, s.service, strings.TrimPrefix(s.kind, "Span"))
		for _, k := range []string{"tenure.outcome", "tenure.from", "tenure.to", "tenure.token", "tenure.attempt", "messaging.batch.message_count", "tenure.linked_jobs"} {
			if v, ok := s.attrs[k]; ok {
				fmt.Fprintf(&sb, " %s=%s", k, v)
			}
		}
		if s.status == "Error" {
			fmt.Fprintf(&sb, " status=Error")
		}
		sb.WriteString("]")
		for _, ev := range s.events {
			if ev.name != "exception" {
				fmt.Fprintf(&sb, " event %s %v", ev.name, ev.attrs)
			}
		}
		if len(s.links) > 0 {
			fmt.Fprintf(&sb, " links=%d", len(s.links))
		}
		sb.WriteByte('\n')
		for _, c := range r.children(s) {
			walk(c, depth+1)
		}
	}
	walk(root, 0)
	return sb.String()
}

// withEnv runs the tenure binary with extra environment variables, through
// env(1): it execs tenure, so the process (and its PID, which the tests
// signal) is tenure's.
func withEnv(vars []string) func(args []string) *exec.Cmd {
	return func(args []string) *exec.Cmd {
		return exec.Command("env", append(append(vars, tenureBin), args...)...)
	}
}

// A job's trace from `tenure produce` to the fenced commit, with real
// processes exporting to a real OTLP/HTTP endpoint: each job's publish span
// (kotel, in tenure produce), the batch span of the worker that committed
// it, linked to it, with the handler, BEGIN and the fence statement with
// COMMIT (one span, one round trip) under it; and a zombie's batch: worker A
// takes the jobs and is frozen (SIGSTOP) inside its transaction, just
// before the fenced commit, past its session timeout; B takes the
// partition and commits them; A resumes, the fence rejects its commit, and
// A's batch span says so (outcome fenced, status error, the fenced event
// naming B).
func TestTracingFromProduceToFencedCommit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	rcv := newReceiver(t)
	otel := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + rcv.srv.URL, "OTEL_BSP_SCHEDULE_DELAY=100"}

	code, out := runTenure(t, otel, "produce", "--brokers", strings.Join(e.brokers, ","), "--topic", e.topic, "--generate", "5", "--key-count", "5")
	if code != 0 {
		t.Fatalf("tenure produce: exit %d\n%s", code, out)
	}
	// tenure produce exports what it traced before it exits.
	publish := rcv.find(func(s otlpSpan) bool { return s.name == e.topic+" publish" })
	if len(publish) != 5 {
		t.Fatalf("%d publish spans received after tenure produce exited, want 5: %v", len(publish), rcv.all())
	}
	for _, p := range publish {
		if p.service != "tenure-produce" || p.kind != "Producer" || p.parent != "" {
			t.Errorf("publish span: service %q kind %q parent %q, want a tenure-produce producer root", p.service, p.kind, p.parent)
		}
	}

	// A takes the jobs and holds just before its commit. The noop handler
	// takes no row locks, so that B never waits on A's transaction: what
	// decides A's commit is the fence alone.
	a := e.startWorkerCmd("A", withEnv(otel), "--handler", "noop", "--hold-once", "before-commit")
	held := a.waitLog(30*time.Second, map[string]any{"msg": "holding", "point": "before-commit"})
	b := e.startWorkerCmd("B", withEnv(otel))
	b.waitLog(30*time.Second, map[string]any{"msg": "worker starting"})
	waitForMembers(t, e, 2)
	a.pause()
	t.Logf("A frozen before committing [%v,%v) with token %v", held["from"], held["to"], held["token"])
	b.waitLog(30*time.Second, map[string]any{"msg": consumer.MsgClaimed})
	waitCommitted(t, e, 0, 5, "B")
	a.resume()
	a.waitLogAny(30*time.Second, rejected, batchCommitted)
	if a.findLog(rejected) == nil {
		t.Fatalf("A's late batch was not rejected")
	}

	batchOf := func(outcome, worker string) func(otlpSpan) bool {
		return func(s otlpSpan) bool {
			return s.name == consumer.SpanBatch && s.attrs["tenure.outcome"] == outcome && strings.HasPrefix(s.attrs["tenure.member"], "tenure-"+worker+"-")
		}
	}
	waitFor(t, 30*time.Second, "B's committed batch spans and A's fenced one", func() bool {
		return len(rcv.find(batchOf(consumer.OutcomeCommitted, "B"))) > 0 && len(rcv.find(batchOf(consumer.OutcomeFenced, "A"))) > 0
	})
	b.stop(30 * time.Second)
	a.stop(30 * time.Second)

	committed := rcv.find(batchOf(consumer.OutcomeCommitted, "B"))
	zombie := rcv.find(batchOf(consumer.OutcomeFenced, "A"))
	if len(zombie) != 1 {
		t.Fatalf("%d fenced batch spans of A, want 1", len(zombie))
	}
	// Every job's publish span is linked from B's committed batch and from
	// A's fenced one (it held the same records).
	t.Run("Links", func(t *testing.T) {
		linkedFrom := func(batches []otlpSpan, p otlpSpan) *otlpSpan {
			for i, bs := range batches {
				for _, l := range bs.links {
					if l.trace == p.trace && l.span == p.id {
						return &batches[i]
					}
				}
			}
			return nil
		}
		for i, p := range publish {
			bs := linkedFrom(committed, p)
			if i == 0 && bs != nil {
				t.Logf("a job's trace: %s %s [%s %s, trace %s, span %s, offset %s], linked from the batch span %s of trace %s",
					p.name, p.scope, p.service, p.kind, p.trace, p.id, p.attrs["messaging.kafka.message.offset"], bs.id, bs.trace)
			}
			if bs == nil {
				t.Errorf("publish span %s (offset %s) is linked from none of B's committed batches", p.id, p.attrs["messaging.kafka.message.offset"])
				continue
			}
			if bs.trace == p.trace {
				t.Errorf("the batch span is in the producer's trace: it must be a root of its own, linked")
			}
			if linkedFrom(zombie, p) == nil {
				t.Errorf("publish span %s is not linked from A's fenced batch", p.id)
			}
		}
	})
	t.Run("CommittedBatch", func(t *testing.T) {
		for _, bs := range committed {
			checkCommittedBatchSpan(t, e, rcv, bs)
		}
	})
	t.Run("FencedBatch", func(t *testing.T) { checkFencedBatchSpan(t, rcv, zombie[0], held) })
}

// checkCommittedBatchSpan: a committed batch's span is a consumer root of
// the worker's, with the batch's attributes, and the handler's and the
// fence statement's spans as children.
func checkCommittedBatchSpan(t *testing.T, e *env, rcv *receiver, bs otlpSpan) {
	t.Helper()
	t.Logf("B's committed batch, as the receiver decoded it:\n%s", rcv.tree(bs))
	if bs.service != "tenure-worker" || bs.kind != "Consumer" || bs.parent != "" {
		t.Errorf("batch span: service %q kind %q parent %q", bs.service, bs.kind, bs.parent)
	}
	for k, want := range map[string]string{"messaging.destination.name": e.topic, "messaging.destination.partition.id": "0",
		"messaging.consumer.group.name": e.group, "tenure.attempt": "1"} {
		if got := bs.attrs[k]; got != want {
			t.Errorf("batch span %s = %q, want %q", k, got, want)
		}
	}
	for _, k := range []string{"tenure.from", "tenure.to", "tenure.token", "tenure.claim_id", "messaging.batch.message_count"} {
		if bs.attrs[k] == "" {
			t.Errorf("batch span lacks %s: %v", k, bs.attrs)
		}
	}
	h := rcv.child(t, bs, consumer.SpanHandler)
	if len(rcv.children(h)) == 0 {
		t.Errorf("the export handler's statements are not children of its span")
	}
	rcv.child(t, bs, "BEGIN")
	fc := rcv.child(t, bs, consumer.SpanFenceCommit)
	pipeline := rcv.child(t, fc, "batch start")
	st := rcv.children(pipeline)
	if len(st) != 2 || !strings.Contains(st[0].attrs["db.query.text"], "fence_check") || st[1].name != "COMMIT" {
		t.Errorf("the fence_commit span's round trip: %d statements %v, want the fence statement and COMMIT", len(st), st)
	}
}

// checkFencedBatchSpan: a fenced batch's span is an error, with the token
// it held and an event naming the owner that fenced it.
func checkFencedBatchSpan(t *testing.T, rcv *receiver, z otlpSpan, held map[string]any) {
	t.Helper()
	t.Logf("A's fenced batch, as the receiver decoded it:\n%s", rcv.tree(z))
	if z.status != "Error" {
		t.Errorf("the zombie's batch span has status %s, want Error", z.status)
	}
	if z.attrs["tenure.token"] != fmt.Sprint(held["token"]) {
		t.Errorf("the zombie's batch span has token %s, A held %v", z.attrs["tenure.token"], held["token"])
	}
	var ev *otlpEvent
	for i := range z.events {
		if z.events[i].name == consumer.EventFenced {
			ev = &z.events[i]
		}
	}
	switch {
	case ev == nil:
		t.Errorf("the zombie's batch span has no %s event: %v", consumer.EventFenced, z.events)
	case !strings.HasPrefix(ev.attrs["tenure.held_by"], "tenure-B-") || !tokenLess(t, ev.attrs["tenure.token"], ev.attrs["tenure.held_by_token"]):
		t.Errorf("the fenced event should name B and a token above A's: %v", ev.attrs)
	}
	if fc := rcv.child(t, z, consumer.SpanFenceCommit); fc.status != "Error" {
		t.Errorf("the zombie's fence_commit span has status %s", fc.status)
	}
	rcv.child(t, z, consumer.SpanHandler)
}
