package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/tenure-dev/tenure/sink"
)

func init() {
	register(command{name: "migrate", summary: "apply (up), revert one (down) or list (status) schema migrations", run: runMigrate})
}

func runMigrate(ctx context.Context, e *env, args []string) error {
	f := newFlagSet(e, "migrate", "[up|down|status] --database-url URL [--schema S] [--force]\n"+
		"    | --print-roles [--schema S] [--worker-role R] [--admin-role R]\n\n"+
		"up (the default) applies every pending migration, down reverts the newest one, status lists them;\n"+
		"down refuses while the schema holds fencing state (workers use it), saying what would be lost, unless --force;\n"+
		"--print-roles prints the SQL that creates least-privilege roles for the schema (connects nowhere);\n"+
		"flags may come before or after the action.")
	dbURL := f.String("database-url", "", "PostgreSQL URL (libpq PG* variables fill in what it leaves out)")
	schema := f.String("schema", sink.DefaultSchema, "Postgres schema of tenure's tables")
	force := f.Bool("force", false, "down: revert even while the schema holds fencing state, losing what the migration drops")
	printRoles := f.Bool("print-roles", false, "print the SQL that creates a worker role (reads and writes the schema's rows, nothing else) and a read-only admin role; run it as the schema's owner after migrate up")
	workerRole := f.String("worker-role", "tenure_worker", "--print-roles: the workers' role")
	adminRole := f.String("admin-role", "tenure_admin", "--print-roles: the read-only role of the admin commands that only read")
	if err := f.parse(args, 1); err != nil {
		return err
	}
	if *printRoles {
		if len(f.positional) > 0 {
			return usagef("--print-roles takes no action (%s)", f.positional[0])
		}
		if err := sink.ValidateSchema(*schema); err != nil {
			return usageError{msg: err.Error()}
		}
		for _, r := range []struct{ flag, name string }{{"worker-role", *workerRole}, {"admin-role", *adminRole}} {
			if err := validRoleName(r.name); err != nil {
				return usagef("--%s: %v", r.flag, err)
			}
		}
		if *workerRole == *adminRole {
			return usagef("--worker-role and --admin-role must differ")
		}
		_, err := io.WriteString(e.stdout, rolesSQL(*schema, *workerRole, *adminRole))
		return err
	}
	action := "up"
	if len(f.positional) == 1 {
		action = f.positional[0]
	}
	if action != "up" && action != "down" && action != "status" {
		return usagef("unknown action %q: use up, down or status", action)
	}
	if *force && action != "down" {
		return usagef("--force goes with down")
	}
	if err := required("database-url", *dbURL); err != nil {
		return err
	}
	if err := sink.ValidateSchema(*schema); err != nil {
		return usageError{msg: err.Error()}
	}
	pool, err := openDB(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	switch action {
	case "up":
		applied, err := sink.Migrate(ctx, pool, *schema)
		if err != nil {
			return err
		}
		if len(applied) == 0 {
			fmt.Fprintf(e.stdout, "schema %s is up to date\n", *schema)
		}
		for _, v := range applied {
			fmt.Fprintf(e.stdout, "applied migration %03d to schema %s\n", v, *schema)
		}
	case "down":
		v, err := sink.MigrateDown(ctx, pool, *schema, sink.MigrateDownOptions{Force: *force})
		if errors.Is(err, sink.ErrSchemaInUse) {
			return fmt.Errorf("%v; stop them first, then run `tenure migrate down --schema %s --force` if that loss is intended", err, *schema)
		}
		if err != nil {
			return err
		}
		if v == 0 {
			fmt.Fprintf(e.stdout, "schema %s has no migrations to revert\n", *schema)
			break
		}
		fmt.Fprintf(e.stdout, "reverted migration %03d of schema %s", v, *schema)
		for _, m := range sink.Migrations() {
			if m.Version == v && len(m.Drops()) > 0 {
				fmt.Fprintf(e.stdout, " (dropped %s)", strings.Join(m.Drops(), ", "))
			}
		}
		fmt.Fprintln(e.stdout)
	case "status":
		st, err := sink.MigrationStatus(ctx, pool, *schema)
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
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
