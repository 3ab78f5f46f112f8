package sink

// Strict hand-off (G3-strict): a batch's transaction ends with PREPARE
// TRANSACTION instead of COMMIT; the lane then commits the batch's offset to
// the group coordinator and COMMIT PREPARED only once the coordinator
// accepted it. This file is Postgres's part: the global transaction id
// (GID), the fence statement that travels with PREPARE TRANSACTION, listing
// a partition's prepared batches, deciding them, and recording decisions.
// docs/fencing.md ("Strict hand-off") and docs/model/strict.pml say why
// each step is there.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// CodeUndefinedObject is SQLSTATE 42704: COMMIT PREPARED or ROLLBACK
// PREPARED of a GID that is not (or no longer) prepared.
const CodeUndefinedObject = "42704"

// gidVersion starts every GID tenure prepares: the format's version.
const gidVersion = "t1"

// StrictBatch is one batch of a strict lane, named by its GID.
type StrictBatch struct {
	Partition Partition
	Token     Token
	ClaimID   int64
	From, To  int64
}

// StrictPrefix is the prefix every GID of p's batches in schema starts with:
// "t1.<hash>.<partition>.", where hash is the first 32 hex digits of the
// SHA-256 of schema, group and topic (names can be long, and a GID is at
// most 200 bytes). The same server may hold several schemas and groups:
// the hash keeps their prepared transactions apart.
func StrictPrefix(schema string, p Partition) string {
	h := sha256.Sum256([]byte(schema + "\x00" + p.Group + "\x00" + p.Topic))
	return gidVersion + "." + hex.EncodeToString(h[:16]) + "." + strconv.FormatInt(int64(p.Partition), 10) + "."
}

// GID is the global transaction id of batch b in schema:
// StrictPrefix, then incarnation.epoch (the token), claim id, from, to,
// dot-separated. At most 3+33+11+20+11+20+20+20 = 138 bytes, within
// Postgres's 200.
func GID(schema string, b StrictBatch) string {
	return StrictPrefix(schema, b.Partition) + strconv.FormatInt(b.Token.Incarnation, 10) + "." +
		strconv.FormatInt(int64(b.Token.Epoch), 10) + "." + strconv.FormatInt(b.ClaimID, 10) + "." +
		strconv.FormatInt(b.From, 10) + "." + strconv.FormatInt(b.To, 10)
}

// ParseGID reads a GID of partition p (its prefix must be StrictPrefix(schema, p)).
func ParseGID(schema string, p Partition, gid string) (StrictBatch, error) {
	rest, ok := strings.CutPrefix(gid, StrictPrefix(schema, p))
	if !ok {
		return StrictBatch{}, fmt.Errorf("prepared transaction %q is not one of %s's batches", gid, p)
	}
	f := strings.Split(rest, ".")
	if len(f) != 5 {
		return StrictBatch{}, fmt.Errorf("prepared transaction %q: want incarnation.epoch.claim.from.to after the prefix", gid)
	}
	var n [5]int64
	for i, s := range f {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return StrictBatch{}, fmt.Errorf("prepared transaction %q: %v", gid, err)
		}
		n[i] = v
	}
	b := StrictBatch{Partition: p, Token: Token{Incarnation: n[0], Epoch: int32(n[1])}, ClaimID: n[2], From: n[3], To: n[4]}
	if GID(schema, b) != gid {
		return StrictBatch{}, fmt.Errorf("prepared transaction %q is not in canonical form", gid)
	}
	return b, nil
}

// ErrNoPreparedTransactions is matched by CheckPreparedTransactions' error.
var ErrNoPreparedTransactions = errors.New("prepared transactions are disabled")

// CheckPreparedTransactions refuses a server whose max_prepared_transactions
// is 0: strict hand-off ends every batch with PREPARE TRANSACTION.
func CheckPreparedTransactions(ctx context.Context, pool *pgxpool.Pool) error {
	var n int
	if err := pool.QueryRow(ctx, `SELECT current_setting('max_prepared_transactions')::int`).Scan(&n); err != nil {
		return fmt.Errorf("reading max_prepared_transactions: %w", err)
	}
	if n == 0 {
		return fmt.Errorf("%w: strict hand-off (--strict) ends every batch with PREPARE TRANSACTION, but this server's max_prepared_transactions is 0; "+
			"set it in postgresql.conf to at least the number of partitions the workers hold at once (a restart is needed), or run without --strict", ErrNoPreparedTransactions)
	}
	return nil
}

// strictFenceSQL is pipelinedSQL with the batch's GID in its fence log
// entry (migration 015): the entry commits with the prepared transaction.
func (s *Store) strictFenceSQL() string {
	return strings.Replace(strings.Replace(s.pipelinedSQL,
		"(kind, consumer_group, topic, partition, incarnation, epoch, owner, from_offset, to_offset, claim_id)",
		"(kind, consumer_group, topic, partition, incarnation, epoch, owner, from_offset, to_offset, claim_id, gid)", 1),
		"SELECT 'commit', $1, $2, $3, $4, $5, $6, $7, $8, $9 FROM u",
		"SELECT 'commit', $1, $2, $3, $4, $5, $6, $7, $8, $9, $12 FROM u", 1)
}

// PrepareBatch is CommitBatch for a strict lane: the fence statement and
// PREPARE TRANSACTION gid travel together, in one round trip. A nil error
// means the batch is prepared: it holds its locks (the fencing row's among
// them) until COMMIT PREPARED or ROLLBACK PREPARED, whatever becomes of the
// session. Errors as CommitBatch's: a *FencedError or ErrTxEnded or a
// *pgconn.PgError mean nothing was prepared; anything else leaves it
// unknown (ResolvePrepare).
//
// Worker protocol: package consumer calls it; not API (see the package doc).
func (s *Store) PrepareBatch(ctx context.Context, tx pgx.Tx, req CommitRequest, marker, gid string) error {
	p := req.Partition
	return s.fenceAndEnd(ctx, tx, req, "prepare", "PREPARE TRANSACTION "+quoteLiteral(gid), s.strictFenceSQL(), p.Group, p.Topic, p.Partition,
		req.Token.Incarnation, req.Token.Epoch, req.Owner, req.From, req.To, req.ClaimID, marker, req.LogEpoch, gid)
}

// PrepareOutcome is what ResolvePrepare learned about a PREPARE whose answer
// was lost.
type PrepareOutcome int

const (
	// Prepared: the batch is prepared (still undecided).
	Prepared PrepareOutcome = iota + 1
	// PreparedThenCommitted: it was prepared, and someone (a resolver) has
	// committed it since.
	PreparedThenCommitted
	// NotPrepared: no such prepared transaction, and its commit is not in
	// the fence log: it was never prepared, or rolled back since.
	NotPrepared
)

// ResolvePrepare finds out what became of a PREPARE TRANSACTION gid whose
// answer was lost: it waits while the batch's session is still in its
// transaction (ending it if it sits idle there), then looks the GID up.
//
// Worker protocol: package consumer calls it; not API (see the package doc).
func (s *Store) ResolvePrepare(ctx context.Context, sess Session, gid string) (PrepareOutcome, error) {
	if err := s.awaitSession(ctx, sess); err != nil {
		return 0, err
	}
	var prepared, committed bool
	err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_prepared_xacts WHERE gid = $1 AND database = current_database()),
		EXISTS (SELECT 1 FROM `+quote(s.schema)+`.fence_log WHERE gid = $1 AND kind = 'commit')`, gid).Scan(&prepared, &committed)
	switch {
	case err != nil:
		return 0, err
	case prepared:
		return Prepared, nil
	case committed:
		return PreparedThenCommitted, nil
	}
	return NotPrepared, nil
}

// ListPrepared lists p's prepared batches (pg_prepared_xacts, by GID
// prefix), lowest starting offset first. A GID under p's prefix that does
// not parse is an error: something else prepared it, and the claim cannot
// tell what it holds.
//
// Worker protocol: package consumer calls it; not API (see the package doc).
func (s *Store) ListPrepared(ctx context.Context, p Partition) ([]StrictBatch, []string, error) {
	prefix := StrictPrefix(s.schema, p)
	rows, err := s.pool.Query(ctx, `SELECT gid FROM pg_prepared_xacts
		WHERE database = current_database() AND starts_with(gid, $1) ORDER BY gid`, prefix)
	if err != nil {
		return nil, nil, fmt.Errorf("listing the prepared transactions of %s: %w", p, err)
	}
	gids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, nil, fmt.Errorf("listing the prepared transactions of %s: %w", p, err)
	}
	out := make([]StrictBatch, 0, len(gids))
	for _, g := range gids {
		b, err := ParseGID(s.schema, p, g)
		if err != nil {
			return nil, nil, err
		}
		out = append(out, b)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].From < out[j].From })
	ordered := make([]string, len(out))
	for i, b := range out {
		ordered[i] = GID(s.schema, b)
	}
	return out, ordered, nil
}

// ErrNotPrepared is matched by FinishPrepared's error when gid is not
// prepared (any more): someone else decided it.
var ErrNotPrepared = errors.New("no such prepared transaction")

// FinishPrepared runs COMMIT PREPARED gid (commit) or ROLLBACK PREPARED gid.
// Neither may run in a transaction block or a pipeline: one statement, in
// autocommit. ErrNotPrepared: the GID is not prepared (someone decided it
// first; StrictCommitted tells which way).
//
// Worker protocol: package consumer calls it; not API (see the package doc).
func (s *Store) FinishPrepared(ctx context.Context, gid string, commit bool) error {
	stmt := "ROLLBACK PREPARED "
	if commit {
		stmt = "COMMIT PREPARED "
	}
	_, err := s.pool.Exec(ctx, stmt+quoteLiteral(gid))
	if SQLState(err) == CodeUndefinedObject {
		return fmt.Errorf("%s%s: %w", stmt, gid, ErrNotPrepared)
	}
	if err != nil {
		return fmt.Errorf("%s%s: %w", stmt, gid, err)
	}
	return nil
}

// StrictCommitted reports whether the batch gid committed: its fence log
// entry is there. Ask it once gid is no longer prepared.
func (s *Store) StrictCommitted(ctx context.Context, gid string) (bool, error) {
	var ok bool
	err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+quote(s.schema)+`.fence_log WHERE gid = $1 AND kind = 'commit')`, gid).Scan(&ok)
	return ok, err
}

// StrictDecision is one decision on a prepared batch (strict_batches: every
// rollback and every resolver's decision; a lane's own commit is recorded
// by its fence log entry alone).
type StrictDecision struct {
	GID       string
	Batch     StrictBatch
	Owner     string // the batch's lane's member
	Committed bool
	// ByResolver: a later claim decided it (else the batch's own lane).
	ByResolver bool
	// Decider and DeciderClaimID name the member and lane that decided.
	Decider        string
	DeciderClaimID int64
	Evidence       string
	DecidedAt      time.Time // read back by LoadStrictDecisions
}

// RecordStrictDecision records d (after its COMMIT PREPARED or ROLLBACK
// PREPARED). The first record of a GID stays.
//
// Worker protocol: package consumer calls it; not API (see the package doc).
func (s *Store) RecordStrictDecision(ctx context.Context, d StrictDecision) error {
	outcome, by := "rolled-back", "lane"
	if d.Committed {
		outcome = "committed"
	}
	if d.ByResolver {
		by = "resolver"
	}
	b := d.Batch
	_, err := s.pool.Exec(ctx, `INSERT INTO `+quote(s.schema)+`.strict_batches
		(gid, consumer_group, topic, partition, incarnation, epoch, owner, claim_id, from_offset, to_offset,
		 outcome, decided_by, decider, decider_claim_id, evidence)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15) ON CONFLICT (gid) DO NOTHING`,
		d.GID, b.Partition.Group, b.Partition.Topic, b.Partition.Partition, b.Token.Incarnation, b.Token.Epoch, d.Owner, b.ClaimID,
		b.From, b.To, outcome, by, d.Decider, d.DeciderClaimID, d.Evidence)
	return err
}

// LoadStrictDecisions reads the recorded decisions of group (every group
// when group is "").
func (s *Store) LoadStrictDecisions(ctx context.Context, group string) ([]StrictDecision, error) {
	rows, err := s.pool.Query(ctx, `SELECT gid, consumer_group, topic, partition, incarnation, epoch, owner, claim_id, from_offset, to_offset,
		outcome = 'committed', decided_by = 'resolver', decider, decider_claim_id, evidence, decided_at
		FROM `+quote(s.schema)+`.strict_batches WHERE ($1 = '' OR consumer_group = $1) ORDER BY decided_at, gid`, group)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (StrictDecision, error) {
		var d StrictDecision
		b := &d.Batch
		err := r.Scan(&d.GID, &b.Partition.Group, &b.Partition.Topic, &b.Partition.Partition, &b.Token.Incarnation, &b.Token.Epoch,
			&d.Owner, &b.ClaimID, &b.From, &b.To, &d.Committed, &d.ByResolver, &d.Decider, &d.DeciderClaimID, &d.Evidence, &d.DecidedAt)
		return d, err
	})
}

// PreparedGIDs lists every prepared transaction of schema's partitions of
// group on this database: those whose GID starts with the StrictPrefix of
// a partition that has a fencing row.
func (s *Store) PreparedGIDs(ctx context.Context, group string) ([]string, error) {
	fences, err := s.List(ctx, group)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, f := range fences {
		_, gids, err := s.ListPrepared(ctx, f.Partition)
		if err != nil {
			return nil, err
		}
		out = append(out, gids...)
	}
	return out, nil
}

// quoteLiteral quotes s as an SQL string literal (PREPARE TRANSACTION and
// its kin take no parameters).
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
