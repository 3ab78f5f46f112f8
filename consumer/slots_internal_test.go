package consumer

import (
	"testing"
	"time"
)

func TestLaneConnsKeepsAReserve(t *testing.T) {
	// pool size: the lanes' share. A pool of 1 has nothing to spare: the
	// lanes and the claims share its connection, as before.
	for conns, want := range map[int32]int{1: 1, 2: 1, 4: 3, 8: 7, 15: 14, 16: 14, 32: 28, 100: 96} {
		if got := laneConns(conns); got != want {
			t.Errorf("laneConns(%d) = %d, want %d", conns, got, want)
		}
	}
}

// The classic heartbeat: a sixth of a short session (the survivors of a
// dead member learn of the rebalance within it), kgo's 3s otherwise.
func TestHeartbeatInterval(t *testing.T) {
	for _, c := range []struct {
		session, want time.Duration
		ok            bool
	}{
		{6 * time.Second, time.Second, true},
		{10 * time.Second, 10 * time.Second / 6, true},
		{17 * time.Second, 17 * time.Second / 6, true},
		{18 * time.Second, 0, false},
		{DefaultSessionTimeout, 0, false},
	} {
		hb, ok := heartbeatInterval(c.session)
		if ok != c.ok || (ok && hb != c.want) {
			t.Errorf("heartbeatInterval(%s) = %s, %v; want %s, %v", c.session, hb, ok, c.want, c.ok)
		}
	}
}
