package bench

// The latency breakdown: where a job's time goes between its produce call
// and its batch's commit, by stage, from the bench's own times (produce
// called, acknowledged), the worker's stage log (tenure worker --stage-log:
// a fetch's records buffered in the Kafka client, a batch formed, its
// handler done, its COMMIT returned) and the fence log's commit time (what
// the end-to-end figure is read from). All are wall-clock times of the same
// machine.

import (
	"bufio"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
)

// stages is a worker's stage log, by partition, sorted by offset.
type stages struct {
	fetched map[int32][]stageFetch
	batches map[int32][]stageBatch
}

type stageFetch struct {
	offset, at int64
}

type stageBatch struct {
	from, to                   int64
	formed, handled, committed int64
}

// jobTimes are one job's times (unix nanoseconds) as the bench saw them.
type jobTimes struct {
	partition                 int32
	offset                    int64
	produced, acked, fenceLog int64
}

// stageNames are the stages in order; a job's stages add up to its time
// from the produce call to the worker's COMMIT returning.
var stageNames = []string{"produce", "fetch", "queue", "handler", "commit"}

// stageWhat says what each stage is, for the report.
var stageWhat = map[string]string{
	"produce": "produce called to the broker's ack",
	"fetch":   "ack to the record buffered in the worker's Kafka client",
	"queue":   "buffered to its batch formed (the lane's buffer: fetched ahead, waiting for the batch before)",
	"handler": "batch formed to the handler done (BEGIN, the handler's statements)",
	"commit":  "handler done to COMMIT returned (the fence statement and COMMIT)",
}

func readStages(file string) (*stages, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st := &stages{fetched: map[int32][]stageFetch{}, batches: map[int32][]stageBatch{}}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		var n []int64
		for _, x := range fs[1:] {
			v, err := strconv.ParseInt(x, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("line %q: %w", sc.Text(), err)
			}
			n = append(n, v)
		}
		switch {
		case fs[0] == "F" && len(n) == 3:
			st.fetched[int32(n[0])] = append(st.fetched[int32(n[0])], stageFetch{n[1], n[2]})
		case fs[0] == "B" && len(n) == 6:
			st.batches[int32(n[0])] = append(st.batches[int32(n[0])], stageBatch{n[1], n[2], n[3], n[4], n[5]})
		default:
			return nil, fmt.Errorf("line %q: not a fetch or a batch", sc.Text())
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	for p := range st.fetched {
		sort.SliceStable(st.fetched[p], func(i, j int) bool { return st.fetched[p][i].offset < st.fetched[p][j].offset })
	}
	for p := range st.batches {
		sort.Slice(st.batches[p], func(i, j int) bool { return st.batches[p][i].from < st.batches[p][j].from })
	}
	return st, nil
}

// breakdown returns, in milliseconds, each stage's p50 and p99 over the
// jobs ("stage_NAME_p50", "stage_NAME_p99"), the mean of each stage over
// the slowest 1% of jobs by end-to-end time ("tail_NAME": what the p99 is
// made of), and how far the fence log's commit time (the end-to-end
// figure's) is from the worker's COMMIT returning ("fencelog_vs_commit_p50",
// "_p99": negative when the fence log's is earlier).
func (st *stages) breakdown(jobs []jobTimes) map[string]float64 {
	type row struct {
		e2e float64
		v   [5]float64
		fl  float64
	}
	var rows []row
	for _, j := range jobs {
		fs := st.fetched[j.partition]
		k := sort.Search(len(fs), func(k int) bool { return fs[k].offset > j.offset }) - 1
		bs := st.batches[j.partition]
		m := sort.Search(len(bs), func(m int) bool { return bs[m].to > j.offset })
		if k < 0 || m == len(bs) || bs[m].from > j.offset {
			continue
		}
		f, b := fs[k], bs[m]
		ms := func(a, z int64) float64 { return float64(z-a) / 1e6 }
		rows = append(rows, row{e2e: ms(j.produced, j.fenceLog),
			v:  [5]float64{ms(j.produced, j.acked), ms(j.acked, f.at), ms(f.at, b.formed), ms(b.formed, b.handled), ms(b.handled, b.committed)},
			fl: ms(b.committed, j.fenceLog)})
	}
	out := map[string]float64{"stage_jobs": float64(len(rows))}
	var nb, nj int64
	for _, bs := range st.batches {
		for _, b := range bs {
			nb, nj = nb+1, nj+b.to-b.from
		}
	}
	if nb > 0 {
		out["batch_jobs_mean"] = float64(nj) / float64(nb)
	}
	if len(rows) == 0 {
		return out
	}
	pct := func(vs []float64, q float64) float64 {
		sort.Float64s(vs)
		return vs[min(len(vs)-1, int(q*float64(len(vs))))]
	}
	for i, name := range stageNames {
		vs := make([]float64, len(rows))
		for r := range rows {
			vs[r] = rows[r].v[i]
		}
		out["stage_"+name+"_p50"] = pct(vs, 0.50)
		out["stage_"+name+"_p99"] = pct(vs, 0.99)
	}
	fl := make([]float64, len(rows))
	for r := range rows {
		fl[r] = rows[r].fl
	}
	out["fencelog_vs_commit_p50"] = pct(fl, 0.50)
	out["fencelog_vs_commit_p99"] = pct(fl, 0.99)
	sort.Slice(rows, func(a, b int) bool { return rows[a].e2e < rows[b].e2e })
	tail := rows[min(len(rows)-1, int(0.99*float64(len(rows)))):]
	for i, name := range stageNames {
		var sum float64
		for _, r := range tail {
			sum += r.v[i]
		}
		out["tail_"+name] = sum / float64(len(tail))
	}
	return out
}

// LatencyVariant is a latency run beside the default: its name, its
// worker flags (after Config.WorkerFlags) and environment (NAME=VALUE
// entries among the flags, e.g. GOGC=200).
type LatencyVariant struct {
	Name        string
	WorkerFlags []string
	Env         []string
}

// VariantLatency is a variant's latency runs and their medians and spreads.
type VariantLatency struct {
	Name        string               `json:"name"`
	WorkerFlags string               `json:"worker_flags"`
	Env         string               `json:"env,omitempty"`
	Runs        []map[string]float64 `json:"runs"`
	Latency     map[string]Stat      `json:"latency_ms"`
}

// summarizeLatency is every figure's median and spread over the runs.
func summarizeLatency(runs []map[string]float64) map[string]Stat {
	out := map[string]Stat{}
	for k := range runs[0] {
		var vs []float64
		for _, l := range runs {
			if v, ok := l[k]; ok {
				vs = append(vs, v)
			}
		}
		out[k] = summarize(vs)
	}
	return out
}

// ParseLatencyVariants reads --latency-variants: "NAME=FLAGS" entries
// separated by ";", e.g. "linger=--batch-linger 5ms;big=--batch-max 5000".
func ParseLatencyVariants(s string) ([]LatencyVariant, error) {
	var out []LatencyVariant
	for _, e := range strings.Split(s, ";") {
		if strings.TrimSpace(e) == "" {
			continue
		}
		name, flags, ok := strings.Cut(e, "=")
		name = strings.TrimSpace(name)
		if !ok || name == "" || strings.ContainsAny(name, " \t") {
			return nil, fmt.Errorf("%q is not NAME=FLAGS", e)
		}
		v := LatencyVariant{Name: name}
		for _, f := range strings.Fields(flags) {
			if k, _, ok := strings.Cut(f, "="); ok && k != "" && strings.Trim(k, "ABCDEFGHIJKLMNOPQRSTUVWXYZ_0123456789") == "" {
				v.Env = append(v.Env, f) // an environment variable of the worker, e.g. GOGC=200
				continue
			}
			v.WorkerFlags = append(v.WorkerFlags, f)
		}
		out = append(out, v)
	}
	return out, nil
}
