// Command tenure runs fenced partition workers and inspects them.
//
//	tenure worker    run one worker replica
//	tenure produce   produce jobs to a topic, keyed like the Java client (murmur2)
//	tenure migrate   apply (up), revert one (down) or list (status) schema migrations
//	tenure broker    run a local development broker (kfake; not for production)
//	tenure demo      replay the paused-worker story on a local broker
//	tenure admin     inspect and operate, one subcommand each:
//	    topic create                   create a topic
//	    topic describe                 a topic's partitions, leaders and high watermarks
//	    topic add-partitions           grow a topic (its groups hold it until acknowledged)
//	    topic acknowledge-partitions   accept a topic's new partition count for a group
//	    groups                         consumer groups: type, state, protocol, members
//	    assignments                    the coordinator's assignment beside Postgres's fencing rows
//	    fences                         the fencing rows in Postgres
//	    dlq list                       dead-lettered jobs
//	    dlq show                       one dead letter in full, with what was done to it
//	    dlq replay                     re-produce dead letters to their topic
//	    dlq discard                    mark dead letters as dealt with
//
// Every flag also reads an environment variable (TENURE_BROKERS, ...); flags
// win, and may come before or after a command's other arguments. Names are
// checked before anything connects: topics by Kafka's rules, groups and
// worker names as UTF-8 without control characters. --help prints to stdout.
// Logs go to stderr (JSON, or --log-format console); results to stdout.
// Exit status: 0 success, 1 failure (one sentence on stderr), 2 bad usage;
// a second SIGINT/SIGTERM exits at once with 130.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
)

// command is one subcommand. run gets the arguments after the subcommand's
// name; it returns a usageError for bad usage.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, env *env, args []string) error
	hidden  bool // internal (a process another command starts): not listed
}

// env is what a command talks to: its streams and environment, so that tests
// can run commands in-process too.
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
}

func (e *env) setKafkaFailure(msg string) { e.kafkaFailure.CompareAndSwap(nil, &msg) }

var commands []command

func register(c command) { commands = append(commands, c) }

// usageError is bad usage: exit status 2. cmd, when set, is the
// subcommand whose --help explains it ("admin topic create").
type usageError struct{ msg, cmd string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{msg: fmt.Sprintf(format, args...)} }

// commandError is a failure (exit status 1) of a subcommand: cmd names it
// on stderr ("admin dlq replay").
type commandError struct {
	cmd string
	err error
}

func (e commandError) Error() string { return e.err.Error() }
func (e commandError) Unwrap() error { return e.err }

func main() {
	e := &env{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv}
	ctx, stop := signalContext()
	defer stop()
	os.Exit(run(ctx, e, os.Args[1:]))
}

// signalError is the cause of the context a signal cancelled.
type signalError struct{ sig os.Signal }

func (s signalError) Error() string { return "received " + signalName(s.sig) }

func signalName(s os.Signal) string {
	switch s {
	case os.Interrupt:
		return "SIGINT"
	case syscall.SIGTERM:
		return "SIGTERM"
	}
	return s.String()
}

// stopSignal returns the name of the signal that cancelled ctx, or "".
func stopSignal(ctx context.Context) string {
	var se signalError
	if errors.As(context.Cause(ctx), &se) {
		return signalName(se.sig)
	}
	return ""
}

// signalContext is cancelled by the first SIGINT/SIGTERM (graceful stop; the
// cause is a signalError); a second one exits at once with status 130,
// saying so on stderr.
func signalContext() (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(context.Background())
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	go func() {
		s := <-ch
		cancel(signalError{s})
		s = <-ch
		fmt.Fprintf(os.Stderr, "tenure: second signal (%s): exiting at once with status 130\n", signalName(s))
		os.Exit(130)
	}()
	return ctx, func() { signal.Stop(ch); cancel(nil) }
}

func isHelp(arg string) bool {
	return arg == "-h" || arg == "--help" || arg == "-help" || arg == "help"
}

func run(ctx context.Context, e *env, args []string) int {
	sort.Slice(commands, func(i, j int) bool { return commands[i].name < commands[j].name })
	if e.secrets == nil {
		e.secrets = &secrets{}
	}
	// Passwords that come from the environment; those of flags are added
	// when the flags are parsed.
	e.secrets.add(e.getenv(envSASLPassword))
	e.secrets.add(e.getenv("PGPASSWORD"))
	e.secrets.addDatabaseURL(e.getenv("TENURE_DATABASE_URL"))
	if len(args) == 0 {
		printUsage(e.stderr)
		return 2
	}
	if isHelp(args[0]) {
		if len(args) > 1 && args[0] == "help" {
			// `tenure help produce` is `tenure produce --help`.
			return run(ctx, e, append(args[1:], "--help"))
		}
		printUsage(e.stdout)
		return 0
	}
	for _, c := range commands {
		if c.name == args[0] {
			err := c.run(ctx, e, args[1:])
			var ue usageError
			switch {
			case err == nil:
				return 0
			case errors.Is(err, flag.ErrHelp):
				return 0
			case errors.As(err, &ue):
				name := c.name
				if ue.cmd != "" {
					name = ue.cmd
				}
				fmt.Fprintf(e.stderr, "tenure %s: %s\n", name, e.secrets.redact(ue.msg))
				fmt.Fprintf(e.stderr, "run 'tenure %s --help' for usage\n", name)
				return 2
			default:
				name := c.name
				var ce commandError
				if errors.As(err, &ce) {
					name = ce.cmd
				}
				msg := sentence(err)
				if f := e.kafkaFailure.Load(); f != nil {
					msg = *f
				}
				fmt.Fprintf(e.stderr, "tenure %s: %s\n", name, e.secrets.redact(msg))
				return 1
			}
		}
	}
	fmt.Fprintf(e.stderr, "tenure: unknown command %q\n", args[0])
	printUsage(e.stderr)
	return 2
}

func printUsage(w io.Writer) {
	fmt.Fprintln(w, "usage: tenure <command> [flags]")
	fmt.Fprintln(w)
	for _, c := range commands {
		if !c.hidden {
			fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Flags also read TENURE_* environment variables (flags win). 'tenure <command> --help' for a command's flags.")
}

// sentence flattens an error to one line.
func sentence(err error) string {
	s := strings.TrimSpace(err.Error())
	s = strings.ReplaceAll(s, "\n", "; ")
	return s
}
