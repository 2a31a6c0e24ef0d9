package main

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// dist is a latency distribution in milliseconds. Samples that never arrived
// (a task that had not run by the deadline) are censored: they count as later
// than every sample, and a percentile that falls among them is shown as "> max".
type dist struct {
	N        int `json:"n"`
	Censored int `json:"censored,omitempty"`
	// CensorMs is a lower bound for every censored sample (the wait after the last
	// due time); percentiles among them are +Inf.
	CensorMs float64 `json:"censor_ms,omitempty"`
	MinMs    float64 `json:"min_ms"`
	P50Ms    float64 `json:"p50_ms"`
	P99Ms    float64 `json:"p99_ms"`
	P999Ms   float64 `json:"p999_ms"`
	MaxMs    float64 `json:"max_ms"`
}

// newDist summarizes samples in nanoseconds plus censored missing ones
// (nearest-rank percentiles, like kjob bench).
func newDist(ns []int64, censored int) dist {
	if len(ns) == 0 {
		return dist{Censored: censored, MinMs: math.Inf(1), P50Ms: math.Inf(1), P99Ms: math.Inf(1), P999Ms: math.Inf(1), MaxMs: math.Inf(1)}
	}
	s := slices.Clone(ns)
	slices.Sort(s)
	total := len(s) + censored
	q := func(p float64) float64 {
		i := int(math.Ceil(p*float64(total))) - 1
		i = max(i, 0)
		if i >= len(s) {
			return math.Inf(1)
		}
		return ms(s[i])
	}
	return dist{N: total, Censored: censored, MinMs: ms(s[0]), P50Ms: q(0.5), P99Ms: q(0.99), P999Ms: q(0.999), MaxMs: q(1)}
}

func ms(ns int64) float64 { return math.Round(float64(ns)/1e3) / 1e3 }

// fmtMs prints a latency in ms with precision that suits its size.
func fmtMs(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "never"
	case math.Abs(v) >= 1000:
		return fmt.Sprintf("%.2f s", v/1000)
	case math.Abs(v) >= 100:
		return fmt.Sprintf("%.0f ms", v)
	case math.Abs(v) >= 10:
		return fmt.Sprintf("%.1f ms", v)
	}
	return fmt.Sprintf("%.2f ms", v)
}

// fmtNum prints a count with thousands separators.
func fmtNum(v float64) string {
	if math.IsInf(v, 0) || math.IsNaN(v) {
		return "-"
	}
	neg := v < 0
	s := strconv.FormatInt(int64(math.Round(math.Abs(v))), 10)
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// fmtRatio prints how many times better kjob is (x > 1) or worse (x < 1).
func fmtRatio(x float64) string {
	switch {
	case math.IsNaN(x):
		return "-"
	case math.IsInf(x, 1):
		return "∞"
	case x >= 100:
		return fmt.Sprintf("%.0f×", x)
	case x >= 10:
		return fmt.Sprintf("%.1f×", x)
	}
	return fmt.Sprintf("%.2f×", x)
}

// better is the factor by which a beats b: higher is better when up, else lower.
func better(a, b float64, up bool) float64 {
	if up {
		if b == 0 {
			return math.Inf(1)
		}
		return a / b
	}
	if math.IsInf(b, 1) && !math.IsInf(a, 1) {
		return math.Inf(1)
	}
	if a <= 0 {
		// Sub-microsecond: compare against a microsecond floor rather than divide by 0.
		a = 0.001
	}
	return b / a
}

// fmtDistMs prints a percentile of d, "> bound" when it falls among censored samples.
func fmtDistMs(d dist, v float64) string {
	if math.IsInf(v, 1) && d.CensorMs > 0 {
		return "> " + fmtMs(d.CensorMs) + " (not run)"
	}
	return fmtMs(v)
}

// fireRates is the sustained rate (fires over the span first to last) and the
// busiest one-second window.
func fireRates(startNs []int64) (sustained, peak float64) {
	if len(startNs) < 2 {
		return 0, 0
	}
	s := slices.Clone(startNs)
	slices.Sort(s)
	if span := float64(s[len(s)-1]-s[0]) / 1e9; span > 0 {
		sustained = float64(len(s)-1) / span
	}
	j := 0
	for i := range s {
		for s[i]-s[j] >= 1e9 {
			j++
		}
		peak = max(peak, float64(i-j+1))
	}
	return sustained, peak
}
