package parallel

import (
	"runtime"
	"sync/atomic"
	"testing"
)

// Run covers every item exactly once, in contiguous ranges that follow
// each other in order of their part, whatever the split.
func TestRunCoversEachItemOnce(t *testing.T) {
	cpus := runtime.GOMAXPROCS(0)
	for _, tt := range []struct {
		name     string
		n, least int
		parts    int
	}{
		{"nothing", 0, 10, 1},
		{"below the least", 9, 10, 1},
		{"one part's worth", 10, 10, 1},
		{"one part a CPU at most", 1000 * cpus, 10, cpus},
		{"parts of at least least", 25, 10, min(cpus, 2)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := Parts(tt.n, tt.least); got != tt.parts {
				t.Fatalf("Parts(%d, %d) = %d, want %d", tt.n, tt.least, got, tt.parts)
			}
			seen := make([]atomic.Int32, tt.n)
			los := make([]int, tt.parts)
			his := make([]int, tt.parts)
			Run(tt.n, tt.least, func(p, lo, hi int) {
				los[p], his[p] = lo, hi
				for i := lo; i < hi; i++ {
					seen[i].Add(1)
				}
			})
			for i := range seen {
				if c := seen[i].Load(); c != 1 {
					t.Errorf("item %d done %d times", i, c)
				}
			}
			for p := 1; p < tt.parts; p++ {
				if los[p] != his[p-1] {
					t.Errorf("part %d starts at %d, part %d ends at %d", p, los[p], p-1, his[p-1])
				}
			}
		})
	}
}
