package consumer

// Strict hand-off (Config.Strict, "G3-strict"): a batch becomes visible
// only if the group coordinator accepted the batch's offset commit while
// the batch's assignment was the partition's current one. The lane ends the
// batch's transaction with PREPARE TRANSACTION, commits the batch's offset
// to the coordinator with a raw OffsetCommit at its OWN assignment's member
// id and generation (classic) or member epoch (KIP-848), and COMMIT PREPARED
// only on acceptance; the next claim of the partition resolves whatever a
// lane left prepared, by the group's committed offset read after its own
// assignment. docs/model/strict.pml is the model this file implements
// (docs/fencing.md, "Strict hand-off (G3-strict)").

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/tenure-dev/tenure/internal/fence"
	"github.com/tenure-dev/tenure/sink"
)

// StrictCoordinatorKafka declares (Config.StrictCoordinator) that the
// group coordinator is Apache Kafka's (4.0 or later), whose KIP-848 offset
// commit rule rejects a commit of an ended assignment: up to 4.2 the epoch
// must be the member's, from 4.3 (KIP-1251) the partition must be assigned
// to the member at that epoch or earlier. kfake's rule accepts an older
// epoch's commit for a partition the member no longer holds, so strict
// hand-off cannot hold there (docs/model/strict.pml, kip848-kfake). The
// protocol does not tell the two apart: the operator declares it.
const StrictCoordinatorKafka = "kafka"

// strictMetaGID separates, in a strict offset commit's metadata, the
// mirror's mark and log epoch (mirrorMetadata, so the divergence check
// reads it) from the batch's GID.
const strictMetaGID = " strict="

func strictMetadata(logEpoch int64, gid string) string {
	return mirrorMetadata(logEpoch) + strictMetaGID + gid
}

// strictGIDOf returns the GID a committed offset's metadata names ("" if none).
func strictGIDOf(metadata string) string {
	_, gid, ok := strings.Cut(metadata, strictMetaGID)
	if !ok || !strings.HasPrefix(metadata, mirrorMetaPrefix) {
		return ""
	}
	return gid
}

// Bounds of the strict path.
const (
	strictAnswerTimeout = 10 * time.Second // one OffsetCommit's answer
	strictResendAfter   = 250 * time.Millisecond
)

// StrictRolledBackError is a strict batch that was rolled back: the
// coordinator did not accept its offset commit at the lane's own
// assignment. It matches sink.ErrFenced: the lane recovers (lane.recover)
// as after any rejection, and claims again only where its own assignment
// is known to hold.
type StrictRolledBackError struct {
	GID, Reason string
}

func (e *StrictRolledBackError) Error() string {
	return "strict batch " + e.GID + " rolled back: " + e.Reason
}

// Is makes errors.Is(err, sink.ErrFenced) true.
func (e *StrictRolledBackError) Is(target error) bool { return target == sink.ErrFenced }

// errStrictLeftPrepared: a stopped lane left its batch prepared with the
// coordinator's answer unknown; the next claim of the partition decides it.
var errStrictLeftPrepared = errors.New("strict batch left prepared: the coordinator's answer is unknown; the next claim of the partition resolves it")

// strictCommitter is a strict lane's committer (Config.Strict): the fence
// statement and PREPARE TRANSACTION in one round trip, then the batch's
// offset commit and the decision (preparedBatch.decide).
type strictCommitter struct{}

func (strictCommitter) commit(ctx context.Context, l *lane, t *openTx) (txOwner, error) {
	b := t.b
	p := &preparedBatch{l: l, b: b, sb: fence.StrictBatchOf(t.req)}
	var err error
	p.gid, err = l.c.store.PrepareBatch(ctx, t.tx, t.req, t.marker)
	if err != nil {
		if ok, out := t.refused(err); ok {
			return laneOwnsTx, out
		}
		// The answer to PREPARE was lost: find out whether it happened.
		t.dropSession()
		out, rerr := p.resolvePrepare(t.sess)
		switch {
		case rerr != nil:
			return laneGaveUpTx, rerr
		case out == fence.PreparedThenCommitted:
			return laneGaveUpTx, nil
		case out == fence.NotPrepared:
			// Never prepared (or rolled back by a claim since): the row
			// says whether to retry or recover, as after a lost COMMIT.
			return laneGaveUpTx, l.resolve(t.req, t.sess, err)
		}
	}
	l.log.Debug(MsgStrictPrepared, zap.String("gid", p.gid), zap.Int64("from", b.From), zap.Int64("to", b.To))
	return laneGaveUpTx, p.decide()
}

// preparedBatch is a strict lane's batch from its PREPARE TRANSACTION
// until it is decided: what the steps of the decision share.
type preparedBatch struct {
	l   *lane
	b   *Batch
	sb  fence.StrictBatch // the batch as its GID names it
	gid string
}

// resolvePrepare learns what became of a PREPARE whose answer was lost,
// asking until the database answers or the lane is stopped.
func (p *preparedBatch) resolvePrepare(sess fence.Session) (fence.PrepareOutcome, error) {
	l, gid := p.l, p.gid
	ctx, cancel := l.quitContext()
	defer cancel()
	var out fence.PrepareOutcome
	err := l.c.retry(ctx, "resolving a PREPARE TRANSACTION of unknown outcome", l.log, func() (err error) {
		out, err = l.c.store.ResolvePrepare(ctx, sess, gid)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("%w: the outcome of PREPARE TRANSACTION %s is unknown (the next claim of the partition resolves it): %v", errStopped, gid, err)
	}
	return out, nil
}

// strictTarget is the member id and generation / member epoch the lane
// commits offsets at: its own assignment's, never the client's current
// ones (kgo stores a classic generation from the JoinGroup response, before
// SyncGroup says who holds what). A newer one only where this lane's own
// assignment is known kept there:
//   - classic: through, raised by the assignment callback of every
//     rebalance that left the partition with this lane;
//   - KIP-848: the member epoch the client holds while this lane is still
//     the partition's lane (read, then checked): under KIP-848 a partition
//     leaves a member only once the member acknowledged its revocation,
//     which the revoke callback does after it removed the lane, so an
//     epoch read while the lane is current is one at which the lane's own
//     assignment stood (kgo calls no callback when only the epoch moves).
func (l *lane) strictTarget() (member string, gen int32) {
	if l.c.cfg.UnsafeStrictCurrentGeneration {
		// Tests only: the lane at the client's current member id and
		// generation, what the model (-DCURGEN) shows is unsafe.
		return l.cl.GroupMetadata()
	}
	if l.c.cfg.Protocol == NextGen {
		if m, e := l.cl.GroupMetadata(); m == l.owner && l.current() && e > l.through.Load() {
			l.through.Store(e)
		}
	}
	return l.owner, max(l.epoch, l.through.Load())
}

// strictAnswer is the coordinator's answer to one OffsetCommit.
type strictAnswer int

const (
	strictUnknown  strictAnswer = iota // no answer, or a retriable error: send the identical request again
	strictAccepted                     // per-partition error 0
	strictRejected                     // refused: not accepted, and never will be at that member and generation
)

// decide commits the batch's offset to the coordinator and decides
// the prepared batch gid on the answer: COMMIT PREPARED if accepted; if
// rejected at the lane's own assignment with no newer one known to keep
// it, by the group's committed offset (decideByRecord). One request at a
// time; an unknown answer (transport error, timeout, retriable error) is
// asked again with the identical request, and never decided on.
//
// A rejection is not the answer to every copy of the request. kgo sends a
// request again, inside RequestWith, when the connection broke after it
// was written (EOF, ECONNRESET: isRetryableBrokerErr), and the lane sends
// the identical request again on an unknown answer: a copy the lane never
// heard of may have been accepted before the coordinator moved on and
// refused the copy whose answer came back. So a rejection is decided by
// the record, never by the answer alone: rolling back an accepted batch
// leaves Kafka's committed offset a batch ahead of Postgres, which the next
// claim reads as a database that lost commits (a diverged hold).
// docs/model/strict.pml's lanes do both resends; the rule before this one
// (roll back unless an answer was known lost) fails there (-DLOSTONLY).
//
// Why the record read after the rejection can be trusted:
//   - no copy can be accepted after the rejection: every copy carries the
//     same member id and generation / member epoch, which the coordinator
//     refused, and it never accepts them again (member ids are not reused;
//     generations and member epochs only grow; KIP-1251 accepts an older
//     epoch only for a partition the member holds from that epoch on, and
//     a partition given back is assigned at a newer one). A copy not yet
//     processed when the refusal came (on a broken connection, in the
//     broker's queue) is refused whenever it is. No new copy is sent:
//     kgo's retries end with the call, and the lane sends nothing after a
//     rejection but at a newer generation its own assignment was kept at,
//     whose copies are decided here the same way;
//   - a copy accepted before the rejection is in the record the read sees:
//     the read asks for stable offsets (committedOffsetOf), which Kafka
//     answers only once no offset commit of the partition is pending
//     (UNSTABLE_OFFSET_COMMIT, retried; the KIP-848 coordinator serializes
//     such a read after the writes in flight);
//   - nothing else overwrites the record while the batch is prepared: the
//     mirror is off, and a later claim of the partition must first resolve
//     this batch (it holds the fencing row's lock), by the same record. An
//     earlier batch's late copy can move the record back: this batch is
//     then rolled back although accepted, and the record names a committed
//     batch, behind Postgres, never ahead of it (the model counts it as a
//     lost record). Someone else's commit on the group (an operator's
//     reset) is the known limit (docs/fencing.md).
//
// kgo's own resend is left on: it has no per-request retry setting
// (RequestRetries is the whole client's), and the lane's resend makes the
// same copies anyway; the decision by record covers both.
func (p *preparedBatch) decide() error {
	l, b, gid := p.l, p.b, p.gid
	meta := strictMetadata(l.logEpoch, gid)
	if h := l.c.cfg.Hooks.BeforeOffsetCommit; h != nil {
		h(l.ctx, b, gid)
	}
	member, gen := l.strictTarget()
	var last error
	for attempt := 1; ; attempt++ {
		sentAt := time.Now()
		l.log.Info(MsgStrictSent, zap.String("gid", gid), zap.String("commit_member", member), zap.Int32("generation", gen),
			zap.Int64("offset", b.To), zap.Int("attempt", attempt), zap.Int64("sent_at_ms", sentAt.UnixMilli()))
		if h := l.c.cfg.Hooks.OffsetCommitInFlight; h != nil && attempt == 1 {
			h(l.ctx, b, gid)
		}
		ans, err := p.send(member, gen, meta)
		switch ans {
		case strictAccepted:
			l.log.Info(MsgStrictAnswered, zap.String("gid", gid), zap.Bool("accepted", true), zap.Int32("generation", gen),
				zap.Int("attempt", attempt), zap.Int64("sent_at_ms", sentAt.UnixMilli()))
			if h := l.c.cfg.Hooks.BeforeCommitPrepared; h != nil {
				h(l.ctx, b, gid)
			}
			return p.finish(true, fmt.Sprintf("offset commit accepted at member %s generation %d", member, gen))
		case strictRejected:
			l.log.Info(MsgStrictAnswered, zap.String("gid", gid), zap.Bool("accepted", false), zap.Int32("generation", gen),
				zap.Int("attempt", attempt), zap.Error(err))
			if m, g := l.strictTarget(); g > gen {
				// This lane's own assignment was kept at a newer
				// generation / epoch: the same offset and metadata there.
				member, gen = m, g
				continue
			}
			// Never accepted at this member and generation from now on:
			// whether a copy was accepted before is in the record.
			return p.decideByRecord(fmt.Sprintf("offset commit rejected at member %s generation %d (%v)", member, gen, err))
		}
		if !sameError(err, last) {
			l.log.Warn("strict offset commit: no answer; sending the identical request again (a prepared batch is never rolled back while an answer is unknown)",
				zap.String("gid", gid), zap.Int("attempt", attempt), zap.Error(err))
		}
		last = err
		if l.ctx.Err() != nil {
			// Stopped hard: leave the batch prepared; the next claim of
			// the partition decides it by the group's committed offset.
			l.log.Warn(MsgStrictLeftPrepared, zap.String("gid", gid), zap.Int64("from", b.From), zap.Int64("to", b.To), zap.Error(err))
			return fmt.Errorf("%w: %w", errStopped, errStrictLeftPrepared)
		}
		t := time.NewTimer(doubling(strictResendAfter, 2*time.Second, attempt))
		select {
		case <-t.C:
		case <-l.ctx.Done():
			t.Stop()
		}
	}
}

// send sends one raw OffsetCommit of the batch's end (kgo's CommitOffsets
// would rewrite the generation and rejoin on ILLEGAL_GENERATION) and
// classifies its answer for this partition.
func (p *preparedBatch) send(member string, gen int32, meta string) (strictAnswer, error) {
	l, to := p.l, p.b.To
	req := kmsg.NewPtrOffsetCommitRequest()
	req.Group = l.key.Group
	req.Generation = gen
	req.MemberID = member
	t := kmsg.NewOffsetCommitRequestTopic()
	t.Topic = l.key.Topic
	t.TopicID = l.topicID // v10 names topics by id
	part := kmsg.NewOffsetCommitRequestTopicPartition()
	part.Partition = l.key.Partition
	part.Offset = to
	part.LeaderEpoch = -1
	part.Metadata = kmsg.StringPtr(meta)
	t.Partitions = append(t.Partitions, part)
	req.Topics = append(req.Topics, t)
	// Not the lane's context: stopping the lane must not make an answer
	// unknown that was about to come.
	ctx, cancel := context.WithTimeout(context.Background(), strictAnswerTimeout)
	defer cancel()
	resp, err := req.RequestWith(ctx, l.cl)
	if err != nil {
		return strictUnknown, err
	}
	for _, rt := range resp.Topics {
		if rt.Topic != l.key.Topic && rt.TopicID != l.topicID {
			continue
		}
		for _, rp := range rt.Partitions {
			if rp.Partition != l.key.Partition {
				continue
			}
			perr := kerr.ErrorForCode(rp.ErrorCode)
			switch {
			case perr == nil:
				return strictAccepted, nil
			case errors.Is(perr, kerr.CoordinatorLoadInProgress), errors.Is(perr, kerr.CoordinatorNotAvailable),
				errors.Is(perr, kerr.NotCoordinator), errors.Is(perr, kerr.RequestTimedOut), errors.Is(perr, kerr.NetworkException):
				return strictUnknown, perr
			}
			// ILLEGAL_GENERATION, STALE_MEMBER_EPOCH, UNKNOWN_MEMBER_ID,
			// REBALANCE_IN_PROGRESS, FENCED_MEMBER_EPOCH, and whatever
			// else refuses: not accepted.
			return strictRejected, perr
		}
	}
	return strictUnknown, errors.New("the offset commit response does not mention the partition")
}

// decideByRecord decides the batch by the group's committed offset, read
// after a rejection of its offset commit (decide): commit iff it names the
// batch's GID and is the batch's end.
func (p *preparedBatch) decideByRecord(why string) error {
	l, sb, gid := p.l, p.sb, p.gid
	ctx, cancel := l.recordContext()
	defer cancel()
	var off int64
	var meta string
	err := l.c.retry(ctx, "reading the group's committed offset", l.log, func() (err error) {
		off, meta, err = l.c.committedOffsetOf(ctx, l.cl, l.key)
		if errors.Is(err, kgo.ErrClientClosed) {
			cancel()
		}
		return err
	})
	if err != nil {
		l.log.Warn(MsgStrictLeftPrepared, zap.String("gid", gid), zap.Error(err))
		return fmt.Errorf("%w: %w", errStopped, errStrictLeftPrepared)
	}
	commit := strictGIDOf(meta) == gid && off == sb.To
	return p.finish(commit, fmt.Sprintf("%s; the group's committed offset is %d (metadata %q)", why, off, meta))
}

// recordContext bounds the record's read: as long as the lane runs, and
// strictAnswerTimeout more once it is stopped. A rejection usually comes
// to a lane stopped by the revocation that caused it; deciding then
// releases the batch's locks at once instead of at the next claim.
func (l *lane) recordContext() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-l.quit:
		case <-l.ctx.Done():
		case <-ctx.Done():
			return
		}
		t := time.NewTimer(strictAnswerTimeout)
		defer t.Stop()
		select {
		case <-t.C:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// finish runs COMMIT PREPARED or ROLLBACK PREPARED for the lane's own
// batch, records the decision, and says what became of the batch: nil
// if it committed, a *StrictRolledBackError if not. A batch that is no
// longer prepared was decided by a later claim first; the fence log says
// which way, and the lane goes on as after a COMMIT of unknown outcome.
func (p *preparedBatch) finish(commit bool, evidence string) error {
	l, sb, gid := p.l, p.sb, p.gid
	ctx := context.Background()
	var ferr error
	for attempt := 1; ; attempt++ {
		fctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		ferr = l.c.store.FinishPrepared(fctx, gid, commit)
		cancel()
		if ferr == nil || errors.Is(ferr, sink.ErrNotPrepared) {
			break
		}
		if l.ctx.Err() != nil && attempt >= 3 {
			l.log.Warn(MsgStrictLeftPrepared, zap.String("gid", gid), zap.Bool("decided_commit", commit), zap.Error(ferr))
			return fmt.Errorf("%w: %w", errStopped, errStrictLeftPrepared)
		}
		d := l.c.retryDelay(attempt, ferr)
		l.log.Warn("deciding a prepared batch failed, retrying", zap.String("gid", gid), zap.Bool("commit", commit), zap.Duration("backoff", d), zap.Error(ferr))
		time.Sleep(d)
	}
	committed := commit
	by := "lane"
	if errors.Is(ferr, sink.ErrNotPrepared) {
		by = "another claim"
		err := l.c.retry(context.Background(), "reading what became of a prepared batch", l.log, func() (err error) {
			committed, err = l.c.store.StrictCommitted(ctx, gid)
			return err
		})
		if err != nil {
			return err
		}
	} else if !commit {
		// A lane's own commit is recorded by its fence log entry (and costs
		// no round trip more); a rollback leaves nothing else behind.
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := l.c.store.RecordStrictDecision(rctx, fence.StrictDecision{GID: gid, Batch: sb, Owner: l.owner, Committed: commit,
			Decider: l.owner, DeciderClaimID: l.claimID, Evidence: evidence}); err != nil {
			l.log.Debug("recording a strict decision failed", zap.String("gid", gid), zap.Error(err))
		}
		cancel()
	}
	l.c.noteDatabase()
	l.log.Info(MsgStrictDecided, zap.String("gid", gid), zap.Bool("committed", committed), zap.String("decided_by", by),
		zap.Int64("from", sb.From), zap.Int64("to", sb.To), zap.String("evidence", evidence))
	if committed {
		return nil
	}
	return &StrictRolledBackError{GID: gid, Reason: evidence}
}

// committedOffsetOf reads the group's committed offset of p now, with its
// metadata; -1 and "" if there is none (none committed, or the group does
// not exist: a deleted group's offsets are gone). It asks for stable
// offsets: an offset commit the coordinator accepted but has not finished
// writing is waited for (UNSTABLE_OFFSET_COMMIT is an error here, and the
// callers retry), so a decision by the record never misses an acceptance
// that came before the read.
func (c *Consumer) committedOffsetOf(ctx context.Context, cl *kgo.Client, p sink.Partition) (int64, string, error) {
	resps, err := kadm.NewClient(cl).FetchOffsets(kadm.RequireStable(ctx), p.Group)
	if errors.Is(err, kerr.GroupIDNotFound) {
		return -1, "", nil
	}
	if err != nil {
		return 0, "", err
	}
	r, ok := resps.Lookup(p.Topic, p.Partition)
	switch {
	case !ok:
		return -1, "", nil
	case r.Err != nil && errors.Is(r.Err, kerr.GroupIDNotFound):
		return -1, "", nil
	case r.Err != nil:
		return 0, "", r.Err
	}
	return r.At, r.Metadata, nil
}

// resolvePrepared is a strict claim's first step, once the coordinator has
// confirmed token (registered, then confirmed: claimOne): it lists the
// partition's prepared batches and decides each of an older token than
// token by the group's committed offset, read AFTER the listing (this
// claim's own assignment came before it, so the old assignment can no
// longer get an offset commit accepted): COMMIT PREPARED iff the offset's
// metadata names the batch and the offset is its end, ROLLBACK PREPARED
// otherwise. A batch at token or above is not this claim's to decide: a
// tie (another claimant at our very token: the round bumps) or a newer
// claimant (we are the zombie), reported as a *sink.FencedError.
func (c *Consumer) resolvePrepared(ctx context.Context, cl *kgo.Client, l *lane, token sink.Token) error {
	batches, gids, err := c.store.ListPrepared(ctx, l.key)
	if err != nil || len(batches) == 0 {
		return err
	}
	var older []int
	for i, b := range batches {
		switch {
		case b.Token.Less(token):
			older = append(older, i)
		case b.Token == token && b.ClaimID == l.claimID:
			return fmt.Errorf("claiming %s: this lane's own batch %s is still prepared", l.key, gids[i])
		default:
			return &sink.FencedError{Op: "claim", Partition: l.key, Presented: token, Owner: l.owner, ClaimID: l.claimID,
				Found: true, Current: b.Token, CurrentOwner: "a prepared batch of claim " + strconv.FormatInt(b.ClaimID, 10),
				CurrentClaim: b.ClaimID, NextOffset: b.From}
		}
	}
	if len(older) == 0 {
		return nil
	}
	// Read after the listing: see above.
	off, meta, err := c.committedOffsetOf(ctx, cl, l.key)
	if err != nil {
		return fmt.Errorf("reading the group's committed offset of %s to resolve its prepared batches: %w", l.key, err)
	}
	named := strictGIDOf(meta)
	for _, i := range older {
		b, gid := batches[i], gids[i]
		commit := named == gid && off == b.To
		evidence := fmt.Sprintf("the group's committed offset is %d (metadata %q), read after the claim's assignment", off, meta)
		if h := c.cfg.Hooks.BeforeResolve; h != nil {
			h(ctx, l.key, gid)
		}
		err := c.store.FinishPrepared(ctx, gid, commit)
		by := "this claim"
		switch {
		case errors.Is(err, sink.ErrNotPrepared):
			// Its lane (or another claim) decided it meanwhile.
			by = "its lane"
			if commit, err = c.store.StrictCommitted(ctx, gid); err != nil {
				return err
			}
		case err != nil:
			return err
		default:
			if rerr := c.store.RecordStrictDecision(ctx, fence.StrictDecision{GID: gid, Batch: b, Owner: "", Committed: commit, ByResolver: true,
				Decider: l.owner, DeciderClaimID: l.claimID, Evidence: evidence}); rerr != nil {
				l.log.Debug("recording a strict decision failed", zap.String("gid", gid), zap.Error(rerr))
			}
		}
		c.stats.strictResolved.Add(1)
		l.log.Warn(MsgStrictResolved, zap.String("gid", gid), zap.Bool("committed", commit), zap.String("decided_by", by),
			zap.Stringer("batch_token", b.Token), zap.Int64("batch_claim_id", b.ClaimID), zap.Int64("from", b.From), zap.Int64("to", b.To),
			zap.String("evidence", evidence))
	}
	return nil
}
