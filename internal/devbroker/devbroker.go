// Package devbroker starts kfake, franz-go's in-process Kafka wire-protocol
// cluster, with settings suited to development and tests: loopback only,
// short group timeouts allowed, optional persistence. It is not a production
// broker.
package devbroker

import (
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

// Config describes a development broker.
type Config struct {
	// Listen is host:port; port 0 picks a free one (default 127.0.0.1:0).
	Listen string
	// DataDir, when set, persists the cluster there and reloads it on start.
	DataDir string
	// Partitions is the partition count of auto-created topics (default 3).
	Partitions int
	// Topics are created at start with Partitions partitions.
	Topics []string
	// ConsumerSessionTimeout and ConsumerHeartbeat are the KIP-848 group
	// session timeout and heartbeat interval, which are broker settings
	// (defaults 45s / 5s, as in Apache Kafka).
	ConsumerSessionTimeout, ConsumerHeartbeat time.Duration
	// AutoCreateTopics lets producers create topics by writing to them.
	AutoCreateTopics bool
	// BrokerConfigs are extra broker settings (e.g.
	// offsets.retention.check.interval.ms, to make empty groups expire
	// quickly in tests).
	BrokerConfigs map[string]string
}

// Start starts the broker. Close it with Cluster.Close.
func Start(cfg Config) (*kfake.Cluster, error) {
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.Partitions == 0 {
		cfg.Partitions = 3
	}
	if cfg.ConsumerSessionTimeout == 0 {
		cfg.ConsumerSessionTimeout = 45 * time.Second
	}
	if cfg.ConsumerHeartbeat == 0 {
		cfg.ConsumerHeartbeat = 5 * time.Second
	}
	host, portStr, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen address %q is not host:port", cfg.Listen)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return nil, fmt.Errorf("listen address %q has a bad port", cfg.Listen)
	}
	if cfg.Partitions < 1 {
		return nil, fmt.Errorf("partition count %d must be at least 1", cfg.Partitions)
	}
	opts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.Ports(port),
		kfake.ListenFn(func(network, _ string) (net.Listener, error) {
			return net.Listen(network, net.JoinHostPort(host, strconv.Itoa(port)))
		}),
		kfake.DefaultNumPartitions(cfg.Partitions),
		// Tests pause workers past their session timeout; let them use
		// short ones.
		kfake.GroupMinSessionTimeout(500 * time.Millisecond),
		kfake.BrokerConfigs(map[string]string{
			"group.consumer.session.timeout.ms":    strconv.FormatInt(cfg.ConsumerSessionTimeout.Milliseconds(), 10),
			"group.consumer.heartbeat.interval.ms": strconv.FormatInt(cfg.ConsumerHeartbeat.Milliseconds(), 10),
		}),
	}
	if len(cfg.BrokerConfigs) > 0 {
		opts = append(opts, kfake.BrokerConfigs(cfg.BrokerConfigs))
	}
	if cfg.AutoCreateTopics {
		opts = append(opts, kfake.AllowAutoTopicCreation())
	}
	if cfg.DataDir != "" {
		opts = append(opts, kfake.DataDir(cfg.DataDir))
	}
	if len(cfg.Topics) > 0 {
		opts = append(opts, kfake.SeedTopics(int32(cfg.Partitions), cfg.Topics...))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		return nil, fmt.Errorf("starting development broker on %s: %w", cfg.Listen, err)
	}
	return c, nil
}
