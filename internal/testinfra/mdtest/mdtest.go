// Package mdtest reads the Markdown documents whose commands the tests run
// as written: a section under its heading, and the fenced code blocks in it.
package mdtest

import (
	"os"
	"strings"
	"testing"
)

// Section is the section of the Markdown file at path under the level-2
// heading title, up to the next level-2 heading. A missing file or section
// fails the test.
func Section(t testing.TB, path, title string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	start := strings.Index(s, "\n## "+title+"\n")
	if start < 0 {
		t.Fatalf("%s has no section %q", path, title)
	}
	s = s[start+1:]
	if end := strings.Index(s, "\n## "); end >= 0 {
		s = s[:end]
	}
	return s
}

// CodeBlocks returns the lines of each fenced code block of s whose opening
// fence is exactly fence (e.g. "```sh"), in order.
func CodeBlocks(s, fence string) [][]string {
	var blocks [][]string
	var cur []string
	in, keep := false, false
	for _, line := range strings.Split(s, "\n") {
		switch {
		case !in && strings.HasPrefix(line, "```"):
			in, keep, cur = true, line == fence, nil
		case in && line == "```":
			in = false
			if keep {
				blocks = append(blocks, cur)
			}
		case in:
			cur = append(cur, line)
		}
	}
	return blocks
}
