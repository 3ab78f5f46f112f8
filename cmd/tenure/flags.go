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
)

// flagSet is a flag.FlagSet whose flags default to TENURE_* environment
// variables.
type flagSet struct {
	*flag.FlagSet
	e       *env
	envErrs []string
}

func newFlagSet(e *env, name, usage string) *flagSet {
	fs := flag.NewFlagSet("tenure "+name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	f := &flagSet{FlagSet: fs, e: e}
	fs.Usage = func() {
		fmt.Fprintf(e.stderr, "usage: tenure %s %s\n\nflags (environment variable in brackets):\n", name, usage)
		fs.PrintDefaults()
	}
	return f
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

// parse parses args; flag errors and stray arguments are usage errors.
func (f *flagSet) parse(args []string, maxPositional int) error {
	if err := f.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return err
		}
		return usageError{err.Error()}
	}
	if len(f.envErrs) > 0 {
		return usageError{strings.Join(f.envErrs, "; ")}
	}
	if f.NArg() > maxPositional {
		return usagef("unexpected argument %q", f.Arg(maxPositional))
	}
	return nil
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
	return func() (*zap.Logger, error) { return newLogger(f.e.stderr, *format, *level) }
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
