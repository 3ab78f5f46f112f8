// Package cli is the tenure command line: every command of the binary,
// built on cobra. `tenure --help` (or `tenure help`) is the list of
// commands, `tenure admin --help` the list of admin subcommands, and
// `tenure <command> --help` a command's flags; cmd/tenure only calls Main.
//
// The rules every command follows, kept here once:
//
//   - A flag not given on the command line reads the environment variable
//     TENURE_<NAME> (upper case, dashes as underscores); flags win. Flags
//     that arm something destructive or exist for tests only never do
//     (flags.go), so that a variable left in a shell cannot arm them.
//   - Flags may come before, between or after a command's other arguments.
//   - Exit status 0 is success; 1 a failure, said in one sentence on
//     stderr; 2 bad usage, said in one sentence followed by the usage line
//     and where to find the rest; 130 when a second SIGINT or SIGTERM
//     stops a command at once (signals.go).
//   - Results go to stdout, --help too; logs and messages to stderr.
//   - Passwords never reach an output: errors, logs and help pass through
//     the secrets' redaction (secrets.go).
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync/atomic"

	"github.com/spf13/cobra"
)

// Main runs the tenure command line with the process's arguments, streams
// and environment, and returns the exit status.
func Main(args []string) int {
	e := &env{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv}
	ctx, stop := signalContext(e.stderr)
	defer stop()
	return run(ctx, e, args)
}

// env is what a command talks to: its streams and environment, so that
// tests can run commands in-process too.
type env struct {
	stdin          io.Reader // `produce --input -`
	stdout, stderr io.Writer
	getenv         func(string) string
	// secrets are redacted from errors, logs and help (secrets.go); run
	// sets it up.
	secrets *secrets
	// kafkaFailure is a sentence about the brokers refusing the command's
	// credentials (authWatch), printed instead of the command's own error.
	kafkaFailure atomic.Pointer[string]
	// notKafka is a sentence about addresses of --brokers that answered,
	// but not as Kafka brokers (kafkaPeerWatch), printed instead of the
	// command's own error when that error is their answer in kgo's words.
	notKafka atomic.Pointer[string]
}

func (e *env) setKafkaFailure(msg string) { e.kafkaFailure.CompareAndSwap(nil, &msg) }

// usageError is bad usage: exit status 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{msg: fmt.Sprintf(format, args...)} }

// asUsage makes err a usage error, keeping its sentence.
func asUsage(err error) error {
	var ue usageError
	if err == nil || errors.As(err, &ue) {
		return err
	}
	return usageError{msg: err.Error()}
}

// run runs one command line and returns its exit status.
func run(ctx context.Context, e *env, args []string) int {
	if e.secrets == nil {
		e.secrets = &secrets{}
	}
	// Passwords that come from the environment; those of flags are added
	// when the flags are parsed.
	e.secrets.add(e.getenv(envSASLPassword))
	e.secrets.add(e.getenv("PGPASSWORD"))
	e.secrets.addDatabaseURL(e.getenv("TENURE_DATABASE_URL"))

	t := newTree(e)
	// A nil slice would make cobra read os.Args.
	t.root.SetArgs(append([]string{}, oneDashFlags(t.root, args)...))
	cmd, err := t.root.ExecuteContextC(ctx)
	return t.exit(cmd, err)
}

// exit says what went wrong, if anything, and returns the exit status.
func (t *tree) exit(cmd *cobra.Command, err error) int {
	if err == nil {
		return 0
	}
	if cmd == nil {
		cmd = t.root
	}
	e := t.e
	prefix := cmd.CommandPath() // "tenure admin dlq replay"
	var ue usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(e.stderr, "%s: %s\n", prefix, e.secrets.redact(ue.msg))
		fmt.Fprintln(e.stderr, usagePointer(cmd))
		return 2
	}
	msg := sentence(err)
	if f := e.kafkaFailure.Load(); f != nil {
		msg = *f
	} else if f := e.notKafka.Load(); f != nil && notKafka(err) != "" {
		msg = *f
	}
	fmt.Fprintf(e.stderr, "%s: %s\n", prefix, e.secrets.redact(msg))
	return 1
}

// sentence flattens an error to one line.
func sentence(err error) string {
	s := strings.TrimSpace(err.Error())
	s = strings.ReplaceAll(s, "\n", "; ")
	return s
}
