package sink_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenure-dev/tenure/internal/fence"
	"github.com/tenure-dev/tenure/internal/testinfra/testdb"
	"github.com/tenure-dev/tenure/sink"
)

// env is what most tests need: a fresh migrated schema of their own, a store
// on it, and an effects table standing in for a handler's output.
type env struct {
	ctx    context.Context
	pool   *pgxpool.Pool
	schema string
	store  *fence.Store
}

// setup gives the test a schema of its own, so tests run with t.Parallel.
// The schema also holds an effects table: one row per processed offset,
// deliberately without a unique constraint so that a duplicate shows.
func setup(t testing.TB) *env {
	t.Helper()
	return setupPool(t, testdb.Pool(t))
}

// setupPool is setup on a pool of the test's choosing.
func setupPool(t testing.TB, pool *pgxpool.Pool) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	schema := testdb.Schema(t, pool)
	ss, err := sink.NewStore(pool, schema)
	if err != nil {
		t.Fatalf("NewStore: %v", err)
	}
	store := fence.Of(ss) // the protocol behind it, as package consumer reaches it
	if store.Schema() != schema {
		t.Fatalf("store.Schema() = %q, want %q", store.Schema(), schema)
	}
	e := &env{ctx: ctx, pool: pool, schema: schema, store: store}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+e.q()+`.effects (
		id          bigint  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		grp         text    NOT NULL,
		topic       text    NOT NULL,
		partition   integer NOT NULL,
		job_offset  bigint  NOT NULL,
		incarnation bigint  NOT NULL,
		epoch       integer NOT NULL,
		owner       text    NOT NULL)`); err != nil {
		t.Fatalf("creating effects table: %v", err)
	}
	return e
}

// sizedPool is testdb.Pool with maxConns connections at most.
func sizedPool(t testing.TB, maxConns int32) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return testdb.PoolOn(t, ctx, testdb.URL(), func(cfg *pgxpool.Config) { cfg.MaxConns = maxConns })
}

// q is the quoted schema.
func (e *env) q() string { return pgx.Identifier{e.schema}.Sanitize() }

var part = sink.Partition{Group: "g", Topic: "t", Partition: 0}

func tok(inc int64, epoch int32) sink.Token { return sink.Token{Incarnation: inc, Epoch: epoch} }

// claim presents a claim with partition count 12, after moving the group's
// incarnation up to the token's (as a worker's bump would have): claims are
// accepted only at the group's current incarnation.
func (e *env) claim(p sink.Partition, t sink.Token, owner string, start int64) (sink.Claimed, error) {
	e.raiseIncarnation(p.Group, t.Incarnation)
	return e.store.Claim(e.ctx, sink.ClaimRequest{Partition: p, Token: t, Owner: owner, StartOffset: start, PartitionCount: 12})
}

// raiseIncarnation moves group's incarnation up to inc if it is below (it
// never lowers it).
func (e *env) raiseIncarnation(group string, inc int64) {
	if inc == 0 {
		return
	}
	if _, err := e.pool.Exec(e.ctx, `INSERT INTO `+e.q()+`.group_incarnations AS g (consumer_group, incarnation, bumped_by, reason)
		VALUES ($1, $2, 'test', 'test') ON CONFLICT (consumer_group) DO UPDATE SET incarnation = excluded.incarnation, high_epoch = 0
		WHERE g.incarnation < excluded.incarnation`, group, inc); err != nil {
		panic(fmt.Sprintf("raising the incarnation of %s to %d: %v", group, inc, err))
	}
}

// mustClaim claims and fails the test unless the claim is accepted.
func (e *env) mustClaim(t testing.TB, p sink.Partition, tk sink.Token, owner string, start int64) int64 {
	t.Helper()
	c, err := e.claim(p, tk, owner, start)
	if err != nil {
		t.Fatalf("claim of %s at %s by %q: %v", p, tk, owner, err)
	}
	return c.NextOffset
}

// handle is a handler's work for a batch: one effects row per offset in
// [req.From, req.To), written inside tx.
func (e *env) handle(tx pgx.Tx, req sink.CommitRequest) error {
	return e.handleCtx(e.ctx, tx, req)
}

func (e *env) handleCtx(ctx context.Context, tx pgx.Tx, req sink.CommitRequest) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+e.q()+`.effects (grp, topic, partition, job_offset, incarnation, epoch, owner)
		SELECT $1, $2, $3, o, $4, $5, $6 FROM pg_catalog.generate_series($7::bigint, $8::bigint - 1) AS o`,
		req.Partition.Group, req.Partition.Topic, req.Partition.Partition,
		req.Token.Incarnation, req.Token.Epoch, req.Owner, req.From, req.To)
	return err
}

// commit processes a batch the way a caller does: begin, handler writes,
// Commit last, then tx.Commit, or tx.Rollback when Commit fails.
func (e *env) commit(t testing.TB, req sink.CommitRequest) error {
	t.Helper()
	tx, err := e.pool.Begin(e.ctx)
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	defer func() { _ = tx.Rollback(e.ctx) }() // no-op after Commit or Rollback
	if req.To > req.From {
		if err := e.handle(tx, req); err != nil {
			t.Fatalf("handler write: %v", err)
		}
	}
	if err := e.store.Commit(e.ctx, tx, req); err != nil {
		if rbErr := tx.Rollback(e.ctx); rbErr != nil {
			t.Fatalf("rollback after %v: %v", err, rbErr)
		}
		return err
	}
	if err := tx.Commit(e.ctx); err != nil {
		t.Fatalf("tx.Commit after an accepted Commit: %v", err)
	}
	return nil
}

func (e *env) mustCommit(t testing.TB, req sink.CommitRequest) {
	t.Helper()
	if err := e.commit(t, req); err != nil {
		t.Fatalf("commit %+v: %v", req, err)
	}
}

// claimAndCommit claims p for owner "a" with tk (from 0 on a new row) and commits
// up to next: the row a worker leaves with every job below next done.
func (e *env) claimAndCommit(t testing.TB, p sink.Partition, tk sink.Token, next int64) {
	t.Helper()
	from := e.mustClaim(t, p, tk, "a", 0)
	e.mustCommit(t, sink.CommitRequest{Partition: p, Token: tk, Owner: "a", From: from, To: next})
}

// setupCommitted is setup with part claimed by owner "a" with token tk
// (epoch 1) and committed up to next (claimAndCommit).
func setupCommitted(t testing.TB, next int64) (e *env, p sink.Partition, tk sink.Token) {
	t.Helper()
	e, p, tk = setup(t), part, sink.Token{Epoch: 1}
	e.claimAndCommit(t, p, tk, next)
	return e, p, tk
}

func (e *env) mustGet(t testing.TB, p sink.Partition) sink.Fence {
	t.Helper()
	f, err := e.store.Get(e.ctx, p)
	if err != nil {
		t.Fatalf("Get(%s): %v", p, err)
	}
	return f
}

// effects returns the offsets with committed handler effects for p, sorted,
// duplicates kept.
func (e *env) effects(t testing.TB, p sink.Partition) []int64 {
	t.Helper()
	rows, err := e.pool.Query(e.ctx, `SELECT job_offset FROM `+e.q()+`.effects
		WHERE grp = $1 AND topic = $2 AND partition = $3 ORDER BY job_offset, id`, p.Group, p.Topic, p.Partition)
	if err != nil {
		t.Fatalf("reading effects: %v", err)
	}
	offs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatalf("reading effects: %v", err)
	}
	return offs
}

// checkEffectsExactlyOnce checks G1 on the handler's output: every offset in
// [from, to) has exactly one effects row, and no other offset has any.
func (e *env) checkEffectsExactlyOnce(t testing.TB, p sink.Partition, from, to int64) {
	t.Helper()
	got := e.effects(t, p)
	var want []int64
	for o := from; o < to; o++ {
		want = append(want, o)
	}
	if !slices.Equal(got, want) {
		t.Errorf("effects of %s = %v, want each offset of [%d, %d) exactly once", p, got, from, to)
	}
}

// logEntry is one row of fence_log.
type logEntry struct {
	ID       int64
	Kind     string
	Token    sink.Token
	Owner    string
	From, To int64
}

// entry is a logEntry without its id, for comparing with expectations.
type entry struct {
	Kind     string
	Token    sink.Token
	Owner    string
	From, To int64
}

func (l logEntry) entry() entry {
	return entry{Kind: l.Kind, Token: l.Token, Owner: l.Owner, From: l.From, To: l.To}
}

func (e *env) fenceLog(t testing.TB, p sink.Partition) []logEntry {
	t.Helper()
	rows, err := e.pool.Query(e.ctx, `SELECT id, kind, incarnation, epoch, owner, from_offset, to_offset
		FROM `+e.q()+`.fence_log WHERE consumer_group = $1 AND topic = $2 AND partition = $3 ORDER BY id`,
		p.Group, p.Topic, p.Partition)
	if err != nil {
		t.Fatalf("reading fence_log: %v", err)
	}
	var out []logEntry
	var l logEntry
	_, err = pgx.ForEachRow(rows, []any{&l.ID, &l.Kind, &l.Token.Incarnation, &l.Token.Epoch, &l.Owner, &l.From, &l.To},
		func() error { out = append(out, l); return nil })
	if err != nil {
		t.Fatalf("reading fence_log: %v", err)
	}
	return out
}

func entries(log []logEntry) []entry {
	out := make([]entry, len(log))
	for i, l := range log {
		out[i] = l.entry()
	}
	return out
}

// asFenced checks that err is a rejection and returns its detail.
func asFenced(t testing.TB, err error) *sink.FencedError {
	t.Helper()
	if err == nil {
		t.Fatal("accepted, want a rejection matching ErrFenced")
	}
	if !errors.Is(err, sink.ErrFenced) {
		t.Fatalf("error %v does not match ErrFenced", err)
	}
	var fe *sink.FencedError
	if !errors.As(err, &fe) {
		t.Fatalf("error %v (%T) is not a *FencedError", err, err)
	}
	return fe
}

// atOnce runs f(0) to f(n-1) on goroutines of their own, released together
// so that they race, and returns when all have returned.
func atOnce(n int, f func(i int)) {
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			f(i)
		}()
	}
	close(start)
	wg.Wait()
}
