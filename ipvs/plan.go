package ipvs

import (
	"net/netip"
	"slices"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/internal/ipvsnl"
	"github.com/kube-nftproxy/kube-nftproxy/model"
)

// Config is what shapes the plan besides the State: kube-proxy's IPVS flags.
type Config struct {
	// Scheduler is --ipvs-scheduler, one for every virtual server; "" is rr.
	Scheduler string
	// NodePortAddresses restricts NodePort virtual servers to the node
	// addresses within them (--nodeport-addresses), per family: a family
	// with no prefix here uses all of its addresses.
	NodePortAddresses []netip.Prefix
	// NodePortPrimary is --nodeport-addresses primary: NodePorts only on
	// the node's primary address of each family (the first of the Node
	// object's addresses, as the nftables mode takes it); a family
	// without one uses all of its addresses, as upstream.
	NodePortPrimary bool
}

func (c Config) scheduler() string {
	if c.Scheduler == "" {
		return "rr"
	}
	return c.Scheduler
}

// Plan is everything the IPVS backend programs for one State: per service
// port, its virtual servers, its addresses for kube-ipvs0 and its helper
// set elements. It is a plain value, built without the kernel.
type Plan struct {
	Services map[model.ServicePortName]*Fragment

	// From a Planner: its identity and the plan's number (a Planner
	// numbers its plans from 1), the number of the plan this one follows
	// (0: none, or unknown) and the service ports whose fragments were
	// added, changed or removed since then, so that the Syncer touches
	// only those.
	planner *Planner
	seq     uint64
	prevSeq uint64
	changed []model.ServicePortName
}

// Fragment is what one service port contributes. Fragments of different
// service ports may share addresses (one ClusterIP, several ports) and
// elements (an endpoint behind two services): the Syncer counts owners.
type Fragment struct {
	Virtual []ipvsnl.VirtualServer // by key
	Addrs   []netip.Addr           // for kube-ipvs0, sorted
	// elems are its helper set elements, packed (one per local endpoint
	// and more: the plan's largest part after the real servers), in
	// compareElements order.
	elems packedElems
}

// Elements lists the fragment's helper set elements, sorted.
func (f *Fragment) Elements() []Element {
	return f.elems.all()
}

// Equal reports whether two fragments program the same objects.
func (f *Fragment) Equal(o *Fragment) bool {
	if f == o {
		return true
	}
	if f == nil || o == nil {
		return false
	}
	return slices.EqualFunc(f.Virtual, o.Virtual, func(a, b ipvsnl.VirtualServer) bool {
		return a.Service == b.Service && slices.Equal(a.Dests, b.Dests)
	}) && slices.Equal(f.Addrs, o.Addrs) && f.elems.equal(o.elems)
}

// BuildPlan builds the plan of a State (a function named Plan would clash
// with the type). nodeAddrs are the node's local
// addresses on every interface but kube-ipvs0: NodePorts listen on them
// (loopback excepted), and external or LB IPs among them are not bound to
// kube-ipvs0.
func BuildPlan(st *model.State, cfg Config, nodeAddrs []netip.Addr) *Plan {
	return NewPlanner(cfg).Plan(st, nodeAddrs)
}

// Planner builds plans and reuses the fragment of every service port whose
// ServicePort and endpoints are the ones it planned last time (a
// model.ChangeTracker tells which changed), so that an unchanged port
// costs a pointer comparison here and nothing in the Syncer. Its plans
// share one map of fragments, updated in place: a plan is valid until the
// next call of Plan (a change of one endpoint costs no copy of every
// service port).
type Planner struct {
	cfg      Config
	node     model.Node
	addrs    []netip.Addr
	changes  model.ChangeTracker
	services map[model.ServicePortName]*Fragment
	seq      uint64 // the number of the last plan
}

// NewPlanner returns a Planner with nothing to reuse.
func NewPlanner(cfg Config) *Planner { return &Planner{cfg: cfg} }

// Plan builds the plan of st; see BuildPlan.
func (p *Planner) Plan(st *model.State, nodeAddrs []netip.Addr) *Plan {
	prevSeq := p.seq
	if p.services == nil || !p.node.Equal(st.Node) || !slices.Equal(p.addrs, nodeAddrs) {
		p.changes.Reset()
		p.services = make(map[model.ServicePortName]*Fragment, st.Services.Len())
		prevSeq = 0 // nothing to follow: the Syncer compares everything
	} else if p.changes.Same(st) {
		// The same State again (a periodic sync): nothing changed.
		return &Plan{Services: p.services, planner: p, seq: p.seq, prevSeq: prevSeq}
	}
	p.node, p.addrs = st.Node, slices.Clone(nodeAddrs)
	p.seq++
	names := p.changes.Changes(st)
	p.changes.Record(st, names)
	b := newBuilder(p.cfg, st.Node, nodeAddrs)
	var changed []model.ServicePortName
	for _, name := range names {
		var fr *Fragment
		if svc, ok := st.Services.Lookup(name); ok {
			fr = b.fragment(svc, st.Endpoints.Get(name))
		}
		if p.setFragment(name, fr) {
			changed = append(changed, name)
		}
	}
	return &Plan{Services: p.services, planner: p, seq: p.seq, prevSeq: prevSeq, changed: changed}
}

// setFragment puts a service port's new fragment (nil: none) in place of
// its old one and reports whether they differ; an equal one keeps the old
// fragment, the one the Syncer has.
func (p *Planner) setFragment(name model.ServicePortName, fr *Fragment) bool {
	old, had := p.services[name]
	if !had && fr == nil {
		return false
	}
	if old.Equal(fr) {
		return false
	}
	if fr == nil {
		delete(p.services, name)
	} else {
		p.services[name] = fr
	}
	return true
}

// builder holds what every fragment of one plan shares.
type builder struct {
	cfg  Config
	node model.Node
	// local are the node's addresses (not kube-ipvs0's); nodePort those
	// NodePorts listen on.
	local    map[netip.Addr]bool
	nodePort []netip.Addr
	// elems collects the fragment being built's elements, reused.
	elems []Element
}

func newBuilder(cfg Config, node model.Node, nodeAddrs []netip.Addr) *builder {
	b := &builder{cfg: cfg, node: node, local: map[netip.Addr]bool{}}
	for _, a := range nodeAddrs {
		a = a.WithZone("").Unmap()
		b.local[a] = true
	}
	prefixes := slices.Clone(cfg.NodePortAddresses)
	if cfg.NodePortPrimary {
		for _, v6 := range []bool{false, true} {
			if p, ok := primaryIP(node, v6); ok {
				prefixes = append(prefixes, netip.PrefixFrom(p, p.BitLen()))
			}
		}
	}
	for _, a := range nodeAddrs {
		a = a.WithZone("").Unmap()
		if a.IsLoopback() || slices.Contains(b.nodePort, a) {
			continue
		}
		if within := ofFamily(a.Is6(), prefixes); len(within) > 0 &&
			!slices.ContainsFunc(within, func(p netip.Prefix) bool { return p.Contains(a) }) {
			continue
		}
		b.nodePort = append(b.nodePort, a)
	}
	slices.SortFunc(b.nodePort, netip.Addr.Compare)
	return b
}

// primaryIP is the node's primary address of a family: the first of the
// Node object's, as kube-proxy's single node IP per family (loopback
// counts as none, as upstream's "unknown" node IP).
func primaryIP(node model.Node, v6 bool) (netip.Addr, bool) {
	for _, a := range node.IPs {
		if a = a.Unmap(); a.Is6() == v6 {
			return a, !a.IsLoopback()
		}
	}
	return netip.Addr{}, false
}

func ofFamily[T interface{ Addr() netip.Addr }](v6 bool, in []T) []T {
	var out []T
	for _, x := range in {
		if x.Addr().Is6() == v6 {
			out = append(out, x)
		}
	}
	return out
}

func addrsOfFamily(v6 bool, in []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, a := range in {
		if a.Unmap().Is6() == v6 {
			out = append(out, a.Unmap())
		}
	}
	return out
}

// fragment builds one service port's fragment, both families; nil when
// it has no ClusterIP (upstream's per-family proxiers skip such ports).
func (b *builder) fragment(svc *model.ServicePort, eps []model.Endpoint) *Fragment {
	fr := &Fragment{}
	b.elems = b.elems[:0]
	for _, v6 := range []bool{false, true} {
		b.family(fr, v6, svc, eps)
	}
	if len(fr.Virtual) == 0 {
		return nil
	}
	slices.SortFunc(fr.Virtual, func(a, b ipvsnl.VirtualServer) int { return a.ServiceKey.Compare(b.ServiceKey) })
	slices.SortFunc(fr.Addrs, netip.Addr.Compare)
	fr.Addrs = slices.Compact(fr.Addrs)
	slices.SortFunc(b.elems, compareElements)
	fr.elems = packElements(slices.Compact(b.elems))
	return fr
}

// family adds one IP family's part of a service port to fr.
func (b *builder) family(fr *Fragment, v6 bool, svc *model.ServicePort, all []model.Endpoint) {
	clusterIPs := addrsOfFamily(v6, svc.ClusterIPs)
	if len(clusterIPs) == 0 {
		return
	}
	eps := all
	if slices.ContainsFunc(all, func(ep model.Endpoint) bool { return ep.Addr.Unmap().Is6() != v6 }) {
		eps = nil // a copy of this family's only
		for _, ep := range all {
			if ep.Addr.Unmap().Is6() == v6 {
				eps = append(eps, ep)
			}
		}
	}
	cluster, local, _, _ := model.CategorizeEndpoints(svc, eps, b.node)
	fb := &familyBuild{builder: b, fr: fr, v6: v6, svc: svc, base: b.virtualBase(v6, svc),
		internal: realServers(svc.InternalPolicyLocal, cluster, local),
		external: realServers(svc.ExternalPolicyLocal, cluster, local)}
	fb.clusterIP(clusterIPs[0])
	fb.externalIPs()
	fb.loadBalancerIPs()
	fb.nodePorts()
	if svc.HealthCheckNodePort != 0 {
		b.elems = append(b.elems, Element{V6: v6, Set: SetHealthCheckNodePort, Port: svc.HealthCheckNodePort})
	}
	fb.hairpin(eps)
}

// virtualBase is what every virtual server of a service port shares.
func (b *builder) virtualBase(v6 bool, svc *model.ServicePort) ipvsnl.Service {
	base := ipvsnl.Service{Scheduler: b.cfg.scheduler(), Netmask: 0xffffffff}
	if v6 {
		base.Netmask = 128
	}
	if svc.AffinityTimeout > 0 {
		base.Flags |= ipvsnl.FlagPersistent
		base.Timeout = uint32(min(svc.AffinityTimeout/time.Second, ipvsnl.MaxTimeout))
	}
	if base.Scheduler == "mh" {
		base.Flags |= ipvsnl.FlagSched2
	}
	return base
}

// familyBuild builds one IP family's part of one service port's fragment.
type familyBuild struct {
	*builder
	fr                 *Fragment
	v6                 bool
	svc                *model.ServicePort
	base               ipvsnl.Service
	internal, external []ipvsnl.Dest
}

func (fb *familyBuild) virtual(a netip.Addr, port uint16, dests []ipvsnl.Dest) {
	s := fb.base
	s.ServiceKey = ipvsnl.ServiceKey{Addr: a, Protocol: fb.svc.Protocol, Port: port}
	fb.fr.Virtual = append(fb.fr.Virtual, ipvsnl.VirtualServer{Service: s, Dests: dests})
}

func (fb *familyBuild) elem(set string, a netip.Addr, port uint16) {
	fb.elems = append(fb.elems, Element{V6: fb.v6, Set: set, Addr: a, Protocol: fb.svc.Protocol, Port: port})
}

// bind puts an address on kube-ipvs0.
func (fb *familyBuild) bind(a netip.Addr) {
	fb.fr.Addrs = append(fb.fr.Addrs, a)
	fb.elems = append(fb.elems, Element{V6: fb.v6, Set: SetIPVSIPs, Addr: a})
}

func (fb *familyBuild) clusterIP(ip netip.Addr) {
	fb.virtual(ip, fb.svc.Port, fb.internal)
	fb.bind(ip)
	fb.elem(SetClusterIP, ip, fb.svc.Port)
}

func (fb *familyBuild) externalIPs() {
	for _, ip := range addrsOfFamily(fb.v6, fb.svc.ExternalIPs) {
		fb.virtual(ip, fb.svc.Port, fb.external)
		if !fb.local[ip] {
			fb.bind(ip)
		}
		if fb.svc.ExternalPolicyLocal {
			fb.elem(SetExternalIPLocal, ip, fb.svc.Port)
		} else {
			fb.elem(SetExternalIP, ip, fb.svc.Port)
		}
	}
}

// loadBalancerIPs adds the LB IPs' virtual servers and elements. As
// upstream, the node may reach an LB IP with source ranges when a range
// holds its primary address of the family (kube-proxy knows one node IP
// per family); otherwise its own requests, which come from the LB IP, are
// dropped.
func (fb *familyBuild) loadBalancerIPs() {
	svc, v6 := fb.svc, fb.v6
	ranges := ofFamily(v6, svc.LoadBalancerSourceRanges)
	nodeInRange := false
	if primary, ok := primaryIP(fb.node, v6); ok {
		for _, p := range ranges {
			nodeInRange = nodeInRange || p.Contains(primary)
		}
	}
	for _, ip := range addrsOfFamily(v6, svc.LoadBalancerIPs) {
		fb.virtual(ip, svc.Port, fb.external)
		if !fb.local[ip] {
			fb.bind(ip)
		}
		fb.elem(SetLoadBalancer, ip, svc.Port)
		if svc.ExternalPolicyLocal {
			fb.elem(SetLoadBalancerLocal, ip, svc.Port)
		}
		if len(ranges) == 0 {
			continue
		}
		fb.elem(SetLoadBalancerFW, ip, svc.Port)
		for _, p := range ranges {
			fb.elems = append(fb.elems, Element{V6: v6, Set: SetLBSourceCIDR, Addr: ip, Protocol: svc.Protocol, Port: svc.Port, Net: p.Masked()})
		}
		// The node's requests to an LB IP it holds come from that IP.
		self := Element{V6: v6, Set: SetLBSourceIP, Addr: ip, Protocol: svc.Protocol, Port: svc.Port, Addr2: ip}
		if !nodeInRange {
			self.Set = SetLBNoNodeAccess
		}
		fb.elems = append(fb.elems, self)
	}
}

func (fb *familyBuild) nodePorts() {
	svc, v6 := fb.svc, fb.v6
	nodePort := svc.NodePortIn(v6)
	if nodePort == 0 {
		return
	}
	nodeAddrs := addrsOfFamily(v6, fb.nodePort)
	for _, a := range nodeAddrs {
		fb.virtual(a, nodePort, fb.external)
	}
	add := func(set string, a netip.Addr) {
		fb.elems = append(fb.elems, Element{V6: v6, Set: set, Addr: a, Port: nodePort})
	}
	if svc.Protocol == model.SCTP {
		for _, a := range nodeAddrs {
			add(SetNodePortSCTP, a)
			if svc.ExternalPolicyLocal {
				add(SetNodePortLocalSCTP, a)
			}
		}
		return
	}
	set, localSet := SetNodePortTCP, SetNodePortLocalTCP
	if svc.Protocol == model.UDP {
		set, localSet = SetNodePortUDP, SetNodePortLocalUDP
	}
	add(set, netip.Addr{})
	if svc.ExternalPolicyLocal {
		add(localSet, netip.Addr{})
	}
}

// hairpin adds the elements of local endpoints that may reach themselves
// through the service.
func (fb *familyBuild) hairpin(eps []model.Endpoint) {
	localEps := map[netip.AddrPort]bool{}
	for _, ep := range eps {
		if ep.IsLocal(fb.node.Name) {
			localEps[netip.AddrPortFrom(ep.Addr.Unmap(), ep.Port)] = true
		}
	}
	for _, v := range fb.fr.Virtual {
		for _, d := range v.Dests {
			if localEps[d.Addr] {
				fb.elems = append(fb.elems, Element{V6: fb.v6, Set: SetLoopBack, Addr: d.Addr.Addr(), Protocol: fb.svc.Protocol, Port: d.Addr.Port(), Addr2: d.Addr.Addr()})
			}
		}
	}
}

// realServers are a virtual server's destinations. With a Local policy
// and no local endpoint, IPVS mode falls back to the cluster endpoints
// (upstream #97081: pods on the node still reach the service). The chosen
// endpoints get weight 1. Endpoints not chosen, such as serving
// terminating ones beside Ready ones, are no real servers, as upstream:
// one that was drains (weight 0, deleted once its connections are gone).
func realServers(onlyLocal bool, cluster, local []model.Endpoint) []ipvsnl.Dest {
	chosen := cluster
	if onlyLocal && len(local) > 0 {
		chosen = local
	}
	if chosen == nil {
		// This virtual server uses no endpoints at all (internal policy
		// Local, no external access, no local endpoint).
		return nil
	}
	out := make([]ipvsnl.Dest, 0, len(chosen))
	in := map[netip.AddrPort]bool{}
	for _, ep := range chosen {
		ap := netip.AddrPortFrom(ep.Addr.Unmap(), ep.Port)
		if !in[ap] {
			in[ap] = true
			out = append(out, ipvsnl.Dest{Addr: ap, Weight: 1, Fwd: ipvsnl.FwdMasq})
		}
	}
	slices.SortFunc(out, func(a, b ipvsnl.Dest) int { return a.Addr.Compare(b.Addr) })
	return out
}

// VirtualServers lists every virtual server of the plan by key. Two
// service ports asking for one virtual server (the same external IP and
// port) get the first's, by name, as the Syncer does.
func (p *Plan) VirtualServers() []ipvsnl.VirtualServer {
	byKey := map[ipvsnl.ServiceKey]ipvsnl.VirtualServer{}
	owner := map[ipvsnl.ServiceKey]string{}
	for name, fr := range p.Services {
		for _, v := range fr.Virtual {
			if o, ok := owner[v.ServiceKey]; !ok || name.String() < o {
				byKey[v.ServiceKey], owner[v.ServiceKey] = v, name.String()
			}
		}
	}
	out := make([]ipvsnl.VirtualServer, 0, len(byKey))
	for _, v := range byKey {
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, b ipvsnl.VirtualServer) int { return a.ServiceKey.Compare(b.ServiceKey) })
	return out
}

// Addrs lists the kube-ipvs0 addresses of the plan, sorted.
func (p *Plan) Addrs() []netip.Addr {
	var out []netip.Addr
	for _, fr := range p.Services {
		out = append(out, fr.Addrs...)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// Elements lists the helper set elements of the plan, by set and key.
func (p *Plan) Elements() []Element {
	var out []Element
	for _, fr := range p.Services {
		out = append(out, fr.elems.all()...)
	}
	slices.SortFunc(out, compareElements)
	return slices.Compact(out)
}
