package sink_test

import (
	"context"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenure-dev/tenure/internal/testinfra/testdb"
	"github.com/tenure-dev/tenure/sink"
)

// migrateBelow reverts schema's migrations (forced) until version v is
// the newest applied one.
func migrateBelow(t *testing.T, ctx context.Context, pool *pgxpool.Pool, schema string, v int) {
	t.Helper()
	for {
		st, err := sink.MigrationStatus(ctx, pool, schema)
		if err != nil {
			t.Fatal(err)
		}
		newest := 0
		for _, s := range st {
			if s.Applied {
				newest = s.Version
			}
		}
		if newest <= v {
			return
		}
		if _, err := sink.MigrateDown(ctx, pool, schema, sink.MigrateDownOptions{Force: true}); err != nil {
			t.Fatalf("reverting %d: %v", newest, err)
		}
	}
}

type exportRow struct {
	Group, Topic, Key string
	Version           int64
}

func exportRows(t *testing.T, ctx context.Context, pool *pgxpool.Pool, schema, table string, grouped bool) []exportRow {
	t.Helper()
	group := "''"
	if grouped {
		group = "consumer_group"
	}
	return testdb.QueryRows(t, ctx, pool, pgx.RowToStructByPos[exportRow], `SELECT `+group+`, topic, job_key, version FROM `+pgx.Identifier{schema, table}.Sanitize()+
		` ORDER BY 1, 2, 3, 4`)
}

// Migration 017 keys the export handler's table by group, topic and key:
// the rows a schema held before it are kept, each given the group that
// wrote it (the partition's only fencing row, else the fence log, else the
// empty group); afterwards two groups or topics writing one key keep a row
// each; reverting it keeps, per key, the row updated last.
func TestMigration017ExportsPerGroup(t *testing.T) {
	t.Parallel()
	ctx, pool, schema := freshDB(t)
	if _, err := sink.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	migrateBelow(t, ctx, pool, schema, 16)
	q := pgx.Identifier{schema}.Sanitize()
	exec := func(sql string) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%v\n%s", err, sql)
		}
	}
	// t1/0 and t2/0 have one fencing row each (g1's, g2's; g2's log
	// pruned); t3/0 has two groups and the log names g4 for initech's
	// job, no commit for umbrella's; t4/0 has no fencing row at all.
	exec(`INSERT INTO ` + q + `.fences (consumer_group, topic, partition, incarnation, epoch, owner, next_offset, partition_count) VALUES
		('g1', 't1', 0, 0, 1, 'm1', 10, 1), ('g2', 't2', 0, 0, 1, 'm2', 10, 1),
		('g3', 't3', 0, 0, 2, 'm3', 10, 1), ('g4', 't3', 0, 0, 2, 'm4', 10, 1)`)
	exec(`INSERT INTO ` + q + `.fence_log (kind, consumer_group, topic, partition, incarnation, epoch, owner, from_offset, to_offset) VALUES
		('commit', 'g1', 't1', 0, 0, 1, 'm1', 0, 10), ('commit', 'g4', 't3', 0, 0, 2, 'm4', 0, 10)`)
	exec(`INSERT INTO ` + q + `.exports (job_key, document, job_value, topic, partition, job_offset, incarnation, epoch, worker, version) VALUES
		('acme', '{}', 'a', 't1', 0, 3, 0, 1, 'w', 1), ('globex', '{}', 'b', 't2', 0, 4, 0, 1, 'w', 2),
		('initech', '{}', 'c', 't3', 0, 5, 0, 2, 'w', 1), ('hooli', '{}', 'd', 't4', 0, 6, 0, 1, 'w', 1),
		('umbrella', '{}', 'e', 't3', 0, 50, 0, 2, 'w', 1)`)
	exec(`INSERT INTO ` + q + `.export_versions (job_key, version, topic, partition, job_offset, incarnation, epoch, worker) VALUES
		('acme', 1, 't1', 0, 3, 0, 1, 'w'), ('globex', 1, 't2', 0, 2, 0, 1, 'w'), ('globex', 2, 't2', 0, 4, 0, 1, 'w'),
		('initech', 1, 't3', 0, 5, 0, 2, 'w'), ('hooli', 1, 't4', 0, 6, 0, 1, 'w'), ('umbrella', 1, 't3', 0, 50, 0, 2, 'w')`)

	if _, err := sink.Migrate(ctx, pool, schema); err != nil {
		t.Fatalf("migrating up over rows: %v", err)
	}
	want := []exportRow{{"", "t3", "umbrella", 1}, {"", "t4", "hooli", 1}, {"g1", "t1", "acme", 1}, {"g2", "t2", "globex", 2}, {"g4", "t3", "initech", 1}}
	if got := exportRows(t, ctx, pool, schema, "exports", true); !slices.Equal(got, want) {
		t.Errorf("exports after 017:\n got %v\nwant %v", got, want)
	}
	wantV := []exportRow{{"", "t3", "umbrella", 1}, {"", "t4", "hooli", 1}, {"g1", "t1", "acme", 1}, {"g2", "t2", "globex", 1}, {"g2", "t2", "globex", 2}, {"g4", "t3", "initech", 1}}
	if got := exportRows(t, ctx, pool, schema, "export_versions", true); !slices.Equal(got, wantV) {
		t.Errorf("export_versions after 017:\n got %v\nwant %v", got, wantV)
	}

	// The same key from another topic, and from another group on the same
	// topic: rows of their own.
	exec(`INSERT INTO ` + q + `.exports (consumer_group, job_key, document, job_value, topic, partition, job_offset, incarnation, epoch, worker, version, updated_at) VALUES
		('g2', 'acme', '{}', 'x', 't2', 0, 7, 0, 1, 'w', 1, now() + interval '1 minute'),
		('g9', 'acme', '{}', 'y', 't1', 0, 1, 0, 1, 'w', 1, now() - interval '1 minute')`)
	exec(`INSERT INTO ` + q + `.export_versions (consumer_group, job_key, version, topic, partition, job_offset, incarnation, epoch, worker) VALUES
		('g2', 'acme', 1, 't2', 0, 7, 0, 1, 'w'), ('g9', 'acme', 1, 't1', 0, 1, 0, 1, 'w')`)

	// Down: per key, the row updated last is kept (g2's acme), with its
	// versions; the others of the key go. Keys with one row lose nothing.
	migrateBelow(t, ctx, pool, schema, 16)
	wantDown := []exportRow{{"", "t2", "acme", 1}, {"", "t2", "globex", 2}, {"", "t3", "initech", 1}, {"", "t3", "umbrella", 1}, {"", "t4", "hooli", 1}}
	if got := exportRows(t, ctx, pool, schema, "exports", false); !slices.Equal(got, wantDown) {
		t.Errorf("exports after reverting 017:\n got %v\nwant %v", got, wantDown)
	}
	wantDownV := []exportRow{{"", "t2", "acme", 1}, {"", "t2", "globex", 1}, {"", "t2", "globex", 2}, {"", "t3", "initech", 1}, {"", "t3", "umbrella", 1},
		{"", "t4", "hooli", 1}}
	if got := exportRows(t, ctx, pool, schema, "export_versions", false); !slices.Equal(got, wantDownV) {
		t.Errorf("export_versions after reverting 017:\n got %v\nwant %v", got, wantDownV)
	}
	if _, err := sink.Migrate(ctx, pool, schema); err != nil {
		t.Fatalf("migrating up again: %v", err)
	}
}
