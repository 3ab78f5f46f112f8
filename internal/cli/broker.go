package cli

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/tenure-dev/tenure/internal/devbroker"
	"github.com/tenure-dev/tenure/partition"
)

var brokerSpec = spec{name: "broker", short: "run a local development broker (kfake; not for production)"}

// brokerCmd is `tenure broker`.
type brokerCmd struct {
	base
	listen, dataDir, topics, brokerConfig string
	partitions                            int32
	session, heartbeat                    time.Duration
	configs                               map[string]string
}

func (c *brokerCmd) define(f *flagSet) {
	f.String(&c.listen, "listen", "127.0.0.1:9092", "address to listen on", arg("ADDR"))
	f.String(&c.dataDir, "data-dir", "", "persist the broker's data here and reload it on start (default: in memory)", arg("DIR"))
	f.Count(&c.partitions, "partitions", 3, fmt.Sprintf("partition count, from 1 to %d, of the topics created by --topic or by producing to a new topic", partition.MaxCount))
	f.String(&c.topics, "topic", "", "topics to create at start, comma separated", arg("T[,T2]"))
	f.Duration(&c.session, "consumer-session-timeout", 45*time.Second, "KIP-848 group session timeout (group.consumer.session.timeout.ms)")
	f.Duration(&c.heartbeat, "consumer-heartbeat-interval", 5*time.Second, "KIP-848 heartbeat interval (group.consumer.heartbeat.interval.ms)")
	f.String(&c.brokerConfig, "broker-config", "", "extra kfake broker settings, KEY=VALUE comma separated (tests: offsets.retention.check.interval.ms=500 makes empty groups expire quickly)", arg("KEY=VALUE[,..]"))
}

func (c *brokerCmd) check([]string) error {
	if err := validTopics("topic", splitList(c.topics)); err != nil {
		return err
	}
	if c.session < 100*time.Millisecond || c.session > maxSession {
		return usagef("--consumer-session-timeout %s is out of range: it must be from 100ms to %s", c.session, maxSession)
	}
	if c.heartbeat <= 0 || c.heartbeat >= c.session {
		return usagef("--consumer-heartbeat-interval %s must be positive and below --consumer-session-timeout (%s)", c.heartbeat, c.session)
	}
	c.configs = map[string]string{}
	for _, kv := range splitList(c.brokerConfig) {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return usagef("--broker-config %q: want KEY=VALUE", kv)
		}
		c.configs[k] = v
	}
	return nil
}

func (c *brokerCmd) run(ctx context.Context) error {
	b, err := devbroker.Start(devbroker.Config{
		Listen: c.listen, DataDir: c.dataDir, Partitions: int(c.partitions), Topics: splitList(c.topics),
		ConsumerSessionTimeout: c.session, ConsumerHeartbeat: c.heartbeat, BrokerConfigs: c.configs,
	})
	if err != nil {
		return err
	}
	defer b.Close()
	fmt.Fprintf(c.stdout, "development broker (kfake) listening on %s; not for production. Ctrl-C stops it.\n", strings.Join(b.ListenAddrs(), ","))
	<-ctx.Done()
	return nil
}
