package devbroker

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tenure-dev/tenure/partition"
)

// Requests for absurd partition counts are refused at once with a message;
// the broker keeps serving, and its memory does not grow. A request at the
// limit is served.
func TestRefusesAbsurdPartitionCounts(t *testing.T) {
	c, err := Start(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	for _, n := range []int32{1<<31 - 1, partition.MaxCount + 1} {
		start := time.Now()
		resp, err := adm.CreateTopic(ctx, n, 1, nil, "huge")
		if err == nil {
			err = resp.Err
		}
		if !errors.Is(err, kerr.InvalidPartitions) || !strings.Contains(resp.ErrMessage, "more than this development broker allows (10000)") {
			t.Fatalf("CreateTopic with %d partitions: %v (%q)", n, err, resp.ErrMessage)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("refusing %d partitions took %s", n, took)
		}
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > 64<<20 {
		t.Errorf("the heap grew by %d MiB while refusing", grew>>20)
	}

	// Two topics in one request, one of them over the limit: nothing is
	// created.
	req := kmsg.NewPtrCreateTopicsRequest()
	for name, n := range map[string]int32{"small": 2, "big": partition.MaxCount + 1} {
		rt := kmsg.NewCreateTopicsRequestTopic()
		rt.Topic, rt.NumPartitions, rt.ReplicationFactor = name, n, 1
		req.Topics = append(req.Topics, rt)
	}
	mixed, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	for _, rt := range mixed.Topics {
		want := map[string]int16{"small": kerr.InvalidRequest.Code, "big": kerr.InvalidPartitions.Code}[rt.Topic]
		if rt.ErrorCode != want {
			t.Errorf("topic %s: error code %d, want %d", rt.Topic, rt.ErrorCode, want)
		}
	}
	if td, err := adm.ListTopics(ctx, "small"); err != nil || td.Has("small") {
		t.Errorf("topic small was created by a refused request (%v)", err)
	}

	created, err := adm.CreateTopics(ctx, 2, 1, nil, "fine")
	if err != nil {
		t.Fatal(err)
	}
	if err := created["fine"].Err; err != nil {
		t.Fatalf("a topic of 2 partitions: %v", err)
	}
	resp, err := adm.CreatePartitions(ctx, 1<<30, "fine")
	if err != nil {
		t.Fatal(err)
	}
	if err := resp["fine"].Err; !errors.Is(err, kerr.InvalidPartitions) || !strings.Contains(resp["fine"].ErrMessage, "more than") {
		t.Fatalf("adding 2^30 partitions: %v (%q)", err, resp["fine"].ErrMessage)
	}
	if resp, err := adm.UpdatePartitions(ctx, 4, "fine"); err != nil || resp["fine"].Err != nil {
		t.Fatalf("growing to 4 partitions: %v %v", err, resp)
	}
	at, err := adm.CreateTopic(ctx, partition.MaxCount, 1, nil, "at-the-limit")
	if err == nil {
		err = at.Err
	}
	if err != nil {
		t.Fatalf("a topic of %d partitions: %v", partition.MaxCount, err)
	}
	td, err := adm.ListTopics(ctx, "fine", "at-the-limit")
	if err != nil || len(td["fine"].Partitions) != 4 || len(td["at-the-limit"].Partitions) != partition.MaxCount {
		t.Fatalf("topics after the requests: %v", err)
	}
}

func TestStartRefusesBadPartitions(t *testing.T) {
	for _, n := range []int{-1, partition.MaxCount + 1} {
		if c, err := Start(Config{Partitions: n}); err == nil {
			c.Close()
			t.Errorf("Start with %d partitions succeeded", n)
		}
	}
}
