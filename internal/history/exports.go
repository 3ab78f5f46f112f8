package history

import (
	"context"
	"fmt"
	"sort"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenure-dev/tenure/sink"
)

// Publication is one row of export_publications: what the object-store
// export sink (package export) committed for one job.
type Publication struct {
	ID        int64
	Key       string
	Topic     string
	Partition int32
	Offset    int64
	Token     sink.Token
	Object    string // "" when coalesced
	Outcome   string // moved, superseded, coalesced
	Version   int64  // the pointer's version after the move (moved only)
}

// ExportPointer is a key's current pointer (export_pointers).
type ExportPointer struct {
	Key       string
	Object    string
	Topic     string
	Partition int32
	Offset    int64
	Version   int64
}

// LoadObjectExports adds to h what the object-store export sink recorded
// for h's group: every publication becomes a Write (moved ones with the
// pointer's version, so that CheckWrites checks that the visible export
// never went backwards, over pointer moves), and every job skipped as a
// duplicate job id (effect.Dedup) a Write too (one effect per job).
// It also fills h.Publications and h.Pointers for CheckPointers.
func (h *History) LoadObjectExports(ctx context.Context, pool *pgxpool.Pool, schema, group string) error {
	if err := sink.ValidateSchema(schema); err != nil {
		return err
	}
	q := pgx.Identifier{schema}.Sanitize()
	rows, err := pool.Query(ctx, `SELECT id, export_key, topic, partition, job_offset, incarnation, epoch, coalesce(object, ''), outcome, coalesce(version, 0)
		FROM `+q+`.export_publications WHERE consumer_group = $1 ORDER BY id`, group)
	if err != nil {
		return err
	}
	var p Publication
	if _, err := pgx.ForEachRow(rows, []any{&p.ID, &p.Key, &p.Topic, &p.Partition, &p.Offset, &p.Token.Incarnation, &p.Token.Epoch,
		&p.Object, &p.Outcome, &p.Version}, func() error {
		h.Publications = append(h.Publications, p)
		h.Writes = append(h.Writes, Write{Key: p.Key, Version: p.Version, Topic: p.Topic, Partition: p.Partition, Offset: p.Offset, Token: p.Token})
		return nil
	}); err != nil {
		return err
	}
	rows, err = pool.Query(ctx, `SELECT coalesce(encode(job_key, 'escape'), ''), topic, partition, job_offset, incarnation, epoch
		FROM `+q+`.job_duplicates WHERE consumer_group = $1`, group)
	if err != nil {
		return err
	}
	var w Write
	if _, err := pgx.ForEachRow(rows, []any{&w.Key, &w.Topic, &w.Partition, &w.Offset, &w.Token.Incarnation, &w.Token.Epoch}, func() error {
		h.Writes = append(h.Writes, w)
		return nil
	}); err != nil {
		return err
	}
	rows, err = pool.Query(ctx, `SELECT export_key, object, topic, partition, job_offset, version FROM `+q+`.export_pointers WHERE consumer_group = $1`, group)
	if err != nil {
		return err
	}
	var ep ExportPointer
	_, err = pgx.ForEachRow(rows, []any{&ep.Key, &ep.Object, &ep.Topic, &ep.Partition, &ep.Offset, &ep.Version}, func() error {
		h.Pointers = append(h.Pointers, ep)
		return nil
	})
	return err
}

// CheckPointers verifies the pointer moves of the object-store export sink:
// per key, the moves' versions run 1, 2, 3... with no gap (every move was
// recorded in the transaction that made it); a move from the same
// partition goes to a later offset (the visible export never went
// backwards); no two publications name one object (each staging is
// published at most once); and the current pointer is the last move.
func CheckPointers(pubs []Publication, pointers []ExportPointer) []Violation {
	var out []Violation
	moves := map[string][]Publication{}
	byObject := map[string]Publication{}
	for _, p := range pubs {
		if p.Object != "" {
			if prev, ok := byObject[p.Object]; ok {
				out = append(out, Violation{"export-object-reused", fmt.Sprintf("object %s is named by publication #%d (offset %d) and #%d (offset %d)",
					p.Object, prev.ID, prev.Offset, p.ID, p.Offset)})
			}
			byObject[p.Object] = p
		}
		if p.Outcome == "moved" {
			moves[p.Key] = append(moves[p.Key], p)
		}
	}
	for key, ms := range moves {
		sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
		for i, m := range ms {
			if m.Version != int64(i+1) {
				out = append(out, Violation{"export-pointer", fmt.Sprintf("key %q: move #%d has version %d, want %d", key, m.ID, m.Version, i+1)})
				break
			}
			if i == 0 {
				continue
			}
			a := ms[i-1]
			if a.Topic == m.Topic && a.Partition == m.Partition && m.Offset <= a.Offset {
				out = append(out, Violation{"export-regressed", fmt.Sprintf("key %q: the pointer moved from offset %d (token %s, version %d) back to offset %d (token %s, version %d)",
					key, a.Offset, a.Token, a.Version, m.Offset, m.Token, m.Version)})
			}
		}
	}
	for _, p := range pointers {
		ms := moves[p.Key]
		switch {
		case len(ms) == 0:
			out = append(out, Violation{"export-pointer", fmt.Sprintf("key %q: a pointer (version %d) but no move was recorded", p.Key, p.Version)})
		case ms[len(ms)-1].Object != p.Object || ms[len(ms)-1].Version != p.Version:
			last := ms[len(ms)-1]
			out = append(out, Violation{"export-pointer", fmt.Sprintf("key %q: the pointer names %s (version %d) but the last move was to %s (version %d)",
				p.Key, p.Object, p.Version, last.Object, last.Version)})
		}
	}
	sortViolations(out)
	return out
}

// Observation is what a reader saw of a key's pointer at one moment.
type Observation struct {
	Key       string
	Version   int64
	Topic     string
	Partition int32
	Offset    int64
	Object    string
	// Mismatch is set when the bytes read did not match the recorded size
	// and SHA-256 (the read's error).
	Mismatch string
}

// CheckObservations verifies a reader's observations, in the order it made
// them: per key, the version never goes down and, within one partition, the
// offset never goes back; and no read returned bytes that did not match
// their publication.
func CheckObservations(obs []Observation) []Violation {
	var out []Violation
	last := map[string]Observation{}
	for _, o := range obs {
		if o.Mismatch != "" {
			out = append(out, Violation{"export-bytes", fmt.Sprintf("key %q: %s", o.Key, o.Mismatch)})
		}
		if l, ok := last[o.Key]; ok {
			if o.Version < l.Version {
				out = append(out, Violation{"export-regressed", fmt.Sprintf("key %q: a reader saw version %d after version %d", o.Key, o.Version, l.Version)})
			}
			if o.Topic == l.Topic && o.Partition == l.Partition && o.Offset < l.Offset {
				out = append(out, Violation{"export-regressed", fmt.Sprintf("key %q: a reader saw offset %d after offset %d", o.Key, o.Offset, l.Offset)})
			}
		}
		last[o.Key] = o
	}
	sortViolations(out)
	return out
}
