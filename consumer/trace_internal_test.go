package consumer

import (
	"context"
	"fmt"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// traceBatch is what one committed batch does for tracing: the batch span,
// the handler's, the fence_commit's, all ended.
func traceBatch(l *lane, b *Batch) {
	ctx, span := l.startBatch(b, 1)
	hctx, hs := l.c.trace.child(ctx, SpanHandler)
	endSpan(hs, nil)
	_, fs := l.c.trace.child(hctx, SpanFenceCommit)
	endSpan(fs, nil)
	span.end(OutcomeCommitted, nil)
}

// tracedRecs are n records whose headers carry a producer's trace context.
func tracedRecs(n int) []*kgo.Record {
	out := make([]*kgo.Record, n)
	for i := range out {
		out[i] = &kgo.Record{Topic: "t", Offset: int64(i), Headers: []kgo.RecordHeader{
			{Key: "traceparent", Value: fmt.Appendf(nil, "00-%032x-%016x-01", i+1, i+1)}}}
	}
	return out
}

// With no TracerProvider, tracing costs a batch nothing: no allocation, and
// the handler's context is the lane's own.
func TestTracingOffAllocatesNothing(t *testing.T) {
	l := testLane(t, 0)
	b := l.batch(tracedRecs(100), 0)
	if allocs := testing.AllocsPerRun(1000, func() { traceBatch(l, b) }); allocs != 0 {
		t.Errorf("tracing off: %v allocations per batch, want 0", allocs)
	}
	if ctx, _ := l.startBatch(b, 1); ctx != l.ctx {
		t.Errorf("tracing off: the batch runs with another context than the lane's")
	}
}

// tracedLane is a test lane tracing into an in-memory exporter, linking
// at most maxLinks jobs per batch.
func tracedLane(t *testing.T, maxLinks int) (*lane, *tracetest.InMemoryExporter) {
	exp := tracetest.NewInMemoryExporter()
	l := testLane(t, 0)
	l.c.cfg.TracerProvider = sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	l.c.cfg.TraceLinksMax = maxLinks
	l.c.trace = newTracing(&l.c.cfg)
	return l, exp
}

func batchSpanOf(t *testing.T, exp *tracetest.InMemoryExporter) tracetest.SpanStub {
	t.Helper()
	for _, s := range exp.GetSpans() {
		if s.Name == SpanBatch {
			return s
		}
	}
	t.Fatal("no batch span")
	return tracetest.SpanStub{}
}

// With a provider, the batch span is a root linked to every record's
// producer span.
func TestTracingLinksEveryRecord(t *testing.T) {
	l, exp := tracedLane(t, DefaultTraceLinksMax)
	recs := tracedRecs(3)
	recs = append(recs, &kgo.Record{Topic: "t", Offset: 3}) // produced untraced: no link
	traceBatch(l, l.batch(recs, 0))
	batch := batchSpanOf(t, exp)
	if len(batch.Links) != 3 {
		t.Fatalf("%d links, want 3", len(batch.Links))
	}
	for i, ln := range batch.Links {
		want := trace.SpanID{7: byte(i + 1)}
		if ln.SpanContext.SpanID() != want || !ln.SpanContext.IsRemote() || !ln.SpanContext.IsSampled() {
			t.Errorf("link %d: %v, want span %s", i, ln.SpanContext, want)
		}
	}
	if batch.Parent.IsValid() {
		t.Errorf("the batch span has a parent: %v", batch.Parent)
	}
}

// TraceLinksMax bounds the links: the first jobs that carry a context;
// negative links them all.
func TestTracingLinksAreBounded(t *testing.T) {
	for _, c := range []struct{ max, want int }{{2, 2}, {-1, 300}, {DefaultTraceLinksMax, DefaultTraceLinksMax}} {
		l, exp := tracedLane(t, c.max)
		l.c.cfg.TracerProvider = sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithRawSpanLimits(sdktrace.SpanLimits{
			AttributeCountLimit: -1, EventCountLimit: -1, LinkCountLimit: -1, AttributePerEventCountLimit: -1, AttributePerLinkCountLimit: -1,
			AttributeValueLengthLimit: -1}))
		l.c.trace = newTracing(&l.c.cfg)
		traceBatch(l, l.batch(tracedRecs(300), 0))
		batch := batchSpanOf(t, exp)
		if len(batch.Links) != c.want {
			t.Errorf("TraceLinksMax %d: %d links, want %d", c.max, len(batch.Links), c.want)
			continue
		}
		if got := batch.Links[0].Attributes[0].Value.AsInt64(); got != 0 {
			t.Errorf("TraceLinksMax %d: the first link is to offset %d, want the batch's first job", c.max, got)
		}
	}
}

// BenchmarkBatchTracing is the tracing work of one batch of 1000 traced
// records alone (no Kafka, no Postgres): nothing when off; when on, the SDK
// with every batch sampled and spans exported to nowhere, linking the
// default 128 jobs, or all 1000 (with the SDK's link limit lifted).
//
//	go test ./consumer -run '^$' -bench BatchTracing -benchmem
func BenchmarkBatchTracing(b *testing.B) {
	for _, c := range []struct {
		name     string
		on       bool
		maxLinks int
	}{{"off", false, 0}, {"on", true, DefaultTraceLinksMax}, {"on-every-job-linked", true, -1}} {
		b.Run(c.name, func(b *testing.B) {
			l := testLane(&testing.T{}, 0)
			if c.on {
				limits := sdktrace.NewSpanLimits()
				limits.LinkCountLimit = -1
				tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()), sdktrace.WithRawSpanLimits(limits))
				defer func() { _ = tp.Shutdown(context.Background()) }()
				l.c.cfg.TracerProvider = tp
				l.c.cfg.TraceLinksMax = c.maxLinks
				l.c.trace = newTracing(&l.c.cfg)
			}
			batch := l.batch(tracedRecs(1000), 0)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				traceBatch(l, batch)
			}
		})
	}
}
