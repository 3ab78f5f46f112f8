package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tenure-dev/tenure/export"
	"github.com/tenure-dev/tenure/internal/jobs"
)

const exportStoreUsage = "the object store (file:///path or s3://bucket/prefix?endpoint=URL&region=R)"

// exportsGet is `tenure admin exports get KEY`.
type exportsGet struct {
	admin
	storeURL, key string
}

func (c *exportsGet) define(f *flagSet) {
	c.withDB(f)
	f.String(&c.storeURL, "export-store", "", exportStoreUsage+" (default: the one recorded with the publication)", arg("URL"))
	c.withOutput(f, "bytes (the published bytes, exactly) or json (the metadata)", "bytes", "json")
}

func (c *exportsGet) check(args []string) error {
	if len(args) != 1 {
		return usagef("give the export's key (see `tenure admin exports list`)")
	}
	c.key = args[0]
	return nil
}

func (c *exportsGet) run(ctx context.Context) error {
	pool, err := c.Pool()
	if err != nil {
		return err
	}
	p, err := export.Lookup(ctx, pool, c.schema, c.key)
	if errors.Is(err, export.ErrNoExport) {
		return c.noExport(ctx)
	}
	if err != nil {
		err = c.dbError("reading the export pointer", err)
		if where := c.elsewhere(ctx); where != "" {
			err = fmt.Errorf("%v; %s", err, where)
		}
		return err
	}
	if c.output == "json" {
		return c.json(p)
	}
	where := c.storeURL
	if where == "" {
		where = p.Store // recorded with the publication
	}
	st, err := export.Open(ctx, where)
	if err != nil {
		return err
	}
	b, _, err := export.Get(ctx, pool, c.schema, st, c.key)
	if err != nil {
		var mm *export.MismatchError
		if errors.As(err, &mm) {
			return fmt.Errorf("key %q: %v; the bytes were not printed", printableString(c.key), err)
		}
		return fmt.Errorf("key %q: reading %s from %s: %v", printableString(c.key), p.Object, where, err)
	}
	_, err = c.stdout.Write(b)
	return err
}

// exportsList is `tenure admin exports list`.
type exportsList struct {
	admin
	group, prefix string
	limit         int
}

func (c *exportsList) define(f *flagSet) {
	c.withDB(f)
	f.String(&c.group, "group", "", "only the exports published by this consumer group", arg("G"))
	f.String(&c.prefix, "prefix", "", "only keys starting with this", arg("P"))
	f.Int(&c.limit, "limit", 1000, "show at most this many keys")
	c.withTableOutput(f)
}

func (c *exportsList) check([]string) error { return checkLimit(c.limit) }

func (c *exportsList) run(ctx context.Context) error {
	pool, err := c.Pool()
	if err != nil {
		return err
	}
	ps, err := export.List(ctx, pool, c.schema, export.ListFilter{Group: c.group, Prefix: c.prefix, Limit: c.limit})
	if err != nil {
		return c.dbError("reading the export pointers", err)
	}
	if c.output == "json" {
		if ps == nil {
			ps = []export.Pointer{}
		}
		if table := c.tableNote(ctx); table != "" {
			fmt.Fprintf(c.stderr, "not listed: %s\n", table)
		}
		return c.json(ps)
	}
	tw := c.table()
	fmt.Fprintln(tw, "KEY\tVERSION\tJOB\tTOKEN\tSIZE\tSHA256\tPUBLISHED_AT\tOBJECT")
	for _, p := range ps {
		fmt.Fprintf(tw, "%s\t%d\t%s/%d/%d\t%s\t%d\t%s\t%s\t%s\n", clip(printableString(p.Key), 32), p.Version, p.Topic, p.Partition, p.Offset,
			p.Token, p.Size, p.SHA256[:12], p.PublishedAt.Format("2006-01-02 15:04:05Z"), printableString(p.Object))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(ps) == c.limit {
		fmt.Fprintf(c.stderr, "showing the first %d keys; there may be more (--limit)\n", c.limit)
	}
	table := c.tableNote(ctx)
	switch {
	case len(ps) == 0 && table != "":
		c.nothingListed("exports in an object store", table)
	case len(ps) == 0:
		c.nothingListed("exports", "")
	case table != "":
		fmt.Fprintf(c.stderr, "besides these exports in an object store, %s\n", table)
	}
	return nil
}

// The export handler has two outputs: without --export-store it writes
// each key's export to the exports table of the schema (internal/jobs),
// with one it publishes objects in the store through export_pointers
// (package export), which is what the exports commands read. They say
// where the table's rows are, rather than "no exports" while it holds
// some.

// tableNote says how many rows (of --group, under --prefix) the exports
// table holds, and how to read them; "" when it holds none or cannot be
// read.
func (c *exportsList) tableNote(ctx context.Context) string {
	n, err := jobs.CountTableExports(ctx, c.pool, c.schema, c.prefix, c.group)
	if err != nil || n == 0 {
		return ""
	}
	q := pgx.Identifier{c.schema}.Sanitize() + ".exports"
	// One row per group, topic and key (migration 017).
	return fmt.Sprintf("the exports table %s holds %s (one per group, topic and key) written by the export handler without --export-store, rows rather than objects in a store: "+
		"read them with %s", q, plural(int(n), "export"), jobs.TableExportsQuery(c.schema))
}

// noExport says that the key has no published export in --schema, and
// where it is if it is elsewhere: in the exports table (written without a
// store; a row per group and topic that wrote the key), or published in
// another tenure schema of the database.
func (c *exportsGet) noExport(ctx context.Context) error {
	key := printableString(c.key)
	msg := fmt.Sprintf("key %q has no published export in schema %q", key, c.schema)
	q := pgx.Identifier{c.schema}.Sanitize() + ".exports"
	if rows, err := jobs.ExportsOf(ctx, c.pool, c.schema, c.key); err == nil && len(rows) > 0 {
		var each []string
		for _, r := range rows {
			each = append(each, fmt.Sprintf("group %s, topic %s: version %d, job %s/%d/%d, token %s",
				printableString(r.Group), printableString(r.Topic), r.Version, printableString(r.Topic), r.Partition, r.Offset, r.Token))
		}
		return fmt.Errorf("%s (an object store's, which this command reads); the export handler without --export-store wrote it to the exports table %s "+
			"(%s): read it with SELECT consumer_group, topic, job_value FROM %s WHERE job_key = '%s'",
			msg, q, strings.Join(each, "; "), q, strings.ReplaceAll(key, "'", "''"))
	}
	if where := c.elsewhere(ctx); where != "" {
		return fmt.Errorf("%s; %s", msg, where)
	}
	if schemas, err := tenureSchemas(ctx, c.pool); err == nil {
		return fmt.Errorf("%s (see `tenure admin exports list`; schemas with tenure tables: %s)", msg, schemaList(schemas))
	}
	return fmt.Errorf("%s (see `tenure admin exports list`)", msg)
}

// elsewhere names the other tenure schemas of the database where the key
// has a published export, and the command that reads it there ("": none).
func (c *exportsGet) elsewhere(ctx context.Context) string {
	if c.pool == nil {
		return ""
	}
	schemas, err := tenureSchemas(ctx, c.pool)
	if err != nil {
		return ""
	}
	var found []string
	for _, s := range otherSchemas(schemas, c.schema) {
		if _, err := export.Lookup(ctx, c.pool, s, c.key); err == nil {
			found = append(found, s)
		}
	}
	if len(found) == 0 {
		return ""
	}
	has := "schema " + found[0] + " has one"
	if len(found) > 1 {
		has = "schemas " + strings.Join(found, ", ") + " have one"
	}
	return fmt.Sprintf("%s: `tenure admin exports get %s --schema %s`", has, shellWord(c.key), found[0])
}

// shellWord quotes s for a shell when it needs it (printable, as a
// message shows it).
func shellWord(s string) string {
	s = printableString(s)
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./:,@%+=") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// exportsGC is `tenure admin exports gc`.
type exportsGC struct {
	admin
	storeURL string
	keep     int
	dryRun   bool
}

func (c *exportsGC) define(f *flagSet) {
	// A collection lists and deletes as long as it takes: no adminTimeout.
	c.ownTimeouts = true
	c.withDB(f)
	f.String(&c.storeURL, "export-store", "", exportStoreUsage, arg("URL"), required)
	f.Int(&c.keep, "keep", 1, "superseded versions to keep per key besides the visible one (readers that read the pointer just before it moved can still fetch them)")
	f.Bool(&c.dryRun, "dry-run", false, "say what would be deleted, delete nothing")
	c.withTableOutput(f)
}

func (c *exportsGC) check([]string) error {
	if c.keep < 0 {
		return usagef("--keep must not be negative")
	}
	return nil
}

func (c *exportsGC) run(ctx context.Context) error {
	st, err := export.Open(ctx, c.storeURL)
	if err != nil {
		return usageError{msg: err.Error()}
	}
	pool, err := c.Pool()
	if err != nil {
		return err
	}
	stop := startProgress(c.stderr, func(elapsed time.Duration) string {
		return fmt.Sprintf("exports gc: listing and checking the objects of %s, %s so far", st, elapsed.Round(time.Second))
	})
	rep, err := export.GC(ctx, pool, c.schema, st, export.GCOptions{Keep: c.keep, DryRun: c.dryRun})
	stop()
	if err != nil {
		return c.dbError("collecting export objects", err)
	}
	if c.output == "json" {
		if rep.Deleted == nil {
			rep.Deleted = []export.Deletion{}
		}
		return c.json(rep)
	}
	verb, staging := "deleted", "removed"
	if c.dryRun {
		verb, staging = "would delete", "would be removed"
	}
	fmt.Fprintf(c.stdout, "%s %s in %s: %d objects listed, %d visible, %d superseded kept (--keep %d), %d that a live writer may still publish, %d not of schema %s (untouched); %s %s\n",
		verb, plural(len(rep.Deleted), "object"), st, rep.Listed, rep.Visible, rep.Kept, c.keep, rep.MayPublish, rep.Foreign, c.schema,
		plural(rep.Staging, "abandoned staging file"), staging)
	for _, d := range rep.Deleted {
		fmt.Fprintf(c.stdout, "  %s  (%s)\n", printableString(d.Object), d.Reason)
	}
	return nil
}
