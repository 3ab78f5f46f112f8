package fence

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Header is a Kafka record header.
type Header struct {
	Key   string `json:"key"`
	Value []byte `json:"value"`
}

// headerJSON is a Header as stored in dead_letters.headers (jsonb): the value
// in base64, and the key as a string, or in base64 (key_base64) when it is
// not UTF-8 text without NUL, which a JSON string in jsonb cannot keep
// exactly.
type headerJSON struct {
	Key       *string `json:"key,omitempty"`
	KeyBase64 *string `json:"key_base64,omitempty"`
	Value     []byte  `json:"value"`
}

// MarshalJSON keeps the key's exact bytes (see headerJSON).
func (h Header) MarshalJSON() ([]byte, error) {
	j := headerJSON{Value: h.Value}
	if utf8.ValidString(h.Key) && !strings.ContainsRune(h.Key, 0) {
		j.Key = &h.Key
	} else {
		b := base64.StdEncoding.EncodeToString([]byte(h.Key))
		j.KeyBase64 = &b
	}
	return json.Marshal(j)
}

// UnmarshalJSON reads either form of the key.
func (h *Header) UnmarshalJSON(b []byte) error {
	var j headerJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	h.Value = j.Value
	switch {
	case j.KeyBase64 != nil:
		k, err := base64.StdEncoding.DecodeString(*j.KeyBase64)
		if err != nil {
			return fmt.Errorf("header key_base64: %w", err)
		}
		h.Key = string(k)
	case j.Key != nil:
		h.Key = *j.Key
	default:
		h.Key = ""
	}
	return nil
}

// DeadLetter is a job that failed for good.
type DeadLetter struct {
	ID        int64
	Partition Partition
	Offset    int64
	Key       []byte
	Value     []byte
	Headers   []Header
	Error     string
	Attempts  int
	Token     Token
	Owner     string
	DeadAt    time.Time
	Status    string // dead, replayed, discarded
}

// AddDeadLetter records d inside tx: the caller's fenced transaction, which
// must also Commit the partition past d.Offset so that the job is parked
// exactly when the partition moves on.
//
// Worker protocol: package consumer calls it; not API (see the package doc).
func (s *Store) AddDeadLetter(ctx context.Context, tx pgx.Tx, d DeadLetter) error {
	headers := d.Headers
	if headers == nil {
		headers = []Header{}
	}
	hj, err := json.Marshal(headers)
	if err != nil {
		return err
	}
	// The letter belongs to the partition's log epoch, read from its fencing
	// row in the same transaction, whose fence checks the lane's epoch: a job
	// repeated by an operator's reset may be parked again (migration 014).
	q := quote(s.schema)
	_, err = tx.Exec(ctx, `INSERT INTO `+q+`.dead_letters
		(consumer_group, topic, partition, job_offset, job_key, job_value, headers, error, attempts, incarnation, epoch, owner, log_epoch)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12,
			coalesce((SELECT log_epoch FROM `+q+`.fences WHERE consumer_group = $1 AND topic = $2 AND partition = $3), 0))`,
		d.Partition.Group, d.Partition.Topic, d.Partition.Partition, d.Offset, d.Key, d.Value, hj,
		// The error is for people; a handler's message may quote a job's
		// bytes, which a text column refuses (and then the job could never
		// be parked: dead-lettering would be retried forever).
		validText(d.Error), d.Attempts, d.Token.Incarnation, d.Token.Epoch, d.Owner)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == CodeUniqueViolation && strings.HasPrefix(pgErr.ConstraintName, "dead_letters_") {
		return &DeadLetterExistsError{Partition: d.Partition, Offset: d.Offset}
	}
	if err != nil {
		return fmt.Errorf("dead-lettering %s at offset %d: %w", d.Partition, d.Offset, err)
	}
	return nil
}

// DeadLetterExistsError says that the job is in the dead-letter table
// already, in the partition's current log epoch. A transaction that parked
// it also moved the partition past it, so
// the caller's idea of the stored offset is wrong (a dead-lettering whose
// outcome it did not learn): it matches ErrFenced, and the reaction is the
// same, claim again and go on from the stored offset. If the stored offset
// is not past the job, something moved the offset back without starting a
// new log epoch (an edit of the fencing row by hand).
type DeadLetterExistsError struct {
	Partition Partition
	Offset    int64
}

func (e *DeadLetterExistsError) Error() string {
	return fmt.Sprintf("job %s/%d/%d is in the dead-letter table already (group %q): the partition should be past it",
		e.Partition.Topic, e.Partition.Partition, e.Offset, e.Partition.Group)
}

// Is makes errors.Is(err, ErrFenced) true.
func (e *DeadLetterExistsError) Is(target error) bool { return target == ErrFenced }

// DeadLetterFilter selects dead letters; zero fields match everything.
type DeadLetterFilter struct {
	Group  string
	Topic  string
	Status string
	Limit  int
	// NewestFirst lists the newest Limit dead letters, newest first.
	NewestFirst bool
}

const deadLetterCols = `id, consumer_group, topic, partition, job_offset, job_key, job_value, headers, error, attempts,
	incarnation, epoch, owner, dead_at, status`

// DeadLetters lists dead letters, oldest first (or newest first, with
// f.NewestFirst); at most f.Limit, 1000 when it is not positive.
func (s *Store) DeadLetters(ctx context.Context, f DeadLetterFilter) ([]DeadLetter, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = 1000
	}
	order := "id"
	if f.NewestFirst {
		order = "id DESC"
	}
	rows, err := s.pool.Query(ctx, `SELECT `+deadLetterCols+` FROM `+quote(s.schema)+`.dead_letters
		WHERE ($1 = '' OR consumer_group = $1) AND ($2 = '' OR topic = $2) AND ($3 = '' OR status = $3)
		ORDER BY `+order+` LIMIT $4`, f.Group, f.Topic, f.Status, limit)
	return collect(rows, err, scanDeadLetter)
}

// DeadLetterCounts counts group's dead letters: those still dead (neither
// replayed nor discarded), and all.
func (s *Store) DeadLetterCounts(ctx context.Context, group string) (dead, total int64, err error) {
	err = s.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'dead'), count(*) FROM `+quote(s.schema)+`.dead_letters
		WHERE consumer_group = $1`, group).Scan(&dead, &total)
	return dead, total, err
}

// ErrNoDeadLetter is returned for an id that does not exist.
var ErrNoDeadLetter = errors.New("no such dead letter")

// DeadLetterByID reads one dead letter.
func (s *Store) DeadLetterByID(ctx context.Context, id int64) (DeadLetter, error) {
	d, err := scanDeadLetter(s.pool.QueryRow(ctx, `SELECT `+deadLetterCols+` FROM `+quote(s.schema)+`.dead_letters WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return d, fmt.Errorf("dead letter %d: %w", id, ErrNoDeadLetter)
	}
	return d, err
}

// ReplayFunc re-produces a dead letter's job and says where it landed.
type ReplayFunc func(ctx context.Context, d DeadLetter) (topic string, partition int32, offset int64, err error)

// Replay re-produces dead letter id with produce and records the replay. It
// holds the dead letter's row lock while producing, so two operators cannot
// replay the same job at once; a job already replayed or discarded is
// refused. If produce fails nothing is recorded and the job stays dead.
func (s *Store) Replay(ctx context.Context, id int64, actor string, produce ReplayFunc) (DeadLetter, error) {
	var d DeadLetter
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		d, err = scanDeadLetter(tx.QueryRow(ctx, `SELECT `+deadLetterCols+` FROM `+quote(s.schema)+`.dead_letters WHERE id = $1 FOR UPDATE`, id))
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("dead letter %d: %w", id, ErrNoDeadLetter)
		}
		if err != nil {
			return err
		}
		if d.Status != "dead" {
			return fmt.Errorf("dead letter %d was already %s", id, d.Status)
		}
		topic, part, off, err := produce(ctx, d)
		if err != nil {
			return fmt.Errorf("re-producing dead letter %d: %w", id, err)
		}
		if _, err := tx.Exec(ctx, `UPDATE `+quote(s.schema)+`.dead_letters SET status = 'replayed' WHERE id = $1`, id); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO `+quote(s.schema)+`.dead_letter_actions (dead_letter_id, action, topic, partition, job_offset, actor)
			VALUES ($1, 'replay', $2, $3, $4, $5)`, id, topic, part, off, actor)
		d.Status = "replayed"
		return err
	})
	return d, err
}

// Discard marks dead letter id as discarded and records who did it.
func (s *Store) Discard(ctx context.Context, id int64, actor string) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var status string
		err := tx.QueryRow(ctx, `UPDATE `+quote(s.schema)+`.dead_letters d SET status = 'discarded'
			FROM (SELECT id, status FROM `+quote(s.schema)+`.dead_letters WHERE id = $1 FOR UPDATE) old
			WHERE d.id = old.id RETURNING old.status`, id).Scan(&status)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("dead letter %d: %w", id, ErrNoDeadLetter)
		}
		if err != nil {
			return err
		}
		if status != "dead" {
			return fmt.Errorf("dead letter %d was already %s", id, status)
		}
		_, err = tx.Exec(ctx, `INSERT INTO `+quote(s.schema)+`.dead_letter_actions (dead_letter_id, action, actor) VALUES ($1, 'discard', $2)`, id, actor)
		return err
	})
}

func scanDeadLetter(r pgx.Row) (DeadLetter, error) {
	var d DeadLetter
	var hj []byte
	err := r.Scan(&d.ID, &d.Partition.Group, &d.Partition.Topic, &d.Partition.Partition, &d.Offset, &d.Key, &d.Value, &hj,
		&d.Error, &d.Attempts, &d.Token.Incarnation, &d.Token.Epoch, &d.Owner, &d.DeadAt, &d.Status)
	if err != nil {
		return d, err
	}
	if err := json.Unmarshal(hj, &d.Headers); err != nil {
		return d, fmt.Errorf("dead letter %d headers: %w", d.ID, err)
	}
	return d, nil
}

// DeadLetterAction is one thing an operator did to a dead letter.
type DeadLetterAction struct {
	Action string // "replay" or "discard"
	Actor  string
	At     time.Time // UTC
	// Where a replay sent the job (nil for a discard).
	Topic     *string
	Partition *int32
	Offset    *int64
}

// DeadLetterActions returns what was done to dead letter id, oldest first
// (none for an id that names no dead letter).
func (s *Store) DeadLetterActions(ctx context.Context, id int64) ([]DeadLetterAction, error) {
	rows, err := s.pool.Query(ctx, `SELECT action, actor, at, topic, partition, job_offset FROM `+quote(s.schema)+
		`.dead_letter_actions WHERE dead_letter_id = $1 ORDER BY id`, id)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadLetterAction, error) {
		var a DeadLetterAction
		err := r.Scan(&a.Action, &a.Actor, &a.At, &a.Topic, &a.Partition, &a.Offset)
		a.At = a.At.UTC()
		return a, err
	})
}
