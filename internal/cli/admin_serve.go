package cli

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/tenure-dev/tenure/internal/ownership"
)

// serveSpec is `tenure admin serve`.
var serveSpec = spec{name: "serve", short: "serve a live ownership page (and its JSON): per partition, the coordinator's owner beside Postgres's, lag, holds, recent claims, dead letters",
	long: "Read-only. Binds to a loopback address unless --listen-any is given: the page has no authentication. " +
		"/ is the page (it refreshes itself), /api/ownership the same data as JSON."}

// serveCmd is `tenure admin serve`: internal/ownership's page on
// --http-addr until a signal stops it.
type serveCmd struct {
	admin
	group       string
	addr        string
	listenAny   bool
	logEntries  int
	deadLetters int
	refresh     time.Duration
	handoff     time.Duration
}

func (c *serveCmd) define(f *flagSet) {
	// It runs until stopped: each refresh bounds its own round trips.
	c.ownTimeouts = true
	c.withDB(f)
	c.withKafka(f, "Kafka seed brokers: the group coordinator's side of each partition", required)
	f.String(&c.group, "group", "", "only this consumer group (default: every group with fencing rows in --schema)", arg("G"))
	f.String(&c.addr, "http-addr", "127.0.0.1:8080", "where to serve the page: a loopback address (127.0.0.0/8, ::1, localhost) unless --listen-any; port 0 picks a free one", arg("HOST:PORT"))
	f.Bool(&c.listenAny, "listen-any", false, "allow a non-loopback --http-addr (\":8080\" is every interface): the page has no authentication, and shows member ids, hosts and handler errors to whoever reaches it", noEnv)
	f.Int(&c.logEntries, "log-entries", ownership.DefaultLogEntries, "recent claims shown per group, from the fence log")
	f.Int(&c.deadLetters, "dead-letters", ownership.DefaultDeadLetters, "newest dead letters shown per group")
	f.Duration(&c.refresh, "refresh", 2*time.Second, "how often the page re-reads its data")
	f.Duration(&c.handoff, "handoff-window", ownership.DefaultHandoffWindow, "a partition whose owner changed within this is highlighted as a hand-off")
}

func (c *serveCmd) check([]string) error {
	if err := optionalGroup(c.group); err != nil {
		return err
	}
	if err := checkServeAddr(c.addr, c.listenAny); err != nil {
		return err
	}
	if c.logEntries < 1 || c.logEntries > 1000 || c.deadLetters < 1 || c.deadLetters > 1000 {
		return usagef("--log-entries and --dead-letters must be from 1 to 1000")
	}
	if c.refresh < 500*time.Millisecond || c.refresh > time.Minute {
		return usagef("--refresh must be from 500ms to 1m, got %s", c.refresh)
	}
	if c.handoff < time.Second || c.handoff > 24*time.Hour {
		return usagef("--handoff-window must be from 1s to 24h, got %s", c.handoff)
	}
	return nil
}

// checkServeAddr is the rule for --http-addr: HOST:PORT, and unless
// listenAny the host is localhost or a loopback address. An empty host
// (":8080") means every interface, so it needs --listen-any too.
func checkServeAddr(addr string, listenAny bool) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return usagef("--http-addr %q is not HOST:PORT", addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return usagef("--http-addr %q: the port must be a number from 0 to 65535", addr)
	}
	if listenAny || ownership.LoopbackHost(host) {
		return nil
	}
	what := fmt.Sprintf("%q is not a loopback address", host)
	if host == "" {
		what = "an empty host listens on every interface"
	}
	return usagef("--http-addr %s: %s; the page has no authentication, so it is served on loopback (127.0.0.1, ::1, localhost) unless --listen-any is given", addr, what)
}

func (c *serveCmd) run(ctx context.Context) error {
	store, err := c.Store()
	if err != nil {
		return err
	}
	cl, err := c.client()
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", c.addr)
	if err != nil {
		return fmt.Errorf("--http-addr %s: %v", c.addr, err)
	}
	// localhost resolved to something else than loopback: refused all the
	// same.
	if ip := ln.Addr().(*net.TCPAddr).IP; !c.listenAny && !ip.IsLoopback() {
		ln.Close()
		return usagef("--http-addr %s resolved to %s, which is not a loopback address; give one (127.0.0.1) or --listen-any", c.addr, ip)
	}
	page := ownership.NewServer(ownership.Config{
		Store: store, Client: cl, Group: c.group,
		Brokers: c.brokers(), KafkaArgs: c.kafka.args(),
		LogEntries: c.logEntries, DeadLetters: c.deadLetters, HandoffWindow: c.handoff,
		Redact: c.secrets.redact,
	}, ownership.ServerConfig{Refresh: c.refresh, Timeout: adminTimeout, LoopbackOnly: !c.listenAny})
	srv := &http.Server{Handler: page, ReadHeaderTimeout: 5 * time.Second, WriteTimeout: adminTimeout + 15*time.Second,
		ErrorLog: log.New(c.secrets.writer(c.stderr), "tenure admin serve: ", 0)}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	url := "http://" + ln.Addr().String() + "/"
	fmt.Fprintf(c.stdout, "serving the ownership page at %s (JSON: %sapi/ownership), read-only; Ctrl-C stops\n", url, url)
	if c.listenAny && !ln.Addr().(*net.TCPAddr).IP.IsLoopback() {
		fmt.Fprintf(c.stderr, "tenure admin serve: --listen-any: the page, which has no authentication, is served on %s\n", ln.Addr())
	}
	select {
	case err := <-served:
		return fmt.Errorf("serving %s: %v", url, err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("stopping the page's server: %v", err)
	}
	return nil
}
