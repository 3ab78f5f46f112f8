package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/tenure-dev/tenure/sink"
)

// poolSize sizes a pool: the most connections and those opened up front
// (zero values: pgxpool's defaults); tracer, if set, traces its statements
// (the worker's, with tracing configured: internal/otelsetup).
type poolSize struct {
	max, min int32
	tracer   pgx.QueryTracer
}

// openDB opens a pool and proves the database answers, turning the usual
// failures into one sentence.
func openDB(ctx context.Context, url string, size ...poolSize) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("the database URL is not valid: %s", pgxCause(err))
	}
	for _, s := range size {
		if s.max > 0 {
			cfg.MaxConns = s.max
		}
		if s.min > 0 {
			cfg.MinConns = min(s.min, cfg.MaxConns)
		}
		if s.tracer != nil {
			cfg.ConnConfig.Tracer = s.tracer
		}
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	}
	// A database that vanishes without a reset must not hang a statement
	// for TCP's fifteen minutes (docs/fencing.md, "A network that drops").
	sink.SetNetworkTimeouts(&cfg.ConnConfig.Config)
	// What answers while the database is proven says what is there when
	// it is not PostgreSQL.
	peer := &pgPeer{direct: cfg.ConnConfig.SSLNegotiation == "direct"}
	defer peer.done.Store(true)
	cfg.ConnConfig.DialFunc = peer.dial(cfg.ConnConfig.DialFunc)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("the database URL is not valid: %s", pgxCause(err))
	}
	start := time.Now()
	pctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		// The bound in force: the URL's connect_timeout (per address), or
		// the ping's, or the command's deadline if it came first.
		bound := cfg.ConnConfig.ConnectTimeout
		if dl, ok := pctx.Deadline(); ok && errors.Is(pctx.Err(), context.DeadlineExceeded) {
			bound = dl.Sub(start)
		}
		return nil, connectError(cfg.ConnConfig.Config, err, peer, bound)
	}
	if _, err := checkPooler(pctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// pingTimeout bounds openDB's proof that the database answers.
const pingTimeout = 15 * time.Second

// dbRefusedError is a database server that answered and refused the
// connection (authentication, an unknown role or database, too many
// connections): reachable, unlike a network failure.
type dbRefusedError struct{ msg string }

func (e *dbRefusedError) Error() string { return e.msg }

// connectError words a failed connection by what the server said, if it
// said anything: a refusal is not a reachability problem. peer is what
// answered (nil: unknown); bound the time the attempt had.
func connectError(cfg pgconn.Config, err error, peer *pgPeer, bound time.Duration) error {
	where := fmt.Sprintf("%s:%d", cfg.Host, cfg.Port)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		var msg string
		switch pgErr.Code {
		case sink.CodeInvalidPassword, sink.CodeInvalidAuthorization: // unknown role, pg_hba.conf
			msg = fmt.Sprintf("the database server at %s refused user %q: %s (check the user and password of the database URL)", where, cfg.User, pgErr.Message)
		case sink.CodeInvalidCatalogName:
			msg = fmt.Sprintf("the database server at %s has no database %q: %s (check the database name of the URL)", where, cfg.Database, pgErr.Message)
		case sink.CodeTooManyConnections, sink.CodeCannotConnectNow: // (starting up, shutting down)
			msg = fmt.Sprintf("the database server at %s is not accepting connections now: %s", where, pgErr.Message)
		default:
			msg = fmt.Sprintf("the database server at %s refused the connection: %s (SQLSTATE %s)", where, pgErr.Message, pgErr.Code)
		}
		return &dbRefusedError{msg}
	}
	timedOut := pgconn.Timeout(err) || errors.Is(err, context.DeadlineExceeded)
	if peer != nil && !errors.Is(err, context.Canceled) {
		if msg := peer.failure(timedOut, bound); msg != "" {
			return errors.New(msg)
		}
	}
	if timedOut {
		return fmt.Errorf("cannot reach the database at %s: no answer within %s", where, boundText(bound))
	}
	return fmt.Errorf("cannot reach the database at %s: %s", where, pgxCause(err))
}

// pgxCause strips pgx's long connection preamble down to the reason.
func pgxCause(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Message
	}
	s := err.Error()
	if i := strings.LastIndex(s, ": "); i >= 0 && strings.HasPrefix(s, "failed to connect") {
		s = s[i+2:]
	}
	return s
}

// kafkaFlags are the flags of a command that talks to Kafka: --brokers,
// and TLS and SASL for clusters that require them. Every such command adds
// them with define and makes its clients with client (or passes kgoOpts to
// consumer.Config.KgoOpts), so that no connection it makes goes without
// them; kgoOpts is the one place where the TLS and SASL flags become kgo
// options.
//
// The SASL password never comes from a flag (it would show in ps): it is
// read from --sasl-password-file or TENURE_SASL_PASSWORD.
type kafkaFlags struct {
	e       *env
	brokers string

	tls, tlsInsecure                              bool
	tlsCA, tlsCert, tlsKey, tlsServerName         string
	saslMechanism, saslUsername, saslPasswordFile string

	done bool
	opts []kgo.Opt
	err  error
}

// envSASLPassword is where the SASL password comes from when no
// --sasl-password-file is given.
const envSASLPassword = "TENURE_SASL_PASSWORD"

// define adds --brokers (with its usage text; brokersOpts say whether it is
// required) and the TLS and SASL flags.
func (k *kafkaFlags) define(f *flagSet, brokersUsage string, brokersOpts ...flagOpt) {
	k.e = f.e
	f.kafka = k
	f.String(&k.brokers, "brokers", "", brokersUsage, append([]flagOpt{arg("HOST:PORT[,..]")}, brokersOpts...)...)

	f.Bool(&k.tls, "tls", false, "connect to the brokers with TLS, verifying their certificates against the system's roots (or --tls-ca-file); any other --tls-* flag implies it", late)
	f.String(&k.tlsCA, "tls-ca-file", "", "PEM file of the CA certificates that sign the brokers' certificates (default: the system's roots)", arg("FILE"), late)
	f.String(&k.tlsCert, "tls-cert-file", "", "PEM file of this client's certificate, for brokers that require mutual TLS (with --tls-key-file)", arg("FILE"), late)
	f.String(&k.tlsKey, "tls-key-file", "", "PEM file of the key of --tls-cert-file", arg("FILE"), late)
	f.String(&k.tlsServerName, "tls-server-name", "", "the name the brokers' certificates must carry (default: the host of each broker address)", arg("NAME"), late)
	f.Bool(&k.tlsInsecure, "tls-insecure-skip-verify", false, "do not verify the brokers' certificates (logged as a warning: anyone on the path can read and change the traffic, SASL credentials included); for tests only", late)

	f.String(&k.saslMechanism, "sasl-mechanism", "", "SASL mechanism: plain, scram-sha-256 or scram-sha-512 (with --sasl-username, and the password in --sasl-password-file or "+envSASLPassword+")", arg("MECHANISM"), late)
	f.String(&k.saslUsername, "sasl-username", "", "SASL user name", arg("NAME"), late)
	f.String(&k.saslPasswordFile, "sasl-password-file", "", "file holding the SASL password (a final newline is ignored); or set "+envSASLPassword+". There is no password flag: it would show in ps", arg("FILE"), late)
}

// list is --brokers as a list.
func (k *kafkaFlags) list() []string { return splitList(k.brokers) }

// saslMechanisms are the values --sasl-mechanism takes, as Kafka spells
// them.
var saslMechanisms = map[string]string{"plain": "PLAIN", "scram-sha-256": "SCRAM-SHA-256", "scram-sha-512": "SCRAM-SHA-512"}

// tlsOn reports whether any TLS flag is set.
func (k *kafkaFlags) tlsOn() bool {
	return k.tls || k.tlsInsecure || k.tlsCA != "" || k.tlsCert != "" || k.tlsKey != "" || k.tlsServerName != ""
}

// kgoOpts turns the TLS and SASL flags into kgo options (none when no such
// flag is set). Contradictory or incomplete flags are usage errors;
// unreadable files are failures. Warnings (certificates not verified, a
// PLAIN password sent in clear) go to warn, or to stderr when warn is nil.
// It does the work once; later calls return the same result.
func (k *kafkaFlags) kgoOpts(warn func(string)) ([]kgo.Opt, error) {
	if k.done {
		return k.opts, k.err
	}
	k.done = true
	k.opts, k.err = k.build(warn)
	return k.opts, k.err
}

func (k *kafkaFlags) build(warn func(string)) ([]kgo.Opt, error) {
	if warn == nil {
		warn = func(msg string) { fmt.Fprintf(k.e.stderr, "tenure: warning: %s\n", msg) }
	}
	var opts []kgo.Opt
	if k.tlsCert != "" && k.tlsKey == "" || k.tlsCert == "" && k.tlsKey != "" {
		return nil, usagef("--tls-cert-file and --tls-key-file go together (a client certificate and its key)")
	}
	if k.tlsOn() {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: k.tlsServerName}
		if k.tlsCA != "" {
			pem, err := os.ReadFile(k.tlsCA)
			if err != nil {
				return nil, fmt.Errorf("--tls-ca-file: %v", fileError(err))
			}
			cfg.RootCAs = x509.NewCertPool()
			if !cfg.RootCAs.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("--tls-ca-file %s holds no PEM certificate", k.tlsCA)
			}
		}
		if k.tlsCert != "" {
			cert, err := tls.LoadX509KeyPair(k.tlsCert, k.tlsKey)
			if err != nil {
				return nil, fmt.Errorf("--tls-cert-file and --tls-key-file: %v", fileError(err))
			}
			cfg.Certificates = []tls.Certificate{cert}
		}
		if k.tlsInsecure {
			cfg.InsecureSkipVerify = true
			warn("--tls-insecure-skip-verify: the brokers' certificates are NOT verified; anyone between this process and the brokers can read and change the traffic, SASL credentials included (give the brokers' CA with --tls-ca-file instead)")
		}
		// kgo sets ServerName per broker from its address when it is empty.
		opts = append(opts, kgo.DialTLSConfig(cfg))
	}

	mech := strings.ToLower(k.saslMechanism)
	pwEnv := k.e.getenv(envSASLPassword)
	switch {
	case mech == "" && (k.saslUsername != "" || k.saslPasswordFile != ""):
		return nil, usagef("--sasl-username and --sasl-password-file need --sasl-mechanism (plain, scram-sha-256 or scram-sha-512)")
	case mech == "":
		return opts, nil
	case saslMechanisms[mech] == "":
		return nil, usagef("--sasl-mechanism %q is not plain, scram-sha-256 or scram-sha-512", k.saslMechanism)
	case k.saslUsername == "":
		return nil, usagef("--sasl-mechanism %s needs --sasl-username", mech)
	case k.saslPasswordFile == "" && pwEnv == "":
		return nil, usagef("--sasl-mechanism %s needs a password: --sasl-password-file FILE or %s (never a flag: it would show in ps)", mech, envSASLPassword)
	case k.saslPasswordFile != "" && pwEnv != "":
		return nil, usagef("the SASL password is given twice, by --sasl-password-file and by %s: give one", envSASLPassword)
	}
	pass := pwEnv
	if k.saslPasswordFile != "" {
		b, err := os.ReadFile(k.saslPasswordFile)
		if err != nil {
			return nil, fmt.Errorf("--sasl-password-file: %v", fileError(err))
		}
		pass = strings.TrimRight(string(b), "\r\n")
		if pass == "" {
			return nil, fmt.Errorf("--sasl-password-file %s is empty", k.saslPasswordFile)
		}
		k.e.secrets.add(pass)
	}
	user := k.saslUsername
	var m sasl.Mechanism
	switch mech {
	case "plain":
		if !k.tlsOn() {
			warn("--sasl-mechanism plain without --tls: the password travels in clear text")
		}
		m = plain.Auth{User: user, Pass: pass}.AsMechanism()
	case "scram-sha-256":
		m = scram.Auth{User: user, Pass: pass}.AsSha256Mechanism()
	case "scram-sha-512":
		m = scram.Auth{User: user, Pass: pass}.AsSha512Mechanism()
	}
	return append(opts, kgo.SASL(m)), nil
}

// args returns the TLS and SASL flags as given, for a command that starts
// other tenure processes (tenure bench starts workers): they connect the
// same way. The password is not among them: a child reads the same
// --sasl-password-file, or inherits TENURE_SASL_PASSWORD.
func (k *kafkaFlags) args() []string {
	var out []string
	for _, f := range []struct{ name, v string }{{"tls-ca-file", k.tlsCA}, {"tls-cert-file", k.tlsCert}, {"tls-key-file", k.tlsKey},
		{"tls-server-name", k.tlsServerName}, {"sasl-mechanism", k.saslMechanism}, {"sasl-username", k.saslUsername},
		{"sasl-password-file", k.saslPasswordFile}} {
		if f.v != "" {
			out = append(out, "--"+f.name, f.v)
		}
	}
	if k.tls {
		out = append(out, "--tls")
	}
	if k.tlsInsecure {
		out = append(out, "--tls-insecure-skip-verify")
	}
	return out
}

// fileError words a failed file read without Go's "open " prefix.
func fileError(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Path + ": " + pe.Err.Error()
	}
	return err.Error()
}

// client makes a client for admin calls to brokers with the TLS and SASL
// flags and extra options. With SASL, a refusal of the credentials ends
// the client's requests at once (authWatch).
func (k *kafkaFlags) client(brokers []string, extra ...kgo.Opt) (*kgo.Client, error) {
	opts, err := k.kgoOpts(nil)
	if err != nil {
		return nil, err
	}
	// The watches end the client's requests (cancel) when what they saw
	// makes them pointless: an address that is not a Kafka broker, a
	// refusal of the SASL credentials.
	ctx, cancel := context.WithCancel(context.Background())
	hooks := []kgo.Hook{&kafkaPeerWatch{e: k.e, brokers: brokers, cancel: cancel}}
	if k.saslMechanism != "" {
		hooks = append(hooks, &authWatch{k: k, brokers: brokers, cancel: cancel})
	}
	opts = append(opts, kgo.WithContext(ctx), kgo.WithHooks(hooks...))
	cl, err := kafkaClient(brokers, append(opts, extra...)...)
	if err != nil {
		cancel()
		return nil, err
	}
	return cl, nil
}

// authWatch watches the connections of a CLI client that authenticates
// with SASL. A broker that accepts the connection and then drops it while
// the client authenticates (kfake does, and so do some managed services),
// or answers SASL_AUTHENTICATION_FAILED (Apache Kafka), refuses the
// credentials. kgo retries a dropped connection like any network hiccup,
// so a command would wait for its timeout and then say only "EOF"; at the
// second refusal in a row the watch ends the client's requests
// (ErrClientClosed) and records the sentence that says why, which run
// prints instead of the command's own error.
type authWatch struct {
	k       *kafkaFlags
	brokers []string
	cancel  context.CancelFunc

	mu       sync.Mutex
	refusals int
}

// authRefusals is how many refused connections in a row end a command.
const authRefusals = 2

func (w *authWatch) OnBrokerConnect(_ kgo.BrokerMetadata, _ time.Duration, conn net.Conn, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var firstRead *kgo.ErrFirstReadEOF
	switch {
	case err == nil:
		w.refusals = 0
		return
	case conn == nil, errors.As(err, &firstRead):
		// Not reached, or dropped before SASL (TLS on one side only):
		// kgo's own error says so.
		return
	case notKafka(err) != "":
		return // not a broker at all: kafkaPeerWatch says so
	}
	var ke *kerr.Error
	if errors.As(err, &ke) && !errors.Is(err, kerr.SaslAuthenticationFailed) {
		return // the broker answered something else; not a refusal of the credentials
	}
	if w.refusals++; w.refusals < authRefusals && !errors.Is(err, kerr.SaslAuthenticationFailed) {
		return
	}
	w.k.e.setKafkaFailure(fmt.Sprintf("the Kafka brokers %s refused to authenticate user %q with SASL %s: check --sasl-username, the password (--sasl-password-file or %s) and --sasl-mechanism (%v)",
		strings.Join(w.brokers, ","), w.k.saslUsername, saslMechanisms[strings.ToLower(w.k.saslMechanism)], envSASLPassword, err))
	w.cancel()
}

// kafkaClient makes a plain client for admin calls: seeds and client id,
// and opts. Commands use kafkaFlags.client, which adds TLS and SASL.
func kafkaClient(brokers []string, opts ...kgo.Opt) (*kgo.Client, error) {
	for _, b := range brokers {
		if !strings.Contains(b, ":") {
			return nil, usagef("broker %q is not host:port", b)
		}
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.ClientID("tenure-cli")}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	return cl, nil
}

// kgoDefaultBatchMaxBytes is kgo's ProducerBatchMaxBytes default, kept below
// the brokers' default message.max.bytes.
const kgoDefaultBatchMaxBytes = 1000012

// producerClient makes the client jobs are produced with: idempotent with
// acks=all, and the murmur2 key partitioner of the Java client (what
// partition.For computes), so that a key lands where every tenure tool
// expects it. largest is the biggest record (key + value bytes) it will send.
func producerClient(k *kafkaFlags, brokers []string, largest int, extra ...kgo.Opt) (*kgo.Client, error) {
	return k.client(brokers, append([]kgo.Opt{
		kgo.RequiredAcks(kgo.AllISRAcks()), // idempotence (kgo's default) needs acks=all
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
		kgo.ProducerBatchMaxBytes(int32(max(kgoDefaultBatchMaxBytes, largest+1024))),
		kgo.RecordDeliveryTimeout(30 * time.Second),
	}, extra...)...)
}

// checkTopics returns the partition count of each topic, or one sentence:
// unreachable brokers, or a missing topic and the command that creates it.
func checkTopics(ctx context.Context, cl *kgo.Client, brokers, topics []string) (map[string]int32, error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	td, err := kadm.NewClient(cl).ListTopics(ctx, topics...)
	if err != nil {
		if dl, ok := ctx.Deadline(); ok && errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("cannot reach the Kafka brokers %s: no answer within %s", strings.Join(brokers, ","), boundText(dl.Sub(start)))
		}
		return nil, fmt.Errorf("cannot reach the Kafka brokers %s: %v%s", strings.Join(brokers, ","), err, securityHint(err))
	}
	out := map[string]int32{}
	for _, t := range topics {
		d, ok := td[t]
		if !ok || d.Err != nil {
			return nil, fmt.Errorf("topic %q does not exist: create it with `tenure admin topic create --brokers %s --topic %s --partitions N`",
				t, strings.Join(brokers, ","), t)
		}
		out[t] = int32(len(d.Partitions))
	}
	return out, nil
}

// securityHint names the flags that fix a connection error about TLS or
// SASL ("" for other errors): kgo's own sentence says what is missing, not
// how tenure is told.
func securityHint(err error) string {
	var firstRead *kgo.ErrFirstReadEOF
	var unknownCA x509.UnknownAuthorityError
	var hostname x509.HostnameError
	switch {
	case errors.As(err, &unknownCA):
		return " (give the CA that signs the brokers' certificates with --tls-ca-file)"
	case errors.As(err, &hostname):
		return " (the brokers' certificates do not name the address connected to: --tls-server-name names what they carry)"
	case errors.As(err, &firstRead):
		return " (TLS: --tls, --tls-ca-file; SASL: --sasl-mechanism, --sasl-username, --sasl-password-file or " + envSASLPassword + ")"
	case errors.Is(err, kerr.SaslAuthenticationFailed), errors.Is(err, kerr.UnsupportedSaslMechanism):
		return " (check --sasl-mechanism, --sasl-username and the password in --sasl-password-file or " + envSASLPassword + ")"
	}
	return ""
}

// checkDatabaseURL refuses, before anything connects, a --database-url
// that is not a PostgreSQL connection string: a URL of another scheme
// (http://...), or text pgx cannot parse. Bad usage, in every command that
// takes the flag. fromEnv says the value came from TENURE_DATABASE_URL.
func checkDatabaseURL(conn string, fromEnv bool) error {
	if strings.TrimSpace(conn) == "" {
		return nil
	}
	what := "--database-url"
	if fromEnv {
		what = envName("database-url")
	}
	const shape = "postgres://user@host:5432/db, postgresql://..., or libpq key=value settings such as host=H dbname=D"
	if scheme, _, ok := strings.Cut(conn, "://"); ok && !strings.ContainsAny(scheme, " =") {
		if s := strings.ToLower(scheme); s != "postgres" && s != "postgresql" {
			return usagef("the database URL (%s) is not a PostgreSQL URL: %q has the scheme %s://; give %s", what, conn, scheme, shape)
		}
	}
	_, err := pgconn.ParseConfig(conn)
	if err == nil {
		return nil
	}
	msg := err.Error()
	// Files the settings name (TLS certificates, a service file) are the
	// environment's business, said when connecting.
	if strings.Contains(msg, "failed to configure TLS") || strings.Contains(msg, "failed to read service") {
		return nil
	}
	var ue *url.Error
	var pe *pgconn.ParseConfigError
	switch {
	case errors.As(err, &ue):
		msg = ue.Err.Error()
	case errors.As(err, &pe) && errors.Unwrap(pe) != nil:
		msg = errors.Unwrap(pe).Error()
	default:
		if _, after, ok := strings.Cut(msg, "`: "); ok {
			msg = after
		}
	}
	return usagef("the database URL (%s) is not valid: %s; give %s", what, msg, shape)
}

// schemaExists reports whether the database has schema (any role may read
// pg_namespace).
func schemaExists(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, schema string) (bool, error) {
	var ok bool
	err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, schema).Scan(&ok)
	return ok, err
}

// tenureSchemas lists the schemas of the database that hold tenure's
// tables: those with tenure's schema_migrations table (version, name,
// applied_at; other tools' tables of that name have other columns).
func tenureSchemas(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relname = 'schema_migrations' AND c.relkind IN ('r', 'p')
		AND (SELECT count(*) FROM pg_attribute a WHERE a.attrelid = c.oid AND NOT a.attisdropped
			AND a.attname IN ('version', 'name', 'applied_at')) = 3
		ORDER BY 1`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// schemaList renders tenureSchemas' answer for a sentence.
func schemaList(schemas []string) string {
	if len(schemas) == 0 {
		return "none"
	}
	return strings.Join(schemas, ", ")
}

// otherSchemas is schemas without schema.
func otherSchemas(schemas []string, schema string) []string {
	var out []string
	for _, s := range schemas {
		if s != schema {
			out = append(out, s)
		}
	}
	return out
}

// missingSchema is the one sentence for a --schema that does not exist:
// which schemas of the database do hold tenure's tables, and what to do.
// alternatives are the ways out besides the right --schema and migrating
// it first ("pass --create-schema").
func missingSchema(ctx context.Context, pool *pgxpool.Pool, schema string, alternatives ...string) error {
	found := "cannot list the schemas with tenure tables"
	if schemas, err := tenureSchemas(ctx, pool); err == nil {
		found = "schemas with tenure tables: " + schemaList(schemas)
	}
	ways := append([]string{"give the right --schema", fmt.Sprintf("run `tenure migrate up --schema %s` first", schema)}, alternatives...)
	last := ways[len(ways)-1]
	return fmt.Errorf("schema %q does not exist in this database; %s; %s, or %s", schema, found, strings.Join(ways[:len(ways)-1], ", "), last)
}
