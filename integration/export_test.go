package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/effect"
	"github.com/tenure-dev/tenure/export"
	"github.com/tenure-dev/tenure/internal/history"
	"github.com/tenure-dev/tenure/internal/testinfra/weedtest"
)

// exportWorld is an env whose workers export to an object store, with a
// reader loop and (optionally) a garbage collector running throughout.
type exportWorld struct {
	*env
	storeURL string
	store    export.ObjectStore

	stop    chan struct{}
	gcStop  chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	obs     []history.Observation
	reads   int
	errs    []string // reads whose pointer named an object that stayed missing, and other failures
	gcRuns  int
	deleted map[string]string // object -> reason, every GC deletion
}

func newExportWorld(t *testing.T, partitions int32) *exportWorld {
	t.Helper()
	return newExportWorldAt(t, partitions, "file://"+t.TempDir())
}

// newExportWorldAt is newExportWorld with the store at storeURL.
func newExportWorldAt(t *testing.T, partitions int32, storeURL string) *exportWorld {
	t.Helper()
	e := newEnv(t, partitions)
	w := &exportWorld{env: e, storeURL: storeURL, stop: make(chan struct{}), gcStop: make(chan struct{}), deleted: map[string]string{}}
	st, err := export.Open(context.Background(), w.storeURL)
	if err != nil {
		t.Fatal(err)
	}
	w.store = st
	t.Cleanup(w.halt)
	return w
}

func (w *exportWorld) worker(name string, extra ...string) *worker {
	return w.startWorker(name, append([]string{"--export-store", w.storeURL}, extra...)...)
}

// pauseAHolding starts worker A holding once at aHold and waits until it
// holds; starts B with bExtra and waits until it has started and the group
// has both; then freezes A. Both run with the common flags. held is A's
// "holding" line.
func (w *exportWorld) pauseAHolding(aHold string, common []string, bExtra ...string) (a, b *worker, held map[string]any) {
	w.t.Helper()
	a = w.worker("A", append(slices.Clone(common), "--hold-once", aHold)...)
	held = a.waitLog(30*time.Second, map[string]any{"msg": "holding", "point": aHold})
	b = w.worker("B", append(slices.Clone(common), bExtra...)...)
	b.waitLog(30*time.Second, map[string]any{"msg": "worker starting"})
	waitForMembers(w.t, w.env, 2)
	a.pause()
	return a, b, held
}

// read starts a reader loop: every 10ms it reads every key's export with
// export.Get (pointer, object, size and SHA-256 check) and records what it
// saw.
func (w *exportWorld) read(keys []string) {
	w.every(10*time.Millisecond, nil, func() {
		for _, k := range keys {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			b, p, err := export.Get(ctx, w.pool, w.schema, w.store, k)
			cancel()
			var mm *export.MismatchError
			w.mu.Lock()
			w.reads++
			switch {
			case errors.Is(err, export.ErrNoExport):
			case errors.As(err, &mm):
				w.obs = append(w.obs, history.Observation{Key: k, Version: p.Version, Topic: p.Topic, Partition: p.Partition, Offset: p.Offset, Mismatch: err.Error()})
			case err != nil:
				if !strings.Contains(err.Error(), "context") {
					w.errs = append(w.errs, fmt.Sprintf("reading %q: %v", k, err))
				}
			default:
				_ = b
				w.obs = append(w.obs, history.Observation{Key: k, Version: p.Version, Topic: p.Topic, Partition: p.Partition, Offset: p.Offset, Object: p.Object})
			}
			w.mu.Unlock()
		}
	})
}

// collect starts a garbage collector loop: GC with keep 0 every 30ms.
func (w *exportWorld) collect() {
	w.every(30*time.Millisecond, w.gcStop, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		rep, err := export.GC(ctx, w.pool, w.schema, w.store, export.GCOptions{Keep: 0})
		cancel()
		w.mu.Lock()
		w.gcRuns++
		if err != nil && !strings.Contains(err.Error(), "context") {
			w.errs = append(w.errs, "gc: "+err.Error())
		}
		for _, d := range rep.Deleted {
			w.deleted[d.Object] = d.Reason
		}
		w.mu.Unlock()
	})
}

// every starts a loop that runs f every d, for 5 minutes at the most,
// until w.stop or also (nil: none) is closed.
func (w *exportWorld) every(d time.Duration, also <-chan struct{}, f func()) {
	w.wg.Go(func() {
		deadline := time.Now().Add(5 * time.Minute)
		for time.Now().Before(deadline) {
			select {
			case <-w.stop:
				return
			case <-also:
				return
			case <-time.After(d):
			}
			f()
		}
	})
}

// haltGC stops the collector loop (the reader goes on).
func (w *exportWorld) haltGC() {
	select {
	case <-w.gcStop:
	default:
		close(w.gcStop)
	}
}

func (w *exportWorld) halt() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	w.wg.Wait()
}

// objectsOf lists the store's objects staged under token.
func (w *exportWorld) objectsOf(token string) []string {
	return w.objectsWhere(func(n export.ObjectName) bool { return n.Token.String() == token })
}

// objectsOfHeld lists the objects a batch held by --hold-once staged: its
// token, its partition, offsets in its range (held: the "holding" log
// entry's fields). The token alone is not enough: the worker's other
// lanes share it and go on committing, and the objects their newer
// publications replace are garbage the collector may delete.
func (w *exportWorld) objectsOfHeld(held map[string]any) []string {
	from, to := int64(held["from"].(float64)), int64(held["to"].(float64))
	part, token := int32(held["partition"].(float64)), fmt.Sprint(held["token"])
	return w.objectsWhere(func(n export.ObjectName) bool {
		return n.Token.String() == token && n.Position.Topic == held["topic"] && n.Position.Partition == part &&
			n.Position.Offset >= from && n.Position.Offset < to
	})
}

// objectsWhere lists the store's objects whose parsed names match.
func (w *exportWorld) objectsWhere(match func(export.ObjectName) bool) []string {
	w.t.Helper()
	var out []string
	err := w.store.List(context.Background(), func(o export.ObjectInfo) error {
		if n, err := export.ParseName(o.Name); err == nil && match(n) {
			out = append(out, o.Name)
		}
		return nil
	})
	if err != nil {
		w.t.Fatal(err)
	}
	return out
}

// check stops the loops and verifies everything: the history (G1-G3, one
// publication per job, tokens covered by commits, pointer moves only
// forward, the pointer is the last move), the coordinator's side, the
// readers' observations, and that every pointer's object is in the store
// and matches.
func (w *exportWorld) check(partitions ...int32) *history.History {
	t := w.t
	t.Helper()
	w.halt()
	h := checkRun(t, w.env, expect{partitions: partitions, objects: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if len(h.Pointers) == 0 {
		t.Errorf("no export was published")
	}
	for _, p := range h.Pointers {
		if _, _, err := export.Get(ctx, w.pool, w.schema, w.store, p.Key); err != nil {
			t.Errorf("key %q: %v", p.Key, err)
		}
		if why, ok := w.deleted[p.Object]; ok {
			t.Errorf("key %q: GC deleted its visible object %s (%s)", p.Key, p.Object, why)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, v := range history.CheckObservations(w.obs) {
		t.Errorf("reader: %s", v)
	}
	for _, e := range w.errs {
		t.Errorf("%s", e)
	}
	t.Logf("readers: %d reads, %d observations; gc: %d runs, %d objects deleted", w.reads, len(w.obs), w.gcRuns, len(w.deleted))
	return h
}

// The paused-worker scenario on the export sink, with real processes: A takes a
// batch and is frozen (SIGSTOP); B gets the partition at a higher token and
// publishes newer exports; A is resumed, stages its old batch's objects and
// tries to publish them: Postgres rejects the transaction, so A's objects
// stay unpublished (and the collector, running throughout, deletes them).
// A reader running throughout never sees a pointer go back or bytes that do
// not match their SHA-256.
func TestExportPausedWorker(t *testing.T) {
	for _, proto := range []string{"classic", "consumer"} {
		t.Run(proto, func(t *testing.T) {
			t.Parallel()
			w := newExportWorld(t, 1)
			if proto == "consumer" && w.real {
				t.Skip("KIP-848 session timeouts are broker settings; this test needs kfake's short ones")
			}
			testExportPausedWorker(t, w, proto)
		})
	}
}

// The same story with the workers exporting to a real S3-compatible server
// (SeaweedFS, started here): objects staged with If-None-Match: *, the
// pointer in Postgres, gc and a reader running throughout.
func TestExportPausedWorkerS3(t *testing.T) {
	// Not parallel: the workers take their S3 credentials from the
	// environment (t.Setenv).
	endpoint := weedtest.Start(t)
	t.Setenv("AWS_ACCESS_KEY_ID", weedtest.Key)
	t.Setenv("AWS_SECRET_ACCESS_KEY", weedtest.Secret)
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	url := "s3://tenure-it/pause?endpoint=" + endpoint + "&region=us-east-1"
	st, err := export.Open(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	s3st := st.(*export.S3Store)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	warm := "objects/warmup/x/0/00000000000000000000-0.0-0000000000000000-0000000000000000"
	for {
		_, err := s3st.Client().CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String("tenure-it")})
		if err == nil || strings.Contains(err.Error(), "BucketAlreadyOwnedByYou") || strings.Contains(err.Error(), "BucketAlreadyExists") {
			if err = st.Put(ctx, warm, bytes.NewReader([]byte("w")), 1, sha256.Sum256([]byte("w"))); err == nil {
				_ = st.Delete(ctx, warm)
				break
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("the S3 server never accepted a bucket and a put: %v", err)
		}
		time.Sleep(300 * time.Millisecond)
	}
	w := newExportWorldAt(t, 1, url)
	testExportPausedWorker(t, w, "classic")
}

func testExportPausedWorker(t *testing.T, w *exportWorld, proto string) {
	w.produce(jobsFor(keys, 0, 20)...)
	w.read(keys)
	w.collect()

	a, b, held := w.pauseAHolding("before-batch", []string{"--protocol", proto})
	aToken := fmt.Sprint(held["token"])

	claimed := b.waitLog(30*time.Second, map[string]any{"msg": consumer.MsgClaimed})
	if !tokenLess(t, aToken, fmt.Sprint(claimed["token"])) {
		t.Fatalf("B claimed with token %v, not above A's %v", claimed["token"], aToken)
	}
	waitCommitted(t, w.env, 0, w.highWatermark(0), "B")
	w.produce(jobsFor(keys, 20, 10)...)
	waitCommitted(t, w.env, 0, w.highWatermark(0), "B")

	// GC stops deleting A's objects from here on, so that they can be
	// seen: staged, never published. The reader goes on.
	w.haltGC()
	time.Sleep(100 * time.Millisecond)
	a.resume()
	a.waitLogAny(30*time.Second, rejected, batchCommitted)
	if a.findLog(rejected) == nil {
		t.Errorf("A's late batch was not rejected")
	}
	staged := w.objectsOf(aToken)
	if len(staged) == 0 {
		t.Errorf("A staged no object for its late batch (token %s)", aToken)
	}
	b.stop(30 * time.Second)
	a.stop(30 * time.Second)
	h := w.check(0)
	named := map[string]bool{}
	for _, p := range h.Publications {
		named[p.Object] = true
	}
	for _, o := range staged {
		if named[o] {
			t.Errorf("A's object %s was published", o)
		}
	}
	for _, p := range h.Publications {
		if p.Token.String() == aToken && p.Outcome == "moved" && p.Offset >= int64(held["from"].(float64)) {
			t.Errorf("a publication of A's late batch: %+v", p)
		}
	}
	t.Logf("A (token %s) staged %d objects for its late batch, none published", aToken, len(staged))
	// A last collection deletes them, and nothing visible.
	rep, err := export.GC(context.Background(), w.pool, w.schema, w.store, export.GCOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if left := w.objectsOf(aToken); len(left) > 0 && len(staged) > 0 {
		for _, o := range left {
			for _, s := range staged {
				if o == s {
					t.Errorf("GC kept A's unpublishable object %s (%+v)", o, rep)
				}
			}
		}
	}
	w.check(0)
}

// G3 on the export sink: B has claimed the partition and not published
// anything yet (held before its first batch). A's late publication fails all
// the same: no pointer exists at all until B publishes.
func TestExportClaimFencesBeforeFirstPublication(t *testing.T) {
	t.Parallel()
	w := newExportWorld(t, 1)
	w.produce(jobsFor(keys, 0, 20)...)
	w.read(keys)

	a, b, held := w.pauseAHolding("before-batch", nil, "--hold-once", "before-batch")
	b.waitLog(30*time.Second, map[string]any{"msg": consumer.MsgClaimed})
	b.waitLog(30*time.Second, map[string]any{"msg": "holding"})

	a.resume()
	a.waitLogAny(30*time.Second, rejected, batchCommitted)
	if a.findLog(rejected) == nil {
		t.Errorf("A's late batch was not rejected after B's claim")
	}
	ps, err := export.List(context.Background(), w.pool, w.schema, export.ListFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 0 {
		t.Errorf("pointers exist before B published anything: %+v", ps)
	}
	if staged := w.objectsOf(fmt.Sprint(held["token"])); len(staged) == 0 {
		t.Errorf("A staged nothing")
	} else {
		t.Logf("A's batch [%v,%v) staged %d objects after B's claim; none published", held["from"], held["to"], len(staged))
	}
	b.resume()
	waitCommitted(t, w.env, 0, w.highWatermark(0), "")
	b.stop(30 * time.Second)
	a.stop(30 * time.Second)
	w.check(0)
}

// GC racing live writers: two workers export continuously over 4
// partitions while the collector runs every 30ms with keep 0 and a reader
// checks every key. One worker is held inside its transaction after staging
// (alive, holding its partitions) while the collector runs: its staged
// objects must survive and then become visible. Nothing that is or may
// become visible is lost.
func TestExportGCUnderLiveWriters(t *testing.T) {
	t.Parallel()
	w := newExportWorld(t, 4)
	many := []string{"k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7", "k8", "k9", "k10", "k11"}
	w.read(many)
	w.collect()
	a := w.worker("A", "--hold-once", "before-commit", "--batch-max", "7")
	b := w.worker("B", "--batch-max", "7")
	waitForMembers(t, w.env, 2)
	w.produce(jobsFor(many, 0, 40)...)
	held := a.waitLog(30*time.Second, map[string]any{"msg": "holding", "point": "before-commit"})
	before := len(w.objectsOfHeld(held))
	if before == 0 {
		t.Fatalf("A's held batch %v staged no object: nothing for the collector to spare", held)
	}
	// While A holds its transaction open, more jobs come and the collector
	// runs many times.
	for i := range 10 {
		w.produce(jobsFor(many, 40+i*12, 12)...)
		time.Sleep(50 * time.Millisecond)
	}
	w.mu.Lock()
	runs := w.gcRuns
	w.mu.Unlock()
	if runs < 5 {
		t.Errorf("the collector ran %d times while A was held", runs)
	}
	after := len(w.objectsOfHeld(held))
	t.Logf("A's held batch %v: %d objects before the collections, %d after; %d objects of its token now", held, before, after, len(w.objectsOf(fmt.Sprint(held["token"]))))
	if after < before {
		t.Errorf("GC deleted objects of A's open transaction: %d before, %d after", before, after)
	}
	a.resume() // releases the hold: A's batch commits, its objects become visible
	a.waitLog(30*time.Second, map[string]any{"msg": "released"})
	for p := range int32(4) {
		waitCommitted(t, w.env, p, w.highWatermark(p), "")
	}
	time.Sleep(300 * time.Millisecond) // a few more collections and reads
	b.stop(30 * time.Second)
	a.stop(30 * time.Second)
	w.check(0, 1, 2, 3)

}

// Job-id deduplication (--job-id-header) across a SIGKILL: worker 1 commits
// jobs with ids and is killed; repeats of two ids arrive (and a known id
// under another key, which is not a repeat: ids are per key), with new
// ones; worker 2 stages that batch and is killed inside its transaction
// (its ids die with it); worker 3 does the batch again. Exactly the two
// repeats are skipped, each recorded once, and every other job is
// published once.
func TestExportDedupAfterKill(t *testing.T) {
	t.Parallel()
	w := newExportWorld(t, 1)
	produce := func(jobs ...[3]string) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		var recs []*kgo.Record
		for _, j := range jobs {
			recs = append(recs, &kgo.Record{Topic: w.topic, Key: []byte(j[0]), Value: []byte(j[2]),
				Headers: []kgo.RecordHeader{{Key: effect.DefaultJobIDHeader, Value: []byte(j[1])}}})
		}
		if err := w.cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 10 {
		produce([3]string{keys[i%2], fmt.Sprintf("id-%d", i), fmt.Sprintf(`{"seq":%d}`, i)})
	}
	flags := []string{"--job-id-header", effect.DefaultJobIDHeader}
	w1 := w.worker("W1", flags...)
	waitCommitted(t, w.env, 0, 10, "")
	w1.kill()

	produce([3]string{keys[0], "id-2", `{"seq":"repeat of 2"}`}, [3]string{keys[1], "id-5", `{"seq":"repeat of 5"}`},
		[3]string{keys[1], "id-2", `{"seq":"id-2 under another key"}`}, [3]string{keys[0], "id-10", `{"seq":10}`}, [3]string{keys[1], "id-11", `{"seq":11}`})
	w2 := w.worker("W2", append(flags, "--hold-once", "before-commit")...)
	w2.waitLog(30*time.Second, map[string]any{"msg": "holding", "point": "before-commit"})
	w2.kill()
	w3 := w.worker("W3", flags...)
	waitCommitted(t, w.env, 0, 15, "")
	w3.stop(30 * time.Second)

	rec, _ := effect.NewRecorder(nil, w.schema)
	dups, err := rec.Duplicates(context.Background(), w.pool, w.group)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range dups {
		got = append(got, fmt.Sprintf("%s@%d(first %d)", d.JobID, d.Offset, d.FirstOffset))
	}
	if want := "[id-2@10(first 2) id-5@11(first 5)]"; fmt.Sprint(got) != want {
		t.Errorf("duplicates skipped: %v, want %s", got, want)
	}
	w.check(0) // every job once: published, or skipped as a duplicate
}

// GC racing a paused writer: A stages its batch and is frozen (SIGSTOP)
// inside its transaction. While A still holds the partition the collector
// keeps A's objects (A may yet publish them); once B has claimed the
// partition they can never be published, and the collector deletes them.
// A, resumed, is fenced; nothing visible is lost.
func TestExportGCPausedWriter(t *testing.T) {
	t.Parallel()
	w := newExportWorld(t, 1)
	w.produce(jobsFor(keys, 0, 20)...)
	w.read(keys)
	a, b, held := w.pauseAHolding("before-commit", nil)
	aToken := fmt.Sprint(held["token"])
	staged := w.objectsOf(aToken)
	if len(staged) == 0 {
		t.Fatal("A staged nothing before its commit")
	}
	w.collect()
	time.Sleep(300 * time.Millisecond)
	if left := w.objectsOf(aToken); len(left) != len(staged) {
		t.Fatalf("GC deleted objects of A, frozen while it still holds the partition: %d of %d left", len(left), len(staged))
	}
	b.waitLog(30*time.Second, map[string]any{"msg": consumer.MsgClaimed})
	waitFor(t, 30*time.Second, "GC to delete A's objects after B's claim", func() bool { return len(w.objectsOf(aToken)) == 0 })
	waitCommitted(t, w.env, 0, w.highWatermark(0), "B")
	a.resumeLost(t)
	b.stop(30 * time.Second)
	a.stop(30 * time.Second)
	w.check(0)
}
