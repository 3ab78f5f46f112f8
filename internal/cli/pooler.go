package cli

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pooler reports whether the pool's connections lead through a connection
// pooler such as PgBouncer (docs/pgbouncer.md): the process id the server
// announced at connect (BackendKeyData) is not the backend that runs the
// connection's statements, because the pooler announces one of its own
// and hands its clients' statements to server connections it shares. A
// direct connection's two ids are always equal. The query runs in the
// simple protocol so that it works whatever the pool's exec mode.
func pooler(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	defer conn.Release()
	var pid uint32
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`, pgx.QueryExecModeSimpleProtocol).Scan(&pid); err != nil {
		return false, err
	}
	return pid != conn.Conn().PgConn().PID(), nil
}

// checkPooler refuses a pool that leads through a connection pooler with
// pgx's default statement cache (default_query_exec_mode=cache_statement):
// a transaction pooler (PgBouncer's pool_mode=transaction) hands the next
// transaction to another server connection, which has not prepared the
// cached statements ("prepared statement ... does not exist"; PgBouncer
// before 1.21 has no max_prepared_statements, and the pooler's version
// cannot be told from here). cache_describe prepares only the unnamed
// statement, in the same round trip as its execution, and still knows the
// parameters' types (exec and simple_protocol guess them from the Go
// types: a []byte bound to a json column is sent as bytea and refused).
func checkPooler(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	pooled, err := pooler(ctx, pool)
	if err != nil || !pooled {
		return false, err
	}
	if mode := pool.Config().ConnConfig.DefaultQueryExecMode; mode == pgx.QueryExecModeCacheStatement {
		return true, fmt.Errorf("the database URL leads through a connection pooler such as PgBouncer (the server's backend is not the one it announced), which does not keep pgx's cached prepared statements from one transaction to the next: add default_query_exec_mode=cache_describe to the database URL (docs/pgbouncer.md)")
	}
	return true, nil
}

// errMigrateThroughPooler is a migration asked for through a pooler.
var errMigrateThroughPooler = fmt.Errorf("migrations hold a session-level advisory lock, which a connection pooler such as PgBouncer does not keep between transactions: run `tenure migrate up` with a database URL that leads to PostgreSQL directly (docs/pgbouncer.md)")
