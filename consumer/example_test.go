package consumer_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/oauth"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/sink"
)

// A worker whose handler writes its own rows through the fenced
// transaction: each order's row commits together with the partition's
// offset, conditioned on the worker's token, or not at all. Cancelling the
// context stops it gracefully. The broker is kfake, in-process; the
// database is the tests' (TENURE_TEST_DATABASE_URL, else the local
// server).
func Example() {
	ctx := context.Background()
	broker, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "orders"))
	if err != nil {
		panic(err)
	}
	defer broker.Close()
	url := os.Getenv("TENURE_TEST_DATABASE_URL")
	if url == "" {
		url = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	schema := fmt.Sprintf("tenure_example_%d", os.Getpid())
	defer func() { _, _ = pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+schema+` CASCADE`) }()

	// tenure's tables, then the application's own.
	if _, err := sink.Migrate(ctx, pool, schema); err != nil {
		panic(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+schema+`.orders (job text PRIMARY KEY, body jsonb NOT NULL)`); err != nil {
		panic(err)
	}
	store, err := sink.NewStore(pool, schema)
	if err != nil {
		panic(err)
	}

	// Jobs keyed by customer: one customer's orders, one owner at a time.
	producer, err := kgo.NewClient(kgo.SeedBrokers(broker.ListenAddrs()...))
	if err != nil {
		panic(err)
	}
	defer producer.Close()
	for i := range 10 {
		r := &kgo.Record{Topic: "orders", Key: fmt.Appendf(nil, "customer-%d", i%3), Value: fmt.Appendf(nil, `{"order":%d}`, i)}
		if err := producer.ProduceSync(ctx, r).FirstErr(); err != nil {
			panic(err)
		}
	}

	c, err := consumer.New(consumer.Config{
		Brokers: broker.ListenAddrs(),
		Group:   "order-writers",
		Topics:  []string{"orders"},
		Store:   store,
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx consumer.Tx, b *consumer.Batch) error {
			for _, r := range b.Records {
				// Through tx only. JobID is stable across attempts and workers.
				if _, err := tx.Exec(ctx, `INSERT INTO `+schema+`.orders (job, body) VALUES ($1, $2)`,
					consumer.JobID(r), r.Value); err != nil {
					return err
				}
			}
			return nil
		}),
	})
	if err != nil {
		panic(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()

	var n int
	for deadline := time.Now().Add(30 * time.Second); n < 10 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.orders`).Scan(&n)
	}
	stop() // graceful: in-flight batches finish, then the member leaves the group
	fmt.Println("orders stored:", n, "stopped:", <-done)

	var next int64
	_ = pool.QueryRow(ctx, `SELECT sum(next_offset) FROM `+schema+`.fences WHERE consumer_group = 'order-writers'`).Scan(&next)
	fmt.Println("offsets stored beside them:", next)
	// Output:
	// orders stored: 10 stopped: <nil>
	// offsets stored beside them: 10
}

// TLS and SASL reach the worker's Kafka client through Config.KgoOpts (the
// `tenure` command's --tls-* and --sasl-* flags build the same options).
// franz-go also has OAUTHBEARER (pkg/sasl/oauth) and AWS MSK IAM
// (pkg/sasl/aws): pass kgo.SASL(oauth.Oauth(...)) or
// kgo.SASL(aws.ManagedStreamingIAM(...)) the same way.
func ExampleConfig_kgoOpts() {
	caPEM, err := os.ReadFile("/etc/tenure/kafka-ca.pem")
	if err != nil {
		panic(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	password, err := os.ReadFile("/etc/tenure/sasl-password")
	if err != nil {
		panic(err)
	}
	cfg := consumer.Config{
		Brokers: []string{"kafka-0.example:9093"},
		Group:   "exports",
		Topics:  []string{"export-jobs"},
		// Store, Handler: as in the package example.
		KgoOpts: []kgo.Opt{
			kgo.DialTLSConfig(&tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}),
			kgo.SASL(scram.Auth{User: "tenure-worker", Pass: string(password)}.AsSha512Mechanism()),
		},
	}
	// Or OAUTHBEARER, with a token your code fetches and refreshes:
	_ = kgo.SASL(oauth.Oauth(func(ctx context.Context) (oauth.Auth, error) {
		return oauth.Auth{Token: "a token from your identity provider"}, nil
	}))
	_ = cfg
}
