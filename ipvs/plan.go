package ipvs

import (
	"net/netip"
	"slices"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/proxier"
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
	Services map[proxier.ServicePortName]*Fragment

	// From a Planner: its identity and generation, the generation this
	// plan follows (0: none, or unknown) and the service ports whose
	// fragments were added, changed or removed since then, so that the
	// Syncer touches only those.
	planner *Planner
	gen     uint64
	prevGen uint64
	changed []proxier.ServicePortName
}

// Fragment is what one service port contributes. Fragments of different
// service ports may share addresses (one ClusterIP, several ports) and
// elements (an endpoint behind two services): the Syncer counts owners.
type Fragment struct {
	Virtual  []VirtualServer // by key
	Addrs    []netip.Addr    // for kube-ipvs0, sorted
	Elements []Element       // sorted
}

// Equal reports whether two fragments program the same objects.
func (f *Fragment) Equal(o *Fragment) bool {
	if f == o {
		return true
	}
	if f == nil || o == nil {
		return false
	}
	return slices.EqualFunc(f.Virtual, o.Virtual, func(a, b VirtualServer) bool {
		return a.Service == b.Service && slices.Equal(a.Dests, b.Dests)
	}) && slices.Equal(f.Addrs, o.Addrs) && slices.Equal(f.Elements, o.Elements)
}

// BuildPlan builds the plan of a State (a function named Plan would clash
// with the type). nodeAddrs are the node's local
// addresses on every interface but kube-ipvs0: NodePorts listen on them
// (loopback excepted), and external or LB IPs among them are not bound to
// kube-ipvs0.
func BuildPlan(st *proxier.State, cfg Config, nodeAddrs []netip.Addr) *Plan {
	return NewPlanner(cfg).Plan(st, nodeAddrs)
}

// Planner builds plans and reuses the fragment of every service port whose
// ServicePort and endpoints are the same objects as last time (sources
// share unchanged ones), so that an unchanged port costs a pointer
// comparison here and nothing in the Syncer. Its plans share one map of
// fragments, updated in place: a plan is valid until the next call of
// Plan (a change of one endpoint costs no copy of every service port).
type Planner struct {
	cfg      Config
	node     proxier.Node
	addrs    []netip.Addr
	inputs   map[proxier.ServicePortName]planInput
	services map[proxier.ServicePortName]*Fragment
	gen      uint64
	// The lineage and generation of the last State planned.
	lineage  *proxier.Lineage
	stateGen uint64
}

type planInput struct {
	svc *proxier.ServicePort
	eps []proxier.Endpoint
}

// NewPlanner returns a Planner with nothing to reuse.
func NewPlanner(cfg Config) *Planner { return &Planner{cfg: cfg} }

// Plan builds the plan of st; see BuildPlan.
func (p *Planner) Plan(st *proxier.State, nodeAddrs []netip.Addr) *Plan {
	prevGen := p.gen
	fresh := p.services == nil || !p.node.Equal(st.Node) || !slices.Equal(p.addrs, nodeAddrs)
	if fresh {
		p.inputs = make(map[proxier.ServicePortName]planInput, len(st.Services))
		p.services = make(map[proxier.ServicePortName]*Fragment, len(st.Services))
		prevGen = 0 // nothing to follow: the Syncer compares everything
	}
	// The State says what changed since the one planned last: only those.
	delta := !fresh && st.Delta.Follows(p.lineage, p.stateGen)
	if !fresh && st.Delta.Lineage != nil && st.Delta.Lineage == p.lineage && st.Delta.Gen == p.stateGen {
		// The same State again (a periodic sync): nothing changed.
		return &Plan{Services: p.services, planner: p, gen: p.gen, prevGen: prevGen}
	}
	p.lineage, p.stateGen = st.Delta.Lineage, st.Delta.Gen
	p.node, p.addrs = st.Node, slices.Clone(nodeAddrs)
	p.gen++
	b := newBuilder(p.cfg, st.Node, nodeAddrs)
	var changed []proxier.ServicePortName
	set := func(name proxier.ServicePortName, fr *Fragment) {
		old, had := p.services[name]
		switch {
		case fr != nil:
			p.services[name] = fr
		case had:
			delete(p.services, name)
		}
		if had || fr != nil {
			if !old.Equal(fr) {
				changed = append(changed, name)
			} else if fr != nil {
				p.services[name] = old // same objects: keep the one the Syncer has
			}
		}
	}
	if delta {
		for _, name := range st.Delta.Changed {
			svc, ok := st.Services[name]
			if !ok {
				if _, had := p.inputs[name]; had {
					delete(p.inputs, name)
					set(name, nil)
				}
				continue
			}
			in := planInput{svc, st.Endpoints[name]}
			if old, ok := p.inputs[name]; ok && sameInput(old, in) {
				continue
			}
			p.inputs[name] = in
			set(name, b.fragment(svc, in.eps))
		}
		return &Plan{Services: p.services, planner: p, gen: p.gen, prevGen: prevGen, changed: changed}
	}
	known, kept := len(p.inputs), 0
	for name, svc := range st.Services {
		in := planInput{svc, st.Endpoints[name]}
		if old, ok := p.inputs[name]; ok {
			kept++
			if sameInput(old, in) {
				continue
			}
		}
		p.inputs[name] = in
		set(name, b.fragment(svc, in.eps))
	}
	// Service ports gone: only looked for when some are.
	if kept < known {
		for name := range p.inputs {
			if _, ok := st.Services[name]; !ok {
				delete(p.inputs, name)
				set(name, nil)
			}
		}
	}
	return &Plan{Services: p.services, planner: p, gen: p.gen, prevGen: prevGen, changed: changed}
}

func sameInput(a, b planInput) bool {
	return a.svc == b.svc && len(a.eps) == len(b.eps) && (len(a.eps) == 0 || &a.eps[0] == &b.eps[0])
}

// builder holds what every fragment of one plan shares.
type builder struct {
	cfg  Config
	node proxier.Node
	// local are the node's addresses (not kube-ipvs0's); nodePort those
	// NodePorts listen on.
	local    map[netip.Addr]bool
	nodePort []netip.Addr
}

func newBuilder(cfg Config, node proxier.Node, nodeAddrs []netip.Addr) *builder {
	b := &builder{cfg: cfg, node: node, local: map[netip.Addr]bool{}}
	for _, a := range nodeAddrs {
		a = a.WithZone("").Unmap()
		b.local[a] = true
	}
	prefixes := cfg.NodePortAddresses
	if cfg.NodePortPrimary {
		prefixes = nil
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
func primaryIP(node proxier.Node, v6 bool) (netip.Addr, bool) {
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
func (b *builder) fragment(svc *proxier.ServicePort, eps []proxier.Endpoint) *Fragment {
	fr := &Fragment{}
	for _, v6 := range []bool{false, true} {
		b.family(fr, v6, svc, eps)
	}
	if len(fr.Virtual) == 0 {
		return nil
	}
	slices.SortFunc(fr.Virtual, func(a, b VirtualServer) int { return a.ServiceKey.Compare(b.ServiceKey) })
	slices.SortFunc(fr.Addrs, netip.Addr.Compare)
	fr.Addrs = slices.Compact(fr.Addrs)
	slices.SortFunc(fr.Elements, compareElements)
	fr.Elements = slices.Compact(fr.Elements)
	return fr
}

func (b *builder) family(fr *Fragment, v6 bool, svc *proxier.ServicePort, all []proxier.Endpoint) {
	clusterIPs := addrsOfFamily(v6, svc.ClusterIPs)
	if len(clusterIPs) == 0 {
		return
	}
	clusterIP := clusterIPs[0]
	var eps []proxier.Endpoint
	for _, ep := range all {
		if ep.Addr.Unmap().Is6() == v6 {
			eps = append(eps, ep)
		}
	}
	cluster, local, _, _ := proxier.CategorizeEndpoints(svc, eps, b.node)
	internal := realServers(svc.InternalPolicyLocal, cluster, local)
	external := realServers(svc.ExternalPolicyLocal, cluster, local)

	base := Service{Scheduler: b.cfg.scheduler(), Netmask: 0xffffffff}
	if v6 {
		base.Netmask = 128
	}
	if svc.AffinityTimeout > 0 {
		base.Flags |= FlagPersistent
		base.Timeout = uint32(min(svc.AffinityTimeout/time.Second, timeoutMax))
	}
	if base.Scheduler == "mh" {
		base.Flags |= FlagSched2
	}
	vs := func(a netip.Addr, port uint16, dests []Dest) {
		s := base
		s.ServiceKey = ServiceKey{Addr: a, Protocol: svc.Protocol, Port: port}
		fr.Virtual = append(fr.Virtual, VirtualServer{Service: s, Dests: dests})
	}
	elem := func(set string, a netip.Addr, port uint16) {
		fr.Elements = append(fr.Elements, Element{V6: v6, Set: set, Addr: a, Protocol: svc.Protocol, Port: port})
	}
	bind := func(a netip.Addr) {
		fr.Addrs = append(fr.Addrs, a)
		fr.Elements = append(fr.Elements, Element{V6: v6, Set: SetIPVSIPs, Addr: a})
	}

	vs(clusterIP, svc.Port, internal)
	bind(clusterIP)
	elem(SetClusterIP, clusterIP, svc.Port)

	for _, ip := range addrsOfFamily(v6, svc.ExternalIPs) {
		vs(ip, svc.Port, external)
		if !b.local[ip] {
			bind(ip)
		}
		if svc.ExternalPolicyLocal {
			elem(SetExternalIPLocal, ip, svc.Port)
		} else {
			elem(SetExternalIP, ip, svc.Port)
		}
	}

	// As upstream, the node may reach an LB IP with source ranges when a
	// range holds its primary address of the family (kube-proxy knows one
	// node IP per family); otherwise its own requests, which come from the
	// LB IP, are dropped.
	ranges := ofFamily(v6, svc.LoadBalancerSourceRanges)
	nodeInRange := false
	if primary, ok := primaryIP(b.node, v6); ok {
		for _, p := range ranges {
			nodeInRange = nodeInRange || p.Contains(primary)
		}
	}
	for _, ip := range addrsOfFamily(v6, svc.LoadBalancerIPs) {
		vs(ip, svc.Port, external)
		if !b.local[ip] {
			bind(ip)
		}
		elem(SetLoadBalancer, ip, svc.Port)
		if svc.ExternalPolicyLocal {
			elem(SetLoadBalancerLocal, ip, svc.Port)
		}
		if len(ranges) == 0 {
			continue
		}
		elem(SetLoadBalancerFW, ip, svc.Port)
		for _, p := range ranges {
			fr.Elements = append(fr.Elements, Element{V6: v6, Set: SetLBSourceCIDR, Addr: ip, Protocol: svc.Protocol, Port: svc.Port, Net: p.Masked()})
		}
		// The node's requests to an LB IP it holds come from that IP.
		self := Element{V6: v6, Set: SetLBSourceIP, Addr: ip, Protocol: svc.Protocol, Port: svc.Port, Addr2: ip}
		if !nodeInRange {
			self.Set = SetLBNoNodeAccess
		}
		fr.Elements = append(fr.Elements, self)
	}

	if nodePort := svc.NodePortIn(v6); nodePort != 0 {
		nodeAddrs := addrsOfFamily(v6, b.nodePort)
		for _, a := range nodeAddrs {
			vs(a, nodePort, external)
		}
		switch svc.Protocol {
		case proxier.SCTP:
			for _, a := range nodeAddrs {
				fr.Elements = append(fr.Elements, Element{V6: v6, Set: SetNodePortSCTP, Addr: a, Port: nodePort})
				if svc.ExternalPolicyLocal {
					fr.Elements = append(fr.Elements, Element{V6: v6, Set: SetNodePortLocalSCTP, Addr: a, Port: nodePort})
				}
			}
		default:
			set, localSet := SetNodePortTCP, SetNodePortLocalTCP
			if svc.Protocol == proxier.UDP {
				set, localSet = SetNodePortUDP, SetNodePortLocalUDP
			}
			fr.Elements = append(fr.Elements, Element{V6: v6, Set: set, Port: nodePort})
			if svc.ExternalPolicyLocal {
				fr.Elements = append(fr.Elements, Element{V6: v6, Set: localSet, Port: nodePort})
			}
		}
	}
	if svc.HealthCheckNodePort != 0 {
		fr.Elements = append(fr.Elements, Element{V6: v6, Set: SetHealthCheckNodePort, Port: svc.HealthCheckNodePort})
	}

	// Hairpin: a local endpoint that may reach itself through the service.
	localEps := map[netip.AddrPort]bool{}
	for _, ep := range eps {
		if ep.IsLocal(b.node.Name) {
			localEps[netip.AddrPortFrom(ep.Addr.Unmap(), ep.Port)] = true
		}
	}
	for _, v := range fr.Virtual {
		for _, d := range v.Dests {
			if localEps[d.Addr] {
				fr.Elements = append(fr.Elements, Element{V6: v6, Set: SetLoopBack, Addr: d.Addr.Addr(), Protocol: svc.Protocol, Port: d.Addr.Port(), Addr2: d.Addr.Addr()})
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
func realServers(onlyLocal bool, cluster, local []proxier.Endpoint) []Dest {
	chosen := cluster
	if onlyLocal && len(local) > 0 {
		chosen = local
	}
	if chosen == nil {
		// This virtual server uses no endpoints at all (internal policy
		// Local, no external access, no local endpoint).
		return nil
	}
	out := make([]Dest, 0, len(chosen))
	in := map[netip.AddrPort]bool{}
	for _, ep := range chosen {
		ap := netip.AddrPortFrom(ep.Addr.Unmap(), ep.Port)
		if !in[ap] {
			in[ap] = true
			out = append(out, Dest{Addr: ap, Weight: 1, Fwd: FwdMasq})
		}
	}
	slices.SortFunc(out, func(a, b Dest) int { return a.Addr.Compare(b.Addr) })
	return out
}

// VirtualServers lists every virtual server of the plan by key. Two
// service ports asking for one virtual server (the same external IP and
// port) get the first's, by name, as the Syncer does.
func (p *Plan) VirtualServers() []VirtualServer {
	byKey := map[ServiceKey]VirtualServer{}
	owner := map[ServiceKey]string{}
	for name, fr := range p.Services {
		for _, v := range fr.Virtual {
			if o, ok := owner[v.ServiceKey]; !ok || name.String() < o {
				byKey[v.ServiceKey], owner[v.ServiceKey] = v, name.String()
			}
		}
	}
	out := make([]VirtualServer, 0, len(byKey))
	for _, v := range byKey {
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, b VirtualServer) int { return a.ServiceKey.Compare(b.ServiceKey) })
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
		out = append(out, fr.Elements...)
	}
	slices.SortFunc(out, compareElements)
	return slices.Compact(out)
}
