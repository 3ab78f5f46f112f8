package cli

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/tenure-dev/tenure/sink"
)

// Names the database has never seen. A mistyped --group or --topic is a
// valid name (names.go cannot tell), and a command that filters rows by it
// would find none and say so, exit 0: "no held partitions". So every admin
// command whose --group or --topic names rows of the database first checks
// that the schema knows the name (sink.Store.Groups, Topics); one it does
// not is refused in one sentence that names the ones it has, closest first,
// exit 1. A group or topic the brokers know (when the command is given
// --brokers) passes: a group whose workers have not claimed anything yet,
// or a topic the group has not consumed, has no rows, and the command's own
// answer for it is the right one.

// nameRefs are the names a command's flags (or arguments) give that must
// be known: "" for those not given.
type nameRefs struct {
	group string
	// topic is checked among the group's topics when group is given.
	topic string
	// warnOnly: an unknown name is a warning on stderr, not a refusal.
	warnOnly bool
	// groupNote is added to the refusal of a group: what the command
	// does for a new one instead.
	groupNote string
}

// namesChecked is an admin command whose names are checked before it
// runs (adminLeaf.run).
type namesChecked interface{ names() nameRefs }

// unknownNameError is the refusal of a name: exit 1.
type unknownNameError struct{ msg string }

func (e unknownNameError) Error() string { return e.msg }

// maxNamesShown is how many known names a refusal lists.
const maxNamesShown = 10

// checkNames refuses a group or topic that has no rows in the schema and
// that the brokers, when given, do not know either.
func (a *admin) checkNames(ctx context.Context, refs nameRefs) error {
	if refs.group == "" && refs.topic == "" {
		return nil
	}
	// Commands that bound their own round trips (serve, fences prune) run
	// without adminTimeout: this check is bounded all the same.
	ctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	store, err := a.Store()
	if err != nil {
		return err
	}
	withBrokers := a.kafka != nil && a.kafka.brokers != ""
	// check refuses name (of kind group or topic; a topic of group) when
	// neither the schema (read) nor the brokers know it.
	check := func(kind, name, group string, read func() ([]string, error)) error {
		if name == "" {
			return nil
		}
		names, err := read()
		if err != nil {
			return a.dbError("reading the "+kind+"s the schema knows", err)
		}
		if slices.Contains(names, name) {
			return nil
		}
		known, err := a.brokersKnow(ctx, kind, name)
		if err != nil || known {
			return err
		}
		msg := unknownName(kind, name, group, a.schema, withBrokers, names)
		if kind == "group" && refs.groupNote != "" {
			msg += "; " + refs.groupNote
		}
		return unknownNameError{msg}
	}
	if err := check("group", refs.group, "", func() ([]string, error) { return store.KnownGroups(ctx) }); err != nil {
		return err
	}
	return check("topic", refs.topic, refs.group, func() ([]string, error) { return store.KnownTopics(ctx, refs.group) })
}

// brokersKnow reports whether the brokers have the group or topic: false
// when the command was not given --brokers.
func (a *admin) brokersKnow(ctx context.Context, kind, name string) (bool, error) {
	if a.kafka == nil || a.kafka.brokers == "" {
		return false, nil
	}
	cl, err := a.client()
	if err != nil {
		return false, err
	}
	adm := kadm.NewClient(cl)
	if kind == "group" {
		lg, err := adm.ListGroups(ctx)
		if err != nil {
			return false, a.kafkaError("listing the consumer groups", err)
		}
		_, ok := lg[name]
		return ok, nil
	}
	td, err := adm.ListTopics(ctx, name)
	if err != nil {
		return false, a.kafkaError("listing the topics", err)
	}
	d, ok := td[name]
	return ok && d.Err == nil, nil
}

// unknownName is the refusal of a name: `no group "readme-wrokers" in
// schema tenure; groups it has: readme-workers, billing`, the known names
// closest first.
func unknownName(kind, name, group, schema string, brokers bool, known []string) string {
	where := fmt.Sprintf("no %s %q in schema %s", kind, name, schema)
	if group != "" {
		where = fmt.Sprintf("no %s %q for group %q in schema %s", kind, name, group, schema)
	}
	if len(known) == 0 {
		// "which has none yet" before the brokers, so that it is the
		// schema's (or the group's) emptiness it speaks of.
		if group != "" {
			where += ", where the group has none yet"
		} else {
			where += ", which has none yet"
		}
		if brokers {
			where += ", nor on the brokers"
		}
		return where
	}
	if brokers {
		where += " nor on the brokers"
	}
	list := closest(name, known)
	more := ""
	if len(list) > maxNamesShown {
		more = fmt.Sprintf(" and %d more", len(list)-maxNamesShown)
		list = list[:maxNamesShown]
	}
	for i, n := range list {
		list[i] = printableString(n)
	}
	whose := fmt.Sprintf("%ss it has", kind)
	switch {
	case group != "":
		whose = "its topics there"
	case brokers:
		whose = fmt.Sprintf("%ss the schema has", kind)
	}
	return fmt.Sprintf("%s; %s: %s%s", where, whose, strings.Join(list, ", "), more)
}

// closest orders names by their edit distance to name (ignoring case),
// nearest first, ties alphabetically.
func closest(name string, names []string) []string {
	out := slices.Clone(names)
	d := make(map[string]int, len(out))
	for _, n := range out {
		d[n] = editDistance(strings.ToLower(name), strings.ToLower(n))
	}
	sort.SliceStable(out, func(i, j int) bool {
		if d[out[i]] != d[out[j]] {
			return d[out[i]] < d[out[j]]
		}
		return out[i] < out[j]
	})
	return out
}

// editDistance is the Levenshtein distance between a and b, in runes.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(rb)]
}

// flagSuggestions are the command's flags (its own and those it inherits,
// not the hidden ones) that a mistyped flag may have meant: within
// suggestionDistance edits, or that it begins (four characters or more),
// nearest first.
func flagSuggestions(c *cobra.Command, typed string) []string {
	typed = strings.ToLower(typed)
	type cand struct {
		name string
		d    int
	}
	var cands []cand
	seen := map[string]bool{}
	visit := func(fl *pflag.Flag) {
		if fl.Hidden || seen[fl.Name] {
			return
		}
		seen[fl.Name] = true
		d := editDistance(typed, fl.Name)
		if d <= suggestionDistance || len([]rune(typed)) >= 4 && strings.HasPrefix(fl.Name, typed) {
			cands = append(cands, cand{fl.Name, d})
		}
	}
	c.Flags().VisitAll(visit)
	c.InheritedFlags().VisitAll(visit)
	sort.Slice(cands, func(i, j int) bool {
		if cands[i].d != cands[j].d {
			return cands[i].d < cands[j].d
		}
		return cands[i].name < cands[j].name
	})
	var out []string
	for _, k := range cands {
		if len(out) == 3 {
			break
		}
		out = append(out, "--"+k.name)
	}
	return out
}

// Completion of --group and --topic values: the names the database knows
// (with --database-url, given or from TENURE_DATABASE_URL) and those the
// brokers know (with --brokers), read within completionTimeout. Completion
// runs at every Tab: it says nothing when either cannot be read, and
// offers what the other gave.

// completionTimeout bounds the reads of one completion.
const completionTimeout = 2 * time.Second

// noNameCompletion are the commands whose --group or --topic name
// something that is not there yet: a topic to create, a test broker's or
// benchmark's own.
var noNameCompletion = []string{"tenure admin topic create", "tenure broker", "tenure bench", "tenure bench-child"}

// registerNameCompletion completes the command's --group and --topic
// (never with file names).
func (t *tree) registerNameCompletion(c *cobra.Command, f *flagSet) {
	for _, kind := range []string{"group", "topic"} {
		if c.Flags().Lookup(kind) == nil {
			continue
		}
		if slices.Contains(noNameCompletion, c.CommandPath()) {
			_ = c.RegisterFlagCompletionFunc(kind, cobra.NoFileCompletions)
			continue
		}
		_ = c.RegisterFlagCompletionFunc(kind, func(c *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
			ctx := c.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			var out []string
			for _, n := range completeNames(ctx, c, f, kind) {
				if strings.HasPrefix(n, toComplete) {
					out = append(out, n)
				}
			}
			return out, cobra.ShellCompDirectiveNoFileComp
		})
	}
}

// completeNames reads the groups or topics the command's database and
// brokers know, sorted; nothing from a source that does not answer in time.
func completeNames(ctx context.Context, c *cobra.Command, f *flagSet, kind string) []string {
	ctx, cancel := context.WithTimeout(ctx, completionTimeout)
	defer cancel()
	_ = f.fromEnv()
	value := func(name string) string {
		if fl := c.Flags().Lookup(name); fl != nil {
			return strings.TrimSpace(fl.Value.String())
		}
		return ""
	}
	group := ""
	if kind == "topic" {
		group = value("group")
	}
	var (
		mu    sync.Mutex
		names []string
		wg    sync.WaitGroup
	)
	add := func(ns []string) {
		mu.Lock()
		defer mu.Unlock()
		names = append(names, ns...)
	}
	if url := value("database-url"); url != "" {
		schema := value("schema")
		if schema == "" {
			schema = sink.DefaultSchema
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			add(databaseNames(ctx, url, schema, kind, group))
		}()
	}
	if k := f.kafka; k != nil && k.brokers != "" {
		wg.Add(1)
		go func() {
			defer wg.Done()
			add(brokerNames(ctx, k, kind))
		}()
	}
	wg.Wait()
	slices.Sort(names)
	return slices.Compact(names)
}

// databaseNames are the groups, or the topics (of group, if given), of
// the schema.
func databaseNames(ctx context.Context, url, schema, kind, group string) []string {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil
	}
	cfg.MaxConns = 1
	cfg.ConnConfig.ConnectTimeout = completionTimeout
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil
	}
	defer pool.Close()
	store, err := sink.NewStore(pool, schema)
	if err != nil {
		return nil
	}
	var names []string
	if kind == "group" {
		names, err = store.KnownGroups(ctx)
	} else {
		names, err = store.KnownTopics(ctx, group)
	}
	if err != nil {
		return nil
	}
	return completable(names)
}

// brokerNames are the consumer groups, or the topics (not the internal
// ones), on the brokers.
func brokerNames(ctx context.Context, k *kafkaFlags, kind string) []string {
	opts, err := k.kgoOpts(func(string) {})
	if err != nil {
		return nil
	}
	cl, err := kafkaClient(k.list(), opts...)
	if err != nil {
		return nil
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	var names []string
	if kind == "group" {
		lg, err := adm.ListGroups(ctx)
		if err != nil {
			return nil
		}
		names = lg.Groups()
	} else {
		td, err := adm.ListTopics(ctx)
		if err != nil {
			return nil
		}
		names = td.Names()
	}
	return completable(names)
}

// completable drops the names a shell could not take as one word.
func completable(names []string) []string {
	return slices.DeleteFunc(names, func(n string) bool {
		return n == "" || strings.IndexFunc(n, func(r rune) bool { return unicode.IsSpace(r) || !unicode.IsPrint(r) }) >= 0
	})
}

// The commands whose names are checked, and why some are not.

// assignments' --topic is not checked against the database: the
// coordinator's side of a topic no worker has claimed yet is an answer,
// and the brokers already refuse a topic they do not have (checkTopics).
func (c *assignments) names() nameRefs { return nameRefs{group: c.group} }

func (c *fences) names() nameRefs      { return nameRefs{group: c.group} }
func (c *fencesPrune) names() nameRefs { return nameRefs{group: c.group} }
func (c *holds) names() nameRefs       { return nameRefs{group: c.group} }
func (c *dlqList) names() nameRefs     { return nameRefs{group: c.group, topic: c.topic} }
func (c *exportsList) names() nameRefs { return nameRefs{group: c.group} }

// A hold, and a recorded partition count, are rows: acknowledging either
// for a name with no rows has nothing to act on.
func (c *holdAcknowledge) names() nameRefs       { return nameRefs{group: c.group, topic: c.topic} }
func (c *acknowledgePartitions) names() nameRefs { return nameRefs{group: c.group, topic: c.topic} }

// The job's topic is its id's first part.
func (c *jobLookup) names() nameRefs { return nameRefs{group: c.group, topic: c.topic} }

// A reset moves stored offsets, which a group no worker has run for does
// not have: where such a group starts is its offset committed in Kafka.
// A group the brokers know gets the command's own answer (no fencing row,
// and the same advice).
func (c *offsetsReset) names() nameRefs {
	return nameRefs{group: c.group, topic: c.topic, groupNote: "nothing was changed (a group's first claim of a partition starts at the offset the group committed in Kafka, " +
		"else at the log's start: to choose where a new group starts, commit that offset for it before any worker runs, e.g. with kafka-consumer-groups --reset-offsets)"}
}

// group delete deletes a group of the brokers (--brokers is required), so
// one that has no rows yet passes: only a name neither knows is refused.
func (c *groupDelete) names() nameRefs { return nameRefs{group: c.group} }

// The ownership page is started beside the workers, by a deployment that
// does not wait for them (deploy/compose): a group that has no rows yet is
// a warning, and the page shows it once its workers have run.
func (c *serveCmd) names() nameRefs {
	return nameRefs{group: c.group, warnOnly: true, groupNote: "serving the page all the same: it shows the group once its workers have run"}
}

// namesNotChecked are the commands that take --group or --topic and do not
// check them against the database, and why.
var namesNotChecked = map[string]string{
	"tenure worker":                     "it creates the group's rows",
	"tenure produce":                    "the brokers refuse a topic they do not have",
	"tenure broker":                     "it creates the topics",
	"tenure bench":                      "it runs its own broker, group and topic",
	"tenure bench-child":                "it runs its own broker, group and topic",
	"tenure admin topic create":         "it creates the topic",
	"tenure admin topic describe":       "the brokers refuse a topic they do not have",
	"tenure admin topic add-partitions": "the brokers refuse a topic they do not have",
	"tenure admin jobs peek":            "the brokers refuse a topic they do not have",
	"tenure admin jobs tail":            "the brokers refuse a topic they do not have",
}
