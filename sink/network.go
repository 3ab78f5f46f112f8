package sink

import (
	"net"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// A database host that vanishes, or a firewall that starts dropping a
// connection's packets, resets nothing: a statement waits for an answer
// that never comes, and TCP keeps retransmitting for about fifteen minutes
// (tcp_retries2) before it gives up. Every wait of a worker has a bound of
// its own (docs/fencing.md, "A network that drops"): statements and commits
// their context deadlines, which pgx enforces by closing the socket; the
// rest is the kernel's, set here.
const (
	// TCPUserTimeout is how long data sent on a database connection may
	// stay unacknowledged before the kernel aborts the connection
	// (TCP_USER_TIMEOUT, Linux): a request or its answer dropped by the
	// network fails the statement within it instead of after TCP's
	// retransmissions run out. An answer that takes long to compute is not
	// affected: the request itself was acknowledged at once.
	TCPUserTimeout = 10 * time.Second
	// Keepalive probes find a pooled connection whose peer vanished while
	// it was idle: the first after KeepAliveIdle without traffic, then
	// every KeepAliveInterval, KeepAliveCount of them (bounded by
	// TCPUserTimeout too).
	KeepAliveIdle     = 5 * time.Second
	KeepAliveInterval = 2 * time.Second
	KeepAliveCount    = 3
)

// SetNetworkTimeouts makes the connections cfg opens give up on a peer that
// stopped answering within the bounds above, instead of hanging until TCP
// does: TCP keepalives and, on Linux, TCP_USER_TIMEOUT. It keeps cfg's
// connect timeout (connect_timeout in the URL, or ConnectTimeout). Call it
// on the pool's ConnConfig before the pool opens connections; `tenure`
// does it for every command.
func SetNetworkTimeouts(cfg *pgconn.Config) {
	d := &net.Dialer{
		Timeout: cfg.ConnectTimeout,
		KeepAliveConfig: net.KeepAliveConfig{
			Enable: true, Idle: KeepAliveIdle, Interval: KeepAliveInterval, Count: KeepAliveCount,
		},
		Control: setUserTimeout(TCPUserTimeout),
	}
	cfg.DialFunc = d.DialContext
}
