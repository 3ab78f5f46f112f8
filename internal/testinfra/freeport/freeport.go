// Package freeport picks loopback ports for the servers tests start as
// child processes (PostgreSQL, pg_auto_failover, SeaweedFS), which bind them
// some time after they were picked.
//
// A port asked of the kernel (":0") comes from its ephemeral range, the
// same range every outgoing connection's local end is taken from: in the
// seconds before the server binds it, one of the many connections a test
// makes can take it, and the server fails with "address already in use"
// (a SeaweedFS start failed so in CI). Ports below that range are never
// given out that way, so Block picks there and checks that each is free.
// Closed is the other need: an address nothing listens on.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

const floor = 10000 // below: well-known and registered services' habits

// given holds every port Block has returned in this process: parallel
// tests pick before their servers bind, so "free when checked" alone would
// hand two of them the same port (two PgBouncers did, and one test's
// worker reached the other test's database).
var given struct {
	sync.Mutex
	ports map[int]bool
}

// Block returns the first of n consecutive loopback ports, each free when
// checked and none returned before in this process, below the kernel's
// ephemeral range. Another process can still bind one before the caller's
// server does; callers whose server reports that may pick again.
func Block(n int) (int, error) {
	given.Lock()
	defer given.Unlock()
	if given.ports == nil {
		given.ports = map[int]bool{}
	}
	lo, hi := floor, EphemeralLow()-n
	if hi-lo < 1000 {
		// An unusual ephemeral range leaves no room below it: any port.
		lo, hi = floor, 65535-n
	}
	for range 50 {
		base := lo + rand.IntN(hi-lo)
		if !taken(base, n) && free(base, n) {
			for i := range n {
				given.ports[base+i] = true
			}
			return base, nil
		}
	}
	return 0, fmt.Errorf("no %d consecutive free loopback ports found between %d and %d", n, lo, hi+n)
}

func taken(base, n int) bool {
	for i := range n {
		if given.ports[base+i] {
			return true
		}
	}
	return false
}

func free(base, n int) bool {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for i := range n {
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(base+i))
		if err != nil {
			return false
		}
		ls = append(ls, l)
	}
	return true
}

// Closed returns a loopback address nothing listens on: a port the kernel
// gave and took back at once, for tests of what a client says when it is
// refused. Any error fails the test.
func Closed(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// EphemeralLow is the first port of the kernel's ephemeral range (32768,
// Linux's default, when it cannot be read).
func EphemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	lo, err := strconv.Atoi(f[0])
	if err != nil {
		return 32768
	}
	return lo
}
