// Package deploy holds the deployment files. No container engine or
// cluster runs in CI, so these tests check them offline instead. The
// Kubernetes manifests decode strictly into k8s.io/api's types (a misspelt
// field fails), and their pods pass the "restricted" Pod Security Standard
// as Kubernetes' own evaluator (k8s.io/pod-security-admission) judges it.
// Against the binary: every TENURE_* variable and every flag a file passes
// is one the command takes; probes and health checks use real endpoints on
// the worker's HTTP port; grace periods cover a graceful stop; credentials
// come from secrets, files from mounted volumes; the schema is migrated
// and the roles granted before the workers start. Against the Dockerfile:
// it builds the real command, and its numeric USER is the user the
// manifests and Compose run. README.md's first deploy is run as written
// (firstdeploy_test.go, rehearsal_test.go), and the deploy docs cite only
// what exists (docs_test.go).
package deploy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	psaapi "k8s.io/pod-security-admission/api"
	psapolicy "k8s.io/pod-security-admission/policy"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/tenure-dev/tenure/internal/testinfra/tenurebin"
)

// tenureBin builds the binary for the test; it is removed when the test
// ends.
func tenureBin(t *testing.T) string {
	t.Helper()
	bin, remove, err := tenurebin.Build()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(remove)
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

// imageUser is the Dockerfile's USER as a uid and gid. It must be numeric:
// a kubelet enforcing runAsNonRoot cannot tell whether a user name is root,
// and refuses the pod ("image has non-numeric user").
func imageUser(t *testing.T) (uid, gid int64) {
	t.Helper()
	b, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^USER[ \t]+(\S+)[ \t]*$`).FindAllStringSubmatch(string(b), -1)
	if m == nil {
		t.Fatal("Dockerfile: no USER: the image runs as root")
	}
	user := m[len(m)-1][1]
	u, g, _ := strings.Cut(user, ":")
	uid, errU := strconv.ParseInt(u, 10, 64)
	gid, errG := strconv.ParseInt(g, 10, 64)
	if errU != nil || errG != nil || uid == 0 {
		t.Fatalf("Dockerfile: USER %s: want a numeric, non-root uid:gid (a kubelet enforcing runAsNonRoot cannot verify a user name)", user)
	}
	return uid, gid
}

// serviceMonitor is the part of the Prometheus Operator's ServiceMonitor
// (not a k8s.io/api kind) that servicemonitor.yaml uses, decoded as
// strictly as the rest: a field the file adds must be added here too.
type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector  metav1.LabelSelector `json:"selector"`
		Endpoints []struct {
			Port     string `json:"port"`
			Path     string `json:"path"`
			Interval string `json:"interval"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// readK8s reads the manifest at path and decodes it with decodeK8s; the
// test fails if it cannot.
func readK8s(t *testing.T, path string) ([]byte, []any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeK8s(path, b)
	if err != nil {
		t.Fatal(err)
	}
	return b, objs
}

// decodeK8s decodes every document of a manifest into its k8s.io/api type
// (a *appsv1.Deployment, a *corev1.Secret, ...; a *serviceMonitor), as
// strictly as `kubectl apply` validates: an unknown or duplicated field, a
// kind or apiVersion the API lacks, a value of the wrong type or a quantity
// that does not parse is an error. Defaults are not applied.
func decodeK8s(path string, data []byte) ([]any, error) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, batchv1.AddToScheme, policyv1.AddToScheme} {
		if err := add(scheme); err != nil {
			return nil, err
		}
	}
	dec := serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []any
	var errs []error
	for n := 1; ; n++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return out, fmt.Errorf("%s: %w", path, err)
		}
		if j, err := sigsyaml.YAMLToJSON(doc); err == nil && string(bytes.TrimSpace(j)) == "null" {
			continue // comments only
		}
		obj, _, err := dec.Decode(doc, nil, nil)
		var tm metav1.TypeMeta
		if runtime.IsNotRegisteredError(err) && sigsyaml.Unmarshal(doc, &tm) == nil && tm.APIVersion == "monitoring.coreos.com/v1" && tm.Kind == "ServiceMonitor" {
			sm := &serviceMonitor{}
			if err := sigsyaml.UnmarshalStrict(doc, sm); err != nil {
				errs = append(errs, fmt.Errorf("%s, document %d (%s): %w", path, n, tm.Kind, err))
			}
			out = append(out, sm)
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s, document %d: %w", path, n, err))
		}
		if obj != nil { // a strict decoding error still decodes the rest
			out = append(out, obj)
		}
	}
	return out, errors.Join(errs...)
}

// podTemplate is the pod a workload runs.
type podTemplate struct {
	where string // "Deployment/tenure-worker"
	meta  metav1.ObjectMeta
	spec  corev1.PodSpec
}

func podTemplates(objs []any) []podTemplate {
	var out []podTemplate
	for _, o := range objs {
		switch o := o.(type) {
		case *appsv1.Deployment:
			out = append(out, podTemplate{"Deployment/" + o.Name, o.Spec.Template.ObjectMeta, o.Spec.Template.Spec})
		case *appsv1.StatefulSet:
			out = append(out, podTemplate{"StatefulSet/" + o.Name, o.Spec.Template.ObjectMeta, o.Spec.Template.Spec})
		case *appsv1.DaemonSet:
			out = append(out, podTemplate{"DaemonSet/" + o.Name, o.Spec.Template.ObjectMeta, o.Spec.Template.Spec})
		case *batchv1.Job:
			out = append(out, podTemplate{"Job/" + o.Name + o.GenerateName, o.Spec.Template.ObjectMeta, o.Spec.Template.Spec})
		case *batchv1.CronJob:
			out = append(out, podTemplate{"CronJob/" + o.Name, o.Spec.JobTemplate.Spec.Template.ObjectMeta, o.Spec.JobTemplate.Spec.Template.Spec})
		case *corev1.Pod:
			out = append(out, podTemplate{"Pod/" + o.Name, o.ObjectMeta, o.Spec})
		}
	}
	return out
}

// restrictedViolations are the reasons the API server's PodSecurity
// admission, enforcing the "restricted" level at its latest version, would
// refuse the pod; Kubernetes' own evaluator (k8s.io/pod-security-admission),
// run offline.
func restrictedViolations(t *testing.T, meta *metav1.ObjectMeta, spec *corev1.PodSpec) []string {
	t.Helper()
	ev, err := psapolicy.NewEvaluator(psapolicy.DefaultChecks(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range ev.EvaluatePod(psaapi.LevelVersion{Level: psaapi.LevelRestricted, Version: psaapi.LatestVersion()}, meta, spec) {
		if !r.Allowed {
			v := r.ForbiddenReason
			if r.ForbiddenDetail != "" {
				v += " (" + r.ForbiddenDetail + ")"
			}
			out = append(out, v)
		}
	}
	return out
}

// Peak RSS of a worker with the default buffers (--partition-buffer-bytes
// 4MiB, --worker-buffer-bytes 32MiB; 64MiB then): draining a backlog, 110-151 MB
// (an earlier `tenure bench` run than docs/throughput.md's: 98-124 MB with
// 12 partitions over 1-3 workers; another measurement: 101-120 MB, 111 MB
// per worker with 1,000 partitions; the partition dimension's backlog of
// 3M-6M jobs over 1,000 partitions and 3 workers: 133-151 MB);
// the largest measured, 261 MB, one worker holding 48 partitions. The
// request must cover the first, the limit the second.
var (
	workerDrainPeak   = resource.NewQuantity(151_000_000, resource.DecimalSI)
	workerLargestPeak = resource.NewQuantity(261_000_000, resource.DecimalSI)
)

// manifests is what TestKubernetesManifests checks: the manifests'
// objects, and the Secrets and ConfigMaps the first deploy creates beside
// them.
type manifests struct {
	bin        string
	uid, gid   int64
	doc        firstDeployDoc
	run        deployRun
	cl         cluster
	objs       []any
	secrets    map[string]map[string]string // name: key: value
	configMaps map[string]map[string]bool   // name: keys
	dep        *appsv1.Deployment
	pdb        *policyv1.PodDisruptionBudget
	svc        *corev1.Service
	sm         *serviceMonitor
	// The Deployment's init container that migrates, and its worker (nil:
	// none).
	migrate, worker *corev1.Container
}

func readManifests(t *testing.T) *manifests {
	t.Helper()
	m := &manifests{bin: tenureBin(t)}
	m.uid, m.gid = imageUser(t)
	m.doc, _, m.run, m.cl = staticDeploy(t)
	workerYAML, err := os.ReadFile("kubernetes/worker.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// With README.md's IMAGE (tenure:dev) the manifest applied is the file.
	if len(m.cl.applied) != 1 || !bytes.Equal(m.cl.applied[0], workerYAML) {
		t.Errorf("the first deploy applies %d manifests; want kubernetes/worker.yaml, unchanged with README.md's IMAGE", len(m.cl.applied))
	}
	for _, path := range []string{"kubernetes/worker.yaml", "kubernetes/servicemonitor.yaml"} {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		o, err := decodeK8s(path, b)
		if err != nil {
			t.Errorf("not valid Kubernetes objects:\n%v", err)
		}
		m.objs = append(m.objs, o...)
	}
	// The Secrets and the ConfigMap are the first deploy's (kubectl
	// create, from the operator's values).
	m.secrets = map[string]map[string]string{}
	for name, o := range m.cl.secrets {
		m.secrets[name] = map[string]string{}
		for k, v := range o.Data {
			m.secrets[name][k] = string(v)
		}
	}
	m.configMaps = map[string]map[string]bool{}
	for name, o := range m.cl.configMaps {
		m.configMaps[name] = map[string]bool{}
		for k := range o.Data {
			m.configMaps[name][k] = true
		}
	}
	m.sortObjects(t)
	return m
}

// sortObjects finds the one worker Deployment, PodDisruptionBudget,
// Service and ServiceMonitor, and refuses what must not be in a manifest.
func (m *manifests) sortObjects(t *testing.T) {
	t.Helper()
	var (
		deployments []*appsv1.Deployment
		pdbs        []*policyv1.PodDisruptionBudget
		services    []*corev1.Service
		monitors    []*serviceMonitor
	)
	for _, o := range m.objs {
		switch o := o.(type) {
		case *corev1.Secret:
			t.Errorf("Secret/%s is in a manifest: its placeholder values would be applied as they are; the first deploy's commands create it from the operator's", o.Name)
		case *corev1.ConfigMap:
			t.Errorf("ConfigMap/%s is in a manifest: its placeholder values would be applied as they are; the first deploy's commands create it from the operator's", o.Name)
		case *appsv1.Deployment:
			deployments = append(deployments, o)
		case *policyv1.PodDisruptionBudget:
			pdbs = append(pdbs, o)
		case *corev1.Service:
			services = append(services, o)
		case *serviceMonitor:
			monitors = append(monitors, o)
		case *batchv1.Job:
			// A Job's pod template is immutable: applying the same name
			// with a new release's image fails.
			if o.Name != "" {
				t.Errorf("Job/%s: a fixed name cannot be applied again for the next release (Jobs are immutable); use metadata.generateName or the migrate init container", o.Name)
			}
		}
	}
	if len(deployments) != 1 || len(pdbs) != 1 || len(services) != 1 || len(monitors) != 1 {
		t.Fatalf("want one worker Deployment, PodDisruptionBudget, Service and ServiceMonitor; got %d, %d, %d, %d", len(deployments), len(pdbs), len(services), len(monitors))
	}
	m.dep, m.pdb, m.svc, m.sm = deployments[0], pdbs[0], services[0], monitors[0]
	pod := m.dep.Spec.Template.Spec
	for i, c := range pod.InitContainers {
		if len(c.Args) > 0 && c.Args[0] == "migrate" && (len(c.Args) == 1 || c.Args[1] == "up") && c.RestartPolicy == nil {
			m.migrate = &pod.InitContainers[i]
		}
	}
	for i, c := range pod.Containers {
		if len(c.Args) > 0 && c.Args[0] == "worker" {
			m.worker = &pod.Containers[i]
		}
	}
}

// selects says whether sel selects the worker pods.
func (m *manifests) selects(sel *metav1.LabelSelector) bool {
	s, err := metav1.LabelSelectorAsSelector(sel)
	return err == nil && !s.Empty() && s.Matches(labels.Set(m.dep.Spec.Template.Labels))
}

func envOf(c corev1.Container) map[string]corev1.EnvVar {
	m := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		m[e.Name] = e
	}
	return m
}

// dbUser is the user of the database URL e takes from a Secret ("": none).
func (m *manifests) dbUser(e corev1.EnvVar) string {
	if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
		return ""
	}
	u, err := url.Parse(m.secrets[e.ValueFrom.SecretKeyRef.Name][e.ValueFrom.SecretKeyRef.Key])
	if err != nil || u.User == nil {
		return ""
	}
	return u.User.Username()
}

func TestKubernetesManifests(t *testing.T) {
	m := readManifests(t)
	t.Run("Pods", func(t *testing.T) {
		for _, p := range podTemplates(m.objs) {
			m.checkPod(t, p)
		}
	})
	t.Run("Deployment", m.checkDeployment)
	t.Run("Selectors", m.checkSelectors)
	t.Run("Image", func(t *testing.T) {
		// The image is the one README.md builds, and a node that has it (a
		// kind or minikube cluster it was loaded into) runs it: with a
		// :latest tag and no policy, Kubernetes pulls Always.
		tag := builtTag(t)
		for _, p := range podTemplates(m.objs) {
			for _, c := range append(append([]corev1.Container{}, p.spec.InitContainers...), p.spec.Containers...) {
				if c.Image != tag {
					t.Errorf("%s container %s: image %q, want %q, the tag README.md builds", p.where, c.Name, c.Image, tag)
				}
				if c.ImagePullPolicy != corev1.PullIfNotPresent {
					t.Errorf("%s container %s: imagePullPolicy %q, want IfNotPresent (a locally built image is in no registry)", p.where, c.Name, c.ImagePullPolicy)
				}
			}
		}
	})
	t.Run("Roles", func(t *testing.T) {
		if m.migrate == nil || m.worker == nil {
			t.Skip("no migrating init container or no worker (Deployment says which)")
		}
		m.checkRoles(t)
	})
	t.Run("Rollout", func(t *testing.T) {
		// Every rollout the first deploy waits for is of a Deployment it
		// applies.
		if len(m.cl.rollouts) == 0 {
			t.Error("the first deploy does not wait for the rollout (kubectl rollout status)")
		}
		for _, r := range m.cl.rollouts {
			if r != "deployment/"+m.dep.Name {
				t.Errorf("the first deploy waits for %s; the Deployment is %s", r, m.dep.Name)
			}
		}
	})
	t.Run("NamesTable", func(t *testing.T) {
		checkNamesTable(t, namesTable(t, m.doc.section), m.objs, m.cl, parseBootstrap(t, heredoc(t, m.doc.commands)))
	})
}

// checkPod checks a pod template: the "restricted" Pod Security level, its
// volumes and its containers.
func (m *manifests) checkPod(t *testing.T, p podTemplate) {
	if v := restrictedViolations(t, &p.meta, &p.spec); len(v) > 0 {
		t.Errorf("%s: the %q Pod Security level (latest) refuses its pods:\n  %s", p.where, psaapi.LevelRestricted, strings.Join(v, "\n  "))
	}
	psc := p.spec.SecurityContext
	if psc == nil {
		psc = &corev1.PodSecurityContext{}
	}
	m.checkVolumes(t, p, psc)
	for i, c := range append(append([]corev1.Container{}, p.spec.InitContainers...), p.spec.Containers...) {
		m.checkContainer(t, p, psc, c, i < len(p.spec.InitContainers))
	}
}

// checkVolumes: volumes hold keys the first deploy defines; a secret
// readable by its group only needs the image's group as fsGroup.
func (m *manifests) checkVolumes(t *testing.T, p podTemplate, psc *corev1.PodSecurityContext) {
	for _, v := range p.spec.Volumes {
		var keys map[string]bool
		var items []corev1.KeyToPath
		var mode *int32
		switch {
		case v.Secret != nil:
			if s := m.secrets[v.Secret.SecretName]; s != nil {
				keys = map[string]bool{}
				for k := range s {
					keys[k] = true
				}
			}
			items, mode = v.Secret.Items, v.Secret.DefaultMode
		case v.ConfigMap != nil:
			keys, items, mode = m.configMaps[v.ConfigMap.Name], v.ConfigMap.Items, v.ConfigMap.DefaultMode
		default:
			continue
		}
		if keys == nil {
			t.Errorf("%s: volume %s refers to a Secret or ConfigMap this file does not define", p.where, v.Name)
		}
		for _, it := range items {
			if keys != nil && !keys[it.Key] {
				t.Errorf("%s: volume %s refers to key %s, which its Secret or ConfigMap lacks", p.where, v.Name, it.Key)
			}
		}
		if mode != nil && *mode&0o004 == 0 && (psc.FSGroup == nil || *psc.FSGroup != m.gid) {
			t.Errorf("%s: volume %s (mode %#o) is readable by its group only, and the pod's fsGroup is not the image's group %d", p.where, v.Name, *mode, m.gid)
		}
	}
}

// checkContainer checks how a container runs tenure: its arguments and
// variables, where its credentials and files come from, its user, root
// filesystem and resources; a worker's, what a worker needs besides.
func (m *manifests) checkContainer(t *testing.T, p podTemplate, psc *corev1.PodSecurityContext, c corev1.Container, init bool) {
	where := p.where + " container " + c.Name
	if len(c.Command) > 0 {
		t.Errorf("%s: command %v replaces the image's entrypoint; pass args to tenure", where, c.Command)
	}
	if len(c.Args) == 0 {
		t.Errorf("%s: no args", where)
		return
	}
	// The flags and variables are the command's; credentials
	// come from Secrets and files from volumes.
	env := map[string]string{}
	var vars []string
	dbURL := ""
	for _, e := range c.Env {
		vars = append(vars, e.Name)
		env[e.Name] = e.Value
		if strings.Contains(e.Name, "PASSWORD") && !strings.HasSuffix(e.Name, "_FILE") {
			t.Errorf("%s: %s is in the environment; mount it as a file (--sasl-password-file)", where, e.Name)
		}
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			ref := e.ValueFrom.SecretKeyRef
			v, ok := m.secrets[ref.Name][ref.Key]
			if !ok {
				t.Errorf("%s: %s refers to secret %s key %s, which this file does not define", where, e.Name, ref.Name, ref.Key)
			}
			if e.Name == "TENURE_DATABASE_URL" {
				dbURL = v
			}
		} else if e.Name == "TENURE_DATABASE_URL" {
			t.Errorf("%s: the database URL (and its password) must come from a Secret", where)
		}
	}
	checkCommand(t, m.bin, where, c.Args, vars)
	mounted := func(file string) bool {
		for _, m := range c.VolumeMounts {
			if strings.HasPrefix(file, m.MountPath+"/") {
				return true
			}
		}
		return false
	}
	for name, v := range env {
		if strings.HasSuffix(name, "_FILE") && !mounted(v) {
			t.Errorf("%s: %s=%s is not under a mounted volume", where, name, v)
		}
	}
	if u, err := url.Parse(dbURL); err == nil && u.Query().Get("sslrootcert") != "" && !mounted(u.Query().Get("sslrootcert")) {
		t.Errorf("%s: the database URL's sslrootcert %s is not under a mounted volume", where, u.Query().Get("sslrootcert"))
	}
	m.checkSecurity(t, where, psc, c)
	if c.Args[0] != "worker" {
		return
	}
	if init {
		t.Errorf("%s: the worker is an init container", where)
	}
	m.checkWorker(t, p, where, c, env, vars)
}

// checkSecurity checks, beyond "restricted", the image's user, a read-only
// root, resources.
func (m *manifests) checkSecurity(t *testing.T, where string, psc *corev1.PodSecurityContext, c corev1.Container) {
	csc := c.SecurityContext
	if csc == nil {
		csc = &corev1.SecurityContext{}
	}
	for _, id := range []struct {
		name     string
		pod, ctr *int64
		want     int64
	}{{"runAsUser", psc.RunAsUser, csc.RunAsUser, m.uid}, {"runAsGroup", psc.RunAsGroup, csc.RunAsGroup, m.gid}} {
		got := id.pod
		if id.ctr != nil {
			got = id.ctr
		}
		if got == nil || *got != id.want {
			t.Errorf("%s: %s is not %d, the image's USER (Dockerfile)", where, id.name, id.want)
		}
	}
	if csc.ReadOnlyRootFilesystem == nil || !*csc.ReadOnlyRootFilesystem {
		t.Errorf("%s: no readOnlyRootFilesystem: true", where)
	}
	req, lim := c.Resources.Requests, c.Resources.Limits
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if _, ok := req[r]; !ok {
			t.Errorf("%s: no %s request", where, r)
		}
	}
	if l, ok := lim[corev1.ResourceMemory]; !ok {
		t.Errorf("%s: no memory limit", where)
	} else if l.Cmp(req[corev1.ResourceMemory]) < 0 {
		t.Errorf("%s: memory limit %s below its request %s", where, l.String(), req.Memory().String())
	}
}

// checkWorker: the worker is a main container, its probes on its HTTP
// port, a grace period above a graceful stop, no static membership,
// memory for a backlog.
func (m *manifests) checkWorker(t *testing.T, p podTemplate, where string, c corev1.Container, env map[string]string, vars []string) {
	req, lim := c.Resources.Requests, c.Resources.Limits
	port := httpPort(t, env["TENURE_HTTP_ADDR"])
	portName := ""
	for _, cp := range c.Ports {
		if strconv.Itoa(int(cp.ContainerPort)) == port {
			portName = cp.Name
		}
	}
	if portName == "" {
		t.Errorf("%s: no container port %s (TENURE_HTTP_ADDR)", where, port)
	}
	for _, pr := range []struct {
		name, path string
		probe      *corev1.Probe
	}{{"readinessProbe", "/readyz", c.ReadinessProbe}, {"livenessProbe", "/healthz", c.LivenessProbe}} {
		if pr.probe == nil || pr.probe.HTTPGet == nil {
			t.Errorf("%s: no %s on %s", where, pr.name, pr.path)
			continue
		}
		if got := pr.probe.HTTPGet.Path; got != pr.path {
			t.Errorf("%s: %s path %q, want %s", where, pr.name, got, pr.path)
		}
		if got := pr.probe.HTTPGet.Port.String(); got != portName && got != port {
			t.Errorf("%s: %s port %q, want %s", where, pr.name, got, portName)
		}
	}
	grace := int64(0)
	if p.spec.TerminationGracePeriodSeconds != nil {
		grace = *p.spec.TerminationGracePeriodSeconds
	}
	if stop := gracefulStop(t, m.bin, env["TENURE_SHUTDOWN_TIMEOUT"]); time.Duration(grace)*time.Second < stop+5*time.Second {
		t.Errorf("%s: terminationGracePeriodSeconds %d does not cover a graceful stop (%s) and a margin", where, grace, stop)
	}
	for _, v := range vars {
		if strings.Contains(v, "INSTANCE") {
			t.Errorf("%s: static membership (%s) must not be configured", where, v)
		}
	}
	if r := req[corev1.ResourceMemory]; r.Cmp(*workerDrainPeak) < 0 {
		t.Errorf("%s: memory request %s is below a worker's peak draining a backlog (%s)", where, r.String(), workerDrainPeak)
	}
	if l := lim[corev1.ResourceMemory]; l.Cmp(*workerLargestPeak) < 0 {
		t.Errorf("%s: memory limit %s is below the largest measured peak (%s)", where, l.String(), workerLargestPeak)
	}
}

// checkDeployment: the schema is migrated before the workers start, a
// rollout keeps the old workers until the new ones run, the replicas
// spread.
func (m *manifests) checkDeployment(t *testing.T) {
	dep, pod := m.dep, m.dep.Spec.Template.Spec
	// The schema is migrated before a worker starts: an init container
	// (not a sidecar) runs `tenure migrate up` as the schema's owner; the
	// worker, under its own role, does not migrate.
	switch {
	case m.worker == nil:
		t.Errorf("Deployment/%s runs no worker", dep.Name)
	case m.migrate == nil:
		t.Errorf("Deployment/%s: no init container runs `tenure migrate up`: nothing migrates the schema before the workers start", dep.Name)
	default:
		me, we := envOf(*m.migrate), envOf(*m.worker)
		if me["TENURE_SCHEMA"].Value != we["TENURE_SCHEMA"].Value {
			t.Errorf("Deployment/%s: the init container migrates schema %q, the worker uses %q", dep.Name, me["TENURE_SCHEMA"].Value, we["TENURE_SCHEMA"].Value)
		}
		if mu, wu := m.dbUser(me["TENURE_DATABASE_URL"]), m.dbUser(we["TENURE_DATABASE_URL"]); mu == "" || mu == wu {
			t.Errorf("Deployment/%s: the migration connects as %q, the worker as %q: want the schema's owner and the workers' least-privilege role", dep.Name, mu, wu)
		}
		if v, _ := strconv.ParseBool(we["TENURE_NO_MIGRATE"].Value); !v {
			t.Errorf("Deployment/%s: the worker would migrate a schema that is behind, under a role that may not (set TENURE_NO_MIGRATE=true)", dep.Name)
		}
	}
	// A rollout stops at a pod whose migration fails, with the old workers
	// still running.
	if s := dep.Spec.Strategy.RollingUpdate; s == nil || s.MaxUnavailable == nil || s.MaxUnavailable.IntValue() != 0 {
		t.Errorf("Deployment/%s: want a rolling update with maxUnavailable 0", dep.Name)
	}

	// The replicas spread over nodes and, where the cluster has them,
	// zones.
	spread := map[string]corev1.TopologySpreadConstraint{}
	for _, c := range pod.TopologySpreadConstraints {
		if !m.selects(c.LabelSelector) {
			t.Errorf("Deployment/%s: the topology spread constraint on %s does not select the workers", dep.Name, c.TopologyKey)
		}
		spread[c.TopologyKey] = c
	}
	if _, ok := spread[corev1.LabelHostname]; !ok {
		t.Errorf("Deployment/%s: the replicas are not spread over nodes (%s)", dep.Name, corev1.LabelHostname)
	}
	if c, ok := spread[corev1.LabelTopologyZone]; !ok {
		t.Errorf("Deployment/%s: the replicas are not spread over zones (%s)", dep.Name, corev1.LabelTopologyZone)
	} else if c.WhenUnsatisfiable != corev1.ScheduleAnyway {
		t.Errorf("Deployment/%s: spreading over zones is %s: in a cluster with fewer zones than replicas some would never run; want ScheduleAnyway", dep.Name, c.WhenUnsatisfiable)
	}
}

// checkSelectors: the PodDisruptionBudget, the Service and the
// ServiceMonitor select the workers, and a Prometheus the ServiceMonitor.
func (m *manifests) checkSelectors(t *testing.T) {
	if pdb := m.pdb; !m.selects(pdb.Spec.Selector) || pdb.Spec.MaxUnavailable == nil {
		t.Errorf("PodDisruptionBudget/%s does not select the workers with a maxUnavailable", pdb.Name)
	}
	svc, sm := m.svc, m.sm
	if len(svc.Spec.Selector) == 0 || !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(m.dep.Spec.Template.Labels)) || len(svc.Spec.Ports) == 0 || svc.Spec.Ports[0].TargetPort.String() != "http" {
		t.Errorf("Service/%s does not reach the workers' http port", svc.Name)
	}
	if s, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector); err != nil || s.Empty() || !s.Matches(labels.Set(svc.Labels)) {
		t.Errorf("ServiceMonitor/%s does not select Service/%s", sm.Name, svc.Name)
	}
	if len(sm.Spec.Endpoints) == 0 || sm.Spec.Endpoints[0].Path != "/metrics" || sm.Spec.Endpoints[0].Port != svc.Spec.Ports[0].Name {
		t.Errorf("ServiceMonitor/%s does not scrape /metrics on the Service's http port", sm.Name)
	}

	// A Prometheus selects the ServiceMonitor: kube-prometheus-stack's
	// default serviceMonitorSelector is release: <Helm release name>
	// (its templates/prometheus/prometheus.yaml), here the release
	// README.md names.
	if !labels.SelectorFromSet(labels.Set{"release": "kube-prometheus-stack"}).Matches(labels.Set(sm.Labels)) {
		t.Errorf("ServiceMonitor/%s has labels %v: kube-prometheus-stack's default selector (release: kube-prometheus-stack) does not select it", sm.Name, sm.Labels)
	}
}

// The roles: the init container grants them after migrating, as the
// owner; the administrator's script creates the roles the Secret's
// URLs log in as, with LOGIN and the passwords the URLs carry, and the
// admin role the grants name (the owner may not create roles); the
// URLs' database is one the owner may create schemas in.
func (m *manifests) checkRoles(t *testing.T) {
	if !slices.Contains(m.migrate.Args, "--grant-roles") {
		t.Errorf("Deployment/%s: the init container migrates without --grant-roles: nothing grants the workers' role its rights on the tables", m.dep.Name)
	}
	boot := parseBootstrap(t, heredoc(t, m.doc.commands))
	vars := map[string]string{}
	for i, a := range m.run.psqlArgs {
		if a == "-v" && i+1 < len(m.run.psqlArgs) {
			k, v, _ := strings.Cut(m.run.psqlArgs[i+1], "=")
			vars[k] = v
		}
	}
	if m.run.psqlStdin != heredoc(t, m.doc.commands)+"\n" {
		t.Errorf("psql did not receive the administrator's script on its standard input:\n%s", m.run.psqlStdin)
	}
	if vars["ON_ERROR_STOP"] != "1" {
		t.Error("psql runs the administrator's script without -v ON_ERROR_STOP=1: a failing statement would not stop it")
	}
	roleFlag := func(flag string) string {
		for i, a := range m.migrate.Args {
			if v, ok := strings.CutPrefix(a, "--"+flag+"="); ok {
				return v
			}
			if a == "--"+flag && i+1 < len(m.migrate.Args) {
				return m.migrate.Args[i+1]
			}
		}
		m := regexp.MustCompile(`\n  --` + flag + ` R\n[^\n]*\(default (\w+)\)`).FindStringSubmatch(help(t, m.bin, []string{"migrate"}))
		if m == nil {
			t.Fatalf("tenure migrate --help shows no default for --%s", flag)
		}
		return m[1]
	}
	workerRole, adminRole := roleFlag("worker-role"), roleFlag("admin-role")
	if _, ok := boot.roles[adminRole]; !ok {
		t.Errorf("the administrator's script does not create role %s: --grant-roles would, and the owner may not create roles", adminRole)
	}
	owner := ""
	for _, c := range []struct {
		name string
		e    corev1.EnvVar
	}{{"migrate", envOf(*m.migrate)["TENURE_DATABASE_URL"]}, {"worker", envOf(*m.worker)["TENURE_DATABASE_URL"]}} {
		if c.e.ValueFrom == nil || c.e.ValueFrom.SecretKeyRef == nil {
			continue // reported above
		}
		ref := c.e.ValueFrom.SecretKeyRef
		u, err := url.Parse(m.secrets[ref.Name][ref.Key])
		if err != nil || u.User == nil {
			t.Errorf("Secret %s key %s: not a database URL with a user: %v", ref.Name, ref.Key, err)
			continue
		}
		user := u.User.Username()
		pw, _ := u.User.Password()
		if login, ok := boot.roles[user]; !ok || !login {
			t.Errorf("container %s logs in as %s, which the administrator's script does not create with LOGIN", c.name, user)
		} else if v := boot.passwords[user]; vars[v] == "" || vars[v] != pw {
			t.Errorf("container %s: the password of %s in Secret %s is not the one the administrator's script sets (psql -v %s)", c.name, user, ref.Name, v)
		}
		db := strings.TrimPrefix(u.Path, "/")
		if !slices.Contains(boot.databases, db) {
			t.Errorf("container %s: database %q is not one the administrator's script creates (%v)", c.name, db, boot.databases)
		}
		if c.name == "migrate" {
			owner = user
			if !slices.Contains(boot.creators[db], user) {
				t.Errorf("the owner %s may not create schemas in database %s (GRANT CREATE ON DATABASE)", user, db)
			}
		} else if user != workerRole {
			t.Errorf("the worker logs in as %s; the init container grants %s (--worker-role)", user, workerRole)
		}
	}
	if owner == workerRole || owner == adminRole {
		t.Errorf("the owner %s is also a role the grants are for", owner)
	}
}

// The checks above can fail: the evaluator names each fault the manifest
// once had (no seccomp profile, capabilities kept, a container without a
// security context, ...), and the decoder refuses a misspelt field.
func TestManifestChecksCatchFaults(t *testing.T) {
	b, objs := readK8s(t, "kubernetes/worker.yaml")
	var pod *podTemplate
	for _, p := range podTemplates(objs) {
		if strings.HasPrefix(p.where, "Deployment/") {
			pod = &p
		}
	}
	if pod == nil || len(pod.spec.InitContainers) == 0 || len(pod.spec.Containers) == 0 {
		t.Fatal("worker.yaml: no Deployment with an init container and a container")
	}
	if v := restrictedViolations(t, &pod.meta, &pod.spec); len(v) > 0 {
		t.Fatalf("%s: %v", pod.where, v)
	}
	for _, f := range []struct {
		fault, want string
		change      func(*corev1.PodSpec)
	}{
		{"no seccomp profile", "seccompProfile", func(s *corev1.PodSpec) { s.SecurityContext.SeccompProfile = nil }},
		{"the worker keeps its capabilities", "unrestricted capabilities", func(s *corev1.PodSpec) { s.Containers[0].SecurityContext.Capabilities = nil }},
		{"the init container has no security context", "allowPrivilegeEscalation != false", func(s *corev1.PodSpec) { s.InitContainers[0].SecurityContext = nil }},
		{"root is not refused", "runAsNonRoot != true", func(s *corev1.PodSpec) { s.SecurityContext.RunAsNonRoot = nil }},
		{"runs as root", "runAsUser=0", func(s *corev1.PodSpec) { s.SecurityContext.RunAsUser = new(int64) }},
		{"a host path", "restricted volume types", func(s *corev1.PodSpec) {
			s.Volumes = append(s.Volumes, corev1.Volume{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}})
		}},
	} {
		spec := pod.spec.DeepCopy()
		f.change(spec)
		v := restrictedViolations(t, &pod.meta, spec)
		if !strings.Contains(strings.Join(v, "\n"), f.want) {
			t.Errorf("%s: the evaluator said %q, want %q", f.fault, v, f.want)
		}
	}
	bad := bytes.Replace(b, []byte("readOnlyRootFilesystem:"), []byte("readOnlyRootFileSystem:"), 1)
	if _, err := decodeK8s("worker.yaml", bad); err == nil || !strings.Contains(err.Error(), `unknown field "spec.template.spec.initContainers[0].securityContext.readOnlyRootFileSystem"`) {
		t.Errorf("a misspelt field decodes: %v", err)
	}
	bad = bytes.Replace(b, []byte("memory: 160Mi"), []byte("memory: 160MB!"), 1)
	if _, err := decodeK8s("worker.yaml", bad); err == nil {
		t.Error("a quantity that does not parse decodes")
	}
}

func TestComposeFile(t *testing.T) {
	bin := tenureBin(t)
	uid, gid := imageUser(t)
	d := docs(t, "compose/compose.yaml")
	if len(d) != 1 {
		t.Fatalf("compose.yaml has %d documents", len(d))
	}
	services, _ := d[0]["services"].(map[string]any)
	for _, name := range []string{"kafka", "postgres", "topic", "migrate", "worker", "serve", "cli"} {
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
	t.Run("TenureServices", func(t *testing.T) {
		for name, s := range services {
			if str(get(s, "image")) == "tenure:dev" {
				checkComposeService(t, bin, uid, gid, string(dockerfile), name, s)
			}
		}
	})
	servePort := httpPort(t, str(get(services, "serve", "environment", "TENURE_HTTP_ADDR")))
	t.Run("Ports", func(t *testing.T) {
		// The host reaches each worker's HTTP port (/metrics) and the
		// ownership page, on loopback only (neither has authentication). The
		// workers' host ports are Docker's to pick: a fixed one would clash
		// between replicas, and Compose does not spread a range over them.
		workerPort := httpPort(t, str(get(services, "worker", "environment", "TENURE_HTTP_ADDR")))
		if ports, _ := get(services, "worker", "ports").([]any); len(ports) != 1 {
			t.Errorf("worker: publishes %d ports, want its HTTP port", len(ports))
		} else if str(get(ports[0], "target")) != workerPort || str(get(ports[0], "host_ip")) != "127.0.0.1" || get(ports[0], "published") != nil {
			t.Errorf("worker: publishes %v; want target %s on host_ip 127.0.0.1 with no fixed published port", ports[0], workerPort)
		}
		serveCmd := strs(get(services, "serve", "command"))
		if len(serveCmd) < 2 || serveCmd[0] != "admin" || serveCmd[1] != "serve" || !slices.Contains(serveCmd, "--listen-any") {
			t.Errorf("serve: command %v, want admin serve --listen-any (the page listens on every interface of its container)", serveCmd)
		}
		if ports := strs(get(services, "serve", "ports")); len(ports) != 1 || ports[0] != "127.0.0.1:"+servePort+":"+servePort {
			t.Errorf("serve: publishes %v, want 127.0.0.1:%s:%s", ports, servePort, servePort)
		}
	})
	t.Run("READMEAndTopic", func(t *testing.T) {
		readme, err := os.ReadFile("compose/README.md")
		if err != nil {
			t.Fatal(err)
		}
		// The README's alias: -T, so that `produce --input -` reads the pipe.
		alias := regexp.MustCompile(`alias tenure='([^']*)'`).FindSubmatch(readme)
		if alias == nil || !strings.HasSuffix(string(alias[1]), " run --rm -T cli") {
			t.Errorf("compose/README.md's alias %q: want docker compose ... run --rm -T cli", bytes.Join(alias, nil))
		}
		if !strings.Contains(string(readme), "http://127.0.0.1:"+servePort+"/") {
			t.Errorf("compose/README.md does not give the ownership page's address, http://127.0.0.1:%s/", servePort)
		}

		// The one-shot topic step can run again (restart: on-failure, a second
		// `up`): it must succeed when the topic exists.
		if !strings.Contains(strings.Join(strs(get(services, "topic", "command")), " "), "--if-not-exists") {
			t.Error("the topic step fails on a second run without --if-not-exists")
		}
	})
}

// checkComposeService checks a service that runs the tenure image: how it
// is built and confined (as on Kubernetes), and its command's variables;
// the cli's, for every command that talks to both; the worker's, its
// stop, health check, replicas and dependencies.
func checkComposeService(t *testing.T, bin string, uid, gid int64, dockerfile, name string, s any) {
	if str(get(s, "build", "dockerfile")) != "deploy/Dockerfile" || str(get(s, "build", "context")) != "../.." {
		t.Errorf("%s: does not build deploy/Dockerfile from the repository root", name)
	}
	// As on Kubernetes: the image's numeric user, a read-only root,
	// no capabilities, no privilege escalation.
	if u := str(get(s, "user")); u != fmt.Sprintf("%d:%d", uid, gid) {
		t.Errorf("%s: user %q, want the image's %d:%d", name, u, uid, gid)
	}
	if ro, _ := get(s, "read_only").(bool); !ro {
		t.Errorf("%s: no read_only: true", name)
	}
	if c := strs(get(s, "cap_drop")); len(c) != 1 || c[0] != "ALL" {
		t.Errorf("%s: cap_drop %v, want [ALL]", name, c)
	}
	if o := strs(get(s, "security_opt")); !slices.Contains(o, "no-new-privileges:true") {
		t.Errorf("%s: security_opt %v lacks no-new-privileges:true", name, o)
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
		return
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
	if name == "worker" {
		checkComposeWorker(t, bin, dockerfile, s, env)
	}
}

func checkComposeWorker(t *testing.T, bin, dockerfile string, s any, env map[string]any) {
	stop := gracefulStop(t, bin, str(env["TENURE_SHUTDOWN_TIMEOUT"]))
	grace, err := time.ParseDuration(str(get(s, "stop_grace_period")))
	if err != nil || grace < stop+5*time.Second {
		t.Errorf("worker: stop_grace_period %v does not cover a graceful stop (%s) and a margin", get(s, "stop_grace_period"), stop)
	}
	test := strs(get(s, "healthcheck", "test"))
	port := httpPort(t, str(env["TENURE_HTTP_ADDR"]))
	if len(test) != 4 || test[0] != "CMD" || test[2] != "probe" || test[3] != "http://127.0.0.1:"+port+"/readyz" {
		t.Errorf("worker: health check %v, want CMD <tenure> probe http://127.0.0.1:%s/readyz", test, port)
	} else if !strings.Contains(dockerfile, "/out/tenure "+test[1]) {
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

func TestDockerfileBuildsTheCommand(t *testing.T) {
	b, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, want := range []string{"./cmd/tenure", "FROM golang:1.26", "ENTRYPOINT", "distroless/static-debian12:nonroot"} {
		if !strings.Contains(s, want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
	// distroless's nonroot user, by number.
	if uid, gid := imageUser(t); uid != 65532 || gid != 65532 {
		t.Errorf("Dockerfile: USER %d:%d, want 65532:65532 (distroless's nonroot)", uid, gid)
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
