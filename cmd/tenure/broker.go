package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/tenure-dev/tenure/internal/devbroker"
	"github.com/tenure-dev/tenure/partition"
)

func init() {
	register(command{name: "broker", summary: "run a local development broker (kfake; not for production)", run: runBroker})
}

func runBroker(ctx context.Context, e *env, args []string) error {
	f := newFlagSet(e, "broker", "[--listen 127.0.0.1:9092] [--data-dir DIR] [--partitions N] [--topic T[,T2]]\n"+
		"    [--consumer-session-timeout D] [--consumer-heartbeat-interval D] [--broker-config KEY=VALUE[,KEY=VALUE]]")
	listen := f.String("listen", "127.0.0.1:9092", "address to listen on")
	dataDir := f.String("data-dir", "", "persist the broker's data here and reload it on start (default: in memory)")
	partitions := f.Count("partitions", 3, fmt.Sprintf("partition count, from 1 to %d, of the topics created by --topic or by producing to a new topic", partition.MaxCount))
	topics := f.String("topic", "", "topics to create at start, comma separated")
	session := f.Duration("consumer-session-timeout", 45*time.Second, "KIP-848 group session timeout (group.consumer.session.timeout.ms)")
	heartbeat := f.Duration("consumer-heartbeat-interval", 5*time.Second, "KIP-848 heartbeat interval (group.consumer.heartbeat.interval.ms)")
	brokerConfig := f.String("broker-config", "", "extra kfake broker settings, KEY=VALUE comma separated (tests: offsets.retention.check.interval.ms=500 makes empty groups expire quickly)")
	if err := f.parse(args, 0); err != nil {
		return err
	}
	if err := validTopics("topic", splitList(*topics)); err != nil {
		return err
	}
	if *session < 100*time.Millisecond || *session > maxSession {
		return usagef("--consumer-session-timeout %s is out of range: it must be from 100ms to %s", *session, maxSession)
	}
	if *heartbeat <= 0 || *heartbeat >= *session {
		return usagef("--consumer-heartbeat-interval %s must be positive and below --consumer-session-timeout (%s)", *heartbeat, *session)
	}
	configs := map[string]string{}
	for _, kv := range splitList(*brokerConfig) {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return usagef("--broker-config %q: want KEY=VALUE", kv)
		}
		configs[k] = v
	}
	c, err := devbroker.Start(devbroker.Config{
		Listen: *listen, DataDir: *dataDir, Partitions: int(*partitions), Topics: splitList(*topics),
		ConsumerSessionTimeout: *session, ConsumerHeartbeat: *heartbeat, BrokerConfigs: configs,
	})
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Fprintf(e.stdout, "development broker (kfake) listening on %s; not for production. Ctrl-C stops it.\n", strings.Join(c.ListenAddrs(), ","))
	<-ctx.Done()
	return nil
}
