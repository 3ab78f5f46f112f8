package bench

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// The breakdown splits each job's time into its stages from the bench's
// times and the worker's stage log, and the slowest 1% says what the tail
// is made of.
func TestLatencyBreakdown(t *testing.T) {
	ms := int64(1e6)
	file := filepath.Join(t.TempDir(), "stages.txt")
	// Partition 0: offsets 0-9 buffered at 10 ms, batch [0,10) formed at
	// 12, handled at 15, committed at 20; offsets 10-19 buffered at 30,
	// batch [10,20) formed at 40 (waited for nothing in this made-up log),
	// handled 41, committed 100.
	log := "F 0 0 10000000\nF 0 10 30000000\nB 0 0 10 12000000 15000000 20000000\nB 0 10 20 40000000 41000000 100000000\n"
	if err := os.WriteFile(file, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := readStages(file)
	if err != nil {
		t.Fatal(err)
	}
	var jobs []jobTimes
	for off := range int64(20) {
		produced, acked := int64(0), 5*ms
		if off >= 10 {
			produced, acked = 20*ms, 25*ms
		}
		done := int64(19 * ms)
		if off >= 10 {
			done = 99 * ms
		}
		jobs = append(jobs, jobTimes{partition: 0, offset: off, produced: produced, acked: acked, fenceLog: done})
	}
	out := st.breakdown(jobs)
	want := map[string]float64{
		"stage_jobs": 20, "batch_jobs_mean": 10,
		"stage_produce_p50": 5, "stage_fetch_p50": 5, "stage_queue_p50": 10, "stage_handler_p50": 3, "stage_commit_p50": 59,
		"stage_queue_p99": 10, "stage_commit_p99": 59,
		// the slowest 1% (here one job) is of the second batch
		"tail_produce": 5, "tail_fetch": 5, "tail_queue": 10, "tail_handler": 1, "tail_commit": 59,
		"fencelog_vs_commit_p50": -1,
	}
	for k, v := range want {
		if got, ok := out[k]; !ok || math.Abs(got-v) > 1e-9 {
			t.Errorf("%s = %v (present %v), want %v", k, got, ok, v)
		}
	}
	// A job the stage log does not cover is left out, not guessed.
	out = st.breakdown(append(jobs, jobTimes{partition: 1, offset: 0}))
	if out["stage_jobs"] != 20 {
		t.Errorf("stage_jobs = %v with a job of a partition the log lacks, want 20", out["stage_jobs"])
	}
}

func TestParseLatencyVariants(t *testing.T) {
	vs, err := ParseLatencyVariants("gogc=GOGC=400 --batch-max 10; linger=--batch-linger 2ms;")
	if err != nil {
		t.Fatal(err)
	}
	if len(vs) != 2 || vs[0].Name != "gogc" || !slices.Equal(vs[0].Env, []string{"GOGC=400"}) || !slices.Equal(vs[0].WorkerFlags, []string{"--batch-max", "10"}) ||
		vs[1].Name != "linger" || !slices.Equal(vs[1].WorkerFlags, []string{"--batch-linger", "2ms"}) || len(vs[1].Env) != 0 {
		t.Errorf("parsed %+v", vs)
	}
	for _, bad := range []string{"noequals", "=--batch-max 1", "two words=--x"} {
		if _, err := ParseLatencyVariants(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}
