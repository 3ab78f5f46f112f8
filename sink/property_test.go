package sink_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tenure-dev/tenure/sink"
)

// TestFenceHistoryProperty lets workers fight over one partition: each claims
// with rising random tokens, commits batches from the offset it last saw, and
// behaves like a zombie after rejections (keeps committing at its old token,
// sometimes believing a rejected batch went through). Then it checks the whole
// history in fence_log, in id order (the fencing row's lock order):
//
//   - G1: commits cover [start, next) in consecutive ranges, no gap, no
//     overlap; every claim resumes at the offset the history reached; the
//     handler's effects cover each offset exactly once; the row agrees.
//   - G2: no entry carries a token lower than any entry before it, and an
//     equal token never changes owner.
//   - G3: every commit is by the holder of the latest claim.
//
// TENURE_FENCE_SEED replays a run.
func TestFenceHistoryProperty(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("TENURE_FENCE_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("TENURE_FENCE_SEED: %v", err)
		}
	}
	t.Logf("seed %d (TENURE_FENCE_SEED replays it)", seed)

	// Enough connections that a rejected commit's second read (outside the
	// transaction) never waits for a connection.
	e := setupPool(t, sizedPool(t, 2*fightWorkers+2))
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	f := &fight{t: t, e: e, ctx: ctx}
	f.run(seed)
	if ctx.Err() != nil {
		t.Fatalf("ran out of time after %d ops: %v", f.ops.Load(), ctx.Err())
	}
	t.Logf("%d operations; claims %d accepted, %d rejected; commits %d accepted, %d rejected, %d rolled back by the handler",
		min(f.ops.Load(), fightMaxOps), f.claimsOK.Load(), f.claimsRejected.Load(), f.commitsOK.Load(), f.commitsRejected.Load(), f.rbk.Load())
	f.checkHistory()
}

const (
	fightWorkers  = 8
	fightTotalOps = 200
	// A schedule drawn at random may not reach what the test is about (a
	// run once had 3 accepted claims, all by one worker, and no rejected
	// commit): past fightTotalOps it goes on, up to fightMaxOps, until it
	// has seen an accepted commit, a rejected one and a hand-off.
	fightMaxOps = 10 * fightTotalOps
	fightStart  = 1000
)

// fight is TestFenceHistoryProperty's run: its workers and what they saw.
type fight struct {
	t   *testing.T
	e   *env
	ctx context.Context

	ops                                                       atomic.Int64
	claimsOK, claimsRejected, commitsOK, commitsRejected, rbk atomic.Int64
	granted                                                   coordinator
	claimMu                                                   sync.Mutex
	lastClaimant                                              string
	handOffsSeen                                              atomic.Int64
}

// run lets the workers fight until the schedule ends.
func (f *fight) run(seed uint64) {
	var wg sync.WaitGroup
	for w := range fightWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.worker(rand.New(rand.NewPCG(seed, uint64(w))), "w"+strconv.Itoa(w))
		}()
	}
	wg.Wait()
}

func (f *fight) exercised() bool {
	return f.commitsOK.Load() > 0 && f.commitsRejected.Load() > 0 && f.handOffsSeen.Load() > 0
}

func (f *fight) more() bool {
	n := f.ops.Add(1)
	return f.ctx.Err() == nil && (n <= fightTotalOps || (n <= fightMaxOps && !f.exercised()))
}

// worker is one worker's loop. It runs on a goroutine of its own: it
// reports with t.Errorf and returns, never t.Fatal.
func (f *fight) worker(rng *rand.Rand, owner string) {
	t, e, ctx := f.t, f.e, f.ctx
	next := sink.Token{Epoch: int32(1 + rng.IntN(5))} // the token it will claim with next
	var (
		held  bool       // it believes it holds the partition
		token sink.Token // at this token
		from  int64      // from this offset
	)
	for f.more() {
		if !held || rng.IntN(4) == 0 {
			switch r := rng.IntN(25); {
			case r == 0: // a group reset: the incarnation moves on (as a member that
				// sees epochs restart, or admin group delete, does), epochs restart low
				cur, err := e.store.Incarnation(ctx, part.Group)
				if err == nil {
					cur, _, err = e.store.BumpIncarnation(ctx, part.Group, cur, owner, "property test reset")
				}
				if err != nil {
					if ctx.Err() == nil {
						t.Errorf("%s: reset: %v", owner, err)
					}
					return
				}
				next = f.granted.reset(sink.Token{Incarnation: cur, Epoch: int32(rng.IntN(3))})
			case r < 12: // the coordinator grants it the newest generation
				next = f.granted.next(next, int32(1+rng.IntN(2)))
			default: // its own idea, possibly stale
				next.Epoch += int32(1 + rng.IntN(3))
			}
			c, err := e.store.Claim(ctx, sink.ClaimRequest{Partition: part, Token: next, Owner: owner, StartOffset: fightStart, PartitionCount: 4})
			switch {
			case err == nil:
				f.claimsOK.Add(1)
				held, token, from = true, next, c.NextOffset
				f.claimMu.Lock()
				if f.lastClaimant != "" && f.lastClaimant != owner {
					f.handOffsSeen.Add(1)
				}
				f.lastClaimant = owner
				f.claimMu.Unlock()
				if c.PartitionCount != 4 {
					t.Errorf("%s: partition count %d, want 4", owner, c.PartitionCount)
				}
			case errors.Is(err, sink.ErrFenced):
				f.claimsRejected.Add(1) // a zombie keeps its old belief
			case ctx.Err() != nil:
				return
			default:
				t.Errorf("%s: claim at %s: %v", owner, next, err)
				return
			}
			continue
		}
		req := sink.CommitRequest{Partition: part, Token: token, Owner: owner, From: from, To: from + 1 + int64(rng.IntN(5))}
		committed, err := commitOnce(ctx, e, req, rng.IntN(10) == 0)
		switch {
		case err == nil && committed:
			f.commitsOK.Add(1)
			from = req.To
		case err == nil:
			f.rbk.Add(1) // the handler failed after the fence: retry the batch
		case errors.Is(err, sink.ErrFenced):
			f.commitsRejected.Add(1)
			switch rng.IntN(3) {
			case 0: // a well-behaved worker drops the partition
				held = false
			case 1: // a zombie that believes the batch went through
				from = req.To
			}
		case ctx.Err() != nil:
			return
		default:
			t.Errorf("%s: commit %+v: %v", owner, req, err)
			return
		}
	}
}

// checkHistory checks G1-G3 on fence_log, the row and the effects.
func (f *fight) checkHistory() {
	t, e := f.t, f.e
	t.Helper()
	log := e.fenceLog(t, part)
	var nClaims, nCommits, handOffs int64
	var (
		holder    sink.Token
		holderOwn string
		maxTok    sink.Token
		maxOwn    string
		next      int64 = fightStart
	)
	for i, l := range log {
		if i == 0 {
			if l.Kind != "claim" {
				t.Fatalf("history starts with %+v, want a claim", l)
			}
		} else {
			// G2
			if l.Token.Less(maxTok) {
				t.Errorf("G2: %+v accepted after token %s", l, maxTok)
			} else if l.Token == maxTok && l.Owner != maxOwn {
				t.Errorf("G2: %+v accepted while %q held token %s", l, maxOwn, maxTok)
			}
		}
		if i == 0 || maxTok.Less(l.Token) {
			maxTok, maxOwn = l.Token, l.Owner
		}
		switch l.Kind {
		case "claim":
			nClaims++
			if l.From != next || l.To != next {
				t.Errorf("G1: claim %+v resumed at [%d, %d), history is at %d", l, l.From, l.To, next)
			}
			if i > 0 && l.Owner != holderOwn {
				handOffs++
			}
			holder, holderOwn = l.Token, l.Owner
		case "commit":
			nCommits++
			if l.Token != holder || l.Owner != holderOwn {
				t.Errorf("G3: commit %+v accepted while %q holds the partition at %s", l, holderOwn, holder)
			}
			if l.From != next {
				t.Errorf("G1: commit %+v starts at %d, previous commit ended at %d (gap or overlap)", l, l.From, next)
			}
			if l.To <= l.From {
				t.Errorf("commit %+v does not advance", l)
			}
			next = l.To
		default:
			t.Errorf("unknown kind in %+v", l)
		}
	}
	if nClaims != f.claimsOK.Load() || nCommits != f.commitsOK.Load() {
		t.Errorf("fence_log has %d claims and %d commits; the workers saw %d and %d accepted",
			nClaims, nCommits, f.claimsOK.Load(), f.commitsOK.Load())
	}
	row := e.mustGet(t, part)
	if row.NextOffset != next || row.Token != holder || row.Owner != holderOwn {
		t.Errorf("row = %s %q at %d; history ends with %s %q at %d", row.Token, row.Owner, row.NextOffset, holder, holderOwn, next)
	}
	e.checkEffectsExactlyOnce(t, part, fightStart, next)
	if nCommits == 0 || f.commitsRejected.Load() == 0 || handOffs == 0 {
		t.Errorf("the run did not exercise the fence: %d commits, %d rejected, %d hand-offs", nCommits, f.commitsRejected.Load(), handOffs)
	}
	t.Logf("history: %d entries, %d hand-offs, next offset %d", len(log), handOffs, next)
}

// commitOnce is e.commit for goroutines other than the test's: it reports
// instead of failing. With rollback, the handler "fails" after an accepted
// Commit and the transaction is rolled back.
func commitOnce(ctx context.Context, e *env, req sink.CommitRequest, rollback bool) (committed bool, err error) {
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if err := e.handleCtx(ctx, tx, req); err != nil {
		return false, err
	}
	if err := e.store.Commit(ctx, tx, req); err != nil {
		return false, err
	}
	if rollback {
		return false, tx.Rollback(ctx)
	}
	return true, tx.Commit(ctx)
}

// coordinator hands out ever higher tokens, like a group coordinator's
// generations, to the workers that ask it.
type coordinator struct {
	mu  sync.Mutex
	top sink.Token
}

// reset starts a new group lifetime at t, unless a newer one has started:
// it returns the token the coordinator grants now.
func (c *coordinator) reset(t sink.Token) sink.Token {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.top.Incarnation < t.Incarnation {
		c.top = t
	}
	return c.top
}

// next returns a token above both the highest granted and mine.
func (c *coordinator) next(mine sink.Token, step int32) sink.Token {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.top.Less(mine) {
		c.top = mine
	}
	c.top.Epoch += step
	return c.top
}
