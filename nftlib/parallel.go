package nftlib

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// ParallelMin is the least amount of work (service ports, chains) worth
// splitting across CPUs: below it, starting goroutines costs more than it
// saves, and small syncs stay on one goroutine.
const ParallelMin = 2048

// partsPerCPU is how many parts each CPU gets when there is enough work:
// on a shared machine a thread the kernel preempts holds up only the part
// it is on, while the others take the rest, rather than half the work.
const partsPerCPU = 4

// ParallelParts is how many parts InParallel splits n items into.
func ParallelParts(n int) int { return parallelParts(n, ParallelMin) }

// parallelParts is one part per CPU, each of at least least items, or
// partsPerCPU parts per CPU when there is that much work: a multiple of
// the CPUs, so that no CPU gets more parts than another.
func parallelParts(n, least int) int {
	procs, p := runtime.GOMAXPROCS(0), n/least
	switch {
	case procs == 1:
		return 1
	case p <= procs:
		return max(1, p)
	}
	return procs * min(partsPerCPU, p/procs)
}

// InParallel runs fn over [0, n) split into ParallelParts(n) contiguous
// ranges, part p covering [lo, hi) (ranges in order of p), on one goroutine
// per CPU that takes the next part as it finishes one (or on the caller's
// alone when there is one part), and returns once all are done.
func InParallel(n int, fn func(p, lo, hi int)) { InParallelFrom(n, ParallelMin, fn) }

// InParallelFrom is InParallel with parts of at least least items, for
// work whose items cost more than a message's encoding.
func InParallelFrom(n, least int, fn func(p, lo, hi int)) {
	parts := parallelParts(n, least)
	if parts == 1 {
		fn(0, 0, n)
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(parts, runtime.GOMAXPROCS(0)) {
		wg.Go(func() {
			for p := int(next.Add(1) - 1); p < parts; p = int(next.Add(1) - 1) {
				lo, hi := partRange(n, parts, p)
				fn(p, lo, hi)
			}
		})
	}
	wg.Wait()
}

// partRange is the range of part p of n items split into parts.
func partRange(n, parts, p int) (lo, hi int) {
	return n * p / parts, n * (p + 1) / parts
}
