package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/internal/testinfra/pgtest"
	"github.com/tenure-dev/tenure/internal/testinfra/testdb"
	"github.com/tenure-dev/tenure/sink"
)

// A strict lane's offset commit is accepted, and the answer the lane sees
// is a rejection: the connection breaks after the coordinator applied the
// commit, kgo sends the identical request again, and that copy is refused
// (ILLEGAL_GENERATION, as when the generation moved on in between). The
// lane must decide by the coordinator's record, which names its batch:
// COMMIT PREPARED. Rolling back would leave Kafka's committed offset a
// batch ahead of Postgres, and the next member to claim the partition would
// hold it as diverged ("the database lost commits"), a false alarm that
// stops the partition (docs/model/strict.pml, classic-rollback-unless-lost).
//
// Real kfake and a real Postgres with prepared transactions; the broker
// applies the first copy (sent by a second client, as a request arriving
// on another connection) and closes the lane's connection without an
// answer.
func TestStrictRejectionAfterAHiddenAcceptanceCommits(t *testing.T) {
	t.Parallel()
	const jobs = 10
	b := setup(t, 1)
	strictDatabase(t, b)
	b.produce(jobs, func(i int) string { return fmt.Sprintf("k%d", i) })
	hidden := hideAcceptance(t, b)
	firstMemberDecidesCommitted(t, b, hidden)
	nextMemberAgrees(t, b, jobs)
}

// hiddenAcceptance is the broker's script for the first strict offset
// commit: applied through side, then the lane's connection is closed;
// kgo's resend is answered ILLEGAL_GENERATION.
type hiddenAcceptance struct {
	phase atomic.Int32
	mu    sync.Mutex
	gid   string // the batch the applied commit named
	err   error  // applying it
}

const (
	hiddenWaiting = iota
	hiddenApplying
	hiddenDropped
	hiddenRefused
)

func hideAcceptance(t *testing.T, b *bundle) *hiddenAcceptance {
	side, err := kgo.NewClient(kgo.SeedBrokers(b.brokers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(side.Close)
	h := &hiddenAcceptance{}
	b.cluster.ControlKey(int16(kmsg.OffsetCommit), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		req := kr.(*kmsg.OffsetCommitRequest)
		gid := strictGIDIn(req)
		if gid == "" {
			return nil, nil, false
		}
		switch h.phase.Load() {
		case hiddenWaiting:
			h.phase.Store(hiddenApplying)
			b.cluster.SleepControl(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				err := commitCopy(ctx, side, req, b.topic)
				h.mu.Lock()
				h.gid, h.err = gid, err
				h.mu.Unlock()
			})
			h.phase.Store(hiddenDropped)
			b.cluster.KeepControl()
			return nil, errors.New("the connection breaks after the offset commit was applied"), true
		case hiddenApplying:
			return nil, nil, false // side's copy: the broker applies it
		case hiddenDropped:
			h.phase.Store(hiddenRefused)
			return refuseCommit(req, kerr.IllegalGeneration), nil, true
		}
		return nil, nil, false
	})
	return h
}

// applied is the batch whose commit was applied, once the resend was refused
// ("" before).
func (h *hiddenAcceptance) applied() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.phase.Load() != hiddenRefused {
		return ""
	}
	return h.gid
}

// firstMemberDecidesCommitted runs the first member until its lane decides
// the batch whose acceptance it did not see, and checks that it decided it
// committed.
func firstMemberDecidesCommitted(t *testing.T, b *bundle, hidden *hiddenAcceptance) {
	// A second attempt at a batch the lane had handled means the batch was
	// rolled back: it waits for the lane to stop, so that the batch is not
	// redone before the next member claims the partition.
	inner := ledger(t, b.schema)
	var handled sync.Map
	h := consumer.HandlerFunc(func(ctx context.Context, tx consumer.Tx, batch *consumer.Batch) error {
		if _, again := handled.LoadOrStore(batch.From, true); again {
			<-ctx.Done()
			return ctx.Err()
		}
		return inner.Handle(ctx, tx, batch)
	})
	log, logs := observedLogger(t, zap.WarnLevel)
	cfg := b.config(h, log)
	cfg.Strict = true
	cfg.ShutdownTimeout = 2 * time.Second
	stopA := b.start(cfg)

	var decided map[string]any
	waitForCond(t, 60*time.Second, "the lane to decide the batch whose acceptance it did not see", func() bool {
		gid := hidden.applied()
		if gid == "" {
			return false
		}
		for _, e := range logs.FilterMessage(consumer.MsgStrictDecided).All() {
			if f := e.ContextMap(); f["gid"] == gid {
				decided = f
				return true
			}
		}
		return false
	})
	hidden.mu.Lock()
	if hidden.err != nil {
		t.Fatalf("applying the first copy of the offset commit: %v", hidden.err)
	}
	hidden.mu.Unlock()
	t.Logf("decided: committed=%v by %v (%v)", decided["committed"], decided["decided_by"], decided["evidence"])
	// The lane saw the refusal as the answer to its first request: the
	// resend was kgo's, hidden from the lane.
	answers := 0
	for _, e := range logs.FilterMessage(consumer.MsgStrictAnswered).All() {
		if f := e.ContextMap(); f["gid"] == decided["gid"] {
			answers++
			if f["accepted"] != false || f["attempt"] != int64(1) {
				t.Errorf("the lane's answer was accepted=%v at attempt %v; want the refusal of its first request, resent by kgo", f["accepted"], f["attempt"])
			}
		}
	}
	if answers != 1 {
		t.Errorf("the lane saw %d answers for its batch, want 1", answers)
	}
	if decided["committed"] != true || decided["decided_by"] != "lane" {
		t.Errorf("the lane decided committed=%v (by %v) a batch the coordinator had accepted; want committed by the lane", decided["committed"], decided["decided_by"])
	}
	if err := stopA(); err != nil {
		t.Fatal(err)
	}
}

// nextMemberAgrees runs the next member: Kafka's record and Postgres
// agree, so nothing is held, and every job commits exactly once.
func nextMemberAgrees(t *testing.T, b *bundle, jobs int64) {
	log, logs := observedLogger(t, zap.WarnLevel)
	cfg := b.config(ledger(t, b.schema), log)
	cfg.Strict = true
	stopB := b.start(cfg)
	held := false
	waitForCond(t, 60*time.Second, "the next member to claim the partition, or to hold it", func() bool {
		if logs.FilterMessageSnippet(consumer.MsgHeldDiverged).Len() > 0 {
			held = true
			return true
		}
		next, ok := storedNext(t, b, 0)
		return logs.FilterMessage(consumer.MsgClaimed).Len() > 0 && ok && next == jobs
	})
	if held {
		e := logs.FilterMessageSnippet(consumer.MsgHeldDiverged).All()[0].ContextMap()
		t.Fatalf("the next member holds the partition as diverged: %v", e["reason"])
	}
	if err := stopB(); err != nil {
		t.Fatal(err)
	}
	if off, meta := committedOffset(t, b, 0); off != jobs {
		t.Errorf("Kafka's committed offset is %d (%q), Postgres's next offset %d", off, meta, jobs)
	}
	if hist := b.check(); int64(len(hist.Writes)) != jobs {
		t.Errorf("ledger has %d rows, want %d", len(hist.Writes), jobs)
	}
}

// strictDatabase moves b onto a throwaway Postgres with prepared
// transactions enabled (the shared server runs without them).
func strictDatabase(t *testing.T, b *bundle) {
	t.Helper()
	c := pgtest.StartPrepared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(c.URL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = ""
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	b.pool = pool
	b.schema = testdb.Schema(t, pool)
	if b.store, err = sink.NewStore(pool, b.schema); err != nil {
		t.Fatal(err)
	}
}

// strictGIDIn is the batch a strict offset commit names ("" if none).
func strictGIDIn(req *kmsg.OffsetCommitRequest) string {
	for _, t := range req.Topics {
		for _, p := range t.Partitions {
			if p.Metadata != nil {
				if _, gid, ok := strings.Cut(*p.Metadata, " strict="); ok {
					return gid
				}
			}
		}
	}
	return ""
}

// commitCopy sends the identical offset commit from another client.
func commitCopy(ctx context.Context, cl *kgo.Client, orig *kmsg.OffsetCommitRequest, topic string) error {
	req := kmsg.NewPtrOffsetCommitRequest()
	req.Group, req.Generation, req.MemberID = orig.Group, orig.Generation, orig.MemberID
	for _, ot := range orig.Topics {
		t := kmsg.NewOffsetCommitRequestTopic()
		t.Topic, t.TopicID = topic, ot.TopicID
		t.Partitions = append(t.Partitions, ot.Partitions...)
		req.Topics = append(req.Topics, t)
	}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return err
	}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				return fmt.Errorf("the copy was refused: %w", err)
			}
		}
	}
	return nil
}

// refuseCommit answers req with code for every partition.
func refuseCommit(req *kmsg.OffsetCommitRequest, code *kerr.Error) *kmsg.OffsetCommitResponse {
	resp := req.ResponseKind().(*kmsg.OffsetCommitResponse)
	resp.Version = req.Version
	for _, t := range req.Topics {
		rt := kmsg.NewOffsetCommitResponseTopic()
		rt.Topic, rt.TopicID = t.Topic, t.TopicID
		for _, p := range t.Partitions {
			rp := kmsg.NewOffsetCommitResponseTopicPartition()
			rp.Partition, rp.ErrorCode = p.Partition, code.Code
			rt.Partitions = append(rt.Partitions, rp)
		}
		resp.Topics = append(resp.Topics, rt)
	}
	return resp
}

// storedNext is partition p's next offset in Postgres.
func storedNext(t *testing.T, b *bundle, p int32) (int64, bool) {
	t.Helper()
	fs, err := b.store.List(context.Background(), b.group)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fs {
		if f.Partition.Partition == p {
			return f.NextOffset, true
		}
	}
	return 0, false
}

// committedOffset is the group's committed offset of partition p in Kafka.
func committedOffset(t *testing.T, b *bundle, p int32) (int64, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resps, err := kadm.NewClient(b.cl).FetchOffsets(ctx, b.group)
	if err != nil {
		t.Fatal(err)
	}
	r, ok := resps.Lookup(b.topic, p)
	if !ok {
		return -1, ""
	}
	return r.At, r.Metadata
}
