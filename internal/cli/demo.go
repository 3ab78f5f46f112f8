package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenure-dev/tenure/export"
	"github.com/tenure-dev/tenure/internal/demo"
	"github.com/tenure-dev/tenure/sink"
)

// localDatabaseURL is the local server scripts/ensure-postgres.sh sets up:
// the demo's and the bench's default.
const localDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

const demoDefaultSchema = "tenure_demo"

var demoSpec = spec{name: "demo", short: "replay the paused-worker story live on a local broker and Postgres",
	long: `Replays the story tenure exists for, live, with real processes: worker A takes
a batch of jobs and is frozen (SIGSTOP) before it writes them; the group hands
its partition to worker B, which publishes newer exports; A is resumed
(SIGCONT) and tries to publish its old batch. Postgres must reject it.

The workers export to an object store (--export-store; default a new
directory under the system's temporary directory, kept afterwards): each
job's bytes are staged under an immutable name, and the key's pointer moves
in the fenced transaction. A's objects get staged; they are never published.

It starts a development broker (kfake) in-process, two 'tenure worker'
processes, and uses PostgreSQL at --database-url (default: the local server,
` + localDatabaseURL + `).
The schema (default ` + demoDefaultSchema + `) is DROPPED and re-created at every start, so
that each run is clean; a schema the demo did not create is never dropped.
It is kept afterwards for inspection. Exit status 0 only if A's stale batch was rejected
and the history checker found no violation.`}

// demoCmd is `tenure demo`; the story is internal/demo's.
type demoCmd struct {
	base
	logs                                       logFlags
	dbURL, schema, storeURL, keyList, protocol string
	jobs                                       int
	session                                    time.Duration
	verbose, strict                            bool
}

func (c *demoCmd) define(f *flagSet) {
	f.String(&c.dbURL, "database-url", localDatabaseURL, "PostgreSQL URL", arg("URL"))
	// Not read from TENURE_SCHEMA: that variable names the workers' real
	// schema, and this one is dropped.
	f.String(&c.schema, "schema", demoDefaultSchema, "Postgres schema for the demo, dropped and re-created at start (not read from TENURE_SCHEMA)", arg("S"), noEnv)
	f.String(&c.storeURL, "export-store", "", "object store the workers export to (default: file:// a new directory under the system's temporary directory)", arg("URL"), noEnv)
	f.String(&c.keyList, "keys", "acme,globex,initech,umbrella,hooli", "job keys (customers), comma separated", arg("K1,K2,.."))
	f.Int(&c.jobs, "jobs", 20, "jobs produced at start (worker A takes the first batch of them); half as many again arrive while A is frozen")
	f.Duration(&c.session, "session-timeout", 3*time.Second, "group session timeout: how long a frozen worker keeps its partition")
	f.String(&c.protocol, "protocol", "classic", "group protocol: classic or consumer (KIP-848)", arg("classic|consumer"))
	f.Bool(&c.strict, "strict", false, "run the workers with --strict (strict hand-off): A is frozen with its batch prepared, before its offset commit; B's claim rolls it back; the database needs max_prepared_transactions above 0 (classic protocol only)")
	f.Bool(&c.verbose, "verbose", false, "echo the workers' JSON logs to stderr, prefixed with their name")
	c.logs.define(f, "console", "warn")
}

func (c *demoCmd) check([]string) error {
	if strings.TrimSpace(c.dbURL) == "" {
		return usagef("--database-url is required (or set %s)", envName("database-url"))
	}
	if err := sink.ValidateSchema(c.schema); err != nil {
		return err
	}
	if c.schema == "public" || c.schema == sink.DefaultSchema || c.schema == "information_schema" || strings.HasPrefix(c.schema, "pg_") {
		return usagef("--schema %s is not a schema the demo may drop: pick a name of its own (default %s)", c.schema, demoDefaultSchema)
	}
	if len(splitList(c.keyList)) == 0 {
		return usagef("--keys needs at least one key")
	}
	if c.jobs < 1 || c.jobs > 100_000 {
		return usagef("--jobs must be between 1 and 100000")
	}
	if c.session < time.Second || c.session > 5*time.Minute {
		return usagef("--session-timeout must be between 1s and 5m")
	}
	if c.protocol != "classic" && c.protocol != "consumer" {
		return usagef("--protocol %q is not classic or consumer", c.protocol)
	}
	if c.strict && c.protocol != "classic" {
		return usagef("--strict runs on the classic protocol: the demo's broker (kfake) has a KIP-848 offset commit rule strict hand-off cannot hold on")
	}
	return nil
}

func (c *demoCmd) run(ctx context.Context) error {
	log, err := newLogger(c.stderr, c.logs.format, c.logs.level)
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()
	// The database first: without it there is nothing to show, and the
	// one sentence must say how to get one.
	pool, err := openDB(ctx, c.dbURL)
	if err != nil {
		if ctx.Err() != nil {
			return demo.ErrInterrupted
		}
		return demoDBAdvice(c.dbURL, err)
	}
	defer pool.Close()
	if c.storeURL == "" {
		dir, err := os.MkdirTemp("", "tenure-demo-exports-")
		if err != nil {
			return err
		}
		c.storeURL = "file://" + dir
	}
	st, err := export.Open(ctx, c.storeURL)
	if err != nil {
		return usageError{msg: err.Error()}
	}
	cfg := demo.Config{Pool: pool, DatabaseURL: c.dbURL, Schema: c.schema, StoreURL: c.storeURL, Store: st,
		Keys: splitList(c.keyList), Jobs: c.jobs, SessionTimeout: c.session, Protocol: c.protocol, Strict: c.strict, Stdout: c.stdout, Log: log}
	if c.verbose {
		cfg.Echo = c.stderr
	}
	return demo.Run(ctx, cfg)
}

// demoDBAdvice adds to openDB's sentence what to do: start a server when
// nothing listens, fix the URL when something does and refused us.
func demoDBAdvice(url string, err error) error {
	if strings.HasPrefix(err.Error(), "the database URL") {
		return fmt.Errorf("%v; set TENURE_DATABASE_URL (or --database-url) to a URL like %s", err, localDatabaseURL)
	}
	var refused *dbRefusedError
	if errors.As(err, &refused) {
		return fmt.Errorf("%v; fix TENURE_DATABASE_URL (or --database-url)", err)
	}
	if cfg, perr := pgxpool.ParseConfig(url); perr == nil {
		network, addr := "tcp", net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port)))
		if strings.HasPrefix(cfg.ConnConfig.Host, "/") {
			network, addr = "unix", fmt.Sprintf("%s/.s.PGSQL.%d", cfg.ConnConfig.Host, cfg.ConnConfig.Port)
		}
		if c, derr := net.DialTimeout(network, addr, 2*time.Second); derr == nil {
			_ = c.Close()
			return fmt.Errorf("%v; a server answers there, so fix the user, password or database in TENURE_DATABASE_URL (or --database-url)", err)
		}
	}
	return fmt.Errorf("%v; start PostgreSQL (as root: `bash scripts/ensure-postgres.sh`) or set TENURE_DATABASE_URL (or --database-url) to a server you can reach", err)
}
