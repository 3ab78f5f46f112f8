package export

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// S3Store keeps objects in an S3 bucket under a prefix:
// <prefix>/objects/<name>. Put is a single PutObject with If-None-Match: *
// (the store refuses to replace an existing key, answering 412), carrying
// the body's SHA-256 so that the store checks what it received. A PutObject
// is atomic: an interrupted upload leaves no object, so there is nothing to
// clean up (objects above 5 GiB, which would need a multipart upload, are
// refused).
type S3Store struct {
	client *s3.Client
	bucket string
	prefix string // "" or ending in "/"
	url    string // without query secrets (there are none in the URL)
	// noChecksum: do not send x-amz-checksum-sha256 (checksum=false in the
	// URL), for stores that do not support it.
	noChecksum bool
}

const maxS3Put = 5 << 30

// openS3 parses s3://bucket/prefix?endpoint=URL&region=R&path_style=BOOL&checksum=BOOL.
func openS3(ctx context.Context, u *url.URL) (*S3Store, error) {
	bucket := u.Host
	if bucket == "" {
		return nil, fmt.Errorf("export store URL %q: want s3://bucket/prefix", u.String())
	}
	prefix := strings.Trim(u.Path, "/")
	if prefix != "" {
		prefix += "/"
	}
	q := u.Query()
	for k := range q {
		switch k {
		case "endpoint", "region", "path_style", "checksum":
		default:
			return nil, fmt.Errorf("export store URL %q: unknown parameter %q (want endpoint, region, path_style, checksum)", u.String(), k)
		}
	}
	endpoint, region := q.Get("endpoint"), q.Get("region")
	pathStyle := endpoint != ""
	if v := q.Get("path_style"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, fmt.Errorf("export store URL %q: path_style=%q is not a boolean", u.String(), v)
		}
		pathStyle = b
	}
	checksum := true
	if v := q.Get("checksum"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, fmt.Errorf("export store URL %q: checksum=%q is not a boolean", u.String(), v)
		}
		checksum = b
	}
	if endpoint != "" {
		eu, err := url.Parse(endpoint)
		if err != nil || (eu.Scheme != "http" && eu.Scheme != "https") || eu.Host == "" {
			return nil, fmt.Errorf("export store URL %q: endpoint %q is not an http(s) URL", u.String(), endpoint)
		}
	}
	var opts []func(*config.LoadOptions) error
	if region != "" {
		opts = append(opts, config.WithRegion(region))
	} else if endpoint != "" {
		opts = append(opts, config.WithRegion("us-east-1")) // S3-compatible stores mostly ignore it, the signature needs one
	}
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("export store %s: loading AWS configuration: %w", u.String(), err)
	}
	client := s3.NewFromConfig(cfg, func(o *s3.Options) {
		if endpoint != "" {
			o.BaseEndpoint = aws.String(endpoint)
		}
		o.UsePathStyle = pathStyle
		// Checksums only where the API requires them: S3-compatible stores
		// differ in the trailing-checksum encodings they accept. Put sends
		// its own SHA-256 header.
		o.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired
		o.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
	})
	return &S3Store{client: client, bucket: bucket, prefix: prefix, url: u.String(), noChecksum: !checksum}, nil
}

func (s *S3Store) String() string { return s.url }

// Bucket is the store's bucket; Prefix its key prefix ("" or ending in "/").
func (s *S3Store) Bucket() string { return s.bucket }
func (s *S3Store) Prefix() string { return s.prefix }

// Client is the S3 client (tests).
func (s *S3Store) Client() *s3.Client { return s.client }

func (s *S3Store) Put(ctx context.Context, name string, body io.ReadSeeker, size int64, sum [32]byte) error {
	if size > maxS3Put {
		return fmt.Errorf("export: object %s is %d bytes; a single S3 upload takes at most 5 GiB", name, size)
	}
	if _, err := body.Seek(0, io.SeekStart); err != nil {
		return err
	}
	in := &s3.PutObjectInput{
		Bucket:        aws.String(s.bucket),
		Key:           aws.String(s.prefix + name),
		Body:          body,
		ContentLength: aws.Int64(size),
		IfNoneMatch:   aws.String("*"),
		Metadata:      map[string]string{"sha256": hex.EncodeToString(sum[:])},
	}
	if !s.noChecksum {
		in.ChecksumSHA256 = aws.String(base64.StdEncoding.EncodeToString(sum[:]))
	}
	_, err := s.client.PutObject(ctx, in)
	if err == nil {
		return nil
	}
	if status(err) == http.StatusPreconditionFailed || apiCode(err) == "PreconditionFailed" {
		return ErrExists
	}
	if status(err) == http.StatusConflict && apiCode(err) == "ConditionalRequestConflict" {
		// Two conditional writes of the key raced; the other one won.
		return ErrExists
	}
	return fmt.Errorf("export: s3 put %s: %w", name, err)
}

func (s *S3Store) Get(ctx context.Context, name string) (io.ReadCloser, error) {
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(s.prefix + name)})
	if err != nil {
		var nsk *types.NoSuchKey
		if errors.As(err, &nsk) || status(err) == http.StatusNotFound {
			return nil, ErrNotFound
		}
		return nil, fmt.Errorf("export: s3 get %s: %w", name, err)
	}
	return out.Body, nil
}

func (s *S3Store) Delete(ctx context.Context, name string) error {
	_, err := s.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(s.prefix + name)})
	if err != nil && status(err) != http.StatusNotFound {
		return fmt.Errorf("export: s3 delete %s: %w", name, err)
	}
	return nil
}

func (s *S3Store) List(ctx context.Context, fn func(ObjectInfo) error) error {
	p := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{Bucket: aws.String(s.bucket), Prefix: aws.String(s.prefix + objectsDir)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return fmt.Errorf("export: s3 list: %w", err)
		}
		for _, o := range page.Contents {
			info := ObjectInfo{Name: strings.TrimPrefix(aws.ToString(o.Key), s.prefix), Size: aws.ToInt64(o.Size)}
			if o.LastModified != nil {
				info.ModTime = *o.LastModified
			}
			if err := fn(info); err != nil {
				return err
			}
		}
	}
	return nil
}

// CleanStaging has nothing to do: an S3 upload is one atomic PutObject.
func (s *S3Store) CleanStaging(context.Context, time.Duration, bool) (int, error) { return 0, nil }

func status(err error) int {
	var re *smithyhttp.ResponseError
	if errors.As(err, &re) {
		return re.HTTPStatusCode()
	}
	return 0
}

func apiCode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}
