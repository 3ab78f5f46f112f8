package consumer

// Tracing (Config.TracerProvider): a span per batch attempt, linked to the
// producer span of each job it carries, with children for the handler, the
// fence statement and COMMIT, and the dead-lettering. With no provider
// nothing here runs: every helper is a nil check.

import (
	"context"
	"errors"
	"strconv"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kotel"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/tenure-dev/tenure/sink"
)

// TracerName is the instrumentation scope of tenure's spans.
const TracerName = "github.com/tenure-dev/tenure/consumer"

// The spans a traced worker makes (Config.TracerProvider). A batch span is
// the root of a trace of its own: one batch carries the jobs of many
// traces, so it links to each job's producer span instead of joining one
// of them.
const (
	// SpanBatch is one attempt at a batch: one transaction. Its attributes
	// say which records it held and what became of it (tenure.outcome).
	SpanBatch = "tenure.batch"
	// SpanHandler is the Handle call; the handler's statements are its
	// children when the pool traces statements.
	SpanHandler = "tenure.handler"
	// SpanFenceCommit is the fence statement and COMMIT, sent together in
	// one round trip.
	SpanFenceCommit = "tenure.fence_commit"
	// SpanDeadLetter is the parking of a failed job in the dead-letter table
	// in the fenced transaction that moves past it.
	SpanDeadLetter = "tenure.dead_letter"
)

// The values of a batch span's tenure.outcome.
const (
	OutcomeCommitted    = "committed"     // the batch committed through the fence
	OutcomeFenced       = "fenced"        // the fence rejected it: a newer owner holds the partition
	OutcomeDeadLettered = "dead_lettered" // its one job was dead-lettered, and the partition moved past it
	OutcomeRetried      = "retried"       // it failed and was rolled back; the same records are tried again
	OutcomeSplit        = "split"         // it kept failing; its halves are tried as batches of their own
	OutcomeHalted       = "halted"        // the handler ended the transaction itself: the partition is held
	OutcomeStopped      = "stopped"       // the lane stopped (revoked, lost, shutdown) before it committed
)

// EventFenced is the event a fenced batch span (and its fence_commit span)
// records, with the token it presented and what the fencing row held.
const EventFenced = "tenure.fenced"

var (
	attrSystem     = attribute.String("messaging.system", "kafka")
	attrOperation  = attribute.String("messaging.operation.type", "process")
	keyDestination = attribute.Key("messaging.destination.name")
	keyPartitionID = attribute.Key("messaging.destination.partition.id")
	keyGroup       = attribute.Key("messaging.consumer.group.name")
	keyCount       = attribute.Key("messaging.batch.message_count")
	keyOffset      = attribute.Key("messaging.kafka.offset")
	keyFrom        = attribute.Key("tenure.from")
	keyTo          = attribute.Key("tenure.to")
	keyToken       = attribute.Key("tenure.token")
	keyClaimID     = attribute.Key("tenure.claim_id")
	keyMember      = attribute.Key("tenure.member")
	keyAttempt     = attribute.Key("tenure.attempt")
	keyLinked      = attribute.Key("tenure.linked_jobs")
	keyOutcome     = attribute.Key("tenure.outcome")
	keyFailure     = attribute.Key("tenure.failure")
	keyJobAttempts = attribute.Key("tenure.job_attempts")
	keyHeldBy      = attribute.Key("tenure.held_by")
	keyHeldToken   = attribute.Key("tenure.held_by_token")
	keyHeldClaim   = attribute.Key("tenure.held_by_claim_id")
	keyNextOffset  = attribute.Key("tenure.next_offset")
)

// tracing is a Consumer's tracer; nil when Config.TracerProvider is nil.
type tracing struct {
	tracer   trace.Tracer
	prop     propagation.TextMapPropagator
	maxLinks int // negative: no bound
}

func newTracing(cfg *Config) *tracing {
	if cfg.TracerProvider == nil {
		return nil
	}
	prop := cfg.TracePropagator
	if prop == nil {
		// The global propagator reads nothing until one is set (its Fields
		// are empty): then W3C Trace Context, what kotel writes with
		// OpenTelemetry's usual setup.
		if prop = otel.GetTextMapPropagator(); len(prop.Fields()) == 0 {
			prop = propagation.TraceContext{}
		}
	}
	return &tracing{tracer: cfg.TracerProvider.Tracer(TracerName), prop: prop, maxLinks: cfg.TraceLinksMax}
}

// links are the producer span contexts in recs' headers, one per record
// that carries one, with its offset: the first maxLinks.
func (t *tracing) links(recs []*kgo.Record) []trace.Link {
	var links []trace.Link
	var offsets []attribute.KeyValue // one allocation for every link's attribute
	for _, r := range recs {
		if len(links) == t.maxLinks {
			break
		}
		if len(r.Headers) == 0 {
			continue
		}
		sc := trace.SpanContextFromContext(t.prop.Extract(context.Background(), kotel.NewRecordCarrier(r)))
		if !sc.IsValid() {
			continue
		}
		if links == nil {
			n := len(recs)
			if t.maxLinks >= 0 {
				n = min(n, t.maxLinks)
			}
			links = make([]trace.Link, 0, n)
			offsets = make([]attribute.KeyValue, 0, n)
		}
		n := len(offsets)
		offsets = append(offsets, keyOffset.Int64(r.Offset))
		links = append(links, trace.Link{SpanContext: sc, Attributes: offsets[n : n+1 : n+1]})
	}
	return links
}

// batchSpan is one attempt's span. Its zero value (tracing off) does
// nothing.
type batchSpan struct{ s trace.Span }

// startBatch starts attempt's span for b under the lane's context; with
// tracing off it returns the lane's context as it is.
func (l *lane) startBatch(b *Batch, attempt int) (context.Context, batchSpan) {
	t := l.c.trace
	if t == nil {
		return l.ctx, batchSpan{}
	}
	links := t.links(b.Records)
	ctx, s := t.tracer.Start(l.ctx, SpanBatch,
		trace.WithNewRoot(), trace.WithSpanKind(trace.SpanKindConsumer), trace.WithLinks(links...),
		trace.WithAttributes(
			attrSystem, attrOperation,
			keyDestination.String(b.Topic),
			keyPartitionID.String(strconv.FormatInt(int64(b.Partition), 10)),
			keyGroup.String(b.Group),
			keyCount.Int(len(b.Records)),
			keyFrom.Int64(b.From),
			keyTo.Int64(b.To),
			keyToken.String(b.Token.String()),
			keyClaimID.Int64(l.claimID),
			keyMember.String(b.Owner),
			keyAttempt.Int(attempt),
			keyLinked.Int(len(links)),
		))
	return ctx, batchSpan{s}
}

// end ends the span with its outcome; err is the attempt's failure, if any
// (a dead-lettered batch's is the job's).
func (s batchSpan) end(outcome string, err error) {
	if s.s == nil {
		return
	}
	s.s.SetAttributes(keyOutcome.String(outcome))
	if err != nil {
		var he *handlerError
		if errors.As(err, &he) {
			s.s.SetAttributes(keyFailure.String(he.class.String()))
		}
		fenced(s.s, err)
		s.s.RecordError(err)
		s.s.SetStatus(codes.Error, outcome+": "+err.Error())
	}
	s.s.End()
}

// deadLettered notes how many attempts the dead-lettered job had.
func (s batchSpan) deadLettered(attempts int) {
	if s.s != nil {
		s.s.SetAttributes(keyJobAttempts.Int(attempts))
	}
}

// fenced adds EventFenced to s if err is the fence's rejection.
func fenced(s trace.Span, err error) {
	var fe *sink.FencedError
	if !errors.As(err, &fe) {
		return
	}
	attrs := []attribute.KeyValue{keyToken.String(fe.Presented.String()), keyClaimID.Int64(fe.ClaimID)}
	if fe.Found {
		attrs = append(attrs, keyHeldToken.String(fe.Current.String()), keyHeldBy.String(fe.CurrentOwner),
			keyHeldClaim.Int64(fe.CurrentClaim), keyNextOffset.Int64(fe.NextOffset))
	}
	s.AddEvent(EventFenced, trace.WithAttributes(attrs...))
}

// EventCommitUnknown is the event of a fence_commit span whose answer was
// lost (the connection broke, the commit timeout passed): the span ends
// once the outcome has been resolved from the fencing row.
const EventCommitUnknown = "tenure.commit_outcome_unknown"

// unknownOutcome records on s (nil: nothing) that the commit's answer was
// lost.
func unknownOutcome(s trace.Span, err error) {
	if s != nil {
		s.AddEvent(EventCommitUnknown, trace.WithAttributes(attribute.String("error", err.Error())))
	}
}

// child starts a child span of ctx's; with tracing off it returns ctx and
// a nil span (endSpan takes it).
func (t *tracing) child(ctx context.Context, name string) (context.Context, trace.Span) {
	if t == nil {
		return ctx, nil
	}
	return t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindInternal))
}

// endSpan ends a span from child, recording err; nil s does nothing.
func endSpan(s trace.Span, err error) {
	if s == nil {
		return
	}
	if err != nil {
		fenced(s, err)
		s.RecordError(err)
		s.SetStatus(codes.Error, err.Error())
	}
	s.End()
}
