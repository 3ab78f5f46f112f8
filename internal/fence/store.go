package fence

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Store reads and writes the fencing state of one schema.
type Store struct {
	pool   *pgxpool.Pool
	schema string

	claimSQL, commitSQL, pipelinedSQL, getSQL, listSQL string

	pooled bool // SetPooled
	roles  roleState
}

// SetPooled declares that the pool leads through a transaction pooler
// (PgBouncer's pool_mode=transaction, docs/pgbouncer.md): the process id a
// connection announced is then the pooler's, not the server backend's that
// runs its transactions, and a session setting would stay behind on a
// server connection other clients get next. The store then asks the server
// for its backend's pid inside each transaction (the lock watch ends
// server backends by it, and the unknown-commit path waits on it), and
// runs a claim in a transaction of its own with SET LOCAL lock_timeout.
// Call it before the store is used.
func (s *Store) SetPooled(pooled bool) { s.pooled = pooled }

// Pooled reports SetPooled.
func (s *Store) Pooled() bool { return s.pooled }

// NewStore returns a Store for schema ("" means DefaultSchema). It does not
// touch the database; see sink.Migrate and sink.CheckSchema.
func NewStore(pool *pgxpool.Pool, schema string) (*Store, error) {
	if pool == nil {
		return nil, errors.New("sink: a pgx pool is required")
	}
	if schema == "" {
		schema = DefaultSchema
	}
	if err := ValidateSchema(schema); err != nil {
		return nil, err
	}
	q := quote(schema)
	return &Store{
		pool:   pool,
		schema: schema,
		// The ON CONFLICT ... WHERE is the whole check: a claim takes the row
		// only from a strictly lower token, or re-takes it at the same token
		// by the same claimant (a retried claim); and only while its
		// incarnation is the group's current one (cur): once a reset has been
		// detected, no claim of an older lifetime lands anywhere in the
		// group. FOR SHARE orders the claim against a concurrent bump.
		// partition_count is kept as it was first recorded, so that a change
		// can be detected by comparing.
		//
		// A claim is also refused, whatever its token, while a newer lane of
		// the same member holds the row (same owner, higher claim id: claim
		// ids grow with every lane a process starts). A member can be given
		// a partition again while its previous lane for it is still
		// stopping; the coordinator's answers vouch for the member, not for
		// the lane, so without this an older lane recovering at the
		// member's current epoch could tie with the newer lane's claim,
		// bump, and take the partition back after it (docs/fencing.md,
		// "Lanes recover by themselves").
		//
		// (xmax = 0) is true for a row this statement inserted: a claim
		// that creates the row tells the caller so (Claimed.Created).
		claimSQL: `WITH cur AS (
	SELECT coalesce((SELECT incarnation FROM ` + q + `.group_incarnations
		WHERE consumer_group = $1 FOR SHARE), 0) AS incarnation
), c AS (
	INSERT INTO ` + q + `.fences AS f
		(consumer_group, topic, partition, incarnation, epoch, owner, next_offset, partition_count, claim_id, topic_id)
	SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10 FROM cur WHERE cur.incarnation = $4
	ON CONFLICT (consumer_group, topic, partition) DO UPDATE
		SET incarnation = excluded.incarnation, epoch = excluded.epoch,
		    owner = excluded.owner, claim_id = excluded.claim_id, claimed_at = now(),
		    topic_id = coalesce(f.topic_id, excluded.topic_id)
		WHERE ((f.incarnation, f.epoch) < (excluded.incarnation, excluded.epoch)
		   OR ((f.incarnation, f.epoch) = (excluded.incarnation, excluded.epoch)
		       AND f.owner = excluded.owner AND f.claim_id = excluded.claim_id))
		  AND NOT (f.owner = excluded.owner AND f.claim_id > excluded.claim_id)
	RETURNING f.next_offset, f.partition_count, f.topic_id, f.log_epoch, (f.xmax = 0) AS created
), l AS (
	INSERT INTO ` + q + `.fence_log
		(kind, consumer_group, topic, partition, incarnation, epoch, owner, from_offset, to_offset, claim_id)
	SELECT 'claim', $1, $2, $3, $4, $5, $6, c.next_offset, c.next_offset, $9 FROM c
), s AS (
	-- A claim ends whatever stall was recorded for the partition.
	DELETE FROM ` + q + `.partition_holds
	WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND resolved_at IS NULL AND kind = 'stalled'
	  AND EXISTS (SELECT 1 FROM c)
)
SELECT next_offset, partition_count, topic_id, log_epoch, created FROM c`,
		// Token, owner, claimant, log epoch and the offset this owner last
		// saw must all still match: any other claim in between, a commit
		// this caller does not know about, or an operator's acknowledgement
		// that started a new log epoch, leaves zero rows and the caller
		// rolls back.
		commitSQL: commitFenceSQL(q, `$10`, ``) + `SELECT count(*), pg_current_xact_id()::text::bigint FROM u`,
		// The same fence for CommitBatch: it fails instead of updating
		// nothing (fence_check), and checks the batch's marker in the same
		// statement, so that it can travel with COMMIT.
		pipelinedSQL: commitFenceSQL(q, `$11`, "\n\t  AND coalesce(current_setting('tenure.tx', true), '') = $10") +
			`SELECT ` + q + `.fence_check(count(*), coalesce(current_setting('tenure.tx', true), '') = $10) FROM u`,
		getSQL: `SELECT consumer_group, topic, partition, incarnation, epoch, owner, next_offset,
	partition_count, created_at, claimed_at, committed_at, claim_id, log_epoch
FROM ` + q + `.fences WHERE consumer_group = $1 AND topic = $2 AND partition = $3`,
		listSQL: `SELECT consumer_group, topic, partition, incarnation, epoch, owner, next_offset,
	partition_count, created_at, claimed_at, committed_at, claim_id, log_epoch
FROM ` + q + `.fences WHERE ($1 = '' OR consumer_group = $1)
ORDER BY consumer_group, topic, partition`,
	}, nil
}

// commitFenceSQL is the part commitSQL and pipelinedSQL share, up to their
// closing SELECT over u: the fencing row moves from $7 to $8 only while
// token, owner, claimant and log epoch ($-parameter logEpoch) still match,
// and the conditions of more (each on a line of its own) hold; the fence
// log records the commit. One text, so that the two fences cannot drift.
func commitFenceSQL(q, logEpoch, more string) string {
	return `WITH u AS (
	UPDATE ` + q + `.fences
	SET next_offset = $8, committed_at = now()
	WHERE consumer_group = $1 AND topic = $2 AND partition = $3
	  AND incarnation = $4 AND epoch = $5 AND owner = $6 AND claim_id = $9 AND next_offset = $7
	  AND log_epoch = ` + logEpoch + more + `
	RETURNING 1
), l AS (
	INSERT INTO ` + q + `.fence_log
		(kind, consumer_group, topic, partition, incarnation, epoch, owner, from_offset, to_offset, claim_id)
	SELECT 'commit', $1, $2, $3, $4, $5, $6, $7, $8, $9 FROM u
)
`
}

// Schema is the schema the store works in.
func (s *Store) Schema() string { return s.schema }

// Pool is the pool the store was built with.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Fence is one row of fencing state.
type Fence struct {
	Partition
	Token          Token
	Owner          string
	NextOffset     int64
	PartitionCount int32
	CreatedAt      time.Time
	ClaimedAt      time.Time
	CommittedAt    *time.Time
	// ClaimID identifies the claimant (one lane: one assignment of the
	// partition to one member); 0 for claimants that did not set one.
	ClaimID int64
	// LogEpoch counts the operator's acknowledgements that declared the
	// partition's offsets to start over (migration 013): offsets compare
	// only within one log epoch.
	LogEpoch int64
}

// ClaimRequest asks for ownership of a partition.
type ClaimRequest struct {
	Partition Partition
	Token     Token
	Owner     string
	// ClaimID identifies the claimant: one value per lane (an assignment of
	// the partition to a member), kept by its retries. A claim at the token
	// already stored is accepted only from the same owner and claim id, and
	// commits must carry it too, so that two lanes never share a claim even
	// when they share a member id and an epoch. Claim ids must grow with
	// each lane a member starts: a claim by the owner stored in the row with
	// a lower claim id than the stored one is refused (a newer lane of the
	// member holds the partition; FencedError.Superseded).
	ClaimID int64
	// StartOffset is the next offset recorded when the partition has no
	// fencing row yet (the first claim ever). Later claims ignore it.
	StartOffset int64
	// PartitionCount is the topic's partition count as the claimant sees it;
	// it is recorded on the first claim and returned by every claim.
	PartitionCount int32
	// TopicID is the topic's id as the claimant sees it (zero: unknown). It
	// is recorded on the first claim that knows it, and returned by every
	// claim: another id means the stored offsets belong to another log.
	TopicID [16]byte
	// LockTimeout, if positive, bounds the claim statement's wait for the
	// fencing row's lock (lock_timeout): a strict lane's claim must not wait
	// for a prepared batch, which holds the lock until it is decided (the
	// claim resolves it and tries again). The error is then SQLSTATE 55P03.
	LockTimeout time.Duration
}

// Claimed is the result of an accepted claim.
type Claimed struct {
	NextOffset int64 // resume fetching here
	// PartitionCount is the count recorded on the first claim. A value other
	// than the request's means the topic's partitions changed since.
	PartitionCount int32
	// TopicID is the topic id the stored offsets belong to (zero: never
	// recorded). A value other than the request's means the topic was
	// deleted and re-created since.
	TopicID [16]byte
	// LogEpoch is the partition's log epoch (Fence.LogEpoch): commits must
	// carry it (CommitRequest.LogEpoch).
	LogEpoch int64
	// Created is true when this claim created the fencing row: the
	// database had no record of the partition.
	Created bool
	// StaleSessionsEnded counts the sessions of older claimants of the
	// partition the claim ended because they held its row (endOlderClaimants).
	StaleSessionsEnded int
}

// Claim takes ownership of a partition for req.Token and req.Owner and returns
// the offset to resume from. A claim with a token lower than the stored one,
// or equal to it but by another claimant, or with an incarnation that is not
// the group's current one, is rejected with an error matching ErrFenced. An
// accepted claim fences every earlier token at once, even before the new
// owner commits anything.
//
// The incarnation must come from Register, and the epoch must have been
// registered there before the group coordinator confirmed it: that order is
// what keeps tokens ordered across group lifetimes (docs/fencing.md).
func (s *Store) Claim(ctx context.Context, req ClaimRequest) (Claimed, error) {
	if req.Owner == "" {
		return Claimed{}, errors.New("sink: claim needs an owner")
	}
	if req.StartOffset < 0 {
		return Claimed{}, fmt.Errorf("sink: claim start offset %d is negative", req.StartOffset)
	}
	if req.PartitionCount <= 0 {
		return Claimed{}, fmt.Errorf("sink: claim partition count %d must be positive", req.PartitionCount)
	}
	p := req.Partition
	var c Claimed
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return Claimed{}, fmt.Errorf("claim of %s: %w", p, err)
	}
	defer conn.Release()
	// The fencing row is locked by a commit in progress: for a moment by a
	// live owner, for good by an owner whose session stopped between its
	// fence statement and its COMMIT (frozen, or cut off by a network that
	// drops its packets). The claim does not wait for the latter.
	pid := conn.Conn().PgConn().PID()
	var tx pgx.Tx
	if s.pooled {
		// Through a transaction pooler only a transaction keeps one server
		// connection: the setting, the backend's pid and the claim.
		if tx, err = conn.Begin(ctx); err != nil {
			return Claimed{}, fmt.Errorf("claim of %s: %w", p, err)
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // after Commit: nothing
		if req.LockTimeout > 0 {
			if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", max(req.LockTimeout.Milliseconds(), 1))); err != nil {
				return Claimed{}, fmt.Errorf("claim of %s: %w", p, err)
			}
		}
		if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			return Claimed{}, fmt.Errorf("claim of %s: %w", p, err)
		}
	} else if req.LockTimeout > 0 {
		if _, err := conn.Exec(ctx, fmt.Sprintf("SET lock_timeout = %d", max(req.LockTimeout.Milliseconds(), 1))); err != nil {
			return Claimed{}, fmt.Errorf("claim of %s: %w", p, err)
		}
		defer func() {
			if _, err := conn.Exec(context.WithoutCancel(ctx), "RESET lock_timeout"); err != nil {
				_ = conn.Conn().Close(context.Background()) // never pooled with the setting
			}
		}()
	}
	stop := s.watchClaim(req, pid)
	row := conn.QueryRow(ctx, s.claimSQL, p.Group, p.Topic, p.Partition,
		req.Token.Incarnation, req.Token.Epoch, req.Owner, req.StartOffset, req.PartitionCount, req.ClaimID, uuidOf(req.TopicID))
	var topicID pgtype.UUID
	err = row.Scan(&c.NextOffset, &c.PartitionCount, &topicID, &c.LogEpoch, &c.Created)
	if tx != nil {
		if err == nil {
			err = tx.Commit(ctx)
		} else {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}
	c.StaleSessionsEnded = stop()
	if topicID.Valid {
		c.TopicID = topicID.Bytes
	}
	if errors.Is(err, pgx.ErrNoRows) {
		ferr := s.fenced(ctx, "claim", p, req.Token, req.Owner, -1)
		var fe *FencedError
		if errors.As(ferr, &fe) {
			fe.ClaimID = req.ClaimID
			if inc, err := s.Incarnation(ctx, p.Group); err == nil && inc != req.Token.Incarnation {
				fe.StaleIncarnation, fe.GroupIncarnation = true, inc
			}
		}
		return Claimed{}, ferr
	}
	if err != nil {
		return Claimed{}, fmt.Errorf("claim of %s: %w", p, err)
	}
	return c, nil
}

// CommitRequest advances a partition's next offset.
type CommitRequest struct {
	Partition Partition
	Token     Token
	Owner     string
	ClaimID   int64 // the claimant's id, as claimed
	From      int64 // the next offset this owner last saw (its claim, or its last commit's To)
	To        int64 // the new next offset: the batch's last offset + 1
	LogEpoch  int64 // the log epoch of the claim (Claimed.LogEpoch)
}

// Commit advances the partition's next offset from req.From to req.To inside
// tx, only if req.Token and req.Owner still hold the partition and the stored
// next offset is req.From. Call it last in the handler's transaction, just
// before tx.Commit, so that the fencing row is locked for as short a time as
// possible. On rejection it returns an error matching ErrFenced and the caller
// must roll tx back; nothing of the batch may be committed.
func (s *Store) Commit(ctx context.Context, tx pgx.Tx, req CommitRequest) error {
	_, err := s.commitTracked(ctx, tx, req)
	return err
}

// commitTracked is Commit, and also returns the transaction's id (xid8), so
// that resolve can find out exactly what became of the transaction if the
// answer to its COMMIT is lost.
func (s *Store) commitTracked(ctx context.Context, tx pgx.Tx, req CommitRequest) (xid int64, err error) {
	if req.To <= req.From {
		return 0, fmt.Errorf("sink: commit of %s must advance: from %d to %d", req.Partition, req.From, req.To)
	}
	p := req.Partition
	var n int64
	if err := tx.QueryRow(ctx, s.commitSQL, p.Group, p.Topic, p.Partition,
		req.Token.Incarnation, req.Token.Epoch, req.Owner, req.From, req.To, req.ClaimID, req.LogEpoch).Scan(&n, &xid); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == CodeSerializationFailure {
			// Under REPEATABLE READ or SERIALIZABLE a claim that landed after
			// the transaction's snapshot shows up as a serialization failure.
			// If the row has moved to another token, say so.
			if ferr := withClaim(s.fenced(ctx, "commit", p, req.Token, req.Owner, req.From), req); isLost(ferr) {
				return 0, ferr
			}
		}
		return 0, fmt.Errorf("commit of %s: %w", p, err)
	}
	if n == 1 {
		return xid, nil
	}
	// Report what won, read inside tx: under READ COMMITTED (the default,
	// and what tenure's lanes use) the statement sees the winning row, and it
	// needs no second connection, which a pool full of transactions waiting
	// for the same answer could not give. Under a snapshot isolation level
	// the row may predate the winner, so read it outside.
	var iso string
	if err := tx.QueryRow(ctx, `SHOW transaction_isolation`).Scan(&iso); err == nil && iso == "read committed" {
		f, err := scanFence(tx.QueryRow(ctx, s.getSQL, p.Group, p.Topic, p.Partition))
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return 0, &FencedError{Op: "commit", Partition: p, Presented: req.Token, Owner: req.Owner, ClaimID: req.ClaimID, From: req.From}
		case err == nil:
			return 0, withClaim(fencedFrom("commit", p, req.Token, req.Owner, req.From, f), req)
		}
	}
	return 0, withClaim(s.fenced(ctx, "commit", p, req.Token, req.Owner, req.From), req)
}

// withClaim records the caller's claim id and log epoch on a FencedError,
// so that it can tell an offset mismatch or a new log epoch (our own
// claim) from a lost claim.
func withClaim(err error, req CommitRequest) error {
	var fe *FencedError
	if errors.As(err, &fe) {
		fe.ClaimID, fe.LogEpoch = req.ClaimID, req.LogEpoch
	}
	return err
}

// Outcome is what ResolveSession learned about a commit whose result was not seen.
type Outcome int

const (
	// Committed: the fencing row shows this owner's commit took effect.
	Committed Outcome = iota + 1
	// NotCommitted: the row still shows this owner at the batch's start;
	// the batch may be retried.
	NotCommitted
	// Fenced: another token or owner holds the row; ResolveSession's error says which.
	Fenced
)

func (o Outcome) String() string {
	switch o {
	case Committed:
		return "committed"
	case NotCommitted:
		return "not committed"
	case Fenced:
		return "fenced"
	}
	return "unknown"
}

// resolve finds out exactly whether a commit whose answer was lost (the
// connection broke during COMMIT, or the wait for it timed out) took effect.
//
// xid is the transaction's id from commitTracked (0: unknown). While that
// transaction is still in progress on the server (its COMMIT may yet land, or
// it never arrived and the session sits idle in the transaction), Resolve
// does not answer: an idle session is ended (pg_terminate_backend, allowed
// for the same role), a running COMMIT is waited for, until ctx ends. Only
// then does it answer, from the fence log: the commit is recorded there with
// this claimant's token, claim id and range exactly when it committed, even
// if a later claim has superseded it since. Otherwise the fencing row says
// whether the batch may be retried (NotCommitted: the row still shows this
// claimant at req.From) or the claimant is fenced.
func (s *Store) resolve(ctx context.Context, req CommitRequest, xid int64) (Outcome, error) {
	if xid > 0 {
		if err := s.awaitTransaction(ctx, xid); err != nil {
			return 0, err
		}
	}
	q := quote(s.schema)
	p := req.Partition
	var committed bool
	err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+q+`.fence_log
		WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND kind = 'commit'
		  AND incarnation = $4 AND epoch = $5 AND owner = $6 AND claim_id = $7 AND from_offset = $8 AND to_offset = $9)`,
		p.Group, p.Topic, p.Partition, req.Token.Incarnation, req.Token.Epoch, req.Owner, req.ClaimID, req.From, req.To).Scan(&committed)
	if err != nil {
		return 0, err
	}
	if committed {
		return Committed, nil
	}
	f, err := s.Get(ctx, p)
	if errors.Is(err, pgx.ErrNoRows) {
		return Fenced, &FencedError{Op: "commit", Partition: p, Presented: req.Token, Owner: req.Owner, ClaimID: req.ClaimID, From: req.From, LogEpoch: req.LogEpoch}
	}
	if err != nil {
		return 0, err
	}
	if f.Token == req.Token && f.Owner == req.Owner && f.ClaimID == req.ClaimID && f.NextOffset == req.From && f.LogEpoch == req.LogEpoch {
		return NotCommitted, nil
	}
	return Fenced, withClaim(fencedFrom("commit", p, req.Token, req.Owner, req.From, f), req)
}

// awaitTransaction returns once transaction xid is no longer in progress.
func (s *Store) awaitTransaction(ctx context.Context, xid int64) error {
	for wait := 20 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		var status *string
		err := s.pool.QueryRow(ctx, `SELECT pg_xact_status($1::text::xid8)`, strconv.FormatInt(xid, 10)).Scan(&status)
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &pgErr) && pgErr.Code == CodeInvalidParameterValue:
			// "transaction ID is in the future": this server never ran it
			// (another server took over): it is not in progress here.
			return nil
		case err != nil:
			return err
		case status == nil || *status != "in progress":
			return nil // committed, aborted, or too old to say: the fence log decides
		}
		// Still open. A session idle in the transaction never sent COMMIT
		// (or its client is gone): end it, which aborts the transaction. A
		// COMMIT being processed is waited for.
		_, _ = s.pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE backend_xid::text::bigint = $1 % 4294967296 AND state LIKE 'idle in transaction%'`, xid)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("transaction %d is still in progress: %w", xid, ctx.Err())
		case <-t.C:
		}
	}
}

// Get reads one fencing row; pgx.ErrNoRows if there is none.
func (s *Store) Get(ctx context.Context, p Partition) (Fence, error) {
	return scanFence(s.pool.QueryRow(ctx, s.getSQL, p.Group, p.Topic, p.Partition))
}

// List reads the fencing rows of group, or of every group when group is "".
func (s *Store) List(ctx context.Context, group string) ([]Fence, error) {
	rows, err := s.pool.Query(ctx, s.listSQL, group)
	return collect(rows, err, scanFence)
}

// FenceRows reads the fencing rows of parts (of one group), keyed by
// partition; a partition with no row is missing from the map. One
// statement whatever the number: a worker reads the rows of all its lanes
// with it, every few seconds.
//
// Worker protocol: package consumer calls it; not API (see the package doc).
func (s *Store) FenceRows(ctx context.Context, group string, parts []Partition) (map[Partition]Fence, error) {
	topics := make([]string, len(parts))
	nums := make([]int32, len(parts))
	for i, p := range parts {
		topics[i], nums[i] = p.Topic, p.Partition
	}
	rows, err := s.pool.Query(ctx, `SELECT consumer_group, topic, partition, incarnation, epoch, owner, next_offset,
	partition_count, created_at, claimed_at, committed_at, claim_id, log_epoch
FROM `+quote(s.schema)+`.fences f
WHERE f.consumer_group = $1 AND (f.topic, f.partition) IN (SELECT * FROM unnest($2::text[], $3::int[]))`, group, topics, nums)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make(map[Partition]Fence, len(parts))
	for rows.Next() {
		f, err := scanFence(rows)
		if err != nil {
			return nil, err
		}
		out[f.Partition] = f
	}
	return out, rows.Err()
}

// collect reads every row of a query (rows, err: what Query returned) with
// scan, a scanner that QueryRow's row can use too; nil when there are none.
func collect[T any](rows pgx.Rows, err error, scan func(pgx.Row) (T, error)) ([]T, error) {
	if err != nil {
		return nil, err
	}
	return pgx.AppendRows[T, []T](nil, rows, func(r pgx.CollectableRow) (T, error) { return scan(r) })
}

func scanFence(r pgx.Row) (Fence, error) {
	var f Fence
	err := r.Scan(&f.Group, &f.Topic, &f.Partition.Partition, &f.Token.Incarnation, &f.Token.Epoch,
		&f.Owner, &f.NextOffset, &f.PartitionCount, &f.CreatedAt, &f.ClaimedAt, &f.CommittedAt, &f.ClaimID, &f.LogEpoch)
	return f, err
}

func (s *Store) fenced(ctx context.Context, op string, p Partition, t Token, owner string, from int64) error {
	// Bounded: this read needs a second connection while the caller may hold
	// one in a transaction, and a starved pool must not turn a rejection
	// into a hang.
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	f, err := s.Get(rctx, p)
	if errors.Is(err, pgx.ErrNoRows) {
		return &FencedError{Op: op, Partition: p, Presented: t, Owner: owner, From: from}
	}
	if err != nil {
		// The rejection stands; only the detail is missing.
		return fmt.Errorf("%w (%s of %s with token %s by %q; reading the winner failed: %v)", ErrFenced, op, p, t, owner, err)
	}
	return fencedFrom(op, p, t, owner, from, f)
}

func fencedFrom(op string, p Partition, t Token, owner string, from int64, f Fence) *FencedError {
	return &FencedError{Op: op, Partition: p, Presented: t, Owner: owner, From: from,
		Found: true, Current: f.Token, CurrentOwner: f.Owner, CurrentClaim: f.ClaimID, NextOffset: f.NextOffset, CurrentLogEpoch: f.LogEpoch}
}

// isLost reports whether err is a FencedError that shows another token or
// owner holding the row (not merely an offset mismatch).
func isLost(err error) bool {
	var fe *FencedError
	return errors.As(err, &fe) && (!fe.Found || fe.Current != fe.Presented || fe.CurrentOwner != fe.Owner || fe.CurrentClaim != fe.ClaimID)
}

// Now is the database server's clock: the time the operator's views measure
// ages against (a hold's, a heartbeat's), so that they do not depend on the
// clock of the machine that reads them.
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	var now time.Time
	err := s.pool.QueryRow(ctx, `SELECT now()`).Scan(&now)
	return now, err
}

// TopicIDs returns the distinct topic ids that group's fencing rows of topic
// recorded (the ids their first claims saw; rows that never saw one are left
// out). More than one, or one that is not the topic's id in Kafka, means
// the stored offsets belong to a topic of that name that was deleted and
// re-created.
func (s *Store) TopicIDs(ctx context.Context, group, topic string) ([][16]byte, error) {
	rows, err := s.pool.Query(ctx, `SELECT DISTINCT topic_id FROM `+quote(s.schema)+`.fences
		WHERE consumer_group = $1 AND topic = $2 AND topic_id IS NOT NULL`, group, topic)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) ([16]byte, error) {
		var u pgtype.UUID
		err := r.Scan(&u)
		return u.Bytes, err
	})
}

// Querier is what a read through a handler's transaction needs: the
// QueryRow of consumer.Tx, pgx.Tx and pgxpool.Pool.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// PartitionLog is which log a partition's stored offsets belong to.
type PartitionLog struct {
	// TopicID is the topic id the partition's first claim saw (zero:
	// unknown). Another id means a topic of that name was deleted and
	// re-created.
	TopicID [16]byte
	// LogEpoch counts the operator's acknowledgements that started the
	// partition's offsets over (Fence.LogEpoch).
	LogEpoch int64
}

// ReadPartitionLog reads p's log identity from its fencing row in schema,
// through q. A handler passes its transaction: the batch's fence, which runs
// last in it, checks that the lane's log epoch is still the row's, so what
// the handler read is what its commit is conditioned on. A partition with
// no fencing row reads as the zero PartitionLog.
func ReadPartitionLog(ctx context.Context, q Querier, schema string, p Partition) (PartitionLog, error) {
	if err := ValidateSchema(schema); err != nil {
		return PartitionLog{}, err
	}
	var (
		id  pgtype.UUID
		out PartitionLog
	)
	err := q.QueryRow(ctx, `SELECT topic_id, log_epoch FROM `+quote(schema)+`.fences
		WHERE consumer_group = $1 AND topic = $2 AND partition = $3`, p.Group, p.Topic, p.Partition).Scan(&id, &out.LogEpoch)
	if errors.Is(err, pgx.ErrNoRows) {
		return PartitionLog{}, nil
	}
	if err != nil {
		return PartitionLog{}, err
	}
	if id.Valid {
		out.TopicID = id.Bytes
	}
	return out, nil
}

// CommitTracked is Commit that also returns the transaction's id, and
// Resolve decides the outcome of a commit by that id: the steps CommitBatch
// and ResolveSession take inside, exported for the protocol's tests.
func (s *Store) CommitTracked(ctx context.Context, tx pgx.Tx, req CommitRequest) (int64, error) {
	return s.commitTracked(ctx, tx, req)
}

// Resolve: see CommitTracked.
func (s *Store) Resolve(ctx context.Context, req CommitRequest, xid int64) (Outcome, error) {
	return s.resolve(ctx, req, xid)
}
