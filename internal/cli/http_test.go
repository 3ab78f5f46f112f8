package cli

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/metrics"
)

// /healthz fails once a Handle call runs past the wedge bound (a handler
// that ignores its context), and recovers when it returns.
func TestHealthzWedgedHandler(t *testing.T) {
	m := metrics.New(metrics.Options{})
	release := make(chan struct{})
	cfg := m.Instrument(consumer.Config{Handler: consumer.HandlerFunc(func(context.Context, consumer.Tx, *consumer.Batch) error {
		<-release // ignores its context
		return nil
	})})
	h := &health{m: m, wedged: 100 * time.Millisecond}
	status := func() (int, string) {
		rec := httptest.NewRecorder()
		h.healthz(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		return rec.Code, rec.Body.String()
	}
	if code, body := status(); code != http.StatusOK {
		t.Fatalf("idle: %d %q", code, body)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = cfg.Handler.Handle(context.Background(), nil, &consumer.Batch{})
	}()
	time.Sleep(50 * time.Millisecond)
	if code, body := status(); code != http.StatusOK {
		t.Errorf("a handler within its time: %d %q", code, body)
	}
	time.Sleep(100 * time.Millisecond)
	if code, body := status(); code != http.StatusServiceUnavailable || !strings.Contains(body, "wedged: a handler call has been running for") {
		t.Errorf("a handler past the bound: %d %q", code, body)
	}
	close(release)
	<-done
	if code, body := status(); code != http.StatusOK {
		t.Errorf("after the handler returned: %d %q", code, body)
	}
	// No handler timeout: no bound.
	if wedgedAfter(-1) != 0 || wedgedAfter(60*time.Second) != 90*time.Second || wedgedAfter(10*time.Second) != 40*time.Second {
		t.Errorf("wedgedAfter: %s %s %s", wedgedAfter(-1), wedgedAfter(60*time.Second), wedgedAfter(10*time.Second))
	}
}
