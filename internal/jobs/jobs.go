// Package jobs holds tenure's built-in handlers, the ones `tenure worker
// --handler NAME` runs:
//
//   - export: the paused-worker story's export. For each job's key it overwrites the key's
//     current export (the job's exact value bytes, and a JSON document) and
//     appends a row to export_versions. A row is one per group, topic and
//     key: groups and topics that share a key do not overwrite each other. The write is deliberately naive, a
//     plain overwrite: the fence in the same transaction is what keeps a
//     paused, superseded worker from moving a key's export backwards.
//     With an object store (Options.ExportStore, `--export-store URL`) it is
//     the object-store export protocol instead (package export): the job's
//     exact value bytes are staged under an immutable name, and the key's
//     pointer moves, only forward, in the fenced transaction.
//   - ledger: one row per job, with no unique constraint on the job's position,
//     so a job committed twice would show as two rows. Use it to verify tenure.
//   - noop: commits progress and nothing else (benchmarks, smoke tests).
//
// Their tables are created by sink's migrations, in the same schema as the
// fencing state.
package jobs

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/export"
	"github.com/tenure-dev/tenure/sink"
)

// Names lists the built-in handlers.
func Names() []string {
	n := []string{"export", "ledger", "noop"}
	sort.Strings(n)
	return n
}

// New returns the built-in handler called name, writing to schema. worker is
// recorded with every row it writes (a name for this replica).
func New(name, schema, worker string) (consumer.Handler, error) {
	return NewWith(name, schema, worker, Options{})
}

// Options are the settings some built-in handlers take.
type Options struct {
	// ExportStore, for the export handler: publish through the object
	// store sink (package export) instead of the exports table.
	ExportStore export.ObjectStore
	// JobIDHeader, for the export handler with a store: skip repeats of a
	// producer-supplied job id (effect.Dedup).
	JobIDHeader string
}

// NewWith is New with options.
func NewWith(name, schema, worker string, o Options) (consumer.Handler, error) {
	if err := sink.ValidateSchema(schema); err != nil {
		return nil, err
	}
	if o.ExportStore != nil && name != "export" {
		return nil, fmt.Errorf("an export store is for the export handler, not %q", name)
	}
	q := pgx.Identifier{schema}.Sanitize()
	switch name {
	case "export":
		if o.ExportStore != nil {
			return export.NewHandler(export.Config{Store: o.ExportStore, Schema: schema, Worker: worker, JobIDHeader: o.JobIDHeader})
		}
		return &Export{schema: q, worker: worker}, nil
	case "ledger":
		return &Ledger{schema: schema, worker: worker}, nil
	case "noop":
		return consumer.HandlerFunc(func(context.Context, consumer.Tx, *consumer.Batch) error { return nil }), nil
	}
	return nil, fmt.Errorf("unknown handler %q: choose one of %s", name, strings.Join(Names(), ", "))
}

// ErrNoKey is returned for a job without a key: a job's key decides its
// partition and so its owner, and the export is kept per key.
var ErrNoKey = errors.New("job has no key")

// Export keeps, per group, topic and job key, the current export document
// and the job and token that produced it.
type Export struct {
	schema string // quoted
	worker string
}

// Handle writes one export per record, in one round trip.
func (e *Export) Handle(ctx context.Context, tx consumer.Tx, b *consumer.Batch) error {
	return e.HandleBatches(ctx, tx, []*consumer.Batch{b})
}

// HandleBatches writes the exports of several partitions' batches in one
// round trip (consumer.BatchesHandler: a transaction that spans
// partitions).
func (e *Export) HandleBatches(ctx context.Context, tx consumer.Tx, batches []*consumer.Batch) error {
	// A row per (group, topic, key) (migration 017): another topic's or
	// another group's job of the same key has a row of its own.
	sql := `WITH up AS (
	INSERT INTO ` + e.schema + `.exports AS e
		(consumer_group, job_key, document, job_value, topic, partition, job_offset, incarnation, epoch, worker, version)
	VALUES ($10, $1, $2, $9, $3, $4, $5, $6, $7, $8, 1)
	ON CONFLICT (consumer_group, topic, job_key) DO UPDATE SET
		document = excluded.document, job_value = excluded.job_value, partition = excluded.partition,
		job_offset = excluded.job_offset, incarnation = excluded.incarnation, epoch = excluded.epoch,
		worker = excluded.worker, version = e.version + 1, updated_at = now()
	RETURNING version
)
INSERT INTO ` + e.schema + `.export_versions
	(consumer_group, job_key, version, topic, partition, job_offset, incarnation, epoch, worker)
SELECT $10, $1, version, $3, $4, $5, $6, $7, $8 FROM up`
	var batch pgx.Batch
	for _, b := range batches {
		if err := e.queue(&batch, sql, b); err != nil {
			return err
		}
	}
	return tx.SendBatch(ctx, &batch).Close()
}

// queue queues the statements of b's exports on batch.
func (e *Export) queue(batch *pgx.Batch, sql string, b *consumer.Batch) error {
	for _, r := range b.Records {
		// A job without a usable key can never succeed: park it at once.
		if len(r.Key) == 0 {
			return consumer.Permanent(fmt.Errorf("%s: %w", consumer.JobID(r), ErrNoKey))
		}
		if !utf8.Valid(r.Key) || bytes.IndexByte(r.Key, 0) >= 0 {
			// The export is kept per key in a text column.
			return consumer.Permanent(fmt.Errorf("%s: job key is not valid UTF-8 text (or holds a NUL byte)", consumer.JobID(r)))
		}
		doc := exportDocument{Key: string(r.Key), Job: consumer.JobID(r), Token: b.Token.String(), Worker: e.worker}
		doc.Payload, doc.PayloadBase64 = payload(r.Value)
		dj, err := json.Marshal(doc)
		if err != nil {
			return err
		}
		batch.Queue(sql, string(r.Key), dj, r.Topic, r.Partition, r.Offset,
			b.Token.Incarnation, b.Token.Epoch, e.worker, r.Value, b.Group)
	}
	return nil
}

// exportDocument is the JSON view of an export. The job's exact bytes are in
// the exports.job_value column; the document shows them as JSON when they
// are JSON, as a string when they are other text, and in base64
// (payload_base64) otherwise, never altered.
type exportDocument struct {
	Key           string          `json:"key"`
	Job           string          `json:"job"`
	Token         string          `json:"token"`
	Worker        string          `json:"worker"`
	Payload       json.RawMessage `json:"payload,omitempty"`
	PayloadBase64 string          `json:"payload_base64,omitempty"`
}

// payload renders a job value for the document: JSON as it is, other text
// as a JSON string, and anything jsonb could not keep exactly (bytes that
// are not UTF-8, NUL, which jsonb refuses even as \u0000) in base64.
func payload(v []byte) (json.RawMessage, string) {
	switch {
	case bytes.IndexByte(v, 0) >= 0 || bytes.Contains(v, []byte(`\u0000`)) || !utf8.Valid(v):
		return nil, base64.StdEncoding.EncodeToString(v)
	case len(v) > 0 && json.Valid(v):
		return v, ""
	}
	s, _ := json.Marshal(string(v)) // valid UTF-8: exact
	return s, ""
}

// The built-in handlers that write rows take a joint transaction's batches
// in one call.
var (
	_ consumer.BatchesHandler = (*Ledger)(nil)
	_ consumer.BatchesHandler = (*Export)(nil)
)

// Ledger appends one row per job.
type Ledger struct {
	schema string // unquoted; pgx.Identifier quotes it for COPY
	worker string
}

// Handle copies the batch's rows in with COPY, in the batch's transaction:
// encoded here when the Tx takes binary COPY rows (the lanes' does), by
// pgx's CopyFrom otherwise.
func (l *Ledger) Handle(ctx context.Context, tx consumer.Tx, b *consumer.Batch) error {
	return l.HandleBatches(ctx, tx, []*consumer.Batch{b})
}

// HandleBatches copies the rows of several partitions' batches in one
// COPY (consumer.BatchesHandler: a transaction that spans partitions).
func (l *Ledger) HandleBatches(ctx context.Context, tx consumer.Tx, batches []*consumer.Batch) error {
	table := pgx.Identifier{l.schema, "ledger"}
	bc, ok := tx.(consumer.BinaryCopier)
	if !ok {
		for _, b := range batches {
			if err := l.copyRows(ctx, tx, b); err != nil {
				return err
			}
		}
		return nil
	}
	r := ledgerStreams.Get().(*ledgerRows)
	r.reset(l.worker, batches)
	_, err := bc.CopyFromBinary(ctx, table, ledgerColumns, r)
	// Only a COPY that succeeded gives the stream back. pgx reads the
	// stream in a goroutine of its own, and when the connection breaks
	// mid-COPY (a network error, the context's deadline) it returns
	// without waiting for that goroutine: the goroutine can still be in
	// r.Read, and a lane that took r from the pool would be encoding its
	// batch into the array being read. Left to the collector instead, r
	// goes when the goroutine is done with it.
	if err == nil && cap(r.buf) <= maxKeptChunk {
		r.reset("", nil)
		ledgerStreams.Put(r)
	}
	return err
}

// copyRows is Handle through pgx's CopyFrom, for a Tx that is not a
// BinaryCopier: the rows the binary encoding must match.
func (l *Ledger) copyRows(ctx context.Context, tx consumer.Tx, b *consumer.Batch) error {
	rows := make([][]any, len(b.Records))
	for i, r := range b.Records {
		// job_key is for reading (and the history checker); job_key_bytes
		// keeps the key exactly.
		rows[i] = []any{r.Topic, r.Partition, r.Offset, ledgerKey(string(r.Key)), r.Key,
			b.Token.Incarnation, b.Token.Epoch, l.worker}
	}
	_, err := tx.CopyFrom(ctx, pgx.Identifier{l.schema, "ledger"}, ledgerColumns, pgx.CopyFromRows(rows))
	return err
}

// InjectFaults wraps h for tests and chaos runs: a job whose value contains
// "tenure-fault":"error" makes the handler fail, "panic" makes it panic, and
// "slow" makes it wait for its context to end. Other jobs go to h. A
// consumer.BatchesHandler stays one: a call with several batches fails the
// same way when any of them holds such a job.
func InjectFaults(h consumer.Handler) consumer.Handler {
	f := faulty{h}
	if bh, ok := h.(consumer.BatchesHandler); ok {
		return faultyBatches{f, bh}
	}
	return f
}

type faulty struct{ h consumer.Handler }

func (f faulty) Handle(ctx context.Context, tx consumer.Tx, b *consumer.Batch) error {
	if err := injectedFault(ctx, b); err != nil {
		return err
	}
	return f.h.Handle(ctx, tx, b)
}

type faultyBatches struct {
	faulty
	bh consumer.BatchesHandler
}

func (f faultyBatches) HandleBatches(ctx context.Context, tx consumer.Tx, batches []*consumer.Batch) error {
	for _, b := range batches {
		if err := injectedFault(ctx, b); err != nil {
			return err
		}
	}
	return f.bh.HandleBatches(ctx, tx, batches)
}

// injectedFault does what b's first faulty job asks for, if any.
func injectedFault(ctx context.Context, b *consumer.Batch) error {
	for _, r := range b.Records {
		switch {
		case bytes.Contains(r.Value, []byte(`"tenure-fault":"error"`)):
			return fmt.Errorf("%s: injected failure", consumer.JobID(r))
		case bytes.Contains(r.Value, []byte(`"tenure-fault":"panic"`)):
			panic("injected panic at " + consumer.JobID(r))
		case bytes.Contains(r.Value, []byte(`"tenure-fault":"slow"`)):
			<-ctx.Done()
			return ctx.Err()
		}
	}
	return nil
}
