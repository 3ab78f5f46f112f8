package export

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/effect"
	"github.com/tenure-dev/tenure/sink"
)

// Func computes what one job exports. It is called for every job of a
// batch, and again when the batch is retried; it must honour ctx and should
// be a function of the job (its output may be staged more than once; only
// one staging per job is ever published).
type Func func(ctx context.Context, job Job) (Document, error)

// Job is one record handed to a Func, with its fencing context.
type Job struct {
	Record *kgo.Record
	// Batch carries the token (Batch.Token) and owner the job is processed
	// under.
	Batch *consumer.Batch
	// OperationID is the job's stable identity: the producer's job id
	// (Config.JobIDHeader) when the job has one, else topic/partition/offset.
	OperationID string
}

// Document is what a job exports: a key and its bytes, given whole (Bytes)
// or as a stream (Open, called once per staging; the sink spools it to a
// temporary file to hash it before the store sees it).
type Document struct {
	// Key is the export's key: the pointer it moves. Empty means the job's
	// Kafka key. It must be valid UTF-8 without NUL.
	Key   string
	Bytes []byte
	Open  func() (io.ReadCloser, error)
}

// Config configures a Handler.
type Config struct {
	// Store receives the objects. Required.
	Store ObjectStore
	// Schema is tenure's Postgres schema (the pointers live there, beside
	// the fencing rows). Default sink.DefaultSchema.
	Schema string
	// Export computes each job's document. Default: the job's value, under
	// the job's key.
	Export Func
	// Worker names this replica in what it records. Default "worker".
	Worker string
	// Parallelism bounds the objects one batch stages at once. Default 8.
	Parallelism int
	// JobIDHeader, when set, names a record header carrying a producer-
	// supplied job id: a job whose (key, id) was already processed is
	// skipped, and the skip is recorded in the same fenced transaction
	// (effect.Dedup). Empty: no deduplication.
	JobIDHeader string
}

// Handler is the export sink: a consumer.Handler that stages each job's
// document in the object store under an immutable name and moves the key's
// pointer in the batch's fenced transaction.
type Handler struct {
	cfg   Config
	q     string // quoted schema
	dedup *effect.Recorder
	sql   string
}

// NewHandler checks cfg and returns the sink.
func NewHandler(cfg Config) (*Handler, error) {
	if cfg.Store == nil {
		return nil, errors.New("export: Config.Store is required")
	}
	if cfg.Schema == "" {
		cfg.Schema = sink.DefaultSchema
	}
	if err := sink.ValidateSchema(cfg.Schema); err != nil {
		return nil, err
	}
	if cfg.Export == nil {
		cfg.Export = ValueDocument
	}
	if cfg.Worker == "" {
		cfg.Worker = "worker"
	}
	if cfg.Parallelism <= 0 {
		cfg.Parallelism = 8
	}
	h := &Handler{cfg: cfg, q: pgx.Identifier{cfg.Schema}.Sanitize()}
	if cfg.JobIDHeader != "" {
		r, err := effect.NewRecorder(nil, cfg.Schema)
		if err != nil {
			return nil, err
		}
		h.dedup = r
	}
	h.sql = publishSQL(h.q)
	return h, nil
}

// ValueDocument exports the job's exact value bytes under its key.
func ValueDocument(_ context.Context, job Job) (Document, error) {
	return Document{Key: string(job.Record.Key), Bytes: job.Record.Value}, nil
}

// publishSQL moves each staged key's pointer (only forward) and records
// every job's publication, in one statement. The pointer's ON CONFLICT ...
// WHERE is the position check: it runs on the latest committed row (a
// concurrent writer of the same key waits for the row lock and then
// re-checks), so writers arriving in any order leave the pointer at the
// latest position. A move from another log (topic, partition, or topic id:
// a re-created topic) is allowed: offsets of different logs do not compare.
// Within one log, a later log epoch is later whatever its offsets (an
// operator's acknowledgement of a log that lost records starts one, and the
// new jobs sit at reused, lower offsets); within one log epoch, a higher
// offset is later. The log id and epoch ($13, $14) are read from the
// partition's fencing row in the batch's transaction (sink.ReadPartitionLog),
// whose fence checks that the lane's log epoch is still the row's, so only
// the current epoch commits.
func publishSQL(q string) string {
	return `WITH j AS (
	SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::bigint[], $5::bytea[])
		AS j(export_key, job_offset, object, size, sha256)
), up AS (
	INSERT INTO ` + q + `.export_pointers AS p
		(export_key, store, object, consumer_group, topic, partition, log_id, log_epoch, job_offset, incarnation, epoch, size, sha256, worker, version)
	SELECT j.export_key, $6, j.object, $7, $8, $9, $13::uuid, $14::bigint,
		j.job_offset, $10, $11, j.size, j.sha256, $12, 1
	FROM j WHERE j.object IS NOT NULL
	ON CONFLICT (export_key) DO UPDATE SET
		store = excluded.store, object = excluded.object, consumer_group = excluded.consumer_group,
		topic = excluded.topic, partition = excluded.partition, log_id = excluded.log_id, log_epoch = excluded.log_epoch,
		job_offset = excluded.job_offset, incarnation = excluded.incarnation, epoch = excluded.epoch,
		size = excluded.size, sha256 = excluded.sha256, worker = excluded.worker,
		version = p.version + 1, published_at = now()
	WHERE p.topic <> excluded.topic OR p.partition <> excluded.partition
	   OR p.log_id IS DISTINCT FROM excluded.log_id
	   OR coalesce(p.log_epoch, 0) < coalesce(excluded.log_epoch, 0)
	   OR (coalesce(p.log_epoch, 0) = coalesce(excluded.log_epoch, 0) AND p.job_offset < excluded.job_offset)
	RETURNING p.export_key, p.version
)
INSERT INTO ` + q + `.export_publications
	(export_key, consumer_group, topic, partition, job_offset, incarnation, epoch, worker, store, object, size, sha256, outcome, version)
SELECT j.export_key, $7, $8, $9, j.job_offset, $10, $11, $12,
	CASE WHEN j.object IS NULL THEN NULL ELSE $6 END, j.object, j.size, j.sha256,
	CASE WHEN j.object IS NULL THEN 'coalesced' WHEN up.version IS NULL THEN 'superseded' ELSE 'moved' END,
	up.version
FROM j LEFT JOIN up ON up.export_key = j.export_key AND j.object IS NOT NULL`
}

// staged is one job's output, staged or not.
type staged struct {
	rec    *kgo.Record
	key    string
	doc    Document
	last   bool // the batch's last job of its key: the one staged
	object string
	size   int64
	sum    [32]byte
}

// Handle exports the batch: per key, the last job's document is staged
// (intermediate versions inside one transaction are never visible to
// anyone, so they are recorded as coalesced, not stored); then one
// statement moves the pointers and records every job, in tx.
func (h *Handler) Handle(ctx context.Context, tx consumer.Tx, b *consumer.Batch) error {
	recs := b.Records
	if h.dedup != nil {
		fresh, err := h.dedup.Dedup(ctx, tx, b, h.cfg.JobIDHeader)
		if err != nil {
			return err
		}
		recs = fresh
	}
	jobs := make([]*staged, 0, len(recs))
	lastOf := map[string]*staged{}
	for _, r := range recs {
		job := Job{Record: r, Batch: b, OperationID: effect.OperationID(r, h.cfg.JobIDHeader)}
		doc, err := h.cfg.Export(ctx, job)
		if err != nil {
			return err
		}
		key := doc.Key
		if key == "" {
			key = string(r.Key)
		}
		if key == "" {
			return consumer.Permanent(fmt.Errorf("%s: the job has no key and its document names none", consumer.JobID(r)))
		}
		if !utf8.ValidString(key) || bytes.IndexByte([]byte(key), 0) >= 0 {
			return consumer.Permanent(fmt.Errorf("%s: export key is not valid UTF-8 text (or holds a NUL byte)", consumer.JobID(r)))
		}
		if doc.Bytes != nil && doc.Open != nil {
			return consumer.Permanent(fmt.Errorf("%s: the document sets both Bytes and Open", consumer.JobID(r)))
		}
		s := &staged{rec: r, key: key, doc: doc}
		if prev := lastOf[key]; prev != nil {
			prev.last = false
		}
		s.last = true
		lastOf[key] = s
		jobs = append(jobs, s)
	}
	if len(jobs) == 0 {
		return nil
	}
	if err := h.stage(ctx, b, jobs); err != nil {
		return err
	}
	n := len(jobs)
	keys, offs, objs, sizes, sums := make([]string, n), make([]int64, n), make([]*string, n), make([]*int64, n), make([][]byte, n)
	for i, s := range jobs {
		keys[i], offs[i] = s.key, s.rec.Offset
		if s.last {
			obj, size := s.object, s.size
			objs[i], sizes[i], sums[i] = &obj, &size, s.sum[:]
		}
	}
	log, err := sink.ReadPartitionLog(ctx, tx, h.cfg.Schema, sink.Partition{Group: b.Group, Topic: b.Topic, Partition: b.Partition})
	if err != nil {
		return err
	}
	var logID *[16]byte // NULL: a log whose id the claims never saw
	if log.TopicID != ([16]byte{}) {
		logID = &log.TopicID
	}
	_, err = tx.Exec(ctx, h.sql, keys, offs, objs, sizes, sums, h.cfg.Store.String(),
		b.Group, b.Topic, b.Partition, b.Token.Incarnation, b.Token.Epoch, h.cfg.Worker, logID, log.LogEpoch)
	return err
}

// stage writes the last job of each key to the store, a few at a time.
func (h *Handler) stage(ctx context.Context, b *consumer.Batch, jobs []*staged) error {
	scope := Scope(h.cfg.Schema, b.Group)
	sem := make(chan struct{}, h.cfg.Parallelism)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for _, s := range jobs {
		if !s.last {
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			defer func() { <-sem }()
			err := h.stageOne(ctx, b, scope, s)
			if err != nil {
				mu.Lock()
				if first == nil {
					first = err
					cancel()
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if first != nil {
		return first
	}
	return ctx.Err()
}

func (h *Handler) stageOne(ctx context.Context, b *consumer.Batch, scope string, s *staged) error {
	body, size, sum, cleanup, err := materialise(s.doc)
	if err != nil {
		return fmt.Errorf("%s: reading the document: %w", consumer.JobID(s.rec), err)
	}
	defer cleanup()
	pos := Position{Topic: s.rec.Topic, Partition: s.rec.Partition, Offset: s.rec.Offset}
	for range 3 {
		name := Name(s.key, pos, b.Token, scope, NewNonce())
		err := h.cfg.Store.Put(ctx, name, body, size, sum)
		if errors.Is(err, ErrExists) {
			continue // a nonce collision: draw another
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			// The store is down or refuses us: not the job's fault.
			return consumer.Transient(fmt.Errorf("%s: staging the export of key %q in %s: %w", consumer.JobID(s.rec), s.key, h.cfg.Store, err))
		}
		s.object, s.size, s.sum = name, size, sum
		return nil
	}
	return fmt.Errorf("%s: staging the export of key %q: three fresh names already existed", consumer.JobID(s.rec), s.key)
}

// materialise returns a seekable body, its size and SHA-256. A stream is
// spooled to a temporary file (removed by cleanup).
func materialise(doc Document) (io.ReadSeeker, int64, [32]byte, func(), error) {
	if doc.Open == nil {
		return bytes.NewReader(doc.Bytes), int64(len(doc.Bytes)), sha256.Sum256(doc.Bytes), func() {}, nil
	}
	rc, err := doc.Open()
	if err != nil {
		return nil, 0, [32]byte{}, nil, err
	}
	defer rc.Close()
	f, err := os.CreateTemp("", "tenure-export-*")
	if err != nil {
		return nil, 0, [32]byte{}, nil, err
	}
	cleanup := func() { _ = f.Close(); _ = os.Remove(f.Name()) }
	hs := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, hs), rc)
	if err != nil {
		cleanup()
		return nil, 0, [32]byte{}, nil, err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		cleanup()
		return nil, 0, [32]byte{}, nil, err
	}
	return f, n, [32]byte(hs.Sum(nil)), cleanup, nil
}
