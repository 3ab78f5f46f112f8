package export

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tenure-dev/tenure/sink"
)

// Pointer is a key's visible export: the object its pointer names and the
// job that published it.
type Pointer struct {
	Key         string     `json:"key"`
	Store       string     `json:"store"`
	Object      string     `json:"object"`
	Group       string     `json:"consumer_group"`
	Topic       string     `json:"topic"`
	Partition   int32      `json:"partition"`
	Offset      int64      `json:"job_offset"`
	Token       sink.Token `json:"-"`
	TokenString string     `json:"token"`
	Size        int64      `json:"size"`
	SHA256      string     `json:"sha256"` // hex
	Worker      string     `json:"worker"`
	Version     int64      `json:"version"`
	PublishedAt time.Time  `json:"published_at"`
}

// Querier is what the read functions read through: a pool or a transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ErrNoExport is returned for a key that has no published export.
var ErrNoExport = errors.New("export: no published export for this key")

const pointerCols = `export_key, store, object, consumer_group, topic, partition, job_offset, incarnation, epoch,
	size, encode(sha256, 'hex'), worker, version, published_at`

func scanPointer(r pgx.Row) (Pointer, error) {
	var p Pointer
	err := r.Scan(&p.Key, &p.Store, &p.Object, &p.Group, &p.Topic, &p.Partition, &p.Offset, &p.Token.Incarnation, &p.Token.Epoch,
		&p.Size, &p.SHA256, &p.Worker, &p.Version, &p.PublishedAt)
	p.TokenString = p.Token.String()
	p.PublishedAt = p.PublishedAt.UTC()
	return p, err
}

// Lookup reads key's pointer in schema: ErrNoExport if it has none.
func Lookup(ctx context.Context, q Querier, schema, key string) (Pointer, error) {
	if err := sink.ValidateSchema(schema); err != nil {
		return Pointer{}, err
	}
	p, err := scanPointer(q.QueryRow(ctx, `SELECT `+pointerCols+` FROM `+pgx.Identifier{schema}.Sanitize()+`.export_pointers WHERE export_key = $1`, key))
	if errors.Is(err, pgx.ErrNoRows) {
		return Pointer{}, ErrNoExport
	}
	return p, err
}

// ListFilter narrows List.
type ListFilter struct {
	Group  string // "" for every group
	Prefix string // keys starting with it
	Limit  int    // 0: no limit
}

// List reads the pointers of schema, by key.
func List(ctx context.Context, q Querier, schema string, f ListFilter) ([]Pointer, error) {
	if err := sink.ValidateSchema(schema); err != nil {
		return nil, err
	}
	sql := `SELECT ` + pointerCols + ` FROM ` + pgx.Identifier{schema}.Sanitize() + `.export_pointers
		WHERE ($1 = '' OR consumer_group = $1) AND starts_with(export_key, $2) ORDER BY export_key`
	if f.Limit > 0 {
		sql += fmt.Sprintf(" LIMIT %d", f.Limit)
	}
	rows, err := q.Query(ctx, sql, f.Group, f.Prefix)
	if err != nil {
		return nil, err
	}
	// nil when there are none, as before
	return pgx.AppendRows[Pointer, []Pointer](nil, rows, func(r pgx.CollectableRow) (Pointer, error) { return scanPointer(r) })
}

// MismatchError is returned when an object's bytes do not match what its
// publication recorded.
type MismatchError struct {
	Object          string
	WantSize, Size  int64
	WantSHA256, SHA string
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("export: object %s does not match its publication: %d bytes with SHA-256 %s, recorded %d bytes with SHA-256 %s",
		e.Object, e.Size, e.SHA, e.WantSize, e.WantSHA256)
}

// Get returns key's published bytes and its pointer, having checked them
// against the size and SHA-256 recorded at publication (a *MismatchError
// otherwise). store is where the object is read (the pointer records the
// store's URL; pass a store opened on it).
//
// If the object is gone when it is read (garbage collection removed a
// version superseded between the two reads), Get reads the pointer again,
// a few times; a pointer whose object stays missing is an error.
func Get(ctx context.Context, q Querier, schema string, store ObjectStore, key string) ([]byte, Pointer, error) {
	var last error
	for range 5 {
		p, err := Lookup(ctx, q, schema, key)
		if err != nil {
			return nil, Pointer{}, err
		}
		b, err := ReadObject(ctx, store, p.Object, p.Size, p.SHA256)
		if errors.Is(err, ErrNotFound) {
			last = err
			continue
		}
		return b, p, err
	}
	return nil, Pointer{}, fmt.Errorf("export: key %q: the object its pointer names is missing from %s: %w", key, store, last)
}

// ReadObject reads object and checks its size and SHA-256 (hex).
func ReadObject(ctx context.Context, store ObjectStore, object string, size int64, sha string) ([]byte, error) {
	rc, err := store.Get(ctx, object)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, size+1))
	if err != nil {
		return nil, fmt.Errorf("export: reading %s: %w", object, err)
	}
	sum := sha256.Sum256(b)
	if got := fmt.Sprintf("%x", sum); int64(len(b)) != size || got != sha {
		return nil, &MismatchError{Object: object, WantSize: size, Size: int64(len(b)), WantSHA256: sha, SHA: got}
	}
	return b, nil
}
