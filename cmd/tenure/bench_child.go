package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"

	"github.com/tenure-dev/tenure/sink"
)

// The programs `tenure bench` compares tenure with, each run as a process of
// its own (its CPU time and peak memory are measured): what a user would
// write instead. They are internal: `tenure bench-child KIND`.
func init() {
	register(command{name: "bench-child", hidden: true,
		summary: "internal: a program tenure bench measures (alo, naive, copy)", run: runBenchChild})
}

// ledgerColumns are the columns the programs write: the ledger's.
var ledgerColumns = []string{"topic", "partition", "job_offset", "job_key", "job_key_bytes", "incarnation", "epoch", "worker"}

func runBenchChild(ctx context.Context, e *env, args []string) error {
	f := newFlagSet(e, "bench-child", "alo|naive|copy --brokers B --group G --topic T --database-url URL --schema S [--table T] [--jobs N] [--partitions P] [--batch-max N]")
	kf := addKafkaFlags(f, "Kafka seed brokers")
	group := f.String("group", "", "consumer group")
	topic := f.String("topic", "", "topic")
	dbURL := f.String("database-url", "", "PostgreSQL URL")
	schema := f.String("schema", "", "schema of the ledger table")
	table := f.String("table", "ledger", "copy: the table to copy into")
	jobs := f.Int("jobs", 0, "copy: rows to write; naive: stop after this many")
	partitions := f.Int("partitions", 12, "copy: parallel writers (one per partition)")
	batchMax := f.Int("batch-max", 0, "alo: rows per COPY, at most (0: each partition's part of a poll in one COPY)")
	if err := f.parse(args, 1); err != nil {
		return err
	}
	if len(f.positional) != 1 {
		return usagef("a kind is required: alo, naive or copy")
	}
	kind := f.positional[0]
	pool, err := openDB(ctx, *dbURL, poolSize{max: 32, min: 4})
	if err != nil {
		return err
	}
	defer pool.Close()
	switch kind {
	case "alo", "naive":
		sec, err := kf.kgoOpts(nil)
		if err != nil {
			return err
		}
		return benchConsume(ctx, pool, kind, splitList(*kf.brokers), *group, *topic, *schema, *jobs, *batchMax, sec)
	case "copy":
		return benchCopy(ctx, pool, *schema, *table, *jobs, *partitions)
	}
	return usagef("unknown kind %q: alo, naive or copy", kind)
}

// benchConsume is the at-least-once program (alo: every polled batch of a
// partition written by COPY, in batches of at most batchMax rows (0: all of
// it at once), in parallel across partitions, then the Kafka offsets
// committed: no fencing, a crash between the two repeats the batch) or the
// naive one (one autocommitted INSERT per job, in the order polled, then the
// offsets).
// It stops after jobs jobs (0: when ctx ends).
func benchConsume(ctx context.Context, pool *pgxpool.Pool, kind string, brokers []string, group, topic, schema string, jobs, batchMax int, sec []kgo.Opt) error {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
		kgo.DisableAutoCommit(), kgo.BlockRebalanceOnPoll(), kgo.FetchMaxWait(100 * time.Millisecond),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}, sec...)...)
	if err != nil {
		return err
	}
	defer cl.Close()
	tbl := pgx.Identifier{schema, "ledger"}
	insert := `INSERT INTO ` + tbl.Sanitize() + ` (` + strings.Join(ledgerColumns, ", ") + `) VALUES ($1, $2, $3, $4, $5, 0, 0, 'bench')`
	var done atomic.Int64 // rows written, by all partitions' goroutines
	for jobs == 0 || done.Load() < int64(jobs) {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil || fetches.IsClientClosed() {
			return nil
		}
		var g errgroup.Group
		if kind == "naive" {
			// In order, one statement (one transaction) per job.
			g.Go(func() error {
				for _, r := range fetches.Records() {
					if _, err := pool.Exec(ctx, insert, r.Topic, r.Partition, r.Offset, string(r.Key), r.Key); err != nil {
						return err
					}
					if done.Add(1) >= int64(jobs) && jobs > 0 {
						return nil
					}
				}
				return nil
			})
		} else {
			fetches.EachPartition(func(p kgo.FetchTopicPartition) {
				if len(p.Records) == 0 {
					return
				}
				all := p.Records
				g.Go(func() error {
					for len(all) > 0 {
						recs := all
						if batchMax > 0 && len(recs) > batchMax {
							recs = recs[:batchMax]
						}
						all = all[len(recs):]
						rows := make([][]any, len(recs))
						for i, r := range recs {
							rows[i] = []any{r.Topic, r.Partition, r.Offset, string(r.Key), r.Key, int64(0), int32(0), "bench"}
						}
						if _, err := pool.CopyFrom(ctx, tbl, ledgerColumns, pgx.CopyFromRows(rows)); err != nil {
							return err
						}
						done.Add(int64(len(recs)))
					}
					return nil
				})
			})
		}
		if err := g.Wait(); err != nil {
			cl.AllowRebalance()
			if errors.Is(err, context.Canceled) {
				return nil
			}
			return err
		}
		// After the rows: a crash before this line repeats the batch.
		if err := cl.CommitUncommittedOffsets(ctx); err != nil && ctx.Err() == nil {
			cl.AllowRebalance()
			return err
		}
		cl.AllowRebalance()
	}
	return nil
}

// benchCopy writes jobs rows, the same the ledger gets, by parallel COPY
// (partitions writers), with no Kafka: the ceiling of what Postgres ingests
// into the table.
func benchCopy(ctx context.Context, pool *pgxpool.Pool, schema, table string, jobs, partitions int) error {
	if err := sink.ValidateSchema(table); err != nil {
		return fmt.Errorf("table name: %w", err)
	}
	tbl := pgx.Identifier{schema, table}
	per := (jobs + partitions - 1) / partitions
	const chunk = 10_000
	var g errgroup.Group
	for p := range partitions {
		g.Go(func() error {
			for off := 0; off < per && p*per+off < jobs; off += chunk {
				n := min(chunk, per-off, jobs-p*per-off)
				rows := make([][]any, n)
				for i := range rows {
					key := fmt.Sprintf("key-%d", (p*per+off+i)%10_000)
					rows[i] = []any{"bench", int32(p), int64(off + i), key, []byte(key), int64(0), int32(0), "bench"}
				}
				if _, err := pool.CopyFrom(ctx, tbl, ledgerColumns, pgx.CopyFromRows(rows)); err != nil {
					return err
				}
			}
			return nil
		})
	}
	return g.Wait()
}
