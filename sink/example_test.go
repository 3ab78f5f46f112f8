package sink_test

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenure-dev/tenure/sink"
)

// exampleDB is the database the examples run against (the tests' default:
// the local server), and a schema of their own, dropped at the end.
func exampleDB(ctx context.Context) (*pgxpool.Pool, string, func()) {
	url := os.Getenv("TENURE_TEST_DATABASE_URL")
	if url == "" {
		url = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		panic(err)
	}
	schema := fmt.Sprintf("tenure_example_%d", os.Getpid())
	return pool, schema, func() {
		_, _ = pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
		pool.Close()
	}
}

// The fence in two statements. Worker A claims partition 0 with token 0.3
// and is paused before it commits; the group gives the partition to B, whose
// claim with token 0.4 fences A at once, before B writes anything. A's
// commit, arriving late with its own writes in the same transaction, is
// rejected and rolled back.
func ExampleStore_Claim() {
	ctx := context.Background()
	pool, schema, cleanup := exampleDB(ctx)
	defer cleanup()
	if _, err := sink.Migrate(ctx, pool, schema); err != nil {
		panic(err)
	}
	store, err := sink.NewStore(pool, schema)
	if err != nil {
		panic(err)
	}
	p := sink.Partition{Group: "exports", Topic: "export-jobs", Partition: 0}

	a := sink.ClaimRequest{Partition: p, Token: sink.Token{Epoch: 3}, Owner: "worker-a", ClaimID: 1, PartitionCount: 1}
	claimed, err := store.Claim(ctx, a)
	fmt.Println("A claims with token", a.Token, "at offset", claimed.NextOffset, "error:", err)

	b := sink.ClaimRequest{Partition: p, Token: sink.Token{Epoch: 4}, Owner: "worker-b", ClaimID: 2, PartitionCount: 1}
	claimed, err = store.Claim(ctx, b)
	fmt.Println("B claims with token", b.Token, "at offset", claimed.NextOffset, "error:", err)

	// A wakes up and commits jobs 0-9 with whatever it wrote.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// ... A's writes would be here, in tx ...
		return store.Commit(ctx, tx, sink.CommitRequest{Partition: p, Token: a.Token, Owner: a.Owner, ClaimID: a.ClaimID, From: 0, To: 10})
	})
	fmt.Println("A's commit fenced:", errors.Is(err, sink.ErrFenced))

	f, _ := store.Get(ctx, p)
	fmt.Println("the row:", f.Token, f.Owner, "next offset", f.NextOffset)
	// Output:
	// A claims with token 0.3 at offset 0 error: <nil>
	// B claims with token 0.4 at offset 0 error: <nil>
	// A's commit fenced: true
	// the row: 0.4 worker-b next offset 0
}

// Migrations are embedded; Migrate applies the pending ones under an
// advisory lock (replicas may all call it at start), CheckSchema says
// whether a schema is current without changing anything (what a worker
// with a least-privilege role relies on).
func ExampleMigrate() {
	ctx := context.Background()
	pool, schema, cleanup := exampleDB(ctx)
	defer cleanup()
	fmt.Println("before:", sink.CheckSchema(ctx, pool, schema) != nil)
	applied, err := sink.Migrate(ctx, pool, schema)
	if err != nil {
		panic(err)
	}
	fmt.Println("applied every migration:", len(applied) == len(sink.Migrations()))
	again, _ := sink.Migrate(ctx, pool, schema)
	fmt.Println("then nothing:", len(again), "current:", sink.CheckSchema(ctx, pool, schema) == nil)
	// Output:
	// before: true
	// applied every migration: true
	// then nothing: 0 current: true
}
