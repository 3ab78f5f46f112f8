package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tenure-dev/tenure/sink"
)

// adminTimeout bounds each admin command's broker and database round trips,
// so that an unreachable server is an error, not a hang.
const adminTimeout = 15 * time.Second

// adminCommand builds `tenure admin` and its subcommands.
func (t *tree) adminCommand() *cobra.Command {
	a := func(s spec, c adminRunner) *cobra.Command { return t.leaf(s, adminLeaf{c}) }
	return t.group("admin", "inspect topics, groups, assignments, fencing rows, holds, dead letters and exports; operate on them",
		t.group("topic", "create, describe and grow topics",
			a(spec{name: "create", short: "create a topic"}, &topicCreate{}),
			a(spec{name: "describe", short: "a topic's partitions, leaders and high watermarks"}, &topicDescribe{}),
			a(spec{name: "add-partitions", short: "grow a topic to N partitions (its groups then hold it until acknowledge-partitions)"}, &addPartitions{}),
			a(spec{name: "acknowledge-partitions", short: "accept a topic's new partition count (read from Kafka) for a group, so that its workers resume it"}, &acknowledgePartitions{}),
			a(spec{name: "list", short: "the topics on the brokers: partitions, replication factor, internal or not"}, &topicList{}),
		),
		t.group("group", "operate on a consumer group",
			a(spec{name: "delete", short: "delete an empty consumer group, moving its incarnation on first"}, &groupDelete{}),
		),
		a(spec{name: "groups", short: "list consumer groups: type, state, protocol, member count"}, &groupsList{}),
		a(spec{name: "assignments", short: "per partition, the coordinator's assignment beside Postgres's fencing row, the lag, and whether it progresses (and for how long not)"}, &assignments{}),
		withSubs(a(spec{name: "fences", short: "the fencing rows in Postgres"}, &fences{}),
			a(spec{name: "prune", short: "bound the fence log: remove old entries, keeping each partition's claim and the newest"}, &fencesPrune{}),
		),
		withSubs(a(spec{name: "holds", short: "partitions workers do not process, and why: stalled (recovering by itself), handler bugs, offsets that do not fit the log"}, &holds{}),
			a(spec{name: "acknowledge", short: "let the workers go on with a held partition (moves its offset to where the log now is, for holds about the log)"}, &holdAcknowledge{}),
		),
		t.group("offsets", "move a group's stored offsets through the fence",
			a(spec{name: "reset", short: "move a group's offsets (to the log's start or end, an offset, a shift, a time) while workers run: shows the plan, or with --execute does it"}, &offsetsReset{}),
		),
		a(spec{name: "job", args: "TOPIC/PARTITION/OFFSET", maxArgs: 1, short: "what became of one job for a group: committed (when, by whom), dead-lettered, pending, lost, or not in the log"}, &jobLookup{}),
		t.group("jobs", "read jobs from a topic: peek, tail",
			a(spec{name: "peek", short: "print K jobs of a topic from an offset (key, headers, value; exact bytes escaped) and exit"}, &jobsRead{}),
			a(spec{name: "tail", short: "print a topic's new jobs as they arrive, until interrupted (or --count)"}, &jobsRead{follow: true}),
		),
		t.group("dlq", "the dead-letter table: list, show, replay, discard",
			a(spec{name: "list", short: "dead-lettered jobs, oldest first (default: those still dead)"}, &dlqList{}),
			a(spec{name: "show", args: "ID", maxArgs: -1, short: "one dead letter in full: job, headers, error, attempts, token, owner, and what was done to it"}, &dlqShow{}),
			a(spec{name: "replay", args: "ID [ID...]", maxArgs: -1, short: "re-produce dead letters to their topic (same key, value and headers) and record it"}, &dlqReplay{}),
			a(spec{name: "discard", args: "ID [ID...]", maxArgs: -1, short: "mark dead letters as dealt with, without replaying them, and record it"}, &dlqDiscard{}),
		),
		t.group("exports", "exports in an object store: get, list, gc",
			a(spec{name: "get", args: "KEY", maxArgs: 1, short: "a key's published export: its bytes (checked against the recorded SHA-256), or its metadata as JSON"}, &exportsGet{}),
			a(spec{name: "list", short: "the export pointers: per key, the visible object and the job and token that published it"}, &exportsList{}),
			a(spec{name: "gc", short: "delete the objects no pointer names and no live writer can still publish (safe while workers run)"}, &exportsGC{}),
		),
		a(serveSpec, &serveCmd{}),
	)
}

// withSubs adds subcommands to a command that runs on its own too
// (`admin fences`, `admin fences prune`).
func withSubs(c *cobra.Command, subs ...*cobra.Command) *cobra.Command {
	c.AddCommand(subs...)
	return c
}

// adminRunner is one admin command's own part; admin is the rest.
type adminRunner interface {
	runner
	adminBase() *admin
}

// adminLeaf runs an admin command: the shared flags' checks before the
// command's own, its run within adminTimeout (unless it bounds its own
// round trips), and the connections it opened closed after it.
type adminLeaf struct{ c adminRunner }

func (l adminLeaf) setEnv(e *env) { l.c.adminBase().setEnv(e) }

func (l adminLeaf) define(f *flagSet) { l.c.define(f) }

func (l adminLeaf) check(args []string) error {
	if err := l.c.adminBase().checkShared(); err != nil {
		return err
	}
	return l.c.check(args)
}

func (l adminLeaf) run(ctx context.Context) error {
	a := l.c.adminBase()
	// TLS and SASL flags that do not fit together are bad usage; files
	// they name that cannot be read, a failure: checked before anything
	// connects.
	if a.kafka != nil {
		if _, err := a.kafka.kgoOpts(nil); err != nil {
			return err
		}
	}
	defer a.close()
	a.ctx = ctx
	if !a.ownTimeouts {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, adminTimeout)
		defer cancel()
	}
	// A --group or --topic the database has never seen (known.go).
	if nc, ok := l.c.(namesChecked); ok {
		refs := nc.names()
		err := a.checkNames(ctx, refs)
		var unknown unknownNameError
		switch {
		case errors.As(err, &unknown) && refs.warnOnly:
			fmt.Fprintf(a.stderr, "tenure: warning: %s\n", a.secrets.redact(unknown.msg))
		case err != nil:
			return err
		}
	}
	return l.c.run(ctx)
}

// admin is what the admin commands share: the database flags
// (--database-url, --schema, PG* variables filling in what the URL leaves
// out), the Kafka flags (--brokers, TLS, SASL), --output, the connections,
// opened when first asked for and closed when the command ends, and the
// one sentence a failure becomes. A command declares the flags it takes
// with the db, kafka and output methods in its define.
type admin struct {
	*env
	// ctx is the command's context without adminTimeout: connections are
	// opened within their own bounds, as every command always did.
	ctx context.Context
	// ownTimeouts: the command bounds its round trips itself.
	ownTimeouts bool

	hasDB         bool
	dbURL, schema string
	kafka         *kafkaFlags
	output        string
	outputs       []string // what --output takes; nil: no --output

	pool    *pgxpool.Pool
	store   *sink.Store
	clients []*kgo.Client
}

func (a *admin) adminBase() *admin { return a }

func (a *admin) setEnv(e *env) { a.env = e }

// withDB adds --database-url (required) and --schema.
func (a *admin) withDB(f *flagSet) {
	a.hasDB = true
	f.String(&a.dbURL, "database-url", "", "PostgreSQL URL (libpq PG* variables fill in what it leaves out)", arg("URL"), required)
	f.String(&a.schema, "schema", sink.DefaultSchema, "Postgres schema of tenure's tables", arg("S"))
}

// withKafka adds --brokers and the TLS and SASL flags.
func (a *admin) withKafka(f *flagSet, brokersUsage string, brokersOpts ...flagOpt) {
	a.kafka = &kafkaFlags{}
	a.kafka.define(f, brokersUsage, brokersOpts...)
}

// withOutput adds --output: the first choice is the default.
func (a *admin) withOutput(f *flagSet, usage string, choices ...string) {
	a.outputs = choices
	f.String(&a.output, "output", choices[0], usage, arg(strings.Join(choices, "|")))
}

// withTableOutput adds --output for a command that prints a table, or its
// rows as JSON.
func (a *admin) withTableOutput(f *flagSet) {
	a.withOutput(f, "output format: table or json", "table", "json")
}

// checkShared validates the shared flags: the schema's name and --output.
func (a *admin) checkShared() error {
	if a.hasDB {
		if err := sink.ValidateSchema(a.schema); err != nil {
			return usageError{msg: err.Error()}
		}
	}
	if a.outputs != nil && !slices.Contains(a.outputs, a.output) {
		return usagef("--output %q is not %s or %s", a.output, strings.Join(a.outputs[:len(a.outputs)-1], ", "), a.outputs[len(a.outputs)-1])
	}
	return nil
}

// Pool is the database pool, opened on first use.
func (a *admin) Pool() (*pgxpool.Pool, error) {
	if a.pool == nil {
		pool, err := openDB(a.ctx, a.dbURL)
		if err != nil {
			return nil, err
		}
		a.pool = pool
	}
	return a.pool, nil
}

// Store is the store on --schema, opened on first use.
func (a *admin) Store() (*sink.Store, error) {
	if a.store == nil {
		pool, err := a.Pool()
		if err != nil {
			return nil, err
		}
		if a.store, err = sink.NewStore(pool, a.schema); err != nil {
			return nil, err
		}
	}
	return a.store, nil
}

// brokers is --brokers as a list.
func (a *admin) brokers() []string { return a.kafka.list() }

// client makes a Kafka client with the TLS and SASL flags, closed when the
// command ends.
func (a *admin) client(extra ...kgo.Opt) (*kgo.Client, error) {
	cl, err := a.kafka.client(a.brokers(), extra...)
	if err != nil {
		return nil, err
	}
	a.clients = append(a.clients, cl)
	return cl, nil
}

func (a *admin) close() {
	for _, cl := range a.clients {
		cl.Close()
	}
	if a.pool != nil {
		a.pool.Close()
	}
}

// dbError turns a failed read or write of tenure's tables into one
// sentence: what was being done, and why it failed.
func (a *admin) dbError(what string, err error) error {
	return a.dbErrorWithin(what, err, adminTimeout)
}

// dbErrorWithin is dbError for a round trip bounded by bound.
func (a *admin) dbErrorWithin(what string, err error, bound time.Duration) error {
	switch {
	case sink.IsMissingTables(err):
		return a.missingTables()
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%s: the database did not answer within %s", what, bound)
	case pgconn.Timeout(err):
		// The connection's own bounds (TCP's, not the command's).
		return fmt.Errorf("%s: the connection to the database timed out (%s)", what, pgxCauseOf(err))
	}
	return fmt.Errorf("%s: %s", what, pgxCauseOf(err))
}

// missingTables says why --schema has not the table a command reads: the
// schema does not exist (the schemas that hold tenure's tables are named:
// a mistyped or forgotten --schema is the usual cause), it holds no tenure
// tables, or it is a tenure schema behind this binary's migrations.
func (a *admin) missingTables() error {
	ctx, cancel := context.WithTimeout(a.ctx, adminTimeout)
	defer cancel()
	generic := fmt.Errorf("schema %q has no tenure tables: give the right --schema, or run `tenure migrate up --schema %s`", a.schema, a.schema)
	if a.pool == nil {
		return generic
	}
	exists, err := schemaExists(ctx, a.pool, a.schema)
	if err != nil {
		return generic
	}
	if !exists {
		return missingSchema(ctx, a.pool, a.schema)
	}
	schemas, err := tenureSchemas(ctx, a.pool)
	if err != nil {
		return generic
	}
	if !slices.Contains(schemas, a.schema) {
		return fmt.Errorf("schema %q holds no tenure tables; schemas with tenure tables: %s; give the right --schema, or run `tenure migrate up --schema %s` to add them to it",
			a.schema, schemaList(schemas), a.schema)
	}
	if behind := sink.CheckSchema(ctx, a.pool, a.schema); behind != nil {
		return behind
	}
	return generic
}

// kafkaError turns a failed Kafka request into one sentence.
func (a *admin) kafkaError(what string, err error) error { return kafkaError(what, a.brokers(), err) }

// kafkaError turns a failed admin request to brokers into one sentence.
func kafkaError(what string, brokers []string, err error) error {
	// kadm reports per-broker failures as ShardErrors; the first says why.
	var se *kadm.ShardErrors
	if errors.As(err, &se) && len(se.Errs) > 0 && se.Errs[0].Err != nil {
		err = se.Errs[0].Err
	}
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("cannot reach the Kafka brokers %s (%s): no answer within %s", strings.Join(brokers, ","), what, adminTimeout)
	}
	if errors.Is(err, syscall.ECONNREFUSED) || errors.As(err, &ne) {
		return fmt.Errorf("cannot reach the Kafka brokers %s (%s): %v", strings.Join(brokers, ","), what, err)
	}
	return fmt.Errorf("%s failed: %v%s", what, err, securityHint(err))
}

// pgxCauseOf is the server's message of a failed statement, or the error.
func pgxCauseOf(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Message
	}
	return err.Error()
}

// json writes v indented, with a final newline.
func (a *admin) json(v any) error { return writeJSON(a.stdout, v) }

func writeJSON(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// table is a writer of aligned columns on stdout; Flush prints it.
func (a *admin) table() *tabwriter.Writer { return tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0) }

// nothingListed tells stderr that a listing came out empty: "no WHAT in
// schema S", with note after it when there is one.
func (a *admin) nothingListed(what, note string) {
	if note != "" {
		fmt.Fprintf(a.stderr, "no %s in schema %s; %s\n", what, a.schema, note)
		return
	}
	fmt.Fprintf(a.stderr, "no %s in schema %s\n", what, a.schema)
}

// actorFlag adds --actor: who is recorded as having replayed, discarded or
// acknowledged something. Default: $USER@host.
func (a *admin) actorFlag(f *flagSet, p *string) {
	user := f.e.getenv("USER")
	if user == "" {
		user = f.e.getenv("LOGNAME")
	}
	if user == "" {
		user = "unknown"
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	f.String(p, "actor", user+"@"+host, "who is recorded as doing this", arg("A"))
}

// checkActor refuses an empty --actor.
func checkActor(actor string) error {
	if strings.TrimSpace(actor) == "" {
		return usagef("--actor must not be empty")
	}
	return nil
}

// optionalGroup checks a --group that narrows a listing: empty means every
// group.
func optionalGroup(group string) error {
	return optional(group, func() error { return validGroup("group", group) })
}

// checkLimit refuses a --limit below 1.
func checkLimit(limit int) error {
	if limit < 1 {
		return usagef("--limit must be at least 1")
	}
	return nil
}

// dash renders an absent value in a table.
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func dashInt[T int32 | int64](v *T) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprint(*v)
}
