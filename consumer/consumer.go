package consumer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mrand "math/rand/v2"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/tenure-dev/tenure/internal/fence"
	"github.com/tenure-dev/tenure/internal/tick"
	"github.com/tenure-dev/tenure/sink"
)

// Consumer is one worker replica: a consumer group member that runs one lane
// per assigned partition and commits every batch through the fence.
type Consumer struct {
	cfg   Config
	log   *zap.Logger
	store *fence.Store // the protocol behind cfg.Store (fence.Of)

	opts []kgo.Opt
	// cl is set by Run, and by the first group callback: kgo starts joining
	// inside NewClient, so a callback can run before NewClient returns.
	cl atomic.Pointer[kgo.Client]

	mu    sync.Mutex
	lanes map[tp]*lane
	// ended is the client of a group session whose lanes were taken to
	// stop (shutdown, stepDownSession): no lane is made for it any more,
	// or a claim still running would leave one behind that nothing stops.
	ended *kgo.Client

	running chan struct{} // closed when Run starts

	// buffered is the size of the records all lanes hold: buffered, and
	// in the batches taken and not done with (Config.WorkerBufferBytes).
	buffered     atomic.Int64
	bufferedPeak atomic.Int64 // the most buffered ever was (Stats.BufferedBytesPeak)
	// forWorker: some lane may be paused because the worker's buffers were
	// full; resumeDrained looks at the lanes only then.
	forWorker atomic.Bool
	// unfed are the lanes no record has come for yet: their partitions
	// go first in fetch requests (fetchorder.go).
	unfed unfedLanes

	// lockWatchOff turns the lock watch (handoff.go) off for good once
	// ending a session was refused for want of privilege.
	lockWatchOff atomic.Bool
	fetchErrors  errorLog // fetch errors, logged without flooding
	resubscribed sync.Map // topic -> time.Time of the last re-subscription (topicMaybeRecreated)

	// pollWake cuts the poll loop's current wait short, so that a lane's
	// seek is applied without waiting for records (see lane.seek).
	pollMu   sync.Mutex
	pollWake context.CancelFunc

	// db is what the database watch knows (dbwatch.go).
	db dbWatch
	// watch is what the group watch found (groupwatch.go).
	watch groupWatch
	// txSlots bounds the lanes' transactions at once below the pool's
	// size (laneConns); made at the first transaction, from the pool.
	txSlots func() chan struct{}

	// joint commits lanes' batches in shared transactions
	// (Config.CommitSpan); nil: each batch in its own.
	joint *jointCommitter

	txOptions pgx.TxOptions
	// txTag and txSeq make each batch transaction's marker unique (see
	// lane.commitTx).
	txTag string
	txSeq atomic.Uint64
	// claimBase and claimSeq make the lanes' claim ids (newClaimID).
	claimBase int64
	claimSeq  atomic.Int64
	stats     counters
	// trace traces batches (trace.go); nil: Config.TracerProvider is nil.
	trace *tracing
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
		store:   fence.Of(cfg.Store),
		lanes:   map[tp]*lane{},
		running: make(chan struct{}),
	}
	c.txSlots = sync.OnceValue(func() chan struct{} {
		return make(chan struct{}, laneConns(c.store.Pool().Config().MaxConns))
	})
	c.trace = newTracing(&c.cfg)
	c.joint = newJointCommitter(c)
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
	c.claimBase = mrand.Int64N(1<<52) + 1
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
		// Every fetch position comes from Postgres (claim). A log that
		// moves under it (retention or DeleteRecords passing a lagging
		// lane, a log cut below it) must not be followed silently: kgo
		// reports OFFSET_OUT_OF_RANGE instead of resetting, and the lane
		// checks the log (lane.fetchFailed).
		kgo.ConsumeResetOffset(kgo.NoResetOffset()),
		kgo.WithLogger(kzap{cfg.Logger.Named("kgo")}),
		kgo.RebalanceTimeout(cfg.RebalanceTimeout),
		// A fetch in flight holds back a partition resumed or assigned
		// meanwhile: the wait bounds that (kgo's default is 5s).
		kgo.FetchMaxWait(cfg.FetchMaxWait),
		// Newly assigned partitions first (fetchorder.go).
		kgo.ConsumePreferringLagFn(c.unfed.prefer),
		// A fetch's limits count bytes on the wire, compressed, and a
		// response is decoded whole before a lane can pause: the benchmark's
		// snappy-compressed JSON grows about 10x, and kgo keeps each
		// partition's records in one slab that lives while any of them is
		// buffered. Measured on a 1M-job backlog (12 partitions), the
		// partition limit is what sets peak memory: kgo's 1 MiB gave 450 MB
		// RSS, a thirty-second of the partition's buffer (128 KiB) 100-125
		// MB at the same rate. The response as a whole is at most a
		// 128th of the worker's buffer (kgo's default is 50 MiB): with
		// hundreds of partitions that limit, not the partition's, is the
		// one that binds, and its records, decoded, are what the lanes
		// can hold past the worker's bound (the poll that crossed it) and
		// what kgo holds beside them (the next response). At a
		// thirty-second (1 MiB, 10 MiB decoded) a worker of 334
		// partitions draining a backlog peaked at 160-171 MB RSS; at a
		// 128th, 133-151 MB, and one worker of 12 partitions ran no
		// slower (tenure bench; docs/operations.md, "Memory").
		kgo.FetchMaxBytes(fetchMaxBytes(cfg.WorkerBufferBytes)),
		kgo.FetchMaxPartitionBytes(int32(max(min(cfg.PartitionBufferBytes/32, 1<<30), 16<<10))),
		// kgo fetches from every broker that leads one of the worker's
		// partitions at once, one fetch each, and holds a response until
		// it is polled. Bounding that count (kgo.MaxConcurrentFetches, 4)
		// cost 12 partitions over 3 workers 0.4-0.7x of their rate on one
		// broker (six interleaved bench runs on a loaded 2-core machine),
		// so it is left to KgoOpts.
	}
	if cfg.SessionTimeout > 0 {
		opts = append(opts, kgo.SessionTimeout(cfg.SessionTimeout))
		if hb, ok := heartbeatInterval(cfg.SessionTimeout); ok {
			opts = append(opts, kgo.HeartbeatInterval(hb))
		}
	}
	if cfg.Protocol == NextGen {
		opts = append(opts, kgo.ServerSideBalancer(), kgo.Balancers(kgo.CooperativeStickyBalancer()))
	} else {
		opts = append(opts, kgo.Balancers(kgo.CooperativeStickyBalancer()))
	}
	if err := refuseOverrides(cfg, opts); err != nil {
		return nil, err
	}
	c.opts = append(opts, cfg.KgoOpts...)
	return c, nil
}

// heartbeatInterval is the classic protocol's heartbeat interval for a
// session timeout, when it is shorter than kgo's default of 3s (ok false:
// leave kgo's). When a member dies, the coordinator notices after the
// session timeout, and the others learn of the rebalance at their next
// heartbeat: a hand-off waits the session timeout and up to one interval
// more (then the join, the claims, the first batch). A sixth of the session
// keeps that part short for the short sessions chosen for fast hand-offs
// (1s at the lowest, 6s, where a third left 2s); Kafka asks for at most a
// third, and its own defaults beat fifteen times a session.
func heartbeatInterval(session time.Duration) (time.Duration, bool) {
	hb := session / 6
	return hb, hb < 3*time.Second
}

// fetchMaxBytes is a fetch response's limit for a worker budget of
// workerBytes: a 128th of it, from 64 KiB to 1 GiB.
func fetchMaxBytes(workerBytes int64) int32 {
	return int32(max(min(workerBytes/128, 1<<30), 64<<10))
}

// ErrReservedKgoOpt is matched by the error of a Config whose KgoOpts set an
// option that tenure sets itself, or relies on the default of (see
// Config.KgoOpts). The error names the option.
var ErrReservedKgoOpt = errors.New("Config.KgoOpts sets a kgo option that tenure owns")

// reservedOpts are the kgo options tenure sets, or relies on the default of,
// with what to use instead (refuseOverrides). group marks kgo.GroupOpts;
// set, for a group callback kgo does not wrap, says whether a client has
// it set.
var reservedOpts = []struct {
	opt   any
	name  string
	why   string
	group bool
	set   func(*kgo.Client) bool
}{
	{opt: kgo.ConsumerGroup, name: "kgo.ConsumerGroup", why: "set Config.Group", group: true},
	{opt: kgo.ConsumeTopics, name: "kgo.ConsumeTopics", why: "set Config.Topics"},
	{opt: kgo.ConsumeRegex, name: "kgo.ConsumeRegex", why: "set Config.Topics"},
	{opt: kgo.ConsumeExcludeTopics, name: "kgo.ConsumeExcludeTopics", why: "set Config.Topics"},
	{opt: kgo.ConsumePartitions, name: "kgo.ConsumePartitions", why: "partitions are assigned by the group"},
	{opt: kgo.ShareGroup, name: "kgo.ShareGroup", why: "a share group has no partition owners to fence", group: true},
	{opt: kgo.AdjustFetchOffsetsFn, name: "kgo.AdjustFetchOffsetsFn", why: "it is where tenure claims each partition and sets the fetch offset from Postgres", group: true,
		set: func(cl *kgo.Client) bool {
			f, _ := cl.OptValue(kgo.AdjustFetchOffsetsFn).(func(context.Context, map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error))
			return f != nil
		}},
	{opt: kgo.OnOffsetsFetched, name: "kgo.OnOffsetsFetched", why: "offsets come from Postgres", group: true,
		set: func(cl *kgo.Client) bool {
			f, _ := cl.OptValue(kgo.OnOffsetsFetched).(func(context.Context, *kgo.Client, *kmsg.OffsetFetchResponse) error)
			return f != nil
		}},
	{opt: kgo.ConsumeResetOffset, name: "kgo.ConsumeResetOffset", why: "a partition Postgres has never seen starts at the log's start, so that no job is skipped"},
	{opt: kgo.ConsumeStartOffset, name: "kgo.ConsumeStartOffset", why: "where a partition starts is the fencing row's next offset"},
	{opt: kgo.DisableAutoCommit, name: "kgo.DisableAutoCommit", why: "offsets are committed in Postgres, never by kgo: tenure sets it", group: true},
	{opt: kgo.AutoCommitMarks, name: "kgo.AutoCommitMarks", why: "offsets are committed in Postgres, never by kgo", group: true},
	{opt: kgo.AutoCommitInterval, name: "kgo.AutoCommitInterval", why: "offsets are committed in Postgres, never by kgo", group: true},
	{opt: kgo.GreedyAutoCommit, name: "kgo.GreedyAutoCommit", why: "offsets are committed in Postgres, never by kgo", group: true},
	{opt: kgo.BlockRebalanceOnPoll, name: "kgo.BlockRebalanceOnPoll", why: "tenure relies on it so that no record reaches a revoked lane, and sets it", group: true},
	{opt: kgo.Balancers, name: "kgo.Balancers", why: "set Config.Protocol", group: true},
	{opt: kgo.GroupProtocol, name: "kgo.GroupProtocol", why: "tenure speaks the consumer protocol", group: true},
	{opt: kgo.FetchIsolationLevel, name: "kgo.FetchIsolationLevel", why: "only records of committed Kafka transactions are jobs"},
	{opt: kgo.KeepControlRecords, name: "kgo.KeepControlRecords", why: "transaction markers are not jobs"},
	{opt: kgo.RebalanceTimeout, name: "kgo.RebalanceTimeout", why: "set Config.RebalanceTimeout (revoked lanes get half of it)", group: true},
	{opt: kgo.SessionTimeout, name: "kgo.SessionTimeout", why: "set Config.SessionTimeout", group: true},
	{opt: kgo.HeartbeatInterval, name: "kgo.HeartbeatInterval", why: "derived from Config.SessionTimeout", group: true},
	{opt: kgo.ClientID, name: "kgo.ClientID", why: "set Config.ClientID (member ids, recorded as owners, are built from it)"},
	{opt: kgo.SeedBrokers, name: "kgo.SeedBrokers", why: "set Config.Brokers"},
}

// refuseOverrides inspects cfg.KgoOpts without connecting anywhere (the
// clients it builds have a dialer that refuses every connection), with
// kgo's own ValidateOpts and OptValues, and kgo's public option types:
//
//   - a kgo.GroupOpt is refused: tenure runs the consumer group itself, and
//     its settings are Config fields (Group, SessionTimeout,
//     RebalanceTimeout, Protocol; Hooks instead of the partition
//     callbacks). kgo wraps a group client's partition callbacks in code
//     of its own, so a user's callback cannot be told from tenure's by
//     comparing; the error names the option where its value tells
//     (static membership gets ErrStaticMembership);
//   - any other option is compared, for each reserved one, in a client of
//     tenure's options then KgoOpts against a client of tenure's alone:
//     one that changes what tenure sets or relies on is refused, named; one
//     that repeats it is accepted.
func refuseOverrides(cfg Config, ours []kgo.Opt) error {
	if err := kgo.ValidateOpts(append(slices.Clone(ours), cfg.KgoOpts...)...); err != nil {
		return fmt.Errorf("kafka client options: %w", err)
	}
	// A group client starts joining inside NewClient: it must neither
	// connect nor log its failure to (the worker's log would say a broker
	// was unreachable).
	noDial := []kgo.Opt{kgo.DialTLSConfig(nil), kgo.Dialer(func(context.Context, string, string) (net.Conn, error) {
		return nil, errors.New("consumer: inspecting options, not connecting")
	}), kgo.WithLogger(kgo.BasicLogger(io.Discard, kgo.LogLevelNone, nil))}
	build := func(opts ...kgo.Opt) (*kgo.Client, error) {
		cl, err := kgo.NewClient(append(opts, noDial...)...)
		if err != nil {
			return nil, fmt.Errorf("kafka client options: %w", err)
		}
		return cl, nil
	}
	var bad []string
	var other []kgo.Opt
	for _, o := range cfg.KgoOpts {
		g, ok := o.(kgo.GroupOpt)
		if !ok {
			other = append(other, o)
			continue
		}
		names, err := groupOptNames(build, g)
		if err != nil {
			return err
		}
		bad = append(bad, names...)
	}
	if slices.Contains(bad, errStaticMembershipName) {
		return ErrStaticMembership
	}
	merged, err := build(append(slices.Clone(ours), other...)...)
	if err != nil {
		return err
	}
	defer merged.Close()
	own, err := build(ours...)
	if err != nil {
		return err
	}
	defer own.Close()
	for _, r := range reservedOpts {
		if r.group {
			continue
		}
		if !reflect.DeepEqual(merged.OptValues(r.opt), own.OptValues(r.opt)) {
			bad = append(bad, r.name+" ("+r.why+")")
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("consumer config: %w: %s", ErrReservedKgoOpt, strings.Join(bad, "; "))
	}
	return nil
}

// errStaticMembershipName marks static membership among groupOptNames.
const errStaticMembershipName = "kgo.InstanceID"

// groupOptNames names what the group option g sets, by comparing a group
// client of g with one without it: the reserved group options whose
// values differ, or whose callbacks (other than the three kgo wraps) are
// set. A partition callback, which kgo wraps whether set or not, or a
// group option tenure does not list, gets a general name.
func groupOptNames(build func(...kgo.Opt) (*kgo.Client, error), g kgo.GroupOpt) ([]string, error) {
	// Durations no one sets, so that g setting any of them (kgo's default
	// included) shows.
	base := []kgo.Opt{kgo.ConsumerGroup("tenure-inspecting-options"), kgo.RebalanceTimeout(61729 * time.Millisecond),
		kgo.SessionTimeout(45331 * time.Millisecond), kgo.HeartbeatInterval(3137 * time.Millisecond), kgo.AutoCommitInterval(5113 * time.Millisecond)}
	with, err := build(append(slices.Clone(base), g)...)
	if err != nil {
		return nil, err
	}
	defer with.Close()
	without, err := build(base...)
	if err != nil {
		return nil, err
	}
	defer without.Close()
	if id, _ := with.OptValue(kgo.InstanceID).(string); id != "" {
		return []string{errStaticMembershipName}, nil
	}
	var names []string
	for _, r := range reservedOpts {
		if !r.group {
			continue
		}
		if r.set != nil {
			if r.set(with) {
				names = append(names, r.name+" ("+r.why+")")
			}
			continue
		}
		if !reflect.DeepEqual(with.OptValues(r.opt), without.OptValues(r.opt)) {
			names = append(names, r.name+" ("+r.why+")")
		}
	}
	// kgo.AutoCommitCallback and the partition callbacks have a value of
	// kgo's own in every group client: they are not compared.
	if len(names) == 0 {
		names = append(names, "a kgo group option (kgo.OnPartitionsAssigned, OnPartitionsRevoked or OnPartitionsLost: use Config.Hooks; "+
			"kgo.AutoCommitCallback: offsets are committed in Postgres; or another group setting: tenure runs the group, its settings are Config fields)")
	}
	return names, nil
}

// Client is the underlying kgo client once Run has started (nil before).
func (c *Consumer) Client() *kgo.Client { return c.cl.Load() }

// Run consumes until ctx is cancelled or the client fails fatally, then stops
// gracefully: in-flight batches get ShutdownTimeout to finish (their commits
// are settled by the fence either way), and the member leaves the group. It
// returns nil after a stop caused by ctx.
//
// While it runs, a worker that cannot reach its database for
// Config.DatabaseTimeout gives its partitions up (it leaves the group, so
// that the coordinator hands them to members that can work), keeps probing
// the database, and joins the group again once it answers (dbwatch.go).
func (c *Consumer) Run(ctx context.Context) error {
	select {
	case <-c.running:
		return errors.New("consumer: Run called twice")
	default:
		close(c.running)
	}
	if c.cfg.Strict {
		if err := sink.CheckPreparedTransactions(ctx, c.store.Pool()); err != nil {
			return err
		}
		if err := c.store.CheckStrictRole(ctx); err != nil {
			return err
		}
	} else if _, err := c.store.PreparedRole(ctx); err != nil {
		// Needed only to finish a strict worker's batch, should this
		// worker's claim meet one; read again then.
		c.log.Warn("cannot tell the role prepared batches are finished as; a strict worker's batch this worker meets may stay prepared", zap.Error(err))
	}
	wctx, stopProbe := context.WithCancel(ctx)
	defer stopProbe()
	go c.probeDatabase(wctx)
	for {
		stepped, err := c.session(ctx)
		if !stepped || ctx.Err() != nil {
			return err
		}
		if !c.awaitDatabase(ctx) {
			return nil
		}
	}
}

// session is one membership of the group, on a client of its own: it runs
// until ctx ends (a graceful stop), the client fails, or the worker steps
// down because its database does not answer (stepped).
func (c *Consumer) session(ctx context.Context) (stepped bool, err error) {
	// The group callbacks of the new client set it (kgo starts joining
	// inside NewClient, so a callback can run before NewClient returns).
	c.cl.Store(nil)
	sctx, stepDown := context.WithCancel(ctx)
	defer stepDown()
	c.setStepDown(stepDown)
	defer c.setStepDown(nil)
	cl, err := kgo.NewClient(c.opts...)
	if err != nil {
		return false, fmt.Errorf("kafka client: %w", err)
	}
	c.cl.CompareAndSwap(nil, cl)
	// Stopped after the shutdown below: the row lives while the lanes end.
	defer c.startHeartbeat(cl)()
	defer func() {
		if stepped {
			c.stepDownSession(cl)
		} else {
			c.shutdown(cl)
		}
	}()
	wctx, stopWatch := context.WithCancel(sctx)
	defer stopWatch()
	go c.watchLayouts(wctx, cl)
	if !c.cfg.Strict { // a strict lane's offset commits are the mirror
		go c.mirrorOffsets(wctx, cl)
	}
	go c.pruneFenceLogs(wctx)
	go c.watchRows(wctx)
	go c.watchGroup(wctx, cl)
	for {
		pctx, wake := context.WithCancel(sctx)
		c.pollMu.Lock()
		c.pollWake = wake
		c.pollMu.Unlock()
		c.applySeeks(cl)
		// The whole fetch is handed to the lanes: a partition's records left
		// in kgo's buffer would be dropped when the lane pauses it, and
		// fetched and decoded again. Handing out is cheap (appends), and
		// fetches are bounded (FetchMaxBytes, the lanes' buffers).
		fetches := cl.PollFetches(pctx)
		wake()
		if fetches.IsClientClosed() {
			return false, errors.New("consumer: kafka client closed")
		}
		if sctx.Err() != nil {
			cl.AllowRebalance()
			return ctx.Err() == nil, nil
		}
		fetches.EachError(func(topic string, partition int32, err error) {
			if errors.Is(err, context.Canceled) {
				return
			}
			if errors.Is(err, kerr.UnknownTopicID) && topic != "" {
				c.topicMaybeRecreated(sctx, cl, topic)
			}
			c.fetchErrors.log(c.log, topic, partition, err)
		})
		fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			moved := logMoved(p.Err)
			if len(p.Records) == 0 && !moved {
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
			if len(p.Records) > 0 {
				l.push(p.Records, p.LogStartOffset)
			}
			if moved {
				l.fetchFailed(p.FetchPartition)
			}
		})
		// Over the worker's budget now, every partition waits, not only
		// those that had records in this poll.
		c.holdFetches()
		// Seeks requested meanwhile, before a rebalance may run.
		c.applySeeks(cl)
		cl.AllowRebalance()
	}
}

// logMoved reports whether a fetch error says the partition's log moved
// under its fetch position: OFFSET_OUT_OF_RANGE (kgo reports it instead of
// resetting: NoResetOffset), or a data loss kgo detected and moved the
// position down for.
func logMoved(err error) bool {
	var dl *kgo.ErrDataLoss
	return err != nil && (errors.Is(err, kerr.OffsetOutOfRange) || errors.As(err, &dl))
}

// newClaimID returns a claim id for a new lane: never 0 (0 is "no claimant
// id"), below 2^53 so that the id survives JSON tools that read numbers as
// doubles (log processors, the test harness), and higher than every id this
// Consumer gave before: Postgres refuses a claim by an older lane of a
// member whose newer lane holds the partition (sink.ClaimRequest.ClaimID).
// The base is random, so that ids of different processes rarely meet.
func (c *Consumer) newClaimID() int64 {
	return c.claimBase + c.claimSeq.Add(1)
}

// pruneFenceLogs bounds the fence log of the partitions this worker holds
// (Config.FenceLogRetention), every FenceLogPruneInterval, until ctx ends.
// Replicas prune only their own partitions, so they never do the same work.
func (c *Consumer) pruneFenceLogs(ctx context.Context) {
	r := c.cfg.FenceLogRetention
	if !r.Enabled() {
		return
	}
	tick.Every(ctx, c.cfg.FenceLogPruneInterval, func() {
		lanes := c.snapshotLanes()
		var total int64
		for _, l := range lanes {
			pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			n, err := c.store.PruneFenceLog(pctx, l.key, r)
			cancel()
			if err != nil {
				if ctx.Err() == nil {
					c.log.Warn("pruning the fence log failed; trying again next time", zap.Stringer("partition", l.key), zap.Error(err))
				}
				continue
			}
			total += n
		}
		if total > 0 {
			c.stats.fenceLogPruned.Add(total)
			c.log.Debug("fence log pruned", zap.Int64("entries", total), zap.Int("partitions", len(lanes)))
		}
	})
}

// topicMaybeRecreated runs when a fetch of topic fails with
// UNKNOWN_TOPIC_ID. If the topic was deleted and re-created under the same
// name, kgo keeps fetching by the old topic id and fails for good until the
// topic is purged and added again; so this worker re-subscribes to it (at
// most every few seconds). The group then assigns the new topic's
// partitions, and their claims find that the stored offsets belong to the
// old log (a topic-recreated hold, docs/fencing.md "The log's identity").
// Purging waits for a rebalance, which waits for the poll loop: it runs
// aside.
func (c *Consumer) topicMaybeRecreated(ctx context.Context, cl *kgo.Client, topic string) {
	now := time.Now()
	if last, ok := c.resubscribed.Load(topic); ok && now.Sub(last.(time.Time)) < resubscribeEvery {
		return
	}
	c.resubscribed.Store(topic, now)
	go func() {
		mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		logs, err := topicLogs(mctx, cl, []string{topic}, false)
		if err != nil {
			c.log.Debug("topic not found while its fetches fail with UNKNOWN_TOPIC_ID: deleted, or not created again yet", zap.String("topic", topic), zap.Error(err))
			return
		}
		c.log.Warn("topic was deleted and re-created (its fetches fail with UNKNOWN_TOPIC_ID): re-subscribing to the new one; "+
			"its partitions will be held until an operator acknowledges that the stored offsets belong to the old log",
			zap.String("topic", topic), zap.String("topic_id", uuidString(logs[topic].id)))
		cl.PurgeTopicsFromConsuming(topic)
		cl.AddConsumeTopics(topic)
	}()
}

// resubscribeEvery bounds how often topicMaybeRecreated re-subscribes.
const resubscribeEvery = 5 * time.Second

// errorLog logs repeated errors once per key and then at most every
// errorLogEvery, with the number left out: a partition whose fetches fail
// on every poll must not flood the log.
type errorLog struct {
	mu   sync.Mutex
	seen map[string]*errorSeen
}

type errorSeen struct {
	last       time.Time
	suppressed int
}

const errorLogEvery = 10 * time.Second

func (e *errorLog) log(log *zap.Logger, topic string, partition int32, err error) {
	key := fmt.Sprintf("%s\x00%d\x00%s", topic, partition, err)
	e.mu.Lock()
	if e.seen == nil {
		e.seen = map[string]*errorSeen{}
	}
	s := e.seen[key]
	now := time.Now()
	if s != nil && now.Sub(s.last) < errorLogEvery {
		s.suppressed++
		e.mu.Unlock()
		return
	}
	suppressed := 0
	if s == nil {
		s = &errorSeen{}
		e.seen[key] = s
	} else {
		suppressed = s.suppressed
	}
	s.last, s.suppressed = now, 0
	e.mu.Unlock()
	log.Warn("fetch error", zap.String("topic", topic), zap.Int32("partition", partition), zap.Error(err),
		zap.Int("repeats_not_logged", suppressed))
}

// resumeDrained resumes the partitions paused because the worker's buffers
// were full, once they hold less than half of Config.WorkerBufferBytes.
//
// It runs after every batch: the flag spares it the sweep over every lane
// unless one was paused for the worker since the last sweep. A lane that
// cannot resume yet (its own buffer is still full) raises it again.
func (c *Consumer) resumeDrained() {
	if !c.forWorker.Load() || c.buffered.Load() >= c.cfg.WorkerBufferBytes/2 {
		return
	}
	c.forWorker.Store(false)
	lanes := c.snapshotLanes()
	for _, l := range lanes {
		l.mu.Lock()
		switch {
		case !l.pausedForWorker || !l.paused || l.ended || l.removed:
		case l.drained():
			l.resumeLocked()
		default:
			c.forWorker.Store(true)
		}
		l.mu.Unlock()
	}
}

// wakePoll ends the poll loop's current wait, so that it applies the
// lanes' seeks now.
func (c *Consumer) wakePoll() {
	c.pollMu.Lock()
	defer c.pollMu.Unlock()
	if c.pollWake != nil {
		c.pollWake()
	}
}

// applySeeks moves the fetch positions the lanes asked for (lane.seek). It
// runs on the poll goroutine only, between a poll and AllowRebalance, where
// kgo allows SetOffsets.
func (c *Consumer) applySeeks(cl *kgo.Client) {
	c.mu.Lock()
	lanes := make([]*lane, 0, len(c.lanes))
	for _, l := range c.lanes {
		if l.seekTo.Load() >= 0 {
			lanes = append(lanes, l)
		}
	}
	c.mu.Unlock()
	for _, l := range lanes {
		l.applySeek(cl)
	}
}

// snapshotLanes returns the lanes as they are now, for work that must not
// hold c.mu while it visits them.
func (c *Consumer) snapshotLanes() []*lane {
	c.mu.Lock()
	defer c.mu.Unlock()
	lanes := make([]*lane, 0, len(c.lanes))
	for _, l := range c.lanes {
		lanes = append(lanes, l)
	}
	return lanes
}

// endSession marks cl's group session as ended (no claim of it makes a
// lane from now on: assignedLane) and takes every lane out of the map, for
// the caller to stop.
func (c *Consumer) endSession(cl *kgo.Client) []*lane {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ended = cl
	lanes := make([]*lane, 0, len(c.lanes))
	for k, l := range c.lanes {
		lanes = append(lanes, l)
		delete(c.lanes, k)
	}
	return lanes
}

// leaveTimeout bounds leaving the group and closing the client, together,
// once a stopping worker's lanes have stopped.
const leaveTimeout = 3 * time.Second

// shutdown stops every lane (soft, then hard after ShutdownTimeout), then
// leaves the group and closes the client.
func (c *Consumer) shutdown(cl *kgo.Client) {
	lanes := c.endSession(cl)
	stopLanes(lanes, c.cfg.ShutdownTimeout)
	logReleased(lanes, MsgReleased)
	deadline := time.Now().Add(leaveTimeout)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if !c.cfg.Strict {
		c.mirrorFinal(ctx, cl, lanes)
	}
	// Once the lanes are stopped this member owns nothing: leaving only
	// spares the others a session timeout, so leaving and closing share one
	// short deadline, whatever the coordinator does (kfake was seen holding
	// a JoinGroup open for a rebalance timeout; Close waits on group
	// requests sent on the client's own context).
	// LeaveGroupContext triggers the revoke callback (now a no-op: no lanes)
	// and tells the coordinator to hand our partitions over at once rather
	// than after a session timeout.
	if err := cl.LeaveGroupContext(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		c.log.Warn("leaving group", zap.Error(err))
	}
	closed := make(chan struct{})
	go func() { cl.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(max(time.Until(deadline), 100*time.Millisecond)):
		c.log.Warn("kafka client did not close in time; stopping without waiting for it (the coordinator evicts this member at its session timeout)",
			zap.Duration("waited", leaveTimeout))
	}
	c.log.Info("worker stopped")
}

// assigned is kgo's OnPartitionsAssigned. Claims happen in claim
// (AdjustFetchOffsetsFn), which kgo calls next with the offsets it fetched:
// that is the one place where the claimed offset can become the fetch
// position before any record is fetched.
func (c *Consumer) assigned(_ context.Context, cl *kgo.Client, assigned map[string][]int32) {
	c.cl.CompareAndSwap(nil, cl)
	member, epoch := cl.GroupMetadata()
	if len(assigned) > 0 {
		c.log.Info(MsgPartitionsAssigned, zap.Any("partitions", assigned), zap.String("member", member), zap.Int32("epoch", epoch))
	}
	// kgo calls this once per rebalance, after the revocations: every lane
	// still here whose partition is not assigned anew kept its assignment
	// through this generation (lane.through; recovery claims only there).
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, l := range c.lanes {
		if !slices.Contains(assigned[k.topic], k.partition) && epoch > l.through.Load() {
			l.through.Store(epoch)
		}
	}
}

// revoked is kgo's OnPartitionsRevoked: a cooperative hand-off. Each lane may
// finish its in-flight batch (half the rebalance timeout at most); whatever it
// does, the fence decides whether that batch lands.
func (c *Consumer) revoked(_ context.Context, _ *kgo.Client, revoked map[string][]int32) {
	c.endAssignment(revoked, "revoked", c.cfg.RebalanceTimeout/2, MsgRevoked)
}

// lost is kgo's OnPartitionsLost: the member was evicted or fenced by the
// coordinator (e.g. it was paused past its session timeout). Someone else may
// already own these partitions, so in-flight work is abandoned at once.
func (c *Consumer) lost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	c.endAssignment(lost, "lost", lostGrace, MsgLost)
}

// endAssignment stops the lanes of parts, which were revoked or lost
// (how), giving each grace to finish its batch.
func (c *Consumer) endAssignment(parts map[string][]int32, how string, grace time.Duration, msg string) {
	if len(parts) == 0 {
		return
	}
	level := zap.InfoLevel
	if how == "lost" {
		level = zap.WarnLevel
	}
	c.log.Log(level, "partitions "+how, zap.Any("partitions", parts))
	lanes := c.takeLanes(parts)
	c.logEnded(lanes, how)
	stopLanes(lanes, grace)
	logReleased(lanes, msg)
}

// logEnded logs, for a strict worker, the end of each lane's assignment
// (MsgAssignmentEnded): the history checker's coordinator timeline.
func (c *Consumer) logEnded(lanes []*lane, why string) {
	if !c.cfg.Strict {
		return
	}
	for _, l := range lanes {
		l.baseLog.Info(MsgAssignmentEnded, zap.String("why", why))
	}
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
