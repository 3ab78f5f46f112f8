package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	protocol "github.com/tenure-dev/tenure/internal/fence"
	"github.com/tenure-dev/tenure/sink"
)

// jobOutput is `admin job --output json`.
type jobOutput struct {
	Job        string `json:"job"`
	State      string `json:"state"`
	Reason     string `json:"reason"`
	NextOffset *int64 `json:"next_offset"`
	LagBefore  *int64 `json:"lag_before"`
	LogEnd     *int64 `json:"log_end"`
	Commits    []struct {
		ID      int64  `json:"fence_log_id"`
		Token   string `json:"token"`
		Owner   string `json:"owner"`
		ClaimID int64  `json:"claim_id"`
		From    int64  `json:"from_offset"`
		To      int64  `json:"to_offset"`
	} `json:"commits"`
	Resets []struct {
		ID     int64  `json:"fence_log_id"`
		Actor  string `json:"actor"`
		Effect string `json:"effect"`
	} `json:"resets"`
	DeadLetter *struct {
		ID    int64  `json:"id"`
		Error string `json:"error"`
		Value string `json:"value"`
	} `json:"dead_letter"`
	FenceLogPruned *struct {
		ThroughID int64 `json:"through_id"`
	} `json:"fence_log_pruned"`
}

func (e *env) jobArgs(job string, extra ...string) []string {
	return append([]string{"admin", "job", job, "--database-url", e.dbURL, "--schema", e.schema, "--group", e.group}, extra...)
}

func jobJSON(t *testing.T, e *env, job string, brokers bool) jobOutput {
	t.Helper()
	extra := []string{"--output", "json"}
	if brokers {
		extra = append(extra, "--brokers", strings.Join(e.brokers, ","))
	}
	r := runCLI(t, 60*time.Second, "", e.jobArgs(job, extra...)...)
	if r.code != 0 {
		t.Fatalf("admin job %s: %s", job, r)
	}
	var out jobOutput
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatalf("admin job %s: %v\n%s", job, err, r)
	}
	return out
}

// `tenure admin job` says what became of one job: committed (by whom,
// with which token and claim, in which batch), dead-lettered (with its
// letter), lost (skipped by a reset, named), pending (the lag before it),
// or not in the log; and, once the fence log is pruned, that the commit's
// entry is gone.
func TestAdminJob(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	jobs := jobsFailingAt(10, 3)
	e.produce(jobs...)
	e.ledgerCaughtUp(10, "--inject-faults", "--max-attempts", "1").stop(30 * time.Second)
	e.produce(jobsFor(keys, 10, 10)...)
	resetJSON(t, e, "--partition", "0", "--to-offset", "15", "--execute")

	committed := jobJSON(t, e, e.topic+"/0/2", false)
	if committed.State != "committed" || len(committed.Commits) != 1 || committed.Commits[0].Token != "0.1" || committed.Commits[0].ClaimID == 0 ||
		!strings.HasPrefix(committed.Commits[0].Owner, "tenure-W-") || committed.Commits[0].From > 2 || committed.Commits[0].To <= 2 ||
		!strings.Contains(committed.Reason, "committed at ") {
		t.Errorf("job 2: %+v", committed)
	}
	dead := jobJSON(t, e, e.topic+"/0/3", false)
	if dead.State != "dead-lettered" || dead.DeadLetter == nil || !strings.Contains(dead.DeadLetter.Error, "injected failure") ||
		dead.DeadLetter.Value != jobs[3][1] || !strings.Contains(dead.Reason, "after 1 attempts") {
		t.Errorf("job 3: %+v", dead)
	}
	lost := jobJSON(t, e, e.topic+"/0/12", false)
	if lost.State != "lost" || len(lost.Resets) != 1 || lost.Resets[0].Actor != resetActor || lost.Resets[0].Effect != "skipped" ||
		!strings.Contains(lost.Reason, "skipped: reset #") {
		t.Errorf("job 12: %+v", lost)
	}
	pending := jobJSON(t, e, e.topic+"/0/17", true)
	if pending.State != "pending" || pending.LagBefore == nil || *pending.LagBefore != 2 || *pending.NextOffset != 15 {
		t.Errorf("job 17: %+v", pending)
	}
	beyond := jobJSON(t, e, e.topic+"/0/25", true)
	if beyond.State != "not-in-log" || beyond.LogEnd == nil || *beyond.LogEnd != 20 {
		t.Errorf("job 25: %+v", beyond)
	}
	wantFailure(t, runCLI(t, 30*time.Second, "", e.jobArgs(e.topic+"/0/17")...), 2, "needs the log: give --brokers")

	r := runCLI(t, 30*time.Second, "", e.jobArgs(e.topic+"/0/2")...)
	if r.code != 0 || !strings.Contains(r.stdout, "state       committed") || !strings.Contains(r.stdout, "commit      #") {
		t.Errorf("admin job (table): %s", r)
	}
	t.Logf("admin job %s/0/2:\n%s", e.topic, r.stdout)

	// Pruned: the commit's entry is gone, and the command says so.
	store := e.store()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if n, err := protocol.Of(store).PruneFenceLog(ctx, sink.Partition{Group: e.group, Topic: e.topic, Partition: 0}, sink.FenceLogRetention{MaxEntries: 1}); err != nil || n == 0 {
		t.Fatalf("pruning: %d %v", n, err)
	}
	pruned := jobJSON(t, e, e.topic+"/0/2", false)
	if pruned.State != "committed" || len(pruned.Commits) != 0 || pruned.FenceLogPruned == nil || !strings.Contains(pruned.Reason, "were pruned") {
		t.Errorf("job 2 after pruning: %+v", pruned)
	}
}

// `tenure admin topic list` lists the topics like kcat -L's topic part;
// `tenure admin jobs peek` prints jobs from an offset with their bytes
// escaped (exact in base64 with --output json); `tenure admin jobs tail`
// follows new jobs until --count or an interrupt.
// checkPeek checks `admin jobs peek` on the records
// TestAdminTopicListAndJobs produced (odd is the value of the second).
func checkPeek(t *testing.T, e *env, odd []byte) {
	t.Helper()
	brokers := strings.Join(e.brokers, ",")
	peek := []string{"admin", "jobs", "peek", "--brokers", brokers, "--topic", e.topic}
	r := runCLI(t, 30*time.Second, "", append(peek, "--partition", "1", "--offset", "1", "--count", "2")...)
	lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
	if r.code != 0 || len(lines) != 3 || !strings.HasPrefix(lines[0], "JOB") ||
		!strings.Contains(lines[1], e.topic+"/1/1") || !strings.Contains(lines[1], `b\tc`) || !strings.Contains(lines[1], "id=x1") ||
		!strings.Contains(lines[1], `line\nbreak \x1b[31m\xff\\`) || !strings.Contains(lines[2], e.topic+"/1/2") || !strings.Contains(lines[2], `-`) {
		t.Fatalf("jobs peek: %s", r)
	}
	t.Logf("jobs peek:\n%s", r.stdout)
	r = runCLI(t, 30*time.Second, "", append(peek, "--output", "json")...)
	var rows []struct {
		Job         string  `json:"job"`
		Key         *string `json:"key"`
		ValueBase64 *string `json:"value_base64"`
		Headers     []struct {
			Key   string  `json:"key"`
			Value *string `json:"value"`
		} `json:"headers"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &rows); r.code != 0 || err != nil || len(rows) != 4 {
		t.Fatalf("jobs peek --output json: %v %s", err, r)
	}
	if rows[0].Job != e.topic+"/0/0" || rows[2].Job != e.topic+"/1/1" || rows[3].Key != nil {
		t.Errorf("jobs peek --output json order or keys: %+v", rows)
	}
	if b, err := base64.StdEncoding.DecodeString(*rows[2].ValueBase64); err != nil || !bytes.Equal(b, odd) || *rows[2].Headers[0].Value != "x1" {
		t.Errorf("jobs peek --output json lost bytes: %q %v", b, err)
	}
	wantFailure(t, runCLI(t, 30*time.Second, "", append(peek, "--partition", "2")...), 2, "there is no partition 2")
	if r := runCLI(t, 30*time.Second, "", append(peek, "--partition", "0", "--offset", "5")...); r.code != 0 ||
		!strings.Contains(r.stderr, "partition 0 has no jobs at or after offset 5 (its log ends at 1)") {
		t.Errorf("peek beyond the end: %s", r)
	}
}

func TestAdminTopicListAndJobs(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	brokers := strings.Join(e.brokers, ",")
	t.Run("TopicList", func(t *testing.T) {
		r := runCLI(t, 30*time.Second, "", "admin", "topic", "list", "--brokers", brokers, "--output", "json")
		var topics []struct {
			Topic       string `json:"topic"`
			Partitions  int    `json:"partitions"`
			Replication int    `json:"replication_factor"`
			Internal    bool   `json:"internal"`
			ID          string `json:"topic_id"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &topics); r.code != 0 || err != nil {
			t.Fatalf("topic list: %v %s", err, r)
		}
		found := false
		for _, tp := range topics {
			if tp.Topic == e.topic {
				found = tp.Partitions == 2 && tp.Replication == 1 && !tp.Internal && tp.ID != ""
			}
		}
		if !found {
			t.Errorf("topic list does not show %s with 2 partitions, replication 1: %s", e.topic, r.stdout)
		}
		if r := runCLI(t, 30*time.Second, "", "admin", "topic", "list", "--brokers", brokers); r.code != 0 || !strings.Contains(r.stdout, "TOPIC") ||
			!strings.Contains(r.stdout, e.topic) {
			t.Errorf("topic list (table): %s", r)
		}
	})

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	odd := []byte("line\nbreak \x1b[31m\xff\\")
	recs := []*kgo.Record{
		{Topic: e.topic, Partition: 1, Key: []byte("a"), Value: []byte(`{"seq":0}`)},
		{Topic: e.topic, Partition: 1, Key: []byte("b\tc"), Value: odd, Headers: []kgo.RecordHeader{{Key: "id", Value: []byte("x1")}}},
		{Topic: e.topic, Partition: 1, Key: nil, Value: []byte{}},
		{Topic: e.topic, Partition: 0, Key: []byte("z"), Value: []byte("p0")},
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	tctx, tcancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer tcancel()
	t.Run("Peek", func(t *testing.T) { checkPeek(t, e, odd) })
	// tail: new jobs only, until --count.
	t.Run("Tail", func(t *testing.T) {
		tail := exec.CommandContext(tctx, tenureBin, "admin", "jobs", "tail", "--brokers", brokers, "--topic", e.topic, "--count", "2", "--output", "json")
		var out bytes.Buffer
		tail.Stdout = &out
		stderr, err := tail.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := tail.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(stderr)
		if !sc.Scan() || !strings.Contains(sc.Text(), "following topic "+e.topic) {
			t.Fatalf("tail did not say it follows: %q", sc.Text())
		}
		go func() {
			for sc.Scan() {
			}
		}()
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: e.topic, Partition: 0, Key: []byte("n1"), Value: []byte("new 1")},
			&kgo.Record{Topic: e.topic, Partition: 1, Key: []byte("n2"), Value: []byte("new 2")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if err := tail.Wait(); err != nil {
			t.Fatalf("tail --count 2: %v\n%s", err, out.String())
		}
		got := strings.Split(strings.TrimSpace(out.String()), "\n")
		if len(got) != 2 || !strings.Contains(out.String(), `"key": "n1"`) && !strings.Contains(out.String(), `"key":"n1"`) {
			t.Errorf("tail --count 2 printed:\n%s", out.String())
		}
	})
	// tail until interrupted: SIGINT ends it with exit 0.
	t.Run("TailInterrupted", func(t *testing.T) {
		tail := exec.CommandContext(tctx, tenureBin, "admin", "jobs", "tail", "--brokers", brokers, "--topic", e.topic)
		var terr bytes.Buffer
		tail.Stderr = &terr
		if err := tail.Start(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 30*time.Second, "tail to start following", func() bool { return strings.Contains(terr.String(), "following topic") })
		_ = tail.Process.Signal(syscall.SIGINT)
		if err := tail.Wait(); err != nil || !strings.Contains(terr.String(), "stopped (SIGINT) after 0 jobs") {
			t.Errorf("tail interrupted: %v, %q", err, terr.String())
		}
	})
}
