package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/tenure-dev/tenure/internal/testinfra/mdtest"
)

// runHelp is `tenure <words> --help`, whatever it prints.
func runHelp(bin string, words []string) (string, error) {
	out, err := exec.Command(bin, append(append([]string{}, words...), "--help")...).CombinedOutput()
	return string(out), err
}

// deployDocs are the texts that tell how to deploy: this directory's
// READMEs and docs/operations.md's deploying sections.
func deployDocs(t *testing.T) map[string]string {
	t.Helper()
	docs := map[string]string{}
	for _, p := range []string{"README.md", "compose/README.md"} {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		docs[p] = string(b)
	}
	for _, sec := range []string{"Deploying", "Least privilege"} {
		docs["../docs/operations.md#"+sec] = mdtest.Section(t, "../docs/operations.md", sec)
	}
	return docs
}

// helps is the --help of every command and admin subcommand.
func helps(t *testing.T, bin string) map[string]string {
	t.Helper()
	out := map[string]string{}
	list := func(words []string) []string {
		b, _ := runHelp(bin, words)
		var subs []string
		for _, m := range regexp.MustCompile(`(?m)^  ([a-z][a-z-]*(?: [a-z][a-z-]*)?)\s{2,}`).FindAllStringSubmatch(b, -1) {
			subs = append(subs, m[1])
		}
		return subs
	}
	for _, c := range list(nil) {
		if c == "help" || c == "completion" || c == "version" {
			continue
		}
		if c == "admin" {
			for _, s := range list([]string{"admin"}) {
				words := append([]string{"admin"}, strings.Fields(s)...)
				out[strings.Join(words, " ")] = help(t, bin, words)
			}
			continue
		}
		out[c] = help(t, bin, []string{c})
	}
	if len(out) < 20 {
		t.Fatalf("found the help of %d commands; `tenure --help` and `tenure admin --help` changed shape", len(out))
	}
	return out
}

// The deploy docs cite what exists: each tenure command line has the
// flags it passes, each TENURE_* variable is one a command reads, each
// flag named on its own is one a command takes, each relative link
// leads to a file (and a heading, for a #fragment), each count of
// migrations is the current one.
func TestDeployDocsCiteWhatExists(t *testing.T) {
	bin := tenureBin(t)
	all := helps(t, bin)
	var every strings.Builder
	for _, h := range all {
		every.WriteString(h)
	}
	migrations, _ := filepath.Glob("../sink/migration/*.up.sql")
	tenureLine := regexp.MustCompile(`(?:^|\| |\$ )(tenure (?:[a-z][a-z-]* ?)+[^|#]*)`)
	for where, text := range deployDocs(t) {
		// Command lines, in code blocks and code spans.
		var lines []string
		for _, b := range append(mdtest.CodeBlocks(text, "```sh"), mdtest.CodeBlocks(text, "```")...) {
			lines = append(lines, b...)
		}
		for _, m := range backquoted.FindAllStringSubmatch(text, -1) {
			lines = append(lines, m[1])
		}
		for _, l := range lines {
			for _, m := range tenureLine.FindAllStringSubmatch(strings.TrimSpace(l), -1) {
				args := strings.Fields(m[1])[1:]
				words, _ := commandWords(args)
				if _, ok := all[strings.Join(words, " ")]; !ok && len(words) > 0 && words[0] != "admin" {
					t.Errorf("%s: `%s`: tenure has no command %q", where, m[1], strings.Join(words, " "))
					continue
				}
				checkCommand(t, bin, where+": `"+strings.TrimSpace(m[1])+"`", args, nil)
			}
		}
		for _, v := range regexp.MustCompile(`\bTENURE_[A-Z0-9_]+\b`).FindAllString(text, -1) {
			if !strings.Contains(every.String(), "["+v+"]") {
				t.Errorf("%s: %s is no command's variable", where, v)
			}
		}
		// A flag named on its own, in the texts about Kubernetes and
		// operations (Compose's README names docker compose's flags).
		if where != "compose/README.md" {
			for _, m := range regexp.MustCompile("`(--[a-z][a-z0-9-]*)[ =`]").FindAllStringSubmatch(text, -1) {
				if !regexp.MustCompile(`\n  ` + regexp.QuoteMeta(m[1]) + `[ \n]`).MatchString(every.String()) {
					t.Errorf("%s: %s is no command's flag", where, m[1])
				}
			}
		}
		// Relative links.
		dir := filepath.Dir(strings.Split(where, "#")[0])
		for _, m := range regexp.MustCompile(`\]\(([^)\s]+)\)`).FindAllStringSubmatch(text, -1) {
			link := m[1]
			if strings.Contains(link, "://") || strings.HasPrefix(link, "#") {
				continue
			}
			file, frag, _ := strings.Cut(link, "#")
			p := filepath.Join(dir, file)
			b, err := os.ReadFile(p)
			if fi, serr := os.Stat(p); serr != nil || (err != nil && !fi.IsDir()) {
				t.Errorf("%s: link %s: no such file", where, link)
				continue
			}
			if frag != "" && !slices.Contains(headingSlugs(string(b)), frag) {
				t.Errorf("%s: link %s: %s has no heading #%s", where, link, file, frag)
			}
		}
		for _, m := range regexp.MustCompile(`(\d+) migrations`).FindAllStringSubmatch(text, -1) {
			if m[1] != strconv.Itoa(len(migrations)) {
				t.Errorf("%s: %q: there are %d migrations (sink/migration)", where, m[0], len(migrations))
			}
		}
	}
}

// headingSlugs are the anchors GitHub gives a Markdown file's headings:
// lower case, punctuation but - and _ dropped, spaces as -.
func headingSlugs(md string) []string {
	var out []string
	in := false
	for _, l := range strings.Split(md, "\n") {
		if strings.HasPrefix(l, "```") {
			in = !in
		}
		if in || !strings.HasPrefix(l, "#") {
			continue
		}
		h := strings.ToLower(strings.TrimSpace(strings.TrimLeft(l, "#")))
		var b strings.Builder
		for _, r := range h {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		out = append(out, b.String())
	}
	return out
}
