// Package weedtest starts a real S3-compatible server for tests: SeaweedFS's
// `weed server -s3`, on loopback ports, checking signatures (one identity:
// Key, Secret). scripts/test.sh builds the binary once per machine
// (scripts/build-weed.sh) and passes its path in TENURE_TEST_WEED; without
// it the build script's cache is looked at. A test fails when no binary is
// found, unless TENURE_TEST_S3_SKIP=1 says skipping is allowed (a
// developer's quick run; never CI).
package weedtest

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tenure-dev/tenure/internal/testinfra/freeport"
)

const weedVersion = "v0.0.0-20261109003541-7506e5f91cd6"

// Binary returns the weed binary to run, or ends the test (see the package
// comment).
func Binary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("TENURE_TEST_WEED"); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("TENURE_TEST_WEED=%s: %v", p, err)
		}
		return p
	}
	cache := os.Getenv("TENURE_WEED_CACHE")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "tenure")
	}
	p := filepath.Join(cache, "weed-"+weedVersion)
	if _, err := os.Stat(p); err == nil {
		return p
	}
	msg := fmt.Sprintf("no SeaweedFS binary for the S3 store test (looked at TENURE_TEST_WEED and %s): build it with `bash scripts/build-weed.sh` (10-15 minutes, once per machine)", p)
	if os.Getenv("TENURE_TEST_S3_SKIP") == "1" {
		t.Skip(msg + "; skipped because TENURE_TEST_S3_SKIP=1")
	}
	t.Fatal(msg + ", or set TENURE_TEST_S3_SKIP=1 to skip this test")
	return ""
}

// The identity the server accepts.
const (
	Key    = "tenuretest"
	Secret = "tenuretestsecret"
)

// Start starts a server, stopped when the test ends, and returns its
// endpoint (http://127.0.0.1:PORT). A start that fails because one of its
// ports was taken meanwhile is tried again on other ports (3 tries).
func Start(t testing.TB) string {
	t.Helper()
	bin := Binary(t)
	for try := 1; ; try++ {
		endpoint, log, err := start(t, bin)
		if err == nil {
			return endpoint
		}
		if try < 3 && strings.Contains(log, "address already in use") {
			t.Logf("weed start %d: a port was taken meanwhile; trying other ports", try)
			continue
		}
		if log != "" {
			t.Logf("weed log (tail):\n%s", log)
		}
		t.Fatal(err)
	}
}

// start runs one weed server on fresh ports and waits for its S3 port. On
// failure the server is stopped and the error comes with its log's tail.
func start(t testing.TB, bin string) (endpoint, logTail string, err error) {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "s3.json")
	if err := os.WriteFile(cfg, []byte(`{"identities":[{"name":"tenure","credentials":[{"accessKey":"`+Key+`","secretKey":"`+Secret+`"}],"actions":["Admin","Read","Write","List","Tagging"]}]}`), 0o600); err != nil {
		return "", "", err
	}
	p, err := freeport.Block(12)
	if err != nil {
		return "", "", err
	}
	port := func(i int) string { return strconv.Itoa(p + i) }
	cmd := exec.Command(bin, "server", "-dir="+dir, "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
		"-master.port="+port(0), "-master.port.grpc="+port(1), "-volume.port="+port(2), "-volume.port.grpc="+port(3),
		"-filer.port="+port(4), "-filer.port.grpc="+port(5), "-s3", "-s3.port="+port(6), "-s3.port.grpc="+port(7),
		"-s3.port.iceberg="+port(8), "-s3.port.lance="+port(9), "-iam.port="+port(10),
		"-s3.config="+cfg, "-master.volumeSizeLimitMB=32", "-volume.max=20", "-webdav=false", "-metricsPort=0")
	cmd.Dir = dir
	logf, err := os.Create(filepath.Join(dir, "weed.log"))
	if err != nil {
		return "", "", err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return "", "", err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	tail := func() string {
		b, _ := os.ReadFile(logf.Name())
		if len(b) > 4000 {
			b = b[len(b)-4000:]
		}
		return string(b)
	}
	stop := func() {
		_ = cmd.Process.Kill() // ours, by PID
		<-done
		_ = os.Remove(fmt.Sprintf("/tmp/seaweedfs-s3-grpc-%d.sock", p+7))
	}
	endpoint = "http://127.0.0.1:" + port(6)
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(endpoint + "/")
		if err == nil {
			resp.Body.Close()
			break
		}
		select {
		case <-done:
			stop()
			return "", tail(), errors.New("weed exited at start; see its log")
		default:
		}
		if time.Now().After(deadline) {
			stop()
			return "", tail(), fmt.Errorf("weed's S3 port did not answer within 60s: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("weed log (tail):\n%s", tail())
		}
	})
	return endpoint, "", nil
}
