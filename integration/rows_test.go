package integration

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tenure-dev/tenure/internal/testinfra/testdb"
)

// queryTimeout bounds the tests' reads of their database.
const queryTimeout = 30 * time.Second

// queryRows runs q on the test's database and makes one T of each row with
// scan (pgx.RowTo[T] for a single column); any error fails the test.
func queryRows[T any](t *testing.T, e *env, scan pgx.RowToFunc[T], q string, args ...any) []T {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), queryTimeout)
	defer cancel()
	return testdb.QueryRows(t, ctx, e.pool, scan, q, args...)
}

// queryMap runs q, whose rows are (key, value) pairs, on the test's
// database and returns them as a map; any error fails the test.
func queryMap[K comparable, V any](t *testing.T, e *env, q string, args ...any) map[K]V {
	t.Helper()
	pairs := queryRows(t, e, func(row pgx.CollectableRow) (kv keyValue[K, V], err error) {
		err = row.Scan(&kv.k, &kv.v)
		return kv, err
	}, q, args...)
	out := make(map[K]V, len(pairs))
	for _, kv := range pairs {
		out[kv.k] = kv.v
	}
	return out
}

type keyValue[K, V any] struct {
	k K
	v V
}
