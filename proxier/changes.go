package proxier

// ChangeTracker tells a backend which service ports of a State differ from
// those of the State it recorded last, at a cost in proportion to what
// changed: a State whose Changes follow the recorded one is looked at only
// where its Changes say so; the same State again (a periodic sync)
// costs nothing; any other is compared service port by service port, by
// pointer first (sources hand over States that share unchanged
// ServicePorts and endpoint slices), by value when the pointers differ.
//
// Both modes use one: the nftables backend records a State once the
// kernel holds it, the IPVS Planner once it planned it. The zero value
// has recorded nothing (every service port of a State is a change).
type ChangeTracker struct {
	inputs map[ServicePortName]trackedInput
	// byPointer maps each recorded ServicePort object to its endpoints:
	// an unchanged port is found here without hashing its name.
	byPointer map[*ServicePort][]Endpoint
	lineage   *Lineage
	gen       uint64
}

type trackedInput struct {
	svc *ServicePort
	eps []Endpoint
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
	case st.Changes.Follows(t.lineage, t.gen):
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

// changesCompared compares every service port of st, and looks for the
// recorded ones st lacks only when the counts say some are gone.
func (t *ChangeTracker) changesCompared(st *State) []ServicePortName {
	var out []ServicePortName
	added := 0
	for name := range st.Services.Keys() {
		if _, had := t.inputs[name]; !had {
			added++
		}
		if t.differs(st, name) {
			out = append(out, name)
		}
	}
	if len(t.inputs)+added != st.Services.Len() {
		for name := range t.inputs {
			if _, ok := st.Services.Lookup(name); !ok {
				out = append(out, name)
			}
		}
	}
	return out
}

// differs reports whether a service port of st is not the recorded one:
// added, changed, or removed (only if it was recorded).
func (t *ChangeTracker) differs(st *State, name ServicePortName) bool {
	svc, ok := st.Services.Lookup(name)
	in, had := t.inputs[name]
	if !ok {
		return had
	}
	eps := st.Endpoints.Get(name)
	if known, ok := t.byPointer[svc]; ok && sameEndpoints(known, eps) {
		return false // the very ServicePort recorded: no lookup by name
	}
	return !had || !in.same(svc, eps)
}

// same reports whether a service port is the recorded input: by pointer
// first (the cheap, common case), else by value.
func (in trackedInput) same(svc *ServicePort, eps []Endpoint) bool {
	if in.svc != svc && !in.svc.Equal(svc) {
		return false
	}
	return sameEndpoints(in.eps, eps)
}

func sameEndpoints(a, b []Endpoint) bool {
	if len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0]) {
		return true
	}
	return EndpointsEqual(a, b)
}

// Record makes st the recorded State, given the changes Changes listed
// for it (the other service ports are the recorded ones already).
func (t *ChangeTracker) Record(st *State, changed []ServicePortName) {
	if t.inputs == nil {
		t.RecordAll(st)
		return
	}
	for _, name := range changed {
		delete(t.byPointer, t.inputs[name].svc)
		if svc, ok := st.Services.Lookup(name); ok {
			t.inputs[name] = trackedInput{svc: svc, eps: st.Endpoints.Get(name)}
			t.byPointer[svc] = st.Endpoints.Get(name)
		} else {
			delete(t.inputs, name)
		}
	}
	t.lineage, t.gen = st.Changes.Lineage, st.Changes.Gen
}

// RecordAll makes st the recorded State, every service port of it.
func (t *ChangeTracker) RecordAll(st *State) {
	t.inputs = make(map[ServicePortName]trackedInput, st.Services.Len())
	t.byPointer = make(map[*ServicePort][]Endpoint, st.Services.Len())
	for name, svc := range st.Services.All() {
		t.inputs[name] = trackedInput{svc: svc, eps: st.Endpoints.Get(name)}
		t.byPointer[svc] = st.Endpoints.Get(name)
	}
	t.lineage, t.gen = st.Changes.Lineage, st.Changes.Gen
}

// Reset forgets the recorded State.
func (t *ChangeTracker) Reset() { *t = ChangeTracker{} }

// Recorded reports whether a service port is in the recorded State.
func (t *ChangeTracker) Recorded(name ServicePortName) bool {
	_, ok := t.inputs[name]
	return ok
}
