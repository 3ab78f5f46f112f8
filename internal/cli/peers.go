package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kgo"
)

// What answers at an address that should be PostgreSQL or Kafka. pgx and
// kgo say what went wrong in their own protocol's terms ("expected at most
// 1073741822, but got 1414811691"; "invalid large response size
// 1157627904"): true, but not what a user needs, which is that the
// address is something else, an HTTP server, the other of the two, a
// TLS-only port. The watches here see what came back and say that.

// pgPeer watches the connections openDB makes while it proves the
// database answers: which address accepted one, and the first byte each
// sent back. Connections opened after that are not watched (done).
type pgPeer struct {
	done atomic.Bool
	// direct: the URL asks for TLS straight away (sslnegotiation=direct),
	// so the first byte is TLS's, not PostgreSQL's.
	direct bool

	mu       sync.Mutex
	accepted string // an address that accepted a connection
	answered bool   // some connection got a byte back
	foreign  string // an address whose first byte no PostgreSQL server sends
	first    byte   // that byte
}

// pgFirstBytes are the bytes a PostgreSQL server (or a pooler speaking its
// protocol) begins an answer with: to an SSLRequest or GSSENCRequest 'S',
// 'N' or 'G' (or 'E', an error); to a StartupMessage 'R' (authentication),
// 'E' (an error) or 'v' (NegotiateProtocolVersion).
const pgFirstBytes = "SNGREv"

// dial wraps a pgconn dial function so that the connections it makes are
// watched.
func (w *pgPeer) dial(next pgconn.DialFunc) pgconn.DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		if err != nil || w.done.Load() {
			return conn, err
		}
		w.mu.Lock()
		if w.accepted == "" {
			w.accepted = addr
		}
		w.mu.Unlock()
		return &pgPeerConn{Conn: conn, w: w, addr: addr}, nil
	}
}

func (w *pgPeer) firstByte(addr string, b byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.answered = true
	if !w.direct && w.foreign == "" && !strings.ContainsRune(pgFirstBytes, rune(b)) {
		w.foreign, w.first = addr, b
	}
}

// pgPeerConn notes the first byte its peer sends.
type pgPeerConn struct {
	net.Conn
	w    *pgPeer
	addr string
	seen atomic.Bool
}

func (c *pgPeerConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 && c.seen.CompareAndSwap(false, true) {
		c.w.firstByte(c.addr, b[0])
	}
	return n, err
}

// failure words a failed connection by what the watch saw, or returns ""
// when it saw nothing telling: an address that answered something no
// PostgreSQL server sends, or that accepted the connection and then said
// nothing (within bound, or before closing it). timedOut: the attempt
// ended at a deadline.
func (w *pgPeer) failure(timedOut bool, bound time.Duration) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.foreign != "":
		return fmt.Sprintf("%s answered, but not as a PostgreSQL server%s; check the host and port of the database URL", w.foreign, pgForeignHint(w.first))
	case w.accepted == "" || w.answered:
		return ""
	case timedOut:
		return fmt.Sprintf("cannot reach the database at %s: it accepted the connection but sent no answer within %s (is a PostgreSQL server listening there?)", w.accepted, boundText(bound))
	}
	return fmt.Sprintf("cannot reach the database at %s: it accepted the connection and closed it without an answer (is a PostgreSQL server listening there?)", w.accepted)
}

// pgForeignHint says what a first byte suggests is there instead.
func pgForeignHint(b byte) string {
	switch b {
	case 'H':
		return " (its answer begins like an HTTP response)"
	case 0x15, 0x16: // a TLS alert, a TLS handshake
		return " (it answered in TLS: a TLS-only port)"
	}
	return ""
}

// boundText is a bound for a sentence: whole seconds as "10s", a bound
// derived from a deadline to a tenth of a second.
func boundText(d time.Duration) string {
	if d >= time.Second {
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Millisecond).String()
}

// kafkaPeerWatch watches the connections of a CLI client for addresses
// that answer, but not in Kafka's protocol, and keeps the sentence that
// names them (env.notKafka): a command that fails with such an answer in
// kgo's words says that instead. Once every seed broker has answered so
// (the client can reach nothing else), the sentence replaces whatever the
// command says (env.kafkaFailure), and the watch ends the client's
// requests (ErrClientClosed): kgo would retry some of these answers until
// the command's timeout.
type kafkaPeerWatch struct {
	e       *env
	brokers []string
	cancel  context.CancelFunc

	mu  sync.Mutex
	bad map[string]string // address → what answered there
	ord []string
}

func (w *kafkaPeerWatch) OnBrokerConnect(meta kgo.BrokerMetadata, _ time.Duration, conn net.Conn, err error) {
	if conn == nil || err == nil {
		return
	}
	what := notKafka(err)
	if what == "" {
		return
	}
	addr := net.JoinHostPort(meta.Host, strconv.Itoa(int(meta.Port)))
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.bad == nil {
		w.bad = map[string]string{}
	}
	if _, ok := w.bad[addr]; !ok {
		w.bad[addr] = addr + " " + what
		w.ord = append(w.ord, addr)
	}
	var said []string
	for _, a := range w.ord {
		said = append(said, w.bad[a])
	}
	msg := strings.Join(said, "; ") + "; check --brokers"
	w.e.notKafka.Store(&msg)
	if len(w.bad) >= len(w.brokers) {
		w.e.setKafkaFailure(msg)
		w.cancel()
	}
}

// notKafka says what the error of a connection's first exchange (ApiVersions,
// or SASL) shows about a peer that is not a Kafka broker ("answered, but not
// as a Kafka broker"), or "" when it shows nothing of the kind. A Kafka
// broker's answer to ApiVersions is a few hundred bytes with the request's
// correlation ID; kgo's sentences for anything else are matched here by
// their text, as kgo exports no type for them.
func notKafka(err error) string {
	msg := err.Error()
	const large = "invalid large response size "
	switch {
	case strings.Contains(msg, large):
		if strings.Contains(msg, "tls alert") {
			return "answered in TLS, not in Kafka's plaintext protocol (if it is a broker's TLS listener, give --tls, and --tls-ca-file unless the system's roots sign its certificate)"
		}
		hint := ""
		var size int64
		_, serr := fmt.Sscanf(msg[strings.Index(msg, large)+len(large):], "%d", &size)
		switch {
		case strings.Contains(msg, "'HTTP'"):
			hint = " (its answer begins like an HTTP response)"
		case serr == nil && size>>24 == 'E' && size&0x00ffff00 == 0:
			// 'E' and a short length: PostgreSQL's ErrorResponse to a
			// request it reads as a startup packet of an unknown protocol.
			hint = " (its answer is a PostgreSQL server's)"
		}
		return "answered, but not as a Kafka broker" + hint
	case strings.Contains(msg, "invalid negative response size"),
		strings.Contains(msg, "correlation ID mismatch"),
		// Matched by text too: the commands' errors carry kgo's as text.
		errors.Is(err, kbin.ErrNotEnoughData), strings.Contains(msg, kbin.ErrNotEnoughData.Error()):
		return "answered, but not as a Kafka broker"
	}
	return ""
}
