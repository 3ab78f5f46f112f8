package sink_test

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tenure-dev/tenure/internal/testinfra/testdb"
	"github.com/tenure-dev/tenure/sink"
)

// park dead-letters d the way a lane does: in the fenced transaction that
// moves d's partition past it. The partition is claimed first if needed.
func (e *env) park(t testing.TB, d sink.DeadLetter) sink.DeadLetter {
	t.Helper()
	p := d.Partition
	if d.Token == (sink.Token{}) {
		inc, err := e.store.Incarnation(e.ctx, p.Group)
		if err != nil {
			t.Fatal(err)
		}
		d.Token = tok(inc, 1)
	}
	if d.Owner == "" {
		d.Owner = "owner"
	}
	e.raiseIncarnation(p.Group, d.Token.Incarnation)
	from, err := e.store.Claim(e.ctx, sink.ClaimRequest{Partition: p, Token: d.Token, Owner: d.Owner, StartOffset: d.Offset, PartitionCount: 12})
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	if from.NextOffset != d.Offset {
		t.Fatalf("partition %s is at %d, cannot park offset %d", p, from.NextOffset, d.Offset)
	}
	tx, err := e.pool.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(e.ctx) }()
	if err := e.store.AddDeadLetter(e.ctx, tx, d); err != nil {
		t.Fatalf("AddDeadLetter: %v", err)
	}
	if err := e.store.Commit(e.ctx, tx, sink.CommitRequest{Partition: p, Token: d.Token, Owner: d.Owner, From: d.Offset, To: d.Offset + 1}); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	if err := tx.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	all, err := e.store.DeadLetters(e.ctx, sink.DeadLetterFilter{Group: p.Group, Topic: p.Topic})
	if err != nil {
		t.Fatal(err)
	}
	for _, got := range all {
		if got.Partition == p && got.Offset == d.Offset {
			return got
		}
	}
	t.Fatalf("dead letter %s@%d not found after parking it", p, d.Offset)
	return sink.DeadLetter{}
}

func deadLetter(group, topic string, partition int32, offset int64) sink.DeadLetter {
	return sink.DeadLetter{
		Partition: sink.Partition{Group: group, Topic: topic, Partition: partition}, Offset: offset,
		Key: []byte("key"), Value: []byte(`{"n":1}`), Error: "handler: boom", Attempts: 3,
	}
}

func (e *env) actions(t testing.TB, id int64) []string {
	t.Helper()
	return testdb.QueryRows(t, e.ctx, e.pool, pgx.RowTo[string], `SELECT action || ' ' || coalesce(topic, '-') || '/' || coalesce(partition::text, '-') || '@' ||
		coalesce(job_offset::text, '-') || ' by ' || actor FROM `+e.q()+`.dead_letter_actions WHERE dead_letter_id = $1 ORDER BY id`, id)
}

func (e *env) status(t testing.TB, id int64) string {
	t.Helper()
	d, err := e.store.DeadLetterByID(e.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return d.Status
}

// A dead letter is written in the caller's transaction: rolled back, it
// leaves nothing, and the partition did not move either.
func TestAddDeadLetterRolledBack(t *testing.T) {
	t.Parallel()
	e := setup(t)
	d := deadLetter("g", "t", 0, 5)
	e.mustClaim(t, d.Partition, tok(0, 1), "owner", 5)
	tx, err := e.pool.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }() // released on every path: a failure must not hang the pool's Close
	d.Token, d.Owner = tok(0, 1), "owner"
	if err := e.store.AddDeadLetter(e.ctx, tx, d); err != nil {
		t.Fatal(err)
	}
	if err := e.store.Commit(e.ctx, tx, sink.CommitRequest{Partition: d.Partition, Token: d.Token, Owner: d.Owner, From: 5, To: 6}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(e.ctx); err != nil {
		t.Fatal(err)
	}
	all, err := e.store.DeadLetters(e.ctx, sink.DeadLetterFilter{})
	if err != nil || len(all) != 0 {
		t.Fatalf("after a rollback: %d dead letters, %v", len(all), err)
	}
	if f := e.mustGet(t, d.Partition); f.NextOffset != 5 {
		t.Fatalf("next offset %d after a rollback, want 5", f.NextOffset)
	}

	// A fenced transaction (the owner lost the partition) rolls back too.
	e.mustClaim(t, d.Partition, tok(0, 2), "new-owner", 0)
	tx, err = e.pool.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(e.ctx) }()
	if err := e.store.AddDeadLetter(e.ctx, tx, d); err != nil {
		t.Fatal(err)
	}
	asFenced(t, e.store.Commit(e.ctx, tx, sink.CommitRequest{Partition: d.Partition, Token: d.Token, Owner: d.Owner, From: 5, To: 6}))
	if err := tx.Rollback(e.ctx); err != nil {
		t.Fatal(err)
	}
	if all, _ := e.store.DeadLetters(e.ctx, sink.DeadLetterFilter{Status: ""}); len(all) != 0 {
		t.Fatalf("a fenced dead letter survived: %+v", all)
	}
}

// Every field comes back as it went in: binary values, absent keys,
// headers, the token and the owner.
func TestDeadLetterRoundTrip(t *testing.T) {
	t.Parallel()
	e := setup(t)
	in := deadLetter("g", "t", 2, 40)
	in.Key = []byte{0xff, 0xfe, 'k'}
	in.Value = []byte{0, 1, 2, 0xc3}
	in.Headers = []sink.Header{{Key: "trace-id", Value: []byte("abc")}, {Key: "bin", Value: []byte{0x80}}, {Key: "nil"}}
	in.Token, in.Owner = tok(2, 17), "member-1"
	before := time.Now().Add(-time.Minute)
	got := e.park(t, in)
	if got.ID <= 0 || got.Status != "dead" || got.DeadAt.Before(before) {
		t.Fatalf("id %d, status %q, dead at %v", got.ID, got.Status, got.DeadAt)
	}
	if got.Partition != in.Partition || got.Offset != 40 || string(got.Key) != string(in.Key) || string(got.Value) != string(in.Value) ||
		got.Error != in.Error || got.Attempts != 3 || got.Token != tok(2, 17) || got.Owner != "member-1" {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, in)
	}
	if len(got.Headers) != 3 || got.Headers[0].Key != "trace-id" || string(got.Headers[0].Value) != "abc" ||
		string(got.Headers[1].Value) != "\x80" || got.Headers[2].Key != "nil" || len(got.Headers[2].Value) != 0 {
		t.Fatalf("headers %+v", got.Headers)
	}
	byID, err := e.store.DeadLetterByID(e.ctx, got.ID)
	if err != nil || !reflect.DeepEqual(byID, got) {
		t.Fatalf("DeadLetterByID = %+v, %v; want %+v", byID, err, got)
	}

	// No key, no headers.
	bare := deadLetter("g", "t", 3, 0)
	bare.Key, bare.Headers = nil, nil
	got = e.park(t, bare)
	if got.Key != nil || len(got.Headers) != 0 {
		t.Fatalf("bare dead letter: key %v, headers %v", got.Key, got.Headers)
	}

	// One job is dead-lettered once: the same offset cannot be parked twice.
	tx, err := e.pool.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(e.ctx) }()
	if err := e.store.AddDeadLetter(e.ctx, tx, in); err == nil {
		t.Fatal("the same job was dead-lettered twice")
	}
}

// A job's bytes come back exactly, header keys included (a header key that
// is not UTF-8, or holds NUL, used to turn into U+FFFD, or into a \u0000
// that jsonb refuses, so that the job could not be parked at all). A
// handler's error message that quotes such bytes is stored readable rather
// than refused (which used to make dead-lettering retry forever).
func TestDeadLetterKeepsExactBytes(t *testing.T) {
	t.Parallel()
	e := setup(t)
	in := deadLetter("g", "t", 5, 7)
	in.Key, in.Value = []byte("\xff\xfe"), []byte("\x00\xff")
	in.Headers = []sink.Header{{Key: "k\xff", Value: []byte{0xfe}}, {Key: "n\x00ul", Value: []byte("v")}, {Key: "plain", Value: nil}}
	in.Error = "handler: bad payload \xff\xfe\x00"
	got := e.park(t, in)
	if string(got.Key) != "\xff\xfe" || string(got.Value) != "\x00\xff" {
		t.Errorf("key %q value %q", got.Key, got.Value)
	}
	if len(got.Headers) != 3 || got.Headers[0].Key != "k\xff" || string(got.Headers[0].Value) != "\xfe" ||
		got.Headers[1].Key != "n\x00ul" || got.Headers[2].Key != "plain" {
		t.Errorf("headers %q", got.Headers)
	}
	if got.Error != "handler: bad payload \uFFFD\\x00" {
		t.Errorf("error stored as %q", got.Error)
	}
}

func TestDeadLetterByIDUnknown(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, err := e.store.DeadLetterByID(e.ctx, 424242)
	if !errors.Is(err, sink.ErrNoDeadLetter) || !strings.Contains(err.Error(), "424242") {
		t.Fatalf("unknown id: %v, want ErrNoDeadLetter naming the id", err)
	}
}

func TestDeadLettersFilter(t *testing.T) {
	t.Parallel()
	e := setup(t)
	a1 := e.park(t, deadLetter("a", "t1", 0, 0))
	a2 := e.park(t, deadLetter("a", "t2", 0, 0))
	b1 := e.park(t, deadLetter("b", "t1", 0, 0))
	a3 := e.park(t, deadLetter("a", "t1", 0, 1))
	b2 := e.park(t, deadLetter("b", "t1", 1, 0))
	if err := e.store.Discard(e.ctx, a3.ID, "ops"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Replay(e.ctx, b2.ID, "ops", func(context.Context, sink.DeadLetter) (string, int32, int64, error) {
		return "t1", 1, 9, nil
	}); err != nil {
		t.Fatal(err)
	}
	ids := func(f sink.DeadLetterFilter) []int64 {
		t.Helper()
		ds, err := e.store.DeadLetters(e.ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		out := []int64{}
		for _, d := range ds {
			out = append(out, d.ID)
		}
		return out
	}
	for _, c := range []struct {
		name string
		f    sink.DeadLetterFilter
		want []int64
	}{
		{"everything, oldest first", sink.DeadLetterFilter{}, []int64{a1.ID, a2.ID, b1.ID, a3.ID, b2.ID}},
		{"group", sink.DeadLetterFilter{Group: "a"}, []int64{a1.ID, a2.ID, a3.ID}},
		{"topic", sink.DeadLetterFilter{Topic: "t1"}, []int64{a1.ID, b1.ID, a3.ID, b2.ID}},
		{"group and topic", sink.DeadLetterFilter{Group: "a", Topic: "t1"}, []int64{a1.ID, a3.ID}},
		{"dead", sink.DeadLetterFilter{Status: "dead"}, []int64{a1.ID, a2.ID, b1.ID}},
		{"discarded", sink.DeadLetterFilter{Status: "discarded"}, []int64{a3.ID}},
		{"replayed", sink.DeadLetterFilter{Status: "replayed"}, []int64{b2.ID}},
		{"group, topic and status", sink.DeadLetterFilter{Group: "b", Topic: "t1", Status: "dead"}, []int64{b1.ID}},
		{"limit", sink.DeadLetterFilter{Limit: 2}, []int64{a1.ID, a2.ID}},
		{"no match", sink.DeadLetterFilter{Group: "c"}, []int64{}},
		{"names are parameters", sink.DeadLetterFilter{Group: `a' OR '1'='1`}, []int64{}},
	} {
		if got := ids(c.f); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// replayTo is a ReplayFunc that records its calls and says the job went to
// topic/partition@offset.
type replayTo struct {
	calls     atomic.Int32
	topic     string
	partition int32
	offset    int64
	err       error
	seen      []sink.DeadLetter
	mu        sync.Mutex
}

func (r *replayTo) fn(_ context.Context, d sink.DeadLetter) (string, int32, int64, error) {
	r.calls.Add(1)
	r.mu.Lock()
	r.seen = append(r.seen, d)
	r.mu.Unlock()
	return r.topic, r.partition, r.offset, r.err
}

func TestReplay(t *testing.T) {
	t.Parallel()
	e := setup(t)
	in := deadLetter("g", "jobs", 1, 7)
	in.Headers = []sink.Header{{Key: "h", Value: []byte("v")}}
	d := e.park(t, in)

	r := &replayTo{topic: "jobs", partition: 1, offset: 99}
	got, err := e.store.Replay(e.ctx, d.ID, "ops@host", r.fn)
	if err != nil {
		t.Fatalf("Replay: %v", err)
	}
	if r.calls.Load() != 1 {
		t.Fatalf("the ReplayFunc ran %d times, want once", r.calls.Load())
	}
	// The ReplayFunc gets the whole job to re-produce.
	if s := r.seen[0]; s.ID != d.ID || string(s.Key) != "key" || string(s.Value) != `{"n":1}` || len(s.Headers) != 1 ||
		s.Headers[0].Key != "h" || s.Partition != d.Partition || s.Status != "dead" {
		t.Fatalf("ReplayFunc got %+v", s)
	}
	if got.Status != "replayed" || got.ID != d.ID {
		t.Fatalf("Replay returned %+v", got)
	}
	if st := e.status(t, d.ID); st != "replayed" {
		t.Fatalf("status %q, want replayed", st)
	}
	if acts := e.actions(t, d.ID); !reflect.DeepEqual(acts, []string{"replay jobs/1@99 by ops@host"}) {
		t.Fatalf("actions %v", acts)
	}

	// A second replay is refused without producing anything.
	_, err = e.store.Replay(e.ctx, d.ID, "ops@host", r.fn)
	if err == nil || !strings.Contains(err.Error(), "already replayed") {
		t.Fatalf("second replay: %v", err)
	}
	if r.calls.Load() != 1 {
		t.Fatalf("a refused replay produced: %d calls", r.calls.Load())
	}
	// So is discarding what was replayed.
	if err := e.store.Discard(e.ctx, d.ID, "ops"); err == nil || !strings.Contains(err.Error(), "already replayed") {
		t.Fatalf("discard after replay: %v", err)
	}
	if st := e.status(t, d.ID); st != "replayed" {
		t.Fatalf("status %q after a refused discard", st)
	}
	if acts := e.actions(t, d.ID); len(acts) != 1 {
		t.Fatalf("refusals were recorded: %v", acts)
	}

	// Unknown ids.
	if _, err := e.store.Replay(e.ctx, 987654, "ops", r.fn); !errors.Is(err, sink.ErrNoDeadLetter) {
		t.Fatalf("replay of an unknown id: %v", err)
	}
	if err := e.store.Discard(e.ctx, 987654, "ops"); !errors.Is(err, sink.ErrNoDeadLetter) {
		t.Fatalf("discard of an unknown id: %v", err)
	}
	if r.calls.Load() != 1 {
		t.Fatalf("an unknown id was produced")
	}
}

func TestDiscard(t *testing.T) {
	t.Parallel()
	e := setup(t)
	d := e.park(t, deadLetter("g", "jobs", 0, 3))
	if err := e.store.Discard(e.ctx, d.ID, "alice@host"); err != nil {
		t.Fatal(err)
	}
	if st := e.status(t, d.ID); st != "discarded" {
		t.Fatalf("status %q", st)
	}
	if acts := e.actions(t, d.ID); !reflect.DeepEqual(acts, []string{"discard -/-@- by alice@host"}) {
		t.Fatalf("actions %v", acts)
	}
	// Neither a replay nor a second discard of a discarded job.
	r := &replayTo{topic: "jobs"}
	if _, err := e.store.Replay(e.ctx, d.ID, "bob", r.fn); err == nil || !strings.Contains(err.Error(), "already discarded") {
		t.Fatalf("replay after discard: %v", err)
	}
	if r.calls.Load() != 0 {
		t.Fatal("a discarded job was produced")
	}
	if err := e.store.Discard(e.ctx, d.ID, "bob"); err == nil || !strings.Contains(err.Error(), "already discarded") {
		t.Fatalf("second discard: %v", err)
	}
	if st, acts := e.status(t, d.ID), e.actions(t, d.ID); st != "discarded" || len(acts) != 1 {
		t.Fatalf("after refusals: status %q, actions %v", st, acts)
	}
}

// If the job cannot be produced, nothing is recorded: it stays dead, ready
// for another try.
func TestReplayFuncErrorLeavesJobDead(t *testing.T) {
	t.Parallel()
	e := setup(t)
	d := e.park(t, deadLetter("g", "jobs", 0, 0))
	boom := errors.New("broker unreachable")
	r := &replayTo{err: boom}
	_, err := e.store.Replay(e.ctx, d.ID, "ops", r.fn)
	if !errors.Is(err, boom) {
		t.Fatalf("Replay = %v, want the ReplayFunc's error", err)
	}
	if st, acts := e.status(t, d.ID), e.actions(t, d.ID); st != "dead" || len(acts) != 0 {
		t.Fatalf("after a failed replay: status %q, actions %v", st, acts)
	}
	// The next try goes through.
	r.err, r.topic, r.offset = nil, "jobs", 12
	if _, err := e.store.Replay(e.ctx, d.ID, "ops", r.fn); err != nil {
		t.Fatal(err)
	}
	if st, acts := e.status(t, d.ID), e.actions(t, d.ID); st != "replayed" || !reflect.DeepEqual(acts, []string{"replay jobs/0@12 by ops"}) {
		t.Fatalf("after the retry: status %q, actions %v", st, acts)
	}
}

// Two operators replay the same job at once: it is produced exactly once.
// The first holds the dead letter's row lock while producing; the second
// waits for it, then finds the job replayed.
func TestReplayConcurrent(t *testing.T) {
	t.Parallel()
	e := setup(t)
	d := e.park(t, deadLetter("g", "jobs", 0, 0))
	inProduce := make(chan struct{})
	release := make(chan struct{})
	var calls atomic.Int32
	slow := func(ctx context.Context, _ sink.DeadLetter) (string, int32, int64, error) {
		if calls.Add(1) == 1 {
			close(inProduce)
			<-release
		}
		return "jobs", 0, 50, nil
	}
	errs := make(chan error, 2)
	go func() { _, err := e.store.Replay(e.ctx, d.ID, "first", slow); errs <- err }()
	<-inProduce
	go func() { _, err := e.store.Replay(e.ctx, d.ID, "second", slow); errs <- err }()
	select {
	case err := <-errs:
		t.Fatalf("the second replay did not wait for the first one's produce: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	var ok, refused int
	for range 2 {
		select {
		case err := <-errs:
			switch {
			case err == nil:
				ok++
			case strings.Contains(err.Error(), "already replayed"):
				refused++
			default:
				t.Fatalf("unexpected error: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("replays did not finish")
		}
	}
	if ok != 1 || refused != 1 || calls.Load() != 1 {
		t.Fatalf("%d succeeded, %d refused, produced %d times; want 1, 1, 1", ok, refused, calls.Load())
	}
	if acts := e.actions(t, d.ID); !reflect.DeepEqual(acts, []string{"replay jobs/0@50 by first"}) {
		t.Fatalf("actions %v", acts)
	}

	// Many at once, no coordination: still exactly once.
	d2 := e.park(t, deadLetter("g", "jobs", 0, 1))
	var produced atomic.Int32
	const n = 8
	var succeeded atomic.Int32
	atOnce(n, func(int) {
		_, err := e.store.Replay(e.ctx, d2.ID, "many", func(context.Context, sink.DeadLetter) (string, int32, int64, error) {
			produced.Add(1)
			return "jobs", 0, 51, nil
		})
		if err == nil {
			succeeded.Add(1)
		} else if !strings.Contains(err.Error(), "already replayed") {
			t.Errorf("replay: %v", err)
		}
	})
	if produced.Load() != 1 || succeeded.Load() != 1 || len(e.actions(t, d2.ID)) != 1 {
		t.Fatalf("%d concurrent replays produced %d times, %d succeeded, actions %v", n, produced.Load(), succeeded.Load(), e.actions(t, d2.ID))
	}

	// A replay racing a discard: one wins, the other is refused.
	d3 := e.park(t, deadLetter("g", "jobs", 0, 2))
	var wg sync.WaitGroup
	var replayErr, discardErr error
	wg.Add(2)
	go func() {
		defer wg.Done()
		_, replayErr = e.store.Replay(e.ctx, d3.ID, "r", func(context.Context, sink.DeadLetter) (string, int32, int64, error) {
			return "jobs", 0, 52, nil
		})
	}()
	go func() { defer wg.Done(); discardErr = e.store.Discard(e.ctx, d3.ID, "d") }()
	wg.Wait()
	if (replayErr == nil) == (discardErr == nil) {
		t.Fatalf("replay %v, discard %v: exactly one must win", replayErr, discardErr)
	}
	if acts := e.actions(t, d3.ID); len(acts) != 1 {
		t.Fatalf("actions %v", acts)
	}
}
