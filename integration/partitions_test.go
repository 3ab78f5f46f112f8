package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tenure-dev/tenure/partition"
)

// The log line a worker writes when it refuses a topic whose partition
// count changed, and the one when the new count was acknowledged.
var (
	layoutRefused = map[string]any{"msg": "topic partitions changed: not processing it"}
	layoutResumed = map[string]any{"msg": "partition count acknowledged: processing resumes"}
)

// Adding partitions remaps keys. Workers must stop processing the topic
// when they see the new count, commit nothing for it until an operator runs
// `tenure admin topic acknowledge-partitions`, then resume on their own, and
// every job must end up committed exactly once.
//
// Both protocols: a KIP-848 coordinator reassigns as soon as partitions are
// added; a classic group's leader does once its metadata shows them, which
// the workers force when their own check sees the new count.
func TestPartitionCountChange(t *testing.T) {
	t.Parallel()
	for _, proto := range []string{"classic", "consumer"} {
		t.Run(proto, func(t *testing.T) {
			t.Parallel()
			testPartitionCountChange(t, proto)
		})
	}
}

// twoWorkersOnAGrowingTopic starts workers A and B (on protocol proto)
// on a topic of before partitions, produces n jobs over 40 keys (ks) and
// waits until both are members and every job is committed.
func twoWorkersOnAGrowingTopic(t *testing.T, proto string, before int32, n int) (e *env, a, b *worker, ks []string) {
	t.Helper()
	e = newEnv(t, before)
	if e.real {
		t.Skip("needs kfake's short KIP-848 session timeouts")
	}
	ks = partitionKeys(40)
	e.produce(jobsFor(ks, 0, n)...)
	a = e.startWorker("A", "--protocol", proto)
	b = e.startWorker("B", "--protocol", proto)
	for p := range before {
		waitCommitted(t, e, p, e.highWatermark(p), "")
	}
	waitForMembers(t, e, 2)
	return e, a, b, ks
}

// addPartitions adds n partitions to e's topic.
func (e *env) addPartitions(n int) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := kadm.NewClient(e.cl).CreatePartitions(ctx, n, e.topic)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		e.t.Fatalf("adding partitions: %v", err)
	}
}

func testPartitionCountChange(t *testing.T, proto string) {
	const before, after = 2, 4
	e, a, b, ks := twoWorkersOnAGrowingTopic(t, proto, before, 80)
	brokers := strings.Join(e.brokers, ",")

	// Add partitions. The group rebalances onto four partitions and the
	// workers refuse the topic.
	e.addPartitions(after - before)
	// Both workers hold partitions of the topic, so both must refuse it.
	refusal := a.waitLog(60*time.Second, layoutRefused)
	b.waitLog(60*time.Second, layoutRefused)
	msg := fmt.Sprint(refusal["error"])
	for _, want := range []string{fmt.Sprintf("now has %d partitions", after), fmt.Sprintf("recorded %d", before),
		"two owners", "out of order", "tenure admin topic acknowledge-partitions", e.group} {
		if !strings.Contains(msg, want) {
			t.Errorf("the refusal should say %q: %s", want, msg)
		}
	}
	if refusal["topic"] != e.topic {
		t.Errorf("refusal names topic %v, want %s", refusal["topic"], e.topic)
	}
	t.Logf("refusal: %s", msg)

	// Jobs keep coming, to every partition, keyed as murmur2 now says.
	mark := fenceLogMark(t, e)
	atMark := map[int32]int64{}
	for p := range int32(before) {
		atMark[p] = fenceRow(t, e, p).next
	}
	e.produceMurmur(after, jobsFor(ks, 80, 120)...)
	for p := range int32(after) {
		if e.highWatermark(p) == 0 {
			t.Fatalf("partition %d got no job; pick other keys", p)
		}
	}

	// Meanwhile, nothing is committed for the topic, on its old partitions
	// or its new ones: watch for several of the lanes' re-check periods.
	for range 4 {
		time.Sleep(2 * time.Second)
		if n := topicCommitsSince(t, e, mark); n != 0 {
			t.Fatalf("%d commits for topic %s after its partition count changed, before any acknowledgement: %v", n, e.topic, fenceLogSince(t, e, mark))
		}
	}
	// The new partitions are claimed at once (so that whoever held them
	// before, in an earlier layout, is fenced from now on), but nothing is
	// processed on them: their stored offsets are still where they started.
	for p := int32(before); p < after; p++ {
		if f := fenceRow(t, e, p); f.next != 0 {
			t.Fatalf("new partition %d: want it claimed at offset 0 before the acknowledgement, got %+v", p, f)
		}
	}
	for p := range int32(before) {
		if got := fenceRow(t, e, p).next; got != atMark[p] {
			t.Fatalf("partition %d moved from %d to %d while the topic was refused", p, atMark[p], got)
		}
	}

	// The operator acknowledges with the CLI; the workers resume by
	// themselves.
	r := runCLI(t, 60*time.Second, "", "admin", "topic", "acknowledge-partitions", "--brokers", brokers,
		"--database-url", e.dbURL, "--schema", e.schema, "--group", e.group, "--topic", e.topic, "--actor", "ops@test")
	if r.code != 0 {
		t.Fatalf("acknowledge-partitions: %s", r)
	}
	out := strings.TrimSpace(r.stdout)
	if strings.Contains(out, "\n") || !strings.Contains(out, fmt.Sprintf("at %d partitions (was %d)", after, before)) ||
		!strings.Contains(out, "ordering hazard") {
		t.Errorf("acknowledge-partitions should say what changed and the hazard in one line: %q", out)
	}
	t.Logf("acknowledge-partitions: %s", out)

	for p := range int32(after) {
		waitCommitted(t, e, p, e.highWatermark(p), "")
	}
	if a.findLog(layoutResumed) == nil && b.findLog(layoutResumed) == nil {
		t.Errorf("no worker logged %v", layoutResumed)
	}
	// A second acknowledgement changes nothing and says so.
	r = runCLI(t, 60*time.Second, "", "admin", "topic", "acknowledge-partitions", "--brokers", brokers, "--partitions", fmt.Sprint(after),
		"--database-url", e.dbURL, "--schema", e.schema, "--group", e.group, "--topic", e.topic)
	if r.code != 0 || !strings.Contains(r.stdout, "nothing changed") {
		t.Errorf("acknowledging again: %s", r)
	}
	a.stop(30 * time.Second)
	b.stop(30 * time.Second)
	checkRun(t, e, expect{partitions: allPartitions(after), deadLetters: true, atEnd: true})
	for _, w := range []*worker{a, b} {
		select {
		case <-w.done:
		default:
			t.Errorf("%s did not exit", w.name)
		}
	}
}

// An operator who adds partitions and acknowledges the new count at once,
// before any worker has noticed the change: the workers' own check then
// never sees a recorded count that differs from Kafka's, and nothing made
// kgo refresh its metadata, which it does every five minutes by default. A
// classic group's leader assigns new partitions only once its metadata
// shows them: the new partitions stayed unowned for minutes, with jobs
// waiting. The workers now act on Kafka's count changing, whatever the
// recorded count says.
func TestPartitionsAcknowledgedBeforeTheWorkersNotice(t *testing.T) {
	t.Parallel()
	for _, proto := range []string{"classic", "consumer"} {
		t.Run(proto, func(t *testing.T) {
			t.Parallel()
			const before, after = 2, 4
			e, a, b, ks := twoWorkersOnAGrowingTopic(t, proto, before, 40)
			brokers := strings.Join(e.brokers, ",")
			e.addPartitions(after - before)
			r := runCLI(t, 60*time.Second, "", "admin", "topic", "acknowledge-partitions", "--brokers", brokers, "--partitions", fmt.Sprint(after),
				"--database-url", e.dbURL, "--schema", e.schema, "--group", e.group, "--topic", e.topic, "--actor", "ops@test")
			if r.code != 0 {
				t.Fatalf("acknowledge-partitions: %s", r)
			}
			added := time.Now()
			e.produceMurmur(after, jobsFor(ks, 40, 80)...)
			for p := range int32(after) {
				if e.highWatermark(p) == 0 {
					t.Fatalf("partition %d got no job; pick other keys", p)
				}
			}
			// Within the workers' partition count check (5s), a
			// rebalance, and a claim.
			waitFor(t, 30*time.Second, "every partition, the new ones too, to be processed", func() bool {
				for p := range int32(after) {
					if fenceRow(t, e, p).next < e.highWatermark(p) {
						return false
					}
				}
				return true
			})
			t.Logf("all %d partitions processed %s after the partitions were added and acknowledged", after, time.Since(added).Round(time.Millisecond))
			a.stop(30 * time.Second)
			b.stop(30 * time.Second)
			checkRun(t, e, expect{partitions: allPartitions(after), atEnd: true})
		})
	}
}

// partitionKeys returns n distinct keys.
func partitionKeys(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("customer-%02d", i)
	}
	return out
}

// produceMurmur produces jobs with a new client (so that its metadata shows
// the topic's current partitions) and checks that each went to the
// partition murmur2 gives its key for a topic of n partitions.
func (e *env) produceMurmur(n int32, jobs ...[2]string) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	waitFor(e.t, 30*time.Second, fmt.Sprintf("topic %s to have %d partitions", e.topic, n), func() bool {
		td, err := kadm.NewClient(e.cl).ListTopics(ctx, e.topic)
		return err == nil && len(td[e.topic].Partitions) == int(n)
	})
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...), kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))
	if err != nil {
		e.t.Fatal(err)
	}
	defer cl.Close()
	for _, j := range jobs {
		r, err := cl.ProduceSync(ctx, recordOf(e.topic, j[0], j[1])).First()
		if err != nil {
			e.t.Fatalf("producing: %v", err)
		}
		if want := partition.For([]byte(j[0]), n); r.Partition != want {
			e.t.Fatalf("key %s went to partition %d, murmur2 says %d of %d", j[0], r.Partition, want, n)
		}
	}
}

func recordOf(topic, key, value string) *kgo.Record {
	return &kgo.Record{Topic: topic, Key: []byte(key), Value: []byte(value)}
}

// fenceLogMark is the newest fence_log id (0 if none).
func fenceLogMark(t *testing.T, e *env) int64 {
	t.Helper()
	var id int64
	if err := e.pool.QueryRow(context.Background(), `SELECT coalesce(max(id), 0) FROM "`+e.schema+`".fence_log`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// topicCommitsSince counts the topic's commits logged after id.
func topicCommitsSince(t *testing.T, e *env, id int64) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM "`+e.schema+`".fence_log
		WHERE kind = 'commit' AND consumer_group = $1 AND topic = $2 AND id > $3`, e.group, e.topic, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func fenceLogSince(t *testing.T, e *env, id int64) []string {
	t.Helper()
	return queryRows(t, e, pgx.RowTo[string], `SELECT kind || ' ' || partition || ' [' || from_offset || ',' || to_offset || ') by ' || owner
		FROM "`+e.schema+`".fence_log WHERE id > $1 ORDER BY id`, id)
}
