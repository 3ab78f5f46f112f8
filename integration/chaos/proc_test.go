package chaos

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/tenure-dev/tenure/internal/childproc"
	"github.com/tenure-dev/tenure/internal/testinfra/freeport"
	"github.com/tenure-dev/tenure/internal/testinfra/netfault"
)

// proc is one process the run started: a worker or the broker. Every
// process is ended by its PID, and a process stopped with SIGSTOP always
// gets SIGCONT before anything else is sent to it (childproc does both).
type proc struct {
	*childproc.Proc
	name string
}

const tailLines = 200

// startProc starts tenure with args, inside network namespace ns unless it
// is nil (ns.Command: the PID is still tenure's own); every line of its
// stdout and stderr goes to logPath and, for stderr, to onLine.
func startProc(name, logPath string, ns *netfault.Namespace, args []string, onLine func(line string)) (*proc, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(tenureBin, args...)
	where := ""
	if ns != nil {
		cmd = ns.Command(tenureBin, args...)
		where = " in network namespace " + ns.Name()
	}
	cmd.Env = os.Environ()
	opts := childproc.Options{
		Name:       name,
		Output:     f,
		ReadStdout: true,
		Keep:       tailLines,
		QuitGrace:  5 * time.Second,
		KillWait:   15 * time.Second,
		OnExit: func(err error) {
			fmt.Fprintf(f, "---- %s exited at %s: %v\n", name, time.Now().Format(time.RFC3339Nano), exitString(err))
			f.Close()
		},
	}
	if onLine != nil {
		opts.OnLine = func(l childproc.Line) {
			if !l.Stdout {
				onLine(l.Raw)
			}
		}
	}
	fmt.Fprintf(f, "---- %s started at %s%s: %s %s\n", name, time.Now().Format(time.RFC3339Nano), where, filepath.Base(tenureBin), strings.Join(args, " "))
	p, err := childproc.Start(cmd, opts)
	if err != nil {
		f.Close()
		return nil, err
	}
	return &proc{Proc: p, name: name}, nil
}

func exitString(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

func (p *proc) pid() int                 { return p.PID() }
func (p *proc) exited() bool             { return p.Exited() }
func (p *proc) exitTime() time.Time      { return p.ExitedAt() }
func (p *proc) state() byte              { return p.State() }
func (p *proc) resume()                  { _ = p.Thaw() }
func (p *proc) kill() error              { return p.Kill() }
func (p *proc) lastLines(n int) []string { return p.Tail(n) }

// stop asks for a graceful stop (SIGTERM) and waits up to timeout; past it
// the process gets SIGQUIT (a goroutine dump), then SIGKILL, and stop
// reports that it had to.
func (p *proc) stop(timeout time.Duration) error { return p.Stop(timeout) }

// pause sends SIGSTOP and waits (bounded) until the kernel reports the
// process stopped.
func (p *proc) pause() error {
	err := p.Freeze(5 * time.Second)
	if errors.Is(err, childproc.ErrExited) {
		return fmt.Errorf("%s exited instead of stopping", p.name)
	}
	return err
}

// unexpectedExit reports whether the process ended without being asked to.
func (p *proc) unexpectedExit() (bool, error) {
	if !p.Exited() {
		return false, nil
	}
	return !p.StopRequested(), p.ExitErr()
}

// freePort is the broker's port: below the ephemeral range (freeport),
// since the broker binds it again after each restart while the workers
// open connections.
func freePort() (int, error) { return freeport.Block(1) }

// waitListening waits until addr accepts TCP connections.
func waitListening(addr string, timeout time.Duration, p *proc) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		if p != nil && p.exited() {
			return fmt.Errorf("%s exited before listening on %s: %s", p.name, addr, strings.Join(p.lastLines(10), "\n"))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nothing listening on %s after %s: %v", addr, timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
