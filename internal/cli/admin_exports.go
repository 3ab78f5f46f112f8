package cli

import (
	"context"
	"errors"
	"fmt"

	"github.com/tenure-dev/tenure/export"
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
		return fmt.Errorf("key %q has no published export in schema %q (see `tenure admin exports list`)", printableString(c.key), c.schema)
	}
	if err != nil {
		return c.dbError("reading the export pointer", err)
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
	c.withOutput(f, "output format: table or json", "table", "json")
}

func (c *exportsList) check([]string) error {
	if c.limit < 1 {
		return usagef("--limit must be at least 1")
	}
	return nil
}

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
	if len(ps) == 0 {
		fmt.Fprintf(c.stderr, "no exports in schema %s\n", c.schema)
	}
	return nil
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
	c.withOutput(f, "output format: table or json", "table", "json")
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
	rep, err := export.GC(ctx, pool, c.schema, st, export.GCOptions{Keep: c.keep, DryRun: c.dryRun})
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
