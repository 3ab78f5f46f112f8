package chaos

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/internal/testinfra/tenurebin"
)

var (
	durationFlag = flag.Duration("chaos.duration", 0, "how long faults are injected (default 90s, 30m with -chaos.soak) [TENURE_CHAOS_DURATION]")
	workersFlag  = flag.Int("chaos.workers", 0, "worker processes, at least 3 (default 3) [TENURE_CHAOS_WORKERS]")
	seedFlag     = flag.Int64("chaos.seed", 0, "seed of the fault schedule and the jobs (default: from the clock) [TENURE_CHAOS_SEED]")
	soakFlag     = flag.Bool("chaos.soak", false, "long run: 30m of faults (needs -timeout 0) [TENURE_CHAOS_SOAK]")
	rateFlag     = flag.Int("chaos.rate", 0, "jobs produced per second (default 100) [TENURE_CHAOS_RATE]")
	protocolFlag = flag.String("chaos.protocol", "", "group protocol of the workers: classic or consumer (default classic) [TENURE_CHAOS_PROTOCOL]")
	keepFlag     = flag.Bool("chaos.keep", false, "keep the logs directory even when the run passes [TENURE_CHAOS_KEEP]")
	strictFlag   = flag.Bool("chaos.strict", false, "workers run with --strict (strict hand-off), and the run checks G3-strict: no batch became visible after its assignment was superseded (classic protocol, single server) [TENURE_CHAOS_STRICT]")
	postgresFlag = flag.String("chaos.postgres", "", "the run's PostgreSQL: single (one throwaway server, pg-restart faults) or formation (pg_auto_failover, pg-failover faults) (default single) [TENURE_CHAOS_POSTGRES]")
	spanFlag     = flag.Int("chaos.commit-span", 0, "workers run with --commit-span N (commits that span partitions; plain workers only, so not with -chaos.strict) (default: the worker's, consumer.DefaultCommitSpan, or 1 with -chaos.strict; 1: each batch in its own transaction) [TENURE_CHAOS_COMMIT_SPAN]")
	spanTxsFlag  = flag.Int("chaos.commit-transactions", 0, "plain workers run with --commit-transactions N (the joint transactions at once; 1 makes every waiting batch share the next, so that a run over a few partitions shares) (default: the worker's) [TENURE_CHAOS_COMMIT_TRANSACTIONS]")
	kindsFlag    = flag.String("chaos.kinds", "", "deal only these fault kinds, comma separated (default: every kind) [TENURE_CHAOS_KINDS]")
)

const (
	shortDuration = 90 * time.Second
	soakDuration  = 30 * time.Minute
)

// config is one run's settings, from flags, else the environment, else the
// defaults.
type config struct {
	duration time.Duration
	workers  int
	seed     int64
	soak     bool
	rate     int
	protocol string
	keep     bool
	postgres string // postgresSingle or postgresFormation
	strict   bool
	span     int      // --commit-span of the plain workers (1: each batch its own)
	spanTxs  int      // --commit-transactions of the plain workers (0: the worker's default)
	kinds    []string // the kinds the deck deals (nil: all)
}

// loadConfig reads the run's settings: the flags, else the environment,
// else the defaults; then checks them.
func loadConfig() (config, error) {
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	env := func(flagName, envName string) (string, bool) {
		if set[flagName] {
			return "", false
		}
		v := os.Getenv(envName)
		return v, v != ""
	}
	c := config{duration: *durationFlag, workers: *workersFlag, seed: *seedFlag, soak: *soakFlag,
		rate: *rateFlag, protocol: *protocolFlag, keep: *keepFlag, postgres: *postgresFlag, strict: *strictFlag, span: *spanFlag, spanTxs: *spanTxsFlag}
	if err := c.fromEnv(env); err != nil {
		return c, err
	}
	ks := *kindsFlag
	if v, ok := env("chaos.kinds", "TENURE_CHAOS_KINDS"); ok {
		ks = v
	}
	if err := c.parseKinds(ks); err != nil {
		return c, err
	}
	c.fillDefaults()
	return c, c.check()
}

// fromEnv sets what the environment says of each setting whose flag was
// not given.
func (c *config) fromEnv(env func(flagName, envName string) (string, bool)) error {
	for _, x := range []struct {
		flag, env string
		parse     func(v string) error
	}{
		{"chaos.soak", "TENURE_CHAOS_SOAK", func(v string) (err error) { c.soak, err = strconv.ParseBool(v); return err }},
		{"chaos.strict", "TENURE_CHAOS_STRICT", func(v string) (err error) { c.strict, err = strconv.ParseBool(v); return err }},
		{"chaos.keep", "TENURE_CHAOS_KEEP", func(v string) (err error) { c.keep, err = strconv.ParseBool(v); return err }},
		{"chaos.duration", "TENURE_CHAOS_DURATION", func(v string) (err error) { c.duration, err = time.ParseDuration(v); return err }},
		{"chaos.workers", "TENURE_CHAOS_WORKERS", func(v string) (err error) { c.workers, err = strconv.Atoi(v); return err }},
		{"chaos.seed", "TENURE_CHAOS_SEED", func(v string) (err error) { c.seed, err = strconv.ParseInt(v, 10, 64); return err }},
		{"chaos.commit-span", "TENURE_CHAOS_COMMIT_SPAN", func(v string) (err error) { c.span, err = strconv.Atoi(v); return err }},
		{"chaos.commit-transactions", "TENURE_CHAOS_COMMIT_TRANSACTIONS", func(v string) (err error) { c.spanTxs, err = strconv.Atoi(v); return err }},
		{"chaos.rate", "TENURE_CHAOS_RATE", func(v string) (err error) { c.rate, err = strconv.Atoi(v); return err }},
		{"chaos.protocol", "TENURE_CHAOS_PROTOCOL", func(v string) error { c.protocol = v; return nil }},
		{"chaos.postgres", "TENURE_CHAOS_POSTGRES", func(v string) error { c.postgres = v; return nil }},
	} {
		if v, ok := env(x.flag, x.env); ok {
			if err := x.parse(v); err != nil {
				return fmt.Errorf("%s=%q: %v", x.env, v, err)
			}
		}
	}
	return nil
}

// parseKinds sets the kinds the deck deals from a comma-separated list.
func (c *config) parseKinds(ks string) error {
	for _, k := range strings.Split(ks, ",") {
		if k = strings.TrimSpace(k); k == "" {
			continue
		}
		if !slices.Contains(kinds, k) {
			return fmt.Errorf("-chaos.kinds: %q is not a fault kind (%s)", k, strings.Join(kinds, ", "))
		}
		if !slices.Contains(c.kinds, k) {
			c.kinds = append(c.kinds, k)
		}
	}
	return nil
}

// fillDefaults sets the defaults of what is still unset.
func (c *config) fillDefaults() {
	if c.postgres == "" {
		c.postgres = postgresSingle
	}
	if c.duration == 0 {
		c.duration = shortDuration
		if c.soak {
			c.duration = soakDuration
		}
	}
	if c.workers == 0 {
		c.workers = 3
	}
	if c.span == 0 {
		// The worker's own default, said on its command line all the same
		// (workers), so that the summary and the replay line name it.
		c.span = consumer.DefaultCommitSpan
		if c.strict {
			c.span = 1
		}
	}
	if c.rate == 0 {
		c.rate = 100
	}
	if c.protocol == "" {
		c.protocol = "classic"
	}
	if c.seed == 0 {
		c.seed = time.Now().UnixNano() % 1_000_000_000
	}
}

// check refuses settings a run cannot have.
func (c config) check() error {
	switch {
	case c.duration < 10*time.Second:
		return fmt.Errorf("chaos duration %s is too short to inject anything (at least 10s)", c.duration)
	case c.workers < 3:
		return fmt.Errorf("chaos runs need at least 3 workers, not %d", c.workers)
	case c.rate < 1 || c.rate > 5000:
		return fmt.Errorf("job rate %d/s is not in [1, 5000]", c.rate)
	case c.protocol != "classic" && c.protocol != "consumer":
		return fmt.Errorf("protocol %q is not classic or consumer", c.protocol)
	case c.postgres != postgresSingle && c.postgres != postgresFormation:
		return fmt.Errorf("-chaos.postgres %q is not %s or %s", c.postgres, postgresSingle, postgresFormation)
	// kfake's KIP-848 offset commit rule accepts an ended assignment's
	// commit (docs/model/strict.pml), so strict hand-off runs on classic;
	// the formation's failover is covered by its own run.
	case c.strict && c.protocol != "classic":
		return fmt.Errorf("-chaos.strict runs on the classic protocol: kfake's KIP-848 offset commit rule cannot carry strict hand-off")
	case c.span < 1:
		return fmt.Errorf("-chaos.commit-span %d: want 1 (each batch in its own transaction) or more", c.span)
	case c.spanTxs < 0:
		return fmt.Errorf("-chaos.commit-transactions %d: want 1 or more", c.spanTxs)
	case c.spanTxs > 0 && (c.strict || c.span == 1):
		return fmt.Errorf("-chaos.commit-transactions %d is for workers whose commits span partitions (not -chaos.strict, not -chaos.commit-span 1)", c.spanTxs)
	case c.span > 1 && c.strict:
		return fmt.Errorf("-chaos.commit-span %d: strict workers commit each batch in its own transaction (the worker refuses --commit-span with --strict)", c.span)
	case c.strict && c.postgres != postgresSingle:
		return fmt.Errorf("-chaos.strict runs on a single server, not a formation")
	case slices.Contains(c.kinds, kindPGFailover) && c.postgres != postgresFormation:
		return fmt.Errorf("-chaos.kinds %s needs -chaos.postgres formation", kindPGFailover)
	case slices.Contains(c.kinds, kindPGRestart) && c.postgres == postgresFormation:
		return fmt.Errorf("-chaos.kinds %s: a formation deals %s instead", kindPGRestart, kindPGFailover)
	}
	return nil
}

// tenureBin is the `tenure` binary, built once for the package.
var tenureBin string

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run()) // TestChaos skips itself: no binary needed
	}
	os.Exit(tenurebin.Run(m, &tenureBin))
}
