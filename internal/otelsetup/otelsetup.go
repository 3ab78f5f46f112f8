// Package otelsetup builds the tenure binary's OpenTelemetry tracing from
// the SDK's standard environment variables. Tracing is off unless they ask
// for it:
//
//   - OTEL_SDK_DISABLED=true, or OTEL_TRACES_EXPORTER=none: off.
//   - OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (a full URL) or
//     OTEL_EXPORTER_OTLP_ENDPOINT (a base URL; /v1/traces is appended): on,
//     exporting OTLP over HTTP there. OTEL_TRACES_EXPORTER=otlp alone turns
//     it on at the SDK's default, http://localhost:4318.
//   - Nothing of the above: off. The worker's Config has no TracerProvider,
//     its pool no statement tracer, the producer's client no hooks.
//
// The rest is the SDK's own: OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
// (the default service name is the command's, e.g. tenure-worker),
// OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG (default
// parentbased_always_on), OTEL_BSP_* (the batch span processor),
// OTEL_SPAN_*_LIMIT (OTEL_SPAN_LINK_COUNT_LIMIT bounds the links of one
// batch span, 128 by default), and OTEL_EXPORTER_OTLP_[TRACES_]HEADERS,
// _TIMEOUT, _COMPRESSION, _CERTIFICATE, _CLIENT_CERTIFICATE and
// _CLIENT_KEY, _INSECURE, _PROTOCOL (http/protobuf, the default, or
// http/json; grpc is refused: this binary has no gRPC exporter).
// OTEL_PROPAGATORS may name tracecontext and baggage (the default is both).
package otelsetup

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kotel"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	noopmetric "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Tracing is what Setup made. A nil *Tracing, or one with a nil Provider,
// is tracing off: its methods return nothing to install.
type Tracing struct {
	// Provider is the SDK's tracer provider, for consumer.Config; nil when
	// off.
	Provider trace.TracerProvider
	// Propagator writes and reads the trace context in record headers.
	Propagator propagation.TextMapPropagator
	// Endpoint is where spans are exported, for the start log.
	Endpoint string

	sdk *sdktrace.TracerProvider
}

// On reports whether tracing is configured.
func (t *Tracing) On() bool { return t != nil && t.Provider != nil }

// New is tracing on an existing provider (tests, benchmarks, a program
// that embeds tenure's commands): KgoOpts and PgxTracer made from it;
// Shutdown leaves tp alone. A nil prop is W3C Trace Context and Baggage.
func New(tp trace.TracerProvider, prop propagation.TextMapPropagator) *Tracing {
	if prop == nil {
		prop, _ = propagator("")
	}
	return &Tracing{Provider: tp, Propagator: prop}
}

// Setup reads the environment and, if it asks for tracing, starts the SDK:
// a tracer provider with a batch span processor exporting OTLP over HTTP.
// service is the default service.name, instance the service.instance.id
// ("": none); OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win over
// both. onError receives the SDK's errors (a collector that does not
// answer), which it would otherwise print on its own. The error is a
// sentence about a variable tenure cannot honour.
func Setup(ctx context.Context, service, instance string, onError func(error)) (*Tracing, error) {
	endpoint, on, err := configured(os.Getenv)
	if err != nil || !on {
		return &Tracing{}, err
	}
	prop, err := propagator(os.Getenv("OTEL_PROPAGATORS"))
	if err != nil {
		return nil, err
	}
	if onError != nil {
		otel.SetErrorHandler(otel.ErrorHandlerFunc(onError))
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("tracing: the OTLP exporter: %w", err)
	}
	base := []attribute.KeyValue{attribute.String("service.name", service)}
	if v := version(); v != "" {
		base = append(base, attribute.String("service.version", v))
	}
	if instance != "" {
		base = append(base, attribute.String("service.instance.id", instance))
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(base...),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(), // last: OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win
	)
	switch {
	case err != nil && res == nil:
		return nil, fmt.Errorf("tracing: the resource: %w", err)
	case err != nil && onError != nil:
		onError(fmt.Errorf("the resource is partial (OTEL_RESOURCE_ATTRIBUTES?): %w", err))
	}
	// The sampler (OTEL_TRACES_SAMPLER), the batch span processor
	// (OTEL_BSP_*) and the span limits (OTEL_SPAN_*) come from the
	// environment inside the SDK.
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return &Tracing{Provider: tp, Propagator: prop, Endpoint: endpoint, sdk: tp}, nil
}

// Shutdown exports what is buffered and stops the SDK; off, it does
// nothing.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t == nil || t.sdk == nil {
		return nil
	}
	return t.sdk.Shutdown(ctx)
}

// Close is Shutdown within closeTimeout, for a command's exit: spans still
// buffered are exported, or given up if the collector does not take them
// in time.
func (t *Tracing) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	return t.Shutdown(ctx)
}

const closeTimeout = 5 * time.Second

// KgoOpts are the options that make a kgo client trace what it produces
// (kotel: a "<topic> publish" span per record, its context written into
// the record's headers); none when off.
func (t *Tracing) KgoOpts() []kgo.Opt {
	if !t.On() {
		return nil
	}
	tr := kotel.NewTracer(kotel.TracerProvider(t.Provider), kotel.TracerPropagator(t.Propagator))
	return []kgo.Opt{kgo.WithHooks(kotel.NewKotel(kotel.WithTracer(tr)).Hooks()...)}
}

// PgxTracer is the statement tracer for a pool's ConnConfig.Tracer
// (otelpgx): a span for each statement run with a traced context (a
// batch's), none for the others; nil when off.
func (t *Tracing) PgxTracer() pgx.QueryTracer {
	if !t.On() {
		return nil
	}
	return otelpgx.NewTracer(otelpgx.WithTracerProvider(t.Provider),
		otelpgx.WithMeterProvider(noopmetric.NewMeterProvider()), // tenure's metrics are Prometheus's
		otelpgx.WithSpanNameFunc(StatementName))
}

// StatementName names a statement's span by its first keyword, as otelpgx
// does, without the semicolon of a multi-statement string (a batch's
// "BEGIN ...; SET LOCAL ..." is "BEGIN"; the fence statement is "WITH").
func StatementName(sql string) string {
	sql = strings.TrimSpace(sql)
	end := strings.IndexFunc(sql, func(r rune) bool { return r == ' ' || r == '\n' || r == '\t' || r == '\r' || r == ';' || r == '(' })
	if end >= 0 {
		sql = sql[:end]
	}
	if sql == "" {
		return "UNKNOWN"
	}
	return strings.ToUpper(sql)
}

// configured reads whether the environment asks for tracing, and where to.
// What would matter only to tracing is checked only when it is on.
func configured(getenv func(string) string) (endpoint string, on bool, err error) {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return "", false, nil
	}
	explicit := false
	switch exp := strings.ToLower(strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER"))); exp {
	case "":
	case "none":
		return "", false, nil
	case "otlp":
		explicit = true
	default:
		return "", false, fmt.Errorf("tracing: OTEL_TRACES_EXPORTER=%s is not supported: tenure exports otlp (over HTTP), or none", exp)
	}
	switch t, b := strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")), strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_ENDPOINT")); {
	case t != "":
		endpoint, err = t, checkURL("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", t)
	case b != "":
		endpoint, err = strings.TrimSuffix(b, "/")+"/v1/traces", checkURL("OTEL_EXPORTER_OTLP_ENDPOINT", b)
	case explicit:
		endpoint = "http://localhost:4318/v1/traces"
	default:
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	// The per-signal protocol wins over the general one.
	k := "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	p := strings.TrimSpace(getenv(k))
	if p == "" {
		k = "OTEL_EXPORTER_OTLP_PROTOCOL"
		p = strings.TrimSpace(getenv(k))
	}
	switch p {
	case "", "http/protobuf", "http/json":
	case "grpc":
		return "", false, fmt.Errorf("tracing: %s=grpc is not supported: tenure exports OTLP over HTTP (http/protobuf, usually port 4318)", k)
	default:
		return "", false, fmt.Errorf("tracing: %s=%s is not a protocol: http/protobuf or http/json", k, p)
	}
	return endpoint, true, nil
}

func checkURL(name, v string) error {
	u, err := url.Parse(v)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return fmt.Errorf("tracing: %s=%q is not an http:// or https:// URL", name, v)
	}
	return nil
}

// propagator reads OTEL_PROPAGATORS: tracecontext and baggage (the
// default, both), or none.
func propagator(v string) (propagation.TextMapPropagator, error) {
	if strings.TrimSpace(v) == "" {
		return propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}), nil
	}
	var ps []propagation.TextMapPropagator
	for _, name := range strings.Split(v, ",") {
		switch name = strings.ToLower(strings.TrimSpace(name)); name {
		case "tracecontext":
			ps = append(ps, propagation.TraceContext{})
		case "baggage":
			ps = append(ps, propagation.Baggage{})
		case "none":
		default:
			return nil, errors.New("tracing: OTEL_PROPAGATORS=" + v + " is not supported: tenure knows tracecontext, baggage and none")
		}
	}
	return propagation.NewCompositeTextMapPropagator(ps...), nil
}

func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok || bi.Main.Version == "" || bi.Main.Version == "(devel)" {
		return ""
	}
	return bi.Main.Version
}
