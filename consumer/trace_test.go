package consumer_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/internal/otelsetup"
	"github.com/tenure-dev/tenure/sink"
)

// traced is a bundle's tracing: a provider, a store whose pool traces its
// statements with otelpgx, and a producer whose records carry their
// publish span's context (kotel), all on the same provider.
type traced struct {
	tp       *sdktrace.TracerProvider
	store    *sink.Store
	producer *kgo.Client
}

var prop = propagation.TraceContext{}

func (b *bundle) traced(opts ...sdktrace.TracerProviderOption) *traced {
	b.t.Helper()
	tp := sdktrace.NewTracerProvider(opts...)
	b.t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	// What tenure worker installs: otelpgx's tracer and kotel's hooks.
	ot := otelsetup.New(tp, prop)
	store := b.poolStore(func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = ot.PgxTracer() })
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(b.brokers...), kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil))},
		ot.KgoOpts()...)...)
	if err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(cl.Close)
	return &traced{tp: tp, store: store, producer: cl}
}

func (tr *traced) config(b *bundle, h consumer.Handler, log *zap.Logger) consumer.Config {
	cfg := b.config(h, log)
	cfg.Store = tr.store
	cfg.TracerProvider = tr.tp
	cfg.TracePropagator = prop
	return cfg
}

// produce sends values (key "k") through the traced producer.
func (tr *traced) produce(t testing.TB, topic string, values ...string) {
	t.Helper()
	recs := make([]*kgo.Record, len(values))
	for i, v := range values {
		recs[i] = &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte(v)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := tr.producer.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// produceJobs sends n jobs over 101 keys through the traced producer.
func (tr *traced) produceJobs(t testing.TB, topic string, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for start := 0; start < n; start += 10_000 {
		recs := make([]*kgo.Record, 0, 10_000)
		for i := start; i < min(n, start+10_000); i++ {
			recs = append(recs, &kgo.Record{Topic: topic, Key: fmt.Appendf(nil, "k%d", i%101), Value: fmt.Appendf(nil, `{"i":%d}`, i)})
		}
		if err := tr.producer.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
}

// spans indexes what the exporter holds.
type spans struct {
	all  tracetest.SpanStubs
	byID map[trace.SpanID]tracetest.SpanStub
}

func spansOf(exp *tracetest.InMemoryExporter) spans {
	s := spans{all: exp.GetSpans(), byID: map[trace.SpanID]tracetest.SpanStub{}}
	for _, sp := range s.all {
		s.byID[sp.SpanContext.SpanID()] = sp
	}
	return s
}

func (s spans) named(name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, sp := range s.all {
		if sp.Name == name {
			out = append(out, sp)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].StartTime.Before(out[j].StartTime) })
	return out
}

func (s spans) children(parent tracetest.SpanStub) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, sp := range s.all {
		if sp.Parent.SpanID() == parent.SpanContext.SpanID() && sp.Parent.TraceID() == parent.SpanContext.TraceID() {
			out = append(out, sp)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].StartTime.Before(out[j].StartTime) })
	return out
}

func (s spans) child(t *testing.T, parent tracetest.SpanStub, name string) tracetest.SpanStub {
	t.Helper()
	for _, c := range s.children(parent) {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("span %s has no child %q; its children: %s", parent.Name, name, names(s.children(parent)))
	return tracetest.SpanStub{}
}

// tree renders the spans under root, one a line, indented by depth.
func (s spans) tree(root tracetest.SpanStub) string {
	var sb strings.Builder
	var walk func(sp tracetest.SpanStub, depth int)
	walk = func(sp tracetest.SpanStub, depth int) {
		fmt.Fprintf(&sb, "%s%s", strings.Repeat("  ", depth), sp.Name)
		if o, ok := attr(sp, "tenure.outcome"); ok {
			fmt.Fprintf(&sb, " outcome=%s", o.Emit())
		}
		if sp.Status.Code == codes.Error {
			fmt.Fprintf(&sb, " [error]")
		}
		sb.WriteByte('\n')
		for _, c := range s.children(sp) {
			walk(c, depth+1)
		}
	}
	walk(root, 0)
	return sb.String()
}

func names(ss []tracetest.SpanStub) string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = s.Name
	}
	return strings.Join(out, ", ")
}

func attr(sp tracetest.SpanStub, key string) (attribute.Value, bool) {
	for _, a := range sp.Attributes {
		if string(a.Key) == key {
			return a.Value, true
		}
	}
	return attribute.Value{}, false
}

func wantAttr(t *testing.T, sp tracetest.SpanStub, key string, want any) {
	t.Helper()
	v, ok := attr(sp, key)
	if !ok {
		t.Errorf("span %s has no attribute %s: %v", sp.Name, key, sp.Attributes)
		return
	}
	if got := v.AsInterface(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("span %s: %s = %v, want %v", sp.Name, key, got, want)
	}
}

// A traced job's story: its publish span (kotel, in the producer), a batch
// span of a trace of its own linked to it, and under the batch the
// handler (with the handler's COPY), BEGIN, and one fence_commit span over
// the pipelined fence statement and COMMIT.
func TestTracingSpanTree(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	exp := tracetest.NewInMemoryExporter()
	tr := b.traced(sdktrace.WithSyncer(exp))
	tr.produce(t, b.topic, `{"i":0}`, `{"i":1}`, `{"i":2}`)
	b.runUntilDone(tr.config(b, ledger(t, b.schema), zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))), 60*time.Second)
	s := spansOf(exp)

	publish := s.named(b.topic + " publish")
	if len(publish) != 3 {
		t.Fatalf("%d publish spans, want 3: %s", len(publish), names(s.all))
	}
	batches := s.named(consumer.SpanBatch)
	if len(batches) == 0 {
		t.Fatalf("no batch span: %s", names(s.all))
	}
	type spanKey struct {
		trace trace.TraceID
		span  trace.SpanID
	}
	linked := map[spanKey]int64{}
	records := 0
	for _, bs := range batches {
		if bs.Parent.IsValid() {
			t.Errorf("batch span has a parent %v: it must be a root, linked to the jobs", bs.Parent)
		}
		if bs.SpanKind != trace.SpanKindConsumer {
			t.Errorf("batch span kind %v, want consumer", bs.SpanKind)
		}
		wantAttr(t, bs, "tenure.outcome", consumer.OutcomeCommitted)
		wantAttr(t, bs, "messaging.destination.name", b.topic)
		wantAttr(t, bs, "messaging.destination.partition.id", "0")
		wantAttr(t, bs, "messaging.consumer.group.name", b.group)
		wantAttr(t, bs, "tenure.attempt", 1)
		for _, k := range []string{"tenure.from", "tenure.to", "tenure.token", "tenure.claim_id", "tenure.member", "messaging.batch.message_count"} {
			if _, ok := attr(bs, k); !ok {
				t.Errorf("batch span lacks %s: %v", k, bs.Attributes)
			}
		}
		n, _ := attr(bs, "messaging.batch.message_count")
		records += int(n.AsInt64())
		for _, l := range bs.Links {
			off, _ := attrOfLink(l, "messaging.kafka.offset")
			linked[spanKey{l.SpanContext.TraceID(), l.SpanContext.SpanID()}] = off
		}
	}
	if records != 3 {
		t.Errorf("batch spans hold %d records, want 3", records)
	}
	for _, p := range publish {
		if _, ok := linked[spanKey{p.SpanContext.TraceID(), p.SpanContext.SpanID()}]; !ok {
			t.Errorf("publish span %s is linked from no batch span (links: %v)", p.SpanContext.SpanID(), linked)
		}
	}

	bs := batches[0]
	t.Logf("span tree of the first batch:\n%s", s.tree(bs))
	h := s.child(t, bs, consumer.SpanHandler)
	s.child(t, h, "copy_from "+`"`+b.schema+`"."ledger"`)
	s.child(t, bs, "BEGIN")
	fc := s.child(t, bs, consumer.SpanFenceCommit)
	pipeline := s.child(t, fc, "batch start")
	if st := s.children(pipeline); len(st) != 2 || st[1].Name != "COMMIT" {
		t.Errorf("the pipeline's statements: %s, want the fence statement and COMMIT", names(st))
	} else if q, _ := attr(st[0], "db.query.text"); !strings.Contains(q.AsString(), "fence_check") {
		t.Errorf("the pipeline's first statement is not the fence: %s", q.AsString())
	}
	if !h.EndTime.Before(fc.StartTime) && !h.EndTime.Equal(fc.StartTime) {
		t.Errorf("the handler span ends after the fence_commit span starts")
	}
	// Nothing outside a batch (claims, probes) makes a span of its own.
	for _, sp := range s.all {
		if !sp.Parent.IsValid() && sp.Name != consumer.SpanBatch && !strings.HasSuffix(sp.Name, " publish") {
			t.Errorf("stray root span %q", sp.Name)
		}
	}
}

func attrOfLink(l sdktrace.Link, key string) (int64, bool) {
	for _, a := range l.Attributes {
		if string(a.Key) == key {
			return a.Value.AsInt64(), true
		}
	}
	return 0, false
}

// A job that fails: its first attempt's span says retried (status error,
// the failure's class), its last says dead_lettered with the job's
// attempts, and the dead-lettering is a child with its own fenced commit.
func TestTracingRetriedThenDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	exp := tracetest.NewInMemoryExporter()
	tr := b.traced(sdktrace.WithSyncer(exp))
	tr.produce(t, b.topic, `{"fail":true}`)
	h, _ := poisonHandler(t, b.schema)
	cfg := tr.config(b, h, zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel)))
	cfg.MaxAttempts = 2
	b.runUntilDone(cfg, 60*time.Second)
	s := spansOf(exp)
	batches := s.named(consumer.SpanBatch)
	if len(batches) != 2 {
		t.Fatalf("%d batch spans, want 2 (an attempt, then the last one): %s", len(batches), names(s.all))
	}
	first, last := batches[0], batches[1]
	t.Logf("retried:\n%s\ndead-lettered:\n%s", s.tree(first), s.tree(last))
	wantAttr(t, first, "tenure.outcome", consumer.OutcomeRetried)
	wantAttr(t, first, "tenure.attempt", 1)
	wantAttr(t, first, "tenure.failure", "job")
	if first.Status.Code != codes.Error || !strings.Contains(first.Status.Description, "cannot export") {
		t.Errorf("retried batch status %+v, want an error naming the failure", first.Status)
	}
	if hs := s.child(t, first, consumer.SpanHandler); hs.Status.Code != codes.Error {
		t.Errorf("failed handler span status %+v", hs.Status)
	}
	wantAttr(t, last, "tenure.outcome", consumer.OutcomeDeadLettered)
	wantAttr(t, last, "tenure.attempt", 2)
	wantAttr(t, last, "tenure.job_attempts", 2)
	if len(first.Links) != 1 || len(last.Links) != 1 || !first.Links[0].SpanContext.Equal(last.Links[0].SpanContext) {
		t.Errorf("both attempts must link to the job's publish span: %v, %v", first.Links, last.Links)
	}
	dl := s.child(t, last, consumer.SpanDeadLetter)
	s.child(t, dl, "INSERT")
	s.child(t, dl, consumer.SpanFenceCommit)
}

// A batch the fence rejects (another claim took the partition in Postgres
// behind this worker's back): its span says fenced, with status error and
// the fenced event naming who holds the partition.
func TestTracingFencedBatch(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	exp := tracetest.NewInMemoryExporter()
	tr := b.traced(sdktrace.WithSyncer(exp))
	tr.produce(t, b.topic, `{"i":0}`)
	c, stop := runNew(t, tr.config(b, ledger(t, b.schema), zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel))))
	b.waitDone(60 * time.Second)
	f, usurper := b.usurp(0)
	tr.produce(t, b.topic, `{"i":1}`)
	waitForCond(t, 30*time.Second, "the batch to be fenced", func() bool { return c.Stats().BatchesFenced >= 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	var fenced []tracetest.SpanStub
	s := spansOf(exp)
	for _, bs := range s.named(consumer.SpanBatch) {
		if v, _ := attr(bs, "tenure.outcome"); v.AsString() == consumer.OutcomeFenced {
			fenced = append(fenced, bs)
		}
	}
	if len(fenced) != 1 {
		t.Fatalf("%d fenced batch spans, want 1: %s", len(fenced), names(s.all))
	}
	bs := fenced[0]
	t.Logf("fenced:\n%s", s.tree(bs))
	if bs.Status.Code != codes.Error {
		t.Errorf("fenced batch status %+v, want error", bs.Status)
	}
	wantAttr(t, bs, "tenure.token", f.Token.String())
	var ev *sdktrace.Event
	for i := range bs.Events {
		if bs.Events[i].Name == consumer.EventFenced {
			ev = &bs.Events[i]
		}
	}
	if ev == nil {
		t.Fatalf("fenced batch span has no %s event: %+v", consumer.EventFenced, bs.Events)
	}
	got := map[string]string{}
	for _, a := range ev.Attributes {
		got[string(a.Key)] = a.Value.Emit()
	}
	if got["tenure.held_by"] != "usurper" || got["tenure.held_by_token"] != usurper.String() || got["tenure.token"] != f.Token.String() {
		t.Errorf("fenced event attributes %v, want the usurper's token %s over ours %s", got, usurper, f.Token)
	}
	if fc := s.child(t, bs, consumer.SpanFenceCommit); fc.Status.Code != codes.Error {
		t.Errorf("fence_commit span of a fenced batch: status %+v", fc.Status)
	}
}
