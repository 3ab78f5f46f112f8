package bench

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

func rowByName(rep *Report) map[string]*Row {
	by := map[string]*Row{}
	for i := range rep.Results {
		if r := &rep.Results[i]; r.Skipped == "" && len(r.Runs) > 0 {
			by[r.Name] = r
		}
	}
	return by
}

func rate(x Result) float64 { return x.JobsPerSec }

// targets judges the report's figures. A ratio's value is the ratio of the
// medians, its spread that of the per-repeat ratios; a target is met only
// when the whole spread is on its side (verdict).
func targets(rep *Report) []Target {
	by := rowByName(rep)
	var t []Target
	ratio := func(name, a, b string, f func(Result) float64, want, note string) {
		ra, rb := by[a], by[b]
		if ra == nil || rb == nil {
			return
		}
		s := ratioStat(ra.col(f), rb.col(f))
		t = append(t, Target{Name: name, Value: s.Median, Spread: s, Want: want, Note: note})
	}
	cpuNote := ""
	if r := by["tenure"]; r != nil && r.DBCPUPerMJobs == nil {
		cpuNote = "the process's CPU only: the PostgreSQL server is not on this machine"
	}
	ratio("tenure CPU per job (worker + Postgres) / at-least-once's", "tenure", "at-least-once", totalCPU, "<= 1.05", cpuNote)
	ratio("tenure / at-least-once (jobs/s)", "tenure", "at-least-once", rate, ">= 1.0", "")
	ratio("tenure / COPY ceiling, same table (jobs/s)", "tenure", "copy-ceiling", rate, ">= 0.75", "")
	if r := by["tenure"]; r != nil {
		t = append(t, Target{Name: "tenure peak RSS (MB)", Value: r.PeakRSSMB.Median, Spread: r.PeakRSSMB, Want: "<= 150"})
	}
	if p99, ok := rep.Latency["p99"]; ok && p99.N > 0 {
		tg := Target{Name: fmt.Sprintf("p99 end-to-end latency at %.0f jobs/s (ms)", rep.LatencyRate), Value: p99.Median, Spread: p99, Want: "<= 50"}
		if a := rep.Latency["achieved_rate"]; a.Min < 0.95*rep.LatencyRate {
			tg.Verdict = Unclear
			tg.Note = fmt.Sprintf("the producer achieved only %s jobs/s of the %.0f asked for: not measured at that rate", a.cell(0), rep.LatencyRate)
		}
		t = append(t, tg)
	}
	ratio("tenure-traced / tenure (jobs/s)", "tenure-traced", "tenure", rate, ">= 0.90", "")
	ratio("fenced / unfenced (jobs/s)", "tenure", "tenure-unfenced", rate, ">= 0.95", "")
	ratio("tenure / naive (jobs/s)", "tenure", "naive", rate, ">= 100", "")
	t = append(t, dimensionTargets(rep)...)
	for i := range t {
		if t[i].Verdict == "" {
			t[i].Verdict = verdict(t[i].Spread, t[i].Want)
		}
	}
	return t
}

// dimensionBase and dimensionTop are the partition counts the dimension's
// targets compare: 12 (the throughput rows' default) or else the smallest,
// and the largest. ok is false without a dimension.
func dimensionBase(rep *Report) (base, top *PartitionCount, ok bool) {
	for i := range rep.PartitionCounts {
		c := &rep.PartitionCounts[i]
		if len(c.Tenure.Runs) == 0 {
			continue
		}
		if base == nil || c.Partitions == 12 || (base.Partitions != 12 && c.Partitions < base.Partitions) {
			base = c
		}
		if top == nil || c.Partitions > top.Partitions {
			top = c
		}
	}
	return base, top, top != nil
}

// dimensionTargets judges the partition dimension at its largest count
// against tenure's own at the base count (dimensionBase) and against the
// at-least-once program's at the same count; like the others, by the
// whole spread of the rounds (ratios: round i over round i).
func dimensionTargets(rep *Report) []Target {
	base, top, ok := dimensionBase(rep)
	if !ok {
		return nil
	}
	var t []Target
	ratio := func(name string, a, b *Row, f func(Result) float64, want, note string) {
		if len(a.Runs) == 0 || len(b.Runs) == 0 {
			return
		}
		s := ratioStat(a.col(f), b.col(f))
		t = append(t, Target{Name: name, Value: s.Median, Spread: s, Want: want, Note: note})
	}
	n, n0 := top.Partitions, base.Partitions
	if top != base {
		ratio(fmt.Sprintf("partition dimension: tenure at %d / tenure at %d partitions (jobs/s)", n, n0), &top.Tenure, &base.Tenure, rate, ">= 0.7", "")
	}
	ratio(fmt.Sprintf("partition dimension: tenure / at-least-once at %d partitions (jobs/s)", n), &top.Tenure, &top.AtLeastOnce, rate, ">= 0.9", "")
	if top != base {
		note := ""
		if top.Tenure.DBCPUPerMJobs == nil || base.Tenure.DBCPUPerMJobs == nil {
			note = "the workers' CPU only: the PostgreSQL server's was not measured"
		}
		ratio(fmt.Sprintf("partition dimension: tenure's CPU per job (workers + Postgres) at %d / at %d partitions", n, n0), &top.Tenure, &base.Tenure, totalCPU, "<= 1.3", note)
	}
	t = append(t, Target{Name: fmt.Sprintf("partition dimension: tenure's peak RSS per worker at %d partitions (MB)", n),
		Value: top.Tenure.PeakRSSMB.Median, Spread: top.Tenure.PeakRSSMB, Want: "<= 150"})
	h := Target{Name: fmt.Sprintf("partition dimension: hand-off after a SIGKILL at %d partitions, session timeout %g s + 2 s (s)", n, rep.DimensionSessionTimeout),
		Value: top.HandOffSeconds.Median, Spread: top.HandOffSeconds, Want: "<= " + strconv.FormatFloat(rep.DimensionSessionTimeout+2, 'f', -1, 64)}
	if top.HandOffSeconds.N == 0 {
		h.Verdict, h.Note = Unclear, "no round had a partition with jobs left to hand off"
	}
	return append(t, h)
}

// whereTimeGoes explains the targets that are not met: the cost per job
// split between the worker and the PostgreSQL server (from /proc), against
// the program it is compared with, and the worker's CPU profile.
func whereTimeGoes(rep *Report) []string {
	by := rowByName(rep)
	var out []string
	med := func(s *Stat) float64 {
		if s == nil {
			return 0
		}
		return s.Median
	}
	split := func(r *Row) string {
		if r.DBCPUPerMJobs == nil {
			return fmt.Sprintf("%s: process %.2f CPU s per 1M jobs (the server's not measured)", r.Name, r.CPUPerMJobs.Median)
		}
		tot := r.CPUPerMJobs.Median + med(r.DBCPUPerMJobs)
		return fmt.Sprintf("%s: process %.2f + Postgres %.2f = %.2f CPU s per 1M jobs (Postgres %.0f%%)", r.Name,
			r.CPUPerMJobs.Median, med(r.DBCPUPerMJobs), tot, 100*med(r.DBCPUPerMJobs)/tot)
	}
	for _, t := range rep.Targets {
		if t.Verdict == Met {
			continue
		}
		var line string
		switch {
		case strings.HasPrefix(t.Name, "partition dimension: "):
			line = dimensionWhere(rep, t, split)
		case strings.Contains(t.Name, "at-least-once"):
			if a, b := by["tenure"], by["at-least-once"]; a != nil && b != nil {
				line = fmt.Sprintf("%s: %s; %s; tenure's extra: process %+.2f, Postgres %+.2f", t.Name, split(a), split(b),
					a.CPUPerMJobs.Median-b.CPUPerMJobs.Median, med(a.DBCPUPerMJobs)-med(b.DBCPUPerMJobs))
			}
		case strings.Contains(t.Name, "COPY ceiling"):
			if a, b := by["tenure"], by["copy-ceiling"]; a != nil && b != nil {
				line = fmt.Sprintf("%s: %s; %s", t.Name, split(a), split(b))
			}
		case strings.Contains(t.Name, "traced"):
			if a, b := by["tenure-traced"], by["tenure"]; a != nil && b != nil {
				line = fmt.Sprintf("%s: %s; %s", t.Name, split(a), split(b))
			}
		case strings.Contains(t.Name, "fenced / unfenced"):
			if a, b := by["tenure"], by["tenure-unfenced"]; a != nil && b != nil {
				line = fmt.Sprintf("%s: %s; %s", t.Name, split(a), split(b))
			}
		case strings.Contains(t.Name, "latency"):
			if ack, ok := rep.Latency["produce_ack_p99"]; ok {
				line = fmt.Sprintf("%s: of the p99 %s ms, producing alone (produce called to the broker's acknowledgement) took %s ms at p99", t.Name, t.Spread.cell(1), ack.cell(1))
				if tail := tailLine(rep.Latency); tail != "" {
					line += "; " + tail
				}
				if busy, ok := rep.Latency["machine_busy_cores"]; ok && busy.N > 0 {
					line += fmt.Sprintf("; the machine had %s of its %.0f cores busy at that rate", busy.cell(2), rep.Latency["cores"].Median)
				}
			}
		case strings.Contains(t.Name, "RSS"):
			line = t.Name + ": the worker's fetch buffers (--partition-buffer-bytes per partition, --worker-buffer-bytes per worker) bound its memory"
		}
		// Two targets explained alike (the same rows) get one line.
		if line != "" && !slices.ContainsFunc(out, func(o string) bool { return strings.HasSuffix(o, strings.TrimPrefix(line, t.Name+": ")) }) {
			out = append(out, line)
		}
	}
	if len(out) > 0 && rep.Profile != nil && len(rep.Profile.Areas) > 0 {
		var top []string
		for _, a := range rep.Profile.Areas[:min(4, len(rep.Profile.Areas))] {
			top = append(top, fmt.Sprintf("%s %.0f%%", a.Name, a.Percent))
		}
		out = append(out, "the worker's own share, by its CPU profile (below): "+strings.Join(top, ", "))
	}
	return out
}

// dimensionWhere explains a partition dimension target not met: the cost
// per job at the largest count split as split does, against tenure's at
// the base count and the at-least-once program's at the same count.
func dimensionWhere(rep *Report, t Target, split func(*Row) string) string {
	base, top, ok := dimensionBase(rep)
	if !ok {
		return ""
	}
	switch {
	case strings.Contains(t.Name, "RSS"):
		return fmt.Sprintf("%s: at %d partitions each worker holds about %d of them, each with its fetch buffer (--partition-buffer-bytes), all of them within --worker-buffer-bytes; the at-least-once program's processes peaked at %s MB",
			t.Name, top.Partitions, (top.Partitions+2)/3, top.AtLeastOnce.PeakRSSMB.cell(0))
	case strings.Contains(t.Name, "hand-off"):
		var claimed []float64
		for _, r := range rep.Partitions {
			if r.Partitions == top.Partitions && r.HandedOff > 0 {
				claimed = append(claimed, r.HandOffClaimSeconds)
			}
		}
		return fmt.Sprintf("%s: the last of the killed worker's partitions was claimed within %s s of the kill (the group's share: the session timeout is %.0f s), first committed on within %s s (the rest: the new owners' lanes getting to it)",
			t.Name, summarize(claimed).cell(1), rep.DimensionSessionTimeout, top.HandOffSeconds.cell(1))
	}
	parts := []string{split(&top.Tenure)}
	if base != top {
		parts = append(parts, split(&base.Tenure))
	}
	if len(top.AtLeastOnce.Runs) > 0 {
		parts = append(parts, split(&top.AtLeastOnce))
	}
	return t.Name + ": " + strings.Join(parts, "; ")
}

// Print writes the report as tables.
func Print(w io.Writer, rep *Report) {
	fmt.Fprintf(w, "tenure bench: %v jobs of %v bytes over %v partitions, %v keys; %s, %s cores, %s\n",
		rep.Settings["jobs"], rep.Settings["value_bytes"], rep.Settings["partitions"], rep.Settings["keys"],
		rep.Machine["cpu"], rep.Machine["cores"], rep.Machine["postgres"])
	if len(rep.Results) > 0 || rep.Latency != nil {
		// The partition dimension says its own rounds.
		fmt.Fprintf(w, "each figure: median (min–max) of %d runs; rates from the first row's commit to the last\n", rep.Repeat)
	}
	for _, n := range rep.Notes {
		fmt.Fprintf(w, "%s\n", n)
	}
	if f, _ := rep.Settings["worker_flags"].(string); f != "" {
		fmt.Fprintf(w, "tenure workers run with %s\n", f)
	}
	fmt.Fprintln(w)
	switch {
	case len(rep.Results) == 0 && rep.Latency == nil:
		fmt.Fprintln(w, "the partition dimension only (--dimension-only): no throughput rows, latency or scaling runs")
	case len(rep.Results) == 0:
		fmt.Fprintln(w, "latency runs only (--latency-only): no throughput rows")
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if len(rep.Results) > 0 {
		fmt.Fprintln(tw, "RUN\tJOBS/S\tDRAIN S\tCPU S/1M JOBS\tPOSTGRES CPU S/1M\tBOTH S/1M\tPEAK RSS MB\tWHAT")
	}
	var short []string
	for _, r := range rep.Results {
		if r.Skipped != "" {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\t-\t%s\n", r.Name, r.Skipped)
			continue
		}
		db, both := "-", "-"
		if r.DBCPUPerMJobs != nil {
			db, both = r.DBCPUPerMJobs.cell(2), r.TotalCPUPerMJobs.cell(2)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Name, r.JobsPerSec.cell(0), r.DrainSeconds.cell(1), r.CPUPerMJobs.cell(2), db, both, r.PeakRSSMB.cell(0), r.What)
		if r.DrainSeconds.Min < 5 {
			short = append(short, r.Name)
		}
	}
	_ = tw.Flush()
	if len(short) > 0 {
		fmt.Fprintf(w, "drained for less than 5 s in at least one run: %s\n", strings.Join(short, ", "))
	}
	if l := rep.Latency; l != nil {
		fmt.Fprintf(w, "\nend-to-end latency (produce called to the batch's commit), asked for %.0f jobs/s, achieved %s jobs/s, %s jobs per run:\n"+
			"  p50 %s ms, p99 %s ms, max %s ms; of which producing (produce called to the broker's acknowledgement): p50 %s ms, p99 %s ms\n",
			rep.LatencyRate, l["achieved_rate"].cell(0), l["jobs"].cell(0), l["p50"].cell(1), l["p99"].cell(1), l["max"].cell(1),
			l["produce_ack_p50"].cell(1), l["produce_ack_p99"].cell(1))
		printStages(w, "  ", l)
		for _, v := range rep.LatencyVariants {
			vl := v.Latency
			fmt.Fprintf(w, "  beside it, in turns in each round: %s (worker flags %q, environment %q): achieved %s jobs/s; p50 %s ms, p99 %s ms, max %s ms; producing p99 %s ms\n",
				v.Name, v.WorkerFlags, v.Env, vl["achieved_rate"].cell(0), vl["p50"].cell(1), vl["p99"].cell(1), vl["max"].cell(1), vl["produce_ack_p99"].cell(1))
			printStages(w, "    ", vl)
		}
	}
	dbs := func(v *float64) string {
		if v == nil {
			return "-"
		}
		return strconv.FormatFloat(*v, 'f', 2, 64)
	}
	if len(rep.Scaling) > 0 {
		fmt.Fprintln(w, "\nscaling (tenure, ledger; one run each):")
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  RUN\tJOBS/S\tDRAIN S\tCPU S/1M JOBS\tPOSTGRES CPU S/1M\tPEAK RSS MB (per worker)")
		for _, r := range rep.Scaling {
			fmt.Fprintf(tw, "  %s\t%.0f\t%.1f\t%.2f\t%s\t%.0f\n", r.Name, r.JobsPerSec, r.DrainSeconds, r.CPUPerMJobs, dbs(r.DBCPUPerMJobs), r.PeakRSSMB)
		}
		_ = tw.Flush()
	}
	if len(rep.Partitions) > 0 {
		backlog := "the same backlog"
		if rep.DimensionJobs > 0 {
			backlog = fmt.Sprintf("the same backlog of %d jobs at every count, at least %d batches a partition at the largest, produced behind a gate (below)", rep.DimensionJobs, dimBatches)
		}
		fmt.Fprintf(w, "\npartition dimension (%s, 3 workers,\n", backlog)
		fmt.Fprintln(w, "  --session-timeout 6s; one run per count and round; rate, CPU and RSS up to the SIGKILL of one worker a third of the way through, CPU from the moment every partition was claimed;")
		fmt.Fprintln(w, "  held: the partitions the killed worker held at the kill (its last claims); hand-off: the longest time from the kill to another worker's first commit on one of them that still had jobs, and to its claim):")
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		// The round, when there is more than one.
		round := func(p PartitionRun) string { return "" }
		head := ""
		if slices.ContainsFunc(rep.Partitions, func(p PartitionRun) bool { return p.Round > 0 }) {
			round = func(p PartitionRun) string { return strconv.Itoa(p.Round+1) + "\t" }
			head = "ROUND\t"
		}
		fmt.Fprintln(tw, "  "+head+"PARTITIONS\tWORKERS\tJOBS/S\tCPU S/1M JOBS\tPOSTGRES CPU S/1M\tPEAK RSS MB (per worker)\tCLAIMS/S AT START\tHELD\tHANDED OFF\tHAND-OFF MAX S\tCLAIMED MAX S")
		for _, p := range rep.Partitions {
			fmt.Fprintf(tw, "  %s%d\t%d\t%.0f\t%.2f\t%s\t%.0f\t%.0f\t%d\t%d\t%.1f\t%.1f\t%s\n", round(p), p.Partitions, p.Workers, p.JobsPerSec, p.CPUPerMJobs, dbs(p.DBCPUPerMJobs),
				p.PeakRSSMB, p.ClaimsPerSec, p.Held, p.HandedOff, p.HandOffSeconds, p.HandOffClaimSeconds, p.Note)
		}
		_ = tw.Flush()
	}
	if len(rep.PartitionCounts) > 0 {
		printDimension(w, rep)
	}
	if rep.DimensionFailed != "" {
		fmt.Fprintf(w, "\npartition dimension: not reported, a run failed (its targets are not judged): %s\n", rep.DimensionFailed)
	}
	fmt.Fprintln(w, "\ntargets (ratios: the ratio of the medians, spread: the lowest and highest per-repeat ratio; met only when the whole spread is on the right side, unclear when it straddles):")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, t := range rep.Targets {
		spread := "-"
		if t.Spread.N > 1 {
			spread = fmt.Sprintf("(%.2f–%.2f)", t.Spread.Min, t.Spread.Max)
		}
		note := ""
		if t.Note != "" {
			note = ": " + t.Note
		}
		fmt.Fprintf(tw, "  %s\t%.2f\t%s\twant %s\t%s%s\n", t.Name, t.Value, spread, t.Want, t.Verdict, note)
	}
	_ = tw.Flush()
	if p := rep.Profile; p != nil {
		fmt.Fprintf(w, "\nwhere a tenure worker's CPU goes (one more tenure run with --cpu-profile, %.0f jobs/s; go tool pprof %s):\n", p.JobsPerSec, p.File)
		if p.Note != "" {
			fmt.Fprintf(w, "  %s\n", p.Note)
		}
		if len(p.Areas) > 0 {
			fmt.Fprintf(w, "  %.1f CPU s; by the nearest library on the stack:", p.CPUSeconds)
			for _, a := range p.Areas {
				if a.Percent >= 0.5 {
					fmt.Fprintf(w, " %s %.1f%%;", a.Name, a.Percent)
				}
			}
			fmt.Fprintln(w)
			fmt.Fprint(w, "  top functions (flat):")
			for _, f := range p.Top {
				fmt.Fprintf(w, " %s %.1f%%;", f.Name, f.Percent)
			}
			fmt.Fprintln(w)
		}
	}
	if len(rep.WhereTimeGoes) > 0 {
		fmt.Fprintln(w, "\nwhere the time goes (targets not met or unclear; medians):")
		for _, l := range rep.WhereTimeGoes {
			fmt.Fprintf(w, "  - %s\n", l)
		}
	}
}

// tailLine says what the slowest 1% of jobs spent in each stage (means,
// medians over the runs), largest first.
func tailLine(l map[string]Stat) string {
	type part struct {
		name string
		ms   float64
	}
	var parts []part
	for _, n := range stageNames {
		if st, ok := l["tail_"+n]; ok && st.N > 0 {
			parts = append(parts, part{n, st.Median})
		}
	}
	if len(parts) == 0 {
		return ""
	}
	slices.SortStableFunc(parts, func(a, b part) int {
		switch {
		case a.ms > b.ms:
			return -1
		case a.ms < b.ms:
			return 1
		}
		return 0
	})
	var s []string
	for _, p := range parts {
		s = append(s, fmt.Sprintf("%s %.1f ms", p.name, p.ms))
	}
	return "the slowest 1% of jobs spent, on average, " + strings.Join(s, ", ") + " (stages: see the latency breakdown)"
}

// printStages writes the latency breakdown by stage.
func printStages(w io.Writer, indent string, l map[string]Stat) {
	if st, ok := l["stage_jobs"]; !ok || st.N == 0 || st.Median == 0 {
		return
	}
	fmt.Fprintf(w, "%sby stage (the worker's stage log; ms, median (min–max) over the runs):\n", indent)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "%s  STAGE\tP50\tP99\tSLOWEST 1%% (MEAN)\tWHAT\n", indent)
	for _, n := range stageNames {
		fmt.Fprintf(tw, "%s  %s\t%s\t%s\t%s\t%s\n", indent, n, l["stage_"+n+"_p50"].cell(1), l["stage_"+n+"_p99"].cell(1), l["tail_"+n].cell(1), stageWhat[n])
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "%s  batches of %s jobs on average; CPU per 1M jobs: worker %s s, Postgres %s s; worker peak RSS %s MB\n", indent,
		l["batch_jobs_mean"].cell(0), l["worker_cpu_s_per_mjobs"].cell(2), l["postgres_cpu_s_per_mjobs"].cell(2), l["worker_peak_rss_mb"].cell(0))
	if st, ok := l["machine_busy_cores"]; ok && st.N > 0 {
		fmt.Fprintf(w, "%s  cores busy on average while it ran: the machine %s of %s (worker %s, Postgres %s, the bench's producer and in-process broker %s)\n", indent,
			st.cell(2), strconv.FormatFloat(l["cores"].Median, 'f', 0, 64), l["worker_busy_cores"].cell(2), l["postgres_busy_cores"].cell(2), l["bench_busy_cores"].cell(2))
	}
	fmt.Fprintf(w, "%s  the fence log's commit time (the end-to-end figure's) minus the worker's COMMIT returning: p50 %s ms, p99 %s ms\n", indent,
		l["fencelog_vs_commit_p50"].cell(1), l["fencelog_vs_commit_p99"].cell(1))
}

// printDimension writes the partition dimension side by side: tenure's
// workers and the at-least-once program's processes at every count, with
// tenure's ratio to it.
func printDimension(w io.Writer, rep *Report) {
	rounds := 0
	for _, c := range rep.PartitionCounts {
		rounds = max(rounds, len(c.Tenure.Runs))
	}
	over := "one round"
	if rounds > 1 {
		over = fmt.Sprintf("median (min–max) of %d rounds", rounds)
	}
	fmt.Fprintf(w, "\npartition dimension side by side: tenure's 3 workers and the at-least-once program's 3 processes (one COPY per poll across partitions, no fencing) on the same backlog,\n"+
		"  each up to a third of it (tenure's: the SIGKILL); %s; CPU: the processes' and Postgres's together, from the group settled (start-up is the claims column's); ratios: tenure's over the at-least-once program's, of the medians:\n", over)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  PARTITIONS\tTENURE JOBS/S\tAT-LEAST-ONCE JOBS/S\tRATE RATIO\tTENURE CPU S/1M\tAT-LEAST-ONCE CPU S/1M\tCPU RATIO\tTENURE PEAK RSS MB\tAT-LEAST-ONCE PEAK RSS MB\tHAND-OFF MAX S")
	ratio := func(a, b Stat) string {
		if a.N == 0 || b.N == 0 || b.Median == 0 {
			return "-"
		}
		return strconv.FormatFloat(a.Median/b.Median, 'f', 2, 64)
	}
	cpu := func(r Row) Stat {
		if r.TotalCPUPerMJobs != nil {
			return *r.TotalCPUPerMJobs
		}
		return r.CPUPerMJobs
	}
	for _, c := range rep.PartitionCounts {
		t, a := c.Tenure, c.AtLeastOnce
		fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", c.Partitions, t.JobsPerSec.cell(0), a.JobsPerSec.cell(0), ratio(t.JobsPerSec, a.JobsPerSec),
			cpu(t).cell(2), cpu(a).cell(2), ratio(cpu(t), cpu(a)), t.PeakRSSMB.cell(0), a.PeakRSSMB.cell(0), c.HandOffSeconds.cell(1))
	}
	_ = tw.Flush()
	writeGate(w, rep.PartitionCounts)
}

// writeGate says how long each program's writes waited behind the gate
// while its backlog was produced (gatedBacklog), and any run whose gate
// opened before the backlog was all there (its rate then includes the
// producer's pace).
func writeGate(w io.Writer, counts []PartitionCount) {
	gated := func(r Row) (Stat, []string) {
		var gs []float64
		var notes []string
		for _, x := range r.Runs {
			if x.GatedSeconds > 0 {
				gs = append(gs, x.GatedSeconds)
			}
			if x.Note != "" && !slices.Contains(notes, x.Note) {
				notes = append(notes, x.Note)
			}
		}
		return summarize(gs), notes
	}
	var lines []string
	for _, c := range counts {
		tg, tn := gated(c.Tenure)
		ag, an := gated(c.AtLeastOnce)
		if tg.N == 0 && ag.N == 0 {
			continue
		}
		l := fmt.Sprintf("  %d partitions: tenure's writes held %s s, the at-least-once program's %s s", c.Partitions, tg.cell(1), ag.cell(1))
		if notes := slices.Concat(tn, an); len(notes) > 0 {
			l += " (" + strings.Join(notes, "; ") + ")"
		}
		lines = append(lines, l)
	}
	if len(lines) == 0 {
		return
	}
	fmt.Fprintln(w, "\nthe backlog, produced once the group settled while each program's writes waited behind a lock on its table (the programs fetch it meanwhile), then released:\n"+
		"  the rates are the programs' own draining what is all there, not the producer's pace (it runs on the same cores):")
	for _, l := range lines {
		fmt.Fprintln(w, l)
	}
}
