package main

import (
	"context"
	"io/fs"
	"log/slog"
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"

	"github.com/kube-nftproxy/kube-nftproxy/internal/errlog"
	"github.com/kube-nftproxy/kube-nftproxy/internal/loglevel"
	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/proxier"
)

// cgroupMemoryMargin is the share of the cgroup's memory limit kept out
// of the Go runtime's soft limit (one in cgroupMemoryMargin: half), for
// what the cgroup is charged beyond the runtime's own memory. The largest
// part is the kernel's: it charges nftables objects to the memory cgroup
// of the process that makes them (6.18 does), so the rules the proxy
// programs count against its limit for as long as they exist (about as
// much as the process's steady RSS); during a full sync come its netlink
// messages, mapped outside the Go heap (see largeTxMemory). Both grow
// with the ruleset, as the heap does, hence a share rather than a fixed
// size. As the kernel's
// part is about the runtime's own, a proxy that fits its limit at all
// holds less than half of it in the runtime: a soft limit of half does
// not leave the collector running without end (it would take up to half
// the CPU). A smaller margin did not help: under a limit that GOGC's
// pacing overran, soft limits above half of it were OOM-killed too, half
// and below synced (TestCgroupMemoryCeiling).
const cgroupMemoryMargin = 2

// setCgroupMemoryLimit sets the Go runtime's soft memory limit a margin
// below the memory limit of the process's cgroup, read through fsys
// (rooted at "/"), and returns it (0: none set). Paced by GOGC alone, a
// full sync's heap grows to twice the live one, past a pod's limit that
// sits a little above the proxy's need: the OOM killer ends it mid-sync,
// where a soft limit makes the collector work harder and stay under. A
// GOMEMLIMIT of the user's (userLimit, "off" too) is left alone.
func setCgroupMemoryLimit(fsys fs.FS, userLimit string, log *slog.Logger) int64 {
	if userLimit != "" {
		return 0
	}
	hard, file, err := cgroupMemoryLimit(fsys)
	if err != nil || hard == 0 {
		log.Log(context.Background(), loglevel.V2, "no cgroup memory limit found; the collector is paced by GOGC", "err", err)
		return 0
	}
	soft := hard - hard/cgroupMemoryMargin
	debug.SetMemoryLimit(soft)
	log.Info("memory: the Go runtime's soft limit set below the cgroup's limit; GOMEMLIMIT overrides it",
		"cgroupLimit", hard, "file", file, "softLimit", soft)
	return soft
}

// memoryPressure tells when the live heap nears the soft limit set from
// the cgroup's (ceiling): the collector then runs more and more often
// (up to half the CPU), and a larger ruleset would be OOM-killed. It warns
// once when the heap a sync leaves reaches nine tenths of the ceiling, and
// says once when it falls under three quarters again, so that a heap
// hovering at the mark does not flap.
type memoryPressure struct {
	ceiling int64 // 0: no ceiling, nothing to tell
	high    errlog.Mark
}

// synced is told the live heap after a sync.
func (p *memoryPressure) synced(live uint64, log *slog.Logger) {
	if p.ceiling <= 0 {
		return
	}
	l := int64(live)
	switch rose, fell := p.high.Update(l >= p.ceiling/10*9, l < p.ceiling/4*3); {
	case rose:
		log.Warn("memory: the live heap is near the soft limit set from the cgroup's memory limit; the garbage collector runs more, and more Services may get the proxy OOM-killed: raise the pod's memory limit",
			"liveHeap", l, "softLimit", p.ceiling)
	case fell:
		log.Info("memory: the live heap is back under three quarters of the soft limit", "liveHeap", l, "softLimit", p.ceiling)
	}
}

// largeTxHeadroom is how much the Go runtime's memory may grow above
// what it holds after the collection largeTxMemory starts with, while a
// large transaction is encoded and sent.
const largeTxHeadroom = 64 << 20

// largeTxMemory is the backend's OnLargeTx: a large full sync encodes its
// netlink messages, about the size of its live heap, in anonymous
// mappings outside the Go heap (nftlib's transaction) and holds them for
// its one sendmsg, on top of that heap. The garbage collector does not count
// the mappings: left alone, its goal (twice the live heap) let the
// build's garbage stay resident beside them, and that sum set the
// process's peak RSS. So before encoding, the garbage is collected and
// its pages handed back to the kernel, and until the transaction is
// sent a soft memory limit a little above what remains keeps the heap
// from growing on top of the messages. The limit is the runtime's soft
// one: should the live heap itself outgrow it (a burst of watch events
// during the send), the collector caps its own CPU rather than spin, and
// done lifts the limit again. Small syncs never get here (see
// nft.Strategy.LargeTxRules). While it is encoded, the backend lets go of the
// sync's rules as they are written, and twice (OnLargeTxRound, at two and
// four fifths) the proxy hands their pages back with debug.FreeOSMemory:
// the rules and their messages are then never resident together. A
// limit set before (the user's GOMEMLIMIT, or the cgroup's,
// setCgroupMemoryLimit) stays a ceiling and is set back.
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

// idleHeadroom is the least garbage the heap may gather while idle
// before a collection (see idleGC).
const idleHeadroom = 16 << 20

// idleGC paces the garbage collector by a soft memory limit instead of
// GOGC while the proxy is idle (its last sync had nothing to write).
//
// Why: with GOGC on, the runtime forces a full collection every two
// minutes even when nothing was allocated, and marking the live heap (the
// applied rules, the caches) was most of an idle proxy's CPU. An idle
// proxy allocates little (a periodic sync's check), so with GOGC off and a
// limit of what the process holds when it goes idle (after a collection)
// plus a small headroom (idleHeadroom or a sixteenth), a collection runs
// only once that garbage has piled up, and the process never holds more
// than that limit: steady RSS is the live heap and that headroom (GOGC
// itself lets the heap reach twice the live one).
//
// The risk of pacing by a limit is a live heap that outgrows it: every
// collection then frees too little and the next follows at once (the
// runtime caps that at about half the CPU). So the first sync that
// writes anything, and the first collection after which the live heap
// has grown by half the headroom, give GOGC back its pacing; a GOGC or
// GOMEMLIMIT set by the user is left alone. The cgroup's ceiling
// (setCgroupMemoryLimit) stays a ceiling: idle pacing never lifts it.
type idleGC struct {
	// ceiling is the soft memory limit the proxy set from its cgroup's
	// (setCgroupMemoryLimit; 0: none): a limit of ours, not the user's,
	// so idle pacing runs under it and returns to it.
	ceiling int64

	mu   sync.Mutex
	idle bool
	// percent and limit are GOGC and the memory limit before idle;
	// live the live heap then, headroom the limit's room above what the
	// process held.
	percent        int
	limit          int64
	live, headroom uint64
}

// synced is told after each successful sync whether it wrote anything.
func (g *idleGC) synced(changed bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case !changed && !g.idle:
		g.enter()
	case changed && g.idle:
		g.leave()
	}
}

func (g *idleGC) enter() {
	percent, limit := gcSettings()
	if percent < 0 || limit != math.MaxInt64 && (g.ceiling == 0 || limit != g.ceiling) {
		return // the user's GOGC=off or GOMEMLIMIT: it paces already
	}
	// The busy time's garbage (up to the live heap again under GOGC) is
	// collected and handed back first, so the limit follows the live
	// heap: steady RSS drops to it. One collection per busy spell, in
	// the MinSyncPeriod the loop waits after a sync anyway.
	debug.FreeOSMemory()
	held := runtimeHeld()
	g.headroom = max(uint64(held)/16, idleHeadroom)
	g.live = heapLive()
	g.percent = debug.SetGCPercent(-1)
	g.limit = debug.SetMemoryLimit(min(held+int64(g.headroom), limit))
	g.idle = true
	g.watch()
}

func (g *idleGC) leave() {
	debug.SetGCPercent(g.percent)
	debug.SetMemoryLimit(g.limit)
	g.idle = false
}

// gcSentinel is garbage as soon as it is made: its cleanup tells that a
// collection ran. (A pointer field keeps it out of the tiny allocator,
// whose blocks are freed together.)
type gcSentinel struct{ _ *int }

// watch calls collected after the next collection.
func (g *idleGC) watch() {
	runtime.AddCleanup(new(gcSentinel), func(g *idleGC) { g.collected() }, g)
}

// collected runs after each collection while idle: it ends idle pacing
// when the live heap grew, and watches for the next collection otherwise.
func (g *idleGC) collected() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.idle {
		return
	}
	if heapLive() > g.live+g.headroom/2 {
		g.leave()
		return
	}
	g.watch()
}

// gcSettings returns GOGC and the soft memory limit.
func gcSettings() (percent int, limit int64) {
	percent = debug.SetGCPercent(-1)
	debug.SetGCPercent(percent)
	return percent, debug.SetMemoryLimit(-1)
}

// heapLive is the heap the last collection found live.
func heapLive() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// firstSyncGOGC is GOGC while IPVS mode's first sync runs (see
// leanFirstSync).
const firstSyncGOGC = 25

// leanFirstSync runs a backend's syncs with the collector at
// firstSyncGOGC until one succeeds. IPVS mode's first sync builds its
// plans and helper elements on top of the informers' caches, and under
// GOGC 100 the heap grew to twice that live set, which set the process's
// peak RSS above upstream's IPVS mode's (docs/benchmarks.md, "IPVS mode's
// memory"). Its time goes to the kernel's IPVS commands, so the
// extra collections cost little of it; later syncs change little and
// run under GOGC again. A GOGC of the user's lower than this, or off, is kept.
type leanFirstSync struct {
	proxier.Backend
	done bool
}

func (l *leanFirstSync) Sync(ctx context.Context, st *model.State) (proxier.SyncResult, error) {
	if l.done {
		return l.Backend.Sync(ctx, st)
	}
	prev := debug.SetGCPercent(firstSyncGOGC)
	if prev < firstSyncGOGC { // lower, or off
		debug.SetGCPercent(prev)
	}
	res, err := l.Backend.Sync(ctx, st)
	debug.SetGCPercent(prev)
	l.done = err == nil
	return res, err
}
