package cli

import (
	"context"
	"io"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/tenure-dev/tenure/internal/devbroker"
	"github.com/tenure-dev/tenure/internal/testinfra/freeport"
	"github.com/tenure-dev/tenure/internal/testinfra/testdb"
)

// peerMode is how a fakePeer answers a connection.
type peerMode int

const (
	peerHTTP   peerMode = iota // reads what comes, answers an HTTP 400 and closes, as web servers do with bytes that are no request
	peerSilent                 // accepts and never answers
	peerClose                  // accepts and closes at once
	peerTLS                    // reads what comes, answers a TLS alert and closes, as a TLS-only port does with bytes that are no ClientHello
)

// fakePeer listens on a loopback port and answers every connection as
// mode says, until the test ends; it returns the address.
func fakePeer(t *testing.T, mode peerMode) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var conns []net.Conn
	t.Cleanup(func() {
		l.Close()
		<-done
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			switch mode {
			case peerClose:
				c.Close()
			case peerSilent:
				conns = append(conns, c) // closed when the test ends
			case peerHTTP, peerTLS:
				answer := "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: 11\r\n\r\nBad Request"
				if mode == peerTLS {
					answer = "\x15\x03\x03\x00\x02\x02\x28" // alert record, TLS 1.2, fatal handshake_failure
				}
				go func() {
					defer c.Close()
					_ = c.SetDeadline(time.Now().Add(10 * time.Second))
					if _, err := c.Read(make([]byte, 4096)); err != nil {
						return
					}
					_, _ = io.WriteString(c, answer)
				}()
			}
		}
	}()
	return l.Addr().String()
}

// postgresAddr is the host:port of the test database.
func postgresAddr(t *testing.T) string {
	t.Helper()
	u, err := url.Parse(testdb.URL())
	if err != nil || u.Host == "" {
		t.Skipf("TENURE_TEST_DATABASE_URL is not a URL with a host: %v", err)
	}
	return u.Host
}

// A database URL that reaches something else says what answered there, and
// the bound in the message is the one in force.
func TestDatabaseThatIsNotPostgres(t *testing.T) {
	httpAddr, silent, closing, tlsOnly := fakePeer(t, peerHTTP), fakePeer(t, peerSilent), fakePeer(t, peerClose), fakePeer(t, peerTLS)
	broker := startBroker(t, devbroker.Config{})
	kafka := broker.ListenAddrs()[0]
	for _, c := range []struct {
		name, url string
		want      []string
		within    time.Duration
	}{
		{"http server", "postgres://u@" + httpAddr + "/db?sslmode=disable",
			[]string{httpAddr + " answered, but not as a PostgreSQL server (its answer begins like an HTTP response); check the host and port of the database URL"}, 5 * time.Second},
		{"http server, TLS preferred", "postgres://u@" + httpAddr + "/db",
			[]string{httpAddr + " answered, but not as a PostgreSQL server (its answer begins like an HTTP response)"}, 5 * time.Second},
		// A Kafka broker takes the first four bytes for a request's size,
		// one more than it gets, and waits for the rest.
		{"kafka broker", "postgres://u@" + kafka + "/db?sslmode=disable&connect_timeout=2",
			[]string{"cannot reach the database at " + kafka + ": it accepted the connection but sent no answer within 2s (is a PostgreSQL server listening there?)"}, 5 * time.Second},
		{"kafka broker, TLS preferred", "postgres://u@" + kafka + "/db?connect_timeout=2",
			[]string{"cannot reach the database at " + kafka + ": it accepted the connection but sent no answer within 2s (is a PostgreSQL server listening there?)"}, 5 * time.Second},
		{"silent, connect_timeout=3", "postgres://u@" + silent + "/db?connect_timeout=3",
			[]string{"cannot reach the database at " + silent + ": it accepted the connection but sent no answer within 3s"}, 6 * time.Second},
		{"TLS-only port", "postgres://u@" + tlsOnly + "/db",
			[]string{tlsOnly + " answered, but not as a PostgreSQL server (it answered in TLS: a TLS-only port)"}, 5 * time.Second},
		{"closes at once", "postgres://u@" + closing + "/db?sslmode=disable",
			[]string{"cannot reach the database at " + closing + ": it accepted the connection and closed it without an answer (is a PostgreSQL server listening there?)"}, 5 * time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			start := time.Now()
			code, stdout, stderr := runIn(t, "admin", "fences", "--database-url", c.url)
			if stdout != "" {
				t.Errorf("stdout %q", stdout)
			}
			wantSentence(t, c.name, code, 1, stderr, c.want...)
			if d := time.Since(start); d > c.within {
				t.Errorf("took %s, want under %s", d, c.within)
			}
		})
	}
	// The command's own deadline, when it comes before the URL's bound.
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	_, err := openDB(ctx, "postgres://u@"+silent+"/db?connect_timeout=10")
	if err == nil || !strings.Contains(err.Error(), "sent no answer within 1.5s") {
		t.Errorf("deadline 1.5s, connect_timeout 10s: %v", err)
	}
	// Nothing listening: the dialer's own words, as before.
	code, _, stderr := runIn(t, "admin", "fences", "--database-url", "postgres://u@"+freeport.Closed(t)+"/db")
	wantSentence(t, "closed port", code, 1, stderr, "cannot reach the database at 127.0.0.1:", "connection refused")
	// The real one still connects.
	if code, _, stderr := runIn(t, "admin", "fences", "--database-url", testdb.URL(), "--schema", testdb.Schema(t, testdb.Pool(t))); code != 0 {
		t.Errorf("the test database: exit %d, %s", code, stderr)
	}
}

// --brokers that reach something else say what answered there, at once,
// in every kind of command; a bad seed among good ones is passed over.
func TestBrokersThatAreNotKafka(t *testing.T) {
	httpAddr, tlsOnly, pg := fakePeer(t, peerHTTP), fakePeer(t, peerTLS), postgresAddr(t)
	notKafka := func(addr string) string { return addr + " answered, but not as a Kafka broker" }
	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"groups, postgres", []string{"admin", "groups", "--brokers", pg}, []string{notKafka(pg) + " (its answer is a PostgreSQL server's); check --brokers"}},
		{"groups, http", []string{"admin", "groups", "--brokers", httpAddr}, []string{notKafka(httpAddr) + " (its answer begins like an HTTP response); check --brokers"}},
		{"groups, TLS-only port", []string{"admin", "groups", "--brokers", tlsOnly}, []string{tlsOnly + " answered in TLS, not in Kafka's plaintext protocol (if it is a broker's TLS listener, give --tls"}},
		// kgo gives up at the first: it is named.
		{"groups, both", []string{"admin", "groups", "--brokers", httpAddr + "," + pg}, []string{" answered, but not as a Kafka broker", "; check --brokers"}},
		{"topic describe, postgres", []string{"admin", "topic", "describe", "--brokers", pg, "--topic", "t"}, []string{notKafka(pg)}},
		{"produce, postgres", []string{"produce", "--brokers", pg, "--topic", "t", "--key", "k", "--value", "v"}, []string{notKafka(pg)}},
		{"jobs peek, http", []string{"admin", "jobs", "peek", "--brokers", httpAddr, "--topic", "t"}, []string{notKafka(httpAddr)}},
		// Not a refusal of the credentials: there is no broker to refuse them.
		{"groups with SASL, postgres", []string{"admin", "groups", "--brokers", pg, "--sasl-mechanism", "plain", "--sasl-username", "u"}, []string{notKafka(pg)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			start := time.Now()
			code, stdout, stderr := runInEnv(t, map[string]string{"TENURE_SASL_PASSWORD": "pw"}, c.args...)
			if stdout != "" {
				t.Errorf("stdout %q", stdout)
			}
			var lines []string
			for _, l := range strings.SplitAfter(stderr, "\n") {
				if l != "" && !strings.HasPrefix(l, "tenure: warning: ") {
					lines = append(lines, l)
				}
			}
			wantSentence(t, c.name, code, 1, strings.Join(lines, ""), c.want...)
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("took %s", d)
			}
		})
	}
	// A bad seed among good ones: whether kgo goes on with the good one
	// depends on which it asks first; if it fails, the bad one is named.
	broker := startBroker(t, devbroker.Config{})
	for _, seeds := range []string{httpAddr + "," + broker.ListenAddrs()[0], broker.ListenAddrs()[0] + "," + httpAddr} {
		code, _, stderr := runIn(t, "admin", "groups", "--brokers", seeds)
		if code != 0 {
			wantSentence(t, "--brokers "+seeds, code, 1, stderr, notKafka(httpAddr)+" (its answer begins like an HTTP response); check --brokers")
		}
	}
}

// Brokers that accept and never answer: the bound named is the one that
// ended the wait, here the 10s deadline runIn gives a command, not the 15s
// of checkTopics.
func TestSilentBrokersNameTheBoundInForce(t *testing.T) {
	t.Parallel()
	silent := fakePeer(t, peerSilent)
	start := time.Now()
	code, _, stderr := runIn(t, "produce", "--brokers", silent, "--topic", "t", "--key", "k", "--value", "v")
	wantSentence(t, "produce, silent brokers", code, 1, stderr, "cannot reach the Kafka brokers "+silent+": no answer within 10s")
	if d := time.Since(start); d > 12*time.Second {
		t.Errorf("took %s", d)
	}
}
