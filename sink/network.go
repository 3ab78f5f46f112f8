package sink

import (
	"context"
	"fmt"
	"net"
	"strings"
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
	// affected when the request fits in the socket buffers (it was
	// acknowledged at once). A larger one is: a COPY of megabytes that
	// waits for a lock stops being read once the buffers fill, and the
	// kernel aborts the connection after this long (the peer's zero
	// window counts as unacknowledged), before the transaction's
	// lock_timeout. Measured on loopback: a 300,000-row COPY behind a
	// lock held 14 s failed after 10.6 s ("connection timed out"); the
	// same COPY behind 5 s, or 1,000 rows behind 14 s, went through.
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
//
// It also asks the server for the same bounds on its side of each session
// (serverTimeouts), after cfg's own AfterConnect if it has one.
func SetNetworkTimeouts(cfg *pgconn.Config) {
	d := &net.Dialer{
		Timeout: cfg.ConnectTimeout,
		KeepAliveConfig: net.KeepAliveConfig{
			Enable: true, Idle: KeepAliveIdle, Interval: KeepAliveInterval, Count: KeepAliveCount,
		},
		Control: setUserTimeout(TCPUserTimeout),
	}
	cfg.DialFunc = d.DialContext
	set := serverTimeouts(cfg.RuntimeParams)
	if set == "" {
		return
	}
	after := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, conn *pgconn.PgConn) error {
		if after != nil {
			if err := after(ctx, conn); err != nil {
				return err
			}
		}
		if err := conn.Exec(ctx, set).Close(); err != nil {
			return fmt.Errorf("setting the session's TCP keepalives: %w", err)
		}
		return nil
	}
}

// serverTimeouts is the statement that gives the server's side of a session
// the bounds above. The server has the same problem in reverse: a worker
// that vanished, or that gave a connection up while its packets were
// dropped (its reset dropped with them), leaves a session the server
// believes alive. An idle session has nothing to send, so only a keepalive
// finds out, and the server's default (tcp_keepalives_idle 0: the OS's two
// hours) kept such sessions that long after the network healed: idle, no
// transaction, no locks, but each a backend and a connection slot, and a
// worker leaves one per pooled connection at every cut, until
// max_connections refuses everyone. These are per-session settings any
// role may SET (PostgreSQL 12 or later, as tenure needs anyway); on a Unix
// socket the server ignores them, and through PgBouncer they apply to the
// pooler's server connections, which is harmless. A setting the database
// URL names itself (a startup parameter) is left alone.
func serverTimeouts(params map[string]string) string {
	var set []string
	for _, p := range []struct {
		name  string
		value int64 // in the setting's unit: seconds, a count, milliseconds
	}{
		{"tcp_keepalives_idle", int64(KeepAliveIdle / time.Second)},
		{"tcp_keepalives_interval", int64(KeepAliveInterval / time.Second)},
		{"tcp_keepalives_count", KeepAliveCount},
		{"tcp_user_timeout", TCPUserTimeout.Milliseconds()},
	} {
		if _, ok := params[p.name]; !ok {
			set = append(set, fmt.Sprintf("SET %s = %d", p.name, p.value))
		}
	}
	return strings.Join(set, "; ")
}
