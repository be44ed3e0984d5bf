package scale

import (
	"math"
	"strings"
	"testing"
)

func TestParseBuckets(t *testing.T) {
	const metric = "kubeproxy_network_programming_duration_seconds"
	tests := []struct {
		name, page string
		want       Buckets
		wantErr    bool
	}{{
		name: "upstream: no family label",
		page: metric + `_bucket{le="0.25"} 3
` + metric + `_bucket{le="1"} 5
` + metric + `_bucket{le="+Inf"} 6
` + metric + "_sum 2.5\n" + metric + "_count 6\n",
		want: Buckets{0.25: 3, 1: 5, math.Inf(1): 6},
	}, {
		name: "ours: the IPv4 series only",
		page: metric + `_bucket{ip_family="IPv4",le="0.25"} 2
` + metric + `_bucket{ip_family="IPv6",le="0.25"} 9
` + metric + `_bucket{ip_family="IPv4",le="+Inf"} 2
`,
		want: Buckets{0.25: 2, math.Inf(1): 2},
	}, {
		name:    "absent",
		page:    "other_bucket{le=\"1\"} 1\n",
		wantErr: true,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseBuckets(strings.NewReader(tt.page), metric)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
			for le, n := range tt.want {
				if got[le] != n {
					t.Errorf("le=%v: got %d, want %d", le, got[le], n)
				}
			}
		})
	}
}

func TestBucketsQuantile(t *testing.T) {
	inf := math.Inf(1)
	tests := []struct {
		name     string
		b        Buckets
		q        float64
		want     float64
		wantOver bool
	}{
		{"first bucket interpolates from 0", Buckets{0.25: 4, 0.5: 4, inf: 4}, 0.5, 0.125, false},
		{"second bucket", Buckets{0.25: 2, 0.5: 4, inf: 4}, 0.75, 0.375, false},
		{"all in one bucket, top", Buckets{0.25: 0, 1: 10, inf: 10}, 1, 1, false},
		{"past the largest bound", Buckets{0.25: 1, 1: 1, inf: 3}, 0.99, 1, true},
		{"empty", Buckets{0.25: 0, inf: 0}, 0.5, math.NaN(), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, over := tt.b.Quantile(tt.q)
			if over != tt.wantOver || !(got == tt.want || math.IsNaN(got) && math.IsNaN(tt.want)) {
				t.Errorf("Quantile(%v) = %v, %v; want %v, %v", tt.q, got, over, tt.want, tt.wantOver)
			}
		})
	}
}

func TestBucketsMerge(t *testing.T) {
	inf := math.Inf(1)
	before := Buckets{1: 1, inf: 2}
	a := Buckets{1: 3, inf: 5}.Minus(before)
	a.Add(Buckets{1: 1, inf: 1})
	if a[1] != 3 || a.Count() != 4 {
		t.Errorf("merged %v, want 1:3 +Inf:4", a)
	}
}
