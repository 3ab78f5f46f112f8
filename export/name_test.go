package export

import (
	"context"
	"strings"
	"testing"

	"github.com/tenure-dev/tenure/sink"
)

func TestExportName(t *testing.T) {
	t.Parallel()
	sc := Scope("tenure", "exports")
	for _, key := range []string{"acme", "a.b-c_d", "with space", "../etc", ".", "..", "ünïcode", strings.Repeat("k", 101), "x/y"} {
		n := Name(key, Position{Topic: "jobs.v2-x", Partition: 3, Offset: 42}, sink.Token{Incarnation: 2, Epoch: 17}, sc, NewNonce())
		got, err := ParseName(n)
		if err != nil {
			t.Fatalf("key %q: name %q does not parse: %v", key, n, err)
		}
		if got.Position != (Position{Topic: "jobs.v2-x", Partition: 3, Offset: 42}) || got.Token != (sink.Token{Incarnation: 2, Epoch: 17}) || got.Scope != sc {
			t.Errorf("key %q: parsed %+v", key, got)
		}
		if strings.Count(n, "/") != 4 || strings.Contains(n, "/../") || strings.Contains(n, "/./") {
			t.Errorf("key %q: name %q has path tricks", key, n)
		}
	}
	for _, bad := range []string{"", "objects/", "other/acme/jobs/0/00000000000000000001-0.1-0123456789abcdef-0123456789abcdef",
		"objects/acme/jobs/0/1-0.1-0123456789abcdef-0123456789abcdef", "objects/acme/jobs/-1/00000000000000000001-0.1-0123456789abcdef-0123456789abcdef",
		"objects/acme/jobs/0/00000000000000000001-0.1-0123456789abcdef-0123456789abcdef.tmp", "objects/acme/jobs/0/x/y"} {
		if _, err := ParseName(bad); err == nil {
			t.Errorf("ParseName(%q) accepted a foreign name", bad)
		}
	}
	if Scope("a", "b") == Scope("a", "c") || Scope("s1", "g") == Scope("s2", "g") {
		t.Error("scopes of different schemas or groups collide")
	}
}

func TestExportOpenURL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	st, err := Open(ctx, "file://"+dir)
	if err != nil {
		t.Fatal(err)
	}
	if st.String() != "file://"+dir {
		t.Errorf("String() = %q", st.String())
	}
	if _, err := Open(ctx, "s3://bucket/prefix?endpoint=http://127.0.0.1:1&region=us-east-1"); err != nil {
		t.Errorf("s3 URL: %v", err)
	}
	for _, bad := range []string{"relative/path", "file://host/path", "file://" + dir + "?x=1", "s3://", "s3://b/p?bogus=1",
		"s3://key:secret@bucket/p", "s3://b/p?endpoint=ftp://x", "gs://bucket"} {
		if _, err := Open(ctx, bad); err == nil {
			t.Errorf("Open(%q) was accepted", bad)
		} else if strings.Contains(err.Error(), "secret") {
			t.Errorf("Open(%q) error shows the secret: %v", bad, err)
		}
	}
}
