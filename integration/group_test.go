package integration

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
)

// waitForMembers waits until the group (classic or KIP-848) has n members
// and is stable.
func waitForMembers(t *testing.T, e *env, n int) {
	t.Helper()
	adm := kadm.NewClient(e.cl)
	waitFor(t, 60*time.Second, "the group to have its members", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if dg, err := adm.DescribeGroups(ctx, e.group); err == nil {
			if g, ok := dg[e.group]; ok && g.Err == nil && g.State == "Stable" && len(g.Members) == n {
				return true
			}
		}
		if cg, err := adm.DescribeConsumerGroups(ctx, e.group); err == nil {
			if g, ok := cg[e.group]; ok && g.Err == nil && len(g.Members) == n && g.State == "Stable" {
				return true
			}
		}
		return false
	})
}
