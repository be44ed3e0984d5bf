package proxier

import "net/netip"

// changedSince lists the service ports of st that differ from those of
// the State t recorded, and records st. all is true when every port must
// be looked at: nothing recorded yet, or the node changed (what is local
// depends on it).
func changedSince(t *ChangeTracker, st *State) (names []ServicePortName, all bool) {
	all = t.recorded == nil || !t.recorded.Node.Equal(st.Node)
	if !all {
		names = t.Changes(st)
	}
	t.RecordAll(st)
	return names, all
}

// serviceOf names the Service of a service port (Port "").
func serviceOf(name ServicePortName) ServicePortName {
	return ServicePortName{Namespace: name.Namespace, Name: name.Name}
}

// hcIndex keeps, per Service with a health check node port, its port and
// local ready endpoint count, updated from the service ports that changed
// since the last State: a sync costs what changed, not the whole State.
type hcIndex struct {
	tracker ChangeTracker
	// ports lists, per Service, its service ports that ask for a health
	// check node port; services holds what each such Service wants.
	ports    map[ServicePortName]map[ServicePortName]bool
	services map[ServicePortName]hcService
}

type hcService struct {
	port  uint16
	count int
}

// update brings the index to st.
func (x *hcIndex) update(st *State) {
	names, all := changedSince(&x.tracker, st)
	if all || x.ports == nil {
		x.ports, x.services = map[ServicePortName]map[ServicePortName]bool{}, map[ServicePortName]hcService{}
		names = st.Services.SortedKeys()
	}
	touched := map[ServicePortName]bool{}
	for _, name := range names {
		svc := serviceOf(name)
		touched[svc] = true
		if sp := st.Services.Get(name); sp != nil && sp.HealthCheckNodePort != 0 && sp.ExternalPolicyLocal {
			if x.ports[svc] == nil {
				x.ports[svc] = map[ServicePortName]bool{}
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
func (x *hcIndex) service(st *State, ports map[ServicePortName]bool) hcService {
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

// noLocalIndex counts the service ports with a Local traffic policy that
// have endpoints, none on this node, per policy, updated from the service
// ports that changed since the last State.
type noLocalIndex struct {
	tracker ChangeTracker
	// ports holds the service ports counted, with the policies they count for.
	ports              map[ServicePortName]noLocal
	internal, external int
}

type noLocal struct{ internal, external bool }

// update brings the counts to st.
func (x *noLocalIndex) update(st *State) {
	names, all := changedSince(&x.tracker, st)
	if all || x.ports == nil {
		*x = noLocalIndex{tracker: x.tracker, ports: map[ServicePortName]noLocal{}}
		names = st.Services.SortedKeys()
	}
	for _, name := range names {
		x.set(name, x.lacking(st, name))
	}
}

// lacking is what a service port of st counts for.
func (x *noLocalIndex) lacking(st *State, name ServicePortName) noLocal {
	svc := st.Services.Get(name)
	if svc == nil || !svc.InternalPolicyLocal && !svc.ExternalPolicyLocal {
		return noLocal{}
	}
	_, local, _, hasAny := CategorizeEndpoints(svc, st.Endpoints.Get(name), st.Node)
	if !hasAny || len(local) > 0 {
		return noLocal{}
	}
	return noLocal{internal: svc.InternalPolicyLocal, external: svc.ExternalPolicyLocal}
}

func (x *noLocalIndex) set(name ServicePortName, now noLocal) {
	was := x.ports[name]
	x.internal += b2i(now.internal) - b2i(was.internal)
	x.external += b2i(now.external) - b2i(was.external)
	if now == (noLocal{}) {
		delete(x.ports, name)
	} else {
		x.ports[name] = now
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
