package export

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"time"
)

// ObjectStore is where exported bytes live. Objects are immutable: Put
// creates a name once, and never replaces it. Names are slash-separated
// relative paths, as Name builds them.
//
// Implementations: file:// (FileStore) and s3:// (S3Store), chosen by Open.
// They must be safe for concurrent use.
type ObjectStore interface {
	// Put creates the object name with body's size bytes, only if name does
	// not exist: ErrExists otherwise, and the existing object is untouched.
	// The object becomes visible complete or not at all: a writer that dies
	// half-way leaves no object under name (a file store may leave a staging
	// file, which CleanStaging removes).
	Put(ctx context.Context, name string, body io.ReadSeeker, size int64, sha256 [32]byte) error
	// Get opens the object; ErrNotFound if it does not exist.
	Get(ctx context.Context, name string) (io.ReadCloser, error)
	// Delete removes the object; a missing one is not an error.
	Delete(ctx context.Context, name string) error
	// List calls fn for every object under the store's objects area, in no
	// particular order, until fn returns an error.
	List(ctx context.Context, fn func(ObjectInfo) error) error
	// CleanStaging removes what writers that died left behind before their
	// objects were created (staging files), when older than olderThan and
	// no live writer holds them; with dryRun it only counts them.
	CleanStaging(ctx context.Context, olderThan time.Duration, dryRun bool) (int, error)
	// String is the store's URL without credentials, as recorded with every
	// publication.
	String() string
}

// ObjectInfo describes a stored object.
type ObjectInfo struct {
	Name    string
	Size    int64
	ModTime time.Time
}

var (
	// ErrExists is returned by Put when the name already exists.
	ErrExists = errors.New("export: object already exists")
	// ErrNotFound is returned by Get for a name that does not exist.
	ErrNotFound = errors.New("export: object not found")
)

// Open returns the store for rawURL:
//
//   - file:///path: a directory on a local (or shared POSIX) file system;
//     the default for development;
//   - s3://bucket/prefix?endpoint=URL&region=R&path_style=true|false: any
//     S3-compatible store that honours If-None-Match: * on PutObject (AWS S3,
//     MinIO, SeaweedFS, ...). endpoint is optional for AWS; path_style
//     defaults to true when an endpoint is given. Credentials come from the
//     AWS SDK's default chain (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY,
//     shared config, web identity, instance roles), never from the URL.
func Open(ctx context.Context, rawURL string) (ObjectStore, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("export store URL %q: %v", rawURL, err)
	}
	if u.User != nil {
		return nil, fmt.Errorf("export store URL %q holds credentials: give them through the environment instead (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or the SDK's other sources)", redactURL(u))
	}
	switch u.Scheme {
	case "file":
		if u.Host != "" && u.Host != "localhost" {
			return nil, fmt.Errorf("export store URL %q: a file URL names a local path: file:///path (three slashes)", rawURL)
		}
		if u.Path == "" || !strings.HasPrefix(u.Path, "/") {
			return nil, fmt.Errorf("export store URL %q: want file:///absolute/path", rawURL)
		}
		if len(u.Query()) > 0 {
			return nil, fmt.Errorf("export store URL %q: a file store takes no parameters", rawURL)
		}
		return NewFileStore(u.Path)
	case "s3":
		return openS3(ctx, u)
	case "":
		return nil, fmt.Errorf("export store URL %q has no scheme: want file:///path or s3://bucket/prefix", rawURL)
	}
	return nil, fmt.Errorf("export store URL %q: unknown scheme %q: want file or s3", rawURL, u.Scheme)
}

func redactURL(u *url.URL) string {
	c := *u
	if c.User != nil {
		c.User = url.User("REDACTED")
	}
	return c.String()
}

// objectsDir is where objects live inside a store (below its root or
// prefix); the rest of the store is the sink's own business (staging).
const objectsDir = "objects/"
