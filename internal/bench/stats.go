package bench

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Stat is one figure over the repeats of a run: the median, and the
// spread as the smallest and the largest value.
type Stat struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	N      int     `json:"n"`
}

// summarize is the median and spread of vs (NaNs left out; the median of an
// even count is the mean of the middle two).
func summarize(vs []float64) Stat {
	var xs []float64
	for _, v := range vs {
		if !math.IsNaN(v) {
			xs = append(xs, v)
		}
	}
	if len(xs) == 0 {
		return Stat{}
	}
	slices.Sort(xs)
	n := len(xs)
	med := xs[n/2]
	if n%2 == 0 {
		med = (xs[n/2-1] + xs[n/2]) / 2
	}
	return Stat{Median: med, Min: xs[0], Max: xs[n-1], N: n}
}

// Verdicts of a target.
const (
	Met     = "met"
	Unclear = "unclear"
	NotMet  = "not met"
)

// verdict judges a target want (">= X" or "<= X") by the whole spread: met
// only when all of [min, max] is on the right side, not met when all of it
// is on the wrong side, unclear when it straddles the bound.
func verdict(s Stat, want string) string {
	want = strings.TrimSpace(want)
	if len(want) < 3 || s.N == 0 {
		return Unclear
	}
	x, err := strconv.ParseFloat(strings.TrimSpace(want[2:]), 64)
	if err != nil {
		return Unclear
	}
	switch want[:2] {
	case ">=":
		switch {
		case s.Min >= x:
			return Met
		case s.Max < x:
			return NotMet
		}
	case "<=":
		switch {
		case s.Max <= x:
			return Met
		case s.Min > x:
			return NotMet
		}
	}
	return Unclear
}

// ratioStat is a over b: the value is the ratio of the medians, the spread
// that of the per-repeat ratios (repeat i of a over repeat i of b: the two
// ran in the same round, on the same machine state).
func ratioStat(a, b []float64) Stat {
	var rs []float64
	for i := range min(len(a), len(b)) {
		if b[i] > 0 {
			rs = append(rs, a[i]/b[i])
		}
	}
	s := summarize(rs)
	if ma, mb := summarize(a), summarize(b); mb.Median > 0 && s.N > 0 {
		s.Median = ma.Median / mb.Median
	}
	return s
}

// cell formats a figure as "median (min–max)".
func (s Stat) cell(prec int) string {
	if s.N == 0 {
		return "-"
	}
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', prec, 64) }
	if s.N == 1 {
		return f(s.Median)
	}
	return fmt.Sprintf("%s (%s–%s)", f(s.Median), f(s.Min), f(s.Max))
}
