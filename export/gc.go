package export

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenure-dev/tenure/sink"
)

// GCOptions configures GC.
type GCOptions struct {
	// Keep is how many superseded versions of each key to keep besides the
	// visible one (readers that read the pointer just before it moved can
	// still fetch them). 0 keeps only the visible one.
	Keep int
	// DryRun reports what would be deleted and deletes nothing.
	DryRun bool
	// StagingAge is the age below which a staging file (file store) is never
	// removed, locked or not. Default 1 minute.
	StagingAge time.Duration
}

// GCReport says what GC found and did. Deleted holds the names it deleted
// (or would delete, with DryRun), with the reason for each.
type GCReport struct {
	Listed     int // objects listed in the store
	Foreign    int // names this schema did not make (other schemas, other tools): never touched
	Visible    int // named by a pointer
	Kept       int // superseded versions kept by Keep
	MayPublish int // not (yet) published, and a live writer may still publish them
	Deleted    []Deletion
	// Staging is the number of abandoned staging files removed (or that
	// would be).
	Staging int
	DryRun  bool
}

// Deletion is one object GC deleted, and why it could never become visible
// again.
type Deletion struct {
	Object string `json:"object"`
	Reason string `json:"reason"`
}

// GC deletes the objects of schema's groups in store that no pointer names
// and that can never be published. It is safe while workers run:
//
//  1. it reads the fencing rows first: for each partition, the current
//     token and next offset;
//  2. then the pointers (and the Keep latest superseded versions per key);
//  3. then lists the store.
//
// An object staged under token t for partition p at offset o can become
// visible only through a transaction carrying t that commits on p's fencing
// row. If the row held a token above t at step 1, no such transaction will
// ever commit (the claim fenced it: G2/G3), so the object is garbage unless
// step 2 found a pointer on it (the pointer could have moved to it only
// before step 1). If the row held t itself, the owner that staged it may
// still be working on o: but if the row's next offset was already above o
// at step 1, that owner had committed past o, and a lane runs one attempt
// of one batch at a time (an attempt whose COMMIT outcome was lost is
// resolved before the next), so the attempt that staged the object has
// ended without publishing it; another claimant at the same token cannot
// commit (claim ids). One thing moves a partition's next offset down under
// the same token: an operator's acknowledgement of a hold (a log that lost
// records), after which the owner stages jobs at offsets below the one step
// 1 read. Every such acknowledgement starts a new log epoch, so GC reads
// the fencing rows again after listing (step 4) and keeps the objects of a
// partition whose token or log epoch moved since step 1: an object listed
// in step 3 was staged before step 4, and if the log epoch had not moved by
// then, it was staged under the step-1 state the rule relies on. Everything
// else is kept: a token above the row's
// (a claim made after step 1), a row that did not exist at step 1, an
// offset at or above the next offset (the current owner's work in flight),
// and names of groups without fencing rows in schema or not made by this
// sink. A superseded version was published once, by the transaction that
// staged it under its unique name; no other transaction can publish it
// again, so once it is off the pointer and out of Keep it is garbage too.
// docs/export.md walks through the cases.
func GC(ctx context.Context, pool *pgxpool.Pool, schema string, store ObjectStore, opts GCOptions) (GCReport, error) {
	rep := GCReport{DryRun: opts.DryRun}
	if err := sink.ValidateSchema(schema); err != nil {
		return rep, err
	}
	if opts.Keep < 0 {
		return rep, errors.New("export: GCOptions.Keep must not be negative")
	}
	if opts.StagingAge <= 0 {
		opts.StagingAge = time.Minute
	}
	q := pgx.Identifier{schema}.Sanitize()
	fenceStore, err := sink.NewStore(pool, schema)
	if err != nil {
		return rep, err
	}

	// 1. The fencing rows.
	type fenceKey struct {
		scope, topic string
		partition    int32
	}
	type fenceState struct {
		token    sink.Token
		next     int64
		logEpoch int64
	}
	readFences := func() (map[fenceKey]fenceState, map[string]bool, error) {
		fences := map[fenceKey]fenceState{}
		scopes := map[string]bool{}
		rows, err := fenceStore.List(ctx, "")
		if err != nil {
			return nil, nil, fmt.Errorf("export gc: reading the fencing rows: %w", err)
		}
		for _, f := range rows {
			sc := Scope(schema, f.Group)
			scopes[sc] = true
			fences[fenceKey{sc, f.Topic, f.Partition.Partition}] = fenceState{token: f.Token, next: f.NextOffset, logEpoch: f.LogEpoch}
		}
		return fences, scopes, nil
	}
	fences, scopes, err := readFences()
	if err != nil {
		return rep, err
	}

	// 2. What must stay: every pointer's object, and each key's Keep latest
	// superseded versions.
	keep := map[string]string{} // object -> why
	rows, err := pool.Query(ctx, `SELECT object, 'visible' FROM `+q+`.export_pointers
		UNION ALL
		SELECT object, 'kept' FROM (
			SELECT object, row_number() OVER (PARTITION BY export_key ORDER BY version DESC) AS n
			FROM `+q+`.export_publications WHERE outcome = 'moved' AND collected_at IS NULL) v
		WHERE n BETWEEN 2 AND $1 + 1`, opts.Keep)
	if err != nil {
		return rep, err
	}
	var obj, why string
	if _, err := pgx.ForEachRow(rows, []any{&obj, &why}, func() error {
		if keep[obj] != "visible" {
			keep[obj] = why
		}
		return nil
	}); err != nil {
		return rep, fmt.Errorf("export gc: reading the pointers: %w", err)
	}

	// 3. The store. Objects judged by the current token's next offset wait
	// for step 4 (byOffset).
	type candidate struct {
		Deletion
		key fenceKey
	}
	var byOffset []candidate
	err = store.List(ctx, func(o ObjectInfo) error {
		rep.Listed++
		n, err := ParseName(o.Name)
		if err != nil || !scopes[n.Scope] {
			rep.Foreign++
			return nil
		}
		switch keep[o.Name] {
		case "visible":
			rep.Visible++
			return nil
		case "kept":
			rep.Kept++
			return nil
		}
		f, ok := fences[fenceKey{n.Scope, n.Position.Topic, n.Position.Partition}]
		var reason string
		switch {
		case !ok:
			// No fencing row when we looked: the claim that staged it came
			// later (or the row is gone); keep.
		case n.Token.Less(f.token):
			reason = fmt.Sprintf("staged under token %s, below the partition's token %s: no transaction with it can commit", n.Token, f.token)
		case n.Token == f.token && n.Position.Offset < f.next:
			byOffset = append(byOffset, candidate{Deletion{Object: o.Name,
				Reason: fmt.Sprintf("staged under the current token %s at offset %d, below the partition's next offset %d: the transaction that could publish it can no longer commit", n.Token, n.Position.Offset, f.next)},
				fenceKey{n.Scope, n.Position.Topic, n.Position.Partition}})
			return nil
		}
		if reason == "" {
			rep.MayPublish++
			return nil
		}
		rep.Deleted = append(rep.Deleted, Deletion{Object: o.Name, Reason: reason})
		return nil
	})
	if err != nil {
		return rep, fmt.Errorf("export gc: listing %s: %w", store, err)
	}
	// 4. The fencing rows again: a partition whose token or log epoch moved
	// since step 1 may have had its next offset moved down by an operator,
	// and its owner may be about to publish what it staged below the
	// offset step 1 read.
	if len(byOffset) > 0 {
		now, _, err := readFences()
		if err != nil {
			return rep, err
		}
		for _, c := range byOffset {
			if was, is := fences[c.key], now[c.key]; is.token != was.token || is.logEpoch != was.logEpoch {
				rep.MayPublish++
				continue
			}
			rep.Deleted = append(rep.Deleted, c.Deletion)
		}
	}
	sort.Slice(rep.Deleted, func(i, j int) bool { return rep.Deleted[i].Object < rep.Deleted[j].Object })
	if !opts.DryRun {
		for _, d := range rep.Deleted {
			if err := store.Delete(ctx, d.Object); err != nil {
				return rep, err
			}
		}
		if len(rep.Deleted) > 0 {
			names := make([]string, len(rep.Deleted))
			for i, d := range rep.Deleted {
				names[i] = d.Object
			}
			if _, err := pool.Exec(ctx, `UPDATE `+q+`.export_publications SET collected_at = now()
				WHERE object = ANY($1) AND collected_at IS NULL`, names); err != nil {
				return rep, fmt.Errorf("export gc: recording the deletions: %w", err)
			}
		}
	}
	rep.Staging, err = store.CleanStaging(ctx, opts.StagingAge, opts.DryRun)
	if err != nil {
		return rep, fmt.Errorf("export gc: cleaning staging files: %w", err)
	}
	return rep, nil
}
