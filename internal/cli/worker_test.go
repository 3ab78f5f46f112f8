package cli

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/tenure-dev/tenure/consumer"
)

// workerConfig reads a worker command line as `tenure worker` does, as far
// as the consumer's configuration (consumer.New checks it), connecting to
// nothing.
func workerConfig(t *testing.T, args ...string) (consumer.Config, error) {
	t.Helper()
	e := &env{stdout: io.Discard, stderr: io.Discard, getenv: func(string) string { return "" }, secrets: &secrets{}}
	w := &workerCmd{}
	w.setEnv(e)
	f := newFlagSet(e, pflag.NewFlagSet("worker", pflag.ContinueOnError))
	f.fs.SetOutput(io.Discard)
	w.define(f)
	need := []string{"--brokers", "h:1", "--group", "g", "--topic", "t", "--handler", "noop", "--database-url", "postgres://127.0.0.1:1/x"}
	if err := f.fs.Parse(append(need, args...)); err != nil {
		return consumer.Config{}, err
	}
	if err := w.check(nil); err != nil {
		return consumer.Config{}, err
	}
	cfg, _, _, err := w.configure(context.Background(), zap.NewNop())
	return cfg, err
}

// The worker's flags default to consumer.Config's defaults, and a 0 given
// on the command line means what 0 means in Config (the default, or the
// value Config derives from other fields): the flag hands it on as 0, or
// refuses it. It never stands for something else.
func TestWorkerFlagsAndConfig(t *testing.T) {
	t.Run("Defaults", func(t *testing.T) {
		cfg, err := workerConfig(t)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			name      string
			got, want any
		}{
			{"Protocol", cfg.Protocol, consumer.Classic},
			{"SessionTimeout", cfg.SessionTimeout, consumer.DefaultSessionTimeout},
			{"RebalanceTimeout", cfg.RebalanceTimeout, consumer.DefaultRebalanceTimeout},
			{"BatchMax", cfg.BatchMax, consumer.DefaultBatchMax},
			{"CommitSpan", cfg.CommitSpan, consumer.DefaultCommitSpan},
			{"BatchMaxBytes", cfg.BatchMaxBytes, int64(consumer.DefaultBatchMaxBytes)},
			{"PartitionBufferBytes", cfg.PartitionBufferBytes, int64(consumer.DefaultPartitionBufferBytes)},
			{"WorkerBufferBytes", cfg.WorkerBufferBytes, int64(consumer.DefaultWorkerBufferBytes)},
			{"MaxAttempts", cfg.MaxAttempts, consumer.DefaultMaxAttempts},
			{"HandlerTimeout", cfg.HandlerTimeout, consumer.DefaultHandlerTimeout},
			{"ShutdownTimeout", cfg.ShutdownTimeout, consumer.DefaultShutdownTimeout},
			{"FenceLogRetention.MaxAge", cfg.FenceLogRetention.MaxAge, consumer.DefaultFenceLogMaxAge},
			{"FenceLogRetention.MaxEntries", cfg.FenceLogRetention.MaxEntries, consumer.DefaultFenceLogMaxEntries},
		} {
			if c.got != c.want {
				t.Errorf("%s = %v, want consumer's default %v", c.name, c.got, c.want)
			}
		}
	})

	t.Run("ZeroIsConfigZero", func(t *testing.T) {
		for _, c := range []struct {
			flag  string
			field func(consumer.Config) int64
		}{
			{"--batch-linger", func(c consumer.Config) int64 { return int64(c.BatchLinger) }},
			{"--idle-in-tx-timeout", func(c consumer.Config) int64 { return int64(c.IdleInTxTimeout) }},
			{"--database-timeout", func(c consumer.Config) int64 { return int64(c.DatabaseTimeout) }},
			{"--fence-log-max-age", func(c consumer.Config) int64 { return int64(c.FenceLogRetention.MaxAge) }},
			{"--fence-log-max-entries", func(c consumer.Config) int64 { return int64(c.FenceLogRetention.MaxEntries) }},
		} {
			cfg, err := workerConfig(t, c.flag, "0")
			if err != nil {
				t.Errorf("%s 0: %v", c.flag, err)
			} else if got := c.field(cfg); got != 0 {
				t.Errorf("%s 0 sets the configuration's field to %d, want 0 (the default)", c.flag, got)
			}
		}
	})

	t.Run("ZeroRefused", func(t *testing.T) {
		for _, flag := range []string{"--session-timeout", "--rebalance-timeout", "--batch-max", "--batch-max-bytes", "--commit-span",
			"--partition-buffer-bytes", "--worker-buffer-bytes", "--max-attempts", "--handler-timeout", "--shutdown-timeout"} {
			_, err := workerConfig(t, flag, "0")
			var u usageError
			if !errors.As(err, &u) {
				t.Errorf("%s 0: %v, want a usage error", flag, err)
			}
		}
	})

	t.Run("CommitSpan", func(t *testing.T) {
		if cfg, err := workerConfig(t, "--commit-span", "16"); err != nil || cfg.CommitSpan != 16 {
			t.Errorf("--commit-span 16: CommitSpan %d, %v; want 16", cfg.CommitSpan, err)
		}
		var u usageError
		if _, err := workerConfig(t, "--commit-span", "16", "--strict"); !errors.As(err, &u) || !strings.Contains(err.Error(), "--commit-span 16 is not for --strict") {
			t.Errorf("--commit-span 16 --strict: %v, want a usage error saying it is not for --strict", err)
		}
		// The default is the consumer's; strict and unfenced workers,
		// whose commit paths take one batch a transaction, get 1 unasked.
		if cfg, err := workerConfig(t); err != nil || cfg.CommitSpan != consumer.DefaultCommitSpan || cfg.CommitTransactions != consumer.DefaultCommitTransactions {
			t.Errorf("no flag: CommitSpan %d, CommitTransactions %d, %v; want the defaults", cfg.CommitSpan, cfg.CommitTransactions, err)
		}
		for _, mode := range []string{"--strict", "--unsafe-no-fence"} {
			if cfg, err := workerConfig(t, mode); err != nil || cfg.CommitSpan != 1 {
				t.Errorf("%s: CommitSpan %d, %v; want 1", mode, cfg.CommitSpan, err)
			}
		}
		if cfg, err := workerConfig(t, "--commit-transactions", "1"); err != nil || cfg.CommitTransactions != 1 {
			t.Errorf("--commit-transactions 1: CommitTransactions %d, %v; want 1", cfg.CommitTransactions, err)
		}
		for _, n := range []string{"0", "65"} {
			if _, err := workerConfig(t, "--commit-transactions", n); !errors.As(err, &u) {
				t.Errorf("--commit-transactions %s: %v, want a usage error", n, err)
			}
		}
	})

	t.Run("NegativeIsNoLimit", func(t *testing.T) {
		cfg, err := workerConfig(t, "--fence-log-max-age", "-1s", "--fence-log-max-entries", "-1")
		if err != nil {
			t.Fatal(err)
		}
		if r := cfg.FenceLogRetention; r.MaxAge >= 0 || r.MaxEntries >= 0 || r.Enabled() {
			t.Errorf("FenceLogRetention = %+v, want no limit of either kind", r)
		}
	})
}

// `admin fences prune` reads 0 and negative values as the worker does.
func TestFencesPruneRetention(t *testing.T) {
	for _, c := range []struct {
		age     time.Duration
		entries int
		wantAge time.Duration
		wantN   int
	}{
		{0, 0, consumer.DefaultFenceLogMaxAge, consumer.DefaultFenceLogMaxEntries},
		{-time.Second, 0, -time.Second, consumer.DefaultFenceLogMaxEntries},
		{time.Hour, -1, time.Hour, -1},
	} {
		r := (&fencesPrune{maxAge: c.age, maxEntries: c.entries}).retention()
		if r.MaxAge != c.wantAge || r.MaxEntries != c.wantN {
			t.Errorf("--max-age %s --max-entries %d: %+v, want %s and %d", c.age, c.entries, r, c.wantAge, c.wantN)
		}
	}
}
