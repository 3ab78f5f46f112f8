package otelsetup

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync/atomic"
	"testing"

	"go.opentelemetry.io/otel/propagation"
)

func TestConfigured(t *testing.T) {
	for _, c := range []struct {
		name     string
		env      map[string]string
		endpoint string
		on       bool
		err      string
	}{
		{name: "nothing set: off"},
		{name: "base endpoint", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"},
			endpoint: "http://collector:4318/v1/traces", on: true},
		{name: "traces endpoint wins", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://b/x"},
			endpoint: "https://b/x", on: true},
		{name: "exporter otlp alone: the SDK's default", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp"},
			endpoint: "http://localhost:4318/v1/traces", on: true},
		{name: "disabled", env: map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318"}},
		{name: "exporter none", env: map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318"}},
		{name: "unknown exporter", env: map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, err: "OTEL_TRACES_EXPORTER=zipkin is not supported"},
		{name: "grpc refused", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
			err: "OTEL_EXPORTER_OTLP_PROTOCOL=grpc is not supported"},
		{name: "grpc for other programs, tracing off: not our business", env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}},
		{name: "per-signal protocol wins", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318",
			"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}, endpoint: "http://a:4318/v1/traces", on: true},
		{name: "not a URL", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, err: "is not an http:// or https:// URL"},
	} {
		t.Run(c.name, func(t *testing.T) {
			endpoint, on, err := configured(func(k string) string { return c.env[k] })
			switch {
			case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
				t.Fatalf("error %v, want one saying %q", err, c.err)
			case c.err == "" && err != nil:
				t.Fatal(err)
			case endpoint != c.endpoint || on != c.on:
				t.Errorf("configured: %q %v, want %q %v", endpoint, on, c.endpoint, c.on)
			}
		})
	}
}

func TestPropagator(t *testing.T) {
	fields := func(p propagation.TextMapPropagator) string {
		f := p.Fields()
		sort.Strings(f)
		return strings.Join(f, ",")
	}
	p, err := propagator("")
	if err != nil || fields(p) != "baggage,traceparent,tracestate" {
		t.Errorf("default propagator: %v %v", p.Fields(), err)
	}
	if p, err := propagator("tracecontext"); err != nil || fields(p) != "traceparent,tracestate" {
		t.Errorf("tracecontext: %v %v", p.Fields(), err)
	}
	if _, err := propagator("b3"); err == nil {
		t.Errorf("b3 accepted")
	}
}

func TestStatementName(t *testing.T) {
	for sql, want := range map[string]string{
		"BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL tenure.tx = 'x'": "BEGIN",
		"BEGIN; SET LOCAL lock_timeout = '30s'":                           "BEGIN",
		"\n\tWITH u AS (UPDATE x) SELECT 1":                               "WITH",
		"select 1":                                                        "SELECT",
		"COMMIT":                                                          "COMMIT",
		"":                                                                "UNKNOWN",
	} {
		if got := StatementName(sql); got != want {
			t.Errorf("StatementName(%q) = %q, want %q", sql, got, want)
		}
	}
}

// Off: nothing to install. On: spans reach the endpoint by Close.
func TestSetup(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	t.Setenv("OTEL_TRACES_EXPORTER", "")
	t.Setenv("OTEL_SDK_DISABLED", "")
	off, err := Setup(context.Background(), "tenure-test", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if off.On() || off.KgoOpts() != nil || off.PgxTracer() != nil || off.Close() != nil {
		t.Fatalf("tracing is on with nothing configured")
	}

	var posts atomic.Int32
	var body atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		body.Store(string(b))
		if r.URL.Path == "/v1/traces" {
			posts.Add(1)
		}
	}))
	defer srv.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	t.Setenv("OTEL_SERVICE_NAME", "from-env")
	on, err := Setup(context.Background(), "tenure-test", "replica-1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if !on.On() || len(on.KgoOpts()) != 1 || on.PgxTracer() == nil || on.Endpoint != srv.URL+"/v1/traces" {
		t.Fatalf("tracing is not set up: %+v", on)
	}
	_, span := on.Provider.Tracer("t").Start(context.Background(), "a span")
	span.End()
	if err := on.Close(); err != nil {
		t.Fatal(err)
	}
	if posts.Load() == 0 {
		t.Fatal("nothing was exported by Close")
	}
	// The protobuf holds the strings as they are.
	b, _ := body.Load().(string)
	for _, want := range []string{"a span", "from-env", "replica-1"} {
		if !strings.Contains(b, want) {
			t.Errorf("the export lacks %q", want)
		}
	}
	if strings.Contains(b, "tenure-test") {
		t.Errorf("OTEL_SERVICE_NAME did not win over the default service name")
	}
}
