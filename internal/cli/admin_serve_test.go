package cli

import (
	"strings"
	"testing"
)

// --http-addr is a loopback address unless --listen-any; --listen-any is
// never read from the environment.
func TestServeAddress(t *testing.T) {
	for _, c := range []struct {
		addr string
		any  bool
		want string // "" ok, else a part of the usage error
	}{
		{"127.0.0.1:8080", false, ""},
		{"127.0.0.5:0", false, ""},
		{"[::1]:8080", false, ""},
		{"localhost:8080", false, ""},
		{":8080", false, "an empty host listens on every interface"},
		{"0.0.0.0:8080", false, `"0.0.0.0" is not a loopback address`},
		{"192.168.1.4:8080", false, "unless --listen-any is given"},
		{"tenure.internal:8080", false, "is not a loopback address"},
		{":8080", true, ""},
		{"0.0.0.0:8080", true, ""},
		{"127.0.0.1", false, "is not HOST:PORT"},
		{"127.0.0.1:99999", false, "from 0 to 65535"},
	} {
		err := checkServeAddr(c.addr, c.any)
		if (err == nil) != (c.want == "") || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("checkServeAddr(%q, %v) = %v, want %q", c.addr, c.any, err, c.want)
		}
	}
	args := []string{"admin", "serve", "--brokers", "127.0.0.1:1", "--database-url", "postgres://u:pw-77ad31@127.0.0.1:1/x", "--http-addr", "0.0.0.0:8080"}
	code, _, stderr := runInEnv(t, map[string]string{"TENURE_LISTEN_ANY": "true"}, args...)
	if code != 2 || !strings.Contains(stderr, "not a loopback address") || strings.Contains(stderr, "pw-77ad31") {
		t.Errorf("TENURE_LISTEN_ANY armed --listen-any: exit %d, %q", code, stderr)
	}
	for _, bad := range [][]string{{"--refresh", "10ms"}, {"--log-entries", "0"}, {"--handoff-window", "0s"}, {"--group", "a\x01"}} {
		code, _, stderr := runIn(t, append(args[:len(args)-1:len(args)-1], append([]string{"127.0.0.1:0"}, bad...)...)...)
		if code != 2 {
			t.Errorf("%v: exit %d, %q", bad, code, stderr)
		}
	}
}
