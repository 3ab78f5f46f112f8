// Package pgtest runs a throwaway PostgreSQL cluster: its own data directory
// in a temp dir, its own loopback port and socket directory, started and
// stopped with pg_ctl. Tests that stop, restart or break Postgres use one of
// these, never the machine's shared server.
//
// initdb refuses to run as root, so when the test runs as root the cluster
// belongs to the "postgres" OS user and every pg_ctl call runs as that user.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tenure-dev/tenure/internal/testinfra/freeport"
)

// Cluster is one throwaway PostgreSQL server.
type Cluster struct {
	Dir   string // data directory (also the socket directory)
	Port  int
	bin   string
	asPG  bool   // run binaries as the postgres OS user
	netns string // the network namespace the server runs in (NewIn), or ""
	root  string
}

// BinDir finds the newest PostgreSQL server binaries on the machine.
func BinDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", errors.New("no PostgreSQL server binaries (initdb) found: install Debian's postgresql package")
}

func version(dir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return v
}

// New creates and starts a cluster under a new temp dir. Close removes it.
func New(ctx context.Context) (*Cluster, error) { return NewIn(ctx, "") }

// NewIn is New with the server running inside the network namespace netns
// (`ip netns`; "" for none): it listens on that namespace's 127.0.0.1, so
// TCP clients must connect from inside it (where a fault can drop their
// packets, and the server sees exactly what a real one would), while the
// Unix socket (SocketURL) reaches it from anywhere.
func NewIn(ctx context.Context, netns string) (*Cluster, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	root, err := os.MkdirTemp("", "tenure-pg-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{Dir: filepath.Join(root, "data"), bin: bin, root: root, asPG: os.Geteuid() == 0, netns: netns}
	if c.asPG {
		u, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(root)
			return nil, fmt.Errorf("running as root needs the postgres OS user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(root, uid, gid); err != nil {
			os.RemoveAll(root)
			return nil, err
		}
	}
	// Below the ephemeral range (freeport): the server binds it after
	// initdb, and again after every restart, while tests connect a lot.
	if c.Port, err = freeport.Block(1); err != nil {
		os.RemoveAll(root)
		return nil, err
	}
	if out, err := c.run(ctx, "initdb", "-D", c.Dir, "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8", "--locale", "C"); err != nil {
		os.RemoveAll(root)
		return nil, fmt.Errorf("initdb: %v: %s", err, out)
	}
	conf := fmt.Sprintf("\nlisten_addresses = '127.0.0.1'\nport = %d\nunix_socket_directories = '%s'\nfsync = off\nmax_connections = 200\n", c.Port, c.Dir)
	f, err := os.OpenFile(filepath.Join(c.Dir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = f.WriteString(conf)
		f.Close()
	}
	if err != nil {
		os.RemoveAll(root)
		return nil, err
	}
	if err := c.Start(ctx); err != nil {
		os.RemoveAll(root)
		return nil, err
	}
	return c, nil
}

// Start runs a cluster for the test and removes it when the test ends.
func Start(t testing.TB) *Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := New(ctx)
	if err != nil {
		t.Fatalf("throwaway PostgreSQL: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Logf("removing throwaway PostgreSQL: %v", err)
		}
	})
	return c
}

// StartPrepared is Start with prepared transactions enabled
// (max_prepared_transactions = 20), which strict hand-off needs and the
// shared server runs without.
func StartPrepared(t testing.TB) *Cluster {
	t.Helper()
	c := Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := c.Reconfigure(ctx, "max_prepared_transactions = 20"); err != nil {
		t.Fatal(err)
	}
	return c
}

// URL is the cluster's connection URL (trust auth, user postgres).
func (c *Cluster) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.Port)
}

// SocketURL is the connection URL through the cluster's Unix socket, which
// works from any network namespace.
func (c *Cluster) SocketURL() string {
	return fmt.Sprintf("postgres://postgres@/postgres?host=%s&port=%d&sslmode=disable", c.Dir, c.Port)
}

// WriteFile writes a file into the data directory, readable only by the
// server's OS user (a TLS key must be), and returns its path.
func (c *Cluster) WriteFile(name string, data []byte) (string, error) {
	path := filepath.Join(c.Dir, name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return "", err
	}
	if c.asPG {
		u, err := user.Lookup("postgres")
		if err != nil {
			return "", err
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(path, uid, gid); err != nil {
			return "", err
		}
	}
	return path, nil
}

// AppendConf appends lines to postgresql.conf (or to another file of the
// data directory, e.g. pg_hba.conf, with AppendFile); they apply at the next
// Start or Restart.
func (c *Cluster) AppendConf(lines string) error { return c.AppendFile("postgresql.conf", lines) }

// Reconfigure appends lines to postgresql.conf and restarts the server
// (mode "fast") so that they apply.
func (c *Cluster) Reconfigure(ctx context.Context, lines string) error {
	if err := c.AppendConf(lines); err != nil {
		return err
	}
	return c.Restart(ctx, "fast")
}

// AppendFile appends lines to a file of the data directory.
func (c *Cluster) AppendFile(name, lines string) error {
	f, err := os.OpenFile(filepath.Join(c.Dir, name), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString("\n" + lines + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// PrependFile puts lines at the start of a file of the data directory
// (pg_hba.conf: the first matching line wins).
func (c *Cluster) PrependFile(name, lines string) error {
	path := filepath.Join(c.Dir, name)
	old, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return os.WriteFile(path, append([]byte(lines+"\n"), old...), 0o600)
}

// Start starts the server and waits until it accepts connections.
func (c *Cluster) Start(ctx context.Context) error {
	if out, err := c.run(ctx, "pg_ctl", "-D", c.Dir, "-l", filepath.Join(c.Dir, "server.log"), "-w", "-t", "60", "start"); err != nil {
		return fmt.Errorf("pg_ctl start: %v: %s", err, out)
	}
	return c.waitReady(ctx)
}

// Stop stops the server: mode "fast" (clean: sessions are ended) or
// "immediate" (like a crash: no shutdown checkpoint, recovery on start).
func (c *Cluster) Stop(ctx context.Context, mode string) error {
	if out, err := c.run(ctx, "pg_ctl", "-D", c.Dir, "-m", mode, "-w", "-t", "60", "stop"); err != nil {
		return fmt.Errorf("pg_ctl stop: %v: %s", err, out)
	}
	return nil
}

// Restart stops the server in mode and starts it again.
func (c *Cluster) Restart(ctx context.Context, mode string) error {
	if err := c.Stop(ctx, mode); err != nil {
		return err
	}
	return c.Start(ctx)
}

// Close stops the server (if running) and removes its files.
func (c *Cluster) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := os.Stat(filepath.Join(c.Dir, "postmaster.pid")); err == nil {
		_ = c.Stop(ctx, "immediate")
	}
	return os.RemoveAll(c.root)
}

func (c *Cluster) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		url := c.URL()
		if c.netns != "" {
			url = c.SocketURL()
		}
		conn, err := pgx.Connect(ctx, url)
		if err == nil {
			conn.Close(ctx)
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("throwaway PostgreSQL on port %d did not accept connections: %w", c.Port, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *Cluster) run(ctx context.Context, name string, args ...string) (string, error) {
	argv := append([]string{filepath.Join(c.bin, name)}, args...)
	if c.asPG {
		argv = append([]string{"runuser", "-u", "postgres", "--"}, argv...)
	}
	if c.netns != "" {
		argv = append([]string{"ip", "netns", "exec", c.netns}, argv...)
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = os.TempDir()
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}
