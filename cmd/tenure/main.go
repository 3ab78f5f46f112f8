// Command tenure runs fenced Kafka partition workers and the operator's
// commands around them. `tenure --help` (or `tenure help`) lists the
// commands and `tenure <command> --help` a command's flags; they are:
//
//	tenure worker      run one worker replica
//	tenure produce     produce jobs to a topic, keyed like the Java client (murmur2)
//	tenure migrate     apply (up), revert one (down) or list (status) schema migrations
//	tenure broker      run a local development broker (kfake; not for production)
//	tenure probe       GET a worker's /healthz, /readyz or /metrics (container health checks)
//	tenure demo        replay the paused-worker story on a local broker and Postgres
//	tenure bench       throughput of tenure beside the programs it replaces
//	tenure version     the version, also `tenure --version`
//	tenure completion  a shell's completion script (bash, zsh, fish)
//	tenure help        a command's help
//	tenure admin       inspect and operate, one subcommand each:
//	    topic create, topic describe, topic add-partitions, topic acknowledge-partitions,
//	    topic list, group delete, groups, assignments, fences, fences prune, holds,
//	    holds acknowledge, offsets reset, job, jobs peek, jobs tail,
//	    dlq list, dlq show, dlq replay, dlq discard, exports get, exports list, exports gc,
//	    serve (a live ownership page)
//
// The commands live in internal/cli, which says the rules they share:
// TENURE_* variables, exit statuses, where output goes.
package main

import (
	"os"

	"github.com/tenure-dev/tenure/internal/cli"
)

func main() { os.Exit(cli.Main(os.Args[1:])) }
