package consumer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/tenure-dev/tenure/sink"
)

// Consumer is one worker replica: a consumer group member that runs one lane
// per assigned partition and commits every batch through the fence.
type Consumer struct {
	cfg   Config
	log   *zap.Logger
	store *sink.Store

	opts []kgo.Opt
	// cl is set by Run, and by the first group callback: kgo starts joining
	// inside NewClient, so a callback can run before NewClient returns.
	cl atomic.Pointer[kgo.Client]

	mu    sync.Mutex
	lanes map[tp]*lane

	running chan struct{} // closed when Run starts

	txOptions pgx.TxOptions
	// txTag and txSeq make each batch transaction's marker unique (see
	// lane.commitTx).
	txTag string
	txSeq atomic.Uint64
	stats counters
}

// txMarker returns a value no other batch transaction uses.
func (c *Consumer) txMarker() string {
	return c.txTag + "." + strconv.FormatUint(c.txSeq.Add(1), 10)
}

type tp struct {
	topic     string
	partition int32
}

// New validates cfg and returns a Consumer; nothing connects until Run.
func New(cfg Config) (*Consumer, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := &Consumer{
		cfg:     cfg,
		log:     cfg.Logger.With(zap.String("group", cfg.Group)),
		store:   cfg.Store,
		lanes:   map[tp]*lane{},
		running: make(chan struct{}),
	}
	// Set per transaction so that a pool shared with other code keeps its
	// own settings. One round trip: BEGIN and the SETs travel together.
	begin := "BEGIN"
	if cfg.IdleInTxTimeout > 0 {
		begin += fmt.Sprintf("; SET LOCAL idle_in_transaction_session_timeout = %d", cfg.IdleInTxTimeout.Milliseconds())
	}
	if cfg.HandlerTimeout > 0 {
		begin += fmt.Sprintf("; SET LOCAL lock_timeout = %d", max(cfg.HandlerTimeout.Milliseconds()/2, 1))
	}
	c.txOptions.BeginQuery = begin
	var tag [8]byte
	_, _ = rand.Read(tag[:]) // never fails (crypto/rand)
	c.txTag = hex.EncodeToString(tag[:])
	opts := []kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ClientID(cfg.ClientID),
		kgo.ConsumerGroup(cfg.Group),
		kgo.ConsumeTopics(cfg.Topics...),
		kgo.DisableAutoCommit(),
		// Callbacks never run while a poll's records are being handed to
		// lanes, so a lane never receives records of a partition after it was
		// revoked from this member.
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsAssigned(c.assigned),
		kgo.OnPartitionsRevoked(c.revoked),
		kgo.OnPartitionsLost(c.lost),
		kgo.AdjustFetchOffsetsFn(c.claim),
		// Only records of committed Kafka transactions are jobs.
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// A partition without a fencing row and without a Kafka commit
		// starts at the beginning: a job is never skipped by default.
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.WithLogger(kzap{cfg.Logger.Named("kgo")}),
		kgo.RebalanceTimeout(cfg.RebalanceTimeout),
		// A fetch in flight holds back a partition assigned meanwhile; a
		// short wait keeps a hand-off from idling for kgo's default 5s.
		kgo.FetchMaxWait(500 * time.Millisecond),
	}
	if cfg.SessionTimeout > 0 {
		opts = append(opts, kgo.SessionTimeout(cfg.SessionTimeout))
		// kgo heartbeats every 3s by default; a shorter session needs at
		// least three heartbeats per session.
		if hb := cfg.SessionTimeout / 3; hb < 3*time.Second {
			opts = append(opts, kgo.HeartbeatInterval(hb))
		}
	}
	if cfg.Protocol == NextGen {
		opts = append(opts, kgo.ServerSideBalancer(), kgo.Balancers(kgo.CooperativeStickyBalancer()))
	} else {
		opts = append(opts, kgo.Balancers(kgo.CooperativeStickyBalancer()))
	}
	c.opts = append(opts, cfg.KgoOpts...)
	if err := refuseStaticMembership(cfg.KgoOpts); err != nil {
		return nil, err
	}
	return c, nil
}

// refuseStaticMembership inspects the user's options without joining
// anything: a client without a group does not connect until used.
func refuseStaticMembership(opts []kgo.Opt) error {
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("kafka client options: %w", err)
	}
	defer cl.Close()
	if id, _ := cl.OptValue(kgo.InstanceID).(string); id != "" {
		return ErrStaticMembership
	}
	return nil
}

// Client is the underlying kgo client once Run has started (nil before).
func (c *Consumer) Client() *kgo.Client { return c.cl.Load() }

// Run consumes until ctx is cancelled or the client fails fatally, then stops
// gracefully: in-flight batches get ShutdownTimeout to finish (their commits
// are settled by the fence either way), and the member leaves the group. It
// returns nil after a stop caused by ctx.
func (c *Consumer) Run(ctx context.Context) error {
	select {
	case <-c.running:
		return errors.New("consumer: Run called twice")
	default:
		close(c.running)
	}
	cl, err := kgo.NewClient(c.opts...)
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	c.cl.CompareAndSwap(nil, cl)
	defer c.shutdown(cl)
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go c.watchLayouts(wctx, cl)
	for {
		// PollRecords bounds a poll so that callbacks are never blocked by a
		// huge hand-off.
		fetches := cl.PollRecords(ctx, 10_000)
		if fetches.IsClientClosed() {
			return errors.New("consumer: kafka client closed")
		}
		if ctx.Err() != nil {
			cl.AllowRebalance()
			return nil
		}
		fetches.EachError(func(topic string, partition int32, err error) {
			if errors.Is(err, context.Canceled) {
				return
			}
			c.log.Warn("fetch error", zap.String("topic", topic), zap.Int32("partition", partition), zap.Error(err))
		})
		fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) == 0 {
				return
			}
			c.mu.Lock()
			l := c.lanes[tp{p.Topic, p.Partition}]
			c.mu.Unlock()
			if l == nil {
				// Not claimed by us (claim rejected, or already stopped):
				// nothing from this partition may be processed.
				return
			}
			l.push(p.Records)
		})
		cl.AllowRebalance()
	}
}

// shutdown stops every lane (soft, then hard after ShutdownTimeout), then
// leaves the group and closes the client.
func (c *Consumer) shutdown(cl *kgo.Client) {
	c.mu.Lock()
	lanes := make([]*lane, 0, len(c.lanes))
	for k, l := range c.lanes {
		lanes = append(lanes, l)
		delete(c.lanes, k)
	}
	c.mu.Unlock()
	stopLanes(lanes, c.cfg.ShutdownTimeout)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// LeaveGroupContext triggers the revoke callback (now a no-op: no lanes)
	// and tells the coordinator to hand our partitions over at once rather
	// than after a session timeout.
	if err := cl.LeaveGroupContext(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		c.log.Warn("leaving group", zap.Error(err))
	}
	// Close can wait on a group request that kgo sends on the client's own
	// context (seen: a JoinGroup pending on a coordinator that holds a
	// rebalance open). A stopping worker must not hang on it.
	closed := make(chan struct{})
	go func() { cl.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		c.log.Warn("kafka client did not close within 10s; stopping without waiting for it")
	}
	c.log.Info("worker stopped")
}

// assigned is kgo's OnPartitionsAssigned. Claims happen in claim
// (AdjustFetchOffsetsFn), which kgo calls next with the offsets it fetched:
// that is the one place where the claimed offset can become the fetch
// position before any record is fetched.
func (c *Consumer) assigned(_ context.Context, cl *kgo.Client, assigned map[string][]int32) {
	c.cl.CompareAndSwap(nil, cl)
	if len(assigned) > 0 {
		member, epoch := cl.GroupMetadata()
		c.log.Info("partitions assigned", zap.Any("partitions", assigned), zap.String("member", member), zap.Int32("epoch", epoch))
	}
}

// revoked is kgo's OnPartitionsRevoked: a cooperative hand-off. Each lane may
// finish its in-flight batch (half the rebalance timeout at most); whatever it
// does, the fence decides whether that batch lands.
func (c *Consumer) revoked(_ context.Context, _ *kgo.Client, revoked map[string][]int32) {
	if len(revoked) == 0 {
		return
	}
	c.log.Info("partitions revoked", zap.Any("partitions", revoked))
	stopLanes(c.takeLanes(revoked), c.cfg.RebalanceTimeout/2)
}

// lost is kgo's OnPartitionsLost: the member was evicted or fenced by the
// coordinator (e.g. it was paused past its session timeout). Someone else may
// already own these partitions, so in-flight work is abandoned at once.
func (c *Consumer) lost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	if len(lost) == 0 {
		return
	}
	c.log.Warn("partitions lost", zap.Any("partitions", lost))
	stopLanes(c.takeLanes(lost), lostGrace)
}

func (c *Consumer) takeLanes(m map[string][]int32) []*lane {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*lane
	for t, ps := range m {
		for _, p := range ps {
			if l := c.lanes[tp{t, p}]; l != nil {
				out = append(out, l)
				delete(c.lanes, tp{t, p})
			}
		}
	}
	return out
}

// stopLanes asks every lane to stop after its current batch, waits up to
// grace, then cancels what is still running and waits for it to return.
func stopLanes(lanes []*lane, grace time.Duration) {
	for _, l := range lanes {
		l.stopSoft()
	}
	deadline := time.NewTimer(grace)
	defer deadline.Stop()
	for _, l := range lanes {
		select {
		case <-l.done:
		case <-deadline.C:
			for _, l := range lanes {
				l.stopHard()
			}
		}
	}
	for _, l := range lanes {
		l.stopHard()
		<-l.done
		l.release()
	}
}
