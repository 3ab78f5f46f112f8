package consumer

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/tenure-dev/tenure/internal/fence"
	"github.com/tenure-dev/tenure/sink"
)

// A server that refuses the probe's connection (too many connections, a
// role's connection limit) has answered: the network path works, and the
// worker's own connections may well be busy with its work. Counting it as
// silence stepped a worker down whose pool had taken the last connection
// slots, and kept it out of the group for good.
func TestProbeCountsARefusalAsAnAnswer(t *testing.T) {
	t.Parallel()
	addr := refusingServer(t, "53300", "sorry, too many clients already")
	c := probeConsumer(t, "postgres://tenure@"+addr+"/db?sslmode=disable&connect_timeout=2")
	if !c.probeOnce(context.Background()) {
		t.Fatal("a server that refused the connection with an error was counted as silent")
	}
}

// A host that never answers is silent, whatever the dial budget.
func TestProbeOfASilentHostFails(t *testing.T) {
	t.Parallel()
	ended := make(chan struct{})
	addr := serveLocal(t, func(conn net.Conn) { <-ended }) // says nothing until the test ends
	t.Cleanup(func() { close(ended) })
	c := probeConsumer(t, "postgres://tenure@"+addr+"/db?sslmode=disable&connect_timeout=1")
	start := time.Now()
	if c.probeOnce(context.Background()) {
		t.Fatal("a host that never answered was counted as an answer")
	}
	if took := time.Since(start); took < time.Second {
		t.Errorf("the probe gave up after %s, before the host's connect_timeout (1s)", took)
	}
}

func TestDialBudgetCoversEveryHost(t *testing.T) {
	t.Parallel()
	cfg, err := pgxpool.ParseConfig("postgres://u@h1:5432,h2:5432,h3:5432/db?connect_timeout=5")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := dialBudget(cfg.ConnConfig, 10*time.Second), 4*5*time.Second+probeTimeout; got != want {
		t.Errorf("dialBudget = %s, want %s (3 hosts, one more, each 5s, and an answer)", got, want)
	}
	one, err := pgxpool.ParseConfig("postgres://u@h1:5432/db")
	if err != nil {
		t.Fatal(err)
	}
	if got := dialBudget(one.ConnConfig, 10*time.Second); got != 10*time.Second {
		t.Errorf("dialBudget without connect_timeout = %s, want the database timeout", got)
	}
}

// probeConsumer is a Consumer whose store's pool is configured for url
// (never connected to: the probe dials its own connection from the
// pool's configuration).
func probeConsumer(t *testing.T, url string) *Consumer {
	t.Helper()
	return &Consumer{store: fence.Of(idleStore(t, url)), log: zap.NewNop(), cfg: Config{DatabaseTimeout: 3 * time.Second}}
}

// idleStore is a store over a pool configured for url that the test never
// connects (pools connect lazily).
func idleStore(t *testing.T, url string) *sink.Store {
	t.Helper()
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := sink.NewStore(pool, "")
	if err != nil {
		t.Fatal(err)
	}
	return store
}

// refusingServer answers every connection's startup message with a FATAL
// ErrorResponse of SQLSTATE code, as a PostgreSQL server whose connection
// slots are taken does.
func refusingServer(t *testing.T, code, msg string) string {
	t.Helper()
	return serveLocal(t, func(conn net.Conn) {
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		var n [4]byte
		if _, err := io.ReadFull(conn, n[:]); err != nil {
			return
		}
		if _, err := io.CopyN(io.Discard, conn, int64(binary.BigEndian.Uint32(n[:]))-4); err != nil {
			return
		}
		var body []byte
		for _, f := range [][2]string{{"S", "FATAL"}, {"V", "FATAL"}, {"C", code}, {"M", msg}} {
			body = append(append(append(body, f[0][0]), f[1]...), 0)
		}
		body = append(body, 0)
		out := append([]byte{'E', 0, 0, 0, 0}, body...)
		binary.BigEndian.PutUint32(out[1:5], uint32(4+len(body)))
		_, _ = conn.Write(out)
	})
}

// serveLocal listens on a loopback port until the test ends and runs serve
// on each connection, on a goroutine of its own, closing the connection
// after it. It returns the address.
func serveLocal(t *testing.T, serve func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				serve(conn)
			}()
		}
	}()
	return ln.Addr().String()
}
