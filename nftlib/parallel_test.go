package nftlib

import (
	"runtime"
	"sync"
	"testing"
)

// TestInParallelFrom checks that the parts cover every item once, each
// part a contiguous range in order of its number, and that there are as
// many as parallelParts says: one per CPU, or partsPerCPU per CPU with
// enough work, never more parts for one CPU than another.
func TestInParallelFrom(t *testing.T) {
	for _, tc := range []struct {
		procs, n, least, parts int
	}{
		{2, 100, 256, 1},
		{2, 600, 256, 2},
		{2, 1000, 256, 2}, // 3 parts' worth: 2, not 3 for 2 CPUs
		{2, 10000, 256, 8},
		{3, 6149, 2048, 3},
		{3, 9000, 2048, 3},
		{3, 20000, 2048, 9},
		{1, 50000, 256, 1},
	} {
		func() {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(tc.procs))
			if got := parallelParts(tc.n, tc.least); got != tc.parts {
				t.Fatalf("%+v: %d parts, want %d", tc, got, tc.parts)
			}
			seen := make([]int, tc.n)
			ranges := make([][2]int, tc.parts)
			var mu sync.Mutex
			InParallelFrom(tc.n, tc.least, func(p, lo, hi int) {
				mu.Lock()
				defer mu.Unlock()
				ranges[p] = [2]int{lo, hi}
				for i := lo; i < hi; i++ {
					seen[i]++
				}
			})
			for i, c := range seen {
				if c != 1 {
					t.Fatalf("%+v: item %d done %d times", tc, i, c)
				}
			}
			for p := 1; p < tc.parts; p++ {
				if ranges[p][0] != ranges[p-1][1] {
					t.Fatalf("%+v: part %d starts at %d, after %d", tc, p, ranges[p][0], ranges[p-1][1])
				}
			}
		}()
	}
}
