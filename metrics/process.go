package metrics

import (
	"regexp"
	"runtime"
	"runtime/debug"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kprom"
)

// The process's metrics besides a Collector's: what `tenure worker
// --http-addr` serves too.

// modulePath is tenure's module.
const modulePath = "github.com/tenure-dev/tenure"

// BuildInfo is tenure_build_info{version, revision, go_version}, always 1:
// which tenure a process runs, from the build information Go records (what
// `tenure version` prints). version is tenure's module version (a
// release's tag, a pseudo-version in a checkout, "(devel)" when the build
// recorded neither; in a program that imports tenure, the version it
// required), revision the commit it was built from ("unknown" when not
// recorded), go_version the Go release that built it.
func BuildInfo() prometheus.Collector {
	bi, _ := debug.ReadBuildInfo()
	version, revision := buildVersion(bi)
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "tenure_build_info",
		Help:        "Which tenure this process runs: its module version, the commit it was built from and the Go release that built it (always 1).",
		ConstLabels: prometheus.Labels{"version": version, "revision": revision, "go_version": runtime.Version()},
	}, func() float64 { return 1 })
}

// buildVersion reads tenure's version and revision from bi.
func buildVersion(bi *debug.BuildInfo) (version, revision string) {
	version, revision = "(devel)", "unknown"
	if bi == nil {
		return version, revision
	}
	if bi.Main.Path == modulePath || bi.Main.Path == "" {
		if bi.Main.Version != "" {
			version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && s.Value != "" {
				revision = s.Value
			}
		}
		return version, revision
	}
	// A program that imports tenure: the version it required.
	for _, d := range bi.Deps {
		if d.Path == modulePath {
			if d.Replace != nil {
				d = d.Replace
			}
			if d.Version != "" {
				version = d.Version
			}
		}
	}
	return version, revision
}

// KafkaHooks returns the kgo hooks that export a client's own metrics on
// reg under tenure_kafka_ (kprom: connections and connection errors per
// broker, where TLS and SASL failures show, bytes written and read,
// records buffered), for kgo.WithHooks. kprom names its two gauges of
// buffered records with a counter's _total suffix; they are exported as
// tenure_kafka_buffered_fetch_records and
// tenure_kafka_buffered_produce_records instead.
func KafkaHooks(reg prometheus.Registerer) kgo.Hook {
	return kprom.NewMetrics("tenure_kafka", kprom.Registerer(&renaming{Registerer: reg, wrapped: map[prometheus.Collector]prometheus.Collector{}}))
}

// gaugeNames are the kprom gauges renamed, and their help.
var gaugeNames = map[string]struct{ name, help string }{
	"tenure_kafka_buffered_fetch_records_total": {"tenure_kafka_buffered_fetch_records",
		"Records the Kafka client has fetched and buffered, not yet consumed."},
	"tenure_kafka_buffered_produce_records_total": {"tenure_kafka_buffered_produce_records",
		"Records buffered in the Kafka client, waiting to be produced."},
}

// renaming registers what kprom registers, but its gauges of gaugeNames
// under their right names.
type renaming struct {
	prometheus.Registerer
	mu      sync.Mutex
	wrapped map[prometheus.Collector]prometheus.Collector
}

var fqNameRE = regexp.MustCompile(`^Desc\{fqName: ("(?:[^"\\]|\\.)*")`)

// descName reads the name of c's one descriptor ("" if it has several).
func descName(c prometheus.Collector) string {
	ch := make(chan *prometheus.Desc, 16)
	c.Describe(ch)
	close(ch)
	var names []string
	for d := range ch {
		if m := fqNameRE.FindStringSubmatch(d.String()); m != nil {
			if n, err := strconv.Unquote(m[1]); err == nil {
				names = append(names, n)
			}
		}
	}
	if len(names) != 1 {
		return ""
	}
	return names[0]
}

func (r *renaming) Register(c prometheus.Collector) error {
	n, ok := gaugeNames[descName(c)]
	if !ok {
		return r.Registerer.Register(c)
	}
	w := &renamedGauge{c: c, desc: prometheus.NewDesc(n.name, n.help, nil, nil)}
	if err := r.Registerer.Register(w); err != nil {
		return err
	}
	r.mu.Lock()
	r.wrapped[c] = w
	r.mu.Unlock()
	return nil
}

func (r *renaming) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

func (r *renaming) Unregister(c prometheus.Collector) bool {
	r.mu.Lock()
	w, ok := r.wrapped[c]
	delete(r.wrapped, c)
	r.mu.Unlock()
	if ok {
		return r.Registerer.Unregister(w)
	}
	return r.Registerer.Unregister(c)
}

// renamedGauge is gauge c's value under desc.
type renamedGauge struct {
	c    prometheus.Collector
	desc *prometheus.Desc
}

func (g *renamedGauge) Describe(ch chan<- *prometheus.Desc) { ch <- g.desc }

func (g *renamedGauge) Collect(ch chan<- prometheus.Metric) {
	in := make(chan prometheus.Metric, 1)
	go func() { g.c.Collect(in); close(in) }()
	for m := range in {
		var d dto.Metric
		if err := m.Write(&d); err != nil || d.Gauge == nil {
			continue
		}
		ch <- prometheus.MustNewConstMetric(g.desc, prometheus.GaugeValue, d.Gauge.GetValue())
	}
}
