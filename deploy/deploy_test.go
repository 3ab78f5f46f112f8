// Package deploy holds the deployment files. No container engine or
// cluster runs in CI, so this test checks them against the binary instead:
// they parse as YAML; every TENURE_* variable and every flag a file passes
// is one the command takes; probes and health checks use real endpoints on
// the worker's HTTP port; grace periods cover a graceful stop; credentials
// come from secrets; the Dockerfile builds the real command.
package deploy

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// tenureBin builds the binary once per test run.
func tenureBin(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "tenure")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/tenure-dev/tenure/cmd/tenure").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

// help is `tenure <words> --help`.
func help(t *testing.T, bin string, words []string) string {
	t.Helper()
	out, err := exec.Command(bin, append(append([]string{}, words...), "--help")...).CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "usage: tenure "+strings.Join(words, " ")+" ") {
		t.Fatalf("tenure %v --help: %v\n%s", words, err, out)
	}
	return string(out)
}

// commandWords are the words naming the command in args ("worker",
// "admin topic create"), and the rest.
func commandWords(args []string) (words, rest []string) {
	n := 1
	if len(args) > 0 && args[0] == "admin" {
		n = 2
		if len(args) > 2 && !strings.HasPrefix(args[2], "-") && (args[1] == "topic" || args[1] == "dlq" || args[1] == "group" || args[1] == "holds" || args[1] == "fences") {
			n = 3
		}
	}
	n = min(n, len(args))
	return args[:n], args[n:]
}

// checkCommand checks that the command takes every flag in args and a flag
// for every variable.
func checkCommand(t *testing.T, bin, where string, args, vars []string) {
	t.Helper()
	words, rest := commandWords(args)
	h := help(t, bin, words)
	for _, a := range rest {
		if name, ok := strings.CutPrefix(a, "--"); ok {
			name, _, _ = strings.Cut(name, "=")
			if !regexp.MustCompile(`\n  --` + regexp.QuoteMeta(name) + `[ \n]`).MatchString(h) {
				t.Errorf("%s: `tenure %s` has no flag --%s", where, strings.Join(words, " "), name)
			}
		}
	}
	for _, v := range vars {
		if !strings.Contains(h, "["+v+"]") {
			t.Errorf("%s: `tenure %s` has no flag for %s", where, strings.Join(words, " "), v)
		}
	}
}

// gracefulStop is the longest graceful stop of a worker with the given
// --shutdown-timeout: in-flight batches get it, a commit in flight gets
// consumer.Config.CommitTimeout more (15s), leaving the group and closing
// 3s (consumer's leaveTimeout); the worker's --shutdown-timeout help says
// "plus 18s".
func gracefulStop(t *testing.T, bin, shutdown string) time.Duration {
	t.Helper()
	if !strings.Contains(help(t, bin, []string{"worker"}), "at most this plus 18s") {
		t.Fatal("the worker's --shutdown-timeout help no longer says how long a stop takes: update this test")
	}
	d, err := time.ParseDuration(shutdown)
	if err != nil {
		t.Fatalf("TENURE_SHUTDOWN_TIMEOUT %q: %v", shutdown, err)
	}
	return d + 18*time.Second
}

// httpPort is the port of a TENURE_HTTP_ADDR.
func httpPort(t *testing.T, addr string) string {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("TENURE_HTTP_ADDR %q: %v", addr, err)
	}
	return port
}

// docs decodes every YAML document of a file.
func docs(t *testing.T, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var out []map[string]any
	for {
		var d map[string]any
		if err := dec.Decode(&d); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("%s does not parse: %v", path, err)
		}
		if d != nil {
			out = append(out, d)
		}
	}
	return out
}

// get walks a decoded document: get(d, "spec", "template", "spec").
func get(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[k]
		case int:
			s, ok := v.([]any)
			if !ok || k >= len(s) {
				return nil
			}
			v = s[k]
		}
	}
	return v
}

func str(v any) string {
	if v == nil {
		return ""
	}
	switch s := v.(type) {
	case string:
		return s
	case int:
		return strconv.Itoa(s)
	}
	return ""
}

func strs(v any) []string {
	var out []string
	s, _ := v.([]any)
	for _, e := range s {
		out = append(out, str(e))
	}
	return out
}

// k8sContainer is one container of a workload, with its pod spec.
type k8sContainer struct {
	kind, name string
	pod, c     map[string]any
}

func TestKubernetesManifests(t *testing.T) {
	bin := tenureBin(t)
	all := append(docs(t, "kubernetes/worker.yaml"), docs(t, "kubernetes/servicemonitor.yaml")...)
	byKind := map[string][]map[string]any{}
	secrets := map[string]map[string]bool{}
	configMaps := map[string]map[string]bool{}
	var containers []k8sContainer
	for _, d := range all {
		kind, name := str(d["kind"]), str(get(d, "metadata", "name"))
		byKind[kind] = append(byKind[kind], d)
		switch kind {
		case "Secret":
			secrets[name] = map[string]bool{}
			for k := range get(d, "stringData").(map[string]any) {
				secrets[name][k] = true
			}
		case "ConfigMap":
			configMaps[name] = map[string]bool{}
			for k := range get(d, "data").(map[string]any) {
				configMaps[name][k] = true
			}
		case "Deployment", "Job":
			pod := get(d, "spec", "template", "spec").(map[string]any)
			for _, c := range get(pod, "containers").([]any) {
				containers = append(containers, k8sContainer{kind, name, pod, c.(map[string]any)})
			}
		}
	}
	if len(containers) < 2 || len(byKind["Deployment"]) != 1 || len(byKind["PodDisruptionBudget"]) != 1 || len(byKind["ServiceMonitor"]) != 1 {
		t.Fatalf("want a worker Deployment, a migration Job, a PodDisruptionBudget and a ServiceMonitor; kinds %v", byKind)
	}

	for _, k := range containers {
		where := k.kind + "/" + k.name
		args := strs(k.c["args"])
		env := map[string]string{}
		var vars []string
		for _, e := range get(k.c, "env").([]any) {
			name := str(get(e, "name"))
			vars = append(vars, name)
			env[name] = str(get(e, "value"))
			if strings.Contains(name, "PASSWORD") && !strings.HasSuffix(name, "_FILE") {
				t.Errorf("%s: %s is in the environment; mount it as a file (--sasl-password-file)", where, name)
			}
			if ref := get(e, "valueFrom", "secretKeyRef"); ref != nil {
				if s := secrets[str(get(ref, "name"))]; s == nil || !s[str(get(ref, "key"))] {
					t.Errorf("%s: %s refers to secret %v, which this file does not define", where, name, ref)
				}
			}
		}
		checkCommand(t, bin, where, args, vars)
		if get(k.c, "env") != nil {
			for _, e := range get(k.c, "env").([]any) {
				if str(get(e, "name")) == "TENURE_DATABASE_URL" && get(e, "valueFrom", "secretKeyRef") == nil {
					t.Errorf("%s: the database URL (and its password) must come from a Secret", where)
				}
			}
		}
		// Files named by *_FILE variables and the database URL's
		// sslrootcert must be under a mounted volume.
		var mounts []string
		if vm, ok := k.c["volumeMounts"].([]any); ok {
			for _, m := range vm {
				mounts = append(mounts, str(get(m, "mountPath")))
			}
		}
		for name, v := range env {
			if strings.HasSuffix(name, "_FILE") {
				mounted := false
				for _, m := range mounts {
					mounted = mounted || strings.HasPrefix(v, m+"/")
				}
				if !mounted {
					t.Errorf("%s: %s=%s is not under a mounted volume %v", where, name, v, mounts)
				}
			}
		}
		if args[0] != "worker" {
			continue
		}
		// The worker: probes on its HTTP port, a grace period above a
		// graceful stop, no static membership.
		port := httpPort(t, env["TENURE_HTTP_ADDR"])
		portName := ""
		for _, p := range get(k.c, "ports").([]any) {
			if str(get(p, "containerPort")) == port {
				portName = str(get(p, "name"))
			}
		}
		if portName == "" {
			t.Errorf("%s: no container port %s (TENURE_HTTP_ADDR)", where, port)
		}
		for probe, path := range map[string]string{"readinessProbe": "/readyz", "livenessProbe": "/healthz"} {
			if got := str(get(k.c, probe, "httpGet", "path")); got != path {
				t.Errorf("%s: %s path %q, want %s", where, probe, got, path)
			}
			if got := str(get(k.c, probe, "httpGet", "port")); got != portName && got != port {
				t.Errorf("%s: %s port %q, want %s", where, probe, got, portName)
			}
		}
		grace, _ := get(k.pod, "terminationGracePeriodSeconds").(int)
		if stop := gracefulStop(t, bin, env["TENURE_SHUTDOWN_TIMEOUT"]); time.Duration(grace)*time.Second < stop+5*time.Second {
			t.Errorf("%s: terminationGracePeriodSeconds %d does not cover a graceful stop (%s) and a margin", where, grace, stop)
		}
		for _, v := range vars {
			if strings.Contains(v, "INSTANCE") {
				t.Errorf("%s: static membership (%s) must not be configured", where, v)
			}
		}
	}

	// The PodDisruptionBudget and the ServiceMonitor's Service select the
	// workers.
	labels := get(byKind["Deployment"][0], "spec", "template", "metadata", "labels").(map[string]any)
	matches := func(sel any) bool {
		m, ok := sel.(map[string]any)
		if !ok || len(m) == 0 {
			return false
		}
		for k, v := range m {
			if labels[k] != v {
				return false
			}
		}
		return true
	}
	if pdb := byKind["PodDisruptionBudget"][0]; !matches(get(pdb, "spec", "selector", "matchLabels")) || get(pdb, "spec", "maxUnavailable") == nil {
		t.Errorf("the PodDisruptionBudget does not select the workers with a maxUnavailable: %v", pdb["spec"])
	}
	svc := byKind["Service"][0]
	if !matches(get(svc, "spec", "selector")) || str(get(svc, "spec", "ports", 0, "targetPort")) != "http" {
		t.Errorf("the Service does not reach the workers' http port: %v", svc["spec"])
	}
	sm := byKind["ServiceMonitor"][0]
	if str(get(sm, "spec", "endpoints", 0, "path")) != "/metrics" || str(get(sm, "spec", "endpoints", 0, "port")) != "http" {
		t.Errorf("the ServiceMonitor does not scrape /metrics on the http port: %v", sm["spec"])
	}
}

func TestComposeFile(t *testing.T) {
	bin := tenureBin(t)
	d := docs(t, "compose/compose.yaml")
	if len(d) != 1 {
		t.Fatalf("compose.yaml has %d documents", len(d))
	}
	services, _ := d[0]["services"].(map[string]any)
	for _, name := range []string{"kafka", "postgres", "topic", "migrate", "worker", "cli"} {
		if services[name] == nil {
			t.Errorf("no service %q", name)
		}
	}
	if roles := str(get(services, "kafka", "environment", "KAFKA_PROCESS_ROLES")); !strings.Contains(roles, "controller") {
		t.Errorf("kafka is not in KRaft mode (KAFKA_PROCESS_ROLES %q)", roles)
	}
	dockerfile, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	for name, s := range services {
		if str(get(s, "image")) != "tenure:dev" {
			continue
		}
		if str(get(s, "build", "dockerfile")) != "deploy/Dockerfile" || str(get(s, "build", "context")) != "../.." {
			t.Errorf("%s: does not build deploy/Dockerfile from the repository root", name)
		}
		env, _ := get(s, "environment").(map[string]any)
		var vars []string
		for v := range env {
			if !strings.HasPrefix(v, "TENURE_") {
				t.Errorf("%s: %s is not a tenure variable", name, v)
			}
			vars = append(vars, v)
		}
		if name == "cli" {
			// `docker compose run --rm cli <command>`: every command that
			// talks to both.
			for _, words := range [][]string{{"admin", "assignments"}, {"produce"}} {
				h := help(t, bin, words)
				for _, v := range vars {
					if v != "TENURE_DATABASE_URL" && v != "TENURE_SCHEMA" || words[0] == "admin" {
						if !strings.Contains(h, "["+v+"]") {
							t.Errorf("cli: `tenure %s` has no flag for %s", strings.Join(words, " "), v)
						}
					}
				}
			}
			continue
		}
		// Variables a command does not take would be ignored: the one-shot
		// steps only get those of their command.
		cmd := strs(get(s, "command"))
		words, _ := commandWords(cmd)
		h := help(t, bin, words)
		var own []string
		for _, v := range vars {
			if strings.Contains(h, "["+v+"]") || name == "worker" {
				own = append(own, v)
			}
		}
		checkCommand(t, bin, "service "+name, cmd, own)
		if name != "worker" {
			continue
		}
		stop := gracefulStop(t, bin, str(env["TENURE_SHUTDOWN_TIMEOUT"]))
		grace, err := time.ParseDuration(str(get(s, "stop_grace_period")))
		if err != nil || grace < stop+5*time.Second {
			t.Errorf("worker: stop_grace_period %v does not cover a graceful stop (%s) and a margin", get(s, "stop_grace_period"), stop)
		}
		test := strs(get(s, "healthcheck", "test"))
		port := httpPort(t, str(env["TENURE_HTTP_ADDR"]))
		if len(test) != 4 || test[0] != "CMD" || test[2] != "probe" || test[3] != "http://127.0.0.1:"+port+"/readyz" {
			t.Errorf("worker: health check %v, want CMD <tenure> probe http://127.0.0.1:%s/readyz", test, port)
		} else if !strings.Contains(string(dockerfile), "/out/tenure "+test[1]) {
			t.Errorf("worker: the health check runs %s, which the Dockerfile does not install", test[1])
		}
		if r, _ := get(s, "deploy", "replicas").(int); r != 3 {
			t.Errorf("worker: %d replicas, want 3", r)
		}
		for _, dep := range []string{"topic", "migrate"} {
			if c := str(get(s, "depends_on", dep, "condition")); c != "service_completed_successfully" {
				t.Errorf("worker: depends on %s with %q, want service_completed_successfully", dep, c)
			}
		}
	}
	// The one-shot topic step can run again (restart: on-failure, a second
	// `up`): it must succeed when the topic exists.
	if !strings.Contains(strings.Join(strs(get(services, "topic", "command")), " "), "--if-not-exists") {
		t.Error("the topic step fails on a second run without --if-not-exists")
	}
}

func TestDockerfileBuildsTheCommand(t *testing.T) {
	b, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, want := range []string{"./cmd/tenure", "FROM golang:1.26", "ENTRYPOINT", "nonroot"} {
		if !strings.Contains(s, want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
	gomod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	goVer := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindStringSubmatch(string(gomod))
	if goVer == nil || !strings.Contains(s, "golang:"+goVer[1]) {
		t.Errorf("the build image's Go version must match go.mod's (%v)", goVer)
	}
}
