package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/tenure-dev/tenure/sink"
)

var migrateSpec = spec{name: "migrate", args: "[up|down|status]", maxArgs: 1, validArgs: []string{"up", "down", "status"},
	short: "apply (up), revert one (down) or list (status) schema migrations",
	long: `up (the default) applies every pending migration, down reverts the newest one, status lists them;
down refuses while the schema holds fencing state (workers use it), saying what would be lost, unless --force;
--print-roles prints the SQL that creates least-privilege roles for the schema (connects nowhere; --database-url is not needed);
up --grant-roles runs that SQL after migrating, as the same (owner) role: a first deploy and every upgrade in one step;
flags may come before or after the action.`}

// migrateCmd is `tenure migrate`.
type migrateCmd struct {
	admin
	force, printRoles     bool
	grantRoles            bool
	workerRole, adminRole string
	action                string
}

func (c *migrateCmd) define(f *flagSet) {
	// Migrations take what they take: no adminTimeout.
	c.ownTimeouts = true
	f.String(&c.dbURL, "database-url", "", "PostgreSQL URL (libpq PG* variables fill in what it leaves out)", arg("URL"))
	f.String(&c.schema, "schema", sink.DefaultSchema, "Postgres schema of tenure's tables", arg("S"))
	f.Bool(&c.force, "force", false, "down: revert even while the schema holds fencing state, losing what the migration drops (never read from the environment)", destructive)
	f.Bool(&c.printRoles, "print-roles", false, "print the SQL that creates a worker role (reads and writes the schema's rows, nothing else) and a read-only admin role; run it as the schema's owner after migrate up")
	f.Bool(&c.grantRoles, "grant-roles", false, "up: then run the --print-roles SQL as this role (the schema's owner), granting --worker-role and --admin-role their rights on the schema; it creates them (without LOGIN) only if they are missing and this role may create roles")
	f.String(&c.workerRole, "worker-role", "tenure_worker", "--print-roles, --grant-roles: the workers' role", arg("R"))
	f.String(&c.adminRole, "admin-role", "tenure_admin", "--print-roles, --grant-roles: the read-only role of the admin commands that only read", arg("R"))
}

// checkRoles checks the schema and the role names of --print-roles and
// --grant-roles.
func (c *migrateCmd) checkRoles() error {
	if err := sink.ValidateSchema(c.schema); err != nil {
		return err
	}
	for _, r := range []struct{ flag, name string }{{"worker-role", c.workerRole}, {"admin-role", c.adminRole}} {
		if err := validRoleName(r.name); err != nil {
			return usagef("--%s: %v", r.flag, err)
		}
	}
	if c.workerRole == c.adminRole {
		return usagef("--worker-role and --admin-role must differ")
	}
	return nil
}

func (c *migrateCmd) check(args []string) error {
	if c.printRoles {
		if len(args) > 0 {
			return usagef("--print-roles takes no action (%s)", args[0])
		}
		if c.grantRoles {
			return usagef("--print-roles prints the SQL that --grant-roles runs: give one of them")
		}
		return c.checkRoles()
	}
	c.action = "up"
	if len(args) == 1 {
		c.action = args[0]
	}
	if c.action != "up" && c.action != "down" && c.action != "status" {
		return usagef("unknown action %q: use up, down or status", c.action)
	}
	if c.force && c.action != "down" {
		return usagef("--force goes with down")
	}
	if c.grantRoles {
		if c.action != "up" {
			return usagef("--grant-roles goes with up")
		}
		if err := c.checkRoles(); err != nil {
			return err
		}
	}
	if strings.TrimSpace(c.dbURL) == "" {
		return usagef("--database-url is required (or set %s)", envName("database-url"))
	}
	return sink.ValidateSchema(c.schema)
}

func (c *migrateCmd) run(ctx context.Context) error {
	if c.printRoles {
		_, err := io.WriteString(c.stdout, rolesSQL(c.schema, c.workerRole, c.adminRole))
		return err
	}
	pool, err := c.Pool()
	if err != nil {
		return err
	}
	if c.action == "up" || c.action == "down" {
		if pooled, err := pooler(ctx, pool); err != nil || pooled {
			if err == nil {
				err = errMigrateThroughPooler
			}
			return err
		}
	}
	switch c.action {
	case "up":
		applied, err := sink.Migrate(ctx, pool, c.schema)
		if err != nil {
			return err
		}
		if len(applied) == 0 {
			fmt.Fprintf(c.stdout, "schema %s is up to date\n", c.schema)
		}
		for _, v := range applied {
			fmt.Fprintf(c.stdout, "applied migration %03d to schema %s\n", v, c.schema)
		}
		if c.grantRoles {
			return c.grant(ctx, pool)
		}
	case "down":
		v, err := sink.MigrateDown(ctx, pool, c.schema, sink.MigrateDownOptions{Force: c.force})
		if errors.Is(err, sink.ErrSchemaInUse) {
			return fmt.Errorf("%v; stop them first, then run `tenure migrate down --schema %s --force` if that loss is intended", err, c.schema)
		}
		if err != nil {
			return err
		}
		if v == 0 {
			fmt.Fprintf(c.stdout, "schema %s has no migrations to revert\n", c.schema)
			break
		}
		fmt.Fprintf(c.stdout, "reverted migration %03d of schema %s", v, c.schema)
		for _, m := range sink.Migrations() {
			if m.Version == v && len(m.Drops()) > 0 {
				fmt.Fprintf(c.stdout, " (dropped %s)", strings.Join(m.Drops(), ", "))
			}
		}
		fmt.Fprintln(c.stdout)
	case "status":
		st, err := sink.MigrationStatus(ctx, pool, c.schema)
		if err != nil {
			return err
		}
		tw := c.table()
		fmt.Fprintln(tw, "VERSION\tNAME\tAPPLIED")
		for _, m := range st {
			at := "pending"
			if m.Applied {
				at = m.AppliedAt.UTC().Format("2006-01-02 15:04:05Z")
			}
			fmt.Fprintf(tw, "%03d\t%s\t%s\n", m.Version, m.Name, at)
		}
		return tw.Flush()
	}
	return nil
}
