package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/tenure-dev/tenure/sink"
)

func init() {
	register(command{name: "admin", summary: "inspect topics, groups, assignments, fencing rows and dead letters; create topics, replay jobs", run: runAdmin})
}

// adminTimeout bounds each admin command's broker and database round trips,
// so that an unreachable server is an error, not a hang.
const adminTimeout = 15 * time.Second

// adminCommand is one `tenure admin` subcommand; name may be two words
// ("topic create").
type adminCommand struct {
	name    string
	args    string // usage after the name
	summary string
	run     func(ctx context.Context, e *env, f *flagSet, args []string) error
}

func adminCommands() []adminCommand {
	return append([]adminCommand{
		{"topic create", "--brokers HOST:PORT[,..] --topic T --partitions N [--replication-factor R] [--if-not-exists]",
			"create a topic", runTopicCreate},
		{"topic describe", "--brokers HOST:PORT[,..] --topic T [--output table|json]",
			"a topic's partitions, leaders and high watermarks", runTopicDescribe},
		{"topic add-partitions", "--brokers HOST:PORT[,..] --topic T --partitions N",
			"grow a topic to N partitions (its groups then hold it until acknowledge-partitions)", runAddPartitions},
		{"topic acknowledge-partitions", "--brokers HOST:PORT[,..] --database-url URL --group G --topic T [--partitions N] [--schema S] [--actor A]",
			"accept a topic's new partition count (read from Kafka) for a group, so that its workers resume it", runAcknowledgePartitions},
		{"group delete", "--brokers HOST:PORT[,..] --database-url URL --group G [--schema S] [--actor A]",
			"delete an empty consumer group, moving its incarnation on first", runGroupDelete},
		{"groups", "--brokers HOST:PORT[,..] [--output table|json]",
			"list consumer groups: type, state, protocol, member count", runGroups},
		{"assignments", "--brokers HOST:PORT[,..] --group G --database-url URL [--schema S] [--topic T[,T2]] [--output table|json]",
			"per partition, the coordinator's assignment beside Postgres's fencing row, and the lag", runAssignments},
		{"fences prune", "--database-url URL [--schema S] [--group G] [--max-age D] [--max-entries N]",
			"bound the fence log: remove old entries, keeping each partition's claim and the newest", runFencesPrune},
		{"fences", "--database-url URL [--schema S] [--group G] [--output table|json]",
			"the fencing rows in Postgres", runFences},
		{"holds acknowledge", "--database-url URL [--schema S] --group G --topic T --partition P [--brokers B] [--actor A]",
			"let the workers go on with a held partition (moves its offset to where the log now is, for holds about the log)", runHoldAcknowledge},
		{"holds", "--database-url URL [--schema S] [--group G] [--output table|json]",
			"partitions workers do not process, and why: stalled (recovering by itself), handler bugs, offsets that do not fit the log", runHolds},
		{"dlq list", "--database-url URL [--schema S] [--group G] [--topic T] [--status dead|replayed|discarded|all] [--limit N] [--output table|json]",
			"dead-lettered jobs, oldest first (default: those still dead)", runDLQList},
		{"dlq show", "ID --database-url URL [--schema S] [--output table|json]",
			"one dead letter in full: job, headers, error, attempts, token, owner, and what was done to it", runDLQShow},
		{"dlq replay", "ID [ID...] --brokers HOST:PORT[,..] --database-url URL [--schema S] [--actor A]",
			"re-produce dead letters to their topic (same key, value and headers) and record it", runDLQReplay},
		{"dlq discard", "ID [ID...] --database-url URL [--schema S] [--actor A]",
			"mark dead letters as dealt with, without replaying them, and record it", runDLQDiscard},
	}, exportCommands()...)
}

// printAdminUsage lists the admin subcommands whose names start with
// prefix ("" for all, "topic ", "dlq " or "exports " for a group).
func printAdminUsage(w io.Writer, prefix string) {
	fmt.Fprintf(w, "usage: tenure admin %s<subcommand> [flags]\n\n", prefix)
	for _, c := range adminCommands() {
		if strings.HasPrefix(c.name, prefix) {
			fmt.Fprintf(w, "  %-29s %s\n", c.name, c.summary)
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "Flags also read TENURE_* environment variables (flags win). 'tenure admin %s<subcommand> --help' for its flags.\n", prefix)
}

// adminGroups are the first words of two-word subcommands.
var adminGroups = []string{"topic", "dlq", "group", "exports"}

func runAdmin(ctx context.Context, e *env, args []string) error {
	if len(args) == 0 {
		printAdminUsage(e.stderr, "")
		return usagef("a subcommand is required")
	}
	if isHelp(args[0]) {
		printAdminUsage(e.stdout, "")
		return flag.ErrHelp
	}
	for _, c := range adminCommands() {
		words := strings.Fields(c.name)
		if len(args) < len(words) || strings.Join(args[:len(words)], " ") != c.name {
			continue
		}
		f := newFlagSet(e, "admin "+c.name, c.args)
		err := c.run(ctx, e, f, args[len(words):])
		var ue usageError
		if errors.As(err, &ue) {
			// A flag error printed the usage line; other usage errors get
			// it here.
			if !f.usagePrinted {
				f.printUsageLine(e.stderr)
			}
			return usageError{msg: ue.msg, cmd: "admin " + c.name}
		}
		if err != nil && !errors.Is(err, flag.ErrHelp) {
			return commandError{cmd: "admin " + c.name, err: err}
		}
		return err
	}
	for _, g := range adminGroups {
		if args[0] != g {
			continue
		}
		switch {
		case len(args) == 1:
			printAdminUsage(e.stderr, g+" ")
			return usageError{msg: fmt.Sprintf("%q needs a subcommand", "admin "+g), cmd: "admin " + g}
		case isHelp(args[1]):
			printAdminUsage(e.stdout, g+" ")
			return flag.ErrHelp
		}
		printAdminUsage(e.stderr, g+" ")
		return usageError{msg: fmt.Sprintf("unknown subcommand %q", g+" "+args[1]), cmd: "admin " + g}
	}
	printAdminUsage(e.stderr, "")
	return usagef("unknown subcommand %q", args[0])
}

// outputFlag adds --output and returns a checker for it.
func outputFlag(f *flagSet) func() (string, error) {
	out := f.String("output", "table", "output format: table or json")
	return func() (string, error) {
		if *out != "table" && *out != "json" {
			return "", usagef("--output %q is not table or json", *out)
		}
		return *out, nil
	}
}

// dbFlags are --database-url and --schema, shared by the commands that read
// tenure's tables.
type dbFlags struct {
	url    *string
	schema func() (string, error)
}

func addDBFlags(f *flagSet) dbFlags {
	return dbFlags{
		url:    f.String("database-url", "", "PostgreSQL URL (libpq PG* variables fill in what it leaves out)"),
		schema: schemaFlag(f),
	}
}

// check validates both flags (usage errors) and returns the schema.
func (d dbFlags) check() (string, error) {
	if err := required("database-url", *d.url); err != nil {
		return "", err
	}
	return d.schema()
}

func schemaFlag(f *flagSet) func() (string, error) {
	s := f.String("schema", sink.DefaultSchema, "Postgres schema of tenure's tables")
	return func() (string, error) {
		if err := sink.ValidateSchema(*s); err != nil {
			return "", usageError{msg: err.Error()}
		}
		return *s, nil
	}
}

// writeJSON writes v indented, with a final newline.
func writeJSON(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
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

// kafkaError turns a failed admin request into one sentence.
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

// dbError turns a failed read of the fencing tables into one sentence.
func dbError(schema string, err error) error {
	switch {
	case sink.IsMissingTables(err):
		return fmt.Errorf("schema %q has no tenure tables: run `tenure migrate up --schema %s` (or give the right --schema)", schema, schema)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("the database did not answer within %s: %v", adminTimeout, err)
	}
	return fmt.Errorf("reading the fencing rows: %v", pgxCauseOf(err))
}

func pgxCauseOf(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Message
	}
	return err.Error()
}
