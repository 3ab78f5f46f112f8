package export

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// FileStore keeps objects in a directory: <root>/objects/<name>. Put writes
// a staging file in <root>/.staging (same file system), fsyncs it, links it
// to the object's name (link(2) fails if the name exists: create-only, never
// a replace), fsyncs the directory, and removes the staging name. A reader
// therefore sees a complete object or none. A writer killed before the link
// leaves only its staging file, locked (flock) while the writer lives;
// CleanStaging removes those whose writer is gone.
type FileStore struct {
	root string
}

// NewFileStore opens (and creates if needed) a file store rooted at dir.
func NewFileStore(dir string) (*FileStore, error) {
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("export file store %q: the path must be absolute", dir)
	}
	dir = filepath.Clean(dir)
	for _, d := range []string{dir, filepath.Join(dir, objectsDir), filepath.Join(dir, stagingDir)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("export file store: %w", err)
		}
	}
	return &FileStore{root: dir}, nil
}

const stagingDir = ".staging"

// Root is the store's directory.
func (s *FileStore) Root() string { return s.root }

func (s *FileStore) String() string { return "file://" + s.root }

// path turns an object name into a path below the root, refusing anything
// that would leave it.
func (s *FileStore) path(name string) (string, error) {
	if !strings.HasPrefix(name, objectsDir) || strings.Contains(name, "\\") || strings.Contains(name, "\x00") {
		return "", fmt.Errorf("export: object name %q is not below %s", name, objectsDir)
	}
	for _, part := range strings.Split(name, "/") {
		if part == "" || part == "." || part == ".." {
			return "", fmt.Errorf("export: object name %q has an empty, . or .. part", name)
		}
	}
	return filepath.Join(s.root, filepath.FromSlash(name)), nil
}

// testHookBeforeLink, when set (tests only), runs with the staging file's
// path once it is written and synced, just before it is linked.
var testHookBeforeLink func(staging string)

func (s *FileStore) Put(ctx context.Context, name string, body io.ReadSeeker, size int64, sum [32]byte) error {
	final, err := s.path(name)
	if err != nil {
		return err
	}
	if _, err := os.Lstat(final); err == nil {
		return ErrExists
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	tmp, err := os.OpenFile(filepath.Join(s.root, stagingDir, NewNonce()+".tmp"), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("export: staging %s: %w", name, err)
	}
	tmpPath := tmp.Name()
	// Held until the staging file is gone: CleanStaging leaves a locked
	// staging file alone (its writer is alive, perhaps paused).
	if err := lockFile(tmp); err != nil {
		_ = tmp.Close()
		_ = os.Remove(tmpPath)
		return fmt.Errorf("export: locking the staging file of %s: %w", name, err)
	}
	defer func() {
		_ = os.Remove(tmpPath) // the object, if linked, keeps its own name
		_ = tmp.Close()
	}()
	if _, err := body.Seek(0, io.SeekStart); err != nil {
		return err
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), &ctxReader{ctx: ctx, r: body})
	if err != nil {
		return fmt.Errorf("export: writing %s: %w", name, err)
	}
	if n != size || [32]byte(h.Sum(nil)) != sum {
		return fmt.Errorf("export: writing %s: the body changed while it was written (%d bytes, want %d; or its SHA-256 differs)", name, n, size)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("export: syncing %s: %w", name, err)
	}
	if testHookBeforeLink != nil {
		testHookBeforeLink(tmpPath)
	}
	if err := mkdirAllSync(s.root, filepath.Dir(final)); err != nil {
		return fmt.Errorf("export: creating the directory of %s: %w", name, err)
	}
	if err := os.Link(tmpPath, final); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return ErrExists
		}
		return fmt.Errorf("export: publishing %s: %w", name, err)
	}
	if err := syncDir(filepath.Dir(final)); err != nil {
		return fmt.Errorf("export: syncing the directory of %s: %w", name, err)
	}
	return nil
}

// mkdirAllSync creates dir and its missing parents below root, syncing each
// new directory's parent so that the new entries survive a crash.
func mkdirAllSync(root, dir string) error {
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	if dir == root || len(dir) <= len(root) {
		return nil
	}
	if err := mkdirAllSync(root, filepath.Dir(dir)); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return syncDir(filepath.Dir(dir))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func (s *FileStore) Get(ctx context.Context, name string) (io.ReadCloser, error) {
	p, err := s.path(name)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ErrNotFound
	}
	return f, err
}

func (s *FileStore) Delete(ctx context.Context, name string) error {
	p, err := s.path(name)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

func (s *FileStore) List(ctx context.Context, fn func(ObjectInfo) error) error {
	base := filepath.Join(s.root, objectsDir)
	return filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed meanwhile
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		rel, err := filepath.Rel(s.root, p)
		if err != nil {
			return err
		}
		return fn(ObjectInfo{Name: filepath.ToSlash(rel), Size: info.Size(), ModTime: info.ModTime()})
	})
}

// StagingFiles lists the staging files present (tests, gc reports).
func (s *FileStore) StagingFiles() ([]string, error) {
	es, err := os.ReadDir(filepath.Join(s.root, stagingDir))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range es {
		out = append(out, filepath.Join(s.root, stagingDir, e.Name()))
	}
	return out, nil
}

func (s *FileStore) CleanStaging(ctx context.Context, olderThan time.Duration, dryRun bool) (int, error) {
	files, err := s.StagingFiles()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, p := range files {
		info, err := os.Lstat(p)
		if err != nil || !info.Mode().IsRegular() || time.Since(info.ModTime()) < olderThan {
			continue
		}
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		free, err := tryLockFile(f)
		if err != nil || !free {
			_ = f.Close() // a live writer holds it (perhaps paused): its link may still come
			continue
		}
		if !dryRun {
			if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
				_ = f.Close()
				return n, err
			}
		}
		_ = f.Close()
		n++
	}
	return n, nil
}

// ctxReader stops a copy when ctx ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
