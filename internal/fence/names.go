package fence

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// The names the schema knows: the consumer groups and topics that have rows
// in it, so that an operator's command can tell a mistyped name from one
// that merely has nothing to show.
//
// The tables read are those a group or topic can appear in first: the
// fencing rows (a partition's first claim), the partition counts recorded
// (topic_layouts, written before the claim), the holds, the incarnations
// and the workers' heartbeats (a worker beats before it claims anything).
// Every other table that names a group or topic (the fence log, dead
// letters, export pointers, effects, job ids, strict batches) is written
// in a transaction that passed a partition's fence, so its names are among
// the fencing rows', which are never deleted: reading those tables too
// would scan them for nothing.

// KnownGroups returns the consumer groups that have rows in the schema, sorted.
func (s *Store) KnownGroups(ctx context.Context) ([]string, error) {
	q := quote(s.schema)
	return s.names(ctx, `SELECT consumer_group FROM `+q+`.fences
	UNION SELECT consumer_group FROM `+q+`.topic_layouts
	UNION SELECT consumer_group FROM `+q+`.partition_holds
	UNION SELECT consumer_group FROM `+q+`.group_incarnations
	UNION SELECT consumer_group FROM `+q+`.workers
	ORDER BY 1`)
}

// KnownTopics returns the topics that have rows in the schema, sorted: those of
// group, or of every group when group is "".
func (s *Store) KnownTopics(ctx context.Context, group string) ([]string, error) {
	q := quote(s.schema)
	return s.names(ctx, `SELECT topic FROM `+q+`.fences WHERE $1 = '' OR consumer_group = $1
	UNION SELECT topic FROM `+q+`.topic_layouts WHERE $1 = '' OR consumer_group = $1
	UNION SELECT topic FROM `+q+`.partition_holds WHERE $1 = '' OR consumer_group = $1
	ORDER BY 1`, group)
}

func (s *Store) names(ctx context.Context, sql string, args ...any) ([]string, error) {
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}
