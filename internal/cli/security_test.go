package cli

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/tenure-dev/tenure/internal/devbroker"
	"github.com/tenure-dev/tenure/internal/testinfra/testcert"
)

// Every command that takes --brokers takes the TLS and SASL flags too (so
// that a new command cannot forget them), and no command has a password
// flag: it would show in ps.
func TestEveryKafkaCommandHasSecurityFlags(t *testing.T) {
	kafkaCommands := 0
	for _, cl := range commandLines() {
		name := strings.Join(cl, " ")
		_, help, _ := runIn(t, append(cl, "--help")...)
		if strings.Contains(help, "--sasl-password ") || strings.Contains(help, "TENURE_SASL_PASSWORD]") {
			t.Errorf("%s has a SASL password flag", name)
		}
		if !strings.Contains(help, "\n  --brokers ") {
			continue
		}
		kafkaCommands++
		for _, fl := range []string{"tls", "tls-ca-file", "tls-cert-file", "tls-key-file", "tls-server-name", "tls-insecure-skip-verify",
			"sasl-mechanism", "sasl-username", "sasl-password-file"} {
			if !strings.Contains(help, "\n  --"+fl+" ") && !strings.Contains(help, "\n  --"+fl+"\n") {
				t.Errorf("%s takes --brokers but not --%s", name, fl)
			}
		}
	}
	// worker, produce, and the admin commands that reach Kafka.
	if kafkaCommands < 10 {
		t.Errorf("only %d commands take --brokers", kafkaCommands)
	}
}

// Flags that contradict each other, or are incomplete, are usage errors,
// before anything connects (the brokers here do not exist).
func TestSecurityFlagUsageErrors(t *testing.T) {
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte("secret-password\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"admin", "groups", "--brokers", "127.0.0.1:1"}
	for _, c := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--sasl-mechanism", "gssapi", "--sasl-username", "u", "--sasl-password-file", pw}, nil, `--sasl-mechanism "gssapi" is not plain, scram-sha-256 or scram-sha-512`},
		{[]string{"--sasl-mechanism", "plain", "--sasl-password-file", pw}, nil, "--sasl-mechanism plain needs --sasl-username"},
		{[]string{"--sasl-mechanism", "scram-sha-256", "--sasl-username", "u"}, nil, "needs a password: --sasl-password-file FILE or TENURE_SASL_PASSWORD"},
		{[]string{"--sasl-username", "u"}, nil, "need --sasl-mechanism"},
		{[]string{"--sasl-mechanism", "scram-sha-512", "--sasl-username", "u", "--sasl-password-file", pw}, map[string]string{"TENURE_SASL_PASSWORD": "other-password"}, "given twice"},
		{[]string{"--tls-cert-file", pw}, nil, "--tls-cert-file and --tls-key-file go together"},
		{nil, map[string]string{"TENURE_SASL_MECHANISM": "SCRAM-SHA-256", "TENURE_SASL_USERNAME": "u"}, "needs a password"},
	} {
		code, stdout, stderr := runInEnv(t, c.env, append(append([]string{}, base...), c.args...)...)
		if code != 2 || stdout != "" || !strings.Contains(stderr, c.want) {
			t.Errorf("%v %v: exit %d, stdout %q, stderr %q; want exit 2 and %q", c.args, c.env, code, stdout, stderr, c.want)
		}
		if strings.Contains(stderr, "secret-password") || strings.Contains(stderr, "other-password") {
			t.Errorf("%v: the password is in the output: %q", c.args, stderr)
		}
	}
	// Files that cannot be read are failures that name the file.
	code, _, stderr := runIn(t, append(base, "--tls-ca-file", filepath.Join(t.TempDir(), "missing.pem"))...)
	if code != 1 || !strings.Contains(stderr, "--tls-ca-file") || !strings.Contains(stderr, "missing.pem: no such file") {
		t.Errorf("missing CA file: exit %d, stderr %q", code, stderr)
	}
	code, _, stderr = runIn(t, append(base, "--tls-ca-file", pw)...)
	if code != 1 || !strings.Contains(stderr, "holds no PEM certificate") {
		t.Errorf("CA file without a certificate: exit %d, stderr %q", code, stderr)
	}
}

// secureBroker starts kfake with SASL (one user per mechanism) and, when
// tlsCfg is set, a TLS listener.
func secureBroker(t *testing.T, tlsCfg *tls.Config) string {
	t.Helper()
	opts := []kfake.Opt{kfake.EnableSASL(),
		kfake.Superuser("PLAIN", "plain-user", "plain-password-1"),
		kfake.Superuser("SCRAM-SHA-256", "scram256-user", "scram256-password-1"),
		kfake.Superuser("SCRAM-SHA-512", "scram512-user", "scram512-password-1"),
	}
	if tlsCfg != nil {
		opts = append(opts, kfake.TLS(tlsCfg))
	}
	c := startBroker(t, devbroker.Config{Extra: opts})
	return c.ListenAddrs()[0]
}

// passwordFile writes pw to a file, with the final newline `echo` adds.
func passwordFile(t *testing.T, pw string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(f, []byte(pw+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// oneSentence checks that a failure is exit 1 with one line on stderr
// (besides warnings) that contains every want.
func oneSentence(t *testing.T, what string, code int, stderr string, want ...string) {
	t.Helper()
	var lines []string
	for _, l := range strings.SplitAfter(stderr, "\n") {
		if l != "" && !strings.HasPrefix(l, "tenure: warning: ") {
			lines = append(lines, l)
		}
	}
	stderr = strings.Join(lines, "")
	if code != 1 || strings.Count(stderr, "\n") != 1 {
		t.Errorf("%s: exit %d, want 1 with one line; stderr %q", what, code, stderr)
		return
	}
	for _, w := range want {
		if !strings.Contains(stderr, w) {
			t.Errorf("%s: stderr lacks %q: %q", what, w, stderr)
		}
	}
}

// The admin commands and produce authenticate with each SASL mechanism,
// over TLS and without; a wrong password fails within seconds with one
// sentence; a missing SASL configuration says what to give. No password
// is ever in the output.
func TestSASLMechanisms(t *testing.T) {
	ca := testcert.MustCA(t, "kafka")
	srv := ca.MustServer(t, "broker", "127.0.0.1", "localhost")
	for _, overTLS := range []bool{false, true} {
		var tlsCfg *tls.Config
		var tlsArgs []string
		if overTLS {
			tlsCfg = &tls.Config{Certificates: []tls.Certificate{srv.TLS}}
			tlsArgs = []string{"--tls-ca-file", ca.File}
		}
		broker := secureBroker(t, tlsCfg)
		for _, m := range []struct{ mech, user, pw string }{
			{"plain", "plain-user", "plain-password-1"},
			{"scram-sha-256", "scram256-user", "scram256-password-1"},
			{"SCRAM-SHA-512", "scram512-user", "scram512-password-1"},
		} {
			name := m.mech
			if overTLS {
				name += "+tls"
			}
			t.Run(name, func(t *testing.T) {
				topic := "sasl-" + strings.ToLower(strings.ReplaceAll(name, "+", "-"))
				auth := append([]string{"--brokers", broker, "--sasl-mechanism", m.mech, "--sasl-username", m.user}, tlsArgs...)
				withFile := append(append([]string{}, auth...), "--sasl-password-file", passwordFile(t, m.pw))
				withEnv := map[string]string{"TENURE_SASL_PASSWORD": m.pw}
				var outputs []string
				check := func(what string, wantCode int, env map[string]string, args ...string) (string, string) {
					t.Helper()
					start := time.Now()
					code, stdout, stderr := runInEnv(t, env, args...)
					outputs = append(outputs, stdout, stderr)
					if code != wantCode {
						t.Fatalf("%s: exit %d, want %d; stdout %q, stderr %q", what, code, wantCode, stdout, stderr)
					}
					if d := time.Since(start); d > 5*time.Second {
						t.Errorf("%s took %s", what, d)
					}
					return stdout, stderr
				}
				_, stderr := check("topic create", 0, nil, append([]string{"admin", "topic", "create", "--topic", topic, "--partitions", "2"}, withFile...)...)
				if clear := m.mech == "plain" && !overTLS; clear != strings.Contains(stderr, "warning: --sasl-mechanism plain without --tls: the password travels in clear text") {
					t.Errorf("PLAIN without TLS must be warned about, and nothing else: stderr %q", stderr)
				}
				out, _ := check("produce", 0, withEnv, append([]string{"produce", "--topic", topic, "--key", "acme", "--value", "v"}, auth...)...)
				if !strings.Contains(out, "produced 1 job") {
					t.Errorf("produce: %q", out)
				}
				out, _ = check("topic describe", 0, withEnv, append([]string{"admin", "topic", "describe", "--topic", topic}, auth...)...)
				if !strings.Contains(out, "topic "+topic+": 2 partitions") {
					t.Errorf("describe: %q", out)
				}
				check("groups", 0, withEnv, append([]string{"admin", "groups"}, auth...)...)

				// A wrong password: one sentence, at once, for every command.
				wrong := append(append([]string{}, auth...), "--sasl-password-file", passwordFile(t, "not-the-password"))
				for _, args := range [][]string{
					{"admin", "topic", "create", "--topic", topic + "-x", "--partitions", "1"},
					{"produce", "--topic", topic, "--key", "acme", "--value", "v"},
					{"admin", "topic", "describe", "--topic", topic},
				} {
					_, stderr := check(args[0]+" with a wrong password", 1, nil, append(args, wrong...)...)
					oneSentence(t, strings.Join(args[:2], " ")+" with a wrong password", 1, stderr,
						"refused to authenticate user \""+m.user+"\" with SASL "+strings.ToUpper(m.mech), "--sasl-password-file")
				}
				// No SASL at all: kgo's guess, and the flags that give it.
				noSASL := append([]string{"admin", "topic", "describe", "--brokers", broker, "--topic", topic}, tlsArgs...)
				_, stderr = check("describe without SASL", 1, nil, noSASL...)
				oneSentence(t, "describe without SASL", 1, stderr, "is SASL missing?", "--sasl-mechanism")

				for _, o := range outputs {
					for _, pw := range []string{m.pw, "not-the-password"} {
						if strings.Contains(o, pw) {
							t.Errorf("a password is in the output: %q", o)
						}
					}
				}
			})
		}
	}
}

// TLS with a test CA: the system roots do not know it (the error names
// --tls-ca-file), the CA file does; a wrong server name is refused; mutual
// TLS takes a client certificate; skipping verification works and says so
// on stderr.
func TestTLS(t *testing.T) {
	ca := testcert.MustCA(t, "kafka")
	srv := ca.MustServer(t, "broker", "127.0.0.1", "localhost")
	client := ca.MustClient(t, "tenure-cli")
	c, err := devbroker.Start(devbroker.Config{Extra: []kfake.Opt{kfake.TLS(&tls.Config{
		Certificates: []tls.Certificate{srv.TLS},
		ClientAuth:   tls.VerifyClientCertIfGiven,
		ClientCAs:    ca.Pool(),
	})}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	broker := c.ListenAddrs()[0]
	groups := []string{"admin", "groups", "--brokers", broker}

	code, _, stderr := runIn(t, groups...)
	oneSentence(t, "plaintext to a TLS broker", code, stderr, "is TLS missing?", "--tls")
	code, _, stderr = runIn(t, append(groups, "--tls")...)
	oneSentence(t, "system roots", code, stderr, "certificate signed by unknown authority", "--tls-ca-file")
	if code, out, stderr := runIn(t, append(groups, "--tls-ca-file", ca.File)...); code != 0 {
		t.Errorf("--tls-ca-file: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
	code, _, stderr = runIn(t, append(groups, "--tls-ca-file", ca.File, "--tls-server-name", "kafka.example")...)
	oneSentence(t, "wrong server name", code, stderr, "kafka.example", "--tls-server-name")
	if code, out, stderr := runIn(t, append(groups, "--tls-ca-file", ca.File, "--tls-cert-file", client.CertFile, "--tls-key-file", client.KeyFile)...); code != 0 {
		t.Errorf("client certificate: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
	code, out, stderr := runIn(t, append(groups, "--tls-insecure-skip-verify")...)
	if code != 0 || !strings.Contains(stderr, "warning: --tls-insecure-skip-verify: the brokers' certificates are NOT verified") {
		t.Errorf("--tls-insecure-skip-verify: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
}

// A password in TENURE_DATABASE_URL or TENURE_SASL_PASSWORD is not in
// --help (which shows the variables' values as defaults), nor in an error
// that quotes the URL.
func TestHelpAndErrorsHideSecrets(t *testing.T) {
	vars := map[string]string{
		"TENURE_DATABASE_URL":  "postgres://app:db-secret-pw@127.0.0.1:1/app?sslmode=disable",
		"TENURE_SASL_PASSWORD": "sasl-secret-pw",
		"PGPASSWORD":           "pg-env-secret",
	}
	var outs []string
	for _, cl := range commandLines() {
		_, stdout, stderr := runInEnv(t, vars, append(cl, "--help")...)
		outs = append(outs, stdout, stderr)
	}
	_, stdout, stderr := runInEnv(t, vars, "migrate", "status")
	outs = append(outs, stdout, stderr)
	// A URL pgx cannot parse is quoted in its error.
	_, stdout, stderr = runInEnv(t, nil, "migrate", "status", "--database-url", "postgres://app:db-secret-pw@127.0.0.1:99999999/app")
	outs = append(outs, stdout, stderr)
	if !strings.Contains(stderr, "the database URL (--database-url) is not valid: invalid port") {
		t.Errorf("bad URL: %q", stderr)
	}
	_, stdout, stderr = runInEnv(t, nil, "migrate", "status", "--database-url", "host=127.0.0.1 port=x password=db-secret-pw")
	outs = append(outs, stdout, stderr)
	helpShown := false
	for _, o := range outs {
		for _, pw := range []string{"db-secret-pw", "sasl-secret-pw", "pg-env-secret"} {
			if strings.Contains(o, pw) {
				t.Errorf("%s is in the output: %q", pw, o)
			}
		}
		helpShown = helpShown || strings.Contains(o, "postgres://app:[redacted]@127.0.0.1:1/app")
	}
	if !helpShown {
		t.Error("no --help shows TENURE_DATABASE_URL's value with its password redacted")
	}
}

// kafkaFlags.args gives a child process the flags that connect it the same
// way, without the password itself.
func TestKafkaFlagsArgs(t *testing.T) {
	pw := passwordFile(t, "child-password")
	given := []string{"--tls-ca-file", "/ca.pem", "--tls-server-name", "kafka.internal", "--sasl-mechanism", "scram-sha-256",
		"--sasl-username", "u", "--sasl-password-file", pw, "--tls-insecure-skip-verify"}
	parse := func(args []string) *kafkaFlags {
		r := &recorder{}
		if code, stderr := runRecorder(r, args...); code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, stderr)
		}
		return &r.kafka
	}
	got := parse(given).args()
	if strings.Join(got, " ") != strings.Join(given, " ") {
		t.Errorf("args() = %v, want %v", got, given)
	}
	if again := parse(got).args(); strings.Join(again, " ") != strings.Join(got, " ") {
		t.Errorf("args() of args() = %v", again)
	}
	if strings.Contains(strings.Join(got, " "), "child-password") {
		t.Error("args() carries the password")
	}
	if a := parse(nil).args(); len(a) != 0 {
		t.Errorf("no flags: %v", a)
	}
}
