package nft

import (
	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// The backend keeps of the applied tables their fixed parts only. What a
// service port contributes (its fragment) is a function of the port, its
// endpoints, the configuration and the node, and the State the
// ChangeTracker recorded is the one applied; a new node makes the sync a
// full one. So a fragment is rebuilt from that State when a sync needs it
// (the ports it changes or folds, a drift check's read-back) instead of
// being kept: kept, the fragments were a large part of the proxy's steady
// heap (docs/benchmarks.md, "Memory").

// appliedPort is a service port as the last sync left it: the kind of table
// holding it, and its recorded service port and endpoints (ok false: none).
func (b *Backend) appliedPort(name model.ServicePortName) (kind TableKind, svc *model.ServicePort, eps []model.Endpoint, ok bool) {
	st := b.changes.State()
	if st == nil {
		return 0, nil, nil, false
	}
	if svc, ok = st.Services.Lookup(name); !ok {
		return 0, nil, nil, false
	}
	return b.appliedKind(name, svc), svc, st.Endpoints.Get(name), true
}

// appliedKind is the kind of table that holds a service port since the
// last sync.
func (b *Backend) appliedKind(name model.ServicePortName, svc *model.ServicePort) TableKind {
	if b.inDelta[name] {
		return DeltaTable
	}
	return homeTable(svc)
}

// appliedTables are the given tables as the last sync left them, with
// every fragment rebuilt (for a drift check, and tests).
func (b *Backend) appliedTables(ids []tableID) map[tableID]*nftlib.Table {
	out := make(map[tableID]*nftlib.Table, len(ids))
	for _, id := range ids {
		out[id] = withoutFragments(b.applied[id])
	}
	if st := b.changes.State(); st != nil && len(ids) > 0 {
		placeAll(out, b.cfg, st, b.node, b.appliedKind)
		if b.cfg.ClusterIPChecks {
			// From the State, not the index: a drift check also finds an
			// index that went wrong.
			ix := newClusterIPIndex(st)
			for id, t := range out {
				if id.kind == MainTable {
					placeClusterIPs(t, ix)
				}
			}
		}
	}
	return out
}

// withoutFragments is a copy of t's fixed parts, with no fragment yet.
func withoutFragments(t *nftlib.Table) *nftlib.Table {
	c := *t
	c.Fragments = map[string]*nftlib.Fragment{}
	return &c
}
