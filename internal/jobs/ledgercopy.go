package jobs

import (
	"bytes"
	"encoding/binary"
	"io"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tenure-dev/tenure/consumer"
)

// The ledger's rows in PostgreSQL's binary COPY format, encoded here rather
// than by pgx. pgx's CopyFrom looks an encode plan up for every value (two
// map lookups and a reflect.TypeOf) and the rows it takes are [][]any, whose
// boxed offsets and key strings were most of the worker's allocations: in
// the worker's CPU profile at 12 partitions pgx's encoding was about a third
// of the worker's CPU and the collector a fifth. The column types are fixed
// (migration 002 and later), so each row is a few appends into a buffer
// that is reused from batch to batch.
//
// The rows are encoded as COPY reads them, a chunk at a time (ledgerRows),
// not all at once: a transaction that spans partitions carries up to
// --commit-span batches (64 of 1,000 jobs by default, about 6 MB encoded),
// and encoded whole each was a buffer grown to that size (the collector's
// work, and a worker's peak memory with four such transactions at once),
// where a chunk is ledgerChunk whatever the span.
//
// The bytes sent are what pgx sends for the rows the Tx.CopyFrom path
// builds (TestLedgerEncodingsWriteTheSameRows compares the tables).

// ledgerColumns are the columns the ledger handler writes, in the order of
// each encoded row.
var ledgerColumns = []string{"topic", "partition", "job_offset", "job_key", "job_key_bytes", "incarnation", "epoch", "worker"}

// copyHeader starts a binary COPY stream: the signature, no flags, no
// header extension.
var copyHeader = []byte("PGCOPY\n\377\r\n\000\x00\x00\x00\x00\x00\x00\x00\x00")

// ledgerChunk is how many bytes of rows ledgerRows encodes at a time, at
// least: pgx reads the stream in reads of 64 KiB.
var ledgerChunk = 64 << 10

// ledgerRows is a binary COPY stream of batches' rows, header and trailer
// included, encoded as it is read: at most about ledgerChunk bytes (and
// one row) at a time.
type ledgerRows struct {
	worker  string
	batches []*consumer.Batch
	b, i    int // the next row: batches[b].Records[i]
	buf     []byte
	off     int // buf[off:] is encoded and not yet read
	ended   bool
}

// reset makes r the stream of batches' rows, keeping its buffer.
func (r *ledgerRows) reset(worker string, batches []*consumer.Batch) {
	*r = ledgerRows{worker: worker, batches: batches, buf: append(r.buf[:0], copyHeader...)}
}

// Read implements io.Reader. It fills p across chunks: pgx sends each
// read as a CopyData message of its own, and a read that stopped at a
// chunk's end sent a message of the chunk's last few rows after each full
// one.
func (r *ledgerRows) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		if r.off == len(r.buf) {
			if r.ended {
				break
			}
			r.fill()
			continue
		}
		c := copy(p[n:], r.buf[r.off:])
		r.off += c
		n += c
	}
	if n == 0 && len(p) > 0 {
		return 0, io.EOF
	}
	return n, nil
}

// fill encodes the next rows into the buffer, once it has been read: up to
// ledgerChunk bytes, then the trailer (a row of -1 fields) after the last.
func (r *ledgerRows) fill() {
	r.buf, r.off = r.buf[:0], 0
	for len(r.buf) < ledgerChunk && r.b < len(r.batches) {
		b := r.batches[r.b]
		if r.i == len(b.Records) {
			r.b, r.i = r.b+1, 0
			continue
		}
		r.buf = appendLedgerRow(r.buf, b, b.Records[r.i], r.worker)
		r.i++
	}
	if r.b == len(r.batches) {
		r.buf = binary.BigEndian.AppendUint16(r.buf, 0xFFFF)
		r.ended = true
	}
}

// ledgerStreams holds streams between transactions: the lanes call Handle
// concurrently, and each takes one while it encodes and sends.
var ledgerStreams = sync.Pool{New: func() any { return new(ledgerRows) }}

// maxKeptChunk bounds what a stream's buffer may keep when it goes back to
// the pool: a row of unusually large keys should not pin its memory for
// good.
const maxKeptChunk = 1 << 20

// appendLedgerRow appends the row of r, a record of b, to buf.
func appendLedgerRow(buf []byte, b *consumer.Batch, r *kgo.Record, worker string) []byte {
	buf = binary.BigEndian.AppendUint16(buf, uint16(len(ledgerColumns)))
	buf = appendText(buf, r.Topic)
	buf = appendInt32(buf, r.Partition)
	buf = appendInt64(buf, r.Offset)
	buf = appendKeyText(buf, r.Key)
	if r.Key == nil {
		// pgx writes a nil []byte as NULL (and an empty one as '').
		buf = binary.BigEndian.AppendUint32(buf, 0xFFFFFFFF)
	} else {
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(r.Key)))
		buf = append(buf, r.Key...)
	}
	buf = appendInt64(buf, b.Token.Incarnation)
	buf = appendInt32(buf, b.Token.Epoch)
	buf = appendText(buf, worker)
	return buf
}

// ledgerKey is the job_key column's text for a key: invalid UTF-8 and NUL
// (which a text column cannot hold) each become U+FFFD. The copy path's
// encoder and the rows path share it.
func ledgerKey(key string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(key, "\uFFFD"), "\x00", "\uFFFD")
}

// appendKeyText appends the job_key field for key: the key's own bytes when
// they are already valid text (nearly always), with no string made.
func appendKeyText(buf, key []byte) []byte {
	if utf8.Valid(key) && bytes.IndexByte(key, 0) < 0 {
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(key)))
		return append(buf, key...)
	}
	return appendText(buf, ledgerKey(string(key)))
}

func appendText(buf []byte, s string) []byte {
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(s)))
	return append(buf, s...)
}

func appendInt32(buf []byte, v int32) []byte {
	buf = binary.BigEndian.AppendUint32(buf, 4)
	return binary.BigEndian.AppendUint32(buf, uint32(v))
}

func appendInt64(buf []byte, v int64) []byte {
	buf = binary.BigEndian.AppendUint32(buf, 8)
	return binary.BigEndian.AppendUint64(buf, uint64(v))
}
