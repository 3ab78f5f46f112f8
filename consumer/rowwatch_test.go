package consumer_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/tenure-dev/tenure/sink"
)

// An operator's reset of a partition whose lane is idle (its jobs all
// processed, no new ones coming) takes effect within seconds, as it does for
// a busy lane (whose next commit is fenced). Before the row watch the idle
// lane never noticed: no job ran again until new traffic came or the
// partition moved to another member.
func TestResetReachesAnIdleLane(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	b.produce(40, func(i int) string { return fmt.Sprintf("k%d", i) })
	stop := b.start(b.config(ledger(t, b.schema), zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))))
	b.waitDone(60 * time.Second)
	ctx := context.Background()
	end := b.endOffsets()
	p := sink.Partition{Group: b.group, Topic: b.topic, Partition: 0}
	back := end[0] / 2
	r, err := b.store.ResetOffset(ctx, sink.ResetRequest{Partition: p, To: back, LogStart: 0, LogEnd: end[0], By: "ops@test"})
	if err != nil {
		t.Fatal(err)
	}
	if !r.Moved() {
		t.Fatalf("the reset moved nothing: %+v", r)
	}
	start := time.Now()
	// The jobs from the new offset run again, with nothing new produced.
	waitForCond(t, 15*time.Second, "the idle lane to process the partition again from the reset", func() bool {
		f, err := b.store.Get(ctx, p)
		return err == nil && f.NextOffset == end[0] && f.LogEpoch == r.LogEpoch
	})
	t.Logf("partition reset from %d to %d processed again within %s", r.From, back, time.Since(start).Round(time.Millisecond))
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	b.check()
}
