// Package pgproxy is a TCP proxy for tests that sits between PostgreSQL
// clients and a server and can break one connection at its COMMIT, so that
// a test can make a commit's outcome unknown to the client on purpose (a
// COMMIT sent by the simple protocol, as pgx's tx.Commit does, or by the
// extended protocol, as in a pipeline or batch):
//
//   - BeforeCommit drops the connection when the client sends COMMIT,
//     without forwarding it: the transaction does not commit.
//   - AfterCommit forwards COMMIT, waits for the server's reply, and drops
//     the connection instead of relaying it: the transaction committed, and
//     the client only sees a broken connection.
//
// HoldMatching holds one client message, on whichever connection sends it,
// until the test releases it: a statement slow in the network, which the
// server runs when it finally arrives, whether or not its client is still
// waiting.
//
// Everything else is relayed unchanged, on as many connections as the
// client opens. SetDown makes the server unreachable through the proxy, as
// in an outage. The proxy reads the client's messages to find a COMMIT (a
// simple-protocol Query whose text is "commit", as pgx sends it); it
// understands unencrypted connections only (sslmode=disable).
package pgproxy

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// Cut says where a connection is broken around its COMMIT.
type Cut int

const (
	// BeforeCommit: the COMMIT never reaches the server.
	BeforeCommit Cut = iota + 1
	// AfterCommit: the server answers the COMMIT; the client never sees
	// the answer.
	AfterCommit
)

func (c Cut) String() string {
	switch c {
	case BeforeCommit:
		return "before commit"
	case AfterCommit:
		return "after commit"
	}
	return fmt.Sprintf("Cut(%d)", int(c))
}

// Report says what happened at a cut.
type Report struct {
	Cut Cut
	// Reply is the server's answer to the COMMIT (AfterCommit only): its
	// command tag ("COMMIT", or "ROLLBACK" for a failed transaction), or
	// "error" if the server sent an ErrorResponse.
	Reply string
}

// Proxy relays connections from its loopback address to a server.
type Proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	closed bool
	down   bool
	conns  map[*conn]struct{}
	armed  map[string]*arm // by client address (the proxied connection's remote end)
	holds  []*Hold
	// dropCancels: CancelRequests are swallowed (see DropCancelRequests).
	dropCancels bool
	// stalled is non-nil while the proxy forwards nothing (Stall); it is
	// closed when forwarding resumes.
	stalled chan struct{}
	wg      sync.WaitGroup
}

// Stall(true) stops forwarding bytes, in both directions and on every
// connection, without closing anything: what a vanished host or a firewall
// that drops packets looks like to the client (its statements get no answer
// and nothing resets the connection; new connections are accepted and then
// hear nothing). Stall(false) forwards what was held and everything after.
func (p *Proxy) Stall(stall bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case stall && p.stalled == nil:
		p.stalled = make(chan struct{})
	case !stall && p.stalled != nil:
		close(p.stalled)
		p.stalled = nil
	}
}

// gate waits while the proxy is stalled.
func (p *Proxy) gate() {
	p.mu.Lock()
	ch := p.stalled
	p.mu.Unlock()
	if ch != nil {
		<-ch
	}
}

// DropCancelRequests makes the proxy swallow the CancelRequests clients send
// (on a connection of their own) when they give up on a statement: a cancel
// is best-effort, and a test of a statement that arrives late must not
// depend on whether it happens to arrive in time.
func (p *Proxy) DropCancelRequests(drop bool) {
	p.mu.Lock()
	p.dropCancels = drop
	p.mu.Unlock()
}

// Hold is a client message held by HoldMatching.
type Hold struct {
	text      string
	held      chan struct{} // closed when a message is held
	release   chan struct{}
	forwarded chan struct{} // closed once the held message was written to the server
	once      sync.Once
	released  sync.Once
}

// Held is closed once a matching message is being held.
func (h *Hold) Held() <-chan struct{} { return h.held }

// Forwarded is closed once the held message has been written to the
// server (after Release).
func (h *Hold) Forwarded() <-chan struct{} { return h.forwarded }

// Release forwards the held message (and lets the messages its client sent
// after it follow), even if the client has closed its end meanwhile.
func (h *Hold) Release() { h.released.Do(func() { close(h.release) }) }

// HoldMatching holds the next client message whose bytes contain text (for
// a simple-protocol Query, its SQL) until Release; the connection's later
// messages wait behind it. Closing the proxy releases it.
func (p *Proxy) HoldMatching(text string) *Hold {
	h := &Hold{text: text, held: make(chan struct{}), release: make(chan struct{}), forwarded: make(chan struct{})}
	p.mu.Lock()
	p.holds = append(p.holds, h)
	p.mu.Unlock()
	return h
}

// takeHold returns and disarms the hold msg matches, if any.
func (p *Proxy) takeHold(msg []byte) *Hold {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, h := range p.holds {
		if strings.Contains(string(msg), h.text) {
			p.holds = append(p.holds[:i], p.holds[i+1:]...)
			return h
		}
	}
	return nil
}

type arm struct {
	cut    Cut
	down   bool        // take the proxy down at the cut
	report chan Report // cap 1
}

// Start listens on a free loopback port and relays to target (host:port).
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[*conn]struct{}{}, armed: map[string]*arm{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// InFront starts a proxy in front of the server that the PostgreSQL URL
// dbURL names, closed when the test ends, and returns it with dbURL
// pointed at it (its host replaced by the proxy's address). Any error
// fails the test.
func InFront(t testing.TB, dbURL string) (*Proxy, *url.URL) {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	p, err := Start(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	u.Host = p.Addr()
	return p, u
}

// Addr is the proxy's address (host:port): point the client there.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Conns is the number of connections being relayed.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// CutCommit arms the connection whose client end has the address client
// (for pgx: tx.Conn().PgConn().Conn().LocalAddr()): its next COMMIT is cut
// as cut says. The channel receives one Report once the cut is made; it
// never receives anything if that connection sends no COMMIT.
func (p *Proxy) CutCommit(client net.Addr, cut Cut) <-chan Report {
	return p.arm(client, &arm{cut: cut})
}

// CutCommitAndGoDown is CutCommit, and at the cut the proxy goes down
// (SetDown(true)) before the client's end is closed: the client cannot
// reach the server to find out what became of its COMMIT until SetDown(false).
func (p *Proxy) CutCommitAndGoDown(client net.Addr, cut Cut) <-chan Report {
	return p.arm(client, &arm{cut: cut, down: true})
}

func (p *Proxy) arm(client net.Addr, a *arm) <-chan Report {
	a.report = make(chan Report, 1)
	p.mu.Lock()
	p.armed[client.String()] = a
	p.mu.Unlock()
	return a.report
}

// SetDown(true) breaks every relayed connection and closes new ones at once,
// like a server that went away; SetDown(false) relays again.
func (p *Proxy) SetDown(down bool) {
	p.mu.Lock()
	p.down = down
	p.mu.Unlock()
	if down {
		p.breakAll()
	}
}

// Close stops accepting, breaks every connection and waits for the relays
// to end.
func (p *Proxy) Close() error {
	err := p.ln.Close()
	p.mu.Lock()
	p.closed = true
	holds := p.holds
	p.holds = nil
	p.mu.Unlock()
	for _, h := range holds {
		h.Release()
	}
	p.Stall(false)
	p.breakAll()
	p.wg.Wait()
	return err
}

func (p *Proxy) breakAll() {
	p.mu.Lock()
	conns := make([]*conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		c.close()
	}
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		if p.isDown() { // do not bother the server
			client.Close()
			continue
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		c := &conn{p: p, client: client, server: server}
		p.mu.Lock()
		closed, down := p.closed, p.down
		if !closed && !down {
			p.conns[c] = struct{}{}
		}
		p.mu.Unlock()
		if closed || down {
			client.Close()
			server.Close()
			if closed {
				return
			}
			continue
		}
		p.wg.Add(2)
		go c.clientToServer()
		go c.serverToClient()
	}
}

func (p *Proxy) isDown() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.down
}

// takeArm returns and disarms the cut armed for c, if any.
func (p *Proxy) takeArm(c *conn) *arm {
	p.mu.Lock()
	defer p.mu.Unlock()
	key := c.client.RemoteAddr().String()
	a := p.armed[key]
	delete(p.armed, key)
	return a
}

// conn is one relayed connection.
type conn struct {
	p              *Proxy
	client, server net.Conn
	once           sync.Once
	// held is set when a COMMIT was forwarded under AfterCommit: from then
	// on, nothing goes back to the client.
	held atomic.Pointer[arm]
	// commitStmts are the names of the statements the client prepared
	// with the text COMMIT (extended protocol); only clientToServer reads
	// and writes it.
	commitStmts map[string]bool
}

func (c *conn) close() {
	c.once.Do(func() {
		c.client.Close()
		c.server.Close()
		c.p.mu.Lock()
		delete(c.p.conns, c)
		c.p.mu.Unlock()
	})
}

// Protocol codes of the untyped messages a client may send before its
// StartupMessage.
const (
	sslRequest    = 80877103
	gssEncRequest = 80877104
	cancelRequest = 80877102
)

// clientToServer relays the client's messages one by one, looking for an
// armed connection's COMMIT.
func (c *conn) clientToServer() {
	defer c.p.wg.Done()
	defer c.close()
	r := bufio.NewReader(c.client)
	for { // untyped: SSLRequest / GSSENCRequest (answered "no"), then StartupMessage or CancelRequest
		msg, err := readMessage(r, false)
		if err != nil {
			return
		}
		if binary.BigEndian.Uint32(msg[4:8]) == cancelRequest {
			c.p.mu.Lock()
			drop := c.p.dropCancels
			c.p.mu.Unlock()
			if drop {
				return
			}
		}
		c.p.gate()
		if write(c.server, msg) != nil {
			return
		}
		if code := binary.BigEndian.Uint32(msg[4:8]); code != sslRequest && code != gssEncRequest {
			break
		}
	}
	for {
		msg, err := readMessage(r, true)
		if err != nil {
			return
		}
		hold := c.p.takeHold(msg)
		if hold != nil {
			hold.once.Do(func() { close(hold.held) })
			<-hold.release // the client may give up meanwhile: the message still goes out
		}
		if c.isCommit(msg) {
			if a := c.p.takeArm(c); a != nil {
				if a.cut == BeforeCommit {
					c.cutDone(a, Report{Cut: BeforeCommit})
					return // closes both ends: the server rolls back
				}
				c.held.Store(a)
			}
		}
		c.p.gate()
		err = write(c.server, msg)
		if hold != nil {
			close(hold.forwarded)
		}
		if err != nil {
			return
		}
	}
}

// serverToClient relays bytes as they come, except after a held COMMIT:
// then it reads the server's reply, reports it, and breaks the connection.
func (c *conn) serverToClient() {
	defer c.p.wg.Done()
	defer c.close()
	buf := make([]byte, 32<<10)
	var reply []byte
	for {
		n, err := c.server.Read(buf)
		if n > 0 {
			if a := c.held.Load(); a != nil {
				reply = append(reply, buf[:n]...)
				if tag, ok := commandTag(reply); ok {
					c.cutDone(a, Report{Cut: AfterCommit, Reply: tag})
					return
				}
			} else {
				c.p.gate()
				if write(c.client, buf[:n]) != nil {
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}

// cutDone finishes a cut: the proxy goes down if armed so, then the report
// goes out; the caller's return closes both ends.
func (c *conn) cutDone(a *arm, r Report) {
	if a.down {
		c.p.SetDown(true)
	}
	a.report <- r
}

func write(w io.Writer, b []byte) error {
	_, err := w.Write(b)
	return err
}

// readMessage reads one frontend message: a type byte (typed only), then an
// int32 length that counts itself, then the body. It returns the message's
// bytes as they arrived.
func readMessage(r *bufio.Reader, typed bool) ([]byte, error) {
	head := 4
	if typed {
		head = 5
	}
	msg := make([]byte, head)
	if _, err := io.ReadFull(r, msg); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint32(msg[head-4:]))
	if n < 4 || n > 1<<30 {
		return nil, fmt.Errorf("pgproxy: bad message length %d", n)
	}
	msg = append(msg, make([]byte, n-4)...)
	if _, err := io.ReadFull(r, msg[head:]); err != nil {
		return nil, err
	}
	if !typed && n < 8 {
		return nil, errors.New("pgproxy: startup message too short")
	}
	return msg, nil
}

// isCommit reports whether msg runs a COMMIT: a Query message ('Q') whose
// text is COMMIT (in any case, with optional blanks and semicolon), or a
// Bind ('B') of a statement the client prepared (Parse, 'P') with that
// text.
func (c *conn) isCommit(msg []byte) bool {
	switch msg[0] {
	case 'Q':
		return isCommitText(strings.TrimRight(string(msg[5:]), "\x00"))
	case 'P': // Parse: statement name, query, ...
		name, rest, _ := strings.Cut(string(msg[5:]), "\x00")
		query, _, _ := strings.Cut(rest, "\x00")
		if c.commitStmts == nil {
			c.commitStmts = map[string]bool{}
		}
		c.commitStmts[name] = isCommitText(query)
	case 'B': // Bind: portal name, statement name, ...
		_, rest, _ := strings.Cut(string(msg[5:]), "\x00")
		stmt, _, _ := strings.Cut(rest, "\x00")
		return c.commitStmts[stmt]
	}
	return false
}

func isCommitText(text string) bool {
	text = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(text), ";"))
	return strings.EqualFold(text, "commit")
}

// commandTag finds the answer to the COMMIT in the server's messages: the
// CommandComplete of COMMIT (or ROLLBACK, for a transaction that had
// failed), or "error" for an ErrorResponse. Other statements' results that
// come first (a pipeline's) are skipped. ok is false while the buffer holds
// no complete answer yet.
func commandTag(b []byte) (tag string, ok bool) {
	for len(b) >= 5 {
		n := int(binary.BigEndian.Uint32(b[1:5]))
		if n < 4 || len(b) < 1+n {
			return "", false
		}
		body := b[5 : 1+n]
		switch b[0] {
		case 'C':
			if t := strings.TrimRight(string(body), "\x00"); t == "COMMIT" || t == "ROLLBACK" {
				return t, true
			}
		case 'E':
			return "error", true
		}
		b = b[1+n:] // another statement's result, a notice, a parameter status: skip it
	}
	return "", false
}
