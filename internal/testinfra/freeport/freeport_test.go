package freeport

import (
	"net"
	"strconv"
	"testing"
)

// The ports must come from below the kernel's ephemeral range, where an
// outgoing connection can take one between the check and the bind, and
// must be free.
func TestBlockBelowEphemeralRange(t *testing.T) {
	low := EphemeralLow()
	if low < floor+1000 {
		t.Skipf("the ephemeral range starts at %d: no room below it", low)
	}
	for range 20 {
		p, err := Block(12)
		if err != nil {
			t.Fatal(err)
		}
		if p < floor || p+12 > low {
			t.Fatalf("ports %d-%d: not between %d and the ephemeral range's start %d", p, p+11, floor, low)
		}
		for i := range 12 {
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+i))
			if err != nil {
				t.Fatalf("port %d of the block is not free: %v", p+i, err)
			}
			l.Close()
		}
	}
}

// Parallel tests pick before their servers bind: Block never returns a
// port twice in one process, though each is still free.
func TestBlockNeverTwice(t *testing.T) {
	seen := map[int]bool{}
	for range 200 {
		p, err := Block(3)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			if seen[p+i] {
				t.Fatalf("port %d returned twice", p+i)
			}
			seen[p+i] = true
		}
	}
}
