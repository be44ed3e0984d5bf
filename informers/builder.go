package informers

import (
	"cmp"
	"maps"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/kube-nftproxy/kube-nftproxy/proxier"
)

// Builder holds the current Services, EndpointSlices and this node's Node
// object, already converted, and hands out State snapshots. Sources call the
// Upsert/Delete methods as objects come and go; the methods are safe for
// concurrent use (client-go runs one handler goroutine per informer).
type Builder struct {
	mu       sync.Mutex
	nodeName string

	services map[serviceKey][]*proxier.ServicePort
	slices   map[serviceKey]*sliceInfo            // keyed by the slice's own namespace/name
	bySvc    map[serviceKey]map[string]*sliceInfo // service -> slice name -> slice
	node     *proxier.Node
	// endpoints caches each Service's merged endpoints until one of its
	// slices or its ports change, so a snapshot costs O(services), not
	// O(endpoints), after a small change.
	endpoints map[serviceKey]map[proxier.ServicePortName][]proxier.Endpoint
	errs      map[objectRef]error
}

// objectRef names any object the Builder tracks, for per-object errors.
type objectRef struct{ kind, namespace, name string }

// NewBuilder returns an empty Builder for the node named nodeName (the
// hostname override): only that Node object is used, and endpoints on it
// are local.
func NewBuilder(nodeName string) *Builder {
	return &Builder{
		nodeName:  nodeName,
		services:  map[serviceKey][]*proxier.ServicePort{},
		slices:    map[serviceKey]*sliceInfo{},
		bySvc:     map[serviceKey]map[string]*sliceInfo{},
		endpoints: map[serviceKey]map[proxier.ServicePortName][]proxier.Endpoint{},
		errs:      map[objectRef]error{},
	}
}

// NodeName is the node this Builder builds for.
func (b *Builder) NodeName() string { return b.nodeName }

// UpsertService adds or replaces a Service. The returned error lists what
// was wrong with it (also kept for Errors); a Service that cannot be
// programmed, or that kube-proxy ignores, is removed from the state.
func (b *Builder) UpsertService(svc *corev1.Service) error {
	if svc == nil {
		return nil
	}
	ports, err := ServicePorts(svc)
	key := serviceKey{namespaceOrDefault(svc.Namespace), svc.Name}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.setErr(objectRef{"service", key.namespace, key.name}, err)
	if len(ports) == 0 {
		b.deleteServiceLocked(key)
		return err
	}
	b.services[key] = ports
	delete(b.endpoints, key)
	return err
}

// DeleteService removes a Service; its slices stay until they are deleted.
func (b *Builder) DeleteService(namespace, name string) {
	key := serviceKey{namespaceOrDefault(namespace), name}
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.errs, objectRef{"service", key.namespace, key.name})
	b.deleteServiceLocked(key)
}

func (b *Builder) deleteServiceLocked(key serviceKey) {
	delete(b.services, key)
	delete(b.endpoints, key)
}

// UpsertEndpointSlice adds or replaces an EndpointSlice. An ignored or
// unusable slice removes any earlier version of it.
func (b *Builder) UpsertEndpointSlice(es *discoveryv1.EndpointSlice) error {
	if es == nil {
		return nil
	}
	info, err := parseEndpointSlice(es)
	key := serviceKey{namespaceOrDefault(es.Namespace), es.Name}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.setErr(objectRef{"endpointslice", key.namespace, key.name}, err)
	b.deleteSliceLocked(key)
	if info == nil {
		return err
	}
	b.slices[key] = info
	if b.bySvc[info.service] == nil {
		b.bySvc[info.service] = map[string]*sliceInfo{}
	}
	b.bySvc[info.service][info.name] = info
	delete(b.endpoints, info.service)
	return err
}

// DeleteEndpointSlice removes an EndpointSlice.
func (b *Builder) DeleteEndpointSlice(namespace, name string) {
	key := serviceKey{namespaceOrDefault(namespace), name}
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.errs, objectRef{"endpointslice", key.namespace, key.name})
	b.deleteSliceLocked(key)
}

// deleteSliceLocked also handles a slice whose service label changed: the
// old Service loses it.
func (b *Builder) deleteSliceLocked(key serviceKey) {
	old := b.slices[key]
	if old == nil {
		return
	}
	delete(b.slices, key)
	delete(b.bySvc[old.service], old.name)
	if len(b.bySvc[old.service]) == 0 {
		delete(b.bySvc, old.service)
	}
	delete(b.endpoints, old.service)
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
}

func (b *Builder) setErr(ref objectRef, err error) {
	if err == nil {
		delete(b.errs, ref)
		return
	}
	b.errs[ref] = err
}

// Errors lists the problems of the objects currently held, one entry per
// problem, in a stable order.
func (b *Builder) Errors() []error {
	b.mu.Lock()
	defer b.mu.Unlock()
	refs := slices.SortedFunc(maps.Keys(b.errs), func(x, y objectRef) int {
		switch {
		case x.kind != y.kind:
			return cmp.Compare(x.kind, y.kind)
		case x.namespace != y.namespace:
			return cmp.Compare(x.namespace, y.namespace)
		}
		return cmp.Compare(x.name, y.name)
	})
	var out []error
	for _, r := range refs {
		out = append(out, SplitErrors(b.errs[r])...)
	}
	return out
}

// State returns a fresh snapshot. The snapshot shares ServicePort and
// endpoint values with the Builder, which never modifies them after
// creation, so it stays valid whatever happens to the Builder later.
func (b *Builder) State() *proxier.State {
	b.mu.Lock()
	defer b.mu.Unlock()
	st := proxier.NewState()
	st.Node = proxier.Node{Name: b.nodeName}
	if b.node != nil {
		st.Node = *b.node
	}
	for key, ports := range b.services {
		for _, sp := range ports {
			st.Services[sp.Name] = sp
		}
		eps, ok := b.endpoints[key]
		if !ok {
			infos := slices.Collect(maps.Values(b.bySvc[key]))
			eps = mergeEndpoints(ports, infos, b.nodeName)
			b.endpoints[key] = eps
		}
		maps.Copy(st.Endpoints, eps)
	}
	return st
}
