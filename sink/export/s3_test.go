package export

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// The S3 store is tested against a real S3-compatible server, SeaweedFS's
// `weed server -s3`, started here on loopback ports. scripts/test.sh builds
// the binary once per machine (scripts/build-weed.sh) and passes its path in
// TENURE_TEST_WEED; without it the test looks in the build script's cache.
// It fails when no binary is found, unless TENURE_TEST_S3_SKIP=1 says
// skipping is allowed (a developer's quick run; never CI).
const weedVersion = "v0.0.0-20261109003541-7506e5f91cd6"

func weedBinary(t *testing.T) string {
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

// freePorts finds n consecutive free loopback ports.
func freePorts(t *testing.T, n int) int {
	t.Helper()
	for try := 0; try < 50; try++ {
		base := 20000 + int(time.Now().UnixNano()%30000)
		ok := true
		var ls []net.Listener
		for i := range n {
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(base+i))
			if err != nil {
				ok = false
				break
			}
			ls = append(ls, l)
		}
		for _, l := range ls {
			l.Close()
		}
		if ok {
			return base
		}
	}
	t.Fatal("no free ports")
	return 0
}

const (
	s3TestKey    = "tenuretest"
	s3TestSecret = "tenuretestsecret"
)

// startWeed starts an S3-compatible server that checks signatures (one
// identity), and returns its endpoint.
func startWeed(t *testing.T) string {
	t.Helper()
	bin := weedBinary(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "s3.json")
	if err := os.WriteFile(cfg, []byte(`{"identities":[{"name":"tenure","credentials":[{"accessKey":"`+s3TestKey+`","secretKey":"`+s3TestSecret+`"}],"actions":["Admin","Read","Write","List","Tagging"]}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	p := freePorts(t, 12)
	port := func(i int) string { return strconv.Itoa(p + i) }
	cmd := exec.Command(bin, "server", "-dir="+dir, "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
		"-master.port="+port(0), "-master.port.grpc="+port(1), "-volume.port="+port(2), "-volume.port.grpc="+port(3),
		"-filer.port="+port(4), "-filer.port.grpc="+port(5), "-s3", "-s3.port="+port(6), "-s3.port.grpc="+port(7),
		"-s3.port.iceberg="+port(8), "-s3.port.lance="+port(9), "-iam.port="+port(10),
		"-s3.config="+cfg, "-master.volumeSizeLimitMB=32", "-volume.max=20", "-webdav=false", "-metricsPort=0")
	cmd.Dir = dir
	logf, err := os.Create(filepath.Join(dir, "weed.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill() // ours, by PID
		<-done
		_ = os.Remove(fmt.Sprintf("/tmp/seaweedfs-s3-grpc-%d.sock", p+7))
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			if len(b) > 4000 {
				b = b[len(b)-4000:]
			}
			t.Logf("weed log (tail):\n%s", b)
		}
	})
	endpoint := "http://127.0.0.1:" + port(6)
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(endpoint + "/")
		if err == nil {
			resp.Body.Close()
			break
		}
		select {
		case <-done:
			t.Fatalf("weed exited at start; see its log")
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("weed's S3 port did not answer within 60s: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return endpoint
}

func openS3Test(t *testing.T, endpoint, bucket, prefix string) *S3Store {
	t.Helper()
	t.Setenv("AWS_ACCESS_KEY_ID", s3TestKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", s3TestSecret)
	t.Setenv("AWS_CONFIG_FILE", "/dev/null")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	st, err := Open(context.Background(), "s3://"+bucket+"/"+prefix+"?endpoint="+endpoint+"&region=us-east-1")
	if err != nil {
		t.Fatal(err)
	}
	s := st.(*S3Store)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// A fresh server takes a moment before it can allocate volumes.
	for {
		_, err := s.Client().CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(bucket)})
		if err == nil || apiCode(err) == "BucketAlreadyOwnedByYou" || apiCode(err) == "BucketAlreadyExists" {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("creating bucket %s: %v", bucket, err)
		}
		time.Sleep(300 * time.Millisecond)
	}
	return s
}

func TestExportStoreContractS3(t *testing.T) {
	// Not parallel: it sets the AWS_* variables (t.Setenv).
	endpoint := startWeed(t)
	st := openS3Test(t, endpoint, "tenure-exports", "tests/run1")
	// The server needs a moment to have a writable volume.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		err := st.Put(ctx, "objects/warmup/x/0/00000000000000000000-0.0-0000000000000000-0000000000000000", bytesReader("w"), 1, sum("w"))
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the S3 server never accepted a put: %v", err)
		}
		time.Sleep(300 * time.Millisecond)
	}
	_ = st.Delete(ctx, "objects/warmup/x/0/00000000000000000000-0.0-0000000000000000-0000000000000000")
	testStoreContract(t, st)

	// The raw protocol, as the issue states it: a second PUT of a key with
	// If-None-Match: * is answered 412 and changes nothing.
	key := st.Prefix() + "objects/raw/x/0/00000000000000000001-0.1-0000000000000000-0000000000000001"
	for i, want := range []int{200, 412} {
		body := []byte(fmt.Sprintf("body %d", i))
		_, err := st.Client().PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(st.Bucket()), Key: aws.String(key),
			Body: bytes.NewReader(body), IfNoneMatch: aws.String("*")})
		if got := 200; err != nil {
			got = status(err)
			if got != want {
				t.Fatalf("PUT #%d with If-None-Match: *: %v, want %d", i+1, err, want)
			}
		} else if want != 200 {
			t.Fatalf("PUT #%d with If-None-Match: * succeeded, want %d", i+1, want)
		}
	}

	// A prefix is a store of its own: another prefix's objects are not listed.
	other := openS3Test(t, endpoint, "tenure-exports", "tests/run2")
	n := 0
	if err := other.List(ctx, func(ObjectInfo) error { n++; return nil }); err != nil || n != 0 {
		t.Errorf("another prefix lists %d objects (%v)", n, err)
	}

	// The signature is checked: a wrong secret is refused.
	t.Setenv("AWS_SECRET_ACCESS_KEY", "wrong")
	bad, err := Open(ctx, "s3://tenure-exports/tests/run1?endpoint="+endpoint+"&region=us-east-1")
	if err != nil {
		t.Fatal(err)
	}
	b := []byte("x")
	if err := bad.Put(ctx, "objects/acme/jobs/0/00000000000000000099-0.1-0000000000000000-0000000000000009", bytes.NewReader(b), 1, sha256.Sum256(b)); err == nil || errors.Is(err, ErrExists) {
		t.Errorf("a put with a wrong secret: %v, want a refusal", err)
	}
}
