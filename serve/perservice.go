package serve

import (
	"net/netip"

	"github.com/kube-nftproxy/kube-nftproxy/model"
)

// changedSince lists the service ports of st that differ from those of
// the State t recorded, and records st. all is true when every port must
// be looked at: nothing recorded yet, or the node changed (what is local
// depends on it).
func changedSince(t *model.ChangeTracker, st *model.State) (names []model.ServicePortName, all bool) {
	recorded := t.State()
	all = recorded == nil || !recorded.Node.Equal(st.Node)
	if !all {
		names = t.Changes(st)
	}
	t.RecordAll(st)
	return names, all
}

// serviceOf names the Service of a service port (Port "").
func serviceOf(name model.ServicePortName) model.ServicePortName {
	return model.ServicePortName{Namespace: name.Namespace, Name: name.Name}
}

// hcIndex keeps, per Service with a health check node port, its port and
// local ready endpoint count, updated from the service ports that changed
// since the last State: a sync costs what changed, not the whole State.
type hcIndex struct {
	tracker model.ChangeTracker
	// ports lists, per Service, its service ports that ask for a health
	// check node port; services holds what each such Service wants.
	ports    map[model.ServicePortName]map[model.ServicePortName]bool
	services map[model.ServicePortName]hcService
}

type hcService struct {
	port  uint16
	count int
}

// update brings the index to st.
func (x *hcIndex) update(st *model.State) {
	names, all := changedSince(&x.tracker, st)
	if all || x.ports == nil {
		x.ports, x.services = map[model.ServicePortName]map[model.ServicePortName]bool{}, map[model.ServicePortName]hcService{}
		names = st.Services.SortedKeys()
	}
	touched := map[model.ServicePortName]bool{}
	for _, name := range names {
		svc := serviceOf(name)
		touched[svc] = true
		if sp := st.Services.Get(name); sp != nil && sp.HealthCheckNodePort != 0 && sp.ExternalPolicyLocal {
			if x.ports[svc] == nil {
				x.ports[svc] = map[model.ServicePortName]bool{}
			}
			x.ports[svc][name] = true
		} else if x.ports[svc] != nil {
			delete(x.ports[svc], name)
		}
	}
	for svc := range touched {
		if len(x.ports[svc]) == 0 {
			delete(x.ports, svc)
			delete(x.services, svc)
			continue
		}
		x.services[svc] = x.service(st, x.ports[svc])
	}
}

// service is what one Service wants: its health check node port (its
// ports share it) and the count of its local ready endpoints: distinct
// addresses over all its ports, in the family that has the most.
func (x *hcIndex) service(st *model.State, ports map[model.ServicePortName]bool) hcService {
	var out hcService
	addrs := map[netip.Addr]bool{}
	for name := range ports {
		out.port = max(out.port, st.Services.Get(name).HealthCheckNodePort)
		for _, ep := range st.Endpoints.Get(name) {
			if ep.Ready && ep.IsLocal(st.Node.Name) {
				addrs[ep.Addr] = true
			}
		}
	}
	v4 := 0
	for a := range addrs {
		if a.Is4() {
			v4++
		}
	}
	out.count = max(v4, len(addrs)-v4)
	return out
}

// noLocalIndex keeps counts of service ports by buckets (a service port
// is in any set of up to eight), updated from the service ports that
// changed since the last State rather than from all of them: the
// no-local-endpoints metric counts, per traffic policy, the ports with a
// Local policy that have endpoints, none on this node.
type noLocalIndex struct {
	tracker model.ChangeTracker
	ports   map[model.ServicePortName]uint8 // the buckets of each port in any
	counts  [8]int
}

// update brings the counts to st; buckets says which a port of st is in.
func (x *noLocalIndex) update(st *model.State, buckets func(*model.State, model.ServicePortName) uint8) {
	names, all := changedSince(&x.tracker, st)
	if all || x.ports == nil {
		*x = noLocalIndex{tracker: x.tracker, ports: map[model.ServicePortName]uint8{}}
		names = st.Services.SortedKeys()
	}
	for _, name := range names {
		x.set(name, buckets(st, name))
	}
}

func (x *noLocalIndex) set(name model.ServicePortName, now uint8) {
	was := x.ports[name]
	for i := range x.counts {
		x.counts[i] += int(now>>i&1) - int(was>>i&1)
	}
	if now == 0 {
		delete(x.ports, name)
	} else {
		x.ports[name] = now
	}
}

// noLocalBuckets: a service port with a Local traffic policy that has
// endpoints of a family, none of them on this node, counts for each of its
// Local policies in that family: bit 2*f for internal, 2*f+1 for external,
// f the family's index in families.
func noLocalBuckets(st *model.State, name model.ServicePortName) uint8 {
	svc := st.Services.Get(name)
	if svc == nil || !svc.InternalPolicyLocal && !svc.ExternalPolicyLocal {
		return 0
	}
	var out uint8
	for fi, fam := range families {
		eps := endpointsOf(st.Endpoints.Get(name), fam == model.IPv6)
		_, local, _, hasAny := model.CategorizeEndpoints(svc, eps, st.Node)
		if !hasAny || len(local) > 0 {
			continue
		}
		if svc.InternalPolicyLocal {
			out |= 1 << (2 * fi)
		}
		if svc.ExternalPolicyLocal {
			out |= 1 << (2*fi + 1)
		}
	}
	return out
}
