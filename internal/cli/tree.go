package cli

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// The admin subcommands are listed in the order they are added (topic
// commands first), not alphabetically.
func init() { cobra.EnableCommandSorting = false }

// runner is one command's own part: its flags, its checks of them and its
// arguments before anything connects, and its work. leaf adds what every
// command shares: the environment, required flags, the count of
// arguments, and the one sentence an error becomes.
type runner interface {
	define(f *flagSet)
	// check refuses bad usage; every error it returns is one.
	check(args []string) error
	run(ctx context.Context) error
}

// spec is how a command is named and shown.
type spec struct {
	name  string // "create"
	args  string // its arguments in the usage: "ID [ID...]"
	short string // one line in the lists of commands
	long  string // a paragraph under the usage line
	// maxArgs is the most arguments it takes (-1: any number).
	maxArgs int
	hidden  bool
	// validArgs are the words its first argument may be, for completion.
	validArgs []string
}

// tree is the command tree of one run.
type tree struct {
	e     *env
	root  *cobra.Command
	flags map[*cobra.Command]*flagSet
}

func newTree(e *env) *tree {
	t := &tree{e: e, flags: map[*cobra.Command]*flagSet{}}
	t.root = &cobra.Command{
		Use:           "tenure",
		Short:         "fenced Kafka partition workers and their operation",
		Version:       versionText(),
		SilenceErrors: true,
		SilenceUsage:  true,
		// Unknown commands are this command's arguments: run says so, with
		// suggestions, in tenure's one sentence, whatever flags follow.
		Args:               cobra.ArbitraryArgs,
		FParseErrWhitelist: cobra.FParseErrWhitelist{UnknownFlags: true},
		RunE: func(c *cobra.Command, args []string) error {
			return subcommandError(c, args)
		},
		CompletionOptions:          cobra.CompletionOptions{DisableDefaultCmd: true},
		SuggestionsMinimumDistance: suggestionDistance,
	}
	t.root.SetIn(e.stdin)
	t.root.SetOut(e.stdout)
	t.root.SetErr(e.stderr)
	t.root.SetVersionTemplate("{{.Version}}\n")
	t.root.SetFlagErrorFunc(flagError)
	t.root.SetHelpFunc(t.help)
	t.root.SetUsageFunc(func(c *cobra.Command) error {
		fmt.Fprintln(c.ErrOrStderr(), usagePointer(c))
		return nil
	})
	t.root.SetHelpCommand(t.helpCommand())
	t.root.AddCommand(
		t.adminCommand(),
		t.leaf(benchSpec, &benchCmd{}),
		t.leaf(benchChildSpec, &benchChild{}),
		t.leaf(brokerSpec, &brokerCmd{}),
		t.leaf(completionSpec, &completionCmd{root: t.root}),
		t.leaf(demoSpec, &demoCmd{}),
		t.leaf(migrateSpec, adminLeaf{&migrateCmd{}}),
		t.leaf(probeSpec, &probeCmd{}),
		t.leaf(produceSpec, &produceCmd{}),
		t.leaf(versionSpec, &versionCmd{}),
		t.leaf(workerSpec, &workerCmd{}),
	)
	// The help and version flags exist before parsing, so that a one-dash
	// -help is known (oneDashFlags).
	walk(t.root, func(c *cobra.Command) { c.InitDefaultHelpFlag() })
	t.root.InitDefaultVersionFlag()
	// Once every command has its path: --group and --topic complete with
	// the names the database and brokers know (known.go).
	walk(t.root, func(c *cobra.Command) {
		if f := t.flags[c]; f != nil {
			t.registerNameCompletion(c, f)
		}
	})
	return t
}

func walk(c *cobra.Command, fn func(*cobra.Command)) {
	fn(c)
	for _, s := range c.Commands() {
		walk(s, fn)
	}
}

// envSetter is implemented by commands that keep the environment (base).
type envSetter interface{ setEnv(*env) }

// base is what every command may use of its environment.
type base struct{ *env }

func (b *base) setEnv(e *env) { b.env = e }

// leaf makes the cobra command that runs r.
func (t *tree) leaf(s spec, r runner) *cobra.Command {
	use := s.name
	if s.args != "" {
		use += " " + s.args
	}
	c := &cobra.Command{
		Use:       use,
		Short:     s.short,
		Long:      s.long,
		Hidden:    s.hidden,
		ValidArgs: s.validArgs,
		Args:      cobra.ArbitraryArgs,
	}
	if es, ok := r.(envSetter); ok {
		es.setEnv(t.e)
	}
	f := newFlagSet(t.e, c.Flags())
	t.flags[c] = f
	r.define(f)
	c.RunE = func(c *cobra.Command, args []string) error {
		if err := t.prepare(c, f, s, args); err != nil {
			return err
		}
		if err := r.check(args); err != nil {
			return asUsage(err)
		}
		return r.run(c.Context())
	}
	return c
}

// prepare does what every command does before its own checks: read the
// environment, note the database URL's password, count the arguments and
// check the required flags.
func (t *tree) prepare(c *cobra.Command, f *flagSet, s spec, args []string) error {
	if err := f.fromEnv(); err != nil {
		return err
	}
	// A password in a database URL given as a flag is a secret too.
	if fl := c.Flags().Lookup("database-url"); fl != nil {
		t.e.secrets.addDatabaseURL(fl.Value.String())
	}
	if s.maxArgs >= 0 && len(args) > s.maxArgs {
		return usagef("unexpected argument %q", args[s.maxArgs])
	}
	if err := f.checkRequired(); err != nil {
		return err
	}
	// A database URL that is not one is bad usage, in every command.
	if fl := c.Flags().Lookup("database-url"); fl != nil {
		return checkDatabaseURL(fl.Value.String(), !fl.Changed && t.e.getenv(envName("database-url")) != "")
	}
	return nil
}

// group makes a command that only holds subcommands.
func (t *tree) group(name, short string, subs ...*cobra.Command) *cobra.Command {
	c := &cobra.Command{
		Use:   name,
		Short: short,
		Args:  cobra.ArbitraryArgs,
		RunE:  subcommandError,
		// Flags of the subcommands given without one are not this
		// command's business: it says a subcommand is missing.
		FParseErrWhitelist: cobra.FParseErrWhitelist{UnknownFlags: true},
		Annotations:        map[string]string{annGroup: "true"},
		// "dlq lsit": did you mean "dlq list"?
		SuggestionsMinimumDistance: suggestionDistance,
	}
	c.AddCommand(subs...)
	return c
}

// suggestionDistance is how many edits away a mistyped command may be to
// be suggested ("wroker": did you mean "worker"?).
const suggestionDistance = 2

// subcommandError is what a command that holds subcommands says when
// none of them was named: which are there, or which was meant.
func subcommandError(c *cobra.Command, args []string) error {
	if len(args) == 1 && args[0] == "help" && c.HasParent() {
		// `tenure admin help` is `tenure admin --help`.
		c.HelpFunc()(c, nil)
		return nil
	}
	word := "command"
	if c.HasParent() {
		word = "subcommand"
	}
	names := subcommandNames(c)
	if len(args) == 0 {
		if c.HasParent() {
			return usagef("%q needs a %s: %s", relPath(c), word, strings.Join(names, ", "))
		}
		return usagef("a %s is required: %s", word, strings.Join(names, ", "))
	}
	typed := args[0]
	if c.HasParent() && c.Parent().HasParent() {
		typed = strings.TrimPrefix(relPath(c)+" ", "admin ") + typed
	}
	msg := fmt.Sprintf("unknown %s %q", word, typed)
	var hints []string
	for _, s := range c.SuggestionsFor(args[0]) {
		hints = append(hints, fmt.Sprintf("%q", strings.TrimSuffix(typed, args[0])+s))
	}
	if len(hints) > 0 {
		return usagef("%s; did you mean %s?", msg, strings.Join(hints, " or "))
	}
	return usagef("%s (%ss: %s)", msg, word, strings.Join(names, ", "))
}

// relPath is a command's path without "tenure ": "admin topic".
func relPath(c *cobra.Command) string {
	return strings.TrimPrefix(strings.TrimPrefix(c.CommandPath(), c.Root().Name()), " ")
}

// listName is how a command is named in its group's list: the root lists
// its commands by name, admin its subcommands by their path below admin
// ("topic create").
func listName(c *cobra.Command) string {
	p := strings.Fields(relPath(c))
	if len(p) > 1 {
		p = p[1:]
	}
	return strings.Join(p, " ")
}

// listed are the commands a group's list shows: the root's own commands;
// below it, every runnable command of the group, nested ones included.
func listed(c *cobra.Command) []*cobra.Command {
	var out []*cobra.Command
	if !c.HasParent() {
		for _, s := range c.Commands() {
			if s.IsAvailableCommand() || s.Name() == "help" {
				out = append(out, s)
			}
		}
		sort.Slice(out, func(i, j int) bool { return out[i].Name() < out[j].Name() })
		return out
	}
	for _, s := range c.Commands() {
		if s.Hidden {
			continue
		}
		if s.Runnable() && !isGroup(s) {
			out = append(out, s)
		}
		out = append(out, listed(s)...)
	}
	return out
}

// annGroup marks a command that only holds subcommands.
const annGroup = "tenure_group"

func isGroup(c *cobra.Command) bool { return c.Annotations[annGroup] != "" }

func subcommandNames(c *cobra.Command) []string {
	var out []string
	for _, s := range listed(c) {
		out = append(out, listName(s))
	}
	return out
}

// usagePointer is the line that follows a usage error: the usage in one
// line and where the rest is.
func usagePointer(c *cobra.Command) string {
	switch {
	case !c.HasParent():
		return "usage: tenure <command> [flags] (run 'tenure --help' for the commands)"
	case isGroup(c):
		return fmt.Sprintf("usage: %s <subcommand> [flags] (run '%s --help' for the subcommands)", c.CommandPath(), c.CommandPath())
	}
	return fmt.Sprintf("usage: %s (run '%s --help' for the flags)", c.UseLine(), c.CommandPath())
}

// help prints a command's help to stdout: a group's list of commands, or
// a command's usage line and flags.
func (t *tree) help(c *cobra.Command, _ []string) {
	w := c.OutOrStdout()
	f := t.flags[c]
	if f == nil {
		t.printList(w, c)
		return
	}
	// Variables' values are shown as the defaults they are.
	_ = f.fromEnv()
	fmt.Fprintln(w, usageLine(c, f))
	if c.Long != "" {
		fmt.Fprintf(w, "\n%s\n", strings.TrimSpace(c.Long))
	}
	if subs := listed(c); len(subs) > 0 {
		fmt.Fprintln(w, "\nsubcommands:")
		for _, s := range subs {
			fmt.Fprintf(w, "  %-29s %s\n", listName(s), s.Short)
		}
	}
	fmt.Fprint(w, "\nflags (environment variable in brackets):\n")
	var flags []*pflag.Flag
	f.fs.VisitAll(func(fl *pflag.Flag) {
		if !fl.Hidden && fl.Name != "help" {
			flags = append(flags, fl)
		}
	})
	sort.Slice(flags, func(i, j int) bool { return flags[i].Name < flags[j].Name })
	for _, fl := range flags {
		line := "  --" + fl.Name
		if a := argName(fl); a != "" {
			line += " " + a
		}
		_, usage := pflag.UnquoteUsage(fl)
		if v := fl.Annotations[annEnv]; len(v) > 0 {
			usage += " [" + v[0] + "]"
		}
		if fl.DefValue != "" && fl.DefValue != "0" && fl.DefValue != "false" {
			usage += " (default " + t.e.secrets.redact(fl.DefValue) + ")"
		}
		fmt.Fprintf(w, "%s\n      %s\n", line, usage)
	}
}

// printList prints a group's usage and its commands.
func (t *tree) printList(w io.Writer, c *cobra.Command) {
	what, width, more := "<subcommand>", 29, "'"+c.CommandPath()+" <subcommand> --help' for its flags."
	if !c.HasParent() {
		what, width, more = "<command>", 10, "'tenure <command> --help' for a command's flags, 'tenure admin --help' for the admin subcommands."
	}
	fmt.Fprintf(w, "usage: %s %s [flags]\n\n", c.CommandPath(), what)
	for _, s := range listed(c) {
		fmt.Fprintf(w, "  %-*s %s\n", width, listName(s), s.Short)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "Flags also read TENURE_* environment variables (flags win), as each command's --help shows. %s\n", more)
}

// usageWidth is where the usage line wraps.
const usageWidth = 100

// usageLine is "usage: tenure CMD ARGS" and every flag the command shows,
// the required ones bare and the others in brackets, wrapped.
func usageLine(c *cobra.Command, f *flagSet) string {
	var b strings.Builder
	line := "usage: " + c.CommandPath()
	if a := strings.TrimPrefix(c.Use, c.Name()); a != "" {
		line += a
	}
	add := func(item string) {
		if utf8.RuneCountInString(line)+1+utf8.RuneCountInString(item) > usageWidth && strings.TrimSpace(line) != "" {
			b.WriteString(line + "\n")
			line = "   "
		}
		line += " " + item
	}
	// Required flags first, then the others; the TLS and SASL flags last.
	var req, opt, late []string
	f.fs.VisitAll(func(fl *pflag.Flag) {
		if fl.Hidden || fl.Name == "help" {
			return
		}
		item := "--" + fl.Name
		if a := argName(fl); a != "" {
			item += " " + a
		}
		switch {
		case fl.Annotations[annRequired] != nil:
			req = append(req, item)
		case fl.Annotations[annLate] != nil:
			late = append(late, "["+item+"]")
		default:
			opt = append(opt, "["+item+"]")
		}
	})
	for _, item := range slices.Concat(req, opt, late) {
		add(item)
	}
	b.WriteString(line)
	return b.String()
}

// helpCommand is `tenure help [command]`: the command's --help.
func (t *tree) helpCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "help [command]",
		Short: "help about a command: 'tenure help produce' is 'tenure produce --help'",
		Args:  cobra.ArbitraryArgs,
		RunE: func(c *cobra.Command, args []string) error {
			target, rest, err := c.Root().Find(args)
			if err != nil || target == nil {
				target = c.Root()
			}
			if len(rest) > 0 && target.Runnable() && (isGroup(target) || !target.HasParent()) {
				if words := stripFlags(rest); len(words) > 0 {
					return subcommandError(target, words)
				}
			}
			t.help(target, nil)
			return nil
		},
	}
}

// stripFlags returns the words of args that are not flags.
func stripFlags(args []string) []string {
	var out []string
	for _, a := range args {
		if !strings.HasPrefix(a, "-") {
			out = append(out, a)
		}
	}
	return out
}
