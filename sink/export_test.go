package sink

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// Quote exposes quote to the external tests: FuzzValidateSchema checks that a
// name ValidateSchema accepts always quotes to a plain identifier.
var Quote = quote

// LoadMigrationsFrom exposes the migration loader to tests that feed it a
// directory of their own.
var LoadMigrationsFrom = loadMigrationsFrom

// CommitTracked and Resolve expose what the worker's protocol uses inside:
// Commit with the transaction's id, and the resolution of a commit by that
// id.
func (s *Store) CommitTracked(ctx context.Context, tx pgx.Tx, req CommitRequest) (int64, error) {
	return s.commitTracked(ctx, tx, req)
}

func (s *Store) Resolve(ctx context.Context, req CommitRequest, xid int64) (Outcome, error) {
	return s.resolve(ctx, req, xid)
}
