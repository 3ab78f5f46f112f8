package sink

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenure-dev/tenure/internal/fence"
)

// The types below are the protocol's own (package internal/fence, where
// their fields are documented), named here so that an operator's program
// and a handler can use them. They are aliases: a value of one is a value
// of the other.

// Partition names one partition of one consumer group: the key of a
// fencing row.
type Partition = fence.Partition

// Token is a fencing token: the group's incarnation and the coordinator's
// epoch of the claim. Tokens compare as (Incarnation, Epoch).
type Token = fence.Token

// Fence is one fencing row: the partition's token, owner and next offset.
type Fence = fence.Fence

// ClaimRequest asks Store.Claim for ownership of a partition.
type ClaimRequest = fence.ClaimRequest

// Claimed is what a successful claim returns: where to resume.
type Claimed = fence.Claimed

// CommitRequest asks Store.Commit to move a partition's offset.
type CommitRequest = fence.CommitRequest

// FencedError is the error of a claim or commit that a newer token or
// another owner fenced; it matches ErrFenced.
type FencedError = fence.FencedError

// Hold records why a partition is not being processed.
type Hold = fence.Hold

// HoldKind says why a partition is not being processed.
type HoldKind = fence.HoldKind

// The kinds of hold (HoldKind.NeedsAck says which wait for an operator).
const (
	HoldStalled        = fence.HoldStalled
	HoldHandlerBug     = fence.HoldHandlerBug
	HoldTopicRecreated = fence.HoldTopicRecreated
	HoldLogTruncated   = fence.HoldLogTruncated
	HoldAheadOfLog     = fence.HoldAheadOfLog
	HoldDiverged       = fence.HoldDiverged
)

// Header is a Kafka record header, as a dead letter keeps it.
type Header = fence.Header

// DeadLetter is a job parked in the dead-letter table.
type DeadLetter = fence.DeadLetter

// DeadLetterFilter selects the dead letters Store.DeadLetters lists.
type DeadLetterFilter = fence.DeadLetterFilter

// DeadLetterAction is one thing an operator did to a dead letter.
type DeadLetterAction = fence.DeadLetterAction

// DeadLetterExistsError says that a job is in the dead-letter table
// already.
type DeadLetterExistsError = fence.DeadLetterExistsError

// ReplayFunc re-produces a dead letter's job and says where it landed.
type ReplayFunc = fence.ReplayFunc

// ResetRequest asks Store.ResetOffset to move a partition's offset.
type ResetRequest = fence.ResetRequest

// Reset is what an operator's reset did.
type Reset = fence.Reset

// ResetOutOfLogError refuses a reset to an offset outside Kafka's log.
type ResetOutOfLogError = fence.ResetOutOfLogError

// ResetOtherLogError refuses a reset of offsets that belong to another
// log of the topic's name (deleted and re-created).
type ResetOtherLogError = fence.ResetOtherLogError

// FenceLogEntry is one entry of the fence log: an accepted claim or
// commit, or an operator's reset.
type FenceLogEntry = fence.FenceLogEntry

// FenceLogCut is where a partition's fence log was pruned.
type FenceLogCut = fence.FenceLogCut

// FenceLogRetention bounds a partition's fence log.
type FenceLogRetention = fence.FenceLogRetention

// JobLog is what a partition's fence log says about the job at one offset.
type JobLog = fence.JobLog

// ClaimQuery selects the claims Store.Claims returns.
type ClaimQuery = fence.ClaimQuery

// ClaimEntry is a claim or reset from the fence log, with the entry
// before it.
type ClaimEntry = fence.ClaimEntry

// Layout is the partition count a group recorded for a topic.
type Layout = fence.Layout

// LayoutError says how a topic's partition count changed; it matches
// ErrPartitionsChanged.
type LayoutError = fence.LayoutError

// Worker is a worker's last heartbeat.
type Worker = fence.Worker

// PartitionLog is which log a partition's stored offsets belong to.
type PartitionLog = fence.PartitionLog

// Querier is what a read through a handler's transaction needs: the
// QueryRow of consumer.Tx, pgx.Tx and pgxpool.Pool.
type Querier = fence.Querier

// PreparedOwnerError says that a strict batch's prepared transaction
// could not be finished by the role that tried.
type PreparedOwnerError = fence.PreparedOwnerError

// DefaultSchema is the schema tenure's tables live in unless told
// otherwise.
const DefaultSchema = fence.DefaultSchema

// Errors that the operator's API and the worker return; match them with
// errors.Is.
var (
	ErrFenced                 = fence.ErrFenced
	ErrNoDeadLetter           = fence.ErrNoDeadLetter
	ErrNoFencingRow           = fence.ErrNoFencingRow
	ErrNoHold                 = fence.ErrNoHold
	ErrNoPreparedTransactions = fence.ErrNoPreparedTransactions
	ErrNotPrepared            = fence.ErrNotPrepared
	ErrOffsetMismatch         = fence.ErrOffsetMismatch
	ErrPartitionsChanged      = fence.ErrPartitionsChanged
	ErrPreparedRoleAmbiguous  = fence.ErrPreparedRoleAmbiguous
	ErrTxEnded                = fence.ErrTxEnded
)

// SQLSTATE codes tenure's errors are classified by (SQLState returns an
// error's).
const (
	CodeSerializationFailure  = fence.CodeSerializationFailure
	CodeDeadlockDetected      = fence.CodeDeadlockDetected
	CodeLockNotAvailable      = fence.CodeLockNotAvailable
	CodeQueryCanceled         = fence.CodeQueryCanceled
	CodeAdminShutdown         = fence.CodeAdminShutdown
	CodeCrashShutdown         = fence.CodeCrashShutdown
	CodeCannotConnectNow      = fence.CodeCannotConnectNow
	CodeInFailedTransaction   = fence.CodeInFailedTransaction
	CodeReadOnlyTransaction   = fence.CodeReadOnlyTransaction
	CodeInsufficientPrivilege = fence.CodeInsufficientPrivilege
	CodeUndefinedTable        = fence.CodeUndefinedTable
	CodeInvalidSchemaName     = fence.CodeInvalidSchemaName
	CodeInvalidCatalogName    = fence.CodeInvalidCatalogName
	CodeInvalidPassword       = fence.CodeInvalidPassword
	CodeInvalidAuthorization  = fence.CodeInvalidAuthorization
	CodeTooManyConnections    = fence.CodeTooManyConnections
	CodeUniqueViolation       = fence.CodeUniqueViolation
	CodeInvalidParameterValue = fence.CodeInvalidParameterValue
	CodeUndefinedObject       = fence.CodeUndefinedObject
)

// ParseToken parses a token as Token.String writes it ("incarnation.epoch",
// e.g. "0.82").
func ParseToken(s string) (Token, error) { return fence.ParseToken(s) }

// ValidateSchema returns an error unless name can be tenure's schema:
// 1-63 lower-case letters, digits and underscores, not starting with a
// digit, and not a name PostgreSQL reserves.
func ValidateSchema(name string) error { return fence.ValidateSchema(name) }

// SQLState is the SQLSTATE in err's chain, or "".
func SQLState(err error) string { return fence.SQLState(err) }

// IsMissingTables reports whether err says the schema, or a table of it,
// is not there: tenure's migrations have not run in it (or it is the
// wrong schema).
func IsMissingTables(err error) bool { return fence.IsMissingTables(err) }

// IsInsufficientPrivilege reports whether the database refused err's
// statement for want of a privilege.
func IsInsufficientPrivilege(err error) bool { return fence.IsInsufficientPrivilege(err) }

// CheckPreparedTransactions refuses a server whose
// max_prepared_transactions is 0, with an error matching
// ErrNoPreparedTransactions: strict mode ends every batch with PREPARE
// TRANSACTION.
func CheckPreparedTransactions(ctx context.Context, pool *pgxpool.Pool) error {
	return fence.CheckPreparedTransactions(ctx, pool)
}

// ReadPartitionLog reads p's log identity from its fencing row in schema,
// through q. A handler passes its transaction: the batch's fence, which
// runs last in it, checks that the lane's log epoch is still the row's, so
// what the handler read is what its commit is conditioned on. A partition
// with no fencing row reads as the zero PartitionLog.
func ReadPartitionLog(ctx context.Context, q Querier, schema string, p Partition) (PartitionLog, error) {
	return fence.ReadPartitionLog(ctx, q, schema, p)
}

// quote is schema as an SQL identifier.
func quote(schema string) string { return pgx.Identifier{schema}.Sanitize() }
