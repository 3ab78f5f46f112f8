package deploy

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/tenure-dev/tenure/internal/devbroker"
	"github.com/tenure-dev/tenure/internal/testinfra/freeport"
	"github.com/tenure-dev/tenure/internal/testinfra/pgtest"
	"github.com/tenure-dev/tenure/internal/testinfra/testcert"
)

// TestFirstDeploy rehearses the first deploy of README.md as an operator
// runs it, top to bottom, against a throwaway PostgreSQL that requires TLS
// (verify-full) and passwords, and a broker that requires TLS and SASL
// SCRAM-SHA-512: the settings are the operator's (the CAs, the SASL
// password file, the servers' addresses, a registry's image reference),
// the commands run as written with the real psql and openssl, and kubectl
// records what it is asked. Then the pods the applied Deployment
// describes run here the way a kubelet would run them: the Secrets and
// the ConfigMap mounted as files with the volumes' modes, owned by the
// pod's fsGroup, the variables resolved from their sources, the image's
// entrypoint with the containers' args, as the pod's uid and gid when the
// test runs as root; every replica's init container at once, then the
// workers. The only edits are the operator's: TENURE_BROKERS (the
// manifest's names the operator's brokers) and TENURE_HTTP_ADDR (a free
// port: the replicas share this machine). It passes when every init
// container succeeds, every worker becomes ready and the jobs produced are
// committed, and the workers stop gracefully.
func TestFirstDeploy(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a PostgreSQL cluster and a broker")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	bin := tenureBin(t)
	doc := readFirstDeploy(t)
	fileDep, fileEnv := rehearsalManifest(t)

	// PostgreSQL: TLS with a certificate for 127.0.0.1 from the operator's
	// CA, passwords (SCRAM) for every role but the test's superuser.
	files := t.TempDir()
	pg, pgCA := rehearsalPostgres(t, ctx, files)

	// Kafka: TLS from the operator's Kafka CA, SASL SCRAM-SHA-512 for the
	// manifest's user, the manifest's topic with a partition per replica.
	const saslPassword = "sasl-pw-rehearsal-5d1e"
	replicas := int32(1)
	if fileDep.Spec.Replicas != nil {
		replicas = *fileDep.Spec.Replicas
	}
	topic := fileEnv["TENURE_TOPIC"]
	br, kcl, kCA := rehearsalKafka(t, ctx, files, fileEnv["TENURE_SASL_USERNAME"], saslPassword, topic, replicas)

	// The operator's settings, and the commands as written.
	passwordFile := filepath.Join(files, "kafka-password.txt")
	if err := os.WriteFile(passwordFile, []byte(saslPassword+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const image = "registry.example.com/team/tenure:rehearsal"
	settings := map[string]string{
		"IMAGE":          image,
		"ADMIN_URL":      fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=verify-full&sslrootcert=%s", pg.Port, pgCA.File),
		"DB_HOST":        fmt.Sprintf("127.0.0.1:%d", pg.Port),
		"POSTGRES_CA":    pgCA.File,
		"KAFKA_CA":       kCA.File,
		"KAFKA_PASSWORD": passwordFile,
	}
	for _, name := range doc.settingNames() {
		if _, ok := settings[name]; !ok {
			t.Fatalf("README.md's settings have %s, which this rehearsal does not set: add it", name)
		}
	}
	run := runFirstDeploy(t, doc, settings, true)
	t.Logf("the first deploy's commands printed:\n%s", run.output)
	cl := replay(t, run.calls)
	dep := appliedDeployment(t, cl, image)
	spec := dep.Spec.Template.Spec

	// The pods. The binary and the pods' files must be reachable by the
	// pod's user.
	asRoot := os.Geteuid() == 0
	if !asRoot {
		t.Log("not root: the pods run as this test's user, not the manifest's uid, gid and fsGroup")
	}
	podBin := podBinary(t, bin)
	pods := make([]*pod, replicas)
	for i := range pods {
		pods[i] = newPod(t, fmt.Sprintf("%s-7d4b9c-%d", dep.Name, i), dep, cl, podBin, asRoot)
		pods[i].override = map[string]string{"TENURE_BROKERS": strings.Join(br.ListenAddrs(), ",")}
	}

	// Every replica's init containers at once, as a Deployment's new pods
	// start: one migrates, the others wait for its lock and find the
	// schema current; each grants.
	runInitContainers(t, ctx, pods)

	// The workers, as tenure_worker: every one becomes ready.
	for _, p := range pods {
		p.startWorker(t)
	}
	deadline := time.Now().Add(90 * time.Second)
	for _, p := range pods {
		if err := p.waitReady(deadline); err != nil {
			t.Fatalf("pod %s: %v\n%s", p.name, err, p.logs())
		}
	}

	// Jobs produced are committed: the workers write as the worker role.
	waitJobsCommitted(t, ctx, kcl, pg, fileEnv["TENURE_SCHEMA"], topic, pods)

	// A graceful stop, within the pod's grace period.
	grace := 30 * time.Second
	if spec.TerminationGracePeriodSeconds != nil {
		grace = time.Duration(*spec.TerminationGracePeriodSeconds) * time.Second
	}
	for _, p := range pods {
		if err := p.stop(grace); err != nil {
			t.Errorf("pod %s: %v\n%s", p.name, err, p.logs())
		}
	}

	// An upgrade's new pod: the schema is current, the grants run again.
	if out, err := runInit(ctx, newPod(t, dep.Name+"-upgrade", dep, cl, podBin, asRoot).initCommands(t)); err != nil || !strings.Contains(out, "is up to date") || !strings.Contains(out, "granted ") {
		t.Errorf("an upgrade's init container: %v\n%s", err, out)
	}
}

// appliedDeployment is the Deployment of the one manifest the first
// deploy applied, every container of which runs the operator's image.
func appliedDeployment(t *testing.T, cl cluster, image string) *appsv1.Deployment {
	t.Helper()
	if len(cl.applied) != 1 {
		t.Fatalf("the first deploy applied %d manifests, want 1", len(cl.applied))
	}
	applied, err := decodeK8s("the applied manifest", cl.applied[0])
	if err != nil {
		t.Fatal(err)
	}
	dep := deploymentIn(t, "the applied manifest", applied)
	spec := dep.Spec.Template.Spec
	for _, c := range append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...) {
		if c.Image != image {
			t.Errorf("container %s runs %s, not the operator's IMAGE %s", c.Name, c.Image, image)
		}
	}
	return dep
}

// deploymentIn is the last Deployment among objs, decoded from what; the
// test fails if there is none.
func deploymentIn(t *testing.T, what string, objs []any) *appsv1.Deployment {
	t.Helper()
	var dep *appsv1.Deployment
	for _, o := range objs {
		if d, ok := o.(*appsv1.Deployment); ok {
			dep = d
		}
	}
	if dep == nil {
		t.Fatalf("%s has no Deployment", what)
	}
	return dep
}

// podBinary copies bin where every pod's user may run it.
func podBinary(t *testing.T, bin string) string {
	t.Helper()
	podBin := filepath.Join(t.TempDir(), "tenure")
	if b, err := os.ReadFile(bin); err != nil {
		t.Fatal(err)
	} else if err := os.WriteFile(podBin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	openUp(t, filepath.Dir(podBin))
	return podBin
}

// rehearsalManifest is kubernetes/worker.yaml's Deployment as the file
// has it, and its containers' literal variables.
func rehearsalManifest(t *testing.T) (*appsv1.Deployment, map[string]string) {
	t.Helper()
	_, objs := readK8s(t, "kubernetes/worker.yaml")
	fileDep := deploymentIn(t, "kubernetes/worker.yaml", objs)
	fileEnv := map[string]string{}
	for _, c := range fileDep.Spec.Template.Spec.Containers {
		for _, e := range c.Env {
			fileEnv[e.Name] = e.Value
		}
	}
	return fileDep, fileEnv
}

// rehearsalCA makes the operator's CA for a service, name, in files, and
// the service's certificate for 127.0.0.1 from it (name-server).
func rehearsalCA(t *testing.T, files, name string) (*testcert.CA, testcert.Pair) {
	t.Helper()
	ca, err := testcert.NewCA(files, name)
	if err != nil {
		t.Fatal(err)
	}
	return ca, ca.MustServer(t, name+"-server", "127.0.0.1")
}

// rehearsalPostgres starts a throwaway PostgreSQL that requires TLS with a
// certificate for 127.0.0.1 from the operator's CA (made in files), and
// passwords for every role but the test's superuser.
func rehearsalPostgres(t *testing.T, ctx context.Context, files string) (*pgtest.Cluster, *testcert.CA) {
	t.Helper()
	pgCA, pgSrv := rehearsalCA(t, files, "postgres")
	pg := pgtest.Start(t)
	var conf []string
	for _, f := range []struct{ name, src string }{{"server.crt", pgSrv.CertFile}, {"server.key", pgSrv.KeyFile}} {
		b, err := os.ReadFile(f.src)
		if err != nil {
			t.Fatal(err)
		}
		p, err := pg.WriteFile(f.name, b)
		if err != nil {
			t.Fatal(err)
		}
		conf = append(conf, fmt.Sprintf("ssl_%s_file = '%s'", map[string]string{"server.crt": "cert", "server.key": "key"}[f.name], p))
	}
	if err := pg.PrependFile("pg_hba.conf", "host all postgres 127.0.0.1/32 trust\nhostssl all all 127.0.0.1/32 scram-sha-256\nhost all all 127.0.0.1/32 reject"); err != nil {
		t.Fatal(err)
	}
	if err := pg.Reconfigure(ctx, "ssl = on\n"+strings.Join(conf, "\n")); err != nil {
		t.Fatal(err)
	}
	return pg, pgCA
}

// rehearsalKafka starts a broker that requires TLS from the operator's
// Kafka CA (made in files) and SASL SCRAM-SHA-512 for user, with topic at
// a partition per replica, and a client on it.
func rehearsalKafka(t *testing.T, ctx context.Context, files, saslUser, saslPassword, topic string, replicas int32) (*kfake.Cluster, *kgo.Client, *testcert.CA) {
	t.Helper()
	kCA, kSrv := rehearsalCA(t, files, "kafka")
	br, err := devbroker.Start(devbroker.Config{Extra: []kfake.Opt{kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-512", saslUser, saslPassword),
		kfake.TLS(&tls.Config{Certificates: []tls.Certificate{kSrv.TLS}})}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(br.Close)
	kcl, err := kgo.NewClient(kgo.SeedBrokers(br.ListenAddrs()...), kgo.DialTLSConfig(&tls.Config{RootCAs: kCA.Pool()}),
		kgo.SASL(scram.Auth{User: saslUser, Pass: saslPassword}.AsSha512Mechanism()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kcl.Close)
	if _, err := kadm.NewClient(kcl).CreateTopic(ctx, replicas, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	return br, kcl, kCA
}

// runInitContainers runs every pod's init containers at once, and checks
// that they applied each migration once between them and that each
// granted the roles.
func runInitContainers(t *testing.T, ctx context.Context, pods []*pod) {
	t.Helper()
	migrations, _ := filepath.Glob("../sink/migration/*.up.sql")
	outs, errs := make([]string, len(pods)), make([]error, len(pods))
	cmds := make([][]*exec.Cmd, len(pods))
	for i, p := range pods {
		cmds[i] = p.initCommands(t)
	}
	var wg sync.WaitGroup
	for i := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i], errs[i] = runInit(ctx, cmds[i])
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("pod %s: %v\n%s", pods[i].name, err, outs[i])
		}
	}
	all := strings.Join(outs, "")
	if n := strings.Count(all, "applied migration "); n != len(migrations) {
		t.Errorf("the init containers applied %d migrations between them, want %d:\n%s", n, len(migrations), all)
	}
	if n := len(regexp.MustCompile(`(?m)^granted `).FindAllString(all, -1)); n != len(pods) {
		t.Errorf("%d of %d init containers granted the roles:\n%s", n, len(pods), all)
	}
	if strings.Contains(all, "cannot log in") {
		t.Errorf("an init container says a role cannot log in:\n%s", all)
	}
}

// waitJobsCommitted produces 30 jobs to topic and waits until the fencing
// rows of schema say they are committed.
func waitJobsCommitted(t *testing.T, ctx context.Context, kcl *kgo.Client, pg *pgtest.Cluster, schema, topic string, pods []*pod) {
	t.Helper()
	const jobs = 30
	var recs []*kgo.Record
	for i := range jobs {
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte("k" + strconv.Itoa(i%7)), Value: []byte(fmt.Sprintf(`{"seq": %d}`, i))})
	}
	if err := kcl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	admin, err := pgx.Connect(ctx, fmt.Sprintf("postgres://postgres@127.0.0.1:%d/tenure?sslmode=disable", pg.Port))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	var committed int64
	for end := time.Now().Add(time.Minute); time.Now().Before(end) && ctx.Err() == nil; {
		if err := admin.QueryRow(ctx, `SELECT coalesce(sum(next_offset), 0) FROM `+pgx.Identifier{schema, "fences"}.Sanitize()+` WHERE topic = $1`, topic).Scan(&committed); err != nil {
			t.Fatal(err)
		}
		if committed >= jobs {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if committed != jobs {
		for _, p := range pods {
			t.Logf("pod %s:\n%s", p.name, p.logs())
		}
		t.Fatalf("%d of %d jobs committed", committed, jobs)
	}
}

// openUp lets other users through dir and its parent (t.TempDir makes
// both 0700).
func openUp(t *testing.T, dir string) {
	t.Helper()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// pod runs a pod template of a Deployment here: its volumes as files
// under root, its containers as processes of the binary.
type pod struct {
	name     string
	spec     corev1.PodSpec
	cl       cluster
	bin      string
	root     string
	asRoot   bool
	override map[string]string
	addr     string // the worker's HTTP address here

	mu     sync.Mutex
	worker *exec.Cmd
	out    bytes.Buffer
	done   chan error
}

func newPod(t *testing.T, name string, dep *appsv1.Deployment, cl cluster, bin string, asRoot bool) *pod {
	t.Helper()
	p := &pod{name: name, spec: dep.Spec.Template.Spec, cl: cl, bin: bin, root: t.TempDir(), asRoot: asRoot}
	openUp(t, p.root)
	gid := -1
	if fs := p.spec.SecurityContext; fs != nil && fs.FSGroup != nil {
		gid = int(*fs.FSGroup)
	}
	// The kubelet writes a Secret or ConfigMap volume's keys (or its
	// items) as files with the volume's mode (0644 by default), owned by
	// the pod's fsGroup.
	for _, v := range p.spec.Volumes {
		var data map[string][]byte
		var items []corev1.KeyToPath
		mode := int32(0o644)
		switch {
		case v.Secret != nil:
			s := cl.secrets[v.Secret.SecretName]
			if s == nil {
				t.Fatalf("volume %s: the first deploy created no Secret %s", v.Name, v.Secret.SecretName)
			}
			data, items = s.Data, v.Secret.Items
			if v.Secret.DefaultMode != nil {
				mode = *v.Secret.DefaultMode
			}
		case v.ConfigMap != nil:
			c := cl.configMaps[v.ConfigMap.Name]
			if c == nil {
				t.Fatalf("volume %s: the first deploy created no ConfigMap %s", v.Name, v.ConfigMap.Name)
			}
			data = map[string][]byte{}
			for k, s := range c.Data {
				data[k] = []byte(s)
			}
			items = v.ConfigMap.Items
			if v.ConfigMap.DefaultMode != nil {
				mode = *v.ConfigMap.DefaultMode
			}
		default:
			t.Fatalf("volume %s: this rehearsal knows Secret and ConfigMap volumes only", v.Name)
		}
		if items == nil {
			for k := range data {
				items = append(items, corev1.KeyToPath{Key: k, Path: k})
			}
		}
		dir := filepath.Join(p.root, "volumes", v.Name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, it := range items {
			b, ok := data[it.Key]
			if !ok {
				t.Fatalf("volume %s: no key %s", v.Name, it.Key)
			}
			f := filepath.Join(dir, it.Path)
			m := mode
			if it.Mode != nil {
				m = *it.Mode
			}
			if err := os.WriteFile(f, b, os.FileMode(m)); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(f, os.FileMode(m)); err != nil {
				t.Fatal(err)
			}
			if asRoot && gid >= 0 {
				if err := os.Chown(f, 0, gid); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	return p
}

// env is a container's environment as the kubelet gives it, its mount
// paths moved under the pod's root; and the mount paths it translated.
func (p *pod) env(t *testing.T, c corev1.Container) []string {
	t.Helper()
	move := func(v string) string {
		for _, m := range c.VolumeMounts {
			v = strings.ReplaceAll(v, m.MountPath+"/", filepath.Join(p.root, "volumes", m.Name)+"/")
		}
		return v
	}
	var out []string
	for _, e := range c.Env {
		v := e.Value
		switch {
		case e.ValueFrom == nil:
		case e.ValueFrom.SecretKeyRef != nil:
			r := e.ValueFrom.SecretKeyRef
			s := p.cl.secrets[r.Name]
			if s == nil || s.Data[r.Key] == nil {
				t.Fatalf("container %s: %s refers to Secret %s key %s, which the first deploy did not create", c.Name, e.Name, r.Name, r.Key)
			}
			v = string(s.Data[r.Key])
		case e.ValueFrom.ConfigMapKeyRef != nil:
			r := e.ValueFrom.ConfigMapKeyRef
			cm := p.cl.configMaps[r.Name]
			if cm == nil {
				t.Fatalf("container %s: %s refers to ConfigMap %s, which the first deploy did not create", c.Name, e.Name, r.Name)
			}
			v = cm.Data[r.Key]
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
			v = p.name
		default:
			t.Fatalf("container %s: %s: this rehearsal does not know its source", c.Name, e.Name)
		}
		if o, ok := p.override[e.Name]; ok {
			v = o
		}
		out = append(out, e.Name+"="+move(v))
	}
	return out
}

func (p *pod) command(t *testing.T, c corev1.Container) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(p.bin, c.Args...)
	cmd.Env = append(p.env(t, c), "HOME=/")
	cmd.Dir = "/"
	if p.asRoot {
		sc := p.spec.SecurityContext
		cred := &syscall.Credential{Uid: uint32(*sc.RunAsUser), Gid: uint32(*sc.RunAsGroup)}
		if sc.FSGroup != nil {
			cred.Groups = []uint32{uint32(*sc.FSGroup)}
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	return cmd
}

// initCommands are the pod's init containers, in order.
func (p *pod) initCommands(t *testing.T) []*exec.Cmd {
	t.Helper()
	var out []*exec.Cmd
	for _, c := range p.spec.InitContainers {
		out = append(out, p.command(t, c))
	}
	return out
}

// runInit runs init containers in order, as the kubelet does: each must
// exit 0 before the next starts.
func runInit(ctx context.Context, cmds []*exec.Cmd) (string, error) {
	var out bytes.Buffer
	for _, cmd := range cmds {
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			return out.String(), err
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				return out.String(), fmt.Errorf("init container %v: %w", cmd.Args[1:], err)
			}
		case <-ctx.Done():
			_ = cmd.Process.Kill()
			<-done
			return out.String(), fmt.Errorf("init container %v did not finish", cmd.Args[1:])
		}
	}
	return out.String(), nil
}

// startWorker starts the pod's one container, on a free HTTP port.
func (p *pod) startWorker(t *testing.T) {
	t.Helper()
	if len(p.spec.Containers) != 1 {
		t.Fatalf("the pod has %d containers; this rehearsal runs one", len(p.spec.Containers))
	}
	port, err := freeport.Block(1)
	if err != nil {
		t.Fatal(err)
	}
	p.addr = fmt.Sprintf("127.0.0.1:%d", port)
	p.override["TENURE_HTTP_ADDR"] = p.addr
	p.worker = p.command(t, p.spec.Containers[0])
	p.worker.Stdout, p.worker.Stderr = &lockedWriter{&p.mu, &p.out}, &lockedWriter{&p.mu, &p.out}
	if err := p.worker.Start(); err != nil {
		t.Fatal(err)
	}
	p.done = make(chan error, 1)
	go func() { p.done <- p.worker.Wait() }()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.worker.Process.Kill()
			<-p.done
		}
	})
}

func (p *pod) waitReady(deadline time.Time) error {
	var last string
	for time.Now().Before(deadline) {
		select {
		case err := <-p.done:
			p.done <- err
			return fmt.Errorf("the worker exited: %v", err)
		default:
		}
		resp, err := http.Get("http://" + p.addr + "/readyz")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, bytes.TrimSpace(b))
		} else {
			last = err.Error()
		}
		time.Sleep(250 * time.Millisecond)
	}
	return fmt.Errorf("not ready in time: /readyz said %s", last)
}

// stop is the kubelet's SIGTERM; the worker must exit 0 within grace.
func (p *pod) stop(grace time.Duration) error {
	if err := p.worker.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case err := <-p.done:
		p.done <- err
		if err != nil {
			return fmt.Errorf("the worker's graceful stop: %v", err)
		}
		return nil
	case <-time.After(grace):
		return fmt.Errorf("the worker did not stop within the grace period %s", grace)
	}
}

func (p *pod) logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.out.String()
	// Enough to see why, not a whole run.
	if len(s) > 8000 {
		s = "..." + s[len(s)-8000:]
	}
	return regexp.MustCompile(`(?m)^`).ReplaceAllString(s, "  ")
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}
