package metrics_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tenure-dev/tenure/internal/devbroker"
	"github.com/tenure-dev/tenure/metrics"
)

// kprom's gauges of buffered records are exported without the counter's
// _total suffix; its other metrics keep their names; closing the client
// unregisters them all.
func TestKafkaHooksNameGaugesAsGauges(t *testing.T) {
	br, err := devbroker.Start(devbroker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	reg := prometheus.NewPedanticRegistry()
	cl, err := kgo.NewClient(kgo.SeedBrokers(br.ListenAddrs()...), kgo.WithHooks(metrics.KafkaHooks(reg)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := cl.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	types := map[string]dto.MetricType{}
	for _, f := range fams {
		types[f.GetName()] = f.GetType()
	}
	for _, name := range []string{"tenure_kafka_buffered_fetch_records", "tenure_kafka_buffered_produce_records",
		"tenure_kafka_buffered_fetch_bytes", "tenure_kafka_buffered_produce_bytes"} {
		if typ, ok := types[name]; !ok || typ != dto.MetricType_GAUGE {
			t.Errorf("%s: %v, %v (gathered %v)", name, typ, ok, types)
		}
	}
	if _, ok := types["tenure_kafka_connects_total"]; !ok {
		t.Errorf("tenure_kafka_connects_total is not gathered: %v", types)
	}
	for name, typ := range types {
		if typ == dto.MetricType_GAUGE && strings.HasSuffix(name, "_total") {
			t.Errorf("gauge %s ends in _total", name)
		}
	}
	cl.Close()
	if fams, err = reg.Gather(); err != nil || len(fams) != 0 {
		t.Errorf("after the client closed: %d families, %v", len(fams), err)
	}
}

func TestBuildInfo(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics.BuildInfo())
	fams, err := reg.Gather()
	if err != nil || len(fams) != 1 {
		t.Fatalf("%v %v", fams, err)
	}
	f := fams[0]
	if f.GetName() != "tenure_build_info" || f.GetType() != dto.MetricType_GAUGE || len(f.Metric) != 1 || f.Metric[0].Gauge.GetValue() != 1 {
		t.Fatalf("%v", f)
	}
	var names []string
	for _, l := range f.Metric[0].Label {
		names = append(names, l.GetName())
		if l.GetValue() == "" {
			t.Errorf("label %s is empty", l.GetName())
		}
	}
	if strings.Join(names, ",") != "go_version,revision,version" {
		t.Errorf("labels %v", names)
	}
}
