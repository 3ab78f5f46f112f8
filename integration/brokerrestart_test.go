package integration

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/internal/testinfra/freeport"
	"github.com/tenure-dev/tenure/internal/testinfra/testdb"
)

// brokerProcess is a running `tenure broker` process.
type brokerProcess struct {
	t    *testing.T
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  []string // stdout and stderr lines
	done chan struct{}
}

// startBrokerProcess runs `tenure broker` on addr with its data in dir and waits
// until it listens.
func startBrokerProcess(t *testing.T, addr, dir, topic string, partitions int) *brokerProcess {
	t.Helper()
	cmd := exec.Command(tenureBin, "broker", "--listen", addr, "--data-dir", dir,
		"--topic", topic, "--partitions", fmt.Sprint(partitions),
		"--consumer-session-timeout", sessionTimeout.String(), "--consumer-heartbeat-interval", "500ms")
	cmd.Env = os.Environ()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	b := &brokerProcess{t: t, cmd: cmd, done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			b.mu.Lock()
			b.out = append(b.out, sc.Text())
			b.mu.Unlock()
		}
		r.Close()
		_ = cmd.Wait()
		close(b.done)
	}()
	t.Cleanup(func() { b.signal(syscall.SIGKILL); b.wait(10 * time.Second) })
	deadline := time.Now().Add(30 * time.Second)
	for !b.said("listening on") {
		select {
		case <-b.done:
			t.Fatalf("tenure broker exited before listening: %s", b.output())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("tenure broker did not listen within 30s: %s", b.output())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return b
}

func (b *brokerProcess) said(s string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, l := range b.out {
		if strings.Contains(l, s) {
			return true
		}
	}
	return false
}

func (b *brokerProcess) output() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Join(b.out, "\n")
}

func (b *brokerProcess) signal(sig syscall.Signal) {
	select {
	case <-b.done:
	default:
		_ = b.cmd.Process.Signal(sig)
	}
}

func (b *brokerProcess) wait(timeout time.Duration) bool {
	select {
	case <-b.done:
		return true
	case <-time.After(timeout):
		return false
	}
}

// stop sends sig to the broker and waits for it to exit.
func (b *brokerProcess) stop(sig syscall.Signal) {
	b.t.Helper()
	b.signal(sig)
	if !b.wait(20 * time.Second) {
		b.t.Fatalf("tenure broker did not exit within 20s of %s", sig)
	}
}

// freeLoopbackAddress is a port below the ephemeral range (freeport): the
// broker binds it again after each restart.
func freeLoopbackAddress(t *testing.T) string {
	t.Helper()
	p, err := freeport.Block(1)
	if err != nil {
		t.Fatal(err)
	}
	return "127.0.0.1:" + strconv.Itoa(p)
}

// The development broker stops (cleanly, or killed) and comes back on the
// same address with the same data directory. The workers never exit:
// their clients reconnect, the group re-forms, partitions are claimed again
// and processing goes on. Every job is committed exactly once, and the
// broker still has every record it acknowledged.
func TestBrokerRestart(t *testing.T) {
	t.Parallel()
	for _, proto := range []string{"classic", "consumer"} {
		for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
			name := map[syscall.Signal]string{syscall.SIGTERM: "SIGTERM", syscall.SIGKILL: "SIGKILL"}[sig]
			t.Run(proto+"/"+name, func(t *testing.T) {
				t.Parallel()
				testBrokerRestart(t, proto, sig)
			})
		}
	}
}

func testBrokerRestart(t *testing.T, proto string, sig syscall.Signal) {
	const partitions = 3
	addr, dir := freeLoopbackAddress(t), t.TempDir()
	e := &env{t: t, brokers: []string{addr}}
	e.pool = testdb.Pool(t)
	e.dbURL = testdb.URL()
	e.schema = testdb.Schema(t, e.pool)
	suffix := strings.TrimPrefix(e.schema, "tenure_test_")
	e.topic, e.group = "jobs-"+suffix, "workers-"+suffix

	br := startBrokerProcess(t, addr, dir, e.topic, partitions)
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	e.cl = cl

	a := e.startWorker("A", "--protocol", proto)
	b := e.startWorker("B", "--protocol", proto)
	ws := []*worker{a, b}
	for _, w := range ws {
		w.waitLog(30*time.Second, map[string]any{"msg": "worker starting"})
	}
	waitForMembers(t, e, 2)
	var many []string // enough keys to reach every partition
	for i := range 12 {
		many = append(many, fmt.Sprintf("%s-%d", keys[i%len(keys)], i))
	}
	e.produce(jobsFor(many, 0, 300)...)
	e.waitEveryPartitionCommitted(e.highWatermarks(), 30*time.Second, ws...)

	// More jobs, and the broker goes away while the workers are at them.
	e.produce(jobsFor(many, 300, 300)...)
	before := e.highWatermarks()
	e.waitForMoreCommits(1, 30*time.Second, ws...)
	br.stop(sig)
	t.Logf("broker stopped with %s; high watermarks were %v", sig, before)
	requireWorkersRunning(t, ws...)

	br = startBrokerProcess(t, addr, dir, e.topic, partitions)
	logGroupState(t, e, "as the broker is back")
	after := e.highWatermarks()
	for p, hwm := range before {
		if after[p] < hwm {
			t.Errorf("partition %d: the restarted broker's high watermark is %d, it had acknowledged records up to %d", p, after[p], hwm)
		}
	}
	e.produce(jobsFor(many, 600, 300)...)
	e.waitEveryPartitionCommitted(e.highWatermarks(), 30*time.Second, ws...)
	// The workers are members of the group again (not just fetching with
	// the assignment they had), and jobs produced now are processed too.
	waitForMembers(t, e, 2)
	logGroupState(t, e, "re-formed")
	e.produce(jobsFor(many, 900, 300)...)
	end := e.highWatermarks()
	e.waitEveryPartitionCommitted(end, 30*time.Second, ws...)
	requireWorkersRunning(t, ws...)
	h := checkRun(t, e, expect{ends: end})
	var claims []string
	for _, en := range h.Log {
		if en.Kind == "claim" {
			claims = append(claims, fmt.Sprintf("p%d@%s", en.Partition.Partition, en.Token))
		}
	}
	t.Logf("%d jobs, %d fenced commits; claims in order: %s", len(h.Writes), fenceLogCount(h, "commit"), strings.Join(claims, " "))
	for _, w := range ws {
		if m := w.findLog(map[string]any{"msg": consumer.IncarnationMovedOn}); m != nil {
			t.Logf("%s: %v", w.name, m["reason"])
		}
	}
	for _, w := range ws {
		w.stop(30 * time.Second)
	}
	br.stop(syscall.SIGTERM)
}

// logGroupState records what the broker knows of the group, for the report.
func logGroupState(t *testing.T, e *env, when string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	adm := kadm.NewClient(e.cl)
	if cg, err := adm.DescribeConsumerGroups(ctx, e.group); err == nil {
		if g, ok := cg[e.group]; ok && g.Err == nil && len(g.Members) > 0 {
			epochs := make([]int32, 0, len(g.Members))
			for _, m := range g.Members {
				epochs = append(epochs, m.MemberEpoch)
			}
			t.Logf("group %s (KIP-848): state %s, group epoch %d, member epochs %v", when, g.State, g.Epoch, epochs)
			return
		}
	}
	dg, err := adm.DescribeGroups(ctx, e.group)
	if err != nil {
		t.Logf("describing the group %s: %v", when, err)
		return
	}
	if g, ok := dg[e.group]; ok {
		t.Logf("group %s (classic): state %s, protocol %q, %d members, err %v", when, g.State, g.Protocol, len(g.Members), g.Err)
	}
}
