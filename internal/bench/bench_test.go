package bench

import (
	"strings"
	"testing"

	"github.com/tenure-dev/tenure/consumer"
)

// The at-least-once program writes the workers' batch size, wherever the
// workers get it from.
func TestBenchBatchMax(t *testing.T) {
	for _, c := range []struct {
		flags, env string
		want       int
	}{
		{"", "", consumer.DefaultBatchMax},
		{"--batch-max 5000", "", 5000},
		{"--batch-linger 5ms -batch-max=250", "", 250},
		{"--batch-max=0", "", consumer.DefaultBatchMax},
		{"", "700", 700},
		{"--batch-max 90", "700", 90},
	} {
		b := &bench{cfg: Config{Getenv: func(k string) string {
			if k == "TENURE_BATCH_MAX" {
				return c.env
			}
			return ""
		}}, workerFlags: strings.Fields(c.flags)}
		if got := b.batchMax(); got != c.want {
			t.Errorf("flags %q, TENURE_BATCH_MAX %q: %d, want %d", c.flags, c.env, got, c.want)
		}
	}
}
