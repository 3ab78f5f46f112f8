package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/export"
	"github.com/tenure-dev/tenure/internal/devbroker"
	"github.com/tenure-dev/tenure/internal/history"
	"github.com/tenure-dev/tenure/sink"
)

func init() {
	register(command{name: "demo", summary: "replay the paused-worker story live on a local broker and Postgres", run: runDemo})
}

const (
	// demoDefaultDatabaseURL is the local server scripts/ensure-postgres.sh
	// sets up.
	demoDefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	demoDefaultSchema      = "tenure_demo"
	// demoSchemaComment marks a schema as the demo's own, so that a later
	// run may drop it; a schema with tables and without it is never dropped.
	demoSchemaComment = "tenure demo: dropped and re-created by every tenure demo run"
	// demoWait bounds every wait of the story.
	demoWait  = 60 * time.Second
	demoTopic = "jobs"
)

const demoUsage = `[--database-url URL] [--schema S] [--export-store URL] [--keys K1,K2,..] [--jobs N] [--session-timeout D]
    [--protocol classic|consumer] [--verbose] [--log-format console|json] [--log-level L]

Replays the story tenure exists for, live, with real processes: worker A takes
a batch of jobs and is frozen (SIGSTOP) before it writes them; the group hands
its partition to worker B, which publishes newer exports; A is resumed
(SIGCONT) and tries to publish its old batch. Postgres must reject it.

The workers export to an object store (--export-store; default a new
directory under the system's temporary directory, kept afterwards): each
job's bytes are staged under an immutable name, and the key's pointer moves
in the fenced transaction. A's objects get staged; they are never published.

It starts a development broker (kfake) in-process, two 'tenure worker'
processes, and uses PostgreSQL at --database-url (default: the local server,
` + demoDefaultDatabaseURL + `).
The schema (default ` + demoDefaultSchema + `) is DROPPED and re-created at every start, so
that each run is clean; a schema the demo did not create is never dropped.
It is kept afterwards for inspection. Exit status 0 only if A's stale batch was rejected
and the history checker found no violation.`

func runDemo(ctx context.Context, e *env, args []string) error {
	f := newFlagSet(e, "demo", demoUsage)
	dbURL := f.String("database-url", demoDefaultDatabaseURL, "PostgreSQL URL")
	// Deliberately not TENURE_SCHEMA: that variable names the workers' real
	// schema, and this one is dropped.
	schema := f.FlagSet.String("schema", demoDefaultSchema, "Postgres schema for the demo, dropped and re-created at start (not read from TENURE_SCHEMA)")
	storeURL := f.FlagSet.String("export-store", "", "object store the workers export to (default: file:// a new directory under the system's temporary directory)")
	keyList := f.String("keys", "acme,globex,initech,umbrella,hooli", "job keys (customers), comma separated")
	jobs := f.Int("jobs", 20, "jobs produced at start (worker A takes the first batch of them); half as many again arrive while A is frozen")
	session := f.Duration("session-timeout", 3*time.Second, "group session timeout: how long a frozen worker keeps its partition")
	protocol := f.String("protocol", "classic", "group protocol: classic or consumer (KIP-848)")
	verbose := f.Bool("verbose", false, "echo the workers' JSON logs to stderr, prefixed with their name")
	logFormat := f.String("log-format", "console", "format of the demo's own logs (stderr): console or json")
	logLevel := f.String("log-level", "warn", "level of the demo's own logs: debug, info, warn, error")
	if err := f.parse(args, 0); err != nil {
		return err
	}
	if err := required("database-url", *dbURL); err != nil {
		return err
	}
	if err := sink.ValidateSchema(*schema); err != nil {
		return usageError{msg: err.Error()}
	}
	if *schema == "public" || *schema == sink.DefaultSchema || *schema == "information_schema" || strings.HasPrefix(*schema, "pg_") {
		return usagef("--schema %s is not a schema the demo may drop: pick a name of its own (default %s)", *schema, demoDefaultSchema)
	}
	keys := splitList(*keyList)
	if len(keys) == 0 {
		return usagef("--keys needs at least one key")
	}
	if *jobs < 1 || *jobs > 100_000 {
		return usagef("--jobs must be between 1 and 100000")
	}
	if *session < time.Second || *session > 5*time.Minute {
		return usagef("--session-timeout must be between 1s and 5m")
	}
	if *protocol != "classic" && *protocol != "consumer" {
		return usagef("--protocol %q is not classic or consumer", *protocol)
	}
	log, err := newLogger(e.stderr, *logFormat, *logLevel)
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()

	if *storeURL == "" {
		dir, err := os.MkdirTemp("", "tenure-demo-exports-")
		if err != nil {
			return err
		}
		*storeURL = "file://" + dir
	}
	st, err := export.Open(ctx, *storeURL)
	if err != nil {
		return usageError{msg: err.Error()}
	}
	d := &demo{
		storeURL: *storeURL, objects: st,
		e: e, log: log, start: time.Now(), dbURL: *dbURL, schema: *schema, keys: keys, jobs: *jobs,
		session: *session, protocol: *protocol, topic: demoTopic, group: "tenure-demo-" + demoRandom(),
	}
	if *verbose {
		var mu sync.Mutex
		d.echo = func(name string) func(string) {
			return func(line string) {
				mu.Lock()
				defer mu.Unlock()
				fmt.Fprintf(e.stderr, "[%s] %s\n", name, line)
			}
		}
	}
	return d.run(ctx)
}

// demo is one run of the story.
type demo struct {
	e     *env
	log   *zap.Logger
	start time.Time
	echo  func(name string) func(string)

	dbURL, schema, topic, group, protocol string
	keys                                  []string
	jobs                                  int
	session                               time.Duration

	pool  *pgxpool.Pool
	store *sink.Store
	// storeURL and objects are the object store the workers export to.
	storeURL string
	objects  export.ObjectStore
	brokers  []string
	cl       *kgo.Client

	keyAt    map[int64]string // offset -> job key, as produced
	produced int64            // high watermark of what was produced

	children []*demoChild
	members  map[string]string // group member id -> worker name
}

func (d *demo) run(ctx context.Context) error {
	// The database first: without it there is nothing to show, and the
	// one sentence must say how to get one.
	pool, err := openDB(ctx, d.dbURL)
	if err != nil {
		if ctx.Err() != nil {
			return errDemoInterrupted
		}
		return demoDBAdvice(d.dbURL, err)
	}
	d.pool = pool
	defer pool.Close()
	if err := d.resetSchema(ctx); err != nil {
		return err
	}
	if d.store, err = sink.NewStore(pool, d.schema); err != nil {
		return err
	}

	broker, err := devbroker.Start(devbroker.Config{
		Listen: "127.0.0.1:0", Partitions: 1, Topics: []string{d.topic},
		ConsumerSessionTimeout: d.session, ConsumerHeartbeat: min(500*time.Millisecond, d.session/3),
	})
	if err != nil {
		return err
	}
	defer broker.Close()
	d.brokers = broker.ListenAddrs()
	if d.cl, err = kafkaClient(d.brokers, kgo.ClientID("tenure-demo")); err != nil {
		return err
	}
	defer d.cl.Close()
	// Every worker is killed and reaped on every way out, Ctrl-C included
	// (the context ends the waits), before the broker and the pool close.
	defer d.killChildren()
	d.log.Info("demo set up", zap.Strings("brokers", d.brokers), zap.String("schema", d.schema), zap.String("group", d.group))

	cfg, _ := pgxpool.ParseConfig(d.dbURL) // parsed fine by openDB
	d.printf("tenure demo: a paused worker must not overwrite newer output.\n")
	d.printf("  broker  kfake (in-process) on %s, topic %q with 1 partition, group %s, %s protocol, session timeout %s\n",
		strings.Join(d.brokers, ","), d.topic, d.group, d.protocol, d.session)
	d.printf("  sink    PostgreSQL at %s:%d, schema %s (dropped and re-created for this run)\n",
		cfg.ConnConfig.Host, cfg.ConnConfig.Port, d.schema)
	d.printf("  store   %s (exports: staged immutable objects, a pointer per key moved in the fenced transaction)\n\n", d.storeURL)

	return d.story(ctx)
}

// demoDBAdvice adds to openDB's sentence what to do: start a server when
// nothing listens, fix the URL when something does and refused us.
func demoDBAdvice(url string, err error) error {
	if strings.HasPrefix(err.Error(), "the database URL") {
		return fmt.Errorf("%v; set TENURE_DATABASE_URL (or --database-url) to a URL like %s", err, demoDefaultDatabaseURL)
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

// story replays the seeds' scenario and then checks what Postgres recorded.
func (d *demo) story(ctx context.Context) error {
	from, to, err := d.produce(ctx, d.jobs)
	if err != nil {
		return err
	}
	d.say("%d jobs produced to partition 0 (offsets %s), keys %s", d.jobs, demoSpan(from, to), strings.Join(d.keys, ", "))

	// A: takes its first batch and holds before writing it.
	a, err := d.startWorker("A", "--hold-once", "before-batch")
	if err != nil {
		return err
	}
	held, err := a.waitLog(ctx, demoWait, 0, "worker A to take its first batch", demoLogMsg("holding"))
	if err != nil {
		return err
	}
	aToken := demoStr(held.fields, "token")
	aFrom, _ := demoInt(held.fields, "from")
	aTo, _ := demoInt(held.fields, "to")
	if claim, ok := a.find(0, demoLogMsg(consumer.MsgClaimed)); ok {
		d.members[demoStr(claim.fields, "member")] = "A"
	}
	d.sayAt(held.at, "worker A (pid %d) claims partition %s with token %s, reads jobs %s and is about to write them",
		a.pid, demoStr(held.fields, "partition"), aToken, demoSpan(aFrom, aTo))

	// B joins while A is alive and heartbeating: the group keeps the
	// partition with A, so the hand-off below is caused by A's pause alone.
	b, err := d.startWorker("B")
	if err != nil {
		return err
	}
	if _, err := b.waitLog(ctx, demoWait, 0, "worker B to start", demoLogMsg("worker starting")); err != nil {
		return err
	}
	if err := d.waitMembers(ctx, 2); err != nil {
		return err
	}
	if _, moved := b.find(0, demoLogMsg(consumer.MsgClaimed)); moved {
		// The sticky assignor keeps partitions where they are; if it did
		// not, this run cannot show a pause-driven hand-off.
		return errors.New("the group moved partition 0 to worker B before A was frozen, so this run cannot show the story; run the demo again")
	}
	d.say("worker B (pid %d) joins the group; partition 0 stays with A, so B has nothing to do", b.pid)

	// Freeze A inside its check-then-act window.
	if err := a.signal(syscall.SIGSTOP); err != nil {
		return err
	}
	if err := a.frozen(5 * time.Second); err != nil {
		return err
	}
	d.say("SIGSTOP worker A — frozen inside the check-then-act window (GC pause, VM migration...)")
	more := max(1, d.jobs/2)
	from, to, err = d.produce(ctx, more)
	if err != nil {
		return err
	}
	d.say("%d more jobs arrive while A is frozen (offsets %s)", more, demoSpan(from, to))

	claimed, err := b.waitLog(ctx, demoWait+2*d.session, 0, "the group to hand partition 0 to worker B", demoLogMsg(consumer.MsgClaimed))
	if err != nil {
		return err
	}
	bToken := demoStr(claimed.fields, "token")
	d.members[demoStr(claimed.fields, "member")] = "B"
	d.sayAt(claimed.at, "the group evicts A (no heartbeat for %s); worker B claims partition 0 with token %s (%s)",
		d.session, bToken, demoCompareTokens(bToken, aToken))

	if err := d.waitNextOffset(ctx, d.produced); err != nil {
		return err
	}
	bFrom, bTo, bTx, err := d.commitsBy(ctx, demoStr(claimed.fields, "member"))
	if err != nil {
		return err
	}
	d.say("worker B stages objects for jobs %s and moves the keys' pointers in %s (newer output)", demoSpan(bFrom, bTo), demoPlural(bTx, "fenced transaction"))

	// Wake A: it goes on with the batch it took before it was frozen.
	since := a.count()
	if err := a.signal(syscall.SIGCONT); err != nil {
		return err
	}
	d.say("SIGCONT worker A — it wakes up believing it still owns partition 0, stages its old batch's objects and tries to publish them")
	outcome, err := a.waitLog(ctx, demoWait, since, "worker A's old batch to be committed or rejected", demoAnyOf(
		demoLogMsg("batch rejected*", "fenced", "true"), demoLogMsg("batch committed"), demoLogMsg("batch abandoned*")))
	if err != nil {
		return err
	}
	rejected := false
	switch msg := demoStr(outcome.fields, "msg"); {
	case strings.HasPrefix(msg, "batch rejected"):
		rejected = true
		d.sayAt(outcome.at, "Postgres rejects A's commit: %s", demoStr(outcome.fields, "error"))
		d.printf("%s A's transaction rolled back: its %s moved no pointer.\n", demoIndent, demoPlural(int(aTo-aFrom), "publication"))
		if staged := d.objectsOf(ctx, aToken); len(staged) > 0 {
			d.printf("%s A's staged objects stay unpublished (garbage for `tenure admin exports gc`): %s, e.g. %s\n", demoIndent, demoPlural(len(staged), "object"), staged[0])
		}
		if moves := d.wouldHaveRegressed(ctx, aFrom, aTo); moves != "" {
			d.printf("%s Had it landed, %s\n", demoIndent, moves)
		}
	case msg == "batch committed":
		d.sayAt(outcome.at, "A's stale batch %s with token %s was COMMITTED: the fence did not hold", demoSpan(aFrom, aTo), aToken)
	default:
		d.sayAt(outcome.at, "worker A abandoned its batch itself (%s) before Postgres could judge it; the fence was not exercised", demoStr(outcome.fields, "error"))
	}

	d.stopChildren()
	d.say("workers stopped")
	return d.report(ctx, rejected)
}

// report prints the final state and the verdict.
func (d *demo) report(ctx context.Context, rejected bool) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	h, err := history.Load(ctx, d.pool, d.schema, d.group, false)
	if err != nil {
		return d.dbErr(ctx, "reading the history", err)
	}
	out := d.e.stdout

	fmt.Fprintln(out, "\nOwnership in Postgres (fences):")
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  GROUP\tTOPIC\tPARTITION\tTOKEN\tOWNER\tNEXT_OFFSET")
	var next int64 = -1
	for _, f := range h.Fences {
		fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\t%s\t%d\n", f.Group, f.Topic, f.Partition.Partition, f.Token, d.owner(f.Owner), f.NextOffset)
		if f.Topic == d.topic && f.Partition.Partition == 0 {
			next = f.NextOffset
		}
	}
	_ = tw.Flush()

	fmt.Fprintln(out, "\nAccepted by Postgres (fence_log; a rejected transaction leaves no row):")
	tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	for _, en := range h.Log {
		what := "at offset " + fmt.Sprint(en.From)
		if en.Kind == "commit" {
			what = "jobs " + demoSpan(en.From, en.To)
		}
		fmt.Fprintf(tw, "  #%d\t%s\ttoken %s\tworker %s\t%s\n", en.ID, en.Kind, en.Token, d.workerOf(en.Owner), what)
	}
	_ = tw.Flush()

	if err := h.LoadObjectExports(ctx, d.pool, d.schema, d.group); err != nil {
		return d.dbErr(ctx, "reading the export records", err)
	}
	fmt.Fprintln(out, "\nExport pointers (one per key: the visible object):")
	ptrs, err := export.List(ctx, d.pool, d.schema, export.ListFilter{Group: d.group})
	if err != nil {
		return d.dbErr(ctx, "reading the export pointers", err)
	}
	tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  KEY\tVERSION\tJOB_OFFSET\tTOKEN\tWORKER\tOBJECT")
	visible := map[string]bool{}
	for _, p := range ptrs {
		fmt.Fprintf(tw, "  %s\t%d\t%d\t%s\t%s\t%s\n", p.Key, p.Version, p.Offset, p.Token, p.Worker, p.Object)
		visible[p.Object] = true
	}
	_ = tw.Flush()

	fmt.Fprintf(out, "\nObjects in %s, by the token they were staged under:\n", d.storeURL)
	byToken := map[string][2]int{} // token -> objects, visible
	var tokens []string
	_ = d.objects.List(ctx, func(o export.ObjectInfo) error {
		n, err := export.ParseName(o.Name)
		if err != nil {
			return nil
		}
		t := n.Token.String()
		if _, ok := byToken[t]; !ok {
			tokens = append(tokens, t)
		}
		c := byToken[t]
		c[0]++
		if visible[o.Name] {
			c[1]++
		}
		byToken[t] = c
		return nil
	})
	sort.Strings(tokens)
	for _, t := range tokens {
		c := byToken[t]
		who := "?"
		for _, en := range h.Log {
			if en.Kind == "claim" && en.Token.String() == t {
				who = "worker " + d.workerOf(en.Owner)
			}
		}
		switch {
		case c[1] == 0:
			fmt.Fprintf(out, "  token %s (%s): %s staged, none published\n", t, who, demoPlural(c[0], "object"))
		case c[1] == c[0]:
			fmt.Fprintf(out, "  token %s (%s): %s staged, all visible\n", t, who, demoPlural(c[0], "object"))
		default:
			fmt.Fprintf(out, "  token %s (%s): %s staged, %d visible, the rest superseded\n", t, who, demoPlural(c[0], "object"), c[1])
		}
	}

	if len(ptrs) > 0 {
		key := ptrs[0].Key
		fmt.Fprintf(out, "\n$ tenure admin exports get %s\n", key)
		fmt.Fprintln(out, d.admin(ctx, "exports", "get", key))
		fmt.Fprintf(out, "$ tenure admin exports get %s --output json\n", key)
		fmt.Fprint(out, d.admin(ctx, "exports", "get", key, "--output", "json"))
		fmt.Fprintln(out, "$ tenure admin exports gc --dry-run --keep 0")
		fmt.Fprint(out, d.admin(ctx, "exports", "gc", "--export-store", d.storeURL, "--dry-run", "--keep", "0"))
	}

	offs := make([]int64, d.produced)
	for i := range offs {
		offs[i] = int64(i)
	}
	violations := h.Check(map[history.TopicPartition][]int64{{Topic: d.topic, Partition: 0}: offs})
	var problems []string
	for _, v := range violations {
		problems = append(problems, v.String())
	}
	if !rejected {
		problems = append(problems, "worker A's stale batch was not rejected by Postgres")
	}
	if next != d.produced {
		problems = append(problems, fmt.Sprintf("partition 0's next offset is %d, but %d jobs were produced", next, d.produced))
	}
	if int64(len(h.Writes)) != d.produced {
		problems = append(problems, fmt.Sprintf("%d jobs were produced but %d publications were committed", d.produced, len(h.Writes)))
	}
	fmt.Fprintln(out)
	if len(problems) == 0 {
		fmt.Fprintf(out, "verdict: PASS — Postgres rejected A's stale batch; jobs %s were each published exactly once, in offset order, "+
			"and no key's pointer ever moved backwards (history checked: G1 contiguous offsets, G2/G3 fencing, pointer moves).\n", demoSpan(0, d.produced))
		return nil
	}
	fmt.Fprintln(out, "verdict: FAIL")
	for _, p := range problems {
		fmt.Fprintln(out, "  "+p)
	}
	return fmt.Errorf("the demo found %d problem(s), listed on stdout; the first: %s", len(problems), problems[0])
}

// resetSchema drops the demo's schema and migrates it afresh. A schema that
// holds tables and does not carry the demo's mark was made by someone else:
// it is left alone.
func (d *demo) resetSchema(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, demoWait)
	defer cancel()
	var comment *string
	var relations int
	err := d.pool.QueryRow(ctx, `SELECT obj_description(n.oid, 'pg_namespace'),
		(SELECT count(*) FROM pg_class c WHERE c.relnamespace = n.oid)
		FROM pg_namespace n WHERE n.nspname = $1`, d.schema).Scan(&comment, &relations)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return d.dbErr(ctx, "inspecting schema "+d.schema, err)
	case relations > 0 && (comment == nil || *comment != demoSchemaComment):
		return fmt.Errorf("schema %q exists and holds tables the demo did not create, so it will not drop it: pass another --schema, or drop it yourself", d.schema)
	}
	q := pgx.Identifier{d.schema}.Sanitize()
	if _, err := d.pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+q+` CASCADE`); err != nil {
		return d.dbErr(ctx, "dropping schema "+d.schema, err)
	}
	if _, err := sink.Migrate(ctx, d.pool, d.schema); err != nil {
		return d.dbErr(ctx, "creating schema "+d.schema, err)
	}
	if _, err := d.pool.Exec(ctx, `COMMENT ON SCHEMA `+q+` IS '`+demoSchemaComment+`'`); err != nil {
		return d.dbErr(ctx, "marking schema "+d.schema, err)
	}
	return nil
}

func (d *demo) dbErr(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil && errors.Is(err, context.Canceled) {
		return errDemoInterrupted
	}
	return fmt.Errorf("%s: %s", what, pgxCause(err))
}

// produce writes n jobs, keys in turn, and returns their offsets [from, to).
func (d *demo) produce(ctx context.Context, n int) (int64, int64, error) {
	ctx, cancel := context.WithTimeout(ctx, demoWait)
	defer cancel()
	recs := make([]*kgo.Record, n)
	for i := range recs {
		seq := int(d.produced) + i
		k := d.keys[seq%len(d.keys)]
		v, _ := json.Marshal(map[string]any{"customer": k, "seq": seq, "export": "monthly statement"})
		recs[i] = &kgo.Record{Topic: d.topic, Key: []byte(k), Value: v}
	}
	if err := d.cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		if ctx.Err() != nil && errors.Is(err, context.Canceled) {
			return 0, 0, errDemoInterrupted
		}
		return 0, 0, fmt.Errorf("producing jobs to the development broker: %w", err)
	}
	if d.keyAt == nil {
		d.keyAt = map[int64]string{}
	}
	from, to := recs[0].Offset, recs[0].Offset
	for _, r := range recs {
		d.keyAt[r.Offset] = string(r.Key)
		from, to = min(from, r.Offset), max(to, r.Offset+1)
	}
	d.produced = max(d.produced, to)
	return from, to, nil
}

// startWorker starts `tenure worker` as a child process.
func (d *demo) startWorker(name string, extra ...string) (*demoChild, error) {
	if d.members == nil {
		d.members = map[string]string{}
	}
	args := append([]string{"worker",
		"--brokers", strings.Join(d.brokers, ","), "--group", d.group, "--topic", d.topic,
		"--schema", d.schema, "--handler", "export", "--export-store", d.storeURL, "--name", name,
		"--protocol", d.protocol, "--session-timeout", d.session.String(),
		"--log-format", "json", "--log-level", "debug",
	}, extra...)
	// The workers get a clean TENURE_* environment (a TENURE_HOLD_ONCE or
	// TENURE_BATCH_MAX in the caller's shell must not change the story), and
	// the database URL through it rather than on the command line, where ps
	// would show its password.
	var childEnv []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TENURE_") {
			childEnv = append(childEnv, kv)
		}
	}
	childEnv = append(childEnv, "TENURE_DATABASE_URL="+d.dbURL)
	var echo func(string)
	if d.echo != nil {
		echo = d.echo(name)
	}
	c, err := startDemoChild(name, childEnv, echo, args...)
	if err != nil {
		return nil, err
	}
	d.children = append(d.children, c)
	d.log.Info("worker started", zap.String("name", name), zap.Int("pid", c.pid))
	return c, nil
}

// stopChildren stops the workers gracefully, concurrently, each within a
// bound; killChildren is the backstop.
func (d *demo) stopChildren() {
	var wg sync.WaitGroup
	for _, c := range d.children {
		_ = c.signal(syscall.SIGCONT) // a frozen process cannot act on SIGTERM
		wg.Go(func() {
			if !c.stop(20 * time.Second) {
				d.log.Warn("worker did not stop within 20s of SIGTERM; killed", zap.String("name", c.name), zap.Int("pid", c.pid))
			}
		})
	}
	wg.Wait()
}

// killChildren kills and reaps every worker still running.
func (d *demo) killChildren() {
	for _, c := range d.children {
		c.kill()
	}
}

// waitMembers waits until the group is stable with n members.
func (d *demo) waitMembers(ctx context.Context, n int) error {
	adm := kadm.NewClient(d.cl)
	return d.poll(ctx, demoWait, fmt.Sprintf("the group to be stable with %d members", n), func(ctx context.Context) (bool, error) {
		if d.protocol == "consumer" {
			cg, err := adm.DescribeConsumerGroups(ctx, d.group)
			if err != nil {
				return false, nil
			}
			g, ok := cg[d.group]
			return ok && g.Err == nil && g.State == "Stable" && len(g.Members) == n, nil
		}
		dg, err := adm.DescribeGroups(ctx, d.group)
		if err != nil {
			return false, nil
		}
		g, ok := dg[d.group]
		return ok && g.Err == nil && g.State == "Stable" && len(g.Members) == n, nil
	})
}

// waitNextOffset waits until partition 0's stored next offset reaches off.
func (d *demo) waitNextOffset(ctx context.Context, off int64) error {
	p := sink.Partition{Group: d.group, Topic: d.topic, Partition: 0}
	return d.poll(ctx, demoWait, fmt.Sprintf("worker B to commit jobs up to offset %d", off), func(ctx context.Context) (bool, error) {
		f, err := d.store.Get(ctx, p)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		if err != nil {
			return false, d.dbErr(ctx, "reading the fencing row", err)
		}
		return f.NextOffset >= off, nil
	})
}

// poll calls cond every 50ms until it holds, fails, or timeout passes.
func (d *demo) poll(ctx context.Context, timeout time.Duration, what string, cond func(context.Context) (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ok, err := cond(cctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return errDemoInterrupted
		case err != nil:
			return err
		case ok:
			return nil
		}
		for _, c := range d.children {
			if c.exited() {
				return fmt.Errorf("worker %s (pid %d) exited (%v) while the demo was waiting for %s; its last words: %s",
					c.name, c.pid, c.exitErr, what, c.lastWords())
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s waiting for %s (run with --verbose to see the workers' logs)", timeout, what)
		}
		select {
		case <-ctx.Done():
			return errDemoInterrupted
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// commitsBy summarises the commits the fence log holds for owner.
func (d *demo) commitsBy(ctx context.Context, owner string) (from, to int64, n int, err error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err = d.pool.QueryRow(ctx, `SELECT coalesce(min(from_offset), 0), coalesce(max(to_offset), 0), count(*) FROM `+
		pgx.Identifier{d.schema}.Sanitize()+`.fence_log WHERE kind = 'commit' AND consumer_group = $1 AND owner = $2`,
		d.group, owner).Scan(&from, &to, &n)
	if err != nil {
		return 0, 0, 0, d.dbErr(ctx, "reading the fence log", err)
	}
	return from, to, n, nil
}

// wouldHaveRegressed says which keys' visible exports A's batch [from, to)
// would have moved back to older jobs.
func (d *demo) wouldHaveRegressed(ctx context.Context, from, to int64) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	last := map[string]int64{} // key -> A's last job for it
	for off := from; off < to; off++ {
		if k, ok := d.keyAt[off]; ok {
			last[k] = off
		}
	}
	rows, err := d.pool.Query(ctx, `SELECT export_key, job_offset FROM `+pgx.Identifier{d.schema}.Sanitize()+`.export_pointers`)
	if err != nil {
		return ""
	}
	var (
		key   string
		off   int64
		moves []string
	)
	_, err = pgx.ForEachRow(rows, []any{&key, &off}, func() error {
		if a, ok := last[key]; ok && a < off {
			moves = append(moves, fmt.Sprintf("%s from job %d to job %d", key, off, a))
		}
		return nil
	})
	if err != nil || len(moves) == 0 {
		return ""
	}
	sort.Strings(moves)
	n := len(moves)
	if n > 3 {
		moves = append(moves[:3], fmt.Sprintf("and %d more", n-3))
	}
	return fmt.Sprintf("%s would have gone backwards: %s.", demoPlural(n, "key's export"), strings.Join(moves, ", "))
}

// objectsOf lists the objects staged under token (its string form).
func (d *demo) objectsOf(ctx context.Context, token string) []string {
	var out []string
	_ = d.objects.List(ctx, func(o export.ObjectInfo) error {
		if n, err := export.ParseName(o.Name); err == nil && n.Token.String() == token {
			out = append(out, o.Name)
		}
		return nil
	})
	sort.Strings(out)
	return out
}

// admin runs `tenure admin ARGS` (this binary) against the demo's schema
// and returns what it printed.
func (d *demo) admin(ctx context.Context, args ...string) string {
	exe, err := os.Executable()
	if err != nil {
		return err.Error()
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, append(append([]string{"admin"}, args...), "--schema", d.schema)...)
	cmd.Env = append(os.Environ(), "TENURE_DATABASE_URL="+d.dbURL)
	b, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Sprintf("%s(exit: %v)\n", b, err)
	}
	return string(b)
}

// owner renders a member id with the worker it belongs to.
func (d *demo) owner(member string) string {
	if w, ok := d.members[member]; ok {
		return member + " (worker " + w + ")"
	}
	return member
}

func (d *demo) workerOf(member string) string {
	if w, ok := d.members[member]; ok {
		return w
	}
	return member
}

const demoIndent = "      "

// say prints one timeline line stamped with the time since the start.
func (d *demo) say(format string, args ...any) { d.sayAt(time.Now(), format, args...) }

func (d *demo) sayAt(at time.Time, format string, args ...any) {
	stamp := fmt.Sprintf("+%.1fs", at.Sub(d.start).Seconds())
	fmt.Fprintf(d.e.stdout, "%-6s %s\n", stamp, fmt.Sprintf(format, args...))
}

func (d *demo) printf(format string, args ...any) { fmt.Fprintf(d.e.stdout, format, args...) }

// demoSpan renders offsets [from, to) as "from-last".
func demoSpan(from, to int64) string {
	if to-from == 1 {
		return fmt.Sprint(from)
	}
	return fmt.Sprintf("%d-%d", from, to-1)
}

// demoCompareTokens says how token b stands against token a.
func demoCompareTokens(b, a string) string {
	tb, errB := sink.ParseToken(b)
	ta, errA := sink.ParseToken(a)
	switch {
	case errA != nil || errB != nil:
		return "compared with A's " + a
	case ta.Less(tb):
		return "higher than A's " + a
	case tb.Less(ta):
		return "LOWER than A's " + a + "!"
	}
	return "EQUAL to A's " + a + "!"
}

// demoPlural renders "1 thing" or "n things" ("key's export" becomes "keys' exports").
func demoPlural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	if k, rest, ok := strings.Cut(what, "'s "); ok {
		return fmt.Sprintf("%d %ss' %ss", n, k, rest)
	}
	return fmt.Sprintf("%d %ss", n, what)
}

func demoRandom() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
