package sink

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Replication is what a server says about how it acknowledges commits:
// whether a commit waits for a synchronous standby before it is
// acknowledged. tenure's promise across a failover needs that: a standby
// that is behind when it is promoted loses commits workers saw acknowledged
// (docs/fencing.md, "Running on highly available Postgres").
type Replication struct {
	// SynchronousStandbyNames and SynchronousCommit are the settings.
	SynchronousStandbyNames string
	SynchronousCommit       string
	// Standbys and SyncStandbys count the standbys connected now, all and
	// synchronous ('sync' or 'quorum'); -1 when pg_stat_replication cannot
	// be read (a managed service may hide it from this role).
	Standbys, SyncStandbys int
}

// Synchronous reports whether an acknowledged commit is on a synchronous
// standby too (as far as this server can tell).
func (r Replication) Synchronous() bool {
	if strings.TrimSpace(r.SynchronousStandbyNames) == "" {
		return false
	}
	switch r.SynchronousCommit {
	case "on", "remote_apply", "remote_write":
	default:
		return false
	}
	return r.SyncStandbys != 0 // -1 (unknown) counts as configured
}

// Describe says in one sentence what the settings mean for tenure.
func (r Replication) Describe() string {
	switch {
	case r.Synchronous() && r.SyncStandbys < 0:
		return fmt.Sprintf("commits wait for a synchronous standby (synchronous_standby_names %q, synchronous_commit %s); whether one is connected cannot be read (pg_stat_replication is hidden from this role)",
			r.SynchronousStandbyNames, r.SynchronousCommit)
	case r.Synchronous():
		return fmt.Sprintf("commits wait for %d synchronous standby(s) (synchronous_standby_names %q, synchronous_commit %s)",
			r.SyncStandbys, r.SynchronousStandbyNames, r.SynchronousCommit)
	case strings.TrimSpace(r.SynchronousStandbyNames) != "" && r.SyncStandbys == 0:
		return fmt.Sprintf("synchronous_standby_names is %q but no synchronous standby is connected: commits wait until one is", r.SynchronousStandbyNames)
	case r.Standbys > 0:
		return fmt.Sprintf("the database acknowledges commits without a synchronous standby (%d asynchronous standby(s), synchronous_standby_names %q, synchronous_commit %s): "+
			"a failover to a standby that is behind loses commits workers saw acknowledged; tenure then holds the partitions as diverged, but effects outside Postgres and exports readers saw may go back",
			r.Standbys, r.SynchronousStandbyNames, r.SynchronousCommit)
	case r.Standbys < 0:
		return fmt.Sprintf("the database acknowledges commits without a synchronous standby as far as its settings say (synchronous_standby_names %q, synchronous_commit %s); its standbys cannot be read (pg_stat_replication is hidden from this role)",
			r.SynchronousStandbyNames, r.SynchronousCommit)
	default:
		return "the database has no standby: a commit is acknowledged once it is on this server's disk; a restore from a backup would lose later commits (tenure then holds the partitions as diverged)"
	}
}

// ReplicationOf reads how the server behind pool acknowledges commits, with
// read-only queries that need no privilege beyond connecting.
func ReplicationOf(ctx context.Context, pool *pgxpool.Pool) (Replication, error) {
	var r Replication
	if err := pool.QueryRow(ctx, `SELECT current_setting('synchronous_standby_names'), current_setting('synchronous_commit')`).
		Scan(&r.SynchronousStandbyNames, &r.SynchronousCommit); err != nil {
		return r, fmt.Errorf("reading the replication settings: %w", err)
	}
	// Without pg_read_all_stats (or superuser) the rows of other roles'
	// walsenders show NULLs: count what can be seen, and say unknown when
	// nothing is visible although the table has rows.
	var total, visible, sync int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(state), count(*) FILTER (WHERE sync_state IN ('sync', 'quorum')) FROM pg_stat_replication`).
		Scan(&total, &visible, &sync); err != nil {
		r.Standbys, r.SyncStandbys = -1, -1
		return r, nil
	}
	r.Standbys, r.SyncStandbys = total, sync
	if total > 0 && visible == 0 {
		r.SyncStandbys = -1
	}
	return r, nil
}
