// Command orders is a tenure worker to copy and start from: jobs are orders
// keyed by customer on a Kafka topic; the handler writes a row per order
// into the application's own table, through the fenced transaction, so
// that each order's row and the partition's offset commit together,
// conditioned on this worker's token, or not at all. It migrates tenure's
// schema and its own table at start, and stops gracefully on SIGTERM or
// SIGINT.
//
// Configuration comes from the environment:
//
//	ORDERS_BROKERS       Kafka seed brokers, comma separated (default 127.0.0.1:9092)
//	ORDERS_TOPIC         the topic of orders (default orders)
//	ORDERS_GROUP         the consumer group the replicas share (default order-writers)
//	ORDERS_DATABASE_URL  PostgreSQL URL (default the local server)
//	ORDERS_SCHEMA        the schema of tenure's tables and the orders table (default orders)
//
// A job's value is JSON: {"amount": 12.5}. A value that is not is the
// job's fault: consumer.Permanent sends it to the dead-letter table
// (`tenure admin dlq list --schema orders`) at once, in the transaction
// that moves the partition past it.
package main

import (
	"context"
	"embed"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/sink"
)

//go:embed migrations/*.sql
var migrations embed.FS

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "orders:", err)
		os.Exit(1)
	}
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func run() error {
	brokers := strings.Split(env("ORDERS_BROKERS", "127.0.0.1:9092"), ",")
	topic := env("ORDERS_TOPIC", "orders")
	group := env("ORDERS_GROUP", "order-writers")
	dbURL := env("ORDERS_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable")
	schema := env("ORDERS_SCHEMA", "orders")

	// The first SIGTERM/SIGINT cancels ctx: Run then stops gracefully
	// (in-flight batches finish, the member leaves the group).
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	log, err := zap.NewProduction()
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()

	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	// tenure's tables first (under an advisory lock: every replica may do
	// this at start), then the application's.
	if _, err := sink.Migrate(ctx, pool, schema); err != nil {
		return fmt.Errorf("migrating tenure's tables: %w", err)
	}
	if err := migrate(ctx, pool, schema); err != nil {
		return fmt.Errorf("migrating the orders table: %w", err)
	}
	store, err := sink.NewStore(pool, schema)
	if err != nil {
		return err
	}

	c, err := consumer.New(consumer.Config{
		Brokers: brokers,
		Group:   group,
		Topics:  []string{topic},
		Store:   store,
		Handler: &handler{table: pgx.Identifier{schema, "orders"}.Sanitize()},
		Logger:  log,
		// Everything else has defaults that suit most workers: 500 jobs
		// per transaction, 5 attempts before a job is dead-lettered, 60s
		// per Handle call, 30s for in-flight batches at a graceful stop.
	})
	if err != nil {
		return err
	}
	log.Info("orders worker starting", zap.Strings("brokers", brokers), zap.String("topic", topic), zap.String("group", group))
	err = c.Run(ctx) // nil after a graceful stop
	log.Info("orders worker stopped", zap.Error(err))
	return err
}

// handler writes one row per order.
type handler struct{ table string }

// order is a job's value.
type order struct {
	Amount *json.Number `json:"amount"`
}

func (h *handler) Handle(ctx context.Context, tx consumer.Tx, b *consumer.Batch) error {
	// One round trip for the whole batch.
	batch := &pgx.Batch{}
	for _, r := range b.Records {
		var o order
		if err := json.Unmarshal(r.Value, &o); err != nil || o.Amount == nil {
			// Retrying cannot fix the job: dead-letter it at once.
			return consumer.Permanent(fmt.Errorf("order %s is not {\"amount\": N}: %q", consumer.JobID(r), r.Value))
		}
		batch.Queue(`INSERT INTO `+h.table+` (job, customer, amount, token) VALUES ($1, $2, $3, $4)`,
			consumer.JobID(r), string(r.Key), o.Amount.String(), b.Token.String())
	}
	// Written through tx only: it commits with the offset, after the fence.
	return tx.SendBatch(ctx, batch).Close()
}

// migrate applies the application's migrations (migrations/NNN_*.sql, in
// name order) that its orders_migrations table does not list, with their
// rows, in one transaction under an advisory lock (replicas start
// together). Its own table keeps its versions apart from tenure's.
func migrate(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	files, err := migrations.ReadDir("migrations")
	if err != nil {
		return err
	}
	names := make([]string, 0, len(files))
	for _, f := range files {
		names = append(names, f.Name())
	}
	sort.Strings(names)
	q := pgx.Identifier{schema}.Sanitize()
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, "orders.migrate."+schema); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+q+`.orders_migrations (name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			return err
		}
		for _, name := range names {
			var done bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+q+`.orders_migrations WHERE name = $1)`, name).Scan(&done); err != nil {
				return err
			}
			if done {
				continue
			}
			body, err := migrations.ReadFile("migrations/" + name)
			if err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, strings.ReplaceAll(string(body), "{{schema}}", q)); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO `+q+`.orders_migrations (name) VALUES ($1)`, name); err != nil {
				return err
			}
		}
		return nil
	})
}
