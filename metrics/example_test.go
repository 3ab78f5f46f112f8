package metrics_test

import (
	"context"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/metrics"
)

// A library user's worker, with tenure's metrics on the application's own
// registry and HTTP server.
func Example() {
	var cfg consumer.Config // Brokers, Group, Topics, Store, Handler, ...
	m := metrics.New(metrics.Options{ConstLabels: prometheus.Labels{"app": "billing"}})
	c, err := consumer.New(m.Instrument(cfg))
	if err != nil {
		return // (a real program reports it)
	}
	m.Attach(c)
	registry := prometheus.NewRegistry()
	registry.MustRegister(m)
	http.Handle("/metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	_ = c.Run(context.Background())
}
