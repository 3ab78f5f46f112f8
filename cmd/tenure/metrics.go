package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/tenure-dev/tenure/consumer"
)

// serveMetrics serves /metrics (Prometheus text format) and /healthz on addr
// until ctx ends. The listener is opened before returning so that a bad or
// busy address is a start-up error, not a log line.
func serveMetrics(ctx context.Context, addr string, c *consumer.Consumer, log *zap.Logger) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("--metrics-addr %s: %v", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		writeMetrics(w, c.Stats())
	})
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server stopped", zap.Error(err))
		}
	}()
	log.Info("metrics listening", zap.String("addr", ln.Addr().String()))
	return nil
}

func writeMetrics(w http.ResponseWriter, s consumer.Stats) {
	for _, m := range []struct {
		name, help, kind string
		v                int64
	}{
		{"tenure_claims_total", "Partitions claimed in Postgres.", "counter", s.Claims},
		{"tenure_claims_rejected_total", "Claims refused by the fence or the coordinator.", "counter", s.ClaimsRejected},
		{"tenure_batches_committed_total", "Batches committed through the fence.", "counter", s.Batches},
		{"tenure_records_committed_total", "Jobs committed (dead letters included).", "counter", s.Records},
		{"tenure_batches_fenced_total", "Batches rejected by the fence (a stale owner's writes rolled back).", "counter", s.BatchesFenced},
		{"tenure_dead_letters_total", "Jobs parked in the dead-letter table.", "counter", s.DeadLetters},
		{"tenure_handler_failures_total", "Handler errors, panics and timeouts counted against jobs.", "counter", s.HandlerFailures},
		{"tenure_handler_transient_total", "Handler failures retried without counting against jobs (consumer.Transient, lock timeouts, deadlocks).", "counter", s.HandlerTransient},
		{"tenure_handler_environment_errors_total", "Handler SQL errors that say the environment is wrong (missing table or column, permission, read-only server): the partition stalls.", "counter", s.HandlerEnvironment},
		{"tenure_handler_bugs_total", "Batches whose handler ended its own transaction (COMMIT or ROLLBACK in its SQL); each halts its partition.", "counter", s.HandlerBugs},
		{"tenure_lanes_halted", "Partitions this worker holds but does not process until an operator acknowledges their hold (a handler bug, offsets that do not fit the log).", "gauge", s.LanesHalted},
		{"tenure_lanes_stalled", "Partitions whose claim or commit was rejected although this member holds them; recovering by themselves.", "gauge", s.Stalled},
		{"tenure_lane_recoveries_total", "Partitions claimed again by their lane after a rejection, without a rebalance.", "counter", s.Recoveries},
		{"tenure_stale_sessions_ended_total", "Sessions of an older owner of a partition (frozen in its transaction) that held locks a batch waited for, ended by this worker.", "counter", s.StaleSessionsEnded},
		{"tenure_divergences_total", "Partitions found with a stored offset below one this group had acknowledged (the database lost commits: a failover to a standby that was behind, a restore); each is held.", "counter", s.Divergences},
		{"tenure_jobs_lost_total", "Jobs deleted from the log (retention, DeleteRecords) before they were processed, found below the log start.", "counter", s.JobsLost},
		{"tenure_fence_log_pruned_total", "Fence log entries pruned by this worker (--fence-log-max-age, --fence-log-max-entries).", "counter", s.FenceLogPruned},
		{"tenure_batch_retries_total", "Batch attempts after a failure.", "counter", s.Retries},
		{"tenure_incarnation_bumps_total", "Incarnation bumps made by this worker: group resets detected (and ties settled).", "counter", s.Resets},
		{"tenure_lanes", "Partitions this worker is processing now.", "gauge", s.Lanes},
	} {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n%s %d\n", m.name, m.help, m.name, m.kind, m.name, m.v)
	}
}
