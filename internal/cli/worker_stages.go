package cli

// --stage-log FILE (benchmarks only): the times of a job's stages in the
// worker, for tenure bench's latency breakdown. Each record's arrival in the
// Kafka client (kgo's buffered hook; a burst of one fetch is written once,
// by its first offset) and each committed batch's formation, handler end
// and commit, all in wall-clock nanoseconds, written to FILE when the
// worker stops:
//
//	F partition first_offset unix_nanos
//	B partition from to formed_nanos handled_nanos committed_nanos

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tenure-dev/tenure/consumer"
)

type stageLog struct {
	mu      sync.Mutex
	fetched []stageFetch
	last    map[int32]stageFetch // the last record buffered per partition
	batches map[stageKey]*stageBatch
	done    []*stageBatch
}

type stageFetch struct {
	partition int32
	offset    int64
	at        int64
}

type stageKey struct {
	partition int32
	from      int64
}

type stageBatch struct {
	partition                  int32
	from, to                   int64
	formed, handled, committed int64
}

func newStageLog() *stageLog {
	return &stageLog{last: map[int32]stageFetch{}, batches: map[stageKey]*stageBatch{}}
}

// OnFetchRecordBuffered is kgo's hook: a record decoded from a fetch
// response. A record that does not continue the partition's previous one,
// or arrives more than 100µs after it, starts a new entry.
func (s *stageLog) OnFetchRecordBuffered(r *kgo.Record) {
	now := time.Now().UnixNano()
	s.mu.Lock()
	prev, ok := s.last[r.Partition]
	f := stageFetch{r.Partition, r.Offset, now}
	if !ok || prev.offset+1 != r.Offset || now-prev.at > int64(100*time.Microsecond) {
		s.fetched = append(s.fetched, f)
	}
	s.last[r.Partition] = f
	s.mu.Unlock()
}

func (s *stageLog) hooks(h consumer.Hooks) consumer.Hooks {
	before, commit, after := h.BeforeBatch, h.BeforeCommit, h.AfterBatch
	h.BeforeBatch = func(ctx context.Context, b *consumer.Batch) {
		now := time.Now().UnixNano()
		s.mu.Lock()
		k := stageKey{b.Partition, b.From}
		if s.batches[k] == nil { // a retry keeps the first formation
			s.batches[k] = &stageBatch{partition: b.Partition, from: b.From, formed: now}
		}
		s.mu.Unlock()
		if before != nil {
			before(ctx, b)
		}
	}
	h.BeforeCommit = func(ctx context.Context, b *consumer.Batch) {
		now := time.Now().UnixNano()
		s.mu.Lock()
		if sb := s.batches[stageKey{b.Partition, b.From}]; sb != nil {
			sb.handled = now
		}
		s.mu.Unlock()
		if commit != nil {
			commit(ctx, b)
		}
	}
	h.AfterBatch = func(b *consumer.Batch, err error) {
		now := time.Now().UnixNano()
		s.mu.Lock()
		k := stageKey{b.Partition, b.From}
		if sb := s.batches[k]; sb != nil && err == nil {
			sb.to, sb.committed = b.To, now
			s.done = append(s.done, sb)
			delete(s.batches, k)
		}
		s.mu.Unlock()
		if after != nil {
			after(b, err)
		}
	}
	return h
}

func (s *stageLog) write(file string) error {
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	s.mu.Lock()
	for _, e := range s.fetched {
		fmt.Fprintf(w, "F %d %d %d\n", e.partition, e.offset, e.at)
	}
	for _, b := range s.done {
		fmt.Fprintf(w, "B %d %d %d %d %d %d\n", b.partition, b.from, b.to, b.formed, b.handled, b.committed)
	}
	s.mu.Unlock()
	if err := w.Flush(); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
