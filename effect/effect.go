// Package effect helps handlers whose effects land outside Postgres, at
// destinations that cannot check a fencing token: an HTTP API, e-mail, a
// payment. Fencing cannot stop a paused, superseded worker from sending;
// what this package gives is the means to send each operation once in the
// ordinary case and to *reconcile* instead of sending twice after a crash:
//
//   - OperationID: a stable id per job (the producer's job id header, or
//     topic/partition/offset), to pass to the destination as an
//     idempotency key;
//   - Recorder.Intend: written in its own transaction, committed before the
//     handler sends: "operation X may have been sent, by this owner". It
//     survives the crash that loses the batch's transaction, so the next
//     owner finds it and asks the destination instead of sending blindly;
//   - Recorder.Sent: written in the batch's fenced transaction: "operation X
//     was sent and answered". It commits with the job's offset or not at all;
//   - Recorder.Dedup: optional deduplication by a producer-supplied job id
//     header: a repeat of (key, id) is skipped, and the skip recorded, in the
//     batch's fenced transaction.
//
// What each promises and does not is in docs/export.md ("Effects outside
// Postgres").
package effect

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/sink"
)

// DefaultJobIDHeader is the conventional header for producer-supplied job ids.
const DefaultJobIDHeader = "tenure-job-id"

// OperationID is r's stable operation id: the value of header when header
// is not empty and r carries it (non-empty), else consumer.JobID(r)
// (topic/partition/offset). It is the same on every attempt and every
// worker. A job id header also survives a re-produce (a dead letter
// replayed lands at another offset); topic/partition/offset does not.
func OperationID(r *kgo.Record, header string) string {
	if header != "" {
		for _, h := range r.Headers {
			if h.Key == header && len(h.Value) > 0 {
				return string(h.Value)
			}
		}
	}
	return consumer.JobID(r)
}

// Recorder records effects and job ids in tenure's schema.
type Recorder struct {
	pool *pgxpool.Pool // for Intend (its own transaction); may be nil otherwise
	q    string
}

// NewRecorder returns a Recorder for schema. pool is needed by Intend only.
func NewRecorder(pool *pgxpool.Pool, schema string) (*Recorder, error) {
	if schema == "" {
		schema = sink.DefaultSchema
	}
	if err := sink.ValidateSchema(schema); err != nil {
		return nil, err
	}
	return &Recorder{pool: pool, q: pgx.Identifier{schema}.Sanitize()}, nil
}

// State is what is known of an operation.
type State int

const (
	// None: nothing was ever recorded: it was never attempted by a handler
	// that calls Intend.
	None State = iota
	// Attempted: a handler said it was about to send, and no fenced
	// transaction recorded the answer. It may or may not have reached the
	// destination: reconcile (ask the destination by operation id) before
	// sending again.
	Attempted
	// Sent: a fenced transaction recorded that it was sent and answered.
	Sent
)

func (s State) String() string {
	switch s {
	case Attempted:
		return "attempted"
	case Sent:
		return "sent"
	}
	return "none"
}

// Record is what the effects table says about one operation.
type Record struct {
	Group, Operation string
	State            State
	// Attempts counts Intend calls (every worker, every retry).
	Attempts int
	// AttemptedBy and AttemptedToken are the owner of the latest Intend.
	AttemptedBy    string
	AttemptedToken sink.Token
	AttemptedAt    time.Time
	// SentBy, SentToken, SentAt and Detail are set once Sent committed.
	SentBy    string
	SentToken sink.Token
	SentAt    time.Time
	Detail    string
}

// Intend records, in its own transaction committed before it returns, that
// b's owner is about to send operation op for job r, and returns what was
// recorded before this call. Call it right before sending:
//
//   - prev.State == Sent: a fenced transaction already recorded the send;
//     do not send again (this happens when a job is processed again, e.g. a
//     replay, and with job id headers);
//   - prev.State == Attempted: an earlier attempt (perhaps another worker's,
//     perhaps one killed after sending) may have reached the destination:
//     ask the destination about op and send only if it does not know it;
//   - prev.State == None: send.
//
// Intend is not fenced, and needs not be: it only ever says "may have been
// sent", which is true of a zombie's attempt too.
func (r *Recorder) Intend(ctx context.Context, b *consumer.Batch, rec *kgo.Record, op string) (prev Record, err error) {
	if r.pool == nil {
		return Record{}, errors.New("effect: Intend needs the Recorder's pool")
	}
	err = pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		prev, err = r.lookup(ctx, tx, b.Group, op, true)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO `+r.q+`.effect_records AS e
			(consumer_group, operation, topic, partition, job_offset, attempts, attempted_at, attempted_by, attempted_incarnation, attempted_epoch)
			VALUES ($1, $2, $3, $4, $5, 1, now(), $6, $7, $8)
			ON CONFLICT (consumer_group, operation) DO UPDATE SET attempts = e.attempts + 1, attempted_at = now(),
				attempted_by = excluded.attempted_by, attempted_incarnation = excluded.attempted_incarnation,
				attempted_epoch = excluded.attempted_epoch`,
			b.Group, op, rec.Topic, rec.Partition, rec.Offset, b.Owner, b.Token.Incarnation, b.Token.Epoch)
		return err
	})
	if err != nil {
		return Record{}, fmt.Errorf("effect: recording the attempt of %s: %w", op, err)
	}
	return prev, nil
}

// Sent records in tx, the batch's fenced transaction, that op was sent and
// answered (detail: what the destination said, e.g. its id for the
// operation). It commits with the job's offset, under the fence, or not at
// all: after it commits, Intend reports Sent for op.
func (r *Recorder) Sent(ctx context.Context, tx consumer.Tx, b *consumer.Batch, rec *kgo.Record, op, detail string) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+r.q+`.effect_records AS e
		(consumer_group, operation, topic, partition, job_offset, sent_at, sent_by, sent_incarnation, sent_epoch, detail)
		VALUES ($1, $2, $3, $4, $5, now(), $6, $7, $8, $9)
		ON CONFLICT (consumer_group, operation) DO UPDATE SET sent_at = now(), sent_by = excluded.sent_by,
			sent_incarnation = excluded.sent_incarnation, sent_epoch = excluded.sent_epoch, detail = excluded.detail`,
		b.Group, op, rec.Topic, rec.Partition, rec.Offset, b.Owner, b.Token.Incarnation, b.Token.Epoch, detail)
	if err != nil {
		return fmt.Errorf("effect: recording %s as sent: %w", op, err)
	}
	return nil
}

// Querier is what Lookup reads through: a pool, a pgx.Tx or a consumer.Tx.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Lookup returns what is recorded for op in group (State None if nothing).
func (r *Recorder) Lookup(ctx context.Context, q Querier, group, op string) (Record, error) {
	return r.lookup(ctx, q, group, op, false)
}

func (r *Recorder) lookup(ctx context.Context, q Querier, group, op string, forUpdate bool) (Record, error) {
	sql := `SELECT attempts, coalesce(attempted_by, ''), coalesce(attempted_incarnation, 0), coalesce(attempted_epoch, 0),
		coalesce(attempted_at, 'epoch'), coalesce(sent_by, ''), coalesce(sent_incarnation, 0), coalesce(sent_epoch, 0),
		sent_at, coalesce(detail, '') FROM ` + r.q + `.effect_records WHERE consumer_group = $1 AND operation = $2`
	if forUpdate {
		sql += ` FOR UPDATE`
	}
	rec := Record{Group: group, Operation: op}
	var sentAt *time.Time
	err := q.QueryRow(ctx, sql, group, op).Scan(&rec.Attempts, &rec.AttemptedBy, &rec.AttemptedToken.Incarnation, &rec.AttemptedToken.Epoch,
		&rec.AttemptedAt, &rec.SentBy, &rec.SentToken.Incarnation, &rec.SentToken.Epoch, &sentAt, &rec.Detail)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return rec, nil
	case err != nil:
		return rec, err
	case sentAt != nil:
		rec.State, rec.SentAt = Sent, *sentAt
	case rec.Attempts > 0:
		rec.State = Attempted
	}
	return rec, nil
}

// Dedup returns the records of b that carry no job id in header, or whose
// (key, job id) was never seen in b's group; it records the new ids, and
// the repeats as skipped (job_duplicates, with where the id was first
// seen), in tx, the batch's fenced transaction. Within the batch the first
// occurrence wins. Hand the returned records to the handler's work; the
// others are done.
//
// It promises: a repeat of a (key, id) whose first occurrence has committed
// is never processed again, whichever worker meets it, and no id is
// recorded unless the batch that saw it commits. It does not deduplicate
// jobs without the header, nor the same id under two keys (the key decides
// the partition, and so which worker may see it).
func (r *Recorder) Dedup(ctx context.Context, tx consumer.Tx, b *consumer.Batch, header string) ([]*kgo.Record, error) {
	type idKey struct{ key, id string }
	first := map[idKey]*kgo.Record{}
	var withID []*kgo.Record
	var keys [][]byte
	var ids []string
	var offs []int64
	for _, rec := range b.Records {
		id := headerValue(rec, header)
		if id == "" {
			continue
		}
		k := idKey{string(rec.Key), id}
		if _, ok := first[k]; ok {
			continue
		}
		first[k] = rec
		withID = append(withID, rec)
		keys, ids, offs = append(keys, rec.Key), append(ids, id), append(offs, rec.Offset)
	}
	if len(withID) == 0 {
		return b.Records, nil
	}
	// Insert the ids; the ones already there come back with where they were
	// first seen.
	rows, err := tx.Query(ctx, `WITH j AS (
	SELECT * FROM unnest($1::bytea[], $2::text[], $3::bigint[]) AS j(job_key, job_id, job_offset)
), ins AS (
	INSERT INTO `+r.q+`.job_ids (consumer_group, job_key, job_id, topic, partition, job_offset, incarnation, epoch)
	SELECT $4, j.job_key, j.job_id, $5, $6, j.job_offset, $7, $8 FROM j
	ON CONFLICT (consumer_group, job_key, job_id) DO NOTHING
	RETURNING job_key, job_id
)
SELECT j.job_key, j.job_id, s.topic, s.partition, s.job_offset
FROM j JOIN `+r.q+`.job_ids s ON s.consumer_group = $4 AND s.job_key = j.job_key AND s.job_id = j.job_id
WHERE NOT EXISTS (SELECT 1 FROM ins WHERE ins.job_key = j.job_key AND ins.job_id = j.job_id)`,
		keys, ids, offs, b.Group, b.Topic, b.Partition, b.Token.Incarnation, b.Token.Epoch)
	if err != nil {
		return nil, fmt.Errorf("effect: recording job ids: %w", err)
	}
	type firstSeen struct {
		topic     string
		partition int32
		offset    int64
	}
	seen := map[idKey]firstSeen{}
	var (
		key []byte
		id  string
		fs  firstSeen
	)
	if _, err := pgx.ForEachRow(rows, []any{&key, &id, &fs.topic, &fs.partition, &fs.offset}, func() error {
		seen[idKey{string(key), id}] = fs
		return nil
	}); err != nil {
		return nil, fmt.Errorf("effect: recording job ids: %w", err)
	}
	var fresh []*kgo.Record
	var dk [][]byte
	var did, ftopic []string
	var doff, foff []int64
	var fpart []int32
	for _, rec := range b.Records {
		id := headerValue(rec, header)
		if id == "" {
			fresh = append(fresh, rec)
			continue
		}
		k := idKey{string(rec.Key), id}
		f, dup := seen[k]
		if !dup && first[k] != rec {
			fr := first[k]
			dup, f = true, firstSeen{fr.Topic, fr.Partition, fr.Offset}
		}
		if !dup {
			fresh = append(fresh, rec)
			continue
		}
		dk, did, doff = append(dk, rec.Key), append(did, id), append(doff, rec.Offset)
		ftopic, fpart, foff = append(ftopic, f.topic), append(fpart, f.partition), append(foff, f.offset)
	}
	if len(dk) > 0 {
		if _, err := tx.Exec(ctx, `INSERT INTO `+r.q+`.job_duplicates
			(consumer_group, job_key, job_id, topic, partition, job_offset, first_topic, first_partition, first_offset, incarnation, epoch)
			SELECT $1, k, i, $2, $3, o, ft, fp, fo, $4, $5
			FROM unnest($6::bytea[], $7::text[], $8::bigint[], $9::text[], $10::int[], $11::bigint[]) AS u(k, i, o, ft, fp, fo)`,
			b.Group, b.Topic, b.Partition, b.Token.Incarnation, b.Token.Epoch, dk, did, doff, ftopic, fpart, foff); err != nil {
			return nil, fmt.Errorf("effect: recording skipped duplicates: %w", err)
		}
	}
	return fresh, nil
}

func headerValue(r *kgo.Record, header string) string {
	if header == "" {
		return ""
	}
	for _, h := range r.Headers {
		if h.Key == header {
			return string(h.Value)
		}
	}
	return ""
}

// Duplicate is one skipped repeat.
type Duplicate struct {
	Group, JobID   string
	Key            []byte
	Topic          string
	Partition      int32
	Offset         int64
	FirstTopic     string
	FirstPartition int32
	FirstOffset    int64
	Token          sink.Token
	SkippedAt      time.Time
}

// Duplicates lists the skipped repeats of group, oldest first.
func (r *Recorder) Duplicates(ctx context.Context, pool *pgxpool.Pool, group string) ([]Duplicate, error) {
	rows, err := pool.Query(ctx, `SELECT consumer_group, job_id, job_key, topic, partition, job_offset, first_topic, first_partition, first_offset,
		incarnation, epoch, skipped_at FROM `+r.q+`.job_duplicates WHERE consumer_group = $1 ORDER BY id`, group)
	if err != nil {
		return nil, err
	}
	var out []Duplicate
	var d Duplicate
	_, err = pgx.ForEachRow(rows, []any{&d.Group, &d.JobID, &d.Key, &d.Topic, &d.Partition, &d.Offset, &d.FirstTopic, &d.FirstPartition,
		&d.FirstOffset, &d.Token.Incarnation, &d.Token.Epoch, &d.SkippedAt}, func() error {
		out = append(out, d)
		return nil
	})
	return out, err
}
