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
// win. Logs go to stderr (JSON, or --log-format console); results to stdout.
// Exit status: 0 success, 1 failure (one sentence on stderr), 2 bad usage.
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
	"syscall"
)

// command is one subcommand. run gets the arguments after the subcommand's
// name; it returns a usageError for bad usage.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, env *env, args []string) error
}

// env is what a command talks to: its streams and environment, so that tests
// can run commands in-process too.
type env struct {
	stdin          io.Reader // `produce --input -`
	stdout, stderr io.Writer
	getenv         func(string) string
}

var commands []command

func register(c command) { commands = append(commands, c) }

type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

func main() {
	e := &env{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv}
	ctx, stop := signalContext()
	defer stop()
	os.Exit(run(ctx, e, os.Args[1:]))
}

// signalContext is cancelled by the first SIGINT/SIGTERM (graceful stop); a
// second one exits at once.
func signalContext() (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ch
		cancel()
		<-ch
		fmt.Fprintln(os.Stderr, "tenure: second signal, exiting now")
		os.Exit(130)
	}()
	return ctx, func() { signal.Stop(ch); cancel() }
}

func run(ctx context.Context, e *env, args []string) int {
	sort.Slice(commands, func(i, j int) bool { return commands[i].name < commands[j].name })
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		printUsage(e.stderr)
		if len(args) == 0 {
			return 2
		}
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
				fmt.Fprintf(e.stderr, "tenure %s: %s\n", c.name, ue.msg)
				fmt.Fprintf(e.stderr, "run 'tenure %s --help' for usage\n", c.name)
				return 2
			default:
				fmt.Fprintf(e.stderr, "tenure %s: %s\n", c.name, sentence(err))
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
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
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
