package effect_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/effect"
	"github.com/tenure-dev/tenure/internal/devbroker"
	"github.com/tenure-dev/tenure/internal/testinfra/testdb"
	"github.com/tenure-dev/tenure/sink"
)

// TestMain runs the worker child of TestEffectReconcileAfterKill when asked.
func TestMain(m *testing.M) {
	if os.Getenv("TENURE_EFFECT_CHILD") != "" {
		if err := effectChild(); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// effectChild is a worker whose handler sends each job to an HTTP
// destination that cannot check tokens, the way package effect says to: Intend
// before sending (reconcile if an earlier attempt may have sent it), send
// with the operation id as idempotency key, Sent in the fenced transaction.
func effectChild() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(os.Getenv("TENURE_EFFECT_DB"))
	if err != nil {
		return err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	schema, dest := os.Getenv("TENURE_EFFECT_SCHEMA"), os.Getenv("TENURE_EFFECT_DEST")
	store, err := sink.NewStore(pool, schema)
	if err != nil {
		return err
	}
	rec, err := effect.NewRecorder(pool, schema)
	if err != nil {
		return err
	}
	h := consumer.HandlerFunc(func(ctx context.Context, tx consumer.Tx, b *consumer.Batch) error {
		for _, r := range b.Records {
			op := effect.OperationID(r, effect.DefaultJobIDHeader)
			prev, err := rec.Intend(ctx, b, r, op)
			if err != nil {
				return err
			}
			detail := "sent"
			switch prev.State {
			case effect.Sent:
				continue // recorded as sent by a committed batch
			case effect.Attempted:
				// An earlier attempt may have reached the destination: ask.
				resp, err := http.Get(dest + "/ops/" + op)
				if err != nil {
					return consumer.Transient(err)
				}
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					if err := rec.Sent(ctx, tx, b, r, op, "reconciled: the destination had it"); err != nil {
						return err
					}
					continue
				}
				detail = "sent after reconciling: the destination did not have it"
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, dest+"/ops/"+op, bytes.NewReader(r.Value))
			req.Header.Set("Idempotency-Key", op)
			req.Header.Set("Tenure-Token", b.Token.String())
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return consumer.Transient(err)
			}
			resp.Body.Close()
			if err := rec.Sent(ctx, tx, b, r, op, detail); err != nil {
				return err
			}
		}
		return nil
	})
	c, err := consumer.New(consumer.Config{
		Brokers: strings.Split(os.Getenv("TENURE_EFFECT_BROKERS"), ","), Group: os.Getenv("TENURE_EFFECT_GROUP"),
		Topics: []string{os.Getenv("TENURE_EFFECT_TOPIC")}, Store: store, Handler: h,
		SessionTimeout: 3 * time.Second, BatchMax: 4, ClientID: "effect-child", Logger: zap.NewNop(),
	})
	if err != nil {
		return err
	}
	return c.Run(ctx)
}

// destination is an HTTP service that cannot check tokens: it records every
// POST per operation id, and answers GET /ops/ID with 200 if it has it.
type destination struct {
	mu    sync.Mutex
	posts map[string]int
	// killOn, when set, is called (once) when the POST of this operation
	// has been recorded, before the answer is sent.
	killOp string
	kill   func()
}

func (d *destination) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	op := strings.TrimPrefix(r.URL.Path, "/ops/")
	d.mu.Lock()
	defer d.mu.Unlock()
	switch r.Method {
	case http.MethodGet:
		if d.posts[op] == 0 {
			w.WriteHeader(http.StatusNotFound)
		}
	case http.MethodPost:
		_, _ = io.Copy(io.Discard, r.Body)
		d.posts[op]++
		if op == d.killOp && d.kill != nil {
			d.kill()
			d.kill = nil
			return // the worker never hears the answer
		}
	}
}

// A worker is killed (SIGKILL, a real process) right after the destination
// received a job's send and before the worker could commit: its batch's
// transaction, with the "sent" record, is lost. The next owner processes the
// job again, finds the attempt recorded by Intend, asks the destination,
// and records it as sent without sending twice. Every operation reaches the
// destination exactly once.
// startEffectChild starts this test binary as the worker called name
// (effectChild), with env; it is killed when the test ends. done is
// closed once it has exited.
func startEffectChild(t *testing.T, name string, env []string) (cmd *exec.Cmd, done chan struct{}) {
	t.Helper()
	cmd = exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), "TENURE_EFFECT_CHILD="+name), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done = make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		if t.Failed() {
			t.Logf("%s stderr: %s", name, stderr.String())
		}
	})
	return cmd, done
}

func TestEffectReconcileAfterKill(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	schema := testdb.Schema(t, pool)
	broker, err := devbroker.Start(devbroker.Config{Partitions: 1, Topics: []string{"payments"}, ConsumerSessionTimeout: 3 * time.Second, ConsumerHeartbeat: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer broker.Close()
	dest := &destination{posts: map[string]int{}, killOp: "pay-6"}
	srv := httptest.NewServer(dest)
	defer srv.Close()

	cl, err := kgo.NewClient(kgo.SeedBrokers(broker.ListenAddrs()...), kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var recs []*kgo.Record
	for i := range 12 {
		recs = append(recs, &kgo.Record{Topic: "payments", Key: []byte("acct-1"), Value: fmt.Appendf(nil, `{"amount":%d}`, i),
			Headers: []kgo.RecordHeader{{Key: effect.DefaultJobIDHeader, Value: fmt.Appendf(nil, "pay-%d", i)}}})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}

	childEnv := []string{"TENURE_EFFECT_DB=" + testdb.URL(), "TENURE_EFFECT_SCHEMA=" + schema,
		"TENURE_EFFECT_DEST=" + srv.URL, "TENURE_EFFECT_BROKERS=" + strings.Join(broker.ListenAddrs(), ","),
		"TENURE_EFFECT_GROUP=payers", "TENURE_EFFECT_TOPIC=payments"}
	start := func(name string) (*exec.Cmd, chan struct{}) { return startEffectChild(t, name, childEnv) }
	first, firstDone := start("first")
	killed := make(chan struct{})
	dest.mu.Lock()
	dest.kill = func() {
		_ = first.Process.Signal(syscall.SIGKILL) // by PID: our child
		close(killed)
	}
	dest.mu.Unlock()
	select {
	case <-killed:
	case <-ctx.Done():
		t.Fatal("the destination never received pay-6")
	}
	<-firstDone

	rec, _ := effect.NewRecorder(pool, schema)
	if r, err := rec.Lookup(ctx, pool, "payers", "pay-6"); err != nil || r.State != effect.Attempted {
		t.Fatalf("after the kill, pay-6 is %v (%v); want attempted (the sent record died with the transaction)", r.State, err)
	}
	start("second")
	deadline := time.Now().Add(60 * time.Second)
	for {
		f, err := sink.NewStore(pool, schema)
		if err != nil {
			t.Fatal(err)
		}
		fence, err := f.Get(ctx, sink.Partition{Group: "payers", Topic: "payments", Partition: 0})
		if err == nil && fence.NextOffset == 12 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the second worker did not finish: %+v %v", fence, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	dest.mu.Lock()
	defer dest.mu.Unlock()
	for i := range 12 {
		op := fmt.Sprintf("pay-%d", i)
		if n := dest.posts[op]; n != 1 {
			t.Errorf("%s reached the destination %d times, want once", op, n)
		}
		r, err := rec.Lookup(ctx, pool, "payers", op)
		if err != nil || r.State != effect.Sent {
			t.Errorf("%s: %v (%v), want sent", op, r.State, err)
		}
		if op == "pay-6" {
			if !strings.HasPrefix(r.Detail, "reconciled") || r.Attempts < 2 {
				t.Errorf("pay-6: %+v, want reconciled after two attempts", r)
			} else {
				t.Logf("pay-6: %d attempts, %q, sent by %s with token %s", r.Attempts, r.Detail, r.SentBy, r.SentToken)
			}
		}
	}
}
