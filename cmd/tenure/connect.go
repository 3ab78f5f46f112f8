package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// openDB opens a pool and proves the database answers, turning the usual
// failures into one sentence.
// poolSize sizes a pool: the most connections and those opened up front
// (zero values: pgxpool's defaults).
type poolSize struct{ max, min int32 }

func openDB(ctx context.Context, url string, size ...poolSize) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("the database URL is not valid: %s", pgxCause(err))
	}
	for _, s := range size {
		if s.max > 0 {
			cfg.MaxConns = s.max
		}
		if s.min > 0 {
			cfg.MinConns = min(s.min, cfg.MaxConns)
		}
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("the database URL is not valid: %s", pgxCause(err))
	}
	pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, connectError(cfg.ConnConfig.Config, err)
	}
	return pool, nil
}

// dbRefusedError is a database server that answered and refused the
// connection (authentication, an unknown role or database, too many
// connections): reachable, unlike a network failure.
type dbRefusedError struct{ msg string }

func (e *dbRefusedError) Error() string { return e.msg }

// connectError words a failed connection by what the server said, if it
// said anything: a refusal is not a reachability problem.
func connectError(cfg pgconn.Config, err error) error {
	where := fmt.Sprintf("%s:%d", cfg.Host, cfg.Port)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		var msg string
		switch pgErr.Code {
		case "28P01", "28000": // invalid_password; invalid_authorization_specification (unknown role, pg_hba.conf)
			msg = fmt.Sprintf("the database server at %s refused user %q: %s (check the user and password of the database URL)", where, cfg.User, pgErr.Message)
		case "3D000": // invalid_catalog_name
			msg = fmt.Sprintf("the database server at %s has no database %q: %s (check the database name of the URL)", where, cfg.Database, pgErr.Message)
		case "53300", "57P03": // too_many_connections; cannot_connect_now (starting up, shutting down)
			msg = fmt.Sprintf("the database server at %s is not accepting connections now: %s", where, pgErr.Message)
		default:
			msg = fmt.Sprintf("the database server at %s refused the connection: %s (SQLSTATE %s)", where, pgErr.Message, pgErr.Code)
		}
		return &dbRefusedError{msg}
	}
	if pgconn.Timeout(err) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("cannot reach the database at %s: no answer within 15s", where)
	}
	return fmt.Errorf("cannot reach the database at %s: %s", where, pgxCause(err))
}

// pgxCause strips pgx's long connection preamble down to the reason.
func pgxCause(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Message
	}
	s := err.Error()
	if i := strings.LastIndex(s, ": "); i >= 0 && strings.HasPrefix(s, "failed to connect") {
		s = s[i+2:]
	}
	return s
}

// kafkaClient makes a plain client for admin calls.
func kafkaClient(brokers []string, opts ...kgo.Opt) (*kgo.Client, error) {
	for _, b := range brokers {
		if !strings.Contains(b, ":") {
			return nil, usagef("broker %q is not host:port", b)
		}
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.ClientID("tenure-cli")}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	return cl, nil
}

// kgoDefaultBatchMaxBytes is kgo's ProducerBatchMaxBytes default, kept below
// the brokers' default message.max.bytes.
const kgoDefaultBatchMaxBytes = 1000012

// producerClient makes the client jobs are produced with: idempotent with
// acks=all, and the murmur2 key partitioner of the Java client (what
// partition.For computes), so that a key lands where every tenure tool
// expects it. largest is the biggest record (key + value bytes) it will send.
func producerClient(brokers []string, largest int) (*kgo.Client, error) {
	return kafkaClient(brokers,
		kgo.RequiredAcks(kgo.AllISRAcks()), // idempotence (kgo's default) needs acks=all
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
		kgo.ProducerBatchMaxBytes(int32(max(kgoDefaultBatchMaxBytes, largest+1024))),
		kgo.RecordDeliveryTimeout(30*time.Second),
	)
}

// checkTopics returns the partition count of each topic, or one sentence:
// unreachable brokers, or a missing topic and the command that creates it.
func checkTopics(ctx context.Context, cl *kgo.Client, brokers, topics []string) (map[string]int32, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	td, err := kadm.NewClient(cl).ListTopics(ctx, topics...)
	if err != nil {
		return nil, fmt.Errorf("cannot reach the Kafka brokers %s: %v", strings.Join(brokers, ","), err)
	}
	out := map[string]int32{}
	for _, t := range topics {
		d, ok := td[t]
		if !ok || d.Err != nil {
			return nil, fmt.Errorf("topic %q does not exist: create it with `tenure admin topic create --brokers %s --topic %s --partitions N`",
				t, strings.Join(brokers, ","), t)
		}
		out[t] = int32(len(d.Partitions))
	}
	return out, nil
}
