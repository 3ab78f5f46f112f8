package consumer

import "testing"

func TestLaneConnsKeepsAReserve(t *testing.T) {
	// pool size: the lanes' share. A pool of 1 has nothing to spare: the
	// lanes and the claims share its connection, as before.
	for conns, want := range map[int32]int{1: 1, 2: 1, 4: 3, 8: 7, 15: 14, 16: 14, 32: 28, 100: 96} {
		if got := laneConns(conns); got != want {
			t.Errorf("laneConns(%d) = %d, want %d", conns, got, want)
		}
	}
}
