package cli

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// roleName is what --worker-role and --admin-role accept: a plain
// identifier, so that the printed SQL needs no quoting to read.
var roleName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

func validRoleName(s string) error {
	if !roleName.MatchString(s) || strings.HasPrefix(s, "pg_") {
		return errors.New("a role name here is 1 to 63 of a-z, 0-9 and _, not starting with a digit or pg_")
	}
	return nil
}

// rolesSQL is the script `tenure migrate --print-roles` prints and
// `tenure migrate up --grant-roles` runs: a worker role that may read and
// write the rows of the schema's tables (and nothing else: no DDL, no
// other schema), and an admin role that may only read them. It is
// idempotent; run it as the schema's owner after every `tenure migrate up`
// (the default privileges cover tables that later migrations create by the
// same owner, but running it again costs nothing).
func rolesSQL(schema, worker, admin string) string {
	q := pgx.Identifier{schema}.Sanitize()
	r := strings.NewReplacer("{{schema}}", q, "{{schema_name}}", schema, "{{worker}}", worker, "{{admin}}", admin)
	return r.Replace(rolesTemplate)
}

// rolesLockKey is the advisory lock `migrate up --grant-roles` holds while
// it runs the roles script. One key for every schema: the roles are the
// server's, shared by the schemas of a database.
func rolesLockKey() int64 {
	h := fnv.New64a()
	h.Write([]byte("tenure.roles"))
	return int64(h.Sum64())
}

// grant is `migrate up --grant-roles`: the roles script, run as the pool's
// role (the one that has just migrated the schema, its owner). The pods
// of a Deployment all run it as they start, at once: PostgreSQL refuses a
// GRANT on an object whose privileges another transaction is changing at
// the same moment ("tuple concurrently updated"), so the script first
// takes a transaction-level advisory lock. It is sent as one
// simple-protocol batch, which PostgreSQL runs as one transaction: the lock
// is held to its end.
func (c *migrateCmd) grant(ctx context.Context, pool *pgxpool.Pool) error {
	script := fmt.Sprintf("SELECT pg_advisory_xact_lock(%d);\n", rolesLockKey()) + rolesSQL(c.schema, c.workerRole, c.adminRole)
	if _, err := pool.Exec(ctx, script, pgx.QueryExecModeSimpleProtocol); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42501" { // insufficient_privilege
			return fmt.Errorf("--grant-roles: %w: run it as the role that owns schema %s's tables (the one that migrated it), and create the roles %s and %s beforehand unless that role may create roles (CREATE ROLE %s LOGIN PASSWORD '...', as deploy/README.md does)",
				err, c.schema, c.workerRole, c.adminRole, c.workerRole)
		}
		return fmt.Errorf("--grant-roles: %w", err)
	}
	fmt.Fprintf(c.stdout, "granted %s (the rows of schema %s) and %s (reading them)\n", c.workerRole, c.schema, c.adminRole)
	// A worker role the script had to create cannot log in: say so here,
	// rather than leave it to the workers' first connection. (The admin
	// role is meant to be granted to people's own login roles.)
	var canLogin bool
	if err := pool.QueryRow(ctx, `SELECT rolcanlogin FROM pg_roles WHERE rolname = $1`, c.workerRole).Scan(&canLogin); err != nil {
		return err
	}
	if !canLogin {
		fmt.Fprintf(c.stdout, "role %s cannot log in: workers log in as roles granted it (GRANT %s TO ...), or ALTER ROLE %s LOGIN PASSWORD '...'\n", c.workerRole, c.workerRole, c.workerRole)
	}
	return nil
}

const rolesTemplate = `-- Least-privilege roles for tenure's schema {{schema}}
-- (printed by: tenure migrate --print-roles --schema {{schema_name}} --worker-role {{worker}} --admin-role {{admin}}).
--
-- Run it as the role that owns the schema (the one that ran
-- ` + "`tenure migrate up`" + `), after migrating; ` + "`tenure migrate up --grant-roles`" + `
-- runs it for you. It is idempotent: run it again after
-- every upgrade. Workers then run with a role that can read and write the
-- rows of the schema's tables and nothing else: no DDL, so migrations stay
-- with the owner (` + "`tenure migrate up`" + ` as a release step; a worker whose
-- schema is current does not try to migrate, one whose schema is behind
-- fails at start saying so).
--
-- Roles that do not exist yet are created without LOGIN, which needs a
-- role that may create roles. To log in as them, create them first, as
-- an administrator (this script then only grants):
--   CREATE ROLE {{worker}} LOGIN PASSWORD '...';
--   CREATE ROLE {{admin}} NOLOGIN;
-- or, after this script, either let them log in:
--   ALTER ROLE {{worker}} LOGIN PASSWORD '...';
-- or grant them to login roles of your own:
--   GRANT {{worker}} TO my_worker_login;
--
-- The hand-off (docs/fencing.md): a new owner ends the session of an older
-- owner frozen in the middle of its transaction with pg_terminate_backend.
-- PostgreSQL allows that between sessions of the same role, and for members
-- of pg_signal_backend. Workers that all log in as {{worker}} need nothing
-- more. Workers that log in as different roles (each granted {{worker}})
-- need:
--   GRANT pg_signal_backend TO {{worker}};
-- (it lets them signal any non-superuser session of the server). Without
-- either, a frozen owner's locks last until idle_in_transaction_session_timeout
-- (the worker says so once).
--
-- Strict hand-off (--strict): batches are prepared and finished as {{worker}}
-- (SET ROLE), since PostgreSQL lets only the role that prepared a
-- transaction, or a superuser, finish it. Login roles granted {{worker}}
-- find it by themselves (or name it: --prepared-role {{worker}}).
--
-- --require-sync-standby reads pg_stat_replication, whose rows other roles
-- cannot see in full without:
--   GRANT pg_read_all_stats TO {{worker}};

DO $$
BEGIN
	IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{{worker}}') THEN
		CREATE ROLE {{worker}} NOLOGIN;
	END IF;
	IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{{admin}}') THEN
		CREATE ROLE {{admin}} NOLOGIN;
	END IF;
END
$$;

GRANT USAGE ON SCHEMA {{schema}} TO {{worker}}, {{admin}};

-- The worker: rows only (its heartbeat row in workers among them). The
-- built-in handlers' tables (exports, ledger) live in this schema too; a
-- handler's own tables in other schemas need their own grants.
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {{schema}} TO {{worker}};
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {{schema}} TO {{worker}};
-- The list of applied migrations is the owner's to write.
REVOKE INSERT, UPDATE, DELETE ON {{schema}}.schema_migrations FROM {{worker}};

-- The admin role reads: tenure admin assignments (the heartbeats too), fences, holds, dlq list
-- and dlq show. The admin commands that change state (holds acknowledge,
-- dlq replay and discard, group delete, topic acknowledge-partitions,
-- fences prune) need the worker role (or the owner).
GRANT SELECT ON ALL TABLES IN SCHEMA {{schema}} TO {{admin}};

-- Tables and sequences that later migrations create (as the same owner).
ALTER DEFAULT PRIVILEGES IN SCHEMA {{schema}} GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {{worker}};
ALTER DEFAULT PRIVILEGES IN SCHEMA {{schema}} GRANT USAGE, SELECT ON SEQUENCES TO {{worker}};
ALTER DEFAULT PRIVILEGES IN SCHEMA {{schema}} GRANT SELECT ON TABLES TO {{admin}};
`
