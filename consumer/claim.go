package consumer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/tenure-dev/tenure/internal/fence"
	"github.com/tenure-dev/tenure/sink"
)

// claim is kgo's AdjustFetchOffsetsFn. kgo calls it once the group has given
// this member new partitions and before it fetches any of them; whatever
// offsets it returns become the fetch positions. So this is where each new
// partition is claimed in Postgres, and where Postgres's next offset replaces
// whatever Kafka has committed.
//
// The epoch is the member's epoch now: the generation (classic) or the member
// epoch (KIP-848) under which these partitions were assigned. It is captured
// once, here, and never refreshed: a KIP-848 epoch can rise later without the
// partition moving, and the lane keeps the token it claimed with.
//
// Every partition gets a lane, claimed or not. A partition whose claim
// cannot be made now (the database, a lock it cannot end, a prepared batch
// it may not finish, the claim timeout) starts paused, recorded as stalled
// with the reason, and its lane claims it by itself (recover.go): one
// stuck partition is that partition's trouble. An error returned from here
// would make kgo abandon the whole group session and rejoin, moving every
// other partition too, every claim timeout for as long as the one stays
// stuck. ctx is cancelled if the group session starts revoking.
func (c *Consumer) claim(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	cl := c.cl.Load() // set: kgo calls OnPartitionsAssigned first
	member, epoch := cl.GroupMetadata()
	if member == "" || epoch <= 0 {
		return nil, fmt.Errorf("claiming partitions: not in the group yet (member %q, epoch %d)", member, epoch)
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.ClaimTimeout)
	defer cancel()

	topics := make([]string, 0, len(offsets))
	for t := range offsets {
		topics = append(topics, t)
	}
	slices.Sort(topics)
	// In a fixed order (topic, partition): the claims are handed out in
	// this order, several together and then one as each ends, so the first partitions are claimed first; but claims that run
	// together finish in any order, and logs and tests must not read an
	// order into them.
	var parts []tp
	for _, topic := range topics {
		for _, p := range slices.Sorted(maps.Keys(offsets[topic])) {
			parts = append(parts, tp{topic, p})
		}
	}
	a, err := c.readAssignment(ctx, cl, member, epoch, topics)
	if err != nil {
		// Nothing to claim with: every lane recovers by itself. No
		// statement runs here, so one at a time costs nothing.
		for _, part := range parts {
			l, ok := c.assignedLane(cl, member, epoch, part, 0, [16]byte{}, -1)
			if !ok {
				return nil, errSessionEnded
			}
			offsets[part.topic][part.partition] = c.claimLater(l, offsets[part.topic][part.partition], err)
		}
		return offsets, nil
	}
	if !c.claimAll(ctx, cl, member, epoch, a, parts, offsets) {
		return nil, errSessionEnded
	}
	return offsets, nil
}

// maxClaimsAtOnce bounds the claims of one assignment that run at once.
//
// Why in parallel: one at a time, a claim costs a few round trips to
// Postgres, and a worker given the 334 partitions of a dead one out of
// 1,000 spent seconds claiming them after the session timeout, while
// nothing of theirs was processed (kgo fetches none of an assignment
// until all of it is claimed).
const maxClaimsAtOnce = 8

// claimAll claims parts, up to maxClaimsAtOnce at a time (as connections
// allow: below), each in claimPartition
// with the same per-partition steps as alone (register, confirm, claim
// per round; bumps and ties; holds; a claim that cannot be made now
// recovers by itself), and writes each fetch position into offsets. It
// returns false when cl's session is being stopped: no lane is made for
// the partitions not started yet, and those made are the stop's to end.
//
// What the claims share: a is read-only but for its logs (under its
// mutex); the round a.rd was registered and confirmed once for the whole
// assignment and is only read. Each claim has its own lane, its own
// connection from the pool and its own context (the lane's stop ends it).
//
// A stop while claiming (Consumer.shutdown, stepDownSession) takes the
// lanes from the map under c.mu and marks cl ended: a claim whose lane
// was made before that is cancelled by its lane's stop and starts the
// lane recovering, which the stop then ends (it waits for the lane's
// goroutine, which starts only once the claim is done); a claim not
// started yet gets no lane (assignedLane). claimAll waits for every claim
// it started, so no goroutine outlives it.
func (c *Consumer) claimAll(ctx context.Context, cl *kgo.Client, member string, epoch int32, a *assignment, parts []tp, offsets map[string]map[int32]kgo.Offset) bool {
	var (
		mu    sync.Mutex // offsets: kgo's map of maps, written by the claims
		wg    sync.WaitGroup
		ended atomic.Bool
	)
	// Each claim holds a connection for its statements, and pgxpool hands
	// connections out in the order they were asked for: a claim asking
	// while every connection is taken waits behind the lanes queued for
	// one (laneConns). So a claim first takes a right to a connection that
	// no lane can take meanwhile: one of the pool's reserve (what the lanes
	// leave for the protocol's statements, of which these are the bulk at
	// an assignment), or a lane's slot that is free now (at start-up,
	// nothing runs yet). Measured at a hand-off of 167 partitions to a busy
	// worker (one pair of runs, a loaded machine): 8 claims asking the pool
	// directly made 130-150 claims/s, one at a time on the reserve 560.
	conns := c.store.Pool().Config().MaxConns
	reserve := make(chan struct{}, max(1, int(conns)-laneConns(conns)))
	slots := c.txSlots()
	sem := make(chan struct{}, maxClaimsAtOnce)
	for _, part := range parts {
		sem <- struct{}{}
		if ended.Load() {
			break
		}
		var release func()
		select {
		case reserve <- struct{}{}:
			release = func() { <-reserve }
		case slots <- struct{}{}:
			release = func() { <-slots }
		}
		wg.Add(1)
		go func() {
			defer func() { release(); <-sem; wg.Done() }()
			at, ok := c.claimPartition(ctx, cl, member, epoch, a, part)
			if !ok {
				ended.Store(true)
				return
			}
			mu.Lock()
			offsets[part.topic][part.partition] = at
			mu.Unlock()
		}()
	}
	wg.Wait()
	return !ended.Load()
}

// errSessionEnded: the group session whose partitions were being claimed
// is being stopped (a graceful stop, a step-down).
var errSessionEnded = errors.New("claiming partitions: the group session is ending")

// assignment is what the claims of one assignment share: the topics' logs,
// their layout errors, one round's registration and confirmation (claimOne
// runs more rounds only for a partition that needs them), the group's
// committed offsets, and whether any prepared transaction exists. The
// claims run at once (claimAll): logs is read and written under mu, the
// rest is only read once readAssignment has returned.
type assignment struct {
	mu        sync.Mutex
	logs      map[string]*topicLog
	blocked   map[string]error
	rd        *round
	committed map[tp]committedOffset
	prepared  bool
}

// log is the topic's log as last read.
func (a *assignment) log(topic string) *topicLog {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.logs[topic]
}

// readAssignment reads what the claims of an assignment share.
func (c *Consumer) readAssignment(ctx context.Context, cl *kgo.Client, member string, epoch int32, topics []string) (*assignment, error) {
	a := &assignment{}
	var err error
	if a.logs, err = c.topicLogsOf(ctx, cl, topics, true); err != nil {
		return nil, err
	}
	if a.blocked, err = c.checkLayouts(ctx, topics, a.logs); err != nil {
		return nil, err
	}
	if a.rd, err = c.prepare(ctx, cl, member, epoch, -1, topics); err != nil {
		return nil, err
	}
	// The group's committed offsets with their metadata: which of them
	// tenure's mirror wrote (mirror.go), in which log epoch.
	if a.committed, err = c.committedOffsets(ctx, cl); err != nil {
		return nil, err
	}
	if a.prepared, err = c.mayHavePrepared(ctx); err != nil {
		return nil, err
	}
	return a, nil
}

// mayHavePrepared reports whether a claim must look for prepared batches
// first: always for a strict worker, else when the server holds any of
// tenure's (a strict worker's, left by a rolling restart that turned
// --strict off, or by a strict owner that died).
func (c *Consumer) mayHavePrepared(ctx context.Context) (bool, error) {
	if c.cfg.Strict {
		return true, nil
	}
	var any bool
	err := c.retry(ctx, "looking for prepared batches", c.log, func() (err error) {
		any, err = c.store.AnyPrepared(ctx)
		return err
	})
	return any, err
}

// assignedLane makes the lane of a partition this member was just assigned
// and puts it in the lanes' map, after releasing a lane of an earlier
// assignment of the same partition. partitions and topicID are the topic's
// as read (0 and zero: not read), start the offset the claim will start a
// partition Postgres has never seen at (-1: not known yet). ok is false
// when cl's session is being stopped: no lane.
func (c *Consumer) assignedLane(cl *kgo.Client, member string, epoch int32, part tp, partitions int32, topicID [16]byte, start int64) (_ *lane, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended == cl {
		return nil, false
	}
	if old := c.lanes[part]; old != nil {
		// Assigned again without a revoke in between (the session was
		// abandoned): the old lane's token is stale. It is released
		// before the new lane exists, so that it can no longer pause
		// or resume the partition under the new lane.
		delete(c.lanes, part)
		old.release()
		go old.stopHard()
	}
	key := sink.Partition{Group: c.cfg.Group, Topic: part.topic, Partition: part.partition}
	log := c.log.With(zap.String("topic", part.topic), zap.Int32("partition", part.partition), zap.String("member", member))
	l := newLane(c, cl, key, member, epoch, partitions, log)
	l.topicID = topicID
	// The coordinator's side of the history: when this member was
	// given the partition, and the lane (claim id) that claims it.
	// internal/history's Assignment reads this line.
	l.log.Info(MsgClaiming, zap.Int32("member_epoch", epoch), zap.Int64("start_offset", start))
	c.lanes[part] = l
	return l, true
}

// claimLater starts l paused and recovering: its claim could not be made
// now (cause). It returns the fetch position to give kgo meanwhile (at,
// or the log's start where at is no exact offset): nothing is fetched
// until the lane has claimed and moved it to the stored offset.
func (c *Consumer) claimLater(l *lane, at kgo.Offset, cause error) kgo.Offset {
	c.stats.claimsFailed.Add(1)
	l.log.Warn(MsgClaimFailed, zap.Error(cause), zap.Bool("stalled", true))
	l.startRecovering(claimFailedError{cause})
	if at.EpochOffset().Offset < 0 {
		at = kgo.NewOffset().AtStart()
	}
	return at
}

// claimPartition claims one partition of the assignment and starts its
// lane: running, held or blocked, or recovering by itself when the claim
// was refused or could not be made. It returns the partition's fetch
// position; false when the session is being stopped (no lane).
func (c *Consumer) claimPartition(ctx context.Context, cl *kgo.Client, member string, epoch int32, a *assignment, part tp) (kgo.Offset, bool) {
	tl := a.log(part.topic)
	start := c.startOffset(tl, a.committed, part)
	l, ok := c.assignedLane(cl, member, epoch, part, tl.partitions, tl.id, start)
	if !ok {
		return kgo.Offset{}, false
	}
	// A lane stopped while it claims (the session ends) ends its claim:
	// stopping it waits for its goroutine, which starts after the claim.
	cctx, cancel := l.within(ctx)
	res, err := c.firstClaimSafe(cctx, cl, l, a, start)
	cancel()
	switch {
	case errors.Is(err, sink.ErrFenced):
		// Another claim holds the partition. Usually this member is
		// behind the group and the coordinator will take the
		// partition away; if it does not, the lane finds out by
		// itself and claims again (lane.recover).
		c.stats.claimsRejected.Add(1)
		l.log.Error(MsgClaimFenced, append(rejectedFields(err), zap.Int64("start_offset", start), zap.Error(err), zap.Bool("fenced", true))...)
		l.next = start
		l.mu.Lock()
		l.fetchPos = start
		l.mu.Unlock()
		l.startRecovering(err)
		return kgo.NewOffset().At(start).WithEpoch(-1), true
	case err != nil:
		return c.claimLater(l, kgo.NewOffset().At(start).WithEpoch(-1), err), true
	}
	switch {
	case res.hold != nil:
		l.startHeld(res.hold)
	case res.blocked:
		l.block()
	default:
		l.start()
	}
	// Epoch -1: the position comes from Postgres, not from a Kafka
	// commit, so kgo must not run its data-loss check with a leader
	// epoch that belongs to another offset.
	return kgo.NewOffset().At(res.claimed.NextOffset).WithEpoch(-1), true
}

// startOffset is where a partition Postgres has never seen starts: at the
// log's start, or at an offset another client committed for the group (a
// group moving to tenure from plain Kafka offsets). An offset tenure's
// mirror committed says the partition was processed here before: the
// database should have its fencing row, and if it has not (restored from
// before the partition's first claim), the divergence check holds the
// partition rather than take the mirror's word for what the database lost.
func (c *Consumer) startOffset(tl *topicLog, committed map[tp]committedOffset, part tp) int64 {
	start := max(tl.start[part.partition], 0)
	if co, ok := committed[part]; ok && !co.tenure {
		start = max(start, co.offset)
	}
	return start
}

// firstClaimed is what a lane's first accepted claim found: the claim, and
// what it must wait for before it processes anything.
type firstClaimed struct {
	claimed sink.Claimed
	hold    *sink.Hold // offsets that do not fit the log, or the database behind the mirror
	blocked bool       // the topic's partition count changed
}

// firstClaimSafe is firstClaim, with a panic (a hook's, or a bug) turned
// into the claim's error: the lane is in the lanes' map already, and must
// start (recovering) like any lane whose claim failed, or a stop would
// wait for it forever; and the claims run on goroutines of their own,
// where a panic would end the process.
func (c *Consumer) firstClaimSafe(ctx context.Context, cl *kgo.Client, l *lane, a *assignment, start int64) (res firstClaimed, err error) {
	defer func() {
		if r := recover(); r != nil {
			l.log.Error("claim panicked", zap.Any("panic", r), zap.ByteString("stack", debug.Stack()))
			res, err = firstClaimed{}, fmt.Errorf("claiming %s: panicked: %v", l.key, r)
		}
	}()
	return c.firstClaim(ctx, cl, l, a, start)
}

// firstClaim is a lane's first claim of its assignment: the claim, then
// the stored offsets checked against the log and against the offsets the
// group mirrored to Kafka. It sets the lane's fetch position and
// acknowledged offset; a refused claim matches sink.ErrFenced.
func (c *Consumer) firstClaim(ctx context.Context, cl *kgo.Client, l *lane, a *assignment, start int64) (firstClaimed, error) {
	part := tp{l.key.Topic, l.key.Partition}
	tl := a.log(part.topic)
	claimed, err := c.claimOne(ctx, cl, l, start, a.rd, a.prepared)
	if err != nil {
		return firstClaimed{}, err
	}
	l.mu.Lock()
	l.fetchPos = claimed.NextOffset
	l.mu.Unlock()
	l.setAcked(claimed.NextOffset)
	co, hasCommit := a.committed[part]
	if claimed.Created && hasCommit && !co.tenure && co.offset > tl.start[part.partition] {
		l.log.Info("partition starts at the offset the group had committed in Kafka (not by tenure): jobs before it are taken as processed",
			zap.Int64("start_offset", claimed.NextOffset), zap.Int64("log_start", tl.start[part.partition]))
	}
	h, fresh, err := claimedLogHold(ctx, l.key, l.owner, claimed, tl, func(ctx context.Context) (*topicLog, error) {
		logs, err := c.topicLogsOf(ctx, cl, []string{part.topic}, true)
		if err != nil {
			return nil, err
		}
		return logs[part.topic], nil
	})
	if err != nil {
		return firstClaimed{}, fmt.Errorf("claiming %s: reading the log again: %w", l.key, err)
	}
	// The next partitions of the topic use the log as last read (those
	// claiming meanwhile read it again themselves if they need to).
	if fresh != tl {
		a.mu.Lock()
		a.logs[part.topic] = fresh
		a.mu.Unlock()
	}
	if h == nil && hasCommit && co.tenure && (claimed.Created || co.logEpoch == claimed.LogEpoch) {
		source := "mirrored to Kafka's committed offsets"
		if claimed.Created {
			source += " by tenure, although the database has no fencing row for the partition (restored from before its first claim?)"
		}
		h = c.divergenceHold(l.key, l.owner, claimed.NextOffset, co.offset, fresh.end[part.partition], source)
	}
	return firstClaimed{claimed: claimed, hold: h, blocked: a.blocked[part.topic] != nil}, nil
}

// checkLayouts checks each topic's partition count against the one
// recorded. A topic whose count changed is claimed (which fences its
// previous owners at once) but not processed until an operator
// acknowledges the new count: its error is in the map, and the partitions
// this worker already runs are held too (the new layout applies to the
// whole topic).
func (c *Consumer) checkLayouts(ctx context.Context, topics []string, logs map[string]*topicLog) (map[string]error, error) {
	blocked := map[string]error{}
	for _, t := range topics {
		var lerr error
		err := c.retry(ctx, "checking partition count", c.log, func() error {
			lerr = c.store.CheckLayout(ctx, c.cfg.Group, t, logs[t].partitions)
			if errors.Is(lerr, sink.ErrPartitionsChanged) {
				return nil
			}
			return lerr
		})
		if err != nil {
			return nil, err
		}
		if lerr != nil {
			c.log.Error("topic partitions changed: not processing it", zap.String("topic", t), zap.Error(lerr))
			blocked[t] = lerr
			c.holdTopic(t, logs[t].partitions)
		}
	}
	return blocked, nil
}

// maxClaimRounds bounds the rounds of one claim: a round ends in a claim,
// or in a bump or a changed epoch that needs another round. Past it the
// group session is abandoned and rejoined.
const maxClaimRounds = 8

// claimOne claims l's partition, retrying transient errors within ctx, and
// sets the lane's token and next offset.
//
// The token is (incarnation, epoch). The epoch is the classic generation, or
// under KIP-848 the group epoch as the coordinator reported it while this
// member held the partition. Each round of a claim takes three steps, and
// their order is what keeps tokens ordered across group lifetimes:
//
//  1. register: read the group's incarnation I and raise its registered high
//     epoch to ours (fence.Store.Register);
//  2. confirm: the group coordinator says that our epoch is current and that
//     we hold the partition (a zombie is refused here);
//  3. claim with (I, epoch), which Postgres accepts only while I is the
//     group's current incarnation and the stored token is lower.
//
// Deleting a group, or letting it expire while empty, restarts its epochs at
// 1. A member of the dead lifetime registered its epoch before its
// confirmation, hence before the reset; the first claimant of the new
// lifetime registers after it, so it finds a registered epoch above its own
// although the coordinator confirms its own: the epochs restarted. It bumps
// I (compare-and-set) and starts over, and every token of the old lifetime
// is below every token of the new one, whichever claim reaches Postgres
// first. This does not depend on a claim being rejected: a partition with no
// fencing row, or stored epochs below the new lifetime's, are covered too.
//
// Why register before confirming: a worker frozen between its confirmation
// and its claim (a GC pause, a slow network) may wake after a reset. Its
// registration then predates the reset and is seen by the new lifetime; its
// incarnation was read before the reset, so its claim carries the old one.
//
// A tie (the stored token is ours exactly, claimed by another claimant)
// cannot be settled by the epoch: once the coordinator confirms us again,
// we bump too. A bump never lets anyone in (fence.Store.BumpIncarnation).
// docs/fencing.md walks through it; the Promela model in docs/model checks it.
//
// prepared says whether prepared batches may hold the partition's row
// (mayHavePrepared): the claim resolves them first (claimRow).
func (c *Consumer) claimOne(ctx context.Context, cl *kgo.Client, l *lane, start int64, rd *round, prepared bool) (sink.Claimed, error) {
	v := int32(-1) // KIP-848: learn the group epoch first
	if c.cfg.Protocol != NextGen {
		v = l.epoch
	}
	if rd != nil {
		v = rd.epoch
	}
	tie := false
	var last error // the last rejection
	for n := 0; n < maxClaimRounds; n++ {
		if rd == nil {
			var err error
			if rd, err = c.prepare(ctx, cl, l.owner, l.epoch, v, []string{l.key.Topic}); err != nil {
				return sink.Claimed{}, err
			}
			v = rd.epoch
		}
		r := rd
		rd = nil // the next round registers and confirms again
		if !r.grant.holds(l.key.Topic, l.key.Partition) {
			return sink.Claimed{}, fmt.Errorf("%w: the group coordinator does not confirm that member %s holds %s at epoch %d",
				sink.ErrFenced, l.owner, l.key, l.epoch)
		}
		if c.cfg.Protocol == NextGen && r.grant.groupEpoch != v {
			// The group epoch moved between our registration and the
			// confirmation: register the current one.
			v = r.grant.groupEpoch
			continue
		}
		if r.reg.HighEpoch > v || tie {
			if err := c.bump(ctx, l, r, v, tie); err != nil {
				return sink.Claimed{}, err
			}
			tie = false
			continue
		}
		token := sink.Token{Incarnation: r.reg.Incarnation, Epoch: v}
		if c.cfg.Hooks.BeforeClaim != nil {
			c.cfg.Hooks.BeforeClaim(ctx, l.key, token)
		}
		creq := sink.ClaimRequest{
			Partition: l.key, Token: token, Owner: l.owner, ClaimID: l.claimID,
			StartOffset: start, PartitionCount: l.partitions, TopicID: l.topicID,
		}
		claimed, err := c.claimRow(ctx, cl, l, creq, prepared)
		if err == nil {
			if n := claimed.StaleSessionsEnded; n > 0 {
				c.stats.staleSessionsEnded.Add(int64(n))
				l.log.Warn("ended the session of an older owner of this partition that held its fencing row (stopped between its fence and its COMMIT)",
					zap.Int("sessions", n))
			}
			l.claimedOnce, l.fresh = true, true
			l.token = token
			l.logEpoch = claimed.LogEpoch
			l.next = claimed.NextOffset
			l.log = l.baseLog.With(zap.Stringer("token", token))
			c.stats.claims.Add(1)
			l.log.Info(MsgClaimed, zap.Int64("next_offset", claimed.NextOffset))
			c.afterClaim(l.key, token, claimed.NextOffset, nil)
			return claimed, nil
		}
		var fe *sink.FencedError
		if !errors.As(err, &fe) {
			return sink.Claimed{}, err
		}
		c.afterClaim(l.key, token, -1, err)
		if fe.Superseded() {
			return sink.Claimed{}, err // a newer lane of this member holds it: nothing to bump or retry
		}
		// Rejected. Another round finds out why: a newer incarnation (we
		// register under it), a higher token (the coordinator no longer
		// confirms us, or the epochs restarted), or a tie.
		tie = fe.Tie()
		last = err
		l.log.Info("claim rejected; registering and confirming again", zap.Error(err), zap.Int("round", n+1),
			zap.Stringer("claim_token", token), zap.Int64("start_offset", start))
	}
	return sink.Claimed{}, fmt.Errorf("claiming %s: no accepted claim after %d rounds of registering and confirming; the last rejection: %v",
		l.key, maxClaimRounds, last)
}

// Bounds of a claim statement's wait for the fencing row's lock. A commit
// in flight holds it for a moment; an older claimant's session stopped in
// its transaction is ended by the claim (sink.Store.Claim's watch); a
// prepared batch holds it until it is decided, which the claim does first
// (claimRow). What is left after claimLockTries waits is a lock this claim
// cannot end: the partition is held as stalled with the reason, and its
// lane tries again by itself, rather than the claim waiting out the claim
// timeout.
const (
	claimLockWait  = time.Second
	claimLockTries = 3
)

// claimRow runs the claim statement of l's claim round: it first decides
// the partition's prepared batches of older claims (resolvePrepared), in
// either mode: a plain worker meets one when a rolling restart turned
// --strict off, or a strict owner died, and each holds the fencing row's
// lock until it is decided. prepared says whether there may be any; a
// lock wait that times out makes the next try look in any case (a batch
// prepared after the listing).
//
// Errors that retrying within this claim cannot mend end it at once
// (errStuck): a prepared batch this worker's role may not finish
// (sink.PreparedOwnerError), a lock it cannot end, a privilege its role
// lacks.
func (c *Consumer) claimRow(ctx context.Context, cl *kgo.Client, l *lane, req sink.ClaimRequest, prepared bool) (sink.Claimed, error) {
	req.LockTimeout = claimLockWait
	var claimed sink.Claimed
	waits := 0
	err := c.retry(ctx, "claim", l.log, func() error {
		if prepared || waits > 0 {
			if err := c.resolvePrepared(ctx, cl, l, req.Token); err != nil {
				var oe *sink.PreparedOwnerError
				if errors.As(err, &oe) {
					return stuck(err)
				}
				return err
			}
		}
		var err error
		claimed, err = c.store.Claim(ctx, req)
		if sink.IsInsufficientPrivilege(err) {
			return stuck(fmt.Errorf("the database role may not claim %s (grant it the schema's worker role: tenure migrate --print-roles): %w", l.key, err))
		}
		if sink.SQLState(err) == sink.CodeLockNotAvailable {
			if waits++; waits >= claimLockTries {
				return stuck(c.lockedRowError(ctx, l, err))
			}
		}
		return err
	})
	return claimed, err
}

// lockedRowError says why a claim gave up waiting for the fencing row's
// lock, naming the partition's prepared batches if there are any.
func (c *Consumer) lockedRowError(ctx context.Context, l *lane, err error) error {
	why := "by a session this claim may not end (not an older claimant's batch transaction, or the privilege to end it is missing)"
	if _, gids, lerr := c.store.ListPrepared(ctx, l.key); lerr == nil && len(gids) > 0 {
		why = fmt.Sprintf("by prepared batch(es) %s, which this claim may not decide (of a claim at or above its token)", strings.Join(gids, ", "))
	}
	return fmt.Errorf("the fencing row of %s stayed locked through %d waits of %s, %s: %w", l.key, claimLockTries, claimLockWait, why, err)
}

// claimFailedError is the cause a lane recovers from when its claim at
// assignment could not be made (claimLater): its partition is recorded as
// stalled at once, with the reason.
type claimFailedError struct{ err error }

func (e claimFailedError) Error() string { return e.err.Error() }
func (e claimFailedError) Unwrap() error { return e.err }

// bump moves the group's incarnation on from the one registered in r, once
// the coordinator has confirmed epoch v after that registration: either an
// epoch above v was registered (the group's epochs restarted) or a claim at
// our very token is stored (tie).
func (c *Consumer) bump(ctx context.Context, l *lane, r *round, v int32, tie bool) error {
	why := "the group's epochs restarted"
	reason := fmt.Sprintf("epoch %d of member %s is confirmed for %s but epoch %d is registered under incarnation %d: the group's epochs restarted",
		v, l.owner, l.key, r.reg.HighEpoch, r.reg.Incarnation)
	restarted := r.reg.HighEpoch > v
	if !restarted {
		why = "a tie: another claim holds the same token"
		reason = fmt.Sprintf("epoch %d of member %s is confirmed for %s but another claim holds token %d.%d: a tie (or a reset that left the epochs where they were)",
			v, l.owner, l.key, r.reg.Incarnation, v)
	}
	var now int64
	var bumped bool
	if err := c.retry(ctx, "bumping incarnation", l.log, func() (err error) {
		now, bumped, err = c.store.BumpIncarnation(ctx, c.cfg.Group, r.reg.Incarnation, l.owner, reason)
		return err
	}); err != nil {
		return err
	}
	if bumped {
		c.stats.resets.Add(1)
	}
	log := l.log.Info
	if restarted {
		log = l.log.Warn
	}
	log(IncarnationMovedOn, zap.String("why", why), zap.Int64("from", r.reg.Incarnation), zap.Int64("to", now),
		zap.Int32("epoch", v), zap.Int64("next_offset", l.next), zap.Bool("bumped_here", bumped), zap.String("reason", reason))
	return nil
}

// round is one round's first two steps: the registration of epoch, then the
// coordinator's confirmation.
type round struct {
	epoch int32 // the epoch registered, to claim with
	reg   fence.Registration
	grant *grant
}

// grant is what the coordinator confirmed about this member.
type grant struct {
	current    bool                      // the member's epoch is current
	parts      map[string]map[int32]bool // KIP-848: partitions the coordinator says the member holds; nil: all
	groupEpoch int32                     // KIP-848: the group epoch; classic: the generation confirmed
}

func (g *grant) holds(topic string, p int32) bool {
	if !g.current {
		return false
	}
	return g.parts == nil || g.parts[topic][p]
}

// prepare registers epoch v and then has the coordinator confirm that member
// is current at memberEpoch and holds its partitions of topics (see
// claimOne for why in this order). Under KIP-848 the epoch to register is
// the group epoch; v < 0 asks the coordinator for it first.
//
// Classic: a heartbeat carrying the generation and member id is accepted
// only if both are current (else ILLEGAL_GENERATION or UNKNOWN_MEMBER_ID;
// REBALANCE_IN_PROGRESS also means the generation matched); a classic
// member's partitions are fixed per generation.
//
// KIP-848: epochs are per member, so the group is described instead: the
// member must exist at memberEpoch or later, and the partition must be in
// its current assignment, which the coordinator gives to one member at a
// time.
func (c *Consumer) prepare(ctx context.Context, cl *kgo.Client, member string, memberEpoch, v int32, topics []string) (*round, error) {
	if v < 0 {
		g, err := c.confirm(ctx, cl, member, memberEpoch, topics)
		if err != nil {
			return nil, err
		}
		if !g.current {
			return &round{epoch: memberEpoch, grant: g}, nil
		}
		v = g.groupEpoch
	}
	r := &round{epoch: v}
	if err := c.retry(ctx, "registering the epoch", c.log, func() (err error) {
		r.reg, err = c.store.Register(ctx, c.cfg.Group, v, member)
		return err
	}); err != nil {
		return nil, err
	}
	var err error
	r.grant, err = c.confirm(ctx, cl, member, memberEpoch, topics)
	return r, err
}

// confirm asks the coordinator whether member is current at memberEpoch.
func (c *Consumer) confirm(ctx context.Context, cl *kgo.Client, member string, memberEpoch int32, topics []string) (*grant, error) {
	g := &grant{}
	err := c.retry(ctx, "confirming the epoch with the group coordinator", c.log, func() error {
		var err error
		if c.cfg.Protocol == NextGen {
			g.current, g.parts, g.groupEpoch, err = c.describeMember(ctx, cl, member, memberEpoch, topics)
		} else {
			g.current, err = c.heartbeat(ctx, cl, member, memberEpoch)
			g.groupEpoch = memberEpoch
		}
		return err
	})
	return g, err
}

func (c *Consumer) heartbeat(ctx context.Context, cl *kgo.Client, member string, epoch int32) (bool, error) {
	req := kmsg.NewPtrHeartbeatRequest()
	req.Group = c.cfg.Group
	req.Generation = epoch
	req.MemberID = member
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return false, err
	}
	switch err := kerr.ErrorForCode(resp.ErrorCode); {
	case err == nil, errors.Is(err, kerr.RebalanceInProgress):
		return true, nil
	case errors.Is(err, kerr.IllegalGeneration), errors.Is(err, kerr.UnknownMemberID), errors.Is(err, kerr.FencedInstanceID):
		return false, nil
	default:
		return false, err
	}
}

func (c *Consumer) describeMember(ctx context.Context, cl *kgo.Client, member string, epoch int32, topics []string) (bool, map[string]map[int32]bool, int32, error) {
	// kfake describes assignments by topic id only; map ids to names.
	td, err := kadm.NewClient(cl).ListTopics(ctx, topics...)
	if err != nil {
		return false, nil, 0, err
	}
	names := map[[16]byte]string{}
	for _, d := range td {
		if d.Err == nil {
			names[d.ID] = d.Topic
		}
	}
	req := kmsg.NewPtrConsumerGroupDescribeRequest()
	req.Groups = []string{c.cfg.Group}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return false, nil, 0, err
	}
	if len(resp.Groups) != 1 {
		return false, nil, 0, errors.New("malformed consumer group describe response")
	}
	grp := resp.Groups[0]
	if err := kerr.ErrorForCode(grp.ErrorCode); err != nil {
		if errors.Is(err, kerr.GroupIDNotFound) {
			return false, nil, 0, nil
		}
		return false, nil, 0, err
	}
	for _, m := range grp.Members {
		if m.MemberID != member {
			continue
		}
		if m.MemberEpoch < epoch || grp.Epoch < m.MemberEpoch {
			return false, nil, 0, nil
		}
		parts := map[string]map[int32]bool{}
		for _, t := range m.Assignment.TopicPartitions {
			name := t.Topic
			if n, ok := names[t.TopicID]; ok {
				name = n
			}
			if parts[name] == nil {
				parts[name] = map[int32]bool{}
			}
			for _, p := range t.Partitions {
				parts[name][p] = true
			}
		}
		return true, parts, grp.Epoch, nil
	}
	return false, nil, 0, nil
}

// topicLogsOf reads the topics' logs (topicLogs), retrying transient
// errors within ctx.
func (c *Consumer) topicLogsOf(ctx context.Context, cl *kgo.Client, topics []string, offsets bool) (map[string]*topicLog, error) {
	var out map[string]*topicLog
	err := c.retry(ctx, "metadata", c.log, func() (err error) {
		out, err = topicLogs(ctx, cl, topics, offsets)
		return err
	})
	return out, err
}

// watchLayouts reads the topics' partition counts from Kafka every
// layoutWatch (at once first) and acts on two things:
//
//   - a count that changed since the last read: kgo refreshes its metadata
//     only every few minutes (MetadataMaxAge), and a classic group's leader
//     assigns new partitions only once its metadata shows them, so the
//     refresh is forced now. This must not depend on the recorded count: an
//     operator who adds partitions and acknowledges them at once leaves
//     nothing for the layout check below to see, and the new partitions
//     stayed unowned, with jobs waiting, until kgo's next refresh;
//   - a count that differs from the one the group recorded: assignments
//     check it too, but a worker whose assignment does not change would
//     otherwise go on processing a topic whose keys now map elsewhere. Every
//     lane of the topic finishes its batch and waits for the operator's
//     acknowledgement.
func (c *Consumer) watchLayouts(ctx context.Context, cl *kgo.Client) {
	t := time.NewTicker(layoutWatch)
	defer t.Stop()
	warned := map[string]int32{}
	seen := map[string]int32{} // Kafka's count at the last read
	for first := true; ; first = false {
		if !first {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
		logs, err := topicLogs(ctx, cl, c.cfg.Topics, false)
		if err != nil {
			c.log.Debug("partition count check skipped", zap.Error(err))
			continue
		}
		for topic, tl := range logs {
			n := tl.partitions
			if old, ok := seen[topic]; ok && old != n {
				c.log.Warn(MsgPartitionCountChanged, zap.String("topic", topic), zap.Int32("from", old), zap.Int32("to", n))
				cl.ForceMetadataRefresh()
			}
			seen[topic] = n
			err := c.store.CheckLayout(ctx, c.cfg.Group, topic, n)
			if !errors.Is(err, sink.ErrPartitionsChanged) {
				continue
			}
			if warned[topic] != n {
				warned[topic] = n
				c.log.Error("topic partitions changed: not processing it", zap.String("topic", topic), zap.Error(err))
				cl.ForceMetadataRefresh()
			}
			c.holdTopic(topic, n)
		}
	}
}

// holdTopic makes every lane of topic wait for the acknowledgement of n
// partitions.
func (c *Consumer) holdTopic(topic string, n int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, l := range c.lanes {
		if k.topic == topic {
			l.holdForLayout(n)
		}
	}
}
