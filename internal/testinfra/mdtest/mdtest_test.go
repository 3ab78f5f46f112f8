package mdtest

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func TestSectionAndCodeBlocks(t *testing.T) {
	doc := "# Title\n\n## One\n\n```sh\na\nb\n```\n\n```go\nx\n```\n\n```sh\nc\n```\n\n## Two\n\n```sh\nd\n```\n"
	path := filepath.Join(t.TempDir(), "doc.md")
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	one := Section(t, path, "One")
	if got, want := CodeBlocks(one, "```sh"), [][]string{{"a", "b"}, {"c"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("the sh blocks of section One: %q, want %q", got, want)
	}
	if got, want := CodeBlocks(one, "```go"), [][]string{{"x"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("the go blocks of section One: %q, want %q", got, want)
	}
	if got, want := CodeBlocks(Section(t, path, "Two"), "```sh"), [][]string{{"d"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("the sh blocks of section Two: %q, want %q", got, want)
	}
}
