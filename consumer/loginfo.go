package consumer

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tenure-dev/tenure/sink"
)

// topicLog is what the cluster says of a topic's log now: its identity and
// where each partition's log starts and ends. Offsets stored in Postgres are
// only meaningful against the log they were taken from (docs/fencing.md,
// "The log's identity").
type topicLog struct {
	id         [16]byte // the topic id (zero: the broker does not say)
	partitions int32
	start, end map[int32]int64 // per partition: log start offset, high watermark
}

// topicLogs reads the topics' ids and partition counts (one metadata
// request of its own: kgo's cached metadata can be minutes old) and, when
// offsets is set, every partition's start and end offsets.
//
// Every caller gets a read that started after it called, but callers that
// ask for the same topics on the same client while a read is in flight
// share the next one. Lanes ask at once by the hundreds: every lane whose
// first claim was rejected while a group settled reads the whole topic,
// and at 1,000 partitions that many reads of a thousand partitions' offsets
// at once were a worker's largest memory (about 50 MiB live), and as many
// requests to the brokers.
//
// How a read is shared, per (client, topics, offsets): running is the
// read in flight, next the one that starts when it ends. A caller joins
// next if there is one: next has not started, so its result is newer
// than the call. Otherwise it makes a read, which starts at once if none
// is running, else becomes next. A read leaves next, under the lock,
// before it starts, so no caller joins a read that has already started.
// The read runs on a goroutine and a context of its own (the callers that
// wait for it come and go), bounded by logReadTimeout; each caller waits
// on its own context.
func topicLogs(ctx context.Context, cl *kgo.Client, topics []string, offsets bool) (map[string]*topicLog, error) {
	k := logReadKey{cl: cl, topics: strings.Join(topics, "\x00"), offsets: offsets}
	logReads.mu.Lock()
	rd := logReads.next[k]
	if rd == nil {
		rd = &logRead{done: make(chan struct{})}
		prev := logReads.running[k]
		if prev == nil {
			logReads.running[k] = rd
		} else {
			logReads.next[k] = rd
		}
		go rd.run(context.WithoutCancel(ctx), k, prev, slices.Clone(topics))
	}
	logReads.mu.Unlock()
	select {
	case <-rd.done:
		if rd.err != nil {
			return nil, rd.err
		}
		// Callers replace the map's entries (a claim keeps the newest
		// log it read): each gets its own map; the topicLogs are read only.
		return maps.Clone(rd.logs), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// logReads are the reads of topics' logs in flight and waiting to start
// (topicLogs).
var logReads = struct {
	mu            sync.Mutex
	running, next map[logReadKey]*logRead
}{running: map[logReadKey]*logRead{}, next: map[logReadKey]*logRead{}}

type logReadKey struct {
	cl      *kgo.Client
	topics  string
	offsets bool
}

// logRead is one read of topics' logs; logs and err are set before done
// is closed.
type logRead struct {
	done chan struct{}
	logs map[string]*topicLog
	err  error
}

// logReadTimeout bounds one shared read of topics' logs.
const logReadTimeout = 30 * time.Second

// run waits for prev (the read in flight when this one was made, or nil),
// takes its place and reads.
func (rd *logRead) run(ctx context.Context, k logReadKey, prev *logRead, topics []string) {
	if prev != nil {
		<-prev.done
		logReads.mu.Lock()
		delete(logReads.next, k)
		logReads.running[k] = rd
		logReads.mu.Unlock()
	}
	ctx, cancel := context.WithTimeout(ctx, logReadTimeout)
	rd.logs, rd.err = readTopicLogs(ctx, k.cl, topics, k.offsets)
	cancel()
	logReads.mu.Lock()
	if logReads.running[k] == rd {
		delete(logReads.running, k)
	}
	logReads.mu.Unlock()
	close(rd.done)
}

// readTopicLogs is one read of topicLogs.
func readTopicLogs(ctx context.Context, cl *kgo.Client, topics []string, offsets bool) (map[string]*topicLog, error) {
	req := kmsg.NewPtrMetadataRequest()
	for _, t := range topics {
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(t)
		req.Topics = append(req.Topics, rt)
	}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, err
	}
	out := make(map[string]*topicLog, len(topics))
	for _, t := range resp.Topics {
		if t.Topic == nil {
			continue
		}
		if err := kerr.ErrorForCode(t.ErrorCode); err != nil {
			return nil, fmt.Errorf("topic %q: %w", *t.Topic, err)
		}
		out[*t.Topic] = &topicLog{id: t.TopicID, partitions: int32(len(t.Partitions))}
	}
	for _, t := range topics {
		if out[t] == nil || out[t].partitions <= 0 {
			return nil, fmt.Errorf("topic %q has no partitions in metadata", t)
		}
	}
	if !offsets {
		return out, nil
	}
	adm := kadm.NewClient(cl)
	starts, err := adm.ListStartOffsets(ctx, topics...)
	if err != nil {
		return nil, fmt.Errorf("listing log start offsets: %w", err)
	}
	ends, err := adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		return nil, fmt.Errorf("listing end offsets: %w", err)
	}
	for _, t := range topics {
		tl := out[t]
		tl.start, tl.end = map[int32]int64{}, map[int32]int64{}
		for p := range tl.partitions {
			s, ok := starts.Lookup(t, p)
			e, ok2 := ends.Lookup(t, p)
			if !ok || !ok2 || s.Err != nil || e.Err != nil {
				return nil, fmt.Errorf("offsets of %s/%d: %v %v", t, p, s.Err, e.Err)
			}
			tl.start[p], tl.end[p] = s.Offset, e.Offset
		}
	}
	return out, nil
}

// identityHold compares what a claim returned with the log as it is now,
// and returns the hold the partition needs, or nil if the stored offsets fit
// the log: the topic was not re-created (another topic id), the log has not
// lost records the stored offset says were processed (next offset above the
// log's end), and no job below the log start was skipped (log start above
// the next offset).
func identityHold(key sink.Partition, owner string, claimed sink.Claimed, tl *topicLog) *sink.Hold {
	p := key.Partition
	h := &sink.Hold{Partition: key, Owner: owner, NextOffset: claimed.NextOffset, AckedOffset: -1,
		LogStart: tl.start[p], HighWatermark: tl.end[p], TopicID: tl.id}
	switch {
	case claimed.TopicID != [16]byte{} && tl.id != [16]byte{} && claimed.TopicID != tl.id:
		h.Kind = sink.HoldTopicRecreated
		h.Reason = fmt.Sprintf("topic %q was deleted and re-created: the stored next offset %d belongs to the old log (topic id %s), the log now is topic id %s with offsets %d to %d; "+
			"acknowledging restarts the partition at the new log's start",
			key.Topic, claimed.NextOffset, uuidString(claimed.TopicID), uuidString(tl.id), tl.start[p], tl.end[p])
	case claimed.NextOffset > tl.end[p]:
		h.Kind = sink.HoldAheadOfLog
		h.Reason = fmt.Sprintf("the stored next offset %d is above the log's end %d: the log lost jobs that were processed (a truncated or replaced log), "+
			"and new jobs appended at offsets %d to %d would be skipped; acknowledging moves the next offset down to the log's end",
			claimed.NextOffset, tl.end[p], tl.end[p], claimed.NextOffset-1)
	case tl.start[p] > claimed.NextOffset:
		h.Kind = sink.HoldLogTruncated
		h.Reason = fmt.Sprintf("the log starts at %d, above the stored next offset %d: %d jobs (offsets %d to %d) were deleted (retention, DeleteRecords) before they were processed; "+
			"acknowledging moves the next offset up to the log's start",
			tl.start[p], claimed.NextOffset, tl.start[p]-claimed.NextOffset, claimed.NextOffset, tl.start[p]-1)
	default:
		return nil
	}
	return h
}

// movedLogHold is identityHold for a running lane whose log moved under it
// (lane.checkLogMoved): next is the lane's next offset, topicID the topic id
// it was assigned with, tl the log read now, and evidence the lowest offset
// the log was seen to end at below the lane (-1: none). A log that went back
// below the lane is ahead-of-log even when it has grown past next again by
// the time it is read, since its new jobs sit at reused offsets: the hold
// records the end as it was seen, which is where the acknowledgement moves
// the offset to.
func movedLogHold(key sink.Partition, owner string, next int64, topicID [16]byte, tl *topicLog, evidence int64) *sink.Hold {
	p := key.Partition
	if evidence >= 0 && evidence < tl.end[p] {
		end := maps.Clone(tl.end)
		end[p] = evidence
		tl = &topicLog{id: tl.id, partitions: tl.partitions, start: tl.start, end: end}
	}
	return identityHold(key, owner, sink.Claimed{NextOffset: next, TopicID: topicID}, tl)
}

// claimedLogHold is identityHold for a partition claimed on assignment,
// whose log tl was read before the claim (one read for the whole
// assignment). Until the claim lands, the previous owner is not fenced (the
// window docs/fencing.md does not promise to close): it can still commit jobs
// appended after tl was read, so the claim may return a next offset above
// tl's end although the log lost nothing. A next offset above the end is
// therefore judged against the log read again (reread), after the claim:
// every committed job was fetched from the log, so its end, read now, is
// at or above the stored next offset unless the log really lost records.
// The other holds do not need the second read: a stale log start is lower
// (no false log-truncated hold) and a topic id does not move with time.
// It returns the log it judged by.
func claimedLogHold(ctx context.Context, key sink.Partition, owner string, claimed sink.Claimed, tl *topicLog,
	reread func(context.Context) (*topicLog, error)) (*sink.Hold, *topicLog, error) {
	h := identityHold(key, owner, claimed, tl)
	if h == nil || h.Kind != sink.HoldAheadOfLog {
		return h, tl, nil
	}
	fresh, err := reread(ctx)
	if err != nil {
		return nil, tl, err
	}
	return identityHold(key, owner, claimed, fresh), fresh, nil
}

func uuidString(id [16]byte) string {
	return fmt.Sprintf("%x-%x-%x-%x-%x", id[0:4], id[4:6], id[6:8], id[8:10], id[10:16])
}
