package cli

import (
	"io"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/pgconn"
)

// secrets are values no output of tenure may show: the SASL password, the
// password of a database URL, PGPASSWORD. They are collected where they
// come in (the environment, --sasl-password-file, --database-url), and
// error sentences, log lines and --help text pass through redact.
//
// This is the last line, not the only one: tenure never formats a password
// into a message on purpose, and --help does not print the value of
// TENURE_DATABASE_URL's password as a default. But errors of libraries
// (pgx quotes the connection string of a URL it cannot parse, masking the
// password on a best-effort basis) are not ours to word.
type secrets struct {
	mu   sync.Mutex
	vals []string
}

// minSecret is the shortest value redacted: replacing every "a" of a
// message because someone's password is "a" would garble it and protect
// nothing.
const minSecret = 3

const redacted = "[redacted]"

// add records a secret; s may be nil (then nothing is recorded).
func (s *secrets) add(v string) {
	if s == nil || len(v) < minSecret {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if slices.Contains(s.vals, v) {
		return
	}
	s.vals = append(s.vals, v)
	// Its escaped forms too: a URL in an error shows it so.
	for _, esc := range []string{url.QueryEscape(v), url.PathEscape(v)} {
		if esc != v && !slices.Contains(s.vals, esc) {
			s.vals = append(s.vals, esc)
		}
	}
	// Longest first, so that a secret containing another is replaced whole.
	sort.SliceStable(s.vals, func(i, j int) bool { return len(s.vals[i]) > len(s.vals[j]) })
}

// addDatabaseURL records the password of a database URL or key=value
// connection string (and of PGPASSWORD and .pgpass, which pgx reads while
// parsing it).
func (s *secrets) addDatabaseURL(conn string) {
	if s == nil || conn == "" {
		return
	}
	if cfg, err := pgconn.ParseConfig(conn); err == nil {
		s.add(cfg.Password)
	}
	// What pgx could not parse is still redacted where it can be found.
	if u, err := url.Parse(conn); err == nil && u.User != nil {
		if pw, ok := u.User.Password(); ok {
			s.add(pw)
		}
	}
	for _, m := range dsnPassword.FindAllStringSubmatch(conn, -1) {
		s.add(strings.Trim(m[1], `'`))
	}
}

var dsnPassword = regexp.MustCompile(`(?:^|\s)password\s*=\s*('(?:[^'\\]|\\.)*'|\S+)`)

// redact replaces every secret in str.
func (s *secrets) redact(str string) string {
	if s == nil {
		return str
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, v := range s.vals {
		str = strings.ReplaceAll(str, v, redacted)
	}
	return str
}

// writer wraps w so that what is written through it is redacted; each
// Write is redacted as a whole (zap writes one log line per call).
func (s *secrets) writer(w io.Writer) io.Writer {
	if s == nil {
		return w
	}
	return redactWriter{s: s, w: w}
}

type redactWriter struct {
	s *secrets
	w io.Writer
}

func (r redactWriter) Write(p []byte) (int, error) {
	out := r.s.redact(string(p))
	if out == string(p) {
		return r.w.Write(p)
	}
	if _, err := r.w.Write([]byte(out)); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Sync lets zap flush the underlying writer.
func (r redactWriter) Sync() error {
	if s, ok := r.w.(interface{ Sync() error }); ok {
		return s.Sync()
	}
	return nil
}
