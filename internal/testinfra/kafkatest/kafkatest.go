// Package kafkatest is what the tests ask of a Kafka cluster themselves,
// beside what the code under test does: creating a topic and reading its
// end offsets, any error failing the test.
package kafkatest

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// timeout bounds each call: kfake answers at once, a real broker within
// seconds.
const timeout = 20 * time.Second

// CreateTopic creates topic with partitions partitions, one replica.
func CreateTopic(t testing.TB, cl *kgo.Client, topic string, partitions int32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, partitions, 1, nil, topic); err != nil {
		t.Fatalf("creating topic %s: %v", topic, err)
	}
}

// EndOffsets is every partition's end offset (high watermark) of topic.
func EndOffsets(t testing.TB, cl *kgo.Client, topic string) map[int32]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	offs, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int32]int64{}
	offs.Each(func(o kadm.ListedOffset) {
		if o.Err != nil {
			t.Fatalf("end offset of %s/%d: %v", o.Topic, o.Partition, o.Err)
		}
		out[o.Partition] = o.Offset
	})
	return out
}
