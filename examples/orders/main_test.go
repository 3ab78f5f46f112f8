package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tenure-dev/tenure/internal/devbroker"
	"github.com/tenure-dev/tenure/internal/testinfra/testdb"
)

// The example builds and runs as a user would start it: against a local
// broker (kfake) and the tests' PostgreSQL, configured by its environment
// variables. Every good order is written exactly once, the bad one is
// dead-lettered, and SIGTERM stops it gracefully (exit 0).
func TestOrdersExample(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "orders")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("building the example: %v\n%s", err, out)
	}
	br, err := devbroker.Start(devbroker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	pool := testdb.Pool(t)
	schema := testdb.FreshSchema(t, pool, "orders_example")

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(br.ListenAddrs()...), kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 3, 1, nil, "orders"); err != nil {
		t.Fatal(err)
	}
	const good = 30
	var recs []*kgo.Record
	for i := range good {
		recs = append(recs, &kgo.Record{Topic: "orders", Key: fmt.Appendf(nil, "customer-%d", i%7), Value: fmt.Appendf(nil, `{"amount": %d.50}`, i)})
	}
	recs = append(recs, &kgo.Record{Topic: "orders", Key: []byte("customer-1"), Value: []byte(`not json`)})
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(),
		"ORDERS_BROKERS="+strings.Join(br.ListenAddrs(), ","),
		"ORDERS_DATABASE_URL="+testdb.URL(),
		"ORDERS_SCHEMA="+schema,
	)
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
		}
	}()

	var rows, dead int
	deadline := time.Now().Add(45 * time.Second)
	for rows < good || dead < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("%d orders and %d dead letters after 45s\n%s", rows, dead, logs.String())
		}
		time.Sleep(100 * time.Millisecond)
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM "`+schema+`".orders`).Scan(&rows)
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM "`+schema+`".dead_letters`).Scan(&dead)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("the example did not stop cleanly: %v\n%s", err, logs.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the example did not stop within 30s of SIGTERM\n%s", logs.String())
	}
	var distinct, total int
	var sum string
	if err := pool.QueryRow(ctx, `SELECT count(DISTINCT job), count(*), sum(amount)::text FROM "`+schema+`".orders`).Scan(&distinct, &total, &sum); err != nil {
		t.Fatal(err)
	}
	// 0.50 + 1.50 + ... + 29.50
	if distinct != good || total != good || sum != "450.00" || dead != 1 {
		t.Errorf("orders: %d distinct of %d, sum %s; dead letters %d", distinct, total, sum, dead)
	}
	if !strings.Contains(logs.String(), "orders worker stopped") {
		t.Errorf("no graceful stop in the log:\n%s", logs.String())
	}
}
