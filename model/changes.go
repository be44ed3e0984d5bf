package model

// ChangeTracker tells a backend which service ports of a State differ from
// those of the State it recorded last, at a cost in proportion to what
// changed: a State whose Changes follow the recorded one is looked at only
// where its Changes say so; the same State again (a periodic sync)
// costs nothing; any other is compared with the recorded one map against
// map (DiffKeys), skipping what the two share (States of one source share
// all they did not change), by pointer first and by value when the
// pointers differ.
//
// Both modes use one: the nftables backend records a State once the
// kernel holds it, the IPVS Planner once it planned it. Recording keeps
// the State itself (its maps are persistent: nothing is copied). The
// zero value has recorded nothing (every service port of a State is a
// change).
type ChangeTracker struct {
	recorded *State
	lineage  *Lineage
	gen      uint64
}

// Same reports whether st is the State recorded last: nothing changed.
func (t *ChangeTracker) Same(st *State) bool {
	return st.Changes.Lineage != nil && st.Changes.Lineage == t.lineage && st.Changes.Gen == t.gen
}

// Changes lists the service ports added, changed or removed in st since
// the recorded State, each once. It does not record st.
func (t *ChangeTracker) Changes(st *State) []ServicePortName {
	switch {
	case t.Same(st):
		return nil
	case t.recorded != nil && st.Changes.Follows(t.lineage, t.gen):
		return t.changesListed(st)
	}
	return t.changesCompared(st)
}

// changesListed looks only at the service ports st.Changes names.
func (t *ChangeTracker) changesListed(st *State) []ServicePortName {
	var out []ServicePortName
	seen := make(map[ServicePortName]bool, len(st.Changes.Ports))
	for _, name := range st.Changes.Ports {
		if !seen[name] && t.differs(st, name) { // a Service changed twice is listed twice
			out = append(out, name)
		}
		seen[name] = true
	}
	return out
}

// changesCompared compares st with the recorded State, skipping the
// subtrees of their maps that they share.
func (t *ChangeTracker) changesCompared(st *State) []ServicePortName {
	prev := t.recorded
	if prev == nil {
		prev = NewState()
	}
	var out []ServicePortName
	seen := map[ServicePortName]bool{}
	for name := range DiffKeys(prev.Services, st.Services, sameServicePort) {
		seen[name] = true
		out = append(out, name)
	}
	for name := range DiffKeys(prev.Endpoints, st.Endpoints, sameEndpoints) {
		if seen[name] {
			continue
		}
		seen[name] = true
		// Endpoints without a service port in either State program nothing.
		if _, ok := st.Services.Lookup(name); ok || t.Recorded(name) {
			out = append(out, name)
		}
	}
	return out
}

// differs reports whether a service port of st is not the recorded one:
// added, changed, or removed (only if it was recorded).
func (t *ChangeTracker) differs(st *State, name ServicePortName) bool {
	svc, ok := st.Services.Lookup(name)
	was, had := t.recorded.Services.Lookup(name)
	if !ok || !had {
		return ok || had
	}
	return !sameServicePort(was, svc) || !sameEndpoints(t.recorded.Endpoints.Get(name), st.Endpoints.Get(name))
}

// sameServicePort compares by pointer first (the cheap, common case),
// else by value.
func sameServicePort(a, b *ServicePort) bool { return a == b || a.Equal(b) }

func sameEndpoints(a, b []Endpoint) bool {
	if len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0]) {
		return true
	}
	return EndpointsEqual(a, b)
}

// Record makes st the recorded State, given the changes Changes listed
// for it (the other service ports are the recorded ones already): the
// recorded State is the last one with those ports taken from st, so that
// what is recorded is what the caller applied, even were st to differ
// elsewhere unannounced. The cost is that of the changes.
func (t *ChangeTracker) Record(st *State, changed []ServicePortName) {
	if t.recorded == nil {
		t.RecordAll(st)
		return
	}
	svcs, eps := t.recorded.Services.Edit(), t.recorded.Endpoints.Edit()
	for _, name := range changed {
		if svc, ok := st.Services.Lookup(name); ok {
			svcs.Set(name, svc)
		} else {
			svcs.Delete(name)
		}
		if e, ok := st.Endpoints.Lookup(name); ok {
			eps.Set(name, e)
		} else {
			eps.Delete(name)
		}
	}
	t.recorded = &State{Node: st.Node, Services: svcs.Map(), Endpoints: eps.Map(), ServiceCIDRs: st.ServiceCIDRs, Changes: st.Changes}
	t.lineage, t.gen = st.Changes.Lineage, st.Changes.Gen
}

// RecordAll makes st the recorded State, every service port of it.
func (t *ChangeTracker) RecordAll(st *State) {
	t.recorded, t.lineage, t.gen = st, st.Changes.Lineage, st.Changes.Gen
}

// Reset forgets the recorded State.
func (t *ChangeTracker) Reset() { *t = ChangeTracker{} }

// Recorded reports whether a service port is in the recorded State.
func (t *ChangeTracker) Recorded(name ServicePortName) bool {
	if t.recorded == nil {
		return false
	}
	_, ok := t.recorded.Services.Lookup(name)
	return ok
}

// State is the recorded State (nil before the first Record): what the
// caller applied last.
func (t *ChangeTracker) State() *State { return t.recorded }
