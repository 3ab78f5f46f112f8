package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/metrics"
	"github.com/tenure-dev/tenure/sink"
)

// The worker's HTTP endpoint (--http-addr):
//
//	/healthz  200 while the process is alive and not wedged: no Handle call
//	          has been running for longer than the handler timeout plus
//	          wedgeMargin (a handler that ignores its context holds its
//	          partition forever; a restart is what frees it). It never
//	          depends on Postgres or Kafka: restarting a worker does not
//	          bring a database back.
//	/readyz   200 once the worker has joined its group, the database answers
//	          and its schema has every migration; 503 with the reasons
//	          otherwise (and while it stops).
//	/metrics  Prometheus: the metrics package's collectors, kgo's client
//	          metrics (kprom, tenure_kafka_*), Go and process metrics.

// readyTimeout bounds each readiness check's database round trips.
const readyTimeout = 2 * time.Second

// wedgedAfter is how long a Handle call may run before /healthz fails: the
// handler timeout (after which its context is cancelled) plus a margin for
// a handler that is slow to notice, at least 30s. Zero (no handler
// timeout) disables the check.
func wedgedAfter(handlerTimeout time.Duration) time.Duration {
	if handlerTimeout <= 0 {
		return 0
	}
	return handlerTimeout + max(handlerTimeout/2, 30*time.Second)
}

// health is what /healthz and /readyz look at.
type health struct {
	c       *consumer.Consumer
	m       *metrics.Collector
	db      *pgxpool.Pool // a pool of its own: a busy worker pool must not look like an unreachable database
	schema  string
	wedged  time.Duration
	stopped func() bool
	log     *zap.Logger

	mu        sync.Mutex
	lastReady *bool
}

// ready returns the reasons the worker is not ready (none: ready).
func (h *health) ready(ctx context.Context) []string {
	var not []string
	if h.stopped() {
		return []string{"stopping"}
	}
	if h.c.Stats().SteppedDown == 1 {
		not = append(not, "group: left, because the database did not answer; this worker joins again once it does")
	} else if cl := h.c.Client(); cl == nil {
		not = append(not, "group: not started")
	} else if member, epoch := cl.GroupMetadata(); member == "" || epoch <= 0 {
		not = append(not, "group: not joined yet")
	}
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	if err := h.db.Ping(ctx); err != nil {
		not = append(not, "database: "+pgxCause(err))
	} else if err := sink.CheckSchema(ctx, h.db, h.schema); err != nil {
		not = append(not, "schema: "+pgxCauseOf(err))
	}
	return not
}

func (h *health) readyz(w http.ResponseWriter, r *http.Request) {
	not := h.ready(r.Context())
	ok := len(not) == 0
	h.mu.Lock()
	if h.lastReady == nil || *h.lastReady != ok {
		h.lastReady = &ok
		if ok {
			h.log.Info("ready")
		} else {
			h.log.Warn("not ready", zap.Strings("reasons", not))
		}
	}
	h.mu.Unlock()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "not ready: %s\n", strings.Join(not, "; "))
		return
	}
	fmt.Fprintln(w, "ready")
}

func (h *health) healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if old := h.m.OldestHandler(); h.wedged > 0 && old > h.wedged {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "wedged: a handler call has been running for %s, past the handler timeout and a margin (%s); it ignores its context\n",
			old.Round(time.Second), h.wedged)
		return
	}
	fmt.Fprintln(w, "ok")
}

// serveHTTP serves /healthz, /readyz and /metrics on addr until ctx ends.
// The listener is opened before returning, so that a bad or busy address
// is a start-up error, not a log line.
func serveHTTP(addr string, reg *prometheus.Registry, h *health) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("--http-addr %s: %v", addr, err)
	}
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", h.healthz)
	mux.HandleFunc("/readyz", h.readyz)
	// Not shut down when ctx ends: probes are answered (readyz:
	// "stopping") until the worker has stopped and the process exits.
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			h.log.Error("http server stopped", zap.Error(err))
		}
	}()
	h.log.Info("http listening", zap.String("addr", ln.Addr().String()), zap.Strings("paths", []string{"/healthz", "/readyz", "/metrics"}))
	return nil
}

// healthPool opens the small pool readiness checks use; it connects lazily,
// so that a database that is away at start is a not-ready answer.
func healthPool(url string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("the database URL is not valid: %s", pgxCause(err))
	}
	cfg.MaxConns = 1
	cfg.MinConns = 0
	cfg.ConnConfig.ConnectTimeout = readyTimeout
	return pgxpool.NewWithConfig(context.Background(), cfg)
}
