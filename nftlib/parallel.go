package nftlib

import (
	"runtime"
	"sync"
)

// ParallelMin is the least amount of work (fragments, chains) worth
// splitting across CPUs: below it, starting goroutines costs more than it
// saves, and small syncs stay on one goroutine.
const ParallelMin = 2048

// parallelParts is how many parts inParallel splits n items into: one per
// CPU, each of at least least items.
func parallelParts(n, least int) int {
	return max(1, min(runtime.GOMAXPROCS(0), n/least))
}

// inParallel runs fn over [0, n) split into parallelParts(n, ParallelMin) contiguous
// ranges, part p covering [lo, hi) (ranges in order of p), each on a
// goroutine of its own unless there is one part, and returns once all are
// done.
func inParallel(n int, fn func(p, lo, hi int)) { InParallelFrom(n, ParallelMin, fn) }

// InParallelFrom is inParallel with parts of at least least items, for
// work whose items cost more than a message's encoding.
func InParallelFrom(n, least int, fn func(p, lo, hi int)) {
	parts := parallelParts(n, least)
	if parts == 1 {
		fn(0, 0, n)
		return
	}
	var wg sync.WaitGroup
	for p := range parts {
		wg.Go(func() {
			lo, hi := partRange(n, parts, p)
			fn(p, lo, hi)
		})
	}
	wg.Wait()
}

// partRange is the range of part p of n items split into parts.
func partRange(n, parts, p int) (lo, hi int) {
	return n * p / parts, n * (p + 1) / parts
}
