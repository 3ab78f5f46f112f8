package export

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"sort"
	"sync"
	"testing"
	"time"
)

// testStoreContract is what every ObjectStore must do: the contract test
// the file store, the S3 store (against a real S3-compatible server) and
// the in-process fake all pass.
func testStoreContract(t *testing.T, st ObjectStore) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	put := func(name string, b []byte) error {
		return st.Put(ctx, name, bytes.NewReader(b), int64(len(b)), sha256.Sum256(b))
	}
	get := func(name string) ([]byte, error) {
		rc, err := st.Get(ctx, name)
		if err != nil {
			return nil, err
		}
		defer rc.Close()
		return io.ReadAll(rc)
	}
	name := "objects/acme/jobs/0/00000000000000000007-0.3-0123456789abcdef-fedcba9876543210"
	if _, err := get(name); !errors.Is(err, ErrNotFound) {
		t.Fatalf("get of a missing object: %v, want ErrNotFound", err)
	}
	if err := put(name, []byte("first")); err != nil {
		t.Fatal(err)
	}
	if err := put(name, []byte("second")); !errors.Is(err, ErrExists) {
		t.Fatalf("a second put of one name: %v, want ErrExists", err)
	}
	if b, err := get(name); err != nil || string(b) != "first" {
		t.Fatalf("get after a refused second put: %q, %v; want the first bytes", b, err)
	}
	// An empty object, and a larger one.
	empty := "objects/acme/jobs/0/00000000000000000008-0.3-0123456789abcdef-0000000000000001"
	if err := put(empty, nil); err != nil {
		t.Fatal(err)
	}
	if b, err := get(empty); err != nil || len(b) != 0 {
		t.Fatalf("empty object: %q, %v", b, err)
	}
	big := bytes.Repeat([]byte("0123456789"), 300_000)
	bigName := "objects/=00ff/jobs/1/00000000000000000009-1.2-0123456789abcdef-0000000000000002"
	if err := put(bigName, big); err != nil {
		t.Fatal(err)
	}
	if b, err := get(bigName); err != nil || !bytes.Equal(b, big) {
		t.Fatalf("3 MB object read back: %d bytes, %v", len(b), err)
	}
	// A body whose bytes do not match the SHA-256 given is refused (the
	// file store checks it itself, S3 by x-amz-checksum-sha256).
	bad := "objects/acme/jobs/0/00000000000000000010-0.3-0123456789abcdef-0000000000000003"
	if err := st.Put(ctx, bad, bytes.NewReader([]byte("abc")), 3, sha256.Sum256([]byte("abd"))); err == nil {
		t.Errorf("a put whose SHA-256 does not match its body was accepted")
	}
	if _, err := get(bad); !errors.Is(err, ErrNotFound) {
		t.Errorf("a refused put left an object: %v", err)
	}
	// Concurrent create-only puts of one name: exactly one wins.
	race := "objects/acme/jobs/0/00000000000000000011-0.3-0123456789abcdef-0000000000000004"
	var wg sync.WaitGroup
	var mu sync.Mutex
	won, lost := 0, 0
	for i := range 8 {
		wg.Go(func() {
			err := put(race, fmt.Appendf(nil, "writer %d", i))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				won++
			case errors.Is(err, ErrExists):
				lost++
			default:
				t.Errorf("concurrent put: %v", err)
			}
		})
	}
	wg.Wait()
	if won != 1 || lost != 7 {
		t.Errorf("8 concurrent puts of one name: %d won, %d refused; want 1 and 7", won, lost)
	}
	var names []string
	if err := st.List(ctx, func(o ObjectInfo) error {
		names = append(names, o.Name)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	sort.Strings(names)
	want := []string{name, empty, race, bigName}
	sort.Strings(want)
	if fmt.Sprint(names) != fmt.Sprint(want) {
		t.Errorf("list: %v\nwant %v", names, want)
	}
	if err := st.Delete(ctx, name); err != nil {
		t.Fatal(err)
	}
	if err := st.Delete(ctx, name); err != nil {
		t.Errorf("deleting a missing object: %v", err)
	}
	if _, err := get(name); !errors.Is(err, ErrNotFound) {
		t.Errorf("get after delete: %v", err)
	}
}

// memStore is an in-process ObjectStore for unit tests.
type memStore struct {
	mu   sync.Mutex
	objs map[string][]byte
}

func newMemStore() *memStore { return &memStore{objs: map[string][]byte{}} }

func (m *memStore) Put(ctx context.Context, name string, body io.ReadSeeker, size int64, sum [32]byte) error {
	if _, err := body.Seek(0, io.SeekStart); err != nil {
		return err
	}
	b, err := io.ReadAll(body)
	if err != nil {
		return err
	}
	if int64(len(b)) != size || sha256.Sum256(b) != sum {
		return errors.New("memstore: body does not match its size or SHA-256")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.objs[name]; ok {
		return ErrExists
	}
	m.objs[name] = b
	return nil
}

func (m *memStore) Get(ctx context.Context, name string) (io.ReadCloser, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.objs[name]
	if !ok {
		return nil, ErrNotFound
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}

func (m *memStore) Delete(ctx context.Context, name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.objs, name)
	return nil
}

func (m *memStore) List(ctx context.Context, fn func(ObjectInfo) error) error {
	m.mu.Lock()
	var infos []ObjectInfo
	for n, b := range m.objs {
		infos = append(infos, ObjectInfo{Name: n, Size: int64(len(b))})
	}
	m.mu.Unlock()
	for _, i := range infos {
		if err := fn(i); err != nil {
			return err
		}
	}
	return nil
}

func (m *memStore) CleanStaging(context.Context, time.Duration, bool) (int, error) { return 0, nil }
func (m *memStore) String() string                                                 { return "mem://test" }

func TestExportStoreContractMem(t *testing.T) {
	t.Parallel()
	st := newMemStore()
	testStoreContract(t, st)
}

func TestExportStoreContractFile(t *testing.T) {
	t.Parallel()
	st, err := NewFileStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	testStoreContract(t, st)
	// Nothing is left in staging by successful or refused puts.
	if files, _ := st.StagingFiles(); len(files) != 0 {
		t.Errorf("staging files left behind: %v", files)
	}
}
