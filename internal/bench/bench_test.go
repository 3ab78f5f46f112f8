package bench

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/google/pprof/profile"

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

func TestBenchSummarize(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want Stat
	}{
		{nil, Stat{}},
		{[]float64{3}, Stat{Median: 3, Min: 3, Max: 3, N: 1}},
		{[]float64{5, 1, 3}, Stat{Median: 3, Min: 1, Max: 5, N: 3}},
		{[]float64{4, 1, 3, 2}, Stat{Median: 2.5, Min: 1, Max: 4, N: 4}},
		{[]float64{2, math.NaN(), 9}, Stat{Median: 5.5, Min: 2, Max: 9, N: 2}},
	} {
		if got := summarize(c.in); got != c.want {
			t.Errorf("summarize(%v) = %+v, want %+v", c.in, got, c.want)
		}
	}
}

// A target is met only when the whole spread is on its side, unclear when
// the spread straddles the bound, not met when all of it is on the wrong
// side.
func TestBenchVerdict(t *testing.T) {
	for _, c := range []struct {
		min, med, max float64
		want, verdict string
	}{
		{1.0, 1.1, 1.2, ">= 1.0", Met},
		{0.9, 1.05, 1.2, ">= 1.0", Unclear}, // straddles: the median alone would say met
		{0.7, 0.8, 0.99, ">= 1.0", NotMet},
		{100, 120, 150, "<= 150", Met},
		{140, 155, 170, "<= 150", Unclear}, // straddles: the median alone would say not met
		{151, 160, 170, "<= 150", NotMet},
		{0.96, 0.97, 0.98, ">= 0.95", Met},
	} {
		s := Stat{Median: c.med, Min: c.min, Max: c.max, N: 3}
		if got := verdict(s, c.want); got != c.verdict {
			t.Errorf("verdict(%+v, %q) = %q, want %q", s, c.want, got, c.verdict)
		}
	}
	if got := verdict(Stat{}, ">= 1"); got != Unclear {
		t.Errorf("no runs: %q, want unclear", got)
	}
}

// A ratio is the ratio of the medians; its spread is that of the
// per-repeat ratios.
func TestBenchRatio(t *testing.T) {
	a := []float64{100, 90, 120}
	b := []float64{100, 100, 100}
	s := ratioStat(a, b)
	if s.Median != 1.0 || s.Min != 0.9 || s.Max != 1.2 || s.N != 3 {
		t.Errorf("ratio %+v, want median 1.0 (100/100), spread 0.9–1.2", s)
	}
	if v := verdict(s, ">= 1.0"); v != Unclear {
		t.Errorf("verdict %q, want unclear", v)
	}
}

// The report's targets come from medians and judge by the spread; a
// latency measured below the rate asked for is never met.
func TestBenchTargets(t *testing.T) {
	row := func(name string, rates ...float64) Row {
		r := Row{Name: name}
		for _, x := range rates {
			db := 2.0
			r.add(Result{Jobs: 1000, JobsPerSec: x, CPUPerMJobs: 2, DBCPUPerMJobs: &db, PeakRSSMB: 100, DrainSeconds: 6})
		}
		return r
	}
	rep := &Report{Repeat: 3, Results: []Row{row("tenure", 100, 110, 120), row("at-least-once", 90, 100, 130), row("copy-ceiling", 100, 100, 100),
		row("tenure-traced", 95, 99, 110), row("tenure-unfenced", 100, 100, 100), row("naive", 1, 1, 1), {Name: "tenure-strict", Skipped: "skipped: no"}},
		LatencyRate: 100000, Latency: map[string]Stat{"p99": {Median: 20, Min: 10, Max: 30, N: 3}, "achieved_rate": {Median: 90000, Min: 80000, Max: 95000, N: 3}}}
	rep.Targets = targets(rep)
	got := map[string]Target{}
	for _, tg := range rep.Targets {
		got[tg.Name] = tg
	}
	for name, want := range map[string]string{
		"tenure / at-least-once (jobs/s)":                          Unclear, // per-repeat 1.11, 1.10, 0.92
		"tenure / COPY ceiling, same table (jobs/s)":               Met,
		"tenure CPU per job (worker + Postgres) / at-least-once's": Met,
		"tenure peak RSS (MB)":                                     Met,
		"p99 end-to-end latency at 100000 jobs/s (ms)":             Unclear, // below the rate asked for
		"tenure-traced / tenure (jobs/s)":                          Met,
		"tenure / naive (jobs/s)":                                  Met,
	} {
		if tg, ok := got[name]; !ok || tg.Verdict != want {
			t.Errorf("target %q: %+v, want %s", name, tg, want)
		}
	}
	if tg := got["tenure / at-least-once (jobs/s)"]; tg.Value != 110.0/100 {
		t.Errorf("ratio of the medians: %v, want 1.1", tg.Value)
	}
	var sb strings.Builder
	rep.Settings = map[string]any{}
	rep.WhereTimeGoes = whereTimeGoes(rep)
	Print(&sb, rep)
	for _, w := range []string{"median (min–max) of 3 runs", "110 (100–120)", "unclear", "met", "tenure-strict", "skipped: no", "where the time goes"} {
		if !strings.Contains(sb.String(), w) {
			t.Errorf("the report lacks %q:\n%s", w, sb.String())
		}
	}
}

// A profile's samples are charged to the nearest library from the leaf up,
// and a stack of the runtime alone to the runtime's parts.
func TestProfileAreas(t *testing.T) {
	var fns []*profile.Function
	loc := func(names ...string) *profile.Location {
		l := &profile.Location{ID: uint64(len(fns) + 1)}
		for _, n := range names {
			f := &profile.Function{ID: uint64(len(fns) + 1), Name: n}
			fns = append(fns, f)
			l.Line = append(l.Line, profile.Line{Function: f})
		}
		return l
	}
	sample := func(v int64, locs ...*profile.Location) *profile.Sample {
		return &profile.Sample{Value: []int64{1, v}, Location: locs}
	}
	p := &profile.Profile{
		SampleType: []*profile.ValueType{{Type: "samples", Unit: "count"}, {Type: "cpu", Unit: "nanoseconds"}},
		Sample: []*profile.Sample{
			// pgx's allocation is pgx's, though its leaf is the runtime's.
			sample(40e7, loc("runtime.mallocgc"), loc("github.com/jackc/pgx/v5/pgproto3.(*Frontend).Receive"), loc("github.com/tenure-dev/tenure/sink.(*Store).Commit")),
			// An inlined tenure frame above the runtime counts as tenure's.
			sample(30e7, loc("runtime.memmove", "github.com/tenure-dev/tenure/consumer.(*lane).append"), loc("runtime.goexit")),
			sample(20e7, loc("runtime.scanobject"), loc("runtime.gcBgMarkWorker")),
			sample(5e7, loc("syscall.Syscall6"), loc("internal/poll.(*FD).Read")),
			sample(5e7, loc("runtime.findRunnable"), loc("runtime.schedule")),
		},
	}
	var out Profile
	if err := out.summarize(p); err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, a := range out.Areas {
		got[a.Name] = a.Percent
	}
	want := map[string]float64{"pgx (PostgreSQL client)": 40, "tenure/consumer": 30, "Go runtime: garbage collection": 20, "system calls": 5, "Go runtime: scheduler and other": 5}
	for k, v := range want {
		if math.Abs(got[k]-v) > 1e-9 {
			t.Errorf("area %q: %.1f%%, want %.0f%% (all: %v)", k, got[k], v, got)
		}
	}
	if len(got) != len(want) || out.CPUSeconds != 1 || out.Areas[0].Name != "pgx (PostgreSQL client)" {
		t.Errorf("areas %v, %.2f CPU s", out.Areas, out.CPUSeconds)
	}
	if out.Top[0].Name != "runtime.mallocgc" || math.Abs(out.Top[0].Percent-40) > 1e-9 {
		t.Errorf("top function %+v, want runtime.mallocgc 40%%", out.Top[0])
	}
	if err := (&Profile{}).summarize(&profile.Profile{SampleType: p.SampleType}); err == nil {
		t.Error("an empty profile was summarized")
	}
}

// The partition dimension's targets: at the largest count, tenure's rate
// over its own at 12 and over the at-least-once program's at the same
// count, its CPU per job (workers and Postgres together) over its own at
// 12, its peak RSS, and the hand-off against the session timeout + 2 s,
// each judged by the spread of the rounds (round i over round i).
func TestBenchDimensionTargets(t *testing.T) {
	type round struct {
		rate, cpu, db, rss, handOff float64
		handedOff                   int
		alo                         float64
	}
	count := func(parts int, rounds ...round) PartitionCount {
		var c PartitionCount
		for i, r := range rounds {
			db := r.db
			c.addTenure(PartitionRun{Partitions: parts, Workers: 3, Round: i, Jobs: 1000, JobsPerSec: r.rate, CPUPerMJobs: r.cpu, DBCPUPerMJobs: &db,
				PeakRSSMB: r.rss, HandedOff: r.handedOff, Held: r.handedOff, HandOffSeconds: r.handOff})
			adb := 1.0
			c.addAtLeastOnce(Result{Jobs: 1000, JobsPerSec: r.alo, CPUPerMJobs: 0.5, DBCPUPerMJobs: &adb, PeakRSSMB: 900})
		}
		return c
	}
	rep := &Report{Repeat: 1, DimensionSessionTimeout: 6, Settings: map[string]any{}, PartitionCounts: []PartitionCount{
		count(12, round{100, 1, 1, 100, 5, 3, 200}, round{110, 1, 1, 100, 5, 3, 200}, round{120, 1, 1, 100, 5, 3, 200}),
		// The largest count, not the last listed, is the one judged.
		count(1000, round{80, 1.1, 1.6, 140, 7.5, 5, 85}, round{70, 1.1, 1.6, 145, 0, 0, 75}, round{90, 1.1, 1.6, 149, 7.9, 4, 95}),
		count(120, round{90, 1, 1, 120, 6, 4, 100}, round{90, 1, 1, 120, 6, 4, 100}, round{90, 1, 1, 120, 6, 4, 100}),
	}}
	rep.Targets = targets(rep)
	got := map[string]Target{}
	for _, tg := range rep.Targets {
		got[tg.Name] = tg
	}
	for _, c := range []struct {
		name, want, verdict string
		value               float64
	}{
		// Per round 0.80, 0.64, 0.75: the median of the medians (80/110)
		// alone would say met.
		{"partition dimension: tenure at 1000 / tenure at 12 partitions (jobs/s)", ">= 0.7", Unclear, 80.0 / 110},
		// Against the at-least-once program at 1000 (85, 75, 95), not at 12.
		{"partition dimension: tenure / at-least-once at 1000 partitions (jobs/s)", ">= 0.9", Met, 80.0 / 85},
		// Workers and Postgres: 2.7 over 2.0; the workers' alone (1.1) would
		// be met.
		{"partition dimension: tenure's CPU per job (workers + Postgres) at 1000 / at 12 partitions", "<= 1.3", NotMet, 2.7 / 2.0},
		{"partition dimension: tenure's peak RSS per worker at 1000 partitions (MB)", "<= 150", Met, 145},
		// The round with nothing to hand off is left out: 7.5 and 7.9.
		{"partition dimension: hand-off after a SIGKILL at 1000 partitions, session timeout 6 s + 2 s (s)", "<= 8", Met, 7.7},
	} {
		tg, ok := got[c.name]
		if !ok {
			t.Errorf("no target %q among %v", c.name, rep.Targets)
			continue
		}
		if tg.Want != c.want || tg.Verdict != c.verdict || math.Abs(tg.Value-c.value) > 1e-9 {
			t.Errorf("target %q: %+v, want %s, %s, value %.4f", c.name, tg, c.want, c.verdict, c.value)
		}
	}
	if h := got["partition dimension: hand-off after a SIGKILL at 1000 partitions, session timeout 6 s + 2 s (s)"].Spread; h.N != 2 || h.Min != 7.5 || h.Max != 7.9 {
		t.Errorf("hand-off spread %+v: want the two rounds that handed off, 7.5–7.9", h)
	}
	if s := got["partition dimension: tenure at 1000 / tenure at 12 partitions (jobs/s)"].Spread; math.Abs(s.Min-70.0/110) > 1e-9 || math.Abs(s.Max-0.8) > 1e-9 {
		t.Errorf("rate spread %+v: want round over round, 0.64–0.80", s)
	}
	rep.WhereTimeGoes = whereTimeGoes(rep)
	var sb strings.Builder
	Print(&sb, rep)
	for _, w := range []string{"partition dimension side by side", "RATE RATIO", "AT-LEAST-ONCE JOBS/S",
		"80 (70–90)", "85 (75–95)", "0.94", "2.70", "1.50", "not met", "tenure at 1000 partitions: process 1.10 + Postgres 1.60 = 2.70"} {
		if !strings.Contains(sb.String(), w) {
			t.Errorf("the report lacks %q:\n%s", w, sb.String())
		}
	}
	// The rate and the CPU targets are explained by the same rows: once.
	if len(rep.WhereTimeGoes) != 1 {
		t.Errorf("where the time goes: %q, want one line", rep.WhereTimeGoes)
	}

	// One count: nothing to compare tenure's own rate and CPU with, and a
	// hand-off never measured is unclear, not met.
	one := &Report{DimensionSessionTimeout: 6, PartitionCounts: []PartitionCount{count(12, round{100, 1, 1, 100, 0, 0, 100})}}
	var names []string
	for _, tg := range targets(one) {
		names = append(names, tg.Name)
		if strings.Contains(tg.Name, "hand-off") && (tg.Verdict != Unclear || !strings.Contains(tg.Note, "no round")) {
			t.Errorf("hand-off never measured: %+v, want unclear", tg)
		}
	}
	if all := strings.Join(names, "; "); len(names) != 3 || strings.Contains(all, "/ tenure at") || strings.Contains(all, "CPU per job") {
		t.Errorf("one count's targets: %q, want tenure / at-least-once, RSS and hand-off", names)
	}
}

// The report says how long each program's writes were held behind the gate
// while its backlog was produced, with any run whose gate opened early; a
// report whose runs have none (an older JSON) says nothing of it.
func TestBenchGateReport(t *testing.T) {
	var c PartitionCount
	c.Partitions = 1000
	early := "the backlog took longer than 20s to produce: the rest came while the programs drained it"
	for i, g := range []struct {
		tenure, alo float64
		note        string
	}{{3.1, 2.9, ""}, {3.5, 20, early}} {
		c.addTenure(PartitionRun{Partitions: 1000, Round: i, JobsPerSec: 1, GatedSeconds: g.tenure})
		c.addAtLeastOnce(Result{JobsPerSec: 1, GatedSeconds: g.alo, Note: g.note})
	}
	var sb strings.Builder
	writeGate(&sb, []PartitionCount{c})
	want := "1000 partitions: tenure's writes held 3.3 (3.1–3.5) s, the at-least-once program's 11.4 (2.9–20.0) s (" + early + ")"
	if !strings.Contains(sb.String(), want) {
		t.Errorf("the report's gate lines:\n%s\nwant %q", sb.String(), want)
	}
	for i := range c.Tenure.Runs {
		c.Tenure.Runs[i].GatedSeconds, c.AtLeastOnce.Runs[i].GatedSeconds = 0, 0
	}
	sb.Reset()
	writeGate(&sb, []PartitionCount{c})
	if sb.Len() != 0 {
		t.Errorf("runs without a gate: %q, want nothing", sb.String())
	}
}

// The partition dimension's backlog gives every partition of its largest
// count at least dimBatches full batches, and never less than the
// throughput runs' backlog.
func TestBenchDimensionJobs(t *testing.T) {
	for _, c := range []struct{ jobs, batchMax, parts, want int }{
		{600_000, 1000, 1000, 3_000_000},
		{600_000, 1000, 12, 600_000},
		{5_000_000, 1000, 1000, 5_000_000},
		{600_000, 100, 1000, 600_000},
	} {
		if got := dimensionJobs(c.jobs, c.batchMax, c.parts); got != c.want {
			t.Errorf("dimensionJobs(%d, %d, %d) = %d, want %d", c.jobs, c.batchMax, c.parts, got, c.want)
		}
	}
}

// A partition dimension that failed leaves the report without it, saying
// why, and without its targets; the rest is still printed. A dimension cut
// short would pair tenure's rounds with the at-least-once program's rounds
// that never came.
func TestBenchDimensionFailureKeepsTheReport(t *testing.T) {
	var c PartitionCount
	db := 1.0
	c.addTenure(PartitionRun{Partitions: 1000, Workers: 3, Jobs: 1000, JobsPerSec: 100, CPUPerMJobs: 1, DBCPUPerMJobs: &db, PeakRSSMB: 140, HandedOff: 3, Held: 3, HandOffSeconds: 7})
	rep := &Report{Repeat: 1, DimensionSessionTimeout: 6, Settings: map[string]any{},
		Results:         []Row{{Name: "tenure", Runs: []Result{{Jobs: 1000, JobsPerSec: 500}}, JobsPerSec: Stat{N: 1, Median: 500, Min: 500, Max: 500}}},
		PartitionCounts: []PartitionCount{c},
		Partitions:      []PartitionRun{{Partitions: 1000, Workers: 3, JobsPerSec: 100}},
	}
	if !slices.ContainsFunc(targets(rep), func(tg Target) bool { return strings.HasPrefix(tg.Name, "partition dimension") }) {
		t.Fatal("no dimension target before the dimension is dropped: the test checks nothing")
	}
	dropDimension(rep, errors.New("partition dimension, at-least-once, 1000 partitions: the measured process exited"))
	rep.Targets = targets(rep)
	for _, tg := range rep.Targets {
		if strings.HasPrefix(tg.Name, "partition dimension") {
			t.Errorf("a dropped dimension's target is judged: %+v", tg)
		}
	}
	var sb strings.Builder
	Print(&sb, rep)
	out := sb.String()
	if !strings.Contains(out, "partition dimension: not reported, a run failed (its targets are not judged): partition dimension, at-least-once, 1000 partitions: the measured process exited") {
		t.Errorf("the report does not say why the dimension is missing:\n%s", out)
	}
	if strings.Contains(out, "partition dimension (the same") || strings.Contains(out, "side by side") || !strings.Contains(out, "\ntenure ") {
		t.Errorf("want the throughput rows and no dimension table:\n%s", out)
	}
}
