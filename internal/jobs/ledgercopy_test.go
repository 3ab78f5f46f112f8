package jobs

import (
	"bytes"
	"fmt"
	"io"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tenure-dev/tenure/consumer"
)

// The ledger's COPY stream is the same bytes however it is chunked and
// read: header, every row of every batch once and in order, trailer; and a
// stream taken again from the pool starts afresh.
func TestLedgerRowsChunks(t *testing.T) {
	var batches []*consumer.Batch
	for p, n := range []int{0, 1, 700, 3} {
		b := &consumer.Batch{Topic: "t", Partition: int32(p)}
		for i := range n {
			b.Records = append(b.Records, &kgo.Record{Topic: "t", Partition: int32(p), Offset: int64(i), Key: fmt.Appendf(nil, "key-%d-%d", p, i)})
		}
		batches = append(batches, b)
	}
	var want []byte // the rows appended one after another, whole
	want = append(want, copyHeader...)
	rows := 0
	for _, b := range batches {
		for _, r := range b.Records {
			want = appendLedgerRow(want, b, r, "w")
			rows++
		}
	}
	want = append(want, 0xFF, 0xFF)

	defer func(c int) { ledgerChunk = c }(ledgerChunk)
	for _, chunk := range []int{1, 100, 4096, 1 << 30} {
		for _, read := range []int{1, 7, 65536} {
			ledgerChunk = chunk
			var r ledgerRows
			for round := range 2 { // the second: reset, as from the pool
				r.reset("w", batches)
				got, err := io.ReadAll(onlyN{&r, read})
				if err != nil || !bytes.Equal(got, want) {
					t.Fatalf("chunk %d, reads of %d, round %d: %d bytes (err %v), want the %d of %d rows whole", chunk, read, round, len(got), err, len(want), rows)
				}
			}
		}
	}
	var empty ledgerRows
	empty.reset("w", nil)
	if got, _ := io.ReadAll(&empty); !bytes.Equal(got, append(append([]byte{}, copyHeader...), 0xFF, 0xFF)) {
		t.Errorf("no batches: %q, want the header and the trailer", got)
	}
}

// onlyN reads at most n bytes at a time, as a reader with a small buffer.
type onlyN struct {
	r io.Reader
	n int
}

func (o onlyN) Read(p []byte) (int, error) { return o.r.Read(p[:min(len(p), o.n)]) }
