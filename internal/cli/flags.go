package cli

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/tenure-dev/tenure/partition"
)

// flagSet declares a command's flags on its pflag set. What a flag is
// besides its value (the argument name its usage shows, whether it is
// required, the variable it reads) is kept in the flag's annotations, so
// that the usage line and --help are generated from the definitions.
type flagSet struct {
	fs *pflag.FlagSet
	e  *env
	// fromEnv's result, once it ran.
	envDone bool
	envErr  error
	// kafka are the command's Kafka flags (kafkaFlags.define), for the
	// completion of names the brokers know.
	kafka *kafkaFlags
}

func newFlagSet(e *env, fs *pflag.FlagSet) *flagSet {
	// The usage line lists flags in the order they are declared; --help
	// sorts them itself.
	fs.SortFlags = false
	return &flagSet{fs: fs, e: e}
}

const (
	annArg      = "tenure_arg"      // the argument name the usage shows ("T[,T2]")
	annEnv      = "tenure_env"      // the variable the flag reads
	annRequired = "tenure_required" // shown without brackets; checked once the environment is read
	annLate     = "tenure_late"     // shown at the end of the usage line
)

// flagOpt adds to a flag's definition.
type flagOpt func(*pflag.Flag)

// arg names a flag's argument in the usage ("HOST:PORT[,..]"); without it,
// the name comes from the flag's type or, for strings, its last word.
func arg(name string) flagOpt {
	return func(fl *pflag.Flag) { fl.Annotations[annArg] = []string{name} }
}

// required flags must be given, by the flag or its variable. A string flag
// left empty is refused with the others (checkRequired); a command checks
// its other required flags itself, saying what they take.
func required(fl *pflag.Flag) { fl.Annotations[annRequired] = []string{"true"} }

// late flags come last in the usage line: the TLS and SASL flags, which
// most commands take and most uses leave out.
func late(fl *pflag.Flag) { fl.Annotations[annLate] = []string{"true"} }

// noEnv flags never read the environment.
func noEnv(fl *pflag.Flag) { delete(fl.Annotations, annEnv) }

// destructive flags arm something that cannot be undone: only the command
// line may, never a variable left set in a shell or a manifest. They are
// hidden from the usage: the message that refuses the operation names the
// flag, so whoever needs it meets it there, with the reason.
func destructive(fl *pflag.Flag) {
	noEnv(fl)
	fl.Hidden = true
}

// testOnly flags exist for demos, tests and benchmarks: hidden from the
// usage and --help, and never read from the environment, so that nothing
// but a command line written for a test arms them.
func testOnly(fl *pflag.Flag) {
	noEnv(fl)
	fl.Hidden = true
}

// envName is the variable a flag reads: --batch-max reads TENURE_BATCH_MAX.
func envName(flagName string) string {
	return "TENURE_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

func (f *flagSet) annotate(name string, opts []flagOpt) {
	fl := f.fs.Lookup(name)
	fl.Annotations = map[string][]string{annEnv: {envName(name)}}
	for _, o := range opts {
		o(fl)
	}
}

func (f *flagSet) String(p *string, name, def, usage string, opts ...flagOpt) {
	f.fs.StringVar(p, name, def, usage)
	f.annotate(name, opts)
}

func (f *flagSet) Int(p *int, name string, def int, usage string, opts ...flagOpt) {
	f.fs.IntVar(p, name, def, usage)
	f.annotate(name, opts)
}

func (f *flagSet) Duration(p *time.Duration, name string, def time.Duration, usage string, opts ...flagOpt) {
	f.fs.DurationVar(p, name, def, usage)
	f.annotate(name, opts)
}

func (f *flagSet) Bool(p *bool, name string, def bool, usage string, opts ...flagOpt) {
	f.fs.BoolVar(p, name, def, usage)
	f.annotate(name, opts)
}

// Bytes is a size flag: a number of bytes, or one with a KiB, MiB or GiB
// suffix ("4MiB").
func (f *flagSet) Bytes(p *int64, name string, def int64, usage string, opts ...flagOpt) {
	*p = def
	f.fs.Var((*bytesValue)(p), name, usage)
	f.annotate(name, opts)
}

// Count is a partition count flag: partition.ParseCount's rules (a whole
// number from 1 to partition.MaxCount, parsed at its full width). 0 means
// not given.
func (f *flagSet) Count(p *int32, name string, def int32, usage string, opts ...flagOpt) {
	*p = def
	f.fs.Var((*countValue)(p), name, usage)
	f.annotate(name, opts)
}

type bytesValue int64

var byteUnits = []struct {
	suffix string
	n      int64
}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}}

func (b *bytesValue) Set(s string) error {
	num, unit := strings.TrimSpace(s), int64(1)
	for _, u := range byteUnits {
		if v, ok := strings.CutSuffix(num, u.suffix); ok {
			num, unit = strings.TrimSpace(v), u.n
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 || n > (1<<40)/unit {
		return notA{`a size: a whole number of bytes, or one with KiB, MiB or GiB ("4MiB")`}
	}
	*b = bytesValue(n * unit)
	return nil
}

func (b *bytesValue) String() string {
	for _, u := range byteUnits {
		if n := int64(*b); n != 0 && n%u.n == 0 {
			return strconv.FormatInt(n/u.n, 10) + u.suffix
		}
	}
	return "0"
}

func (b *bytesValue) Type() string { return "size" }

type countValue int32

func (c *countValue) String() string {
	if c == nil || *c == 0 {
		return ""
	}
	return strconv.Itoa(int(*c))
}

func (c *countValue) Set(s string) error {
	n, err := partition.ParseCount(s)
	if err != nil {
		return notA{fmt.Sprintf("a partition count: a whole number from 1 to %d", partition.MaxCount)}
	}
	*c = countValue(n)
	return nil
}

func (c *countValue) Type() string { return "count" }

// fromEnv sets every flag not given on the command line from its variable,
// as its default (so --help shows it as one). A variable that does not
// parse is bad usage. It runs once; later calls return the same result.
func (f *flagSet) fromEnv() error {
	if f.envDone {
		return f.envErr
	}
	f.envDone = true
	var errs []string
	f.fs.VisitAll(func(fl *pflag.Flag) {
		name := fl.Annotations[annEnv]
		if len(name) == 0 || fl.Changed {
			return
		}
		v := f.e.getenv(name[0])
		if v == "" {
			return
		}
		if err := fl.Value.Set(v); err != nil {
			errs = append(errs, badEnvValue(name[0], v, fl.Value.Type(), err))
			return
		}
		fl.DefValue = fl.Value.String()
	})
	if len(errs) > 0 {
		f.envErr = usageError{msg: strings.Join(errs, "; ")}
	}
	return f.envErr
}

// checkRequired returns a usage error naming the first required string
// flag that is empty.
func (f *flagSet) checkRequired() error {
	var err error
	f.fs.VisitAll(func(fl *pflag.Flag) {
		if err == nil && fl.Annotations[annRequired] != nil && fl.Value.Type() == "string" && strings.TrimSpace(fl.Value.String()) == "" {
			err = usagef("--%s is required (or set %s)", fl.Name, envName(fl.Name))
		}
	})
	return err
}

// given reports whether the flag was given on the command line.
func (f *flagSet) given(name string) bool {
	fl := f.fs.Lookup(name)
	return fl != nil && fl.Changed
}

// argName is the name a flag's argument goes by in the usage: the arg
// annotation, else a back-quoted word of its usage text, else a name for
// its type ("" for a switch).
func argName(fl *pflag.Flag) string {
	if a := fl.Annotations[annArg]; len(a) > 0 {
		return a[0]
	}
	if name, _ := pflag.UnquoteUsage(fl); strings.Contains(fl.Usage, "`") {
		return name
	}
	switch fl.Value.Type() {
	case "bool":
		return ""
	case "duration":
		return "D"
	case "int", "count":
		return "N"
	case "size":
		return "SIZE"
	}
	// A string: the flag's last word, "--export-store" takes a STORE.
	words := strings.Split(fl.Name, "-")
	return strings.ToUpper(words[len(words)-1])
}

// flagError rewords pflag's parse errors the way tenure has always said
// them: `--partitions "x" is not a partition count: ...` (badFlagValue),
// `flag provided but not defined: --bogus`; a mistyped flag gets the flags
// it may have meant, as a mistyped command does (`--gruop; did you mean
// --group?`).
func flagError(c *cobra.Command, err error) error {
	var (
		notExist *pflag.NotExistError
		noValue  *pflag.ValueRequiredError
		invalid  *pflag.InvalidValueError
	)
	switch {
	case errors.As(err, &notExist):
		if s := notExist.GetSpecifiedShortnames(); s != "" {
			return usagef("flag provided but not defined: -%s", s)
		}
		name := notExist.GetSpecifiedName()
		if hints := flagSuggestions(c, name); len(hints) > 0 {
			return usagef("flag provided but not defined: --%s; did you mean %s?", name, strings.Join(hints, " or "))
		}
		return usagef("flag provided but not defined: --%s", name)
	case errors.As(err, &noValue):
		return usagef("flag needs an argument: --%s", noValue.GetFlag().Name)
	case errors.As(err, &invalid):
		return usageError{msg: badFlagValue(invalid.GetFlag().Name, invalid.GetValue(), invalid.GetFlag().Value.Type(), errors.Unwrap(invalid))}
	}
	return asUsage(err)
}

// oneDashFlags lets a long flag be given with one dash, as Go's flag
// package took it (`-batch-max=250`): pflag would read -batch-max as
// shorthands. Only names the command defines are rewritten, and never a
// flag's value.
func oneDashFlags(root *cobra.Command, args []string) []string {
	cmd, _, err := root.Find(args)
	if err != nil || cmd == nil {
		return args
	}
	cmd.InitDefaultHelpFlag()
	flags := cmd.Flags()
	takesValue := func(name string) bool {
		fl := flags.Lookup(name)
		return fl != nil && fl.NoOptDefVal == ""
	}
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		out = append(out, a)
		if a == "--" {
			return append(out, args[i+1:]...)
		}
		if !strings.HasPrefix(a, "-") || len(a) < 3 {
			continue
		}
		name, _, hasValue := strings.Cut(strings.TrimPrefix(a, "-"), "=")
		if !strings.HasPrefix(a, "--") {
			if flags.Lookup(name) == nil {
				continue
			}
			out[len(out)-1] = "-" + a
		} else {
			name = strings.TrimPrefix(name, "-")
		}
		if !hasValue && takesValue(name) && i+1 < len(args) {
			i++
			out = append(out, args[i])
		}
	}
	return out
}

// logFlags adds --log-format and --log-level.
type logFlags struct{ format, level string }

func (l *logFlags) define(f *flagSet, format, level string) {
	f.String(&l.format, "log-format", format, "log format: json or console", arg("json|console"))
	f.String(&l.level, "log-level", level, "log level: debug, info, warn, error", arg("LEVEL"))
}

// logger makes the logger the flags say, writing to stderr through the
// secrets' redaction.
func (l *logFlags) logger(e *env) (*zap.Logger, error) {
	return newLogger(e.secrets.writer(e.stderr), l.format, l.level)
}

func newLogger(w io.Writer, format, level string) (*zap.Logger, error) {
	var lvl zapcore.Level
	if err := lvl.Set(level); err != nil {
		return nil, usagef("--log-level %q is not one of debug, info, warn, error", level)
	}
	encCfg := zap.NewProductionEncoderConfig()
	encCfg.TimeKey = "ts"
	encCfg.EncodeTime = zapcore.ISO8601TimeEncoder
	var enc zapcore.Encoder
	switch format {
	case "json":
		enc = zapcore.NewJSONEncoder(encCfg)
	case "console":
		encCfg.EncodeLevel = zapcore.CapitalColorLevelEncoder
		enc = zapcore.NewConsoleEncoder(encCfg)
	default:
		return nil, usagef("--log-format %q is not json or console", format)
	}
	return zap.New(zapcore.NewCore(enc, zapcore.AddSync(w), lvl)), nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
