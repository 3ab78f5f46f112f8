package main

import (
	"context"
	"errors"
	"fmt"
	"text/tabwriter"

	"github.com/tenure-dev/tenure/export"
)

// exportCommands are the `tenure admin exports` subcommands (admin.go lists
// them with the others).
func exportCommands() []adminCommand {
	return []adminCommand{
		{"exports get", "KEY --database-url URL [--schema S] [--export-store URL] [--output bytes|json]",
			"a key's published export: its bytes (checked against the recorded SHA-256), or its metadata as JSON", runExportsGet},
		{"exports list", "--database-url URL [--schema S] [--group G] [--prefix P] [--limit N] [--output table|json]",
			"the export pointers: per key, the visible object and the job and token that published it", runExportsList},
		{"exports gc", "--database-url URL --export-store URL [--schema S] [--keep N] [--dry-run] [--output table|json]",
			"delete the objects no pointer names and no live writer can still publish (safe while workers run)", runExportsGC},
	}
}

func exportStoreFlag(f *flagSet) *string {
	return f.String("export-store", "", "the object store (file:///path or s3://bucket/prefix?endpoint=URL&region=R)")
}

func runExportsGet(ctx context.Context, e *env, f *flagSet, args []string) error {
	db := addDBFlags(f)
	storeURL := exportStoreFlag(f)
	output := f.String("output", "bytes", "bytes (the published bytes, exactly) or json (the metadata)")
	if err := f.parse(args, 1); err != nil {
		return err
	}
	if len(f.positional) != 1 {
		return usagef("give the export's key (see `tenure admin exports list`)")
	}
	key := f.positional[0]
	if *output != "bytes" && *output != "json" {
		return usagef("--output %q is not bytes or json", *output)
	}
	sch, err := db.check()
	if err != nil {
		return err
	}
	pool, err := openDB(ctx, *db.url)
	if err != nil {
		return err
	}
	defer pool.Close()
	ctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	p, err := export.Lookup(ctx, pool, sch, key)
	if errors.Is(err, export.ErrNoExport) {
		return fmt.Errorf("key %q has no published export in schema %q (see `tenure admin exports list`)", printableString(key), sch)
	}
	if err != nil {
		return storeError(sch, "reading the export pointer", err)
	}
	if *output == "json" {
		return writeJSON(e.stdout, p)
	}
	where := *storeURL
	if where == "" {
		where = p.Store // recorded with the publication
	}
	st, err := export.Open(ctx, where)
	if err != nil {
		return err
	}
	b, _, err := export.Get(ctx, pool, sch, st, key)
	if err != nil {
		var mm *export.MismatchError
		if errors.As(err, &mm) {
			return fmt.Errorf("key %q: %v; the bytes were not printed", printableString(key), err)
		}
		return fmt.Errorf("key %q: reading %s from %s: %v", printableString(key), p.Object, where, err)
	}
	_, err = e.stdout.Write(b)
	return err
}

func runExportsList(ctx context.Context, e *env, f *flagSet, args []string) error {
	db := addDBFlags(f)
	group := f.String("group", "", "only the exports published by this consumer group")
	prefix := f.String("prefix", "", "only keys starting with this")
	limit := f.Int("limit", 1000, "show at most this many keys")
	output := outputFlag(f)
	if err := f.parse(args, 0); err != nil {
		return err
	}
	out, err := output()
	if err != nil {
		return err
	}
	if *limit < 1 {
		return usagef("--limit must be at least 1")
	}
	sch, err := db.check()
	if err != nil {
		return err
	}
	pool, err := openDB(ctx, *db.url)
	if err != nil {
		return err
	}
	defer pool.Close()
	ctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	ps, err := export.List(ctx, pool, sch, export.ListFilter{Group: *group, Prefix: *prefix, Limit: *limit})
	if err != nil {
		return storeError(sch, "reading the export pointers", err)
	}
	if out == "json" {
		if ps == nil {
			ps = []export.Pointer{}
		}
		return writeJSON(e.stdout, ps)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tVERSION\tJOB\tTOKEN\tSIZE\tSHA256\tPUBLISHED_AT\tOBJECT")
	for _, p := range ps {
		fmt.Fprintf(tw, "%s\t%d\t%s/%d/%d\t%s\t%d\t%s\t%s\t%s\n", clip(printableString(p.Key), 32), p.Version, p.Topic, p.Partition, p.Offset,
			p.Token, p.Size, p.SHA256[:12], p.PublishedAt.Format("2006-01-02 15:04:05Z"), printableString(p.Object))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(ps) == *limit {
		fmt.Fprintf(e.stderr, "showing the first %d keys; there may be more (--limit)\n", *limit)
	}
	if len(ps) == 0 {
		fmt.Fprintf(e.stderr, "no exports in schema %s\n", sch)
	}
	return nil
}

func runExportsGC(ctx context.Context, e *env, f *flagSet, args []string) error {
	db := addDBFlags(f)
	storeURL := exportStoreFlag(f)
	keep := f.Int("keep", 1, "superseded versions to keep per key besides the visible one (readers that read the pointer just before it moved can still fetch them)")
	dry := f.Bool("dry-run", false, "say what would be deleted, delete nothing")
	output := outputFlag(f)
	if err := f.parse(args, 0); err != nil {
		return err
	}
	out, err := output()
	if err != nil {
		return err
	}
	if err := required("export-store", *storeURL); err != nil {
		return err
	}
	if *keep < 0 {
		return usagef("--keep must not be negative")
	}
	sch, err := db.check()
	if err != nil {
		return err
	}
	st, err := export.Open(ctx, *storeURL)
	if err != nil {
		return usageError{msg: err.Error()}
	}
	pool, err := openDB(ctx, *db.url)
	if err != nil {
		return err
	}
	defer pool.Close()
	rep, err := export.GC(ctx, pool, sch, st, export.GCOptions{Keep: *keep, DryRun: *dry})
	if err != nil {
		return storeError(sch, "collecting export objects", err)
	}
	if out == "json" {
		if rep.Deleted == nil {
			rep.Deleted = []export.Deletion{}
		}
		return writeJSON(e.stdout, rep)
	}
	verb := "deleted"
	if *dry {
		verb = "would delete"
	}
	fmt.Fprintf(e.stdout, "%s %s in %s: %d objects listed, %d visible, %d superseded kept (--keep %d), %d that a live writer may still publish, %d not of schema %s (untouched); %s\n",
		verb, plural(len(rep.Deleted), "object"), st, rep.Listed, rep.Visible, rep.Kept, *keep, rep.MayPublish, rep.Foreign, sch,
		plural(rep.Staging, "abandoned staging file")+" "+map[bool]string{true: "would be removed", false: "removed"}[*dry])
	for _, d := range rep.Deleted {
		fmt.Fprintf(e.stdout, "  %s  (%s)\n", printableString(d.Object), d.Reason)
	}
	return nil
}
