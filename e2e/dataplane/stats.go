package dataplane

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// Stats summarises one series of samples.
type Stats struct {
	N             int
	P50, P90, P99 time.Duration
}

// Summarise returns the nearest-rank percentiles of ds (left unsorted).
// Percentiles, not means: the machine is shared and a few samples wait for
// a CPU.
func Summarise(ds []time.Duration) Stats {
	if len(ds) == 0 {
		return Stats{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := func(p float64) time.Duration {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return s[max(i, 0)]
	}
	return Stats{N: len(s), P50: rank(0.50), P90: rank(0.90), P99: rank(0.99)}
}

// Micros formats a duration in microseconds with one decimal.
func Micros(d time.Duration) string {
	return fmt.Sprintf("%.1f", float64(d.Nanoseconds())/1000)
}

// String is "p50 / p90 / p99" in microseconds.
func (s Stats) String() string {
	return Micros(s.P50) + " / " + Micros(s.P90) + " / " + Micros(s.P99)
}
