package integration

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tenure-dev/tenure/partition"
)

// kcat is librdkafka's command-line client (Debian package kcat): a Kafka
// client no one here wrote. scripts/test.sh installs it and sets
// TENURE_TEST_REQUIRE_KCAT, so that CI cannot skip these tests.
func kcatPath(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("kcat")
	if err != nil {
		if os.Getenv("TENURE_TEST_REQUIRE_KCAT") != "" {
			t.Fatalf("kcat is required (TENURE_TEST_REQUIRE_KCAT) but not found: %v", err)
		}
		t.Skip("kcat not installed (apt-get install kcat)")
	}
	return p
}

// kcat runs kcat with args (a bounded time) and returns its stdout.
func kcat(t *testing.T, bin string, stdin string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kcat %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out)
}

// Jobs produced by librdkafka: with partitioner=murmur2_random (what
// docs/handlers.md tells librdkafka users to set) every key lands on the
// partition partition.For names, the one tenure produce and franz-go
// choose, and a tenure worker processes them exactly once; with
// librdkafka's default partitioner keys land elsewhere, which is why
// docs/handlers.md says to set it.
// The other way round, kcat reads what `tenure produce` wrote, each key on
// the partition partition.For names.
func TestKcatInterop(t *testing.T) {
	bin := kcatPath(t)
	t.Parallel()
	const parts, n = 6, 120
	e := newEnv(t, parts)
	broker := strings.Join(e.brokers, ",")
	var in strings.Builder
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("customer-%d", i)
		fmt.Fprintf(&in, "%s\t{\"n\":%d,\"by\":\"kcat\"}\n", keys[i], i)
	}

	// 1. kcat produces with murmur2_random: keys where partition.For says.
	kcat(t, bin, in.String(), "-P", "-b", broker, "-t", e.topic, "-K", "\t", "-X", "partitioner=murmur2_random", "-X", "acks=all")
	recs := readTopic(t, e, e.topic, n)
	for _, r := range recs {
		if want := partition.For(r.Key, parts); r.Partition != want {
			t.Errorf("kcat (murmur2_random) put key %q on partition %d; partition.For says %d", r.Key, r.Partition, want)
		}
		if !strings.Contains(string(r.Value), `"by":"kcat"`) {
			t.Errorf("record %q: value %q is not what kcat was given", r.Key, r.Value)
		}
	}

	// 2. A tenure worker processes them exactly once, checked against the
	// log and the coordinator's side.
	w := e.startWorker("W")
	for p := int32(0); p < parts; p++ {
		waitCommitted(t, e, p, e.highWatermark(p), "")
	}
	w.stop(30 * time.Second)
	partsList := make([]int32, parts)
	for i := range partsList {
		partsList[i] = int32(i)
	}
	checkRun(t, e, expect{partitions: partsList})

	// 3. librdkafka's default partitioner does not agree: the warning in
	// docs/handlers.md is needed.
	other := e.topic + "-default"
	createTopic(t, e, other, parts)
	kcat(t, bin, in.String(), "-P", "-b", broker, "-t", other, "-K", "\t", "-X", "acks=all")
	moved := 0
	for _, r := range readTopic(t, e, other, n) {
		if r.Partition != partition.For(r.Key, parts) {
			moved++
		}
	}
	if moved == 0 {
		t.Errorf("librdkafka's default partitioner put all %d keys where murmur2 does: docs/handlers.md's warning would be wrong", n)
	}
	t.Logf("librdkafka's default partitioner put %d of %d keys on another partition than murmur2", moved, n)

	// 4. kcat reads what tenure produce wrote.
	third := e.topic + "-produced"
	createTopic(t, e, third, parts)
	var jobs strings.Builder
	for i, k := range keys {
		fmt.Fprintf(&jobs, "{\"key\":%q,\"value\":\"job %d\"}\n", k, i)
	}
	if r := runCLI(t, 60*time.Second, jobs.String(), "produce", "--brokers", broker, "--topic", third, "--input", "-"); r.code != 0 {
		t.Fatalf("tenure produce: %s", r)
	}
	out := kcat(t, bin, "", "-C", "-b", broker, "-t", third, "-o", "beginning", "-e", "-q", "-f", "%p\t%k\t%s\n")
	seen := 0
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.SplitN(sc.Text(), "\t", 3)
		if len(f) != 3 {
			t.Fatalf("kcat printed %q", sc.Text())
		}
		p, err := strconv.Atoi(f[0])
		if err != nil {
			t.Fatalf("kcat printed partition %q", f[0])
		}
		if want := partition.For([]byte(f[1]), parts); int32(p) != want {
			t.Errorf("tenure produce put key %q on partition %d; partition.For says %d", f[1], p, want)
		}
		if !strings.HasPrefix(f[2], "job ") {
			t.Errorf("key %q: kcat read value %q", f[1], f[2])
		}
		seen++
	}
	if seen != n {
		t.Errorf("kcat read %d of the %d jobs tenure produce wrote", seen, n)
	}
}

func createTopic(t *testing.T, e *env, topic string, parts int32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	adm := kadm.NewClient(e.cl)
	if _, err := adm.CreateTopic(ctx, parts, 1, nil, topic); err != nil {
		t.Fatalf("creating topic %s: %v", topic, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopics(ctx, topic)
	})
}

// readTopic reads the first n records of topic from the start.
func readTopic(t *testing.T, e *env, topic string, n int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []*kgo.Record
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d of %d records of %s", len(out), n, topic)
		}
		fs.EachRecord(func(r *kgo.Record) { out = append(out, r) })
	}
	return out
}
