package consumer

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// A hundred lanes that read a 1,000-partition topic's log at once share
// the reads: the one in flight when they ask, and the next. Each read is
// two ListOffsets requests (the starts, the ends) to the one broker; a
// read per lane made 200, and held a thousand partitions' offsets per lane
// at once. The first request is held back, so that every lane asks while
// a read is in flight, whatever the machine's load.
func TestTopicLogsShareReadsInFlight(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1000, "t"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var requests atomic.Int64
	c.ControlKey(int16(kmsg.ListOffsets), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if requests.Add(1) == 1 {
			time.Sleep(200 * time.Millisecond)
		}
		return nil, nil, false
	})
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	const lanes = 100
	errs := make(chan error, lanes)
	var wg sync.WaitGroup
	for range lanes {
		wg.Go(func() {
			logs, err := topicLogs(ctx, cl, []string{"t"}, true)
			if err == nil && (logs["t"] == nil || len(logs["t"].end) != 1000 || len(logs["t"].start) != 1000) {
				err = fmt.Errorf("a read without the 1,000 partitions' offsets: %+v", logs["t"])
			}
			if err == nil {
				logs["t"] = nil // each caller's map is its own
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	// Two reads, four requests; a lane slow enough to ask after the second
	// read started makes a third.
	if n := requests.Load(); n > 8 {
		t.Fatalf("%d ListOffsets requests for %d lanes reading at once: the reads were not shared", n, lanes)
	}
	t.Logf("%d ListOffsets requests for %d lanes", requests.Load(), lanes)
	logReads.mu.Lock()
	defer logReads.mu.Unlock()
	if len(logReads.running)+len(logReads.next) != 0 {
		t.Fatalf("reads left behind: %d running, %d waiting", len(logReads.running), len(logReads.next))
	}
}
