package sink_test

import (
	"context"
	"errors"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sys/unix"

	"github.com/tenure-dev/tenure/internal/testinfra/testdb"
	"github.com/tenure-dev/tenure/sink"
)

// The connections SetNetworkTimeouts dials carry the kernel's bounds: a
// peer that stops answering fails them within TCPUserTimeout, not after
// TCP's retransmissions run out (about fifteen minutes).
func TestSetNetworkTimeouts(t *testing.T) {
	t.Parallel()
	if runtime.GOOS != "linux" {
		t.Skip("TCP_USER_TIMEOUT is Linux's")
	}
	conn := connectWithTimeouts(t, testdb.URL())
	tcp, ok := conn.PgConn().Conn().(*net.TCPConn)
	if !ok {
		t.Skipf("the test database is not reached over TCP (%T)", conn.PgConn().Conn())
	}
	raw, err := tcp.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var user, keep, idle int
	var gerr error
	if err := raw.Control(func(fd uintptr) {
		user, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT)
		if gerr == nil {
			keep, gerr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_KEEPALIVE)
		}
		if gerr == nil {
			idle, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_KEEPIDLE)
		}
	}); err != nil || gerr != nil {
		t.Fatal(errors.Join(err, gerr))
	}
	if user != int(sink.TCPUserTimeout.Milliseconds()) || keep != 1 || idle != int(sink.KeepAliveIdle.Seconds()) {
		t.Errorf("TCP_USER_TIMEOUT %dms, SO_KEEPALIVE %d, TCP_KEEPIDLE %ds; want %s, 1, %s", user, keep, idle, sink.TCPUserTimeout, sink.KeepAliveIdle)
	}
}

// The server's side of each session gets the same bounds (a worker that
// vanished leaves sessions the server would otherwise keep for its default
// two hours of keepalive idle), except a setting the URL names itself.
func TestSetNetworkTimeoutsOnTheServer(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, param string
		want        map[string]string // pg_settings.setting, in the setting's unit
	}{
		{"defaults", "", map[string]string{"tcp_keepalives_idle": "5", "tcp_keepalives_interval": "2", "tcp_keepalives_count": "3", "tcp_user_timeout": "10000"}},
		{"the URL's own", "tcp_keepalives_idle=7", map[string]string{"tcp_keepalives_idle": "7", "tcp_keepalives_interval": "2", "tcp_keepalives_count": "3", "tcp_user_timeout": "10000"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			url := testdb.URL()
			if c.param != "" {
				sep := "?"
				if strings.Contains(url, "?") {
					sep = "&"
				}
				url += sep + c.param
			}
			conn := connectWithTimeouts(t, url)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, ok := conn.PgConn().Conn().(*net.TCPConn); !ok {
				t.Skipf("the test database is not reached over TCP (%T): the server ignores these", conn.PgConn().Conn())
			}
			got := map[string]string{}
			rows, err := conn.Query(ctx, `SELECT name, setting FROM pg_settings WHERE name LIKE 'tcp_%'`)
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var name, setting string
				if err := rows.Scan(&name, &setting); err != nil {
					t.Fatal(err)
				}
				got[name] = setting
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			for name, want := range c.want {
				if got[name] != want {
					t.Errorf("%s = %q on the server, want %q", name, got[name], want)
				}
			}
		})
	}
}

// connectWithTimeouts connects to url as SetNetworkTimeouts configures a
// connection; it is closed when the test ends.
func connectWithTimeouts(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	sink.SetNetworkTimeouts(&cfg.Config)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	})
	return conn
}
