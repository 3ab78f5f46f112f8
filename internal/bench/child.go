package bench

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

// ledgerColumns are the columns the programs write: the ledger's.
var ledgerColumns = []string{"topic", "partition", "job_offset", "job_key", "job_key_bytes", "incarnation", "epoch", "worker"}

// ChildConfig is one run of a program the bench compares tenure with.
type ChildConfig struct {
	// Kind is alo (at least once: COPY, then the Kafka offsets), naive
	// (one INSERT per job) or copy (COPY alone, no Kafka).
	Kind string
	// Pool is the database; Schema holds the ledger table (and Table, for
	// copy).
	Pool          *pgxpool.Pool
	Schema, Table string
	// Brokers, Group, Topic and KafkaOpts (TLS and SASL) are where alo and
	// naive consume.
	Brokers      []string
	Group, Topic string
	KafkaOpts    []kgo.Opt
	// Jobs: copy writes this many rows; naive stops after this many (0:
	// when ctx ends). Partitions: copy's parallel writers. BatchMax: alo's
	// rows per COPY, at most (0: each partition's part of a poll in one).
	Jobs, Partitions, BatchMax int
	// PerPoll: alo writes all of a poll, across its partitions, in one
	// COPY (BatchMax must be 0).
	PerPoll bool
}

// Child runs one of the programs `tenure bench` compares tenure with: what
// a user would write instead, each run as a process of its own (`tenure
// bench-child KIND`) so that its CPU time and peak memory are measured.
func Child(ctx context.Context, cfg ChildConfig) error {
	switch cfg.Kind {
	case "alo", "naive":
		if cfg.PerPoll && (cfg.Kind != "alo" || cfg.BatchMax > 0) {
			return errors.New("per-poll writes a whole poll in one COPY, for kind alo only: it takes no batch-max")
		}
		return benchConsume(ctx, cfg.Pool, cfg.Kind, cfg.Brokers, cfg.Group, cfg.Topic, cfg.Schema, cfg.Jobs, cfg.BatchMax, cfg.PerPoll, cfg.KafkaOpts)
	case "copy":
		return benchCopy(ctx, cfg.Pool, cfg.Schema, cfg.Table, cfg.Jobs, cfg.Partitions)
	}
	return fmt.Errorf("unknown kind %q: alo, naive or copy", cfg.Kind)
}

// benchConsume is the at-least-once program (alo: every polled batch of a
// partition written by COPY, in batches of at most batchMax rows (0: all of
// it at once), in parallel across partitions, then the Kafka offsets
// committed: no fencing, a crash between the two repeats the batch; with
// perPoll, all of a poll across its partitions in one COPY, what a user
// with many partitions would write) or the naive one (one autocommitted INSERT per job, in the order polled, then the
// offsets).
// It stops after jobs jobs (0: when ctx ends).
func benchConsume(ctx context.Context, pool *pgxpool.Pool, kind string, brokers []string, group, topic, schema string, jobs, batchMax int, perPoll bool, sec []kgo.Opt) error {
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
	// copyRecs writes recs as ledger rows in one COPY.
	copyRecs := func(recs []*kgo.Record) error {
		rows := make([][]any, len(recs))
		for i, r := range recs {
			rows[i] = []any{r.Topic, r.Partition, r.Offset, string(r.Key), r.Key, int64(0), int32(0), "bench"}
		}
		start := time.Now()
		if _, err := pool.CopyFrom(ctx, tbl, ledgerColumns, pgx.CopyFromRows(rows)); err != nil {
			// Say which step and how far: a bare driver error ("unexpected
			// EOF") reaches the bench's report as the process's last line.
			return fmt.Errorf("COPY of %d rows, after %s and %d rows written before it: %w", len(recs), time.Since(start).Round(time.Millisecond), done.Load(), err)
		}
		done.Add(int64(len(recs)))
		return nil
	}
	for jobs == 0 || done.Load() < int64(jobs) {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil || fetches.IsClientClosed() {
			return nil
		}
		var g errgroup.Group
		switch {
		case perPoll:
			// One COPY for the poll, whatever partitions it spans: one
			// transaction per poll, not one per partition.
			recs := fetches.Records()
			if len(recs) == 0 {
				break
			}
			g.Go(func() error { return copyRecs(recs) })
		case kind == "naive":
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
		default:
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
						if err := copyRecs(recs); err != nil {
							return err
						}
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
			return fmt.Errorf("committing the Kafka offsets after %d rows written: %w", done.Load(), err)
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
