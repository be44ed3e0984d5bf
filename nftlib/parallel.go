package nftlib

// ParallelMin is the least amount of work (fragments, chains) worth
// splitting across CPUs: below it, starting goroutines costs more than it
// saves, and small syncs stay on one goroutine.
const ParallelMin = 2048
