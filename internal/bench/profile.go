package bench

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/google/pprof/profile"
)

// Profile is where one tenure worker's CPU went: a run of its own, after
// the measured rounds, with --cpu-profile (profiling costs a few percent,
// so this run's rate is not in the table).
type Profile struct {
	File       string  `json:"file"` // go tool pprof FILE
	CPUSeconds float64 `json:"cpu_seconds"`
	JobsPerSec float64 `json:"jobs_per_sec"`
	// Areas: every sample charged to the nearest library on its stack, from
	// the leaf up (so a pgx call's allocations are pgx's), or to the Go
	// runtime when its stack has no library (the collector's background
	// work, the scheduler).
	Areas []Share `json:"areas"`
	// Top are the functions the samples were in (flat).
	Top  []Share `json:"top_functions"`
	Note string  `json:"note,omitempty"`
}

// Share is a part of the profile's CPU time.
type Share struct {
	Name    string  `json:"name"`
	Percent float64 `json:"percent"`
}

// profileWorker runs tenure once more on topic with --cpu-profile and reads
// the profile.
func (b *bench) profileWorker(ctx context.Context, topic string) (*Profile, error) {
	file := filepath.Join(os.TempDir(), "tenure-bench-"+b.id+"-worker.pprof")
	if b.cfg.JSONFile != "" {
		file = strings.TrimSuffix(b.cfg.JSONFile, filepath.Ext(b.cfg.JSONFile)) + ".worker.pprof"
	}
	b.say("profiling: tenure once more with --cpu-profile %s", file)
	r, err := b.runWorkers(ctx, "profile", topic, b.jobs, 1, []string{"--cpu-profile", file}, nil)
	if err != nil {
		return nil, err
	}
	out := &Profile{File: file, JobsPerSec: r.JobsPerSec}
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	p, err := profile.Parse(f)
	if err != nil {
		return nil, fmt.Errorf("reading the worker's CPU profile %s: %w", file, err)
	}
	// A run too short to be sampled says so in the report; it is not the
	// bench's failure.
	if err := out.summarize(p); err != nil {
		out.Note = err.Error()
	}
	return out, nil
}

// summarize charges a CPU profile's samples to areas and functions.
func (out *Profile) summarize(p *profile.Profile) error {
	vi := slices.IndexFunc(p.SampleType, func(t *profile.ValueType) bool { return t.Type == "cpu" })
	if vi < 0 {
		return fmt.Errorf("not a CPU profile (sample types %v)", p.SampleType)
	}
	areas, funcs := map[string]int64{}, map[string]int64{}
	var total int64
	for _, s := range p.Sample {
		v := s.Value[vi]
		total += v
		var frames []string // leaf first, inlined frames included
		for _, loc := range s.Location {
			for _, l := range loc.Line {
				if l.Function != nil {
					frames = append(frames, l.Function.Name)
				}
			}
		}
		if len(frames) > 0 {
			funcs[frames[0]] += v
		}
		areas[area(frames)] += v
	}
	if total == 0 {
		return fmt.Errorf("the profile has no samples: the run was too short")
	}
	out.CPUSeconds = float64(total) / 1e9
	out.Areas = shares(areas, total, 0)
	out.Top = shares(funcs, total, 10)
	return nil
}

// shares are m's entries as percentages of total, largest first; n > 0
// keeps the n largest.
func shares(m map[string]int64, total int64, n int) []Share {
	var out []Share
	for k, v := range m {
		out = append(out, Share{Name: k, Percent: 100 * float64(v) / float64(total)})
	}
	slices.SortFunc(out, func(a, b Share) int {
		return cmp.Or(cmp.Compare(b.Percent, a.Percent), strings.Compare(a.Name, b.Name))
	})
	if n > 0 && len(out) > n {
		out = out[:n]
	}
	return out
}

// libraries name the modules a worker's time is spent in.
var libraries = []struct{ prefix, name string }{
	{"github.com/tenure-dev/tenure/", "tenure"},
	{"github.com/jackc/", "pgx (PostgreSQL client)"},
	{"github.com/twmb/franz-go/", "franz-go (Kafka client)"},
	{"github.com/klauspost/compress/", "compression"},
	{"github.com/pierrec/lz4/", "compression"},
	{"go.uber.org/zap", "zap (logging)"},
	{"github.com/prometheus/", "Prometheus client"},
	{"go.opentelemetry.io/", "OpenTelemetry"},
}

// area is the nearest library on a stack (leaf first): tenure's by package,
// others by name; a stack of the standard library and the runtime alone is
// the collector's, a system call's, or the runtime's.
func area(frames []string) string {
	for _, f := range frames {
		for _, l := range libraries {
			if rest, ok := strings.CutPrefix(f, l.prefix); ok {
				if l.name == "tenure" {
					pkg, _, _ := strings.Cut(rest, ".")
					return "tenure/" + pkg
				}
				return l.name
			}
		}
		// Another module: its path up to the package.
		if first, _, slash := strings.Cut(f, "/"); slash && strings.Contains(first, ".") {
			pkg, _, _ := strings.Cut(f[strings.LastIndex(f, "/")+1:], ".")
			return f[:strings.LastIndex(f, "/")+1] + pkg
		}
	}
	for _, f := range frames {
		switch {
		case strings.HasPrefix(f, "runtime.gcBgMarkWorker"), strings.HasPrefix(f, "runtime.bgsweep"), strings.HasPrefix(f, "runtime.bgscavenge"):
			return "Go runtime: garbage collection"
		case strings.HasPrefix(f, "syscall."), strings.HasPrefix(f, "internal/poll."):
			return "system calls"
		}
	}
	return "Go runtime: scheduler and other"
}
