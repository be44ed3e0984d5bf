package scale

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// ProgrammingMetric is the histogram of network programming latency both
// proxies export: from the EndpointSlice annotation
// endpoints.kubernetes.io/last-change-trigger-time to the sync that
// programmed the change.
const ProgrammingMetric = "kubeproxy_network_programming_duration_seconds"

// Buckets is one histogram series' cumulative bucket counts by upper bound
// (le; +Inf included), so that histograms of many proxies and two moments
// can be merged and subtracted.
type Buckets map[float64]int

// ReadBuckets reads histogram metric's buckets from the /metrics page at url.
func ReadBuckets(ctx context.Context, hc *http.Client, url, metric string) (Buckets, error) {
	var b Buckets
	err := readMetrics(ctx, hc, url, func(r io.Reader) (err error) {
		b, err = ParseBuckets(r, metric)
		return err
	})
	return b, err
}

// ParseBuckets reads histogram metric's buckets from a Prometheus text
// page: the IPv4 series where the series carry an ip_family label (ours),
// the only one where they do not (upstream's).
func ParseBuckets(r io.Reader, metric string) (Buckets, error) {
	b := Buckets{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), metric+"_bucket")
		if !ok {
			continue
		}
		_, labels, value, ok := splitSample("bucket" + rest)
		if !ok || strings.Contains(labels, "ip_family=") && !strings.Contains(labels, `ip_family="IPv4"`) {
			continue
		}
		le, ok := label(labels, "le")
		if !ok {
			continue
		}
		bound, err1 := strconv.ParseFloat(le, 64)
		count, err2 := strconv.ParseFloat(value, 64)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("%s_bucket%s: not a number", metric, rest)
		}
		b[bound] = int(count)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(b) == 0 {
		return nil, errors.New("no " + metric + " buckets in the metrics")
	}
	return b, nil
}

// label returns the value of label name in `{a="x",name="y"}`.
func label(labels, name string) (string, bool) {
	_, rest, ok := strings.Cut(labels, name+`="`)
	if !ok {
		return "", false
	}
	v, _, ok := strings.Cut(rest, `"`)
	return v, ok
}

// Add adds o's counts to b's.
func (b Buckets) Add(o Buckets) {
	for le, n := range o {
		b[le] += n
	}
}

// Minus is the observations between before and b.
func (b Buckets) Minus(before Buckets) Buckets {
	out := Buckets{}
	for le, n := range b {
		out[le] = n - before[le]
	}
	return out
}

// Count is the number of observations (the +Inf bucket's count).
func (b Buckets) Count() int { return b[math.Inf(1)] }

// Quantile estimates quantile q (0 < q <= 1) as Prometheus's
// histogram_quantile does: linearly within the bucket the rank falls in
// (from 0 for the first). A rank past the largest finite bound is that
// bound; over returns whether it was (the figure is then a lower bound).
// NaN when there are no observations.
func (b Buckets) Quantile(q float64) (v float64, over bool) {
	total := b.Count()
	if total == 0 {
		return math.NaN(), false
	}
	les := make([]float64, 0, len(b))
	for le := range b {
		les = append(les, le)
	}
	slices.Sort(les)
	rank := q * float64(total)
	lower, below := 0.0, 0
	for _, le := range les {
		// The first bucket that reaches rank holds more than those below.
		n := b[le]
		if float64(n) >= rank {
			if math.IsInf(le, 1) {
				return lower, true
			}
			return lower + (le-lower)*(rank-float64(below))/float64(n-below), false
		}
		lower, below = le, n
	}
	return lower, true
}
