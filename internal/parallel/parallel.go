// Package parallel splits work over the items [0, n) into contiguous
// parts, one goroutine a part, for work large enough to be worth it.
package parallel

import (
	"runtime"
	"sync"
)

// Parts is how many parts Run splits n items into: one per CPU, each of
// at least least items.
func Parts(n, least int) int {
	return max(1, min(runtime.GOMAXPROCS(0), n/least))
}

// Run runs fn over [0, n) split into Parts(n, least) contiguous ranges,
// part p covering [lo, hi) (ranges in order of p), each on a goroutine of
// its own unless there is one part, and returns once all are done.
func Run(n, least int, fn func(p, lo, hi int)) {
	parts := Parts(n, least)
	if parts == 1 {
		fn(0, 0, n)
		return
	}
	var wg sync.WaitGroup
	for p := range parts {
		wg.Go(func() {
			lo, hi := Range(n, parts, p)
			fn(p, lo, hi)
		})
	}
	wg.Wait()
}

// Range is the range of part p of n items split into parts.
func Range(n, parts, p int) (lo, hi int) {
	return n * p / parts, n * (p + 1) / parts
}
