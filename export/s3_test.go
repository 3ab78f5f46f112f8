package export

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/tenure-dev/tenure/internal/testinfra/weedtest"
)

// The S3 store is tested against a real S3-compatible server, SeaweedFS,
// started by internal/testinfra/weedtest (which says where the binary comes from and
// when the test may skip).

func openS3Test(t *testing.T, endpoint, bucket, prefix string) *S3Store {
	t.Helper()
	t.Setenv("AWS_ACCESS_KEY_ID", weedtest.Key)
	t.Setenv("AWS_SECRET_ACCESS_KEY", weedtest.Secret)
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
	endpoint := weedtest.Start(t)
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
