package jobs

import (
	"bytes"
	"encoding/binary"
	"strings"
	"sync"
	"unicode/utf8"

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
// The bytes sent are what pgx sends for the rows the Tx.CopyFrom path
// builds (TestLedgerEncodingsWriteTheSameRows compares the tables).

// ledgerColumns are the columns the ledger handler writes, in the order of
// each encoded row.
var ledgerColumns = []string{"topic", "partition", "job_offset", "job_key", "job_key_bytes", "incarnation", "epoch", "worker"}

// copyHeader starts a binary COPY stream: the signature, no flags, no
// header extension.
var copyHeader = []byte("PGCOPY\n\377\r\n\000\x00\x00\x00\x00\x00\x00\x00\x00")

// copyBuffer is one batch's encoded rows and the reader COPY takes them
// from, kept together so that neither is allocated per batch.
type copyBuffer struct {
	buf []byte
	r   bytes.Reader
}

// copyBuffers holds the buffers between batches: the lanes call Handle
// concurrently, and each takes one while it encodes and sends.
var copyBuffers = sync.Pool{New: func() any { return new(copyBuffer) }}

// maxKeptCopyBuffer bounds what a buffer may keep when it goes back to the
// pool: a batch of unusually large keys should not pin its memory for good.
const maxKeptCopyBuffer = 4 << 20

// encodeLedger appends the rows of batches, header and trailer included,
// to buf: one COPY stream for all of them.
func encodeLedger(buf []byte, worker string, batches ...*consumer.Batch) []byte {
	buf = append(buf, copyHeader...)
	for _, b := range batches {
		buf = appendLedgerRows(buf, b, worker)
	}
	// The trailer: a row of -1 fields.
	return binary.BigEndian.AppendUint16(buf, 0xFFFF)
}

// appendLedgerRows appends b's rows to buf.
func appendLedgerRows(buf []byte, b *consumer.Batch, worker string) []byte {
	for _, r := range b.Records {
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
	}
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
