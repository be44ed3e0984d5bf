package main

import (
	"runtime/debug"
	"runtime/metrics"
)

// largeTxHeadroom is how much the Go runtime's memory may grow above
// what it holds after the collection largeTxMemory starts with, while a
// large transaction is encoded and sent.
const largeTxHeadroom = 64 << 20

// largeTxMemory is the backend's OnLargeTx: a full sync at 50k Services
// encodes about 0.5 GB of netlink messages in anonymous mappings outside
// the Go heap (nftlib.Batch) and holds them for its one sendmsg, on top
// of a live heap of about 0.5 GB. The garbage collector does not count
// the mappings: left alone, its goal (twice the live heap) let the
// build's garbage stay resident beside them, and that sum set the
// process's peak RSS. So before encoding, the garbage is collected and
// its pages handed back to the kernel, and until the transaction is
// sent a soft memory limit a little above what remains keeps the heap
// from growing on top of the messages. The limit is the runtime's soft
// one: should the live heap itself outgrow it (a burst of watch events
// during the send), the collector caps its own CPU rather than spin, and
// done lifts the limit again. Small syncs never get here (see
// nft.largeTxRules).
func largeTxMemory() (done func()) {
	debug.FreeOSMemory()
	held := runtimeHeld()
	prev := debug.SetMemoryLimit(-1)
	debug.SetMemoryLimit(min(prev, held+max(held/8, largeTxHeadroom)))
	return func() { debug.SetMemoryLimit(prev) }
}

// runtimeHeld is the memory the Go runtime holds from the kernel, as the
// soft memory limit counts it: all it mapped less what it released.
func runtimeHeld() int64 {
	s := []metrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64() - s[1].Value.Uint64())
}
