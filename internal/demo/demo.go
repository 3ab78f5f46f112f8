// Package demo is `tenure demo`: the story tenure exists for, replayed live
// with real processes on a development broker and Postgres (Run). The CLI
// (internal/cli) parses its flags, opens the database and words its
// errors; the workers it starts are `tenure worker` processes of the
// running binary, and the admin commands it shows are that binary's too.
package demo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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

// Config is one run of the demo.
type Config struct {
	// Pool is the database, open; the demo drops and re-creates Schema on
	// it. DatabaseURL is the same database, for the worker processes.
	Pool        *pgxpool.Pool
	DatabaseURL string
	// Schema is dropped and re-created at start; a schema the demo did not
	// create (one with tables and without its mark) is never dropped.
	Schema string
	// StoreURL is the object store the workers export to; Store is it,
	// opened.
	StoreURL string
	Store    export.ObjectStore
	// Keys are the jobs' keys (customers), in turn; Jobs are produced at
	// start, half as many again while worker A is frozen.
	Keys []string
	Jobs int
	// SessionTimeout is how long a frozen worker keeps its partition.
	SessionTimeout time.Duration
	// Protocol is the group protocol: classic or consumer (KIP-848).
	Protocol string
	// Strict runs the workers with --strict (strict hand-off, G3-strict):
	// A is frozen with its batch prepared, before its offset commit; B's
	// claim rolls the prepared batch back (the group's committed offset does
	// not name it), and A's late offset commit is rejected by the
	// coordinator. The database must allow prepared transactions
	// (max_prepared_transactions above 0), and the protocol be classic
	// (kfake's KIP-848 offset commit rule cannot carry strict hand-off).
	Strict bool
	// Stdout gets the story; Echo, when set, every line the workers log,
	// prefixed with their name.
	Stdout, Echo io.Writer
	Log          *zap.Logger
}

const (
	// schemaComment marks a schema as the demo's own, so that a later
	// run may drop it; a schema with tables and without it is never dropped.
	schemaComment = "tenure demo: dropped and re-created by every tenure demo run"
	// waitLimit bounds every wait of the story.
	waitLimit = 60 * time.Second
	topicName = "jobs"
)

// Run replays the story tenure exists for, live, with real processes:
// worker A takes a batch of jobs and is frozen (SIGSTOP) before it writes
// them; the group hands its partition to worker B, which publishes newer
// exports; A is resumed (SIGCONT) and tries to publish its old batch.
// Postgres must reject it. The workers are `tenure worker` processes (this
// binary) on a development broker (kfake) the demo starts in-process. Run
// returns an error unless A's stale batch was rejected and the history
// checker found no violation; ErrInterrupted when ctx ends.
func Run(ctx context.Context, cfg Config) error {
	d := &demo{
		cfg: cfg, log: cfg.Log, start: time.Now(), pool: cfg.Pool, dbURL: cfg.DatabaseURL, schema: cfg.Schema,
		keys: cfg.Keys, jobs: cfg.Jobs, session: cfg.SessionTimeout, protocol: cfg.Protocol, strict: cfg.Strict,
		storeURL: cfg.StoreURL, objects: cfg.Store, topic: topicName, group: "tenure-demo-" + random(),
	}
	if d.log == nil {
		d.log = zap.NewNop()
	}
	if cfg.Echo != nil {
		var mu sync.Mutex
		d.echo = func(name string) func(string) {
			return func(line string) {
				mu.Lock()
				defer mu.Unlock()
				fmt.Fprintf(cfg.Echo, "[%s] %s\n", name, line)
			}
		}
	}
	return d.run(ctx)
}

// demo is one run of the story.
type demo struct {
	cfg   Config
	log   *zap.Logger
	start time.Time
	echo  func(name string) func(string)

	dbURL, schema, topic, group, protocol string
	keys                                  []string
	jobs                                  int
	session                               time.Duration
	strict                                bool

	pool  *pgxpool.Pool
	store *sink.Store
	// storeURL and objects are the object store the workers export to.
	storeURL string
	objects  export.ObjectStore
	brokers  []string
	cl       *kgo.Client

	keyAt    map[int64]string // offset -> job key, as produced
	produced int64            // high watermark of what was produced

	children []*child
	members  map[string]string // group member id -> worker name
}

func (d *demo) run(ctx context.Context) error {
	if d.strict {
		if d.protocol != "classic" {
			return errors.New("the strict demo runs on the classic protocol: kfake's KIP-848 offset commit rule accepts an ended assignment's commit, so strict hand-off cannot hold on it")
		}
		if err := sink.CheckPreparedTransactions(ctx, d.pool); err != nil {
			return err
		}
	}
	if err := d.resetSchema(ctx); err != nil {
		return err
	}
	var err error
	if d.store, err = sink.NewStore(d.pool, d.schema); err != nil {
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
	if d.cl, err = kgo.NewClient(kgo.SeedBrokers(d.brokers...), kgo.ClientID("tenure-demo")); err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	defer d.cl.Close()
	// Every worker is killed and reaped on every way out, Ctrl-C included
	// (the context ends the waits), before the broker and the pool close.
	defer d.killChildren()
	d.log.Info("demo set up", zap.Strings("brokers", d.brokers), zap.String("schema", d.schema), zap.String("group", d.group))

	cfg, err := pgxpool.ParseConfig(d.dbURL)
	if err != nil {
		return fmt.Errorf("the database URL is not valid: %w", err)
	}
	d.printf("tenure demo: a paused worker must not overwrite newer output.\n")
	if d.strict {
		d.printf("  strict  --strict: batches are prepared (PREPARE TRANSACTION), their offsets committed to the group coordinator, and made visible only on its acceptance\n")
	}
	d.printf("  broker  kfake (in-process) on %s, topic %q with 1 partition, group %s, %s protocol, session timeout %s\n",
		strings.Join(d.brokers, ","), d.topic, d.group, d.protocol, d.session)
	d.printf("  sink    PostgreSQL at %s:%d, schema %s (dropped and re-created for this run)\n",
		cfg.ConnConfig.Host, cfg.ConnConfig.Port, d.schema)
	d.printf("  store   %s (exports: staged immutable objects, a pointer per key moved in the fenced transaction)\n\n", d.storeURL)

	return d.story(ctx)
}

// story replays the scenario and then checks what Postgres recorded.
func (d *demo) story(ctx context.Context) error {
	from, to, err := d.produce(ctx, d.jobs)
	if err != nil {
		return err
	}
	d.say("%d jobs produced to partition 0 (offsets %s), keys %s", d.jobs, span(from, to), strings.Join(d.keys, ", "))
	a, held, err := d.startA(ctx)
	if err != nil {
		return err
	}
	b, err := d.startB(ctx)
	if err != nil {
		return err
	}
	if err := d.freeze(ctx, a); err != nil {
		return err
	}
	if err := d.handOff(ctx, b, held); err != nil {
		return err
	}
	wake := d.wake
	if d.strict {
		wake = d.wakeStrict
	}
	rejected, err := wake(ctx, a, held)
	if err != nil {
		return err
	}
	d.stopChildren()
	d.say("workers stopped")
	return d.report(ctx, rejected)
}

// batch is the batch worker A took before it was frozen.
type batch struct {
	token    string
	from, to int64
	gid      string // strict: the prepared transaction
}

// startA starts worker A, which takes its first batch and holds before
// writing it.
func (d *demo) startA(ctx context.Context) (*child, batch, error) {
	point := "before-batch"
	if d.strict {
		point = "strict-before-offset-commit"
	}
	a, err := d.startWorker("A", "--hold-once", point)
	if err != nil {
		return nil, batch{}, err
	}
	held, err := a.waitLog(ctx, waitLimit, 0, "worker A to take its first batch", logMsg("holding"))
	if err != nil {
		return nil, batch{}, err
	}
	bt := batch{token: str(held.Fields, "token"), gid: str(held.Fields, "gid")}
	bt.from, _ = intField(held.Fields, "from")
	bt.to, _ = intField(held.Fields, "to")
	if claim, ok := a.Find(0, logMsg(consumer.MsgClaimed)); ok {
		d.members[str(claim.Fields, "member")] = "A"
	}
	if d.strict {
		d.sayAt(held.At, "worker A (pid %d) claims partition %s with token %s, processes jobs %s and PREPAREs the transaction (%s); it is about to commit their offset to the group coordinator",
			a.pid, str(held.Fields, "partition"), bt.token, span(bt.from, bt.to), bt.gid)
		return a, bt, nil
	}
	d.sayAt(held.At, "worker A (pid %d) claims partition %s with token %s, reads jobs %s and is about to write them",
		a.pid, str(held.Fields, "partition"), bt.token, span(bt.from, bt.to))
	return a, bt, nil
}

// startB starts worker B while A is alive and heartbeating: the group
// keeps the partition with A, so the hand-off that follows is caused by
// A's pause alone.
func (d *demo) startB(ctx context.Context) (*child, error) {
	b, err := d.startWorker("B")
	if err != nil {
		return nil, err
	}
	if _, err := b.waitLog(ctx, waitLimit, 0, "worker B to start", logMsg("worker starting")); err != nil {
		return nil, err
	}
	if err := d.waitMembers(ctx, 2); err != nil {
		return nil, err
	}
	if _, moved := b.Find(0, logMsg(consumer.MsgClaimed)); moved {
		// The sticky assignor keeps partitions where they are; if it did
		// not, this run cannot show a pause-driven hand-off.
		return nil, errors.New("the group moved partition 0 to worker B before A was frozen, so this run cannot show the story; run the demo again")
	}
	d.say("worker B (pid %d) joins the group; partition 0 stays with A, so B has nothing to do", b.pid)
	return b, nil
}

// freeze stops A inside its check-then-act window; more jobs arrive.
func (d *demo) freeze(ctx context.Context, a *child) error {
	if err := a.freeze(5 * time.Second); err != nil {
		return err
	}
	if d.strict {
		d.say("SIGSTOP worker A — frozen with its batch prepared and its offset not yet committed (GC pause, VM migration...)")
	} else {
		d.say("SIGSTOP worker A — frozen inside the check-then-act window (GC pause, VM migration...)")
	}
	more := max(1, d.jobs/2)
	from, to, err := d.produce(ctx, more)
	if err != nil {
		return err
	}
	d.say("%d more jobs arrive while A is frozen (offsets %s)", more, span(from, to))
	return nil
}

// handOff waits for the group to evict A and B to claim the partition
// and commit every job.
func (d *demo) handOff(ctx context.Context, b *child, a batch) error {
	if d.strict {
		res, err := b.waitLog(ctx, waitLimit+2*d.session, 0, "worker B's claim to resolve A's prepared batch", logMsg(consumer.MsgStrictResolved))
		if err != nil {
			return err
		}
		what := "rolls it back (ROLLBACK PREPARED): nothing of it will ever be visible"
		if str(res.Fields, "committed") == "true" {
			what = "commits it (COMMIT PREPARED): the coordinator had accepted its offset"
		}
		d.sayAt(res.At, "the group evicts A; worker B's claim finds A's prepared batch holding the partition, reads the group's committed offset (%s) and %s",
			str(res.Fields, "evidence"), what)
	}
	claimed, err := b.waitLog(ctx, waitLimit+2*d.session, 0, "the group to hand partition 0 to worker B", logMsg(consumer.MsgClaimed))
	if err != nil {
		return err
	}
	bToken := str(claimed.Fields, "token")
	d.members[str(claimed.Fields, "member")] = "B"
	d.sayAt(claimed.At, "the group evicts A (no heartbeat for %s); worker B claims partition 0 with token %s (%s)",
		d.session, bToken, compareTokens(bToken, a.token))
	if err := d.waitNextOffset(ctx, d.produced); err != nil {
		return err
	}
	bFrom, bTo, bTx, err := d.commitsBy(ctx, str(claimed.Fields, "member"))
	if err != nil {
		return err
	}
	d.say("worker B stages objects for jobs %s and moves the keys' pointers in %s (newer output)", span(bFrom, bTo), plural(bTx, "fenced transaction"))
	return nil
}

// wake resumes A, which goes on with the batch it took before it was
// frozen, and reports whether Postgres rejected it.
func (d *demo) wake(ctx context.Context, a *child, held batch) (rejected bool, err error) {
	since := a.Count()
	if err := a.signal(syscall.SIGCONT); err != nil {
		return false, err
	}
	d.say("SIGCONT worker A — it wakes up believing it still owns partition 0, stages its old batch's objects and tries to publish them")
	outcome, err := a.waitLog(ctx, waitLimit, since, "worker A's old batch to be committed or rejected", anyOf(
		logMsg("batch rejected*", "fenced", "true"), logMsg("batch committed"), logMsg("batch abandoned*")))
	if err != nil {
		return false, err
	}
	switch msg := str(outcome.Fields, "msg"); {
	case strings.HasPrefix(msg, "batch rejected"):
		d.sayAt(outcome.At, "Postgres rejects A's commit: %s", str(outcome.Fields, "error"))
		d.printf("%s A's transaction rolled back: its %s moved no pointer.\n", indent, plural(int(held.to-held.from), "publication"))
		if staged := d.objectsOf(ctx, held.token); len(staged) > 0 {
			d.printf("%s A's staged objects stay unpublished (garbage for `tenure admin exports gc`): %s, e.g. %s\n", indent, plural(len(staged), "object"), staged[0])
		}
		if moves := d.wouldHaveRegressed(ctx, held.from, held.to); moves != "" {
			d.printf("%s Had it landed, %s\n", indent, moves)
		}
		return true, nil
	case msg == "batch committed":
		d.sayAt(outcome.At, "A's stale batch %s with token %s was COMMITTED: the fence did not hold", span(held.from, held.to), held.token)
	default:
		d.sayAt(outcome.At, "worker A abandoned its batch itself (%s) before Postgres could judge it; the fence was not exercised", str(outcome.Fields, "error"))
	}
	return false, nil
}

// wakeStrict resumes A, whose lane goes on with its offset commit, and
// reports whether A's batch stayed invisible (rolled back).
func (d *demo) wakeStrict(ctx context.Context, a *child, held batch) (rejected bool, err error) {
	since := a.Count()
	if err := a.signal(syscall.SIGCONT); err != nil {
		return false, err
	}
	d.say("SIGCONT worker A — it wakes up and commits its batch's offset to the group coordinator at its own assignment's generation")
	ans, err := a.waitLog(ctx, waitLimit, since, "worker A's offset commit to be answered", logMsg(consumer.MsgStrictAnswered))
	if err != nil {
		return false, err
	}
	if str(ans.Fields, "accepted") == "true" {
		d.sayAt(ans.At, "the coordinator ACCEPTED A's offset commit after the partition was handed to B: strict hand-off did not hold")
	} else {
		d.sayAt(ans.At, "the coordinator rejects A's offset commit: %s", str(ans.Fields, "error"))
	}
	dec, err := a.waitLog(ctx, waitLimit, since, "worker A's batch to be decided", logMsg(consumer.MsgStrictDecided))
	if err != nil {
		return false, err
	}
	if str(dec.Fields, "committed") == "true" {
		d.sayAt(dec.At, "A's prepared batch %s with token %s was COMMITTED: strict hand-off did not hold", span(held.from, held.to), held.token)
		return false, nil
	}
	d.sayAt(dec.At, "A's ROLLBACK PREPARED finds its batch already rolled back by B's claim: jobs %s were never visible with token %s", span(held.from, held.to), held.token)
	if staged := d.objectsOf(ctx, held.token); len(staged) > 0 {
		d.printf("%s A's staged objects stay unpublished (garbage for `tenure admin exports gc`): %s, e.g. %s\n", indent, plural(len(staged), "object"), staged[0])
	}
	return true, nil
}

// report prints the final state and the verdict.
func (d *demo) report(ctx context.Context, rejected bool) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	h, err := history.Load(ctx, d.pool, d.schema, d.group, false)
	if err != nil {
		return d.dbErr(ctx, "reading the history", err)
	}
	next := d.printOwnership(h)
	if err := h.LoadObjectExports(ctx, d.pool, d.schema, d.group); err != nil {
		return d.dbErr(ctx, "reading the export records", err)
	}
	ptrs, err := d.printExports(ctx, h)
	if err != nil {
		return err
	}
	if len(ptrs) > 0 {
		// The commands as they can be run again: the demo's schema and
		// database are not the defaults.
		out, key := d.cfg.Stdout, ptrs[0].Key
		fmt.Fprintln(out)
		if withoutPassword(d.dbURL) != d.dbURL {
			fmt.Fprintln(out, "(the database URL's password is left out of these commands: give it with PGPASSWORD)")
		}
		for _, args := range [][]string{
			{"exports", "get", key},
			{"exports", "get", key, "--output", "json"},
			{"exports", "gc", "--export-store", d.storeURL, "--dry-run", "--keep", "0"},
		} {
			fmt.Fprintf(out, "$ %s\n", d.shown(args))
			fmt.Fprint(out, strings.TrimSuffix(d.admin(ctx, args...), "\n")+"\n")
		}
	}
	return d.verdict(h, rejected, next)
}

// printOwnership prints the fencing rows and the fence log, and returns
// partition 0's next offset (-1 if it has no row).
func (d *demo) printOwnership(h *history.History) int64 {
	out := d.cfg.Stdout
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
			what = "jobs " + span(en.From, en.To)
		}
		fmt.Fprintf(tw, "  #%d\t%s\ttoken %s\tworker %s\t%s\n", en.ID, en.Kind, en.Token, d.workerOf(en.Owner), what)
	}
	_ = tw.Flush()
	return next
}

// printExports prints the export pointers and the store's objects by the
// token they were staged under, and returns the pointers.
func (d *demo) printExports(ctx context.Context, h *history.History) ([]export.Pointer, error) {
	out := d.cfg.Stdout
	fmt.Fprintln(out, "\nExport pointers (one per key: the visible object):")
	ptrs, err := export.List(ctx, d.pool, d.schema, export.ListFilter{Group: d.group})
	if err != nil {
		return nil, d.dbErr(ctx, "reading the export pointers", err)
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
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
			fmt.Fprintf(out, "  token %s (%s): %s staged, none published\n", t, who, plural(c[0], "object"))
		case c[1] == c[0]:
			fmt.Fprintf(out, "  token %s (%s): %s staged, all visible\n", t, who, plural(c[0], "object"))
		default:
			fmt.Fprintf(out, "  token %s (%s): %s staged, %d visible, the rest superseded\n", t, who, plural(c[0], "object"), c[1])
		}
	}
	return ptrs, nil
}

// verdict checks the history and prints PASS, or FAIL and the problems.
func (d *demo) verdict(h *history.History, rejected bool, next int64) error {
	offs := make([]int64, d.produced)
	for i := range offs {
		offs[i] = int64(i)
	}
	var problems []string
	for _, v := range h.Check(map[history.TopicPartition][]int64{{Topic: d.topic, Partition: 0}: offs}) {
		problems = append(problems, v.String())
	}
	switch {
	case !rejected && d.strict:
		problems = append(problems, "worker A's prepared batch was not rolled back")
	case !rejected:
		problems = append(problems, "worker A's stale batch was not rejected by Postgres")
	}
	for _, g := range h.Prepared {
		problems = append(problems, "prepared batch "+g+" was left undecided")
	}
	if next != d.produced {
		problems = append(problems, fmt.Sprintf("partition 0's next offset is %d, but %d jobs were produced", next, d.produced))
	}
	if int64(len(h.Writes)) != d.produced {
		problems = append(problems, fmt.Sprintf("%d jobs were produced but %d publications were committed", d.produced, len(h.Writes)))
	}
	out := d.cfg.Stdout
	fmt.Fprintln(out)
	if len(problems) == 0 && d.strict {
		fmt.Fprintf(out, "verdict: PASS — A's prepared batch was rolled back by B's claim and the coordinator refused A's late offset commit; jobs %s were each published exactly once, in offset order, "+
			"and no key's pointer ever moved backwards (history checked: G1 contiguous offsets, G2/G3 fencing, pointer moves, no batch left prepared).\n", span(0, d.produced))
		return nil
	}
	if len(problems) == 0 {
		fmt.Fprintf(out, "verdict: PASS — Postgres rejected A's stale batch; jobs %s were each published exactly once, in offset order, "+
			"and no key's pointer ever moved backwards (history checked: G1 contiguous offsets, G2/G3 fencing, pointer moves).\n", span(0, d.produced))
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
	ctx, cancel := context.WithTimeout(ctx, waitLimit)
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
	case relations > 0 && (comment == nil || *comment != schemaComment):
		return fmt.Errorf("schema %q exists and holds tables the demo did not create, so it will not drop it: pass another --schema, or drop it yourself", d.schema)
	}
	q := pgx.Identifier{d.schema}.Sanitize()
	if _, err := d.pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+q+` CASCADE`); err != nil {
		return d.dbErr(ctx, "dropping schema "+d.schema, err)
	}
	if _, err := sink.Migrate(ctx, d.pool, d.schema); err != nil {
		return d.dbErr(ctx, "creating schema "+d.schema, err)
	}
	if _, err := d.pool.Exec(ctx, `COMMENT ON SCHEMA `+q+` IS '`+schemaComment+`'`); err != nil {
		return d.dbErr(ctx, "marking schema "+d.schema, err)
	}
	return nil
}

func (d *demo) dbErr(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil && errors.Is(err, context.Canceled) {
		return ErrInterrupted
	}
	return fmt.Errorf("%s: %s", what, pgMessage(err))
}

// produce writes n jobs, keys in turn, and returns their offsets [from, to).
func (d *demo) produce(ctx context.Context, n int) (int64, int64, error) {
	ctx, cancel := context.WithTimeout(ctx, waitLimit)
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
			return 0, 0, ErrInterrupted
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
func (d *demo) startWorker(name string, extra ...string) (*child, error) {
	if d.members == nil {
		d.members = map[string]string{}
	}
	if d.strict {
		extra = append([]string{"--strict"}, extra...)
	}
	args := append([]string{"worker",
		"--brokers", strings.Join(d.brokers, ","), "--group", d.group, "--topic", d.topic,
		"--schema", d.schema, "--handler", "export", "--export-store", d.storeURL, "--name", name,
		"--protocol", d.protocol, "--session-timeout", d.session.String(),
		"--log-format", "json", "--log-level", "debug",
	}, extra...)
	// The workers get a clean TENURE_* environment (a TENURE_MAX_ATTEMPTS or
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
	c, err := startChild(name, childEnv, echo, args...)
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
		wg.Go(func() {
			// Stop thaws a frozen worker first: it cannot act on SIGTERM.
			if c.Stop(20*time.Second) != nil {
				d.log.Warn("worker did not stop within 20s of SIGTERM; killed", zap.String("name", c.name), zap.Int("pid", c.pid))
			}
		})
	}
	wg.Wait()
}

// killChildren kills and reaps every worker still running.
func (d *demo) killChildren() {
	for _, c := range d.children {
		_ = c.Kill()
	}
}

// waitMembers waits until the group is stable with n members.
func (d *demo) waitMembers(ctx context.Context, n int) error {
	adm := kadm.NewClient(d.cl)
	return d.poll(ctx, waitLimit, fmt.Sprintf("the group to be stable with %d members", n), func(ctx context.Context) (bool, error) {
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
	return d.poll(ctx, waitLimit, fmt.Sprintf("worker B to commit jobs up to offset %d", off), func(ctx context.Context) (bool, error) {
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
			return ErrInterrupted
		case err != nil:
			return err
		case ok:
			return nil
		}
		for _, c := range d.children {
			if c.Exited() {
				return c.exitedWhile(what)
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s waiting for %s (run with --verbose to see the workers' logs)", timeout, what)
		}
		select {
		case <-ctx.Done():
			return ErrInterrupted
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// commitsBy summarises the commits the fence log holds for owner.
func (d *demo) commitsBy(ctx context.Context, owner string) (from, to int64, n int, err error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	log, err := d.store.FenceLog(ctx, d.group)
	if err != nil {
		return 0, 0, 0, d.dbErr(ctx, "reading the fence log", err)
	}
	for _, e := range log {
		if e.Kind != "commit" || e.Owner != owner {
			continue
		}
		if n == 0 || e.From < from {
			from = e.From
		}
		to = max(to, e.To)
		n++
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
	return fmt.Sprintf("%s would have gone backwards: %s.", plural(n, "key's export"), strings.Join(moves, ", "))
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

// shown is `tenure admin ARGS` as the demo prints it: with the demo's
// --schema and --database-url (its password, if any, left out: give it
// with PGPASSWORD), quoted for a shell.
func (d *demo) shown(args []string) string {
	words := append(append([]string{"tenure", "admin"}, args...), "--schema", d.schema, "--database-url", withoutPassword(d.dbURL))
	for i, w := range words {
		words[i] = shellWord(w)
	}
	return strings.Join(words, " ")
}

// withoutPassword is a database URL without its password.
func withoutPassword(conn string) string {
	u, err := url.Parse(conn)
	if err != nil || u.User == nil {
		return conn
	}
	if _, ok := u.User.Password(); !ok {
		return conn
	}
	u.User = url.User(u.User.Username())
	return u.String()
}

// shellWord quotes w for a shell when it needs it.
func shellWord(w string) string {
	if w != "" && strings.Trim(w, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./:,@%+=") == "" {
		return w
	}
	return "'" + strings.ReplaceAll(w, "'", `'\''`) + "'"
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

const indent = "      "

// say prints one timeline line stamped with the time since the start.
func (d *demo) say(format string, args ...any) { d.sayAt(time.Now(), format, args...) }

func (d *demo) sayAt(at time.Time, format string, args ...any) {
	stamp := fmt.Sprintf("+%.1fs", at.Sub(d.start).Seconds())
	fmt.Fprintf(d.cfg.Stdout, "%-6s %s\n", stamp, fmt.Sprintf(format, args...))
}

func (d *demo) printf(format string, args ...any) { fmt.Fprintf(d.cfg.Stdout, format, args...) }

// span renders offsets [from, to) as "from-last".
func span(from, to int64) string {
	if to-from == 1 {
		return fmt.Sprint(from)
	}
	return fmt.Sprintf("%d-%d", from, to-1)
}

// compareTokens says how token b stands against token a.
func compareTokens(b, a string) string {
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

// plural renders "1 thing" or "n things" ("key's export" becomes "keys' exports").
func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	if k, rest, ok := strings.Cut(what, "'s "); ok {
		return fmt.Sprintf("%d %ss' %ss", n, k, rest)
	}
	return fmt.Sprintf("%d %ss", n, what)
}

func random() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// pgMessage is the server's message of a failed statement, or the error.
func pgMessage(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Message
	}
	return err.Error()
}
