package export

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func bytesReader(s string) io.ReadSeeker { return bytes.NewReader([]byte(s)) }
func sum(s string) [32]byte              { return sha256.Sum256([]byte(s)) }

// TestMain runs the crash test's child when asked to: a process that puts
// one object into a file store and stops at the requested point, to be
// killed there by the parent.
func TestMain(m *testing.M) {
	if dir := os.Getenv("TENURE_EXPORT_CRASH_DIR"); dir != "" {
		crashChild(dir, os.Getenv("TENURE_EXPORT_CRASH_AT"))
		return
	}
	os.Exit(m.Run())
}

const crashName = "objects/acme/jobs/0/00000000000000000042-0.7-0123456789abcdef-00000000000000aa"

func crashChild(dir, at string) {
	st, err := NewFileStore(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ready := func() {
		_ = os.WriteFile(filepath.Join(dir, "child-ready"), []byte(at), 0o644)
		select {} // wait to be killed
	}
	body := bytes.Repeat([]byte("export bytes "), 100_000)
	var r io.ReadSeeker = bytes.NewReader(body)
	switch at {
	case "mid-write":
		r = &stallingReader{ReadSeeker: r, after: int64(len(body) / 2), stall: ready}
	case "before-link":
		testHookBeforeLink = func(string) { ready() }
	}
	err = st.Put(context.Background(), crashName, r, int64(len(body)), sha256.Sum256(body))
	fmt.Fprintln(os.Stderr, "put returned", err)
	os.Exit(1)
}

// stallingReader calls stall once after handing out `after` bytes.
type stallingReader struct {
	io.ReadSeeker
	after, n int64
	stall    func()
}

func (s *stallingReader) Read(p []byte) (int, error) {
	if s.n >= s.after {
		s.stall()
	}
	p = p[:min(int64(len(p)), s.after-s.n+1)]
	n, err := s.ReadSeeker.Read(p)
	s.n += int64(n)
	return n, err
}

// A writer killed (SIGKILL, a real process) in the middle of writing, or
// after the staging file is complete and synced but before it is linked,
// leaves no visible object, partial or whole; while it is alive (here:
// frozen with SIGSTOP) CleanStaging leaves its staging file alone, and once
// it is dead CleanStaging removes it. The name stays free for a new put.
func TestExportFileStoreCrash(t *testing.T) {
	for _, at := range []string{"mid-write", "before-link"} {
		t.Run(at, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), "TENURE_EXPORT_CRASH_DIR="+dir, "TENURE_EXPORT_CRASH_AT="+at)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			go func() { _ = cmd.Wait(); close(done) }()
			defer func() {
				_ = cmd.Process.Signal(syscall.SIGKILL)
				<-done
			}()
			deadline := time.Now().Add(30 * time.Second)
			for {
				if _, err := os.Stat(filepath.Join(dir, "child-ready")); err == nil {
					break
				}
				select {
				case <-done:
					t.Fatalf("the writer exited early: %s", stderr.String())
				default:
				}
				if time.Now().After(deadline) {
					t.Fatal("the writer did not reach its point within 30s")
				}
				time.Sleep(10 * time.Millisecond)
			}
			st, err := NewFileStore(dir)
			if err != nil {
				t.Fatal(err)
			}
			staging, _ := st.StagingFiles()
			if len(staging) != 1 {
				t.Fatalf("staging files: %v, want the writer's one", staging)
			}
			info, _ := os.Stat(staging[0])
			t.Logf("writer stopped %s with a staging file of %d bytes", at, info.Size())

			// Alive but frozen: its staging file is not garbage.
			if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			if n, err := st.CleanStaging(context.Background(), 0, false); err != nil || n != 0 {
				t.Fatalf("CleanStaging with a live (frozen) writer removed %d files (%v)", n, err)
			}
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			<-done

			if names := objectNames(t, st); len(names) != 0 {
				t.Fatalf("a killed writer left visible objects: %v", names)
			}
			if _, err := st.Get(context.Background(), crashName); err == nil {
				t.Fatal("the killed writer's object is readable")
			}
			n, err := st.CleanStaging(context.Background(), 0, false)
			if err != nil || n != 1 {
				t.Fatalf("CleanStaging after the writer died removed %d files (%v), want 1", n, err)
			}
			if left, _ := st.StagingFiles(); len(left) != 0 {
				t.Fatalf("staging files left: %v", left)
			}
			if err := st.Put(context.Background(), crashName, bytesReader("fresh"), 5, sum("fresh")); err != nil {
				t.Fatalf("the name is not free after the crash: %v", err)
			}
			if !strings.Contains(crashName, "0.7") {
				t.Fatal("unreachable")
			}
		})
	}
}
