package netfault

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"
)

// dialTimeout bounds the forwarder's dial to the real service. Dials run in
// the root namespace, on loopback, so they either succeed or are refused at
// once; the bound only guards against a wedged service backlog.
const dialTimeout = 5 * time.Second

// forwarder relays connections accepted inside the namespace to the same
// port on the root namespace's loopback.
type forwarder struct {
	wg    sync.WaitGroup
	mu    sync.Mutex
	lns   []net.Listener
	conns map[net.Conn]struct{}
	done  bool
}

func newForwarder() *forwarder {
	return &forwarder{conns: make(map[net.Conn]struct{})}
}

// serve accepts on ln (a socket inside the namespace) until close.
func (f *forwarder) serve(ln net.Listener, port int) {
	f.mu.Lock()
	f.lns = append(f.lns, ln)
	f.mu.Unlock()
	target := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return // closed by close; Accept on loopback fails for no other reason worth retrying
			}
			if !f.track(c) {
				c.Close()
				return
			}
			f.wg.Add(1)
			go func() {
				defer f.wg.Done()
				f.relay(c, target)
			}()
		}
	}()
}

// relay dials target from an ordinary goroutine (so in the root namespace)
// and copies both ways until both directions end.
func (f *forwarder) relay(in net.Conn, target string) {
	defer f.untrack(in)
	out, err := net.DialTimeout("tcp4", target, dialTimeout)
	if err != nil {
		// The service is down: answer with a RST, which is what the client
		// would get from a closed port (connection refused or reset), not
		// an orderly EOF it might take for a server's close.
		if tc, ok := in.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		in.Close()
		return
	}
	if !f.track(out) {
		out.Close()
		in.Close()
		return
	}
	defer f.untrack(out)
	var wg sync.WaitGroup
	wg.Add(2)
	pipe := func(dst, src net.Conn) {
		defer wg.Done()
		_, err := io.Copy(dst, src)
		if err == nil {
			// Orderly EOF: pass the half-close on, so that a FIN crosses the
			// forwarder as it would cross the network.
			if cw, ok := dst.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
				return
			}
		}
		// A reset or an error on either side ends both.
		dst.Close()
		src.Close()
	}
	go pipe(out, in)
	go pipe(in, out)
	wg.Wait()
	in.Close()
	out.Close()
}

func (f *forwarder) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.done {
		return false
	}
	f.conns[c] = struct{}{}
	return true
}

func (f *forwarder) untrack(c net.Conn) {
	f.mu.Lock()
	delete(f.conns, c)
	f.mu.Unlock()
}

// active is the number of open connections (both sides counted).
func (f *forwarder) active() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.conns)
}

// close stops accepting, closes every connection, and waits (up to timeout)
// for every goroutine to end.
func (f *forwarder) close(timeout time.Duration) error {
	f.mu.Lock()
	f.done = true
	var errs []error
	for _, ln := range f.lns {
		if err := ln.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	ended := make(chan struct{})
	go func() {
		f.wg.Wait()
		close(ended)
	}()
	select {
	case <-ended:
	case <-time.After(timeout):
		errs = append(errs, fmt.Errorf("netfault: forwarder goroutines still running %s after close", timeout))
	}
	return errors.Join(errs...)
}
