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

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tenure-dev/tenure/partition"
)

// Config describes a development broker.
type Config struct {
	// Listen is host:port; port 0 picks a free one (default 127.0.0.1:0).
	Listen string
	// DataDir, when set, persists the cluster there and reloads it on start.
	DataDir string
	// Partitions is the partition count of auto-created topics (default 3,
	// at most partition.MaxCount).
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
	// Extra are more kfake options, applied last (tests: SASL users with
	// kfake.EnableSASL and kfake.User, a TLS listener with kfake.TLS).
	Extra []kfake.Opt
}

// Start starts the broker. Close it with Cluster.Close.
//
// The broker refuses CreateTopics and CreatePartitions requests for more
// than partition.MaxCount partitions (INVALID_PARTITIONS, with a message):
// kfake would try to build them all and grow until the machine runs out of
// memory, unresponsive to everyone in the meantime.
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
	if err := partition.CheckCount(int64(cfg.Partitions)); err != nil {
		return nil, err
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
	opts = append(opts, cfg.Extra...)
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		return nil, fmt.Errorf("starting development broker on %s: %w", cfg.Listen, err)
	}
	refuseAbsurdCounts(c)
	return c, nil
}

// tooMany is the message of a refused request.
func tooMany(n int32) string {
	return fmt.Sprintf("%d partitions is more than this development broker allows (%d)", n, partition.MaxCount)
}

// refuseAbsurdCounts answers CreateTopics and CreatePartitions requests that
// ask for more than partition.MaxCount partitions in a topic, before kfake
// sees them. A request that names such a topic is refused whole: the topics
// over the limit get INVALID_PARTITIONS, the others INVALID_REQUEST, and
// nothing is created.
func refuseAbsurdCounts(c *kfake.Cluster) {
	refuseOver(c, kmsg.CreateTopics, func(r kmsg.Request, count func(topic string, n int32)) {
		for _, t := range r.(*kmsg.CreateTopicsRequest).Topics {
			n := t.NumPartitions
			if len(t.ReplicaAssignment) > 0 {
				n = int32(min(len(t.ReplicaAssignment), 1<<31-1))
			}
			count(t.Topic, n)
		}
	}, func(r kmsg.Request, over map[string]int32) kmsg.Response {
		req := r.(*kmsg.CreateTopicsRequest)
		resp := req.ResponseKind().(*kmsg.CreateTopicsResponse)
		for _, t := range req.Topics {
			rt := kmsg.NewCreateTopicsResponseTopic()
			rt.Topic = t.Topic
			rt.NumPartitions, rt.ReplicationFactor = -1, -1
			rt.ErrorCode, rt.ErrorMessage = refusal(over, t.Topic, "created")
			resp.Topics = append(resp.Topics, rt)
		}
		return resp
	})
	refuseOver(c, kmsg.CreatePartitions, func(r kmsg.Request, count func(topic string, n int32)) {
		for _, t := range r.(*kmsg.CreatePartitionsRequest).Topics {
			count(t.Topic, t.Count)
		}
	}, func(r kmsg.Request, over map[string]int32) kmsg.Response {
		req := r.(*kmsg.CreatePartitionsRequest)
		resp := req.ResponseKind().(*kmsg.CreatePartitionsResponse)
		for _, t := range req.Topics {
			rt := kmsg.NewCreatePartitionsResponseTopic()
			rt.Topic = t.Topic
			rt.ErrorCode, rt.ErrorMessage = refusal(over, t.Topic, "changed")
			resp.Topics = append(resp.Topics, rt)
		}
		return resp
	})
}

// refuseOver controls requests of key: counts calls count with each topic
// of a request and the partitions the request asks it to have; when one of
// them is over partition.MaxCount the request gets refuse's response (over
// is those topics and their counts), otherwise kfake handles it.
func refuseOver(c *kfake.Cluster, key kmsg.Key, counts func(r kmsg.Request, count func(topic string, n int32)), refuse func(r kmsg.Request, over map[string]int32) kmsg.Response) {
	c.ControlKey(int16(key), func(r kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		over := map[string]int32{}
		counts(r, func(topic string, n int32) {
			if n > partition.MaxCount {
				over[topic] = n
			}
		})
		if len(over) == 0 {
			return nil, nil, false
		}
		return refuse(r, over), nil, true
	})
}

// refusal is the error code and message of topic in a refused request:
// INVALID_PARTITIONS with the count for a topic over the limit,
// INVALID_REQUEST for the others, whose request was not done either.
func refusal(over map[string]int32, topic, notDone string) (int16, *string) {
	if n, ok := over[topic]; ok {
		return kerr.InvalidPartitions.Code, kmsg.StringPtr(tooMany(n))
	}
	return kerr.InvalidRequest.Code, kmsg.StringPtr("another topic of this request asks for too many partitions; nothing was " + notDone)
}
