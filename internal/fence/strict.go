package fence

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
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
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
// PREPARE TRANSACTION travel together, in one round trip. It returns the
// batch's GID (GID of the batch req names), also with an error: a lost
// answer is resolved by it. A nil error means the batch is prepared: it holds its locks (the fencing row's among
// them) until COMMIT PREPARED or ROLLBACK PREPARED, whatever becomes of the
// session. Errors as CommitBatch's: a *FencedError or ErrTxEnded or a
// *pgconn.PgError mean nothing was prepared; anything else leaves it
// unknown (ResolvePrepare).
//
// Worker protocol: package consumer calls it; not API (see the package doc).
func (s *Store) PrepareBatch(ctx context.Context, tx pgx.Tx, req CommitRequest, marker string) (gid string, err error) {
	p := req.Partition
	gid = GID(s.schema, StrictBatchOf(req))
	roles, err := s.preparedRoles(ctx)
	if err != nil {
		return gid, fmt.Errorf("prepare of %s: %w", p, err)
	}
	end := []string{"PREPARE TRANSACTION " + quoteLiteral(gid)}
	if roles.setRole() {
		// Right before PREPARE, so that the handler's statements ran as
		// the login role; the prepared transaction belongs to the role
		// current at PREPARE.
		end = append([]string{"SET LOCAL ROLE " + quote(roles.name)}, end...)
	}
	return gid, s.fenceAndEnd(ctx, tx, req, "prepare", end, s.strictFenceSQL(), p.Group, p.Topic, p.Partition,
		req.Token.Incarnation, req.Token.Epoch, req.Owner, req.From, req.To, req.ClaimID, marker, req.LogEpoch, gid)
}

// StrictBatchOf is the strict batch a commit request names.
func StrictBatchOf(req CommitRequest) StrictBatch {
	return StrictBatch{Partition: req.Partition, Token: req.Token, ClaimID: req.ClaimID, From: req.From, To: req.To}
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

// AnyPrepared reports whether the server holds any prepared transaction
// with tenure's GID format in this database: whether a claim must look
// for its partition's.
//
// Worker protocol: package consumer calls it; not API (see the package doc).
func (s *Store) AnyPrepared(ctx context.Context) (bool, error) {
	var ok bool
	err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_prepared_xacts
		WHERE database = current_database() AND starts_with(gid, $1))`, gidVersion+".").Scan(&ok)
	return ok, err
}

// ErrNotPrepared is matched by FinishPrepared's error when gid is not
// prepared (any more): someone else decided it.
var ErrNotPrepared = errors.New("no such prepared transaction")

// FinishPrepared runs COMMIT PREPARED gid (commit) or ROLLBACK PREPARED gid,
// as the prepared-batch role (PreparedRole: SET ROLE on the connection that
// runs it, reset afterwards). Neither may run in a transaction block or a
// pipeline: one statement, in autocommit. ErrNotPrepared: the GID is not
// prepared (someone decided it first; StrictCommitted tells which way). A
// *PreparedOwnerError: the batch belongs to a role this one cannot act for
// (it was prepared under another login role, by a worker that did not
// share the prepared-batch role).
//
// Worker protocol: package consumer calls it; not API (see the package doc).
func (s *Store) FinishPrepared(ctx context.Context, gid string, commit bool) error {
	stmt := "ROLLBACK PREPARED "
	if commit {
		stmt = "COMMIT PREPARED "
	}
	roles, err := s.preparedRoles(ctx)
	if err != nil {
		return fmt.Errorf("%s%s: %w", stmt, gid, err)
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("%s%s: %w", stmt, gid, err)
	}
	defer conn.Release()
	// Through a transaction pooler a session's SET ROLE would not reach
	// the COMMIT PREPARED (and would stay behind for another client), so
	// none is sent there: CheckStrictRole refuses a strict worker that
	// would need one.
	setRole := roles.setRole() && !s.pooled
	if setRole {
		if _, err := conn.Exec(ctx, "SET ROLE "+quote(roles.name)); err != nil {
			return fmt.Errorf("%s%s: SET ROLE %s: %w", stmt, gid, roles.name, err)
		}
		defer func() {
			if _, err := conn.Exec(context.WithoutCancel(ctx), "RESET ROLE"); err != nil {
				_ = conn.Conn().Close(context.Background()) // never pooled with the role set
			}
		}()
	}
	_, err = conn.Exec(ctx, stmt+quoteLiteral(gid))
	switch {
	case err == nil:
		return nil
	case SQLState(err) == CodeUndefinedObject:
		return fmt.Errorf("%s%s: %w", stmt, gid, ErrNotPrepared)
	case IsInsufficientPrivilege(err):
		oe := &PreparedOwnerError{GID: gid, Commit: commit, As: roles.login, Err: err}
		if setRole {
			oe.As = roles.name
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = s.pool.QueryRow(rctx, `SELECT owner::text FROM pg_prepared_xacts WHERE gid = $1`, gid).Scan(&oe.Owner)
		return oe
	}
	return fmt.Errorf("%s%s: %w", stmt, gid, err)
}

// PreparedOwnerError says that a prepared batch belongs to a role that the
// finishing role cannot act for: PostgreSQL lets only the role that ran
// PREPARE TRANSACTION, or a superuser, finish it (membership in a shared
// role is not enough). The batch keeps its locks, the fencing row's among
// them, until someone who may finishes it: Error says who, and the exact
// statement.
type PreparedOwnerError struct {
	GID    string
	Owner  string // the role that prepared it ("" if it could not be read)
	As     string // the role that tried to finish it
	Commit bool   // what the caller decided, by the group's committed offset
	Err    error
}

func (e *PreparedOwnerError) Error() string {
	stmt := "ROLLBACK PREPARED"
	if e.Commit {
		stmt = "COMMIT PREPARED"
	}
	owner := e.Owner
	if owner == "" {
		owner = "another role"
	}
	return fmt.Sprintf("prepared batch %s belongs to role %s, and role %s may not finish it (PostgreSQL lets only the role that prepared a transaction, "+
		"or a superuser, commit or roll it back); it holds the partition's fencing row until then: as %s or a superuser, run %s %s "+
		"(the decision the group's committed offset gives), and give every worker the same prepared-batch role (--prepared-role)",
		e.GID, owner, e.As, owner, stmt, quoteLiteral(e.GID))
}

func (e *PreparedOwnerError) Unwrap() error { return e.Err }

// The role prepared batches belong to.
//
// PostgreSQL lets only the role current at PREPARE TRANSACTION, or a
// superuser, run COMMIT PREPARED or ROLLBACK PREPARED for it: membership in
// a shared role is not enough. Workers that log in as different roles,
// each granted the schema's worker role (what `tenure migrate
// --print-roles` documents), could not finish each other's batches: the
// next owner's claim failed with 42501, then waited on the fencing row's
// lock, and the partition wedged. So every worker prepares its batches as
// one shared role (SET LOCAL ROLE right before PREPARE TRANSACTION, so
// that the handler's statements still run as the login role) and finishes
// them as it (SET ROLE on the connection that runs COMMIT PREPARED).
type roleState struct {
	mu    sync.Mutex
	done  bool   // read from the database (once it answered)
	set   bool   // SetPreparedRole was called
	name  string // the prepared-batch role; "": the login role
	login string // current_user of the pool's connections
	super bool   // the login role is a superuser
}

// preparedRoles is what PreparedRole read: the prepared-batch role, and
// the login role and whether it is a superuser.
type preparedRoles struct {
	name, login string
	super       bool
}

// setRole reports whether preparing or finishing as r.name needs SET ROLE.
func (r preparedRoles) setRole() bool { return r.name != "" && r.name != r.login }

// SetPreparedRole names the role strict batches are prepared and finished
// as (the schema's worker role that every worker's login role is a member
// of); "" prepares and finishes them as the login role. Without it the
// store finds the role at first use (PreparedRole). Call it before the
// store is used.
func (s *Store) SetPreparedRole(role string) {
	s.roles.mu.Lock()
	defer s.roles.mu.Unlock()
	s.roles.set, s.roles.name = true, role
}

// ErrPreparedRoleAmbiguous is matched by PreparedRole's error when the
// login role belongs to several roles that could be the shared one.
var ErrPreparedRoleAmbiguous = errors.New("more than one role could be the prepared-batch role")

// PreparedRole returns the role strict batches are prepared and finished
// as ("" for the login role). Unless SetPreparedRole named it, it is the
// role that holds a direct UPDATE grant on the schema's fences table (the
// worker role of `tenure migrate --print-roles`), is neither a superuser
// nor the table's owner, and has the login role as a member (or is the
// login role): every worker set up that way finds the same role, whatever
// it logs in as. None: the login role (workers that log in as the
// schema's owner, or as a superuser where no worker role was made). It is
// read once, when the database first answers.
func (s *Store) PreparedRole(ctx context.Context) (string, error) {
	r, err := s.preparedRoles(ctx)
	return r.name, err
}

func (s *Store) preparedRoles(ctx context.Context) (preparedRoles, error) {
	r := &s.roles
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done {
		return preparedRoles{r.name, r.login, r.super}, nil
	}
	var login string
	var super bool
	if err := s.pool.QueryRow(ctx, `SELECT current_user::text, (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)`).Scan(&login, &super); err != nil {
		return preparedRoles{}, fmt.Errorf("reading the login role: %w", err)
	}
	name := r.name
	if r.set && name != "" {
		var member bool
		err := s.pool.QueryRow(ctx, `SELECT CASE WHEN EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1) THEN pg_has_role(current_user, $1::text, 'MEMBER') ELSE false END`, name).Scan(&member)
		if err != nil {
			return preparedRoles{}, fmt.Errorf("checking the prepared-batch role %s: %w", name, err)
		}
		if !member {
			return preparedRoles{}, fmt.Errorf("the prepared-batch role %s does not exist or the login role %s is not a member of it (GRANT %s TO %s)", name, login, name, login)
		}
	}
	if !r.set {
		rows, err := s.pool.Query(ctx, `SELECT DISTINCT r.rolname::text
			FROM pg_class c, aclexplode(c.relacl) a, pg_roles r
			WHERE c.oid = to_regclass($1) AND a.privilege_type = 'UPDATE' AND r.oid = a.grantee
			  AND r.oid <> c.relowner AND NOT r.rolsuper AND pg_has_role(current_user, r.oid, 'MEMBER')
			ORDER BY 1`, quote(s.schema)+".fences")
		if err != nil {
			return preparedRoles{}, fmt.Errorf("finding the prepared-batch role: %w", err)
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		switch {
		case err != nil:
			return preparedRoles{}, fmt.Errorf("finding the prepared-batch role: %w", err)
		case len(names) == 1:
			name = names[0]
		case len(names) > 1 && slices.Contains(names, login):
			name = login
		case len(names) > 1:
			return preparedRoles{}, fmt.Errorf("%w: the login role %s is a member of %s, each granted UPDATE on %s.fences; name the one every worker shares (--prepared-role)",
				ErrPreparedRoleAmbiguous, login, strings.Join(names, ", "), s.schema)
		}
	}
	r.done, r.name, r.login, r.super = true, name, login, super
	return preparedRoles{name, login, super}, nil
}

// CheckStrictRole refuses, in one sentence, a strict worker whose batches
// other workers could not finish: one that would prepare them as a shared
// role through a transaction pooler (SetPooled), where the SET ROLE that
// finishing them needs cannot reach COMMIT PREPARED; and a login role
// whose prepared-batch role cannot be told (ErrPreparedRoleAmbiguous).
func (s *Store) CheckStrictRole(ctx context.Context) error {
	r, err := s.preparedRoles(ctx)
	if err != nil {
		return err
	}
	if s.pooled && r.setRole() && !r.super {
		return fmt.Errorf("strict hand-off through a transaction pooler needs every worker to log in as one role: this worker logs in as %s "+
			"and prepares its batches as %s, but a pooler cannot carry the SET ROLE %s that finishing another worker's batch needs "+
			"(PostgreSQL lets only the preparing role or a superuser finish it); log the workers in as %s",
			r.login, r.name, r.name, r.name)
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
