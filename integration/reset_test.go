package integration

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/tenure-dev/tenure/consumer"
)

// Deleting the group restarts its epochs at 1, below the tokens stored in
// Postgres. New workers must resume on their own (the incarnation moves on
// once the coordinator confirms their epoch), and a zombie from before the
// reset must stay fenced.
// storeAHighToken produces 20 jobs and raises the group's epochs: a worker
// (with args) commits them, a second joins, and both leave, so that the
// stored token is above what a fresh group starts at.
func (e *env) storeAHighToken(args ...string) {
	e.t.Helper()
	e.produce(jobsFor(keys, 0, 20)...)
	w1 := e.startWorker("W1", args...)
	waitCommitted(e.t, e, 0, 20, "")
	w2 := e.startWorker("W2", args...)
	waitForMembers(e.t, e, 2)
	w2.stop(30 * time.Second)
	w1.stop(30 * time.Second)
}

func TestGroupDeletedWorkersResumeAndZombieStaysFenced(t *testing.T) {
	t.Parallel()
	eachProtocol(t, 1, func(t *testing.T, e *env, proto string) {
		e.storeAHighToken("--protocol", proto)

		// The zombie: takes the partition, holds a batch, and is frozen.
		e.produce(jobsFor(keys, 20, 10)...)
		z := e.startWorker("Z", "--protocol", proto, "--hold-once", "before-batch")
		held := z.waitLog(30*time.Second, map[string]any{"msg": "holding"})
		z.pause()
		t.Logf("zombie Z frozen with token %v holding [%v,%v)", held["token"], held["from"], held["to"])

		// Z is evicted; the group, now empty, is deleted.
		deleteGroupWhenEmpty(t, e)

		n := e.startWorker("N", "--protocol", proto)
		n.waitLog(60*time.Second, map[string]any{"msg": consumer.IncarnationMovedOn})
		claimed := n.waitLog(60*time.Second, map[string]any{"msg": consumer.MsgClaimed})
		if !tokenLess(t, held["token"].(string), claimed["token"].(string)) {
			t.Fatalf("N's token %v is not above the zombie's %v", claimed["token"], held["token"])
		}
		waitCommitted(t, e, 0, 30, "")

		z.resumeLost(t) // the zombie from before the reset
		checkStopped(t, e, n, z)
	})
}

// An empty group whose committed offsets have expired (tenure mirrors its
// offsets to Kafka while workers run) expires at the broker's retention
// check, and its epochs restart just like after a deletion.
func TestExpiredGroupWorkersResume(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, 1, map[string]string{"offsets.retention.check.interval.ms": "500"})
	if e.real {
		t.Skip("group expiry takes ten minutes on a real cluster")
	}
	e.storeAHighToken()

	// Nothing holds the group now: no members, and no committed offsets once
	// the mirror's have expired (offsets.retention.minutes; here deleted).
	adm := kadm.NewClient(e.cl)
	dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer dcancel()
	if _, err := adm.DeleteOffsets(dctx, e.group, kadm.TopicsSet{e.topic: {0: {}}}); err != nil {
		t.Fatalf("deleting the group's committed offsets: %v", err)
	}
	waitFor(t, 60*time.Second, "the empty group to expire", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		lg, err := adm.ListGroups(ctx)
		if err != nil {
			return false
		}
		_, ok := lg[e.group]
		return !ok
	})

	e.produce(jobsFor(keys, 20, 10)...)
	n := e.startWorker("N")
	n.waitLog(60*time.Second, map[string]any{"msg": consumer.IncarnationMovedOn})
	waitCommitted(t, e, 0, 30, "")
	checkStopped(t, e, n)
}

// deleteGroupWhenEmpty waits for the group to empty (its members evicted)
// and deletes it.
func deleteGroupWhenEmpty(t *testing.T, e *env) {
	t.Helper()
	adm := kadm.NewClient(e.cl)
	waitFor(t, 60*time.Second, "the group to be empty and deleted", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := adm.DeleteGroup(ctx, e.group)
		return err == nil && resp.Err == nil
	})
}

// The narrowest window: a worker confirmed by the coordinator is frozen just
// before its claim, the group is reset and a new worker takes over under a
// new incarnation. Waking up, the old worker must not pair its old epoch with
// the new incarnation: its claim loses, and the coordinator no longer
// confirms it.
func TestZombieFrozenBeforeClaimAcrossReset(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	e.storeAHighToken()

	z := e.startWorker("Z", "--hold-once", "before-claim")
	zAssigned := z.waitLog(30*time.Second, map[string]any{"msg": "partitions assigned"})
	z.waitLog(30*time.Second, map[string]any{"msg": "holding", "point": "before-claim"})
	z.pause()
	deleteGroupWhenEmpty(t, e)

	e.produce(jobsFor(keys, 20, 10)...)
	n := e.startWorker("N")
	claimed := n.waitLog(60*time.Second, map[string]any{"msg": consumer.MsgClaimed})
	waitCommitted(t, e, 0, 30, "")

	z.resume()
	// Z wakes with its old epoch. Either its claim reaches Postgres and
	// loses to the new incarnation (and the coordinator refuses to confirm
	// it), or kgo reports the partition lost first and the claim is
	// abandoned. It must never claim.
	z.waitLogAny(30*time.Second,
		map[string]any{"msg": consumer.MsgClaimFenced, "fenced": true},
		map[string]any{"msg": consumer.MsgClaimFailed})
	zombie := zAssigned["member"].(string)
	if z.findLog(map[string]any{"msg": consumer.MsgClaimed, "member": zombie}) != nil {
		t.Errorf("the zombie claimed the partition after the reset")
	}
	e.produce(jobsFor(keys, 30, 5)...)
	waitCommitted(t, e, 0, 35, "")
	h := checkStopped(t, e, n, z)
	for _, en := range h.Log {
		if en.Owner == zombie {
			t.Errorf("the zombie is in the fence log: %+v (N claimed with %v)", en, claimed["token"])
		}
	}
}
