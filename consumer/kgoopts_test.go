package consumer_test

import (
	"context"
	"crypto/tls"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/internal/testinfra/testdb"
	"github.com/tenure-dev/tenure/sink"
)

// Config.KgoOpts come after tenure's own options, so they could silently
// replace what tenure relies on (its group, its callbacks, the claim in
// AdjustFetchOffsetsFn, the reset offset, the isolation level...). New
// refuses those, naming the option; options that only repeat tenure's own
// setting, and the ones KgoOpts exist for (TLS, SASL, tuning), pass.
func TestKgoOptsThatReplaceTenuresAreRefused(t *testing.T) {
	t.Parallel()
	store, err := sink.NewStore(testdb.Pool(t), "tenure")
	if err != nil {
		t.Fatal(err)
	}
	h := consumer.HandlerFunc(func(context.Context, consumer.Tx, *consumer.Batch) error { return nil })
	cfg := func(opts ...kgo.Opt) consumer.Config {
		return consumer.Config{Brokers: []string{"127.0.0.1:1"}, Group: "g", Topics: []string{"t"}, Store: store, Handler: h,
			RebalanceTimeout: 20 * time.Second, KgoOpts: opts}
	}
	noop := func(context.Context, *kgo.Client, map[string][]int32) {}
	for want, opt := range map[string]kgo.Opt{
		"kgo.ConsumerGroup":        kgo.ConsumerGroup("x"),
		"kgo.ConsumeTopics":        kgo.ConsumeTopics("other"),
		"kgo.ConsumeRegex":         kgo.ConsumeRegex(),
		"kgo.OnPartitionsAssigned": kgo.OnPartitionsAssigned(noop),
		"kgo.OnPartitionsRevoked":  kgo.OnPartitionsRevoked(noop),
		"kgo.OnPartitionsLost":     kgo.OnPartitionsLost(noop),
		"kgo.AdjustFetchOffsetsFn": kgo.AdjustFetchOffsetsFn(func(_ context.Context, o map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
			return o, nil
		}),
		"kgo.ConsumeResetOffset":  kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd()),
		"kgo.ConsumeStartOffset":  kgo.ConsumeStartOffset(kgo.NewOffset().AtEnd()),
		"kgo.AutoCommitInterval":  kgo.AutoCommitInterval(time.Second),
		"kgo.Balancers":           kgo.Balancers(kgo.RangeBalancer()),
		"kgo.FetchIsolationLevel": kgo.FetchIsolationLevel(kgo.ReadUncommitted()),
		"kgo.KeepControlRecords":  kgo.KeepControlRecords(),
		"kgo.RebalanceTimeout":    kgo.RebalanceTimeout(time.Minute),
		"kgo.SessionTimeout":      kgo.SessionTimeout(10 * time.Second),
		"kgo.ClientID":            kgo.ClientID("me"),
		"kgo.SeedBrokers":         kgo.SeedBrokers("10.0.0.1:9092"),
	} {
		_, err := consumer.New(cfg(opt))
		if strings.HasPrefix(want, "kgo.OnPartitions") {
			// kgo wraps a group client's partition callbacks: the error
			// names them together.
			want = "kgo.OnPartitionsAssigned, OnPartitionsRevoked or OnPartitionsLost"
		} else {
			want += " ("
		}
		if !errors.Is(err, consumer.ErrReservedKgoOpt) || !strings.Contains(err.Error(), want) {
			t.Errorf("KgoOpts with %s: %v, want ErrReservedKgoOpt naming it", want, err)
		}
	}
	if _, err := consumer.New(cfg(kgo.InstanceID("pod-0"))); !errors.Is(err, consumer.ErrStaticMembership) {
		t.Errorf("KgoOpts with kgo.InstanceID: %v, want ErrStaticMembership", err)
	}
	_, err = consumer.New(cfg(kgo.ConsumerGroup("x"), kgo.FetchIsolationLevel(kgo.ReadUncommitted())))
	if err == nil || !strings.Contains(err.Error(), "kgo.ConsumerGroup") || !strings.Contains(err.Error(), "kgo.FetchIsolationLevel") {
		t.Errorf("two reserved options: %v, want both named", err)
	}
	// Any group option is refused, even one that repeats tenure's own
	// value: tenure runs the group, and a group client's callbacks cannot
	// be told apart by their values.
	for name, opts := range map[string][]kgo.Opt{
		"the same group":             {kgo.ConsumerGroup("g")},
		"the same rebalance timeout": {kgo.RebalanceTimeout(20 * time.Second)},
		"autocommit off again":       {kgo.DisableAutoCommit(), kgo.BlockRebalanceOnPoll()},
		"an auto-commit callback":    {kgo.AutoCommitCallback(func(*kgo.Client, *kmsg.OffsetCommitRequest, *kmsg.OffsetCommitResponse, error) {})},
	} {
		if _, err := consumer.New(cfg(opts...)); !errors.Is(err, consumer.ErrReservedKgoOpt) {
			t.Errorf("KgoOpts with %s: %v, want ErrReservedKgoOpt", name, err)
		}
	}
	start := time.Now()
	for name, opts := range map[string][]kgo.Opt{
		"TLS":                {kgo.DialTLSConfig(&tls.Config{MinVersion: tls.VersionTLS12})},
		"tuning":             {kgo.FetchMaxBytes(1 << 20), kgo.MetadataMaxAge(time.Minute), kgo.FetchMaxWait(time.Second)},
		"the same topics":    {kgo.ConsumeTopics("t")},
		"the same isolation": {kgo.FetchIsolationLevel(kgo.ReadCommitted())},
		"the same seeds":     {kgo.SeedBrokers("127.0.0.1:1")},
	} {
		if _, err := consumer.New(cfg(opts...)); err != nil {
			t.Errorf("KgoOpts with %s: %v, want accepted", name, err)
		}
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("inspecting options took %s: it must not connect anywhere", d)
	}
}
