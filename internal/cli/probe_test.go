package cli

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tenure-dev/tenure/internal/devbroker"
)

// tenure probe: exit 0 and the body on 2xx, exit 1 with one sentence
// otherwise; bad URLs are usage errors.
func TestProbe(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/readyz" {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("not ready: database: gone\n"))
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	}))
	defer srv.Close()
	if code, out, errs := runIn(t, "probe", srv.URL+"/healthz"); code != 0 || out != "ok\n" || errs != "" {
		t.Errorf("healthz: exit %d, %q, %q", code, out, errs)
	}
	code, out, errs := runIn(t, "probe", srv.URL+"/readyz")
	if code != 1 || out != "not ready: database: gone\n" || !strings.Contains(errs, "answered 503 Service Unavailable") {
		t.Errorf("readyz: exit %d, %q, %q", code, out, errs)
	}
	if code, _, errs := runIn(t, "probe", "127.0.0.1:8080/readyz"); code != 2 || !strings.Contains(errs, "is not an http:// or https:// URL") {
		t.Errorf("bad URL: exit %d, %q", code, errs)
	}
	if code, _, errs := runIn(t, "probe", "http://127.0.0.1:1/readyz"); code != 1 || !strings.Contains(errs, "no answer from") {
		t.Errorf("nothing listening: exit %d, %q", code, errs)
	}
}

// topic create --if-not-exists succeeds on a topic that exists with the
// count asked for, and fails on another count.
func TestTopicCreateIfNotExists(t *testing.T) {
	c := startBroker(t, devbroker.Config{})
	args := []string{"admin", "topic", "create", "--brokers", c.ListenAddrs()[0], "--topic", "t", "--partitions", "3", "--if-not-exists"}
	for i, want := range []string{"created topic t with 3 partitions", "topic t exists already with 3 partitions"} {
		if code, out, errs := runIn(t, args...); code != 0 || !strings.Contains(out, want) {
			t.Errorf("run %d: exit %d, %q, %q", i, code, out, errs)
		}
	}
	args[8] = "4"
	if code, _, errs := runIn(t, args...); code != 1 || !strings.Contains(errs, `topic "t" exists with 3 partitions, not 4`) {
		t.Errorf("another count: exit %d, %q", code, errs)
	}
	if code, _, errs := runIn(t, args[:len(args)-1]...); code != 1 || !strings.Contains(errs, "already exists") {
		t.Errorf("without --if-not-exists: exit %d, %q", code, errs)
	}
}
