package jobs_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/internal/jobs"
	"github.com/tenure-dev/tenure/internal/testinfra/testdb"
	"github.com/tenure-dev/tenure/sink"
)

// txOf lets a test hand a handler its own pgx transaction.
type txOf struct{ pgx.Tx }

func (t txOf) Begin(ctx context.Context) (consumer.Savepoint, error) {
	sp, err := t.Tx.Begin(ctx)
	return txOf{sp}, err
}

// testSchema is the test database's pool, a schema of the test's own on
// it, and a context that ends 30s from now or with the test.
func testSchema(t *testing.T) (context.Context, *pgxpool.Pool, string) {
	t.Helper()
	pool := testdb.Pool(t)
	schema := testdb.Schema(t, pool)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx, pool, schema
}

// The export handler keeps every job's exact bytes: a value that is not
// UTF-8 ($'\xff\xfe' used to come back as two U+FFFD), one with NUL bytes
// (which jsonb refuses), and JSON whose spelling jsonb would rewrite. The
// document shows them without altering them either. The ledger keeps keys
// exactly.
func TestBuiltInHandlersKeepTheJobsBytes(t *testing.T) {
	t.Parallel()
	ctx, pool, schema := testSchema(t)
	values := map[string][]byte{
		"not-utf8": []byte("\xff\xfe"),
		"nul":      []byte("a\x00b"),
		"nul-json": []byte(`{"s":"\u0000"}`),
		"json":     []byte(`{"b": 1,  "a": [1.0, 2]}`),
		"text":     []byte("plain text"),
		"empty":    {},
	}
	var recs []*kgo.Record
	for k, v := range values {
		recs = append(recs, &kgo.Record{Topic: "t", Partition: 0, Offset: int64(len(recs)), Key: []byte(k), Value: v})
	}
	b := &consumer.Batch{Group: "g", Topic: "t", Partition: 0, Token: sink.Token{Epoch: 1}, Owner: "o",
		From: 0, To: int64(len(recs)), Records: recs}
	for _, name := range []string{"export", "ledger"} {
		h, err := jobs.New(name, schema, "w")
		if err != nil {
			t.Fatal(err)
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return h.Handle(ctx, txOf{tx}, b) }); err != nil {
			t.Fatalf("%s handler: %v", name, err)
		}
	}
	t.Run("Exports", func(t *testing.T) {
		rows, err := pool.Query(ctx, `SELECT job_key, job_value, document FROM `+pgx.Identifier{schema, "exports"}.Sanitize())
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		var key string
		var value, doc []byte
		if _, err := pgx.ForEachRow(rows, []any{&key, &value, &doc}, func() error {
			n++
			want := values[key]
			if !bytes.Equal(value, want) {
				t.Errorf("%s: job_value %q, want %q", key, value, want)
			}
			shown := documentPayload(t, key, doc, want)
			if !bytes.Equal(shown, want) {
				t.Errorf("%s: the document shows %q, want %q", key, shown, want)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if n != len(values) {
			t.Errorf("%d exports, want %d", n, len(values))
		}
	})
	// The ledger: exact key bytes beside the readable key.
	t.Run("Ledger", func(t *testing.T) {
		var k []byte
		if err := pool.QueryRow(ctx, `SELECT job_key_bytes FROM `+pgx.Identifier{schema, "ledger"}.Sanitize()+
			` WHERE job_key = 'not-utf8'`).Scan(&k); err != nil || string(k) != "not-utf8" {
			t.Errorf("ledger job_key_bytes %q, %v", k, err)
		}
		bad := &consumer.Batch{Group: "g", Topic: "t", Partition: 0, Token: sink.Token{Epoch: 1}, Owner: "o", From: 10, To: 11,
			Records: []*kgo.Record{{Topic: "t", Offset: 10, Key: []byte("k\xff\x00"), Value: []byte("v")}}}
		h, _ := jobs.New("ledger", schema, "w")
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return h.Handle(ctx, txOf{tx}, bad) }); err != nil {
			t.Fatalf("ledger with a key that is not text: %v", err)
		}
		if err := pool.QueryRow(ctx, `SELECT job_key_bytes FROM `+pgx.Identifier{schema, "ledger"}.Sanitize()+
			` WHERE job_offset = 10`).Scan(&k); err != nil || string(k) != "k\xff\x00" {
			t.Errorf("ledger job_key_bytes %q, %v; want the key's exact bytes", k, err)
		}
		h, _ = jobs.New("export", schema, "w")
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return h.Handle(ctx, txOf{tx}, bad) }); !consumer.IsPermanent(err) {
			t.Errorf("export of a key that is not text: %v, want a Permanent error", err)
		}
	})
}

// documentPayload is the job's bytes as an export's document shows them:
// base64, JSON (which jsonb may respace, but which must mean the same as
// want) or a JSON string.
func documentPayload(t *testing.T, key string, doc, want []byte) []byte {
	t.Helper()
	var d struct {
		Payload       json.RawMessage `json:"payload"`
		PayloadBase64 *string         `json:"payload_base64"`
	}
	if err := json.Unmarshal(doc, &d); err != nil {
		t.Fatalf("%s: document %s: %v", key, doc, err)
	}
	var shown []byte
	switch {
	case d.PayloadBase64 != nil:
		var err error
		if shown, err = base64.StdEncoding.DecodeString(*d.PayloadBase64); err != nil {
			t.Fatal(err)
		}
	case json.Valid(want) && len(want) > 0:
		// jsonb may respace JSON; the document must still mean the same.
		var a, b any
		_ = json.Unmarshal(d.Payload, &a)
		_ = json.Unmarshal(want, &b)
		if ab, _ := json.Marshal(a); string(ab) != string(mustJSON(b)) {
			t.Errorf("%s: document payload %s, want %s", key, d.Payload, want)
		}
		return want
	default:
		var s string
		if err := json.Unmarshal(d.Payload, &s); err != nil {
			t.Fatalf("%s: payload %s: %v", key, d.Payload, err)
		}
		shown = []byte(s)
	}
	return shown
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

// The export handler keeps a row per group, topic and key: two groups on
// two topics writing key acme keep a row each (before migration 017 the
// second replaced the first), as do two groups on one topic; a group's
// next write of its key moves its own row on. ExportsOf reads them all.
func TestExportRowPerGroupTopicAndKey(t *testing.T) {
	t.Parallel()
	ctx, pool, schema := testSchema(t)
	h, err := jobs.New("export", schema, "w")
	if err != nil {
		t.Fatal(err)
	}
	write := func(group, topic string, offset int64, value string) {
		t.Helper()
		b := &consumer.Batch{Group: group, Topic: topic, Partition: 0, Token: sink.Token{Epoch: 1}, Owner: "o", From: offset, To: offset + 1,
			Records: []*kgo.Record{{Topic: topic, Partition: 0, Offset: offset, Key: []byte("acme"), Value: []byte(value)}}}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return h.Handle(ctx, txOf{tx}, b) }); err != nil {
			t.Fatalf("%s on %s: %v", group, topic, err)
		}
	}
	write("readme-workers", "readme-jobs", 0, `{"invoice":42}`)
	write("readme-faults", "readme-faults", 0, `{"seq":1}`)
	write("audit", "readme-jobs", 0, `{"invoice":42}`)
	write("readme-workers", "readme-jobs", 5, `{"invoice":43}`)

	got, err := jobs.ExportsOf(ctx, pool, schema, "acme")
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		group, topic string
		version      int64
		offset       int64
	}
	var rows []row
	for _, e := range got {
		rows = append(rows, row{e.Group, e.Topic, e.Version, e.Offset})
	}
	want := []row{{"audit", "readme-jobs", 1, 0}, {"readme-faults", "readme-faults", 1, 0}, {"readme-workers", "readme-jobs", 2, 5}}
	if len(rows) != len(want) {
		t.Fatalf("rows of acme %v, want %v", rows, want)
	}
	for i := range want {
		if rows[i] != want[i] {
			t.Errorf("rows of acme %v, want %v", rows, want)
			break
		}
	}
	var value string
	if err := pool.QueryRow(ctx, `SELECT convert_from(job_value, 'UTF8') FROM `+pgx.Identifier{schema, "exports"}.Sanitize()+
		` WHERE consumer_group = 'readme-faults' AND topic = 'readme-faults' AND job_key = 'acme'`).Scan(&value); err != nil || value != `{"seq":1}` {
		t.Errorf("readme-faults' acme: %q, %v", value, err)
	}
	var versions int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{schema, "export_versions"}.Sanitize()+
		` WHERE job_key = 'acme'`).Scan(&versions); err != nil || versions != 4 {
		t.Errorf("export_versions of acme: %d, %v; want 4", versions, err)
	}
	if n, err := jobs.CountTableExports(ctx, pool, schema, "ac", "audit"); err != nil || n != 1 {
		t.Errorf("CountTableExports(ac, audit) = %d, %v; want 1", n, err)
	}
	if n, err := jobs.CountTableExports(ctx, pool, schema, "", ""); err != nil || n != 3 {
		t.Errorf("CountTableExports of every group = %d, %v; want 3", n, err)
	}
}

// copyTx is txOf with binary COPY, as the lanes' Tx has it: the ledger
// handler then encodes its rows itself instead of through pgx.
type copyTx struct{ txOf }

func (t copyTx) CopyFromBinary(ctx context.Context, table pgx.Identifier, columns []string, data io.Reader) (int64, error) {
	cols := make([]string, len(columns))
	for i, c := range columns {
		cols[i] = pgx.Identifier{c}.Sanitize()
	}
	tag, err := t.Conn().PgConn().CopyFrom(ctx, data, "COPY "+table.Sanitize()+" ("+strings.Join(cols, ", ")+") FROM STDIN BINARY")
	return tag.RowsAffected(), err
}

// ledgerBatch is a batch whose keys and numbers reach every edge of the
// ledger's encoding: no key (NULL bytes) and an empty one, keys that are
// not text (invalid UTF-8, NUL, a lone surrogate), U+FFFD itself, other
// scripts, a long key, and the largest partitions, offsets and tokens.
func ledgerBatch() *consumer.Batch {
	keys := [][]byte{nil, {}, []byte("k"), []byte("\xff\xfe"), []byte("a\x00b"), []byte("k\xff\x00"),
		[]byte("\xed\xa0\x80"), []byte("\uFFFD"), []byte("ключ-鍵"), bytes.Repeat([]byte("x"), 10_000), []byte("\x00")}
	b := &consumer.Batch{Group: "g", Topic: "jobs.eu_1-x", Partition: math.MaxInt32,
		Token: sink.Token{Incarnation: math.MaxInt64, Epoch: math.MaxInt32}, Owner: "o"}
	for i, k := range keys {
		b.Records = append(b.Records, &kgo.Record{Topic: b.Topic, Partition: b.Partition,
			Offset: math.MaxInt64 - int64(len(keys)) + int64(i), Key: k, Value: []byte("v")})
	}
	b.From, b.To = b.Records[0].Offset, b.Records[len(b.Records)-1].Offset+1
	return b
}

// The ledger's own binary encoding writes what pgx's CopyFrom writes for
// the same batches: every column of every row, NULL and empty told apart,
// for one batch (Handle) and for several in one COPY (HandleBatches, the
// rows streamed in chunks: the second batch alone is several of them).
func TestLedgerEncodingsWriteTheSameRows(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b := ledgerBatch()
	many := &consumer.Batch{Group: "g", Topic: "jobs.eu_1-x", Partition: 3, Token: sink.Token{Incarnation: 2, Epoch: 5}, Owner: "o"}
	for i := range 5000 {
		many.Records = append(many.Records, &kgo.Record{Topic: many.Topic, Partition: many.Partition,
			Offset: int64(i), Key: fmt.Appendf(nil, "key-%d", i), Value: []byte("v")})
	}
	many.From, many.To = 0, 5000
	// Twice each: the second time's rows are encoded into the stream the
	// first one left in the pool.
	read := func(name string, wrap func(pgx.Tx) consumer.Tx) []string {
		schema := testdb.Schema(t, pool)
		h, err := jobs.New("ledger", schema, "wörker-1")
		if err != nil {
			t.Fatal(err)
		}
		for _, handle := range []func(tx consumer.Tx) error{
			func(tx consumer.Tx) error { return h.Handle(ctx, tx, b) },
			func(tx consumer.Tx) error {
				return h.(consumer.BatchesHandler).HandleBatches(ctx, tx, []*consumer.Batch{b, many})
			},
		} {
			if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return handle(wrap(tx)) }); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		}
		return testdb.QueryRows(t, ctx, pool, pgx.RowTo[string], `SELECT format('%s|%s|%s|%s|%s|%s|%s|%s|%s', topic, partition, job_offset, job_key,
			encode(job_key_bytes, 'hex'), job_key_bytes IS NULL, incarnation, epoch, worker)
			FROM `+pgx.Identifier{schema, "ledger"}.Sanitize()+` ORDER BY partition, job_offset, job_key`)
	}
	viaPgx := read("pgx's CopyFrom", func(tx pgx.Tx) consumer.Tx { return txOf{tx} })
	own := read("binary COPY", func(tx pgx.Tx) consumer.Tx { return copyTx{txOf{tx}} })
	if want := 2*len(b.Records) + len(many.Records); len(viaPgx) != want {
		t.Fatalf("pgx's CopyFrom wrote %d rows, want %d", len(viaPgx), want)
	}
	if first := viaPgx[len(many.Records)]; !strings.HasSuffix(first, "||t|9223372036854775807|2147483647|wörker-1") {
		t.Errorf("no key: %q, want NULL key bytes", first)
	}
	if len(own) != len(viaPgx) {
		t.Fatalf("binary COPY wrote %d rows, pgx's CopyFrom %d", len(own), len(viaPgx))
	}
	for i := range own {
		if own[i] != viaPgx[i] {
			t.Errorf("row %d: binary COPY wrote\n\t%.200q\npgx's CopyFrom\n\t%.200q", i, own[i], viaPgx[i])
		}
	}
}
