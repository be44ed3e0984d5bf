package kube

import (
	"cmp"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/kube-nftproxy/kube-nftproxy/model"
)

// Builder holds the current Services, EndpointSlices and this node's Node
// object, already converted, and hands out State snapshots. Sources call the
// Upsert/Delete methods as objects come and go; the methods are safe for
// concurrent use (client-go runs one handler goroutine per informer).
//
// Work is done per change, not per snapshot: a change resolves the keys the
// Service shares with others (see conflicts.go) and marks what it touched,
// and State only refreshes the marked Services (the state's maps are
// persistent: a snapshot copies nothing).
type Builder struct {
	mu       sync.Mutex
	nodeName string
	opts     builderOptions

	services map[serviceKey]*serviceEntry
	slices   map[serviceKey]*sliceInfo   // keyed by the slice's own namespace/name
	bySvc    map[serviceKey][]*sliceInfo // service -> its slices (a list: a map per Service costs hundreds of bytes)
	node     *model.Node
	errs     map[objectRef]error
	// serviceCIDRs are the ServiceCIDR objects' ranges by object name;
	// cidrs their union (see servicecidr.go).
	serviceCIDRs map[string][]netip.Prefix
	cidrs        []netip.Prefix

	// owner holds, for every key some Service asks for, the Service that
	// keeps it; rivals lists the others asking, only for contested keys.
	owner     map[claim]*serviceEntry
	rivals    map[claim][]*serviceEntry
	conflicts map[objectRef][]error // per losing Service
	// ignoredIPs are the external IPs the options left out of each
	// Service's latest version (only Services that had some).
	ignoredIPs map[serviceKey][]netip.Addr
	pending    []*serviceEntry // entries to resolve before the lock is released

	// liveServices and liveEndpoints are the state as of the last snapshot
	// plus the refreshed Services; published lists the port names each
	// Service has in them; dirty are the Services to refresh.
	liveServices  model.PortMapEditor[*model.ServicePort]
	liveEndpoints model.PortMapEditor[[]model.Endpoint]
	published     map[serviceKey][]model.ServicePortName
	dirty         map[serviceKey]struct{}
	// snap is the last snapshot handed out, nil once anything changed.
	snap *model.State
	// The snapshots' lineage and the last one's generation; the service
	// ports refreshed and whether the Node changed since it.
	lineage      *model.Lineage
	gen          uint64
	changed      []model.ServicePortName
	nodeChanged  bool
	cidrsChanged bool

	// For kube-proxy's change metrics (ChangeCounts, StateWithTriggers):
	// events seen since started; the Services changed since the last
	// snapshot, with their ports then (nil: absent), kept only while they
	// differ; how many slice events since then changed a slice; and the
	// trigger times of those changes, per Service.
	started        time.Time
	serviceEvents  uint64
	sliceEvents    uint64
	servicesBefore map[serviceKey][]*model.ServicePort
	slicesChanged  int
	triggers       map[serviceKey][]model.Trigger
}

// objectRef names any object the Builder tracks, for per-object errors.
type objectRef struct{ kind, namespace, name string }

// NewBuilder returns an empty Builder for the node named nodeName (the
// hostname override): only that Node object is used, and endpoints on it
// are local. Without options it reads Services as kube-proxy does by
// default.
func NewBuilder(nodeName string, opts ...Option) *Builder {
	return &Builder{
		nodeName:   nodeName,
		opts:       newBuilderOptions(opts),
		services:   map[serviceKey]*serviceEntry{},
		slices:     map[serviceKey]*sliceInfo{},
		bySvc:      map[serviceKey][]*sliceInfo{},
		errs:       map[objectRef]error{},
		owner:      map[claim]*serviceEntry{},
		rivals:     map[claim][]*serviceEntry{},
		conflicts:  map[objectRef][]error{},
		ignoredIPs: map[serviceKey][]netip.Addr{},
		published:  map[serviceKey][]model.ServicePortName{},
		dirty:      map[serviceKey]struct{}{},
		lineage:    &model.Lineage{},

		started:        time.Now(),
		servicesBefore: map[serviceKey][]*model.ServicePort{},
		triggers:       map[serviceKey][]model.Trigger{},
	}
}

// NodeName is the node this Builder builds for.
func (b *Builder) NodeName() string { return b.nodeName }

// UpsertService adds or replaces a Service. The returned error lists what
// was wrong with it (also kept for Errors); a Service that cannot be
// programmed, or that kube-proxy ignores, is removed from the state.
// Conflicts with other Services are resolved here and reported by Errors,
// not in the returned error: they come and go with the other Services.
func (b *Builder) UpsertService(svc *corev1.Service) error {
	if svc == nil {
		return nil
	}
	ports, ignored, err := servicePorts(svc, b.opts.dropExternalIPs)
	key := serviceKey{NamespaceOrDefault(svc.Namespace), svc.Name}
	b.mu.Lock()
	changed := b.upsertServiceLocked(key, svc.CreationTimestamp.Time, ports, err)
	logIgnored := b.noteIgnoredLocked(key, ignored, changed)
	b.mu.Unlock()
	if logIgnored {
		b.logIgnored(key, ignored)
	}
	return err
}

// upsertServiceLocked replaces a Service's ports (none: it goes), and
// reports whether that changed what the Builder holds for it.
func (b *Builder) upsertServiceLocked(key serviceKey, created time.Time, ports []*model.ServicePort, err error) (changed bool) {
	b.serviceEvents++
	defer b.noteServiceChange(key, b.portsOf(key))
	b.setErr(objectRef{"service", key.namespace, key.name}, err)
	old := b.services[key]
	if len(ports) == 0 {
		b.deleteServiceLocked(key)
		return old != nil
	}
	if old != nil && old.created.Equal(created) && slices.EqualFunc(old.ports, ports, (*model.ServicePort).Equal) {
		return false // a resync, or a change the proxy does not use
	}
	e := newServiceEntry(key, created, ports)
	if old != nil {
		b.removeClaims(old)
		if sameEndpointPorts(old.ports, ports) {
			e.endpoints = old.endpoints // the merge only looks at port names and protocols
		}
	}
	b.services[key] = e
	b.addClaims(e)
	b.resolvePending()
	b.markDirty(key)
	return true
}

// DeleteService removes a Service; its slices stay until they are deleted.
func (b *Builder) DeleteService(namespace, name string) {
	key := serviceKey{NamespaceOrDefault(namespace), name}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.serviceEvents++
	defer b.noteServiceChange(key, b.portsOf(key))
	delete(b.errs, objectRef{"service", key.namespace, key.name})
	delete(b.ignoredIPs, key)
	b.deleteServiceLocked(key)
}

func (b *Builder) portsOf(key serviceKey) []*model.ServicePort {
	if e := b.services[key]; e != nil {
		return e.ports
	}
	return nil
}

// noteServiceChange follows a Service event, given the ports it had
// before: the Service is pending while its ports differ from those of the
// last snapshot, so changes that cancel out leave nothing pending (as
// kube-proxy's service change tracker).
func (b *Builder) noteServiceChange(key serviceKey, before []*model.ServicePort) {
	if at, ok := b.servicesBefore[key]; ok {
		before = at
	}
	if slices.EqualFunc(before, b.portsOf(key), (*model.ServicePort).Equal) {
		delete(b.servicesBefore, key)
	} else {
		b.servicesBefore[key] = before
	}
}

func (b *Builder) deleteServiceLocked(key serviceKey) {
	old := b.services[key]
	if old == nil {
		return
	}
	delete(b.services, key)
	delete(b.conflicts, objectRef{"service", key.namespace, key.name})
	b.removeClaims(old)
	b.resolvePending()
	b.markDirty(key)
}

func sameEndpointPorts(a, b []*model.ServicePort) bool {
	return slices.EqualFunc(a, b, func(x, y *model.ServicePort) bool {
		return x.Name == y.Name && x.Protocol == y.Protocol
	})
}

// markDirty queues a Service (its ports or endpoints changed, or it is
// gone) for the next State.
func (b *Builder) markDirty(key serviceKey) {
	b.dirty[key] = struct{}{}
	b.snap = nil
}

// invalidateEndpoints drops a Service's merged endpoints after one of its
// slices changed.
func (b *Builder) invalidateEndpoints(key serviceKey) {
	if e := b.services[key]; e != nil {
		e.endpoints = nil
		b.markDirty(key)
	}
}

// UpsertEndpointSlice adds or replaces an EndpointSlice. An ignored or
// unusable slice removes any earlier version of it.
func (b *Builder) UpsertEndpointSlice(es *discoveryv1.EndpointSlice) error {
	if es == nil {
		return nil
	}
	info, err := parseEndpointSlice(es)
	key := serviceKey{NamespaceOrDefault(es.Namespace), es.Name}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.setErr(objectRef{"endpointslice", key.namespace, key.name}, err)
	if countedSlice(es) {
		b.noteSliceUpdate(es, b.slices[key], info)
	}
	b.deleteSliceLocked(key)
	if info == nil {
		return err
	}
	b.slices[key] = info
	b.bySvc[info.service] = append(b.bySvc[info.service], info)
	b.invalidateEndpoints(info.service)
	return err
}

// DeleteEndpointSlice removes an EndpointSlice. For the change metrics it
// counts only if the Builder held the slice; RemoveEndpointSlice, given
// the deleted object, counts as kube-proxy does.
func (b *Builder) DeleteEndpointSlice(namespace, name string) {
	key := serviceKey{NamespaceOrDefault(namespace), name}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.removeSliceLocked(key, b.slices[key] != nil)
}

// RemoveEndpointSlice is DeleteEndpointSlice for a source that has the
// deleted object, as the API source has.
func (b *Builder) RemoveEndpointSlice(es *discoveryv1.EndpointSlice) {
	if es == nil {
		return
	}
	key := serviceKey{NamespaceOrDefault(es.Namespace), es.Name}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.removeSliceLocked(key, countedSlice(es))
}

func (b *Builder) removeSliceLocked(key serviceKey, counted bool) {
	delete(b.errs, objectRef{"endpointslice", key.namespace, key.name})
	if counted {
		b.sliceEvents++
	}
	if old := b.slices[key]; old != nil {
		// A deletion changes the Service's endpoints but carries no
		// trigger time of its own (its annotation is that of the last
		// update), and the Service's earlier trigger times now measure
		// nothing that gets programmed: kube-proxy drops them too.
		b.slicesChanged++
		delete(b.triggers, old.service)
	}
	b.deleteSliceLocked(key)
}

// countedSlice reports whether kube-proxy's change metrics count events of
// es: it tracks IPv4 and IPv6 slices that name their Service (and never
// sees those its label selector leaves out).
func countedSlice(es *discoveryv1.EndpointSlice) bool {
	switch es.AddressType {
	case discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6:
	default:
		return false
	}
	return !ignoredSlice(es) && es.Name != "" && es.Labels[discoveryv1.LabelServiceName] != ""
}

// noteSliceUpdate counts an added or updated slice, given the Builder's
// old and new view of it (nil: not held, or unusable). An update that
// changes that view is pending until the next snapshot, and its trigger
// time, if it has one from after the Builder started (older ones predate
// this proxy: it cannot have been programming them), is handed out with
// the snapshot. Every such change counts, several per Service included.
func (b *Builder) noteSliceUpdate(es *discoveryv1.EndpointSlice, old, info *sliceInfo) {
	b.sliceEvents++
	if old == nil && info == nil || old != nil && info != nil && reflect.DeepEqual(old, info) {
		return // a resync, or a change the proxy does not see
	}
	b.slicesChanged++
	if t := triggerTime(es); t.After(b.started) {
		svc := serviceKey{NamespaceOrDefault(es.Namespace), es.Labels[discoveryv1.LabelServiceName]}
		family := model.IPv4
		if es.AddressType == discoveryv1.AddressTypeIPv6 {
			family = model.IPv6
		}
		b.triggers[svc] = append(b.triggers[svc], model.Trigger{At: t, Family: family})
	}
}

// triggerTime reads the endpoints.kubernetes.io/last-change-trigger-time
// annotation: when the change that led to this version of the slice
// happened (a Pod or the Service changing). Zero if absent or unparsable.
func triggerTime(es *discoveryv1.EndpointSlice) time.Time {
	v, ok := es.Annotations[corev1.EndpointsLastChangeTriggerTime]
	if !ok {
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}
	}
	return t
}

// ChangeCounts returns the events seen and the changes pending since the
// last snapshot, for kube-proxy's change metrics (model.ChangeCounts).
func (b *Builder) ChangeCounts() model.ChangeCounts {
	b.mu.Lock()
	defer b.mu.Unlock()
	return model.ChangeCounts{
		ServiceChanges:         b.serviceEvents,
		EndpointChanges:        b.sliceEvents,
		ServicesPending:        len(b.servicesBefore),
		EndpointChangesPending: b.slicesChanged,
	}
}

// deleteSliceLocked also handles a slice whose service label changed: the
// old Service loses it.
func (b *Builder) deleteSliceLocked(key serviceKey) {
	old := b.slices[key]
	if old == nil {
		return
	}
	delete(b.slices, key)
	if rest := slices.DeleteFunc(b.bySvc[old.service], func(i *sliceInfo) bool { return i == old }); len(rest) > 0 {
		b.bySvc[old.service] = rest
	} else {
		delete(b.bySvc, old.service)
	}
	b.invalidateEndpoints(old.service)
}

// UpsertNode records this node's Node object; other nodes are ignored.
func (b *Builder) UpsertNode(node *corev1.Node) error {
	if node == nil || node.Name != b.nodeName {
		return nil
	}
	n, err := NodeInfo(node)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.setErr(objectRef{"node", "", node.Name}, err)
	b.node = &n
	b.snap = nil
	b.nodeChanged = true
	return err
}

// DeleteNode forgets this node's Node object (the state keeps its name).
func (b *Builder) DeleteNode(name string) {
	if name != b.nodeName {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.errs, objectRef{"node", "", name})
	b.node = nil
	b.snap = nil
	b.nodeChanged = true
}

func (b *Builder) setErr(ref objectRef, err error) {
	if err == nil {
		delete(b.errs, ref)
		return
	}
	b.errs[ref] = err
}

// Errors lists the problems of the objects currently held, one entry per
// problem, in a stable order: each object's own problems, then the values
// it lost to other Services (as *ConflictError inside an *ObjectError).
func (b *Builder) Errors() []error {
	b.mu.Lock()
	defer b.mu.Unlock()
	refs := slices.Collect(maps.Keys(b.errs))
	for r := range b.conflicts {
		if _, ok := b.errs[r]; !ok {
			refs = append(refs, r)
		}
	}
	slices.SortFunc(refs, compareRefs)
	var out []error
	for _, r := range refs {
		out = append(out, SplitErrors(b.errs[r])...)
		out = append(out, b.conflicts[r]...)
	}
	return out
}

// ConflictErrors lists the values Services lost to each other, in the
// order Errors uses.
func (b *Builder) ConflictErrors() []error {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []error
	for _, r := range slices.SortedFunc(maps.Keys(b.conflicts), compareRefs) {
		out = append(out, b.conflicts[r]...)
	}
	return out
}

func compareRefs(x, y objectRef) int {
	switch {
	case x.kind != y.kind:
		return cmp.Compare(x.kind, y.kind)
	case x.namespace != y.namespace:
		return cmp.Compare(x.namespace, y.namespace)
	}
	return cmp.Compare(x.name, y.name)
}

// StateWithTriggers is State, and also hands out the trigger times of the
// EndpointSlice changes since the previous snapshot (see noteSliceUpdate)
// for serve.Metrics.Syncing. Taking a snapshot, with either method,
// clears the pending changes: a sync has taken them. The extra cost is
// O(changes).
func (b *Builder) StateWithTriggers() (*model.State, []time.Time) {
	st, triggers := b.StateWithFamilyTriggers()
	var times []time.Time
	for _, t := range triggers {
		times = append(times, t.At)
	}
	return st, times
}

// StateWithFamilyTriggers is StateWithTriggers with the IP family of each
// trigger time's slice (the ip_family of
// kubeproxy_network_programming_duration_seconds).
func (b *Builder) StateWithFamilyTriggers() (*model.State, []model.Trigger) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var triggers []model.Trigger
	for _, ts := range b.triggers {
		triggers = append(triggers, ts...)
	}
	// New maps rather than clear: clearing costs the largest size the
	// map ever had, a fresh one nothing.
	if len(b.triggers) > 0 {
		b.triggers = map[serviceKey][]model.Trigger{}
	}
	if len(b.servicesBefore) > 0 {
		b.servicesBefore = map[serviceKey][]*model.ServicePort{}
	}
	b.slicesChanged = 0
	return b.stateLocked(), triggers
}

// State returns a snapshot. The snapshot shares ServicePort and endpoint
// values with the Builder, which never modifies them after creation, and
// its maps are persistent (model.PortMap): the Builder's later changes
// copy what they touch, so the snapshot stays as it was whatever happens
// to the Builder later. With nothing changed since the last call, the same
// snapshot is returned again.
//
// The cost is refreshing the Services changed since the last call: no
// copy of the whole state.
func (b *Builder) State() *model.State {
	st, _ := b.StateWithTriggers()
	return st
}

func (b *Builder) stateLocked() *model.State {
	if len(b.published) == 0 && len(b.dirty) > 0 {
		b.published = make(map[serviceKey][]model.ServicePortName, len(b.dirty))
	}
	b.refreshDirty()
	if len(b.dirty) > 0 {
		// A fresh map rather than clear, which costs the largest size
		// the map ever had (every Service, after the first listing).
		b.dirty = map[serviceKey]struct{}{}
	}
	if b.snap != nil {
		return b.snap
	}
	b.gen++
	st := &model.State{
		Node:         model.Node{Name: b.nodeName},
		Services:     b.liveServices.Map(),
		Endpoints:    b.liveEndpoints.Map(),
		ServiceCIDRs: b.cidrs,
		Changes: model.StateChanges{Lineage: b.lineage, Gen: b.gen, Ports: b.changed,
			NodeChanged: b.nodeChanged || b.gen == 1, ServiceCIDRsChanged: b.cidrsChanged},
	}
	b.changed, b.nodeChanged, b.cidrsChanged = nil, false, false
	if b.node != nil {
		st.Node = *b.node
	}
	b.snap = st
	return st
}

// refreshDirty refreshes the Services changed since the last snapshot.
func (b *Builder) refreshDirty() {
	for key := range b.dirty {
		b.refreshLocked(key)
	}
}

// refreshLocked replaces a Service's entries in the live maps.
func (b *Builder) refreshLocked(key serviceKey) {
	for _, n := range b.published[key] {
		b.liveServices.Delete(n)
		b.liveEndpoints.Delete(n)
	}
	b.changed = append(b.changed, b.published[key]...)
	e := b.services[key]
	if e == nil {
		delete(b.published, key)
		return
	}
	if e.endpoints == nil {
		infos := b.bySvc[key] // mergeEndpointList sorts a copy
		e.endpoints = mergeEndpointList(e.ports, infos, b.nodeName)
	}
	names := make([]model.ServicePortName, 0, len(e.effective))
	for _, sp := range e.effective {
		b.liveServices.Set(sp.Name, sp)
		names = append(names, sp.Name)
	}
	for _, pe := range e.endpoints {
		b.liveEndpoints.Set(pe.name, pe.eps)
	}
	b.published[key] = names
	b.changed = append(b.changed, names...)
}
