package main

import (
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/tenure-dev/tenure/partition"
)

// flagSet is a flag.FlagSet whose flags default to TENURE_* environment
// variables. It prints its own usage: in full to stdout for --help (exit 0,
// so that `| less` works), the usage line to stderr beside a flag error.
type flagSet struct {
	*flag.FlagSet
	e       *env
	name    string // "produce", "admin topic create"
	usage   string // what follows the name on the usage line
	envErrs []string
	// positional are the arguments that are not flags, in order; flags may
	// come before, between or after them.
	positional []string
	// usagePrinted is set once the usage line went to stderr.
	usagePrinted bool
}

func newFlagSet(e *env, name, usage string) *flagSet {
	fs := flag.NewFlagSet("tenure "+name, flag.ContinueOnError)
	// The flag package would print errors and usage itself; parse does.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return &flagSet{FlagSet: fs, e: e, name: name, usage: usage}
}

// printUsageLine writes the usage line alone (beside a usage error).
func (f *flagSet) printUsageLine(w io.Writer) {
	fmt.Fprintf(w, "usage: tenure %s %s\n", f.name, f.usage)
	f.usagePrinted = true
}

// printUsage writes the usage line and every flag, with its argument name,
// environment variable and default.
func (f *flagSet) printUsage(w io.Writer) {
	fmt.Fprintf(w, "usage: tenure %s %s\n\nflags (environment variable in brackets):\n", f.name, f.usage)
	f.VisitAll(func(fl *flag.Flag) {
		arg, usage := flagArg(fl)
		line := "  --" + fl.Name
		if arg != "" {
			line += " " + arg
		}
		fmt.Fprintln(w, line)
		if fl.DefValue != "" && fl.DefValue != "0" && fl.DefValue != "false" {
			usage += " (default " + f.e.secrets.redact(fl.DefValue) + ")"
		}
		fmt.Fprintf(w, "      %s\n", usage)
	})
}

// flagArg is the argument name shown for a flag, and its usage text: the
// first `quoted` word of the usage, else a name for the flag's type.
func flagArg(fl *flag.Flag) (arg, usage string) {
	arg, usage = flag.UnquoteUsage(fl)
	if _, ok := fl.Value.(*countValue); ok && !strings.Contains(fl.Usage, "`") {
		arg = "N"
	}
	if _, ok := fl.Value.(*bytesValue); ok && !strings.Contains(fl.Usage, "`") {
		arg = "SIZE"
	}
	return arg, usage
}

func envName(flagName string) string {
	return "TENURE_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

func (f *flagSet) String(name, def, usage string) *string {
	if v := f.e.getenv(envName(name)); v != "" {
		def = v
	}
	return f.FlagSet.String(name, def, usage+" ["+envName(name)+"]")
}

func (f *flagSet) Int(name string, def int, usage string) *int {
	if v := f.e.getenv(envName(name)); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			f.envErrs = append(f.envErrs, fmt.Sprintf("%s=%q is not an integer", envName(name), v))
		} else {
			def = n
		}
	}
	return f.FlagSet.Int(name, def, usage+" ["+envName(name)+"]")
}

func (f *flagSet) Duration(name string, def time.Duration, usage string) *time.Duration {
	if v := f.e.getenv(envName(name)); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			f.envErrs = append(f.envErrs, fmt.Sprintf("%s=%q is not a duration", envName(name), v))
		} else {
			def = d
		}
	}
	return f.FlagSet.Duration(name, def, usage+" ["+envName(name)+"]")
}

// Bytes is a size flag: a number of bytes, or one with a KiB, MiB or GiB
// suffix ("4MiB").
func (f *flagSet) Bytes(name string, def int64, usage string) *int64 {
	v := bytesValue(def)
	if s := f.e.getenv(envName(name)); s != "" {
		if err := v.Set(s); err != nil {
			f.envErrs = append(f.envErrs, fmt.Sprintf("%s=%q: %v", envName(name), s, err))
		}
	}
	f.FlagSet.Var(&v, name, usage+" ["+envName(name)+"]")
	return (*int64)(&v)
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
		return fmt.Errorf("not a size: a whole number of bytes, or with KiB, MiB or GiB (\"4MiB\")")
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

func (f *flagSet) Bool(name string, def bool, usage string) *bool {
	if v := f.e.getenv(envName(name)); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			f.envErrs = append(f.envErrs, fmt.Sprintf("%s=%q is not a boolean", envName(name), v))
		} else {
			def = b
		}
	}
	return f.FlagSet.Bool(name, def, usage+" ["+envName(name)+"]")
}

// countValue is a partition count flag: partition.ParseCount's rules (a
// whole number from 1 to partition.MaxCount, parsed at its full width). 0
// means not given.
type countValue struct{ n int32 }

func (c *countValue) String() string {
	if c == nil || c.n == 0 {
		return ""
	}
	return strconv.Itoa(int(c.n))
}

func (c *countValue) Set(s string) error {
	n, err := partition.ParseCount(s)
	if err != nil {
		return fmt.Errorf("a partition count is a whole number from 1 to %d", partition.MaxCount)
	}
	c.n = n
	return nil
}

// Count adds a partition count flag; def 0 means none by default.
func (f *flagSet) Count(name string, def int32, usage string) *int32 {
	v := &countValue{n: def}
	if s := f.e.getenv(envName(name)); s != "" {
		if err := v.Set(s); err != nil {
			f.envErrs = append(f.envErrs, fmt.Sprintf("%s=%q: %v", envName(name), s, err))
		}
	}
	f.FlagSet.Var(v, name, usage+" ["+envName(name)+"]")
	return &v.n
}

// parse parses args, whose flags may come before, between or after at most
// maxPositional other arguments (`migrate up --schema s`); those are left in
// f.positional. After "--" every argument is positional. Flag errors and
// stray arguments are usage errors; --help prints the usage to stdout and
// returns flag.ErrHelp.
func (f *flagSet) parse(args []string, maxPositional int) error {
	var pos []string
	for {
		if err := f.Parse(args); err != nil {
			if err == flag.ErrHelp {
				f.printUsage(f.e.stdout)
				return err
			}
			f.printUsageLine(f.e.stderr)
			return usageError{msg: flagError(err)}
		}
		rest := f.Args()
		if len(rest) == 0 {
			break
		}
		if i := len(args) - len(rest) - 1; i >= 0 && args[i] == "--" {
			pos = append(pos, rest...)
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	f.positional = pos
	// A password in a database URL given as a flag is a secret too.
	if fl := f.Lookup("database-url"); fl != nil {
		f.e.secrets.addDatabaseURL(fl.Value.String())
	}
	if len(f.envErrs) > 0 {
		return usageError{msg: strings.Join(f.envErrs, "; ")}
	}
	if len(pos) > maxPositional {
		return usagef("unexpected argument %q", pos[maxPositional])
	}
	return nil
}

// flagError rewords the flag package's errors with the double dash the
// usage shows: `invalid value "x" for flag -partitions: ...` becomes
// `invalid value "x" for --partitions: ...`.
func flagError(err error) string {
	s := err.Error()
	for _, from := range []string{" for flag -", " for -"} {
		if i := strings.Index(s, from); i >= 0 && strings.HasPrefix(s, "invalid ") {
			s = s[:i] + " for --" + s[i+len(from):]
			break
		}
	}
	if strings.HasPrefix(s, "flag provided but not defined: -") || strings.HasPrefix(s, "flag needs an argument: -") {
		i := strings.LastIndex(s, ": -")
		s = s[:i] + ": --" + strings.TrimPrefix(s[i+3:], "-")
	}
	return s
}

// required returns a usage error naming the first empty flag.
func required(pairs ...any) error {
	for i := 0; i+1 < len(pairs); i += 2 {
		if s, _ := pairs[i+1].(string); strings.TrimSpace(s) == "" {
			return usagef("--%s is required (or set %s)", pairs[i], envName(pairs[i].(string)))
		}
	}
	return nil
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

// logFlags adds --log-format and --log-level and returns a constructor.
func logFlags(f *flagSet) func() (*zap.Logger, error) {
	format := f.String("log-format", "json", "log format: json or console")
	level := f.String("log-level", "info", "log level: debug, info, warn, error")
	return func() (*zap.Logger, error) { return newLogger(f.e.secrets.writer(f.e.stderr), *format, *level) }
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
