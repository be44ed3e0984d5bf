package ipvs

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/internal/ipvsnl"
	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
	"github.com/kube-nftproxy/kube-nftproxy/proxier"
)

// BackendConfig is what the IPVS backend needs besides the kernel.
type BackendConfig struct {
	Plan Config
	Sync SyncConfig
	// NodeAddrs lists the node's local addresses on every interface but
	// kube-ipvs0 (loopback may be among them: the plan leaves it out of
	// NodePorts). Nil means none.
	NodeAddrs func() ([]netip.Addr, error)
	// NewHelper returns the Helper for a node: its pod CIDRs shape the
	// helper table's rules. It is called at the first sync and again
	// when the node's description changes.
	NewHelper func(model.Node) (Helper, error)
	// CleanupHelper, when set, removes what the helpers hold (kube-ipvs0
	// and the helper tables) for Cleanup; removed is false when there
	// was nothing.
	CleanupHelper func() (removed bool, err error)
	// CheckEvery is how often a sync first compares the kernel with what
	// was applied (0: never): the virtual and real servers, kube-ipvs0's
	// addresses and, without a change monitor, the helper tables. A
	// difference is logged, handed to OnDrift and repaired by that sync.
	CheckEvery time.Duration
	// Watch, when set, opens a change monitor of the helper tables
	// (HelperTableRefs) calling onChange when another process changes
	// one: the next sync compares those tables and repairs them. It is
	// called at the first sync.
	Watch func(onChange func()) (ChangeMonitor, error)
	// Log receives drift reports; nil discards them.
	Log *slog.Logger
	// SyncAt, when set, is told when the next sync is due for graceful
	// termination (draining real servers' connection counts): the loop's
	// SyncAt.
	SyncAt func(time.Time)
	// OnForeignChange, when set, is called (from another goroutine) when
	// the change monitor sees another process change a helper table: the
	// loop's Changed, so that the repair is at once.
	OnForeignChange func()
	// OnDrift, when set, is called for each object in which a check found
	// differences ("ip kube-nftproxy-ipvs", "kube-ipvs0", "ipvs"), with
	// short descriptions of them; the sync then repairs them.
	OnDrift func(table string, diffs []string)
}

// ChangeMonitor tells which helper tables another process changed; a
// Kernel's Monitor (an nftlib.Watcher) is one.
type ChangeMonitor interface {
	Pending() bool
	Take() (changed map[nftlib.TableRef]bool, all bool)
}

// Backend is the IPVS mode's proxier.Backend: each sync plans the State
// (Planner, reusing the fragments of unchanged service ports) and makes the
// kernel match through a Syncer, which orders its work so that no packet
// meets a virtual address without a virtual server. Categorisation is
// package model's, health and metrics package serve's and conntrack
// cleanup package conntrack's, as in nftables mode.
type Backend struct {
	mon       ChangeMonitor
	monTried  bool
	lastCheck time.Time

	k       ipvsnl.Kernel
	cfg     BackendConfig
	planner *Planner
	syncer  *Syncer
	node    model.Node
	last    *Plan
}

var _ proxier.Backend = (*Backend)(nil)

// NewBackend returns a backend over k; nothing is read before the first Sync.
func NewBackend(k ipvsnl.Kernel, cfg BackendConfig) *Backend {
	return &Backend{k: k, cfg: cfg, planner: NewPlanner(cfg.Plan)}
}

// Sync programs st. After an error the Syncer retries what failed in the
// next sync; what did apply stays.
func (b *Backend) Sync(ctx context.Context, st *model.State) (proxier.SyncResult, error) {
	var res proxier.SyncResult
	if err := ctx.Err(); err != nil {
		return res, err
	}
	var addrs []netip.Addr
	if b.cfg.NodeAddrs != nil {
		a, err := b.cfg.NodeAddrs()
		if err != nil {
			return res, err
		}
		addrs = slices.SortedFunc(slices.Values(a), netip.Addr.Compare)
		addrs = slices.Compact(addrs)
	}
	b.openMonitor()
	if b.syncer == nil || !b.node.Equal(st.Node) {
		h, err := b.cfg.NewHelper(st.Node)
		if err != nil {
			return res, err
		}
		b.syncer = NewSyncer(b.k, h, b.cfg.Sync)
		b.node = st.Node
		res.Full = true // the new Syncer reads and adopts everything
		b.lastCheck = b.now()
		if b.mon != nil {
			b.mon.Take() // it rewrites the helper tables anyway
		}
	} else {
		b.check()
	}
	plan := b.planner.Plan(st, addrs)
	r, err := b.syncer.Sync(plan)
	b.last = plan
	if t := b.syncer.NextDrainCheck(); !t.IsZero() && b.cfg.SyncAt != nil {
		b.cfg.SyncAt(t)
	}
	hc := len(r.Helper.AddAddrs) + len(r.Helper.DelAddrs) + len(r.Helper.AddElems) + len(r.Helper.DelElems)
	res.Messages = r.Ops + hc
	res.Changed = res.Messages > 0
	return res, err
}

func (b *Backend) now() time.Time {
	if b.cfg.Sync.Now != nil {
		return b.cfg.Sync.Now()
	}
	return time.Now()
}

func (b *Backend) openMonitor() {
	if b.monTried || b.cfg.Watch == nil {
		return
	}
	b.monTried = true
	onChange := b.cfg.OnForeignChange
	if onChange == nil {
		onChange = func() {}
	}
	m, err := b.cfg.Watch(onChange)
	if err != nil {
		b.log().Warn("cannot follow changes to the IPVS helper tables; they are read back every check period instead", "err", err)
		return
	}
	b.mon = m
}

func (b *Backend) log() *slog.Logger {
	if b.cfg.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return b.cfg.Log
}

// check compares the kernel with what was applied, when due (every
// CheckEvery: IPVS, kube-ipvs0's addresses, and the helper tables unless a
// change monitor follows them) or when the monitor saw another process
// change a helper table (those tables). What differs is logged, reported
// and left to the Syncer to repair in this sync.
func (b *Backend) check() {
	now := b.now()
	due := b.cfg.CheckEvery > 0 && now.Sub(b.lastCheck) >= b.cfg.CheckEvery
	if !due && (b.mon == nil || !b.mon.Pending()) {
		return
	}
	var scope DriftScope
	switch {
	case b.mon != nil:
		changed, all := b.mon.Take()
		scope = scopeOf(changed)
		if all {
			scope = allHelpers
		}
	case due:
		scope = allHelpers
	}
	if due {
		b.lastCheck = now
		scope.Addrs = true
		diffs, err := b.syncer.CheckIPVS()
		if err != nil {
			b.log().Warn("cannot read IPVS back to check it", "err", err)
		}
		b.drifted("ipvs", "IPVS virtual servers changed behind our back; repairing them", diffs)
	}
	found, err := b.syncer.CheckHelper(scope)
	if err != nil {
		b.log().Warn("cannot read the IPVS helper tables back to check them", "err", err)
	}
	for _, name := range slices.Sorted(maps.Keys(found)) {
		b.drifted(name, "IPVS helper changed behind our back; repairing it", found[name])
	}
}

func (b *Backend) drifted(name, msg string, diffs []string) {
	if len(diffs) == 0 {
		return
	}
	b.log().Warn(msg, "table", name, "differences", diffs)
	if b.cfg.OnDrift != nil {
		b.cfg.OnDrift(name, diffs)
	}
}

// Plan is the plan the last sync programmed (nil before the first).
func (b *Backend) Plan() *Plan { return b.last }

// Cleanup removes everything of IPVS mode: kube-ipvs0 and the helper
// tables first (no traffic is led to IPVS any more), then every virtual
// server the Syncer would count as ours (all on an address, that is no
// firewall-mark ones, outside the excluded CIDRs).
func (b *Backend) Cleanup(ctx context.Context) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	removed := false
	var errs []error
	if b.cfg.CleanupHelper != nil {
		r, err := b.cfg.CleanupHelper()
		removed = removed || r
		if err != nil {
			errs = append(errs, err)
		}
	}
	if b.k != nil {
		n, err := DeleteVirtualServers(b.k, b.cfg.Sync.ExcludeCIDRs)
		removed = removed || n > 0
		if err != nil {
			errs = append(errs, err)
		}
	}
	b.syncer, b.last = nil, nil
	b.planner = NewPlanner(b.cfg.Plan)
	return removed, errors.Join(errs...)
}

// DeleteVirtualServers deletes, in one write, every virtual server k
// reads outside exclude, and returns how many it deleted.
func DeleteVirtualServers(k ipvsnl.Kernel, exclude []netip.Prefix) (int, error) {
	return ipvsnl.DeleteMatching(k, "", func(v ipvsnl.VirtualServer) bool {
		return !slices.ContainsFunc(exclude, func(p netip.Prefix) bool { return p.Contains(v.Addr) })
	})
}
