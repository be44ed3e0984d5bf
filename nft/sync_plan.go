package nft

import (
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/internal/parallel"
	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// syncPlan is what one sync wants the kernel to hold: the tables, and,
// for a sync that is not full, the service ports whose place changed.
//
// A full plan builds every table afresh. Any other holds, besides the
// tables' fixed parts, the fragments of the service ports it touches: want
// what they get, have what they had (nil: nothing), rebuilt from the
// applied State, for the diff.
type syncPlan struct {
	full bool
	want map[tableID]*nftlib.Table
	have map[tableID]*nftlib.Table
	// changed are the service ports added, changed or removed since the
	// applied State; names those the diff must look at: the changed ones
	// and those a fold moves, each once.
	changed, names []model.ServicePortName
	// inDelta are the service ports the delta tables hold after the sync.
	inDelta map[model.ServicePortName]bool
	// now is the stale-chain clock's time of the sync.
	now time.Time
	// deferred, for a full plan to stage (see stagesFull), are the
	// service ports, in key order, whose fragments are built as they are
	// staged: the tables then hold their fixed parts only. node is the
	// Node they are built for.
	deferred []placedPort
	node     model.Node
	// extraKeys are the keys of the ClusterIP elements' fragments the diff
	// must look at besides names'; clusterIPs the holders of those
	// ClusterIPs after the sync (a full plan's: of every one). See
	// clusterips.go.
	extraKeys  []string
	clusterIPs clusterIPIndex
}

// plan builds the plan of st.
func (b *Backend) plan(st *model.State, full bool) *syncPlan {
	now := b.stale.now()
	if full {
		p := b.planFull(st)
		p.now = now
		return p
	}
	p := b.planChanges(st)
	p.now = now
	if b.shouldFold(len(p.names), b.stale.anyDue(now), p.inDelta, st.Services.Len()) {
		b.planFold(p)
	}
	return p
}

// planFull puts every service port of st in the tables of its home, or
// defers them to the staged transactions that build them (see
// stagesFull).
func (b *Backend) planFull(st *model.State) *syncPlan {
	p := &syncPlan{full: true, want: map[tableID]*nftlib.Table{}, inDelta: map[model.ServicePortName]bool{}, node: st.Node}
	for _, id := range tableIDs() {
		p.want[id] = BuildTable(id.f, b.cfg, st.Node, id.kind)
	}
	if b.cfg.ClusterIPChecks {
		p.clusterIPs = newClusterIPIndex(st)
		for _, f := range nftlib.Families {
			id := tableID{f, MainTable}
			p.want[id] = withServiceCIDRs(p.want[id], st.ServiceCIDRs)
			placeClusterIPs(p.want[id], p.clusterIPs)
		}
	}
	ports := sortedPorts(st, homeKind)
	if b.stagesFull(ports, p.want) {
		p.deferred = ports
		return p
	}
	placePorts(p.want, b.cfg, st.Node, ports)
	return p
}

// placeDeferred builds the fragments a plan deferred into its tables, for
// a sync that will not be staged after all.
func (b *Backend) placeDeferred(p *syncPlan) {
	placePorts(p.want, b.cfg, p.node, p.deferred)
	p.deferred = nil
}

// planChanges moves each service port that differs from what was applied
// (added, changed or removed) to its new table: a changed port goes to the
// delta table, unless its home is the affinity table. The tables of the
// plan hold the fragments of those ports only (see appliedPort).
func (b *Backend) planChanges(st *model.State) *syncPlan {
	p := &syncPlan{want: map[tableID]*nftlib.Table{}, have: map[tableID]*nftlib.Table{}, inDelta: maps.Clone(b.inDelta)}
	for _, id := range tableIDs() {
		p.have[id] = withoutFragments(b.applied[id])
		p.want[id] = withoutFragments(b.applied[id])
	}
	p.changed = b.changes.Changes(st)
	p.names = p.changed
	for _, name := range p.changed {
		b.remember(p, name)
		svc, ok := st.Services.Lookup(name)
		if !ok {
			delete(p.inDelta, name)
			continue
		}
		kind := homeTable(svc)
		if kind == MainTable {
			kind = DeltaTable
			p.inDelta[name] = true
		} else {
			delete(p.inDelta, name)
		}
		b.place(p.want, name, kind, st.Node, svc, st.Endpoints.Get(name))
	}
	b.planClusterIPs(p, st)
	return p
}

// planFold moves every service port of the delta tables back to the main
// ones: those this sync changed with their new fragments, the others with
// the applied ones (the same, rebuilt once for both tables).
func (b *Backend) planFold(p *syncPlan) {
	changed := make(map[model.ServicePortName]bool, len(p.names))
	for _, name := range p.names {
		changed[name] = true
	}
	names := append([]model.ServicePortName(nil), p.names...)
	for name := range p.inDelta {
		if !changed[name] { // a port is diffed once, wherever it goes
			names = append(names, name)
		}
		b.remember(p, name)
		key := fragmentKey(name)
		for _, f := range nftlib.Families {
			delta, main := tableID{f, DeltaTable}, tableID{f, MainTable}
			fr := p.want[delta].Fragments[key]
			if !changed[name] {
				fr = p.have[delta].Fragments[key]
			}
			if fr != nil {
				p.want[main].Fragments[key] = fr
			}
			delete(p.want[delta].Fragments, key)
		}
	}
	p.names = names
	p.inDelta = map[model.ServicePortName]bool{}
}

// shouldFold folds the delta into the main table when a sync has no change
// of its own to make (a periodic sync; not the follow-up that deletes stale
// chains, which would otherwise fold a second after every change), or when
// the delta has grown so that validating it costs more than a fold is
// worth.
func (b *Backend) shouldFold(changed int, cleanupDue bool, inDelta map[model.ServicePortName]bool, total int) bool {
	n := len(inDelta)
	if n == 0 {
		return false
	}
	return changed == 0 && !cleanupDue || n > b.strategy.foldLimit(total)
}

// remember saves, once per sync, what the applied tables hold for a service
// port before the sync changes or moves it: have[id].Fragments gets its
// fragment in that table, rebuilt, or nil.
func (b *Backend) remember(p *syncPlan, name model.ServicePortName) {
	key := fragmentKey(name)
	if _, done := p.have[tableIDs()[0]].Fragments[key]; done {
		return
	}
	kind, svc, eps, ok := b.appliedPort(name)
	for _, id := range tableIDs() {
		var fr *nftlib.Fragment
		if ok && id.kind == kind {
			fr = BuildFragment(id.f, b.cfg, b.node, svc, eps)
		}
		p.have[id].Fragments[key] = fr
	}
}

// place builds a service port's fragments into the tables of that kind.
func (b *Backend) place(want map[tableID]*nftlib.Table, name model.ServicePortName, kind TableKind, node model.Node, svc *model.ServicePort, eps []model.Endpoint) {
	key := fragmentKey(name)
	for _, f := range nftlib.Families {
		if fr := BuildFragment(f, b.cfg, node, svc, eps); fr != nil {
			want[tableID{f, kind}].Fragments[key] = fr
		}
	}
}

// placeAll builds every service port of st into the given tables, each in
// the table kindOf names (ports whose table is not given are skipped).
func placeAll(tables map[tableID]*nftlib.Table, cfg Config, st *model.State, node model.Node, kindOf func(model.ServicePortName, *model.ServicePort) TableKind) {
	placePorts(tables, cfg, node, sortedPorts(st, kindOf))
}

// sortedPorts lists st's service ports in the order of their keys, each
// with its endpoints and the table kind kindOf names.
func sortedPorts(st *model.State, kindOf func(model.ServicePortName, *model.ServicePort) TableKind) []placedPort {
	ports := make([]placedPort, 0, st.Services.Len())
	for name, svc := range st.Services.All() {
		ports = append(ports, placedPort{fragmentKey(name), name, svc, st.Endpoints.Get(name), kindOf(name, svc)})
	}
	slices.SortFunc(ports, func(a, b placedPort) int { return strings.Compare(a.key, b.key) })
	return ports
}

// placePorts builds the ports' fragments into the tables, on all CPUs
// (they depend on their own inputs alone), in the order of their keys,
// the order in which a transaction writes them: one that lets go of them
// as it goes (nftlib.Tx.ReleaseRules) then frees whole pages of memory,
// not a few objects of each.
func placePorts(tables map[tableID]*nftlib.Table, cfg Config, node model.Node, ports []placedPort) {
	built := buildFragments(tables, cfg, node, ports, true)
	for i, p := range ports {
		for j, f := range nftlib.Families {
			if fr := built[i][j]; fr != nil {
				tables[tableID{f, p.kind}].Fragments[p.key] = fr
			}
		}
	}
}

// buildFragments builds each port's fragment per family (IPv4, IPv6) for
// the tables given, on all CPUs when onAllCPUs.
func buildFragments(tables map[tableID]*nftlib.Table, cfg Config, node model.Node, ports []placedPort, onAllCPUs bool) [][2]*nftlib.Fragment {
	built := make([][2]*nftlib.Fragment, len(ports))
	build := func(_, lo, hi int) {
		for i := lo; i < hi; i++ {
			for j, f := range nftlib.Families {
				if tables[tableID{f, ports[i].kind}] != nil {
					built[i][j] = BuildFragment(f, cfg, node, ports[i].svc, ports[i].eps)
				}
			}
		}
	}
	if !onAllCPUs {
		build(0, 0, len(ports))
		return built
	}
	parallel.Run(len(ports), buildParallelMin, build)
	return built
}

// buildParallelMin is the least number of service ports whose fragments
// are built on more than one CPU: each is small (eleven chains at ten
// endpoints), so only some hundreds of them outweigh what splitting the
// work costs.
const buildParallelMin = 256
