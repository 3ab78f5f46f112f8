package fence

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
)

// The SQLSTATE codes tenure acts on, named once (PostgreSQL, Appendix A).
// Code classes (the first two characters) are matched in consumer's error
// classification; these are the single codes.
const (
	CodeSerializationFailure  = "40001" // serialization_failure
	CodeDeadlockDetected      = "40P01" // deadlock_detected
	CodeLockNotAvailable      = "55P03" // lock_not_available: lock_timeout
	CodeQueryCanceled         = "57014" // query_canceled: statement_timeout, a cancel request
	CodeAdminShutdown         = "57P01" // admin_shutdown
	CodeCrashShutdown         = "57P02" // crash_shutdown
	CodeCannotConnectNow      = "57P03" // cannot_connect_now: starting up, shutting down
	CodeInFailedTransaction   = "25P02" // in_failed_sql_transaction
	CodeReadOnlyTransaction   = "25006" // read_only_sql_transaction: a standby
	CodeInsufficientPrivilege = "42501" // insufficient_privilege
	CodeUndefinedTable        = "42P01" // undefined_table
	CodeUndefinedColumn       = "42703" // undefined_column: a schema before a migration that added it
	CodeInvalidSchemaName     = "3F000" // invalid_schema_name
	CodeInvalidCatalogName    = "3D000" // invalid_catalog_name: no such database
	CodeInvalidPassword       = "28P01" // invalid_password
	CodeInvalidAuthorization  = "28000" // invalid_authorization_specification: unknown role, pg_hba.conf
	CodeTooManyConnections    = "53300" // too_many_connections
	CodeUniqueViolation       = "23505" // unique_violation
	CodeInvalidParameterValue = "22023" // invalid_parameter_value ("transaction ID is in the future")
	// tenure's own (fence_check, migration 009).
	CodeFenced  = "TF001" // the fence statement did not pass
	CodeTxEnded = "TF002" // the batch's transaction was ended before the fence
)

// SQLState is the SQLSTATE in err's chain, or "".
func SQLState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// IsMissingTables reports whether err says the schema, or a table of it, is
// not there: tenure's migrations have not run in it (or it is the wrong
// schema).
func IsMissingTables(err error) bool {
	c := SQLState(err)
	return c == CodeUndefinedTable || c == CodeInvalidSchemaName
}

// IsInsufficientPrivilege reports whether the database refused err's
// statement for want of a privilege.
func IsInsufficientPrivilege(err error) bool { return SQLState(err) == CodeInsufficientPrivilege }
