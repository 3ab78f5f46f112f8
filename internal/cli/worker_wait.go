package cli

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/internal/tick"
	"github.com/tenure-dev/tenure/sink"
)

// waitBounds are the settings that bound a worker's wait for partitions.
type waitBounds struct {
	protocol           string
	session, rebalance time.Duration
}

// waitGrace is how long a worker holds no partition before it says why.
const waitGrace = 3 * time.Second

// watchWaiting logs, once per wait, when the worker has held no partition
// for waitGrace: what it waits for, and how long that lasts at most. A
// member that stopped (paused, crashed, cut off) keeps its partitions, and
// a classic group's rebalance waits for it, until its session times out;
// without this line the new worker would say nothing for that long.
func watchWaiting(ctx context.Context, c *consumer.Consumer, store *sink.Store, group string, topics []string, b waitBounds, log *zap.Logger) {
	var idleSince, asked time.Time
	said := false
	tick.Every(ctx, time.Second, func() {
		cl := c.Client()
		if st := c.Stats(); st.Lanes > 0 || st.SteppedDown == 1 || cl == nil {
			idleSince, asked, said = time.Time{}, time.Time{}, false
			return
		}
		if idleSince.IsZero() {
			idleSince = time.Now()
		}
		// Ask the coordinator once the grace is over, then at most every
		// waitGrace while there is nothing to say (a claim under way).
		if said || time.Since(idleSince) < waitGrace || time.Since(asked) < waitGrace {
			return
		}
		asked = time.Now()
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		rows, err := consumer.Describe(dctx, cl, store, group, topics)
		session := b.session
		if err == nil && b.protocol == string(consumer.NextGen) {
			session = brokerSessionTimeout(dctx, cl)
		}
		cancel()
		if err != nil {
			log.Debug("describing the group to say what this worker waits for", zap.Error(err))
			return
		}
		me, _ := cl.GroupMetadata()
		if why, atMost, fields := waitReason(rows, me, b.protocol, session); why != "" {
			log.Info("waiting for partitions", append([]zap.Field{zap.String("why", why), zap.String("at_most", atMost)}, fields...)...)
			said = true
		}
	})
}

// waitReason says why member me holds none of rows' partitions, and the
// longest that can last. session is the session timeout the group's members
// are assumed to use (0: unknown, a KIP-848 broker setting not read).
func waitReason(rows []consumer.Assignment, me, protocol string, session time.Duration) (why, atMost string, fields []zap.Field) {
	if len(rows) == 0 {
		return "", "", nil
	}
	atMost = "one session timeout: " + session.String()
	switch {
	case session == 0:
		atMost = "one session timeout (the broker's group.consumer.session.timeout.ms)"
	case protocol == string(consumer.NextGen):
		atMost += " (the broker's group.consumer.session.timeout.ms)"
	default:
		atMost += " (this worker's --session-timeout; a member started with a longer one keeps its partitions longer)"
	}
	held := map[string]int{} // other members -> partitions
	var rebalancing, unowned, mine int
	for _, r := range rows {
		switch {
		case r.State == consumer.StateRebalancing:
			rebalancing++
		case r.MemberID == "":
			unowned++
		case r.MemberID == me:
			mine++
		default:
			held[r.MemberID]++
		}
	}
	holders := make([]string, 0, len(held))
	for m, n := range held {
		holders = append(holders, m+" ("+plural(n, "partition")+")")
	}
	sort.Strings(holders)
	fields = []zap.Field{zap.Int("partitions", len(rows)), zap.Strings("held_by", holders)}
	switch {
	case mine > 0:
		// Assigned, not yet claimed: the claim is under way.
		return "", "", nil
	case rebalancing > 0:
		return "the group is rebalancing: the coordinator waits for every member to rejoin, and removes a member that stopped " +
			"(paused, crashed or cut off) once its session times out", atMost, fields
	case len(held) > 0 && len(held) >= len(rows):
		return "the other members hold every partition, one or more each: this worker takes over when one leaves, or when one " +
			"that stopped is removed at the end of its session", atMost, fields
	case len(held) > 0:
		return fmt.Sprintf("the members holding the partitions must give some up to this worker first (%d of %d partitions are held by %s); "+
			"one that stopped (paused, crashed or cut off) gives them up only when its session times out",
			len(rows)-unowned, len(rows), plural(len(held), "other member")), atMost, fields
	}
	return "no member is assigned the topics' partitions yet: the coordinator has not finished assigning them", atMost, fields
}

// brokerSessionTimeout reads the KIP-848 session timeout from a broker's
// configuration (group.consumer.session.timeout.ms); 0 if it cannot.
func brokerSessionTimeout(ctx context.Context, cl *kgo.Client) time.Duration {
	rcs, err := kadm.NewClient(cl).DescribeBrokerConfigs(ctx)
	if err != nil {
		return 0
	}
	for _, rc := range rcs {
		for _, c := range rc.Configs {
			if c.Key == "group.consumer.session.timeout.ms" && c.Value != nil {
				if ms, err := strconv.ParseInt(*c.Value, 10, 64); err == nil && ms > 0 {
					return time.Duration(ms) * time.Millisecond
				}
			}
		}
	}
	return 0
}
