package deploy

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/tenure-dev/tenure/internal/testinfra/mdtest"
)

// The first deploy is the command sequence in README.md ("First deploy on
// Kubernetes"). The tests run it as written, with bash, a kubectl that
// records what it is asked (no cluster runs here) and, for the rehearsal,
// the real psql against a throwaway PostgreSQL.

// firstDeployDoc is the first deploy as README.md has it: the block that
// sets the operator's values, and the block of commands.
type firstDeployDoc struct {
	settings, commands string
	section            string
}

func readFirstDeploy(t *testing.T) firstDeployDoc {
	t.Helper()
	sec := mdtest.Section(t, "README.md", "First deploy on Kubernetes")
	var d firstDeployDoc
	d.section = sec
	for _, lines := range mdtest.CodeBlocks(sec, "```sh") {
		b := strings.Join(lines, "\n") + "\n"
		switch {
		case strings.HasPrefix(b, "IMAGE="):
			d.settings = b
		case strings.Contains(b, "kubectl apply"):
			d.commands = b
		}
	}
	if d.settings == "" || d.commands == "" {
		t.Fatal(`README.md, "First deploy on Kubernetes": want a sh block of settings (starting IMAGE=) and one of commands (with kubectl apply)`)
	}
	return d
}

var (
	shellAssign = regexp.MustCompile(`(?m)^([A-Z_][A-Z0-9_]*)=`)
	shellRef    = regexp.MustCompile(`\$\{?([A-Z_][A-Z0-9_]*)`)
)

// inputs are the variables the commands use without setting them: the
// settings block must set exactly these.
func (d firstDeployDoc) inputs() []string {
	set := map[string]bool{}
	for _, m := range shellAssign.FindAllStringSubmatch(d.commands, -1) {
		set[m[1]] = true
	}
	var out []string
	for _, m := range shellRef.FindAllStringSubmatch(d.commands, -1) {
		if !set[m[1]] && !slices.Contains(out, m[1]) {
			out = append(out, m[1])
		}
	}
	slices.Sort(out)
	return out
}

func (d firstDeployDoc) settingNames() []string {
	var out []string
	for _, m := range shellAssign.FindAllStringSubmatch(d.settings, -1) {
		out = append(out, m[1])
	}
	slices.Sort(out)
	return out
}

// fakeKubectl records each call in dir: its working directory and
// arguments, NUL-separated, and the manifest it reads from its standard
// input (-f -).
const fakeKubectl = `#!/bin/bash
set -eu
n=$(find "$FAKE_KUBECTL_DIR" -name '*.args' | wc -l)
f="$FAKE_KUBECTL_DIR/$(printf %03d "$n")"
printf '%s\0' "$PWD" "$@" > "$f.args"
prev=
for a in "$@"; do
	if [ "$prev" = -f ] && [ "$a" = - ]; then cat > "$f.stdin"; fi
	prev=$a
done
`

// fakePsql records its arguments and the SQL it reads from its standard
// input, for the tests that do not run a database.
const fakePsql = `#!/bin/bash
set -eu
printf '%s\0' "$@" > "$FAKE_PSQL_DIR/args"
cat > "$FAKE_PSQL_DIR/stdin"
`

type kubectlCall struct {
	dir   string
	args  []string
	stdin []byte
}

// deployRun is what the first deploy's commands did.
type deployRun struct {
	calls     []kubectlCall
	psqlArgs  []string // with the fake psql only
	psqlStdin string
	output    string
}

// runFirstDeploy runs the commands block with bash from the repository
// root, with env (the settings) and the fake kubectl first on PATH; with
// realPsql false, a fake psql too.
func runFirstDeploy(t *testing.T, d firstDeployDoc, env map[string]string, realPsql bool) deployRun {
	t.Helper()
	bin := t.TempDir()
	kdir, pdir := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "kubectl"), []byte(fakeKubectl), 0o755); err != nil {
		t.Fatal(err)
	}
	if !realPsql {
		if err := os.WriteFile(filepath.Join(bin, "psql"), []byte(fakePsql), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", d.commands)
	cmd.Dir = ".."
	// No PG* variable, kubeconfig or psqlrc of the machine's.
	cmd.Env = []string{"PATH=" + bin + string(os.PathListSeparator) + os.Getenv("PATH"), "HOME=" + t.TempDir(),
		"FAKE_KUBECTL_DIR=" + kdir, "FAKE_PSQL_DIR=" + pdir, "LC_ALL=C"}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the first deploy's commands failed: %v\n%s", err, out)
	}
	run := deployRun{output: string(out)}
	names, _ := filepath.Glob(filepath.Join(kdir, "*.args"))
	slices.Sort(names)
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
		c := kubectlCall{dir: f[0], args: f[1:]}
		c.stdin, _ = os.ReadFile(strings.TrimSuffix(n, ".args") + ".stdin")
		run.calls = append(run.calls, c)
	}
	if !realPsql {
		if b, err := os.ReadFile(filepath.Join(pdir, "args")); err == nil {
			run.psqlArgs = strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
		}
		b, _ := os.ReadFile(filepath.Join(pdir, "stdin"))
		run.psqlStdin = string(b)
	}
	return run
}

// cluster is what the kubectl calls made, in order.
type cluster struct {
	secrets    map[string]*corev1.Secret
	configMaps map[string]*corev1.ConfigMap
	applied    [][]byte // manifests, as kubectl apply received them
	rollouts   []string // rollout status targets ("deployment/x")
}

// replay reads the kubectl calls: only the forms the first deploy uses
// are known, and a Secret or ConfigMap must be created before a manifest
// that uses it is applied.
func replay(t *testing.T, calls []kubectlCall) cluster {
	t.Helper()
	c := cluster{secrets: map[string]*corev1.Secret{}, configMaps: map[string]*corev1.ConfigMap{}}
	for _, call := range calls {
		a := call.args
		where := "kubectl " + strings.Join(a, " ")
		switch {
		case len(a) >= 4 && a[0] == "create" && (a[1] == "secret" && a[2] == "generic" || a[1] == "configmap"):
			name, flags := a[3], a[4:]
			if a[1] == "configmap" {
				name, flags = a[2], a[3:]
			}
			data := map[string][]byte{}
			for _, f := range flags {
				k, v, ok := strings.Cut(f, "=")
				switch {
				case ok && k == "--from-literal":
					key, val, ok := strings.Cut(v, "=")
					if !ok {
						t.Fatalf("%s: --from-literal needs key=value", where)
					}
					if _, dup := data[key]; dup {
						t.Fatalf("%s: key %s twice", where, key)
					}
					data[key] = []byte(val)
				case ok && k == "--from-file":
					key, path, ok := strings.Cut(v, "=")
					if !ok {
						key, path = filepath.Base(v), v
					}
					if !filepath.IsAbs(path) {
						path = filepath.Join(call.dir, path)
					}
					b, err := os.ReadFile(path)
					if err != nil {
						t.Fatalf("%s: %v", where, err)
					}
					if _, dup := data[key]; dup {
						t.Fatalf("%s: key %s twice", where, key)
					}
					data[key] = b
				default:
					t.Fatalf("%s: this test knows only --from-literal=K=V and --from-file=[K=]PATH", where)
				}
			}
			if a[1] == "secret" && c.secrets[name] != nil || a[1] == "configmap" && c.configMaps[name] != nil {
				t.Fatalf("%s: created twice (kubectl create fails the second time)", where)
			}
			if a[1] == "secret" {
				c.secrets[name] = &corev1.Secret{Data: data}
				c.secrets[name].Name = name
			} else {
				cm := &corev1.ConfigMap{Data: map[string]string{}}
				cm.Name = name
				for k, v := range data {
					cm.Data[k] = string(v)
				}
				c.configMaps[name] = cm
			}
		case len(a) == 3 && a[0] == "apply" && a[1] == "-f":
			b := call.stdin
			if a[2] != "-" {
				p := a[2]
				if !filepath.IsAbs(p) {
					p = filepath.Join(call.dir, p)
				}
				var err error
				if b, err = os.ReadFile(p); err != nil {
					t.Fatalf("%s: %v", where, err)
				}
			}
			if len(bytes.TrimSpace(b)) == 0 {
				t.Fatalf("%s: an empty manifest", where)
			}
			c.applied = append(c.applied, b)
		case len(a) >= 3 && a[0] == "rollout" && a[1] == "status":
			c.rollouts = append(c.rollouts, a[2])
			for _, f := range a[3:] {
				if d, ok := strings.CutPrefix(f, "--timeout="); !ok {
					t.Fatalf("%s: unknown flag %s", where, f)
				} else if _, err := time.ParseDuration(d); err != nil {
					t.Fatalf("%s: %v", where, err)
				}
			}
		default:
			t.Fatalf("the first deploy runs `%s`, which this test does not know: teach replay what it does", where)
		}
	}
	return c
}

// sqlStatements splits the administrator's script into statements, as
// psql sends them (none of them holds a semicolon of its own).
func sqlStatements(script string) []string {
	var out []string
	for _, s := range strings.Split(script, ";") {
		if s = strings.Join(strings.Fields(s), " "); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// bootstrap is what the administrator's script creates.
type bootstrap struct {
	roles     map[string]bool // role -> LOGIN
	databases []string
	creators  map[string][]string // database -> roles granted CREATE on it
	passwords map[string]string   // role -> psql variable of its password
}

var (
	createRole = regexp.MustCompile(`^CREATE ROLE ([a-z_][a-z0-9_]*) (LOGIN|NOLOGIN)(?: PASSWORD :'([a-z_]+)')?$`)
	createDB   = regexp.MustCompile(`^CREATE DATABASE ([a-z_][a-z0-9_]*)$`)
	grantDB    = regexp.MustCompile(`^GRANT CREATE ON DATABASE ([a-z_][a-z0-9_]*) TO ([a-z_][a-z0-9_]*)$`)
)

func parseBootstrap(t *testing.T, script string) bootstrap {
	t.Helper()
	b := bootstrap{roles: map[string]bool{}, creators: map[string][]string{}, passwords: map[string]string{}}
	for _, s := range sqlStatements(script) {
		switch {
		case createRole.MatchString(s):
			m := createRole.FindStringSubmatch(s)
			b.roles[m[1]] = m[2] == "LOGIN"
			if m[3] != "" {
				b.passwords[m[1]] = m[3]
			}
			if m[2] == "LOGIN" && m[3] == "" {
				t.Errorf("the administrator's script: %q: a role that logs in without a password", s)
			}
		case createDB.MatchString(s):
			b.databases = append(b.databases, createDB.FindStringSubmatch(s)[1])
		case grantDB.MatchString(s):
			m := grantDB.FindStringSubmatch(s)
			b.creators[m[1]] = append(b.creators[m[1]], m[2])
		default:
			t.Errorf("the administrator's script: %q: this test does not know the statement", s)
		}
	}
	return b
}

// heredoc is the text of the first <<'SQL' here-document of the commands.
func heredoc(t *testing.T, commands string) string {
	t.Helper()
	_, rest, ok := strings.Cut(commands, "<<'SQL'\n")
	if !ok {
		t.Fatal("the first deploy's commands have no <<'SQL' here-document for psql")
	}
	body, _, ok := strings.Cut(rest, "\nSQL\n")
	if !ok {
		t.Fatal("the first deploy's SQL here-document does not end")
	}
	return body
}

// namesTable is README.md's table of the names the pieces share: kind,
// name, keys/ports/labels, used by.
type nameRow struct {
	kind, name         string
	attrs              []string // the backquoted words of the third column
	attrText, userText string
}

var backquoted = regexp.MustCompile("`([^`\n]+)`")

func namesTable(t *testing.T, section string) []nameRow {
	t.Helper()
	var rows []nameRow
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "| ") || strings.HasPrefix(line, "| kind ") {
			continue
		}
		cols := strings.Split(strings.Trim(line, "|"), "|")
		if len(cols) != 4 {
			t.Fatalf("README.md's names table: %q has %d columns, want 4", line, len(cols))
		}
		words := func(s string) []string {
			var out []string
			for _, m := range backquoted.FindAllStringSubmatch(s, -1) {
				out = append(out, m[1])
			}
			return out
		}
		name := words(cols[1])
		if len(name) != 1 {
			t.Fatalf("README.md's names table: %q: want one name", line)
		}
		rows = append(rows, nameRow{kind: strings.TrimSpace(cols[0]), name: name[0], attrs: words(cols[2]), attrText: cols[2], userText: cols[3]})
	}
	if len(rows) == 0 {
		t.Fatal("README.md, First deploy: no table of names")
	}
	return rows
}

// settingValues are the values the settings block gives, as bash reads
// them.
func (d firstDeployDoc) settingValues(t *testing.T) map[string]string {
	t.Helper()
	names := d.settingNames()
	script := d.settings + "\nfor n in " + strings.Join(names, " ") + "; do printf '%s\\0%s\\0' \"$n\" \"${!n}\"; done\n"
	out, err := exec.Command("bash", "-euo", "pipefail", "-c", script).Output()
	if err != nil {
		t.Fatalf("the first deploy's settings: %v", err)
	}
	f := strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
	v := map[string]string{}
	for i := 0; i+1 < len(f); i += 2 {
		v[f[i]] = f[i+1]
	}
	return v
}

var fromFileVar = regexp.MustCompile(`--from-file=[^=\s]+="?\$\{?([A-Z_][A-Z0-9_]*)`)

// fileInputs are the settings that name files the commands read.
func (d firstDeployDoc) fileInputs() []string {
	var out []string
	for _, m := range fromFileVar.FindAllStringSubmatch(d.commands, -1) {
		out = append(out, m[1])
	}
	return out
}

// staticDeploy runs the first deploy's commands with the settings as
// README.md gives them, a fake psql and placeholder files: what the
// commands create, without a database.
func staticDeploy(t *testing.T) (firstDeployDoc, map[string]string, deployRun, cluster) {
	t.Helper()
	d := readFirstDeploy(t)
	if in, set := d.inputs(), d.settingNames(); !slices.Equal(in, set) {
		t.Errorf("README.md, First deploy: the commands use %v without setting them; the settings set %v", in, set)
	}
	env := d.settingValues(t)
	dir := t.TempDir()
	for _, name := range d.fileInputs() {
		p := filepath.Join(dir, filepath.Base(env[name]))
		if err := os.WriteFile(p, []byte("placeholder for "+name+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		env[name] = p
	}
	run := runFirstDeploy(t, d, env, false)
	return d, env, run, replay(t, run.calls)
}

// builtTag is the image tag README.md's build command gives, which the
// Dockerfile's comment must give too.
func builtTag(t *testing.T) string {
	t.Helper()
	build := regexp.MustCompile("docker build -f deploy/Dockerfile -t (\\S+) \\.")
	var tags []string
	for _, path := range []string{"README.md", "Dockerfile"} {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		m := build.FindSubmatch(b)
		if m == nil {
			t.Fatalf("%s: no `docker build -f deploy/Dockerfile -t TAG .`", path)
		}
		tags = append(tags, string(m[1]))
	}
	if tags[0] != tags[1] {
		t.Errorf("README.md builds %s, the Dockerfile's comment %s", tags[0], tags[1])
	}
	return tags[0]
}

// checkNamesTable checks README.md's table of names against the
// manifests, the objects the first deploy creates and the administrator's
// script, both ways: every row names something that exists, with the keys,
// labels and ports it lists, and everything they hold has a row.
func checkNamesTable(t *testing.T, rows []nameRow, objs []any, cl cluster, boot bootstrap) {
	t.Helper()
	objects := manifestObjects(objs)
	var pod *corev1.PodSpec
	for k, o := range objects {
		if strings.HasPrefix(k, "Deployment/") {
			pod = o.pod
		}
	}
	seen := map[string]bool{}
	for _, r := range rows {
		key := r.kind + "/" + r.name
		seen[key] = true
		switch r.kind {
		case "PostgreSQL role":
			checkRoleRow(t, r, boot)
		case "Secret", "ConfigMap":
			if !checkKeysRow(t, r, key, cl) {
				continue
			}
		default:
			o, ok := objects[key]
			if !ok {
				t.Errorf("README.md names %s, which no manifest has", key)
				continue
			}
			checkObjectRow(t, r, key, o)
		}
		checkRowUsers(t, r, key, pod, objects)
	}
	if missing := missingNames(objects, cl, boot, seen); len(missing) > 0 {
		slices.Sort(missing)
		t.Errorf("README.md's table of names lacks %v", missing)
	}
}

// manifestObject is what the names table says of a manifest's object.
type manifestObject struct {
	labels   map[string]string // metadata.labels (a Deployment: its pods')
	selector *metav1.LabelSelector
	ports    []string
	pod      *corev1.PodSpec
}

// manifestObjects are the manifests' objects the names table lists, by
// "Kind/name".
func manifestObjects(objs []any) map[string]manifestObject {
	objects := map[string]manifestObject{}
	for _, o := range objs {
		switch o := o.(type) {
		case *appsv1.Deployment:
			var ports []string
			for _, c := range o.Spec.Template.Spec.Containers {
				for _, p := range c.Ports {
					ports = append(ports, p.Name, fmt.Sprint(p.ContainerPort))
				}
			}
			objects["Deployment/"+o.Name] = manifestObject{labels: o.Spec.Template.Labels, selector: o.Spec.Selector, ports: ports, pod: &o.Spec.Template.Spec}
		case *policyv1.PodDisruptionBudget:
			objects["PodDisruptionBudget/"+o.Name] = manifestObject{labels: o.Labels, selector: o.Spec.Selector}
		case *corev1.Service:
			var ports []string
			for _, p := range o.Spec.Ports {
				ports = append(ports, p.Name)
			}
			objects["Service/"+o.Name] = manifestObject{labels: o.Labels, ports: ports}
		case *serviceMonitor:
			objects["ServiceMonitor/"+o.Name] = manifestObject{labels: o.Labels, selector: &o.Spec.Selector}
		}
	}
	return objects
}

// checkRoleRow: the role exists, and logs in if and only if the row says so.
func checkRoleRow(t *testing.T, r nameRow, boot bootstrap) {
	t.Helper()
	login, ok := boot.roles[r.name]
	switch {
	case !ok:
		t.Errorf("README.md names role %s, which the administrator's script does not create", r.name)
	case login != strings.Contains(r.attrText, "logs in"):
		t.Errorf("README.md says of role %s %q; the administrator's script creates it with LOGIN %v", r.name, strings.TrimSpace(r.attrText), login)
	}
}

// checkKeysRow: the Secret or ConfigMap exists, with the keys the row
// lists. false: it does not exist.
func checkKeysRow(t *testing.T, r nameRow, key string, cl cluster) bool {
	t.Helper()
	var keys []string
	if r.kind == "Secret" && cl.secrets[r.name] != nil {
		for k := range cl.secrets[r.name].Data {
			keys = append(keys, k)
		}
	} else if r.kind == "ConfigMap" && cl.configMaps[r.name] != nil {
		for k := range cl.configMaps[r.name].Data {
			keys = append(keys, k)
		}
	} else {
		t.Errorf("README.md names %s, which the first deploy does not create", key)
		return false
	}
	want := slices.Clone(r.attrs)
	slices.Sort(keys)
	slices.Sort(want)
	if !slices.Equal(keys, want) {
		t.Errorf("README.md lists %s's keys as %v; the first deploy creates %v", key, want, keys)
	}
	return true
}

// nameRowLabel is a label in a names table row's attributes.
var nameRowLabel = regexp.MustCompile(`^([a-z0-9./-]+): (\S+)$`)

// checkObjectRow: each attribute of the row is one of the object's labels
// (a PodDisruptionBudget: its selector matches it) or ports.
func checkObjectRow(t *testing.T, r nameRow, key string, o manifestObject) {
	t.Helper()
	for _, a := range r.attrs {
		if m := nameRowLabel.FindStringSubmatch(a); m != nil {
			has := o.labels[m[1]] == m[2]
			if r.kind == "PodDisruptionBudget" {
				s, err := metav1.LabelSelectorAsSelector(o.selector)
				has = err == nil && s.Matches(labels.Set{m[1]: m[2]})
			}
			if !has {
				t.Errorf("README.md gives %s the label %s; it has %v", key, a, o.labels)
			}
		} else if !slices.Contains(o.ports, a) && !slices.Contains(o.ports, strings.Trim(a, "()")) {
			t.Errorf("README.md gives %s %q, which is neither a label nor one of its ports %v", key, a, o.ports)
		}
	}
}

// nameRowUsers are the users a names table row names ("init container
// `migrate`", "volumes `a`, `b`").
var nameRowUsers = regexp.MustCompile("(init containers?|containers?|volumes?|ServiceMonitor) ((?:`[^`]+`(?:, | and )?)+)")

// checkRowUsers: the users the row names exist.
func checkRowUsers(t *testing.T, r nameRow, key string, pod *corev1.PodSpec, objects map[string]manifestObject) {
	t.Helper()
	for _, m := range nameRowUsers.FindAllStringSubmatch(r.userText, -1) {
		for _, w := range backquoted.FindAllStringSubmatch(m[2], -1) {
			found := false
			switch strings.TrimSuffix(m[1], "s") {
			case "init container", "container":
				if pod != nil {
					cs := pod.Containers
					if strings.HasPrefix(m[1], "init") {
						cs = pod.InitContainers
					}
					found = slices.ContainsFunc(cs, func(c corev1.Container) bool { return c.Name == w[1] })
				}
			case "volume":
				found = pod != nil && slices.ContainsFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == w[1] })
			case "ServiceMonitor":
				_, found = objects["ServiceMonitor/"+w[1]]
			}
			if !found {
				t.Errorf("README.md says %s is used by %s %s, which the manifests do not have", key, m[1], w[1])
			}
		}
	}
}

// missingNames are the objects, Secrets, ConfigMaps and roles the table
// has no row for.
func missingNames(objects map[string]manifestObject, cl cluster, boot bootstrap, seen map[string]bool) []string {
	var missing []string
	for k := range objects {
		if !seen[k] {
			missing = append(missing, k)
		}
	}
	for n := range cl.secrets {
		if !seen["Secret/"+n] {
			missing = append(missing, "Secret/"+n)
		}
	}
	for n := range cl.configMaps {
		if !seen["ConfigMap/"+n] {
			missing = append(missing, "ConfigMap/"+n)
		}
	}
	for n := range boot.roles {
		if !seen["PostgreSQL role/"+n] {
			missing = append(missing, "PostgreSQL role/"+n)
		}
	}
	return missing
}
