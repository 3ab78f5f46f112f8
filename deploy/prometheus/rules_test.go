// Package prometheus holds tenure's Prometheus alerting rules
// (tenure-rules.yaml) and their unit tests (tenure-rules.test.yaml); it has
// no Go code but this test, which checks them and the Grafana dashboard
// (../grafana/tenure-dashboard.json):
//
//   - every metric an expression names is one the metrics package exports
//     (names and labels read from metrics.New's own descriptors; histograms
//     only through _bucket, _sum and _count), every label a selector
//     matches or an expression groups by is one of those metrics' labels
//     or the scrape's job and instance, and every function is PromQL's: a
//     typo fails;
//   - every alert has a for:, a severity, a summary, a description, a
//     runbook annotation that points at its paragraph in README.md, and a
//     unit test that makes it fire;
//   - `promtool check rules` and `promtool test rules` pass, and the
//     dashboard's queries parse (`promtool check rules` on a temporary file
//     of them as recording rules). promtool comes
//     with Debian's prometheus package; without it the test fails, it does
//     not skip.
package prometheus

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	prom "github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.yaml.in/yaml/v3"

	"github.com/tenure-dev/tenure/consumer"
	"github.com/tenure-dev/tenure/metrics"
	"github.com/tenure-dev/tenure/sink"
)

const (
	rulesFile     = "tenure-rules.yaml"
	rulesTestFile = "tenure-rules.test.yaml"
	dashboardFile = "../grafana/tenure-dashboard.json"
	runbookFile   = "README.md"
)

// targetLabels are the labels Prometheus adds to every scraped series.
var targetLabels = []string{"job", "instance"}

// exported is what the metrics package exports: series name to its labels.
type exported map[string][]string

// exportedMetrics reads the metric names and labels from a Collector's
// descriptors, and which of them are histograms from what it gathers once
// its hooks have seen a claim, a handler call and a commit.
func exportedMetrics(t *testing.T) exported {
	t.Helper()
	m := metrics.New(metrics.Options{})
	descs := make(chan *prom.Desc, 100)
	m.Describe(descs)
	close(descs)
	nameRE := regexp.MustCompile(`^Desc\{fqName: ("(?:[^"\\]|\\.)*")`)
	labelsRE := regexp.MustCompile(`variableLabels: \{([^}]*)\}\}$`)
	base := map[string][]string{}
	for d := range descs {
		s := d.String()
		n, l := nameRE.FindStringSubmatch(s), labelsRE.FindStringSubmatch(s)
		if n == nil || l == nil {
			t.Fatalf("cannot read a descriptor (client_golang's Desc.String changed?): %s", s)
		}
		name, err := strconv.Unquote(n[1])
		if err != nil {
			t.Fatal(err)
		}
		var labels []string
		if l[1] != "" {
			labels = strings.Split(l[1], ",")
		}
		base[name] = labels
	}
	if len(base) < 20 {
		t.Fatalf("only %d metrics described: %v", len(base), base)
	}

	// Exercise the hooks so that the histogram vectors have a series.
	cfg := m.Instrument(consumer.Config{Handler: consumer.HandlerFunc(func(context.Context, consumer.Tx, *consumer.Batch) error { return nil })})
	p := sink.Partition{Group: "g", Topic: "t", Partition: 0}
	b := &consumer.Batch{Group: "g", Topic: "t", Partition: 0, From: 0, To: 1,
		Records: []*kgo.Record{{Topic: "t", Partition: 0, Offset: 0, Timestamp: time.Now()}}}
	cfg.Hooks.AfterClaim(p, sink.Token{}, 0, nil)
	if err := cfg.Handler.Handle(context.Background(), nil, b); err != nil {
		t.Fatal(err)
	}
	cfg.Hooks.BeforeCommit(context.Background(), b)
	cfg.Hooks.AfterBatch(b, nil)
	reg := prom.NewPedanticRegistry()
	reg.MustRegister(m)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := exported{}
	for name, labels := range base {
		out[name] = labels
	}
	histograms := 0
	for _, f := range fams {
		if f.GetType() != dto.MetricType_HISTOGRAM {
			continue
		}
		histograms++
		name := f.GetName()
		labels := base[name]
		delete(out, name) // a histogram has no series of its own name
		out[name+"_bucket"] = append(slices.Clone(labels), "le")
		out[name+"_sum"] = labels
		out[name+"_count"] = labels
	}
	if histograms != 3 {
		t.Fatalf("gathered %d histograms, want 3 (handler, commit, end-to-end)", histograms)
	}
	return out
}

// promqlFunctions are PromQL's functions and aggregation operators.
var promqlFunctions = map[string]bool{}

func init() {
	for _, f := range strings.Fields(`abs absent absent_over_time acos acosh asin asinh atan atanh avg_over_time
		ceil changes clamp clamp_max clamp_min cos cosh count_over_time days_in_month day_of_month day_of_week
		day_of_year deg delta deriv exp floor histogram_quantile holt_winters hour idelta increase irate
		label_join label_replace last_over_time ln log10 log2 max_over_time min_over_time minute month
		pi predict_linear present_over_time quantile_over_time rad rate resets round scalar sgn sin sinh
		sort sort_desc sqrt stddev_over_time stdvar_over_time sum_over_time tan tanh time timestamp vector
		year sum min max avg group stddev stdvar count count_values bottomk topk quantile`) {
		promqlFunctions[f] = true
	}
}

var aggregations = map[string]bool{"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true,
	"stdvar": true, "count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true}

// checkPromQL reports the metrics, labels and functions of expr that do not
// exist. It is a small lexer, not a parser: promtool checks the syntax of
// the rules (and Grafana that of the dashboard); this checks the names.
func checkPromQL(expr string, ex exported) []string {
	s := &promScan{expr: expr}
	s.scan()
	return s.check(ex)
}

// promSelector is a selector of an expression: its metric ("" for a bare
// {…}) and the label names it matches.
type promSelector struct {
	metric   string
	matchers []string
}

// promScan is checkPromQL's reading of one expression: where it is, the
// selectors and grouping labels read so far, and the errors found.
type promScan struct {
	expr     string
	i        int
	errs     []string
	sels     []promSelector
	grouping []string
}

func (s *promScan) skipSpace() {
	for s.i < len(s.expr) && strings.ContainsRune(" \t\r\n", rune(s.expr[s.i])) {
		s.i++
	}
}

func (s *promScan) ident() string {
	expr := s.expr
	j := s.i
	for s.i < len(expr) && (expr[s.i] == '_' || expr[s.i] == ':' || expr[s.i] >= 'a' && expr[s.i] <= 'z' ||
		expr[s.i] >= 'A' && expr[s.i] <= 'Z' || expr[s.i] >= '0' && expr[s.i] <= '9' && s.i > j) {
		s.i++
	}
	return expr[j:s.i]
}

func (s *promScan) skipString() {
	q := s.expr[s.i]
	for s.i++; s.i < len(s.expr) && s.expr[s.i] != q; s.i++ {
		if s.expr[s.i] == '\\' && q != '`' {
			s.i++
		}
	}
	s.i++
}

// labelList reads "(a, b)" after by, without, on, ignoring, group_left.
func (s *promScan) labelList() {
	s.skipSpace()
	if s.i >= len(s.expr) || s.expr[s.i] != '(' {
		return
	}
	s.i++
	for s.i < len(s.expr) && s.expr[s.i] != ')' {
		s.skipSpace()
		if l := s.ident(); l != "" {
			s.grouping = append(s.grouping, l)
		} else if s.i < len(s.expr) && s.expr[s.i] != ')' {
			s.i++
		}
	}
	s.i++
}

// matchers reads "{a="x", b=~"y"}" and returns the label names.
func (s *promScan) matchers() []string {
	var ls []string
	s.i++ // {
	for s.i < len(s.expr) && s.expr[s.i] != '}' {
		s.skipSpace()
		switch c := s.expr[s.i]; {
		case c == '"' || c == '\'' || c == '`':
			s.skipString()
		case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
			ls = append(ls, s.ident())
		default:
			s.i++
		}
	}
	s.i++
	return ls
}

// scan reads the expression: its selectors, grouping labels and function
// names (an unknown function is an error).
func (s *promScan) scan() {
	expr := s.expr
	for s.i < len(expr) {
		c := expr[s.i]
		switch {
		case strings.ContainsRune(" \t\r\n", rune(c)):
			s.i++
		case c == '#':
			for s.i < len(expr) && expr[s.i] != '\n' {
				s.i++
			}
		case c == '"' || c == '\'' || c == '`':
			s.skipString()
		case c == '[':
			for s.i < len(expr) && expr[s.i] != ']' {
				s.i++
			}
			s.i++
		case c == '$': // a Grafana variable: $__rate_interval, ${datasource}
			s.i++
			if s.i < len(expr) && expr[s.i] == '{' {
				for s.i < len(expr) && expr[s.i] != '}' {
					s.i++
				}
				s.i++
			} else {
				s.ident()
			}
		case c >= '0' && c <= '9' || c == '.':
			for s.i < len(expr) && (expr[s.i] == '.' || expr[s.i] >= '0' && expr[s.i] <= '9' || expr[s.i] >= 'a' && expr[s.i] <= 'z' || expr[s.i] >= 'A' && expr[s.i] <= 'Z') {
				s.i++
			}
		case c == '{':
			s.sels = append(s.sels, promSelector{matchers: s.matchers()})
		case c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
			s.word()
		default:
			s.i++
		}
	}
}

// word reads an identifier: a keyword, a function (or aggregation) name, or
// a metric with its matchers.
func (s *promScan) word() {
	expr := s.expr
	id := s.ident()
	switch id {
	case "and", "or", "unless", "bool", "atan2", "inf", "Inf", "nan", "NaN":
		return
	case "by", "without", "on", "ignoring", "group_left", "group_right":
		s.labelList()
		return
	case "offset":
		s.skipSpace()
		if s.i < len(expr) && expr[s.i] == '-' {
			s.i++
		}
		for s.i < len(expr) && (expr[s.i] >= '0' && expr[s.i] <= '9' || expr[s.i] >= 'a' && expr[s.i] <= 'z') {
			s.i++
		}
		return
	}
	j := s.i
	s.skipSpace()
	if aggregations[id] || s.i < len(expr) && expr[s.i] == '(' {
		if !promqlFunctions[id] {
			s.errs = append(s.errs, fmt.Sprintf("%q is not a PromQL function", id))
		}
		return
	}
	s.i = j
	sel := promSelector{metric: id}
	if s.i < len(expr) && expr[s.i] == '{' {
		sel.matchers = s.matchers()
	}
	s.sels = append(s.sels, sel)
}

// check holds what was read to the metrics the metrics package exports:
// each metric exported, each matcher and grouping label one of its
// metrics has, and at least one metric named.
func (s *promScan) check(ex exported) []string {
	errs := s.errs
	var known []string // labels of the metrics the expression names
	known = append(known, targetLabels...)
	for _, sel := range s.sels {
		if sel.metric == "" {
			for _, m := range sel.matchers {
				if m != "__name__" && !slices.Contains(targetLabels, m) {
					errs = append(errs, fmt.Sprintf("a selector without a metric name matches %q", m))
				}
			}
			continue
		}
		labels, ok := ex[sel.metric]
		if !ok {
			errs = append(errs, fmt.Sprintf("metric %q is not exported by the metrics package", sel.metric))
			continue
		}
		known = append(known, labels...)
		for _, m := range sel.matchers {
			if m != "__name__" && !slices.Contains(labels, m) && !slices.Contains(targetLabels, m) {
				errs = append(errs, fmt.Sprintf("metric %s has no label %q (it has %v, and the scrape adds job and instance)", sel.metric, m, labels))
			}
		}
	}
	if !slices.ContainsFunc(s.sels, func(sel promSelector) bool { return sel.metric != "" }) {
		errs = append(errs, "names no metric")
	}
	for _, g := range s.grouping {
		if !slices.Contains(known, g) {
			errs = append(errs, fmt.Sprintf("groups or matches by %q, which none of its metrics has (they have %v)", g, known))
		}
	}
	return errs
}

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Record      string            `yaml:"record"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func readRules(t *testing.T) ruleFile {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(true)
	if err := dec.Decode(&rf); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	return rf
}

// Every rule's expression names exported metrics and labels; every alert
// says what it means, how bad it is, what to run, and has a runbook
// paragraph and a unit test that makes it fire.
func TestRules(t *testing.T) {
	ex := exportedMetrics(t)
	rf := readRules(t)
	runbook, err := os.ReadFile(runbookFile)
	if err != nil {
		t.Fatal(err)
	}
	firing := firingTests(t)
	seen := map[string]bool{}
	n := 0
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			n++
			name := r.Alert
			if name == "" {
				t.Errorf("group %s: a rule without alert (recording rules are not expected here): %q", g.Name, r.Record)
				continue
			}
			if seen[name] {
				t.Errorf("%s: two alerts of this name", name)
			}
			seen[name] = true
			for _, e := range checkPromQL(r.Expr, ex) {
				t.Errorf("%s: %s\n  expr: %s", name, e, r.Expr)
			}
			if d, err := time.ParseDuration(r.For); err != nil || d <= 0 {
				t.Errorf("%s: for: %q, want a duration above zero", name, r.For)
			}
			if s := r.Labels["severity"]; s != "critical" && s != "warning" {
				t.Errorf("%s: severity %q, want critical or warning", name, s)
			}
			for _, a := range []string{"summary", "description", "runbook"} {
				if strings.TrimSpace(r.Annotations[a]) == "" {
					t.Errorf("%s: no %s annotation", name, a)
				}
			}
			if want := "deploy/prometheus/README.md#" + strings.ToLower(name); r.Annotations["runbook"] != want {
				t.Errorf("%s: runbook %q, want %q", name, r.Annotations["runbook"], want)
			}
			if !regexp.MustCompile(`(?m)^### ` + name + `$`).Match(runbook) {
				t.Errorf("%s: %s has no paragraph headed \"### %s\"", name, runbookFile, name)
			}
			if !strings.Contains(r.Annotations["description"], "`tenure ") {
				t.Errorf("%s: the description names no command to run", name)
			}
			if !firing[name] {
				t.Errorf("%s: %s has no case where it fires while another input series does not", name, rulesTestFile)
			}
		}
	}
	if n < 15 {
		t.Errorf("%d rules, want at least 15", n)
	}
	for name := range firing {
		if !seen[name] {
			t.Errorf("%s tests alert %s, which %s does not have", rulesTestFile, name, rulesFile)
		}
	}
}

// firingTests reads tenure-rules.test.yaml: the alerts that have a case
// where they fire for fewer series than its input has (so that some input
// series is there not to fire).
func firingTests(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(rulesTestFile)
	if err != nil {
		t.Fatal(err)
	}
	var tf struct {
		RuleFiles []string `yaml:"rule_files"`
		Tests     []struct {
			Name        string `yaml:"name"`
			InputSeries []struct {
				Series string `yaml:"series"`
			} `yaml:"input_series"`
			AlertRuleTest []struct {
				Alertname string `yaml:"alertname"`
				ExpAlerts []any  `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	if err := yaml.Unmarshal(b, &tf); err != nil {
		t.Fatalf("%s: %v", rulesTestFile, err)
	}
	if !slices.Equal(tf.RuleFiles, []string{rulesFile}) {
		t.Errorf("%s loads %v, want [%s]", rulesTestFile, tf.RuleFiles, rulesFile)
	}
	out := map[string]bool{}
	for _, g := range tf.Tests {
		for _, c := range g.AlertRuleTest {
			if len(c.ExpAlerts) > 0 && len(c.ExpAlerts) < len(g.InputSeries) {
				out[c.Alertname] = true
			}
		}
	}
	return out
}

// The checker itself: typos in metric names, labels and functions fail.
func TestCheckPromQLFindsTypos(t *testing.T) {
	ex := exportedMetrics(t)
	for _, c := range []struct{ expr, want string }{
		{`tenure_lanes_halt > 0`, `metric "tenure_lanes_halt" is not exported`},
		{`increase(tenure_batch_fenced_total[5m]) > 0`, `metric "tenure_batch_fenced_total" is not exported`},
		{`tenure_lanes{topic="jobs"}`, `metric tenure_lanes has no label "topic"`},
		{`sum by (partiton) (tenure_partition_lag)`, `groups or matches by "partiton"`},
		{`sum by (topic) (tenure_lanes)`, `groups or matches by "topic"`},
		{`rat(tenure_records_committed_total[5m])`, `"rat" is not a PromQL function`},
		{`histogram_quantile(0.9, rate(tenure_commit_duration_seconds[5m]))`, `metric "tenure_commit_duration_seconds" is not exported`},
		{`tenure_kafka_connects_total`, `is not exported by the metrics package`},
		{`vector(1)`, `names no metric`},
	} {
		errs := checkPromQL(c.expr, ex)
		if !slices.ContainsFunc(errs, func(e string) bool { return strings.Contains(e, c.want) }) {
			t.Errorf("%s: got %q, want an error containing %q", c.expr, errs, c.want)
		}
	}
	for _, ok := range []string{
		`histogram_quantile(0.99, sum by (le, instance) (rate(tenure_commit_duration_seconds_bucket{job=~"$job",outcome="committed"}[$__rate_interval])))`,
		`tenure_partition_lag > 0 unless on (job, instance, topic, partition) increase(tenure_batches_committed_total[10m]) > 0`,
		`max by (job) (tenure_lanes) > 1 or sum by (job) (tenure_lanes) == 0 # a comment`,
		`tenure_partition_lag offset 5m`,
	} {
		if errs := checkPromQL(ok, ex); len(errs) > 0 {
			t.Errorf("%s: %q", ok, errs)
		}
	}
}

// The Grafana dashboard: a current schema, a Prometheus data source
// variable every panel uses, and queries (panels' and variables') that name
// exported metrics; the panels the deployment docs promise are there.
type dashTarget struct {
	Expr       string `json:"expr"`
	RefID      string `json:"refId"`
	Datasource struct {
		Type, UID string
	} `json:"datasource"`
}

type dashPanel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		Type, UID string
	} `json:"datasource"`
	GridPos struct{ H, W, X, Y int } `json:"gridPos"`
	Targets []dashTarget             `json:"targets"`
	Panels  []json.RawMessage        `json:"panels"`
}

type dashboard struct {
	UID           string      `json:"uid"`
	Title         string      `json:"title"`
	SchemaVersion int         `json:"schemaVersion"`
	Panels        []dashPanel `json:"panels"`
	Templating    struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"`
			Definition string          `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

// readDashboard reads the dashboard, and its panels with the rows'
// nested ones, in order.
func readDashboard(t *testing.T) (dashboard, []dashPanel) {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var all []dashPanel
	var walk func(ps []dashPanel)
	walk = func(ps []dashPanel) {
		for _, p := range ps {
			all = append(all, p)
			var nested []dashPanel
			for _, raw := range p.Panels {
				var np dashPanel
				if err := json.Unmarshal(raw, &np); err != nil {
					t.Fatal(err)
				}
				nested = append(nested, np)
			}
			walk(nested)
		}
	}
	walk(d.Panels)
	return d, all
}

func TestDashboard(t *testing.T) {
	ex := exportedMetrics(t)
	d, all := readDashboard(t)
	t.Run("Header", func(t *testing.T) {
		if d.SchemaVersion < 39 {
			t.Errorf("schemaVersion %d: want a current Grafana's (39 or later)", d.SchemaVersion)
		}
		if d.UID == "" || d.Title == "" {
			t.Errorf("uid %q, title %q", d.UID, d.Title)
		}
	})
	t.Run("Variables", func(t *testing.T) { checkDashboardVariables(t, d, ex) })
	t.Run("Panels", func(t *testing.T) { checkDashboardPanels(t, all, ex) })
	t.Run("Coverage", func(t *testing.T) {
		used := map[string]bool{} // the tenure_ series the panels show
		for _, p := range all {
			for _, tg := range p.Targets {
				for _, m := range regexp.MustCompile(`tenure_\w+`).FindAllString(tg.Expr, -1) {
					used[m] = true
				}
			}
		}
		// What the dashboard is for: throughput, commit latency, lag, lanes
		// held and stalled, fenced batches, dead letters, step-downs.
		for _, m := range []string{"tenure_records_committed_total", "tenure_commit_duration_seconds_bucket", "tenure_partition_lag",
			"tenure_lanes", "tenure_lanes_halted", "tenure_lanes_stalled", "tenure_batches_fenced_total",
			"tenure_dead_letters_total", "tenure_worker_step_downs_total", "tenure_worker_stepped_down"} {
			if !used[m] {
				t.Errorf("no panel shows %s", m)
			}
		}
		var unused []string
		for m := range ex {
			if !used[m] && !strings.HasSuffix(m, "_sum") {
				unused = append(unused, m)
			}
		}
		sort.Strings(unused)
		t.Logf("%d panels; exported series no panel shows: %v", len(all), unused)
	})
}

// checkDashboardVariables: a Prometheus data source variable, and query
// variables over labels the metrics have.
func checkDashboardVariables(t *testing.T, d dashboard, ex exported) {
	var dsVar bool
	for _, v := range d.Templating.List {
		switch v.Type {
		case "datasource":
			var q string
			if err := json.Unmarshal(v.Query, &q); err != nil || q != "prometheus" || v.Name != "datasource" {
				t.Errorf("data source variable %q: query %s, want a variable named datasource of query prometheus", v.Name, v.Query)
			}
			dsVar = true
		case "query":
			// label_values(selector, label)
			m := regexp.MustCompile(`^label_values\((.*),\s*([a-zA-Z_]\w*)\)$`).FindStringSubmatch(v.Definition)
			if m == nil {
				t.Errorf("variable %s: %q is not label_values(selector, label)", v.Name, v.Definition)
				continue
			}
			for _, e := range checkPromQL(m[1], ex) {
				t.Errorf("variable %s: %s", v.Name, e)
			}
			if metric := regexp.MustCompile(`^\w+`).FindString(m[1]); !slices.Contains(ex[metric], m[2]) && !slices.Contains(targetLabels, m[2]) {
				t.Errorf("variable %s: %s has no label %q", v.Name, metric, m[2])
			}
			var q struct {
				Query string `json:"query"`
			}
			if err := json.Unmarshal(v.Query, &q); err != nil || q.Query != v.Definition {
				t.Errorf("variable %s: query %s and definition %q differ (%v)", v.Name, v.Query, v.Definition, err)
			}
		}
	}
	if !dsVar {
		t.Error("no Prometheus data source variable")
	}
}

// checkDashboardPanels: unique ids, inside the grid, the data source
// variable, queries that check (checkPromQL) and follow the topic
// variable.
func checkDashboardPanels(t *testing.T, all []dashPanel, ex exported) {
	perPartition := regexp.MustCompile(`tenure_(partition_lag|records_committed_total|batches_committed_total|batches_fenced_total|claims_total|claims_fenced_total)\b`)
	ids := map[int]bool{}
	exprs := 0
	for _, p := range all {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		if p.GridPos.W <= 0 || p.GridPos.X+p.GridPos.W > 24 || p.GridPos.H <= 0 {
			t.Errorf("panel %q: gridPos %+v outside the 24 columns", p.Title, p.GridPos)
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.Type != "prometheus" || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: datasource %+v, want the ${datasource} variable", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q: no query", p.Title)
		}
		for _, tg := range p.Targets {
			exprs++
			if tg.Datasource.UID != "${datasource}" || tg.RefID == "" {
				t.Errorf("panel %q: query %s: datasource %+v, refId %q", p.Title, tg.RefID, tg.Datasource, tg.RefID)
			}
			for _, e := range checkPromQL(tg.Expr, ex) {
				t.Errorf("panel %q: %s\n  expr: %s", p.Title, e, tg.Expr)
			}
			if perPartition.MatchString(tg.Expr) {
				if !strings.Contains(tg.Expr, `topic=~"$topic"`) {
					t.Errorf("panel %q: a per-partition query does not follow the topic variable: %s", p.Title, tg.Expr)
				}
			}
		}
	}
	t.Logf("%d panels, %d queries", len(all), exprs)
}

// dashboardExprs returns the dashboard's panel queries with Grafana's
// variables replaced by values Prometheus parses.
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var exprs []string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if e, ok := v["expr"].(string); ok {
				exprs = append(exprs, e)
			}
			for _, c := range v {
				walk(c)
			}
		case []any:
			for _, c := range v {
				walk(c)
			}
		}
	}
	var d any
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	walk(d)
	r := strings.NewReplacer("$__rate_interval", "2m", "$__range", "6h", "$job", "tenure", "$instance", ".*", "$topic", ".*")
	for i, e := range exprs {
		exprs[i] = r.Replace(e)
		if strings.Contains(exprs[i], "$") {
			t.Errorf("dashboard query with a variable the test does not know: %s", e)
		}
	}
	return exprs
}

// promtool checks the rules' syntax and runs their unit tests, and checks
// the syntax of the dashboard's queries (as recording rules of a temporary
// file: Grafana does not run here).
func TestPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool is required (Debian's prometheus package: apt-get install prometheus; scripts/test.sh installs it): %v", err)
	}
	type record struct {
		Record string `yaml:"record"`
		Expr   string `yaml:"expr"`
	}
	var recs []record
	for i, e := range dashboardExprs(t) {
		recs = append(recs, record{Record: fmt.Sprintf("dashboard:query_%d", i+1), Expr: e})
	}
	dash, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": recs}}})
	if err != nil {
		t.Fatal(err)
	}
	dashRules := filepath.Join(t.TempDir(), "dashboard-queries.yaml")
	if err := os.WriteFile(dashRules, dash, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"check", "rules", rulesFile}, {"test", "rules", rulesTestFile}, {"check", "rules", dashRules}} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		out, err := exec.CommandContext(ctx, promtool, args...).CombinedOutput()
		cancel()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
			continue
		}
		t.Logf("promtool %s:\n%s", strings.Join(args, " "), strings.TrimSpace(string(out)))
	}
}
