package jobs

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/tenure-dev/tenure/sink"
)

// Querier is what the table readers need: a pool, a connection or a
// transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// TableExport is one row of the export handler's table (without an object
// store): a group's latest export of a key of a topic.
type TableExport struct {
	Group     string
	Topic     string
	Key       string
	Version   int64
	Partition int32
	Offset    int64
	Token     sink.Token
}

// tableName is schema's exports table, quoted.
func tableName(schema string) string { return pgx.Identifier{schema}.Sanitize() + ".exports" }

// ExportsOf reads the rows of the exports table of schema for key: one per
// group and topic that wrote it, ordered by group and topic.
func ExportsOf(ctx context.Context, q Querier, schema, key string) ([]TableExport, error) {
	rows, err := q.Query(ctx, `SELECT consumer_group, topic, job_key, version, partition, job_offset, incarnation, epoch
	FROM `+tableName(schema)+` WHERE job_key = $1 ORDER BY consumer_group, topic`, key)
	if err != nil {
		return nil, err
	}
	var out []TableExport
	var e TableExport
	_, err = pgx.ForEachRow(rows, []any{&e.Group, &e.Topic, &e.Key, &e.Version, &e.Partition, &e.Offset, &e.Token.Incarnation, &e.Token.Epoch}, func() error {
		out = append(out, e)
		return nil
	})
	return out, err
}

// CountTableExports counts the rows of the exports table of schema whose
// key starts with prefix, of group ("": every group).
func CountTableExports(ctx context.Context, q Querier, schema, prefix, group string) (int64, error) {
	var n int64
	err := q.QueryRow(ctx, `SELECT count(*) FROM `+tableName(schema)+` WHERE starts_with(job_key, $1) AND ($2 = '' OR consumer_group = $2)`,
		prefix, group).Scan(&n)
	return n, err
}

// TableExportsQuery is the SQL a person runs to read the exports table of
// schema (for messages).
func TableExportsQuery(schema string) string {
	return "SELECT consumer_group, topic, job_key, version, partition, job_offset, document FROM " + tableName(schema) +
		" ORDER BY consumer_group, topic, job_key"
}
