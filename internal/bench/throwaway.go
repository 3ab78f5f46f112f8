package bench

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The tenure-strict row needs prepared transactions, which a server with
// max_prepared_transactions = 0 refuses (the default, and it takes a
// restart to change). Rather than skip the row, the bench starts a
// PostgreSQL cluster of its own for it: initdb in a temporary directory,
// its own loopback port, max_prepared_transactions set, the settings that
// shape a commit's cost copied from the server at --database-url. The
// tests have their own such cluster (internal/testinfra/pgtest), which a
// product package must not import.

// errNoPostgresBinaries: no initdb on this machine.
var errNoPostgresBinaries = errors.New("no PostgreSQL server binaries (initdb) found on this machine")

// copiedSettings are the settings a throwaway cluster takes from the
// server at --database-url: what a commit and a COPY cost there.
var copiedSettings = []string{"fsync", "synchronous_commit", "full_page_writes", "wal_level", "shared_buffers",
	"wal_buffers", "max_wal_size", "checkpoint_timeout", "wal_compression"}

// throwawayPG is a PostgreSQL cluster the bench started: a data directory
// under root, a server on 127.0.0.1:port, owned by the postgres OS user
// when the bench runs as root (initdb refuses root).
type throwawayPG struct {
	root, dir, bin string
	port           int
	asPG           bool
}

// pgBinDir finds PostgreSQL's server binaries: initdb on PATH, or else the
// newest of Debian's /usr/lib/postgresql/*/bin.
func pgBinDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	major := func(d string) int { v, _ := strconv.Atoi(filepath.Base(filepath.Dir(d))); return v }
	slices.SortFunc(dirs, func(a, b string) int { return major(b) - major(a) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", errNoPostgresBinaries
}

// serverSettings reads names' values from the server of pool, in the form
// SHOW gives (with units), which postgresql.conf reads back as is. A
// setting the server does not have (an older version) is left out.
func serverSettings(ctx context.Context, pool *pgxpool.Pool, names []string) (map[string]string, error) {
	rows, err := pool.Query(ctx, `SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY($1)`, names)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	var k, v string
	_, err = pgx.ForEachRow(rows, []any{&k, &v}, func() error { out[k] = v; return nil })
	return out, err
}

// startThrowawayPG creates and starts a cluster with settings (and
// max_prepared_transactions = 100, listen_addresses and port, which
// settings cannot override). Close stops and removes it.
func startThrowawayPG(ctx context.Context, settings map[string]string) (*throwawayPG, error) {
	bin, err := pgBinDir()
	if err != nil {
		return nil, err
	}
	root, err := os.MkdirTemp("", "tenure-bench-pg-")
	if err != nil {
		return nil, err
	}
	c := &throwawayPG{root: root, dir: filepath.Join(root, "data"), bin: bin, asPG: os.Geteuid() == 0}
	ok := false
	defer func() {
		if !ok {
			_ = c.Close()
		}
	}()
	if c.asPG {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("initdb refuses to run as root, and there is no postgres OS user to run it as: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(root, uid, gid); err != nil {
			return nil, err
		}
	}
	if out, err := c.run(ctx, "initdb", "-D", c.dir, "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8", "--locale", "C"); err != nil {
		return nil, fmt.Errorf("initdb: %v: %s", err, out)
	}
	var conf strings.Builder
	conf.WriteString("\n# tenure bench: a throwaway cluster for the tenure-strict row\n")
	for _, k := range slices.Sorted(maps.Keys(settings)) {
		fmt.Fprintf(&conf, "%s = '%s'\n", k, strings.ReplaceAll(settings[k], "'", "''"))
	}
	fmt.Fprintf(&conf, "max_prepared_transactions = 100\nmax_connections = 200\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '%s'\n", c.dir)
	base, err := os.ReadFile(filepath.Join(c.dir, "postgresql.conf"))
	if err != nil {
		return nil, err
	}
	// A free port is only free until someone takes it: a server that
	// cannot bind it does not start, and the next attempt takes another.
	var startErr error
	for range 3 {
		if c.port, err = freeLoopbackPort(); err != nil {
			return nil, err
		}
		// The port last: the last occurrence of a setting wins.
		full := string(base) + conf.String() + fmt.Sprintf("port = %d\n", c.port)
		if err := os.WriteFile(filepath.Join(c.dir, "postgresql.conf"), []byte(full), 0o600); err != nil {
			return nil, err
		}
		out, err := c.run(ctx, "pg_ctl", "-D", c.dir, "-l", filepath.Join(root, "server.log"), "-w", "-t", "60", "start")
		if err == nil {
			startErr = nil
			break
		}
		startErr = fmt.Errorf("pg_ctl start: %v: %s", err, out)
	}
	if startErr != nil {
		return nil, startErr
	}
	ok = true
	return c, nil
}

// freeLoopbackPort is a TCP port of 127.0.0.1 that nothing listened on a
// moment ago.
func freeLoopbackPort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// URL is the cluster's connection URL (trust authentication).
func (c *throwawayPG) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

// Close stops the server, if it runs, and removes its files.
func (c *throwawayPG) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var err error
	if _, serr := os.Stat(filepath.Join(c.dir, "postmaster.pid")); serr == nil {
		if out, rerr := c.run(ctx, "pg_ctl", "-D", c.dir, "-m", "fast", "-w", "-t", "60", "stop"); rerr != nil {
			err = fmt.Errorf("pg_ctl stop: %v: %s", rerr, out)
		}
	}
	return errors.Join(err, os.RemoveAll(c.root))
}

// run runs one of the server's binaries, as the postgres OS user when the
// bench runs as root.
func (c *throwawayPG) run(ctx context.Context, name string, args ...string) (string, error) {
	argv := append([]string{filepath.Join(c.bin, name)}, args...)
	if c.asPG {
		argv = append([]string{"runuser", "-u", "postgres", "--"}, argv...)
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = os.TempDir() // the postgres user may not enter the bench's
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}
