package integration

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/tenure-dev/tenure/internal/devbroker"
	"github.com/tenure-dev/tenure/internal/testinfra/testcert"
	"github.com/tenure-dev/tenure/internal/testinfra/testdb"
)

// The secrets of the tests below: none may appear in any output.
const (
	saslPassword = "sasl-pw-7f3c9e1b"
	dbPassword   = "db-pw-2b8d4a6c"
)

// newSecureEnv is newEnv against a broker that requires TLS (a test CA)
// and SASL SCRAM-SHA-512, with a database URL that carries a password
// (the local server trusts loopback connections, so it is not checked,
// only carried). It returns the env and the worker flags that connect.
func newSecureEnv(t *testing.T, partitions int32) (*env, []string) {
	t.Helper()
	if os.Getenv("TENURE_TEST_BROKERS") != "" {
		t.Skip("needs kfake with SASL and TLS")
	}
	ca := testcert.MustCA(t, "kafka")
	srv := ca.MustServer(t, "broker", "127.0.0.1", "localhost")
	br := startBroker(t, devbroker.Config{Extra: []kfake.Opt{kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-512", "tenure-worker", saslPassword),
		kfake.TLS(&tls.Config{Certificates: []tls.Certificate{srv.TLS}})}})
	e := &env{t: t, brokers: br.ListenAddrs(), cluster: br}
	e.pool = testdb.Pool(t)
	e.schema = testdb.Schema(t, e.pool)
	e.dbURL = strings.Replace(testdb.URL(), "postgres://postgres@", "postgres://postgres:"+dbPassword+"@", 1)
	if e.dbURL == testdb.URL() {
		t.Skip("TENURE_TEST_DATABASE_URL is not the default shape; this test puts a password into it")
	}
	e.createTopic(partitions, kgo.DialTLSConfig(&tls.Config{RootCAs: ca.Pool()}),
		kgo.SASL(scram.Auth{User: "tenure-worker", Pass: saslPassword}.AsSha512Mechanism()))
	pw := filepath.Join(t.TempDir(), "sasl-password")
	if err := os.WriteFile(pw, []byte(saslPassword+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return e, []string{"--tls-ca-file", ca.File, "--sasl-mechanism", "scram-sha-512", "--sasl-username", "tenure-worker", "--sasl-password-file", pw}
}

// runTenure runs the binary with extra environment variables and returns
// its exit status and combined output.
func runTenure(t *testing.T, env []string, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, tenureBin, args...)
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("running tenure %v: %v", args, err)
	}
	return code, out.String()
}

// A worker reaches a broker that requires TLS and SASL SCRAM-SHA-512 and
// processes every job; `tenure admin assignments` and `tenure produce`
// reach it with the password in TENURE_SASL_PASSWORD; a worker with a
// wrong password stops at once with one sentence. No password (Kafka's or
// the database URL's) is in any log line (kgo's debug logs included), any
// output or any --help.
func TestWorkerOverSASLAndTLS(t *testing.T) {
	t.Parallel()
	e, secure := newSecureEnv(t, 2)
	e.produce(jobsFor(keys, 0, 30)...)
	w := e.startWorker("S", append(secure, "--http-addr", "127.0.0.1:0")...)
	for p := int32(0); p < 2; p++ {
		waitCommitted(t, e, p, e.highWatermark(p), "")
	}
	var outputs []string
	flagArgs := secure[:6] // the CA, the mechanism and the user; the password from the environment
	pwEnv := []string{"TENURE_SASL_PASSWORD=" + saslPassword, "TENURE_DATABASE_URL=" + e.dbURL}
	code, out := runTenure(t, pwEnv, append([]string{"admin", "assignments", "--brokers", strings.Join(e.brokers, ","),
		"--group", e.group, "--schema", e.schema}, flagArgs...)...)
	outputs = append(outputs, out)
	if code != 0 || len(regexp.MustCompile(`(?m) ok +\S+$`).FindAllString(out, -1)) != 2 { // STATE, then FOR
		t.Errorf("admin assignments over SASL and TLS: exit %d\n%s", code, out)
	}
	code, out = runTenure(t, pwEnv, append([]string{"produce", "--brokers", strings.Join(e.brokers, ","), "--topic", e.topic,
		"--key", "acme", "--value", "{}"}, flagArgs...)...)
	outputs = append(outputs, out)
	if code != 0 || !strings.Contains(out, "produced 1 job") {
		t.Errorf("produce over SASL and TLS: exit %d\n%s", code, out)
	}
	for _, cmd := range [][]string{{"worker"}, {"admin", "assignments"}, {"produce"}, {"migrate"}} {
		_, out = runTenure(t, pwEnv, append(cmd, "--help")...)
		outputs = append(outputs, out)
	}
	if code, body := w.get("/metrics"); code != 200 || !strings.Contains(body, "tenure_kafka_connects_total") {
		t.Errorf("/metrics: %d", code)
	} else {
		outputs = append(outputs, body)
	}

	// A wrong password: the worker stops before joining, in one sentence.
	bad := filepath.Join(t.TempDir(), "wrong")
	if err := os.WriteFile(bad, []byte("not-"+saslPassword), 0o600); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	code, out = runTenure(t, nil, append([]string{"worker", "--brokers", strings.Join(e.brokers, ","), "--group", e.group,
		"--topic", e.topic, "--database-url", e.dbURL, "--schema", e.schema, "--handler", "export", "--log-format", "console"},
		append(append([]string{}, flagArgs...), "--sasl-password-file", bad)...)...)
	outputs = append(outputs, out)
	last := strings.TrimSpace(out[strings.LastIndex(strings.TrimSpace(out), "\n")+1:])
	if code != 1 || !strings.HasPrefix(last, `tenure worker: the Kafka brokers `+strings.Join(e.brokers, ",")+` refused to authenticate user "tenure-worker" with SASL SCRAM-SHA-512`) {
		t.Errorf("worker with a wrong password: exit %d, last line %q\n%s", code, last, out)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("a worker with a wrong password took %s to stop", d)
	}

	w.stop(30 * time.Second)
	outputs = append(outputs, w.raw()...)
	if n := len(outputs); n < 10 {
		t.Fatalf("only %d outputs collected", n)
	}
	for _, o := range outputs {
		for _, secret := range []string{saslPassword, dbPassword} {
			if strings.Contains(o, secret) {
				t.Errorf("a password is in the output: %q", o)
			}
		}
	}
}

// Postgres over TLS: a throwaway cluster with a certificate signed by a
// test CA, and a role that may only connect with TLS. The worker and the
// CLI connect with sslmode=verify-full and the CA file; a CA that did not
// sign the server's certificate is refused in one sentence, and so is a
// connection without TLS.
func TestPostgresVerifyFull(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	e, pg := newOutageEnv(t, 1)
	ca := testcert.MustCA(t, "postgres")
	srv := ca.MustServer(t, "server", "127.0.0.1", "localhost")
	for name, file := range map[string]string{"server.pem": srv.CertFile, "server-key.pem": srv.KeyFile} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pg.WriteFile(name, b); err != nil {
			t.Fatal(err)
		}
	}
	if err := pg.AppendConf("ssl = on\nssl_cert_file = 'server.pem'\nssl_key_file = 'server-key.pem'"); err != nil {
		t.Fatal(err)
	}
	// tls_user: TLS only. The test's own connections (user postgres) stay
	// as they are.
	if err := pg.PrependFile("pg_hba.conf", "hostssl all tls_user 127.0.0.1/32 trust\nhostnossl all tls_user 127.0.0.1/32 reject"); err != nil {
		t.Fatal(err)
	}
	if err := pg.Restart(ctx, "fast"); err != nil {
		t.Fatal(err)
	}
	// The test pool's connections did not survive the restart.
	var err error
	for range 20 {
		if _, err = e.pool.Exec(ctx, `CREATE ROLE tls_user LOGIN SUPERUSER`); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	verifyFull := func(caFile string) string {
		return fmt.Sprintf("postgres://tls_user@127.0.0.1:%d/postgres?sslmode=verify-full&sslrootcert=%s&application_name=%s", pg.Port, caFile, workerApp)
	}
	// The server really speaks TLS to this role, with this certificate.
	conn, err := pgx.Connect(ctx, verifyFull(ca.File))
	if err != nil {
		t.Fatalf("verify-full with the test CA: %v", err)
	}
	var ssl bool
	if err := conn.QueryRow(ctx, `SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()`).Scan(&ssl); err != nil || !ssl {
		t.Fatalf("the connection is not TLS (%v, %v)", ssl, err)
	}
	conn.Close(ctx)

	e.dbURL = verifyFull(ca.File)
	e.produce(jobsFor(keys, 0, 20)...)
	w := e.startWorker("V", "--http-addr", "127.0.0.1:0")
	waitCommitted(t, e, 0, e.highWatermark(0), "")
	if code, body := w.get("/readyz"); code != 200 {
		t.Errorf("/readyz over TLS: %d %s", code, body)
	}
	w.stop(30 * time.Second)
	if code, out := runTenure(t, nil, "migrate", "status", "--database-url", e.dbURL, "--schema", e.schema); code != 0 {
		t.Errorf("migrate status over verify-full: exit %d\n%s", code, out)
	}

	other := testcert.MustCA(t, "other")
	code, out := runTenure(t, nil, "migrate", "status", "--database-url", verifyFull(other.File), "--schema", e.schema)
	if code != 1 || strings.Count(out, "\n") != 1 || !strings.Contains(out, "certificate signed by unknown authority") {
		t.Errorf("verify-full with a CA that did not sign the server's certificate: exit %d\n%s", code, out)
	}
	noTLS := fmt.Sprintf("postgres://tls_user@127.0.0.1:%d/postgres?sslmode=disable", pg.Port)
	code, out = runTenure(t, nil, "migrate", "status", "--database-url", noTLS, "--schema", e.schema)
	if code != 1 || strings.Count(out, "\n") != 1 || !strings.Contains(out, `refused user "tls_user"`) {
		t.Errorf("without TLS: exit %d\n%s", code, out)
	}
}
