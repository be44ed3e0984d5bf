package nft

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
	"github.com/kube-nftproxy/kube-nftproxy/nftlocal"
	"github.com/kube-nftproxy/kube-nftproxy/proxier"
)

// DefaultTableName is the name of our main tables (one per family); the
// delta tables add deltaSuffix.
const DefaultTableName = "kube-nftproxy"

// deltaSuffix names the tables that hold the service ports changed since the
// last fold. The kernel validates every chain reachable from a table's base
// chains whenever a transaction adds a jump, goto, dnat or map verdict to
// that table, at a cost that grows with the table (docs/benchmarks.md).
// Changes therefore go to a small delta table whose base chains run just
// before the main table's; the main table only loses elements and rules
// (which needs no validation) until a fold moves the delta back into it.
//
// That relies on the kernel keeping the validation state per table. Kernels
// before that (Debian 12's 6.1 among them) keep one state per network
// namespace: any transaction with a rule holding an expression the kernel
// validates (any verdict, even accept; a lookup, dnat, meta, ...) or a
// map element with a jump/goto marks the whole namespace, and the commit
// validates every table in it, the main one included, wherever the change
// went. There a one-endpoint change costs a walk of the whole ruleset
// (BenchmarkKernelTxShapes; docs/benchmarks.md); only element deletes and
// rules without such expressions escape it.
const deltaSuffix = "-delta"

// affinitySuffix names the tables of the service ports with session
// affinity (their set: setAffinity). They live there for good:
// their clients' affinities are elements of that table's set, which a
// move would lose, and changes to them validate this table only, not the
// main or delta ones.
const affinitySuffix = "-affinity"

// The affinity table's sticky set (nftlib's Table.Sticky): a client's
// address and the id of the endpoint chain it has affinity to.
const (
	setAffinity        = "affinity"
	setAffinityComment = "sessionAffinity ClientIP: client . endpoint id"
)

// TableKind tells the three tables of a family apart.
type TableKind uint8

// The tables of a family, in the order of their base chains' priorities:
// affinity, delta, then main.
const (
	MainTable TableKind = iota
	DeltaTable
	AffinityTable
)

// Names of the fixed chains and maps (iptables mode's, where it has one).
const (
	chainServices    = "KUBE-SERVICES"
	chainNodePorts   = "KUBE-NODEPORTS"
	chainMarkMasq    = "KUBE-MARK-MASQ"
	chainPostrouting = "KUBE-POSTROUTING"

	chainExternalServices = "KUBE-EXTERNAL-SERVICES"
	chainForward          = "KUBE-FORWARD"
	chainFirewall         = "KUBE-PROXY-FIREWALL"
	chainReject           = "KUBE-REJECT"

	mapServiceIPs      = "service-ips"
	mapServicePorts    = "service-nodeports"
	mapNoEndpointIPs   = "no-endpoint-services"
	mapNoEndpointPorts = "no-endpoint-nodeports"
	mapFirewallIPs     = "firewall-ips"
	priorityFirewall   = -110 // before DNAT (dstnat - 10), to see the LB IP
	priorityFilter     = 0
)

// Config is what shapes the ruleset besides the State: kube-proxy's flags.
type Config struct {
	TableName string
	// Settings are the flags the IPVS mode shares.
	proxier.Settings
	// ConntrackTCPBeLiberal leaves out-of-window TCP packets alone
	// (--conntrack-tcp-be-liberal): no `ct state invalid drop`.
	ConntrackTCPBeLiberal bool
	// LocalhostNodePorts serves IPv4 NodePorts on 127.0.0.0/8 too, as
	// iptables mode does (--iptables-localhost-nodeports), when the
	// NodePort addresses include loopback; see localhost.go.
	LocalhostNodePorts bool
	// ClusterIPChecks, as upstream's nftables mode does (its cluster-ips
	// set and cluster-ips-check chain): a new connection to a ClusterIP
	// that no rule took (a port no Service port defines) is rejected, one
	// to an address of the State's ServiceCIDRs that no Service holds is
	// dropped. See clusterips.go.
	ClusterIPChecks bool
}

// DefaultConfig is kube-proxy's defaults.
func DefaultConfig() Config {
	return Config{TableName: DefaultTableName, Settings: proxier.DefaultSettings()}
}

// Validate reports flag values that cannot work.
func (c Config) Validate() error {
	if err := c.Settings.Validate(); err != nil {
		return err
	}
	if c.TableName == "" {
		return fmt.Errorf("empty table name")
	}
	return nil
}

// localMatch is nftlocal.Match of cfg's shared settings.
func localMatch(f nftlib.Family, cfg Config, node model.Node, negate bool) (nftlib.Term, bool) {
	return nftlocal.Match(f, cfg.Settings, node, negate)
}

// Build returns the whole Ruleset for a State as a full sync programs it:
// per family, a main table holding every service port but those with
// session affinity, which the affinity table holds, and an empty delta table.
func Build(st *model.State, cfg Config) *nftlib.Ruleset {
	rs := &nftlib.Ruleset{}
	for _, f := range nftlib.Families {
		tables := map[TableKind]*nftlib.Table{}
		for _, k := range []TableKind{MainTable, DeltaTable, AffinityTable} {
			tables[k] = BuildTable(f, cfg, st.Node, k)
		}
		for name, svc := range st.Services.All() {
			if fr := BuildFragment(f, cfg, st.Node, svc, st.Endpoints.Get(name)); fr != nil {
				tables[homeTable(svc)].Fragments[fragmentKey(name)] = fr
			}
		}
		if cfg.ClusterIPChecks {
			tables[MainTable] = withServiceCIDRs(tables[MainTable], st.ServiceCIDRs)
			placeClusterIPs(tables[MainTable], newClusterIPIndex(st))
		}
		rs.Tables = append(rs.Tables, tables[MainTable], tables[DeltaTable], tables[AffinityTable])
	}
	return rs
}

// BuildTable returns a main or delta table with its fixed chains and maps and
// no services.
func BuildTable(f nftlib.Family, cfg Config, node model.Node, kind TableKind) *nftlib.Table {
	mark := cfg.MasqueradeMark()
	notLoopback := loopbackExclusion(f, cfg)
	t := &nftlib.Table{
		Family:  f,
		Name:    cfg.TableName,
		Comment: "rules for kube-nftproxy",
		Maps: []*nftlib.Map{
			{Name: mapServiceIPs, Key: []nftlib.Field{nftlib.FieldDaddr, nftlib.FieldL4Proto, nftlib.FieldDport}, Comment: "ClusterIP, ExternalIP and LoadBalancer IP traffic"},
			{Name: mapServicePorts, Key: []nftlib.Field{nftlib.FieldL4Proto, nftlib.FieldDport}, Comment: "NodePort traffic"},
			{Name: mapNoEndpointIPs, Key: []nftlib.Field{nftlib.FieldDaddr, nftlib.FieldL4Proto, nftlib.FieldDport}, Comment: "reject or drop traffic to service IPs without usable endpoints"},
			{Name: mapNoEndpointPorts, Key: []nftlib.Field{nftlib.FieldL4Proto, nftlib.FieldDport}, Comment: "reject or drop traffic to NodePorts without usable endpoints"},
			{Name: mapFirewallIPs, Key: []nftlib.Field{nftlib.FieldDaddr, nftlib.FieldL4Proto, nftlib.FieldDport}, Comment: "LoadBalancer IPs with loadBalancerSourceRanges"},
		},
		Chains:    fixedChains(cfg, mark, notLoopback),
		Fragments: map[string]*nftlib.Fragment{},
	}
	// NodePorts answer on the node's own addresses, not on loopback (no
	// route_localnet, as upstream's nftables mode) unless localhost
	// NodePorts are on, optionally only those within --nodeport-addresses.
	services := t.FixedChain(chainServices)
	for _, m := range nodePortMatches(f, cfg, node, notLoopback) {
		services.Rules = append(services.Rules, nftlib.R(append(m, nftlib.JumpTo(chainNodePorts))...))
	}
	if kind == MainTable && localhostNodePorts(f, cfg) {
		addLocalnetFirewall(t)
	}
	if kind == MainTable && cfg.ClusterIPChecks {
		addClusterIPChecks(t)
	}
	if kind != MainTable {
		earlierTable(t, cfg, kind)
	}
	return t
}

// fixedChains are a main table's chains besides the service ports'.
func fixedChains(cfg Config, mark uint32, notLoopback []nftlib.Term) []*nftlib.Chain {
	return []*nftlib.Chain{
		{Name: "nat-prerouting", Hook: &nftlib.Hook{Type: "nat", Hook: "prerouting", Priority: -100},
			Rules: []nftlib.Rule{nftlib.R(nftlib.JumpTo(chainServices))}},
		{Name: "nat-output", Hook: &nftlib.Hook{Type: "nat", Hook: "output", Priority: -100},
			Rules: []nftlib.Rule{nftlib.R(nftlib.JumpTo(chainServices))}},
		{Name: "nat-postrouting", Hook: &nftlib.Hook{Type: "nat", Hook: "postrouting", Priority: 100},
			Rules: []nftlib.Rule{nftlib.R(nftlib.JumpTo(chainPostrouting))}},
		{Name: chainServices, Rules: []nftlib.Rule{
			nftlib.R(nftlib.Vmap(mapServiceIPs, nftlib.FieldDaddr, nftlib.FieldL4Proto, nftlib.FieldDport)),
		}},
		{Name: chainNodePorts, Rules: []nftlib.Rule{nftlib.R(nftlib.Vmap(mapServicePorts, nftlib.FieldL4Proto, nftlib.FieldDport))}},
		{Name: chainMarkMasq, Rules: []nftlib.Rule{nftlib.R(nftlib.MarkSet{Bit: mark})}},
		{Name: chainPostrouting, Rules: []nftlib.Rule{
			nftlib.R(nftlib.MarkZero{Bit: mark}, nftlib.Verdict{Kind: nftlib.Return}),
			nftlib.R(nftlib.MarkSet{Bit: mark, Toggle: true}),
			nftlib.R(nftlib.Masquerade{}),
		}},
		// Filtering: loadBalancerSourceRanges before DNAT; services
		// without usable endpoints after it (their packets are not
		// DNATed, so they still carry the service address).
		{Name: "filter-prerouting", Hook: &nftlib.Hook{Type: "filter", Hook: "prerouting", Priority: priorityFirewall},
			Rules: []nftlib.Rule{nftlib.R(nftlib.CtState{Bits: nftlib.CtNew}, nftlib.JumpTo(chainFirewall))}},
		{Name: "filter-output-pre-dnat", Hook: &nftlib.Hook{Type: "filter", Hook: "output", Priority: priorityFirewall},
			Rules: []nftlib.Rule{nftlib.R(nftlib.CtState{Bits: nftlib.CtNew}, nftlib.JumpTo(chainFirewall))}},
		{Name: "filter-input", Hook: &nftlib.Hook{Type: "filter", Hook: "input", Priority: priorityFilter},
			Rules: []nftlib.Rule{nftlib.R(nftlib.CtState{Bits: nftlib.CtNew}, nftlib.JumpTo(chainExternalServices))}},
		{Name: "filter-forward", Hook: &nftlib.Hook{Type: "filter", Hook: "forward", Priority: priorityFilter},
			Rules: []nftlib.Rule{nftlib.R(nftlib.JumpTo(chainForward)), nftlib.R(nftlib.CtState{Bits: nftlib.CtNew}, nftlib.JumpTo(chainExternalServices))}},
		{Name: "filter-output", Hook: &nftlib.Hook{Type: "filter", Hook: "output", Priority: priorityFilter},
			Rules: []nftlib.Rule{nftlib.R(nftlib.CtState{Bits: nftlib.CtNew}, nftlib.JumpTo(chainExternalServices))}},
		{Name: chainFirewall, Rules: []nftlib.Rule{nftlib.R(nftlib.Vmap(mapFirewallIPs, nftlib.FieldDaddr, nftlib.FieldL4Proto, nftlib.FieldDport))}},
		{Name: chainExternalServices, Rules: []nftlib.Rule{
			nftlib.R(nftlib.Vmap(mapNoEndpointIPs, nftlib.FieldDaddr, nftlib.FieldL4Proto, nftlib.FieldDport)),
			nftlib.R(slices.Concat([]nftlib.Term{nftlib.FibLocal{}}, notLoopback, []nftlib.Term{nftlib.Vmap(mapNoEndpointPorts, nftlib.FieldL4Proto, nftlib.FieldDport)})...),
		}},
		{Name: chainForward, Rules: forwardRules(cfg, mark)},
		{Name: chainReject, Rules: []nftlib.Rule{nftlib.R(nftlib.Reject{})}},
	}
}

// earlierTable turns a main table into a delta or affinity one: the same
// topology, one priority earlier (two for the affinity table), without
// postrouting: the main table's KUBE-POSTROUTING masquerades what any of
// them marks.
func earlierTable(t *nftlib.Table, cfg Config, kind TableKind) {
	t.Secondary = true
	earlier := int32(1)
	if kind == DeltaTable {
		t.Name += deltaSuffix
		t.Comment = "kube-nftproxy: service ports changed since the last fold into " + cfg.TableName + "; evaluated first"
	} else {
		t.Name += affinitySuffix
		t.Sticky, t.StickyComment = setAffinity, setAffinityComment
		t.Comment = "kube-nftproxy: service ports with session affinity"
		earlier = 2
	}
	var chains []*nftlib.Chain
	for _, c := range t.Chains {
		switch c.Name {
		case "nat-postrouting", chainPostrouting, chainForward:
			continue
		case "filter-forward":
			c = &nftlib.Chain{Name: c.Name, Hook: c.Hook, Rules: c.Rules[1:]}
		}
		if c.Hook != nil {
			h := *c.Hook
			h.Priority -= earlier
			c.Hook = &h
		}
		chains = append(chains, c)
	}
	t.Chains = chains
}

// nodePortMatches are the matches that send a packet to KUBE-NODEPORTS:
// a local destination, not loopback (notLoopback, empty with localhost
// NodePorts), and within --nodeport-addresses.
func nodePortMatches(f nftlib.Family, cfg Config, node model.Node, notLoopback []nftlib.Term) [][]nftlib.Term {
	base := append([]nftlib.Term{nftlib.FibLocal{}}, notLoopback...)
	given := familyPrefixes(f, cfg.NodePortAddresses)
	if slices.ContainsFunc(given, func(p netip.Prefix) bool { return p.Bits() == 0 }) {
		// 0.0.0.0/0 or ::/0 (the keyword all): every node address, as
		// upstream's MatchAll; a zero-length daddr match is refused by
		// the kernel.
		return [][]nftlib.Term{base}
	}
	var within []netip.Prefix
	if cfg.NodePortPrimary {
		for _, ip := range node.IPs {
			if f.Has(ip) {
				within = append(within, netip.PrefixFrom(ip, ip.BitLen()))
				break
			}
		}
	}
	// Loopback CIDRs where NodePorts stay off loopback would make a rule
	// that never matches (the keyword localhost in nftables mode, whose
	// localhost NodePorts are answered in userspace, if at all).
	offLoopback := false
	for _, p := range given {
		if len(notLoopback) > 0 && loopbackPrefix(f).Bits() <= p.Bits() && loopbackPrefix(f).Contains(p.Addr()) {
			offLoopback = true
			continue
		}
		within = append(within, p)
	}
	switch {
	case len(within) == 0 && offLoopback:
		return nil
	case len(within) == 0:
		// Nothing given for this family: all its node addresses, as
		// upstream's NodePortAddresses does per family.
		return [][]nftlib.Term{base}
	}
	var out [][]nftlib.Term
	for _, p := range within {
		out = append(out, append([]nftlib.Term{nftlib.FibLocal{}, nftlib.AddrMatch{Field: nftlib.FieldDaddr, Prefix: p}}, base[1:]...))
	}
	return out
}

// forwardRules are KUBE-FORWARD's: drop packets conntrack finds invalid
// (unless --conntrack-tcp-be-liberal), accept what we marked for masquerade
// and the rest of connections already accepted, as iptables mode does.
func forwardRules(cfg Config, mark uint32) []nftlib.Rule {
	var rules []nftlib.Rule
	if !cfg.ConntrackTCPBeLiberal {
		rules = append(rules, nftlib.R(nftlib.CtState{Bits: nftlib.CtInvalid}, nftlib.Verdict{Kind: nftlib.Drop}))
	}
	return append(rules,
		nftlib.R(nftlib.MarkIsSet{Bit: mark}, nftlib.Verdict{Kind: nftlib.Accept}).WithComment("kubernetes forwarding rules"),
		nftlib.R(nftlib.CtState{Bits: nftlib.CtEstablished | nftlib.CtRelated}, nftlib.Verdict{Kind: nftlib.Accept}).WithComment("kubernetes forwarding conntrack rule"),
	)
}

// BuildFragment returns one service port's chains and map elements in family
// f, or nil when the service has no ClusterIP of that family. The chains
// and their rules follow iptables mode (pkg/proxy/iptables in upstream
// kube-proxy): KUBE-SVC (cluster policy), KUBE-SVL (local policy), KUBE-EXT
// (external destinations), KUBE-FW (source ranges), KUBE-SEP (endpoints).
func BuildFragment(f nftlib.Family, cfg Config, node model.Node, svc *model.ServicePort, eps []model.Endpoint) *nftlib.Fragment {
	clusterIP, ok := firstOfFamily(f, svc.ClusterIPs)
	if !ok {
		return nil
	}
	var fb fragmentBuilder // on the stack: one per fragment of a full sync
	fb.init(f, cfg, node, svc, eps)
	fb.clusterIPElement(clusterIP)
	fb.externalElements()
	fb.firewallChain()
	fb.endpointChains()
	fb.policyChains(clusterIP)
	fb.externalChain()
	return fb.fr
}

// fragmentBuilder builds one service port's fragment in one family: what
// its parts share.
type fragmentBuilder struct {
	f     nftlib.Family
	cfg   Config
	node  model.Node
	svc   *model.ServicePort
	name  string
	proto uint8
	fr    *nftlib.Fragment

	svcChain, svlChain, extChain, fwChain string
	// The endpoints each policy uses, and every endpoint some policy can
	// reach; hasAny: the service has usable endpoints at all.
	cluster, local, allReachable []model.Endpoint
	hasAny                       bool
	// Which chain each kind of traffic goes to, and whether it has
	// endpoints there (upstream's internal/external policy chains).
	internalChain, externalPolicyChain string
	hasInternal, hasExternal           bool
	// What the filter does with traffic that finds no endpoint.
	internalFilter, externalFilter nftlib.Verdict
	internalNote, externalNote     string

	externalIPs, lbIPs []netip.Addr
	fwRanges           []netip.Prefix
	nodePort           uint16
	usesExternalChain  bool
	epNames            map[netip.AddrPort]endpointNames
}

func (fb *fragmentBuilder) init(f nftlib.Family, cfg Config, node model.Node, svc *model.ServicePort, eps []model.Endpoint) {
	*fb = fragmentBuilder{f: f, cfg: cfg, node: node, svc: svc, name: svc.Name.String(), proto: svc.Protocol.Number(), fr: &nftlib.Fragment{},
		svcChain: ServiceChain(svc.Name, svc.Protocol), svlChain: LocalServiceChain(svc.Name, svc.Protocol),
		extChain: ExternalChain(svc.Name, svc.Protocol), fwChain: FirewallChain(svc.Name, svc.Protocol)}
	fb.cluster, fb.local, fb.allReachable, fb.hasAny = model.CategorizeEndpoints(svc, familyEndpoints(f, eps), node)
	// KUBE-SVC exists when it has endpoints, KUBE-SVL likewise.
	fb.internalChain, fb.hasInternal = fb.svcChain, len(fb.cluster) > 0
	if svc.InternalPolicyLocal {
		fb.internalChain, fb.hasInternal = fb.svlChain, len(fb.local) > 0
	}
	fb.externalPolicyChain, fb.hasExternal = fb.svcChain, len(fb.cluster) > 0
	if svc.ExternalPolicyLocal {
		fb.externalPolicyChain, fb.hasExternal = fb.svlChain, len(fb.local) > 0
	}
	fb.externalIPs = familyAddrs(f, svc.ExternalIPs)
	fb.lbIPs = familyAddrs(f, svc.LoadBalancerIPs)
	fb.fwRanges = familyPrefixes(f, svc.LoadBalancerSourceRanges)
	fb.nodePort = svc.NodePortIn(f == nftlib.IPv6)
	externallyAccessible := fb.nodePort != 0 || len(fb.externalIPs) > 0 || len(fb.lbIPs) > 0
	fb.usesExternalChain = fb.hasAny && externallyAccessible
	fb.noEndpointFilters()
}

// familyEndpoints are the endpoints of family f. A repeated ip:port (one
// endpoint in two slices) would add its KUBE-SEP chain twice, which the
// kernel refuses; kube-proxy keeps the first.
func familyEndpoints(f nftlib.Family, eps []model.Endpoint) []model.Endpoint {
	var out []model.Endpoint
	for i, ep := range eps {
		if f.Has(ep.Addr) && !slices.ContainsFunc(eps[:i], func(o model.Endpoint) bool { return o.Addr == ep.Addr && o.Port == ep.Port }) {
			if out == nil {
				out = make([]model.Endpoint, 0, len(eps)-i) // grown by append, the largest garbage of a full sync
			}
			out = append(out, ep)
		}
	}
	return out
}

func familyAddrs(f nftlib.Family, addrs []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, ip := range addrs {
		if f.Has(ip) {
			out = append(out, ip)
		}
	}
	return out
}

// noEndpointFilters says what the filter does with traffic that finds no
// endpoint: reject when the service has none at all; drop when only the
// Local policy leaves none (external traffic from outside, or ClusterIP
// traffic).
func (fb *fragmentBuilder) noEndpointFilters() {
	if !fb.hasAny {
		fb.internalFilter, fb.externalFilter = nftlib.GotoChain(chainReject), nftlib.GotoChain(chainReject)
		fb.internalNote, fb.externalNote = fb.name+" has no endpoints", fb.name+" has no endpoints"
		return
	}
	if !fb.hasInternal {
		fb.internalFilter, fb.internalNote = nftlib.Verdict{Kind: nftlib.Drop}, fb.name+" has no local endpoints"
	}
	if !fb.hasExternal {
		fb.externalFilter, fb.externalNote = nftlib.Verdict{Kind: nftlib.Drop}, fb.name+" has no local endpoints"
	}
}

func (fb *fragmentBuilder) elem(m string, k nftlib.Key, v nftlib.Verdict, comment string) {
	fb.fr.Elements = append(fb.fr.Elements, nftlib.MapElement{Map: m, Element: nftlib.Element{Key: k, Verdict: v, Comment: comment}})
}

func (fb *fragmentBuilder) clusterIPElement(clusterIP netip.Addr) {
	key := nftlib.Key{Addr: clusterIP, Proto: fb.proto, Port: fb.svc.Port}
	if fb.hasInternal {
		fb.elem(mapServiceIPs, key, nftlib.GotoChain(fb.internalChain), fb.name+" cluster IP")
	} else {
		fb.elem(mapNoEndpointIPs, key, fb.internalFilter, fb.internalNote)
	}
}

// externalElements maps the external IPs, the LoadBalancer IPs (through
// KUBE-FW with source ranges) and the NodePort.
func (fb *fragmentBuilder) externalElements() {
	ext := nftlib.GotoChain(fb.extChain)
	for _, ip := range fb.externalIPs {
		fb.externalElement(nftlib.Key{Addr: ip, Proto: fb.proto, Port: fb.svc.Port}, ext, fb.name+" external IP", mapServiceIPs, mapNoEndpointIPs)
	}
	for _, ip := range fb.lbIPs {
		key := nftlib.Key{Addr: ip, Proto: fb.proto, Port: fb.svc.Port}
		fb.externalElement(key, ext, fb.name+" loadbalancer IP", mapServiceIPs, mapNoEndpointIPs)
		if len(fb.fwRanges) > 0 {
			fb.elem(mapFirewallIPs, key, nftlib.GotoChain(fb.fwChain), fb.name+" loadbalancer IP")
		}
	}
	if fb.nodePort != 0 {
		fb.externalElement(nftlib.Key{Proto: fb.proto, Port: fb.nodePort}, ext, fb.name, mapServicePorts, mapNoEndpointPorts)
	}
}

// externalElement maps one external destination to KUBE-EXT, and to the
// filter's verdict when the external policy leaves it no endpoint.
func (fb *fragmentBuilder) externalElement(key nftlib.Key, ext nftlib.Verdict, comment, toService, toFilter string) {
	if fb.usesExternalChain {
		fb.elem(toService, key, ext, comment)
	}
	if !fb.hasExternal {
		fb.elem(toFilter, key, fb.externalFilter, fb.externalNote)
	}
}

// firewallChain is KUBE-FW: sources in a range go on; the node's own
// traffic passes when a range holds its address, since that is its source.
func (fb *fragmentBuilder) firewallChain() {
	if len(fb.fwRanges) == 0 || len(fb.lbIPs) == 0 {
		return
	}
	var rules []nftlib.Rule
	allowNode := false
	for _, p := range fb.fwRanges {
		rules = append(rules, nftlib.R(nftlib.AddrMatch{Field: nftlib.FieldSaddr, Prefix: p}, nftlib.Verdict{Kind: nftlib.Return}))
		for _, ip := range fb.node.IPs {
			allowNode = allowNode || p.Contains(ip)
		}
	}
	// When a range holds the node's address, the node may use the
	// service; where the LB IP is also a local address, the node's
	// requests to it come from the LB IP itself (as upstream allows).
	if allowNode {
		for _, ip := range fb.lbIPs {
			rules = append(rules, nftlib.R(nftlib.AddrMatch{Field: nftlib.FieldSaddr, Prefix: netip.PrefixFrom(ip, ip.BitLen())}, nftlib.Verdict{Kind: nftlib.Return}).WithComment(fb.name+" node traffic from its own LB IP"))
		}
	}
	rules = append(rules, nftlib.R(nftlib.Verdict{Kind: nftlib.Drop}).WithComment(fb.name+" traffic not accepted by "+fb.fwChain))
	fb.fr.Chains = append(fb.fr.Chains, &nftlib.Chain{Name: fb.fwChain, Comment: fb.name, Rules: rules})
}

// endpointChains are the KUBE-SEP chains, for every endpoint some policy
// can reach. Their chains, rules and terms are carved from one array each
// per fragment: a full sync builds millions of them (this halved the
// build's allocations), and they live and go with their fragment.
func (fb *fragmentBuilder) endpointChains() {
	svc, eps := fb.svc, fb.allReachable
	fb.epNames = make(map[netip.AddrPort]endpointNames, len(eps))
	perRules, perTerms := 2, 4 // hairpin masquerade, DNAT: two terms each
	if svc.AffinityTimeout > 0 {
		perRules, perTerms = 3, 5
	}
	chains := make([]nftlib.Chain, len(eps))
	rules := make([]nftlib.Rule, perRules*len(eps))
	terms := make([]nftlib.Term, perTerms*len(eps))
	for i, ep := range eps {
		n := newEndpointNames(svc, ep, fb.name)
		fb.epNames[netip.AddrPortFrom(ep.Addr, ep.Port)] = n
		t := terms[i*perTerms : (i+1)*perTerms : (i+1)*perTerms]
		r := rules[i*perRules : (i+1)*perRules : (i+1)*perRules]
		t[0], t[1] = nftlib.AddrMatch{Field: nftlib.FieldSaddr, Prefix: netip.PrefixFrom(ep.Addr, ep.Addr.BitLen())}, jumpMarkMasq
		r[0] = nftlib.Rule{Terms: t[0:2:2]}
		if svc.AffinityTimeout > 0 {
			// Each new connection through here (re)starts the client's
			// affinity, as iptables mode's `recent --set`.
			t[2] = nftlib.StickyUpdate{Set: setAffinity, ID: nftlib.StickyID(n.chain), Timeout: svc.AffinityTimeout}
			r[1] = nftlib.Rule{Terms: t[2:3:3]}
		}
		t[perTerms-2], t[perTerms-1] = nftlib.ProtoMatch{Proto: fb.proto}, nftlib.DNAT{Addr: ep.Addr, Port: ep.Port}
		r[perRules-1] = nftlib.Rule{Terms: t[perTerms-2 : perTerms : perTerms]}
		chains[i] = nftlib.Chain{Name: n.chain, Comment: fb.name, Rules: r}
		fb.fr.Chains = append(fb.fr.Chains, &chains[i])
	}
}

// policyChains are KUBE-SVC and KUBE-SVL. The masquerade rule for
// ClusterIP traffic lives in the internal chain and matches the ClusterIP,
// so that external traffic passing through the same chain keeps its
// source.
func (fb *fragmentBuilder) policyChains(clusterIP netip.Addr) {
	masq := clusterMasquerade(fb.f, fb.cfg, fb.node, clusterIP, fb.svc.Port, fb.name)
	fb.policyChain(fb.svcChain, fb.cluster, masq)
	fb.policyChain(fb.svlChain, fb.local, masq)
}

// policyChain is one policy's chain, when it has endpoints.
func (fb *fragmentBuilder) policyChain(chain string, eps []model.Endpoint, masq *nftlib.Rule) {
	if len(eps) == 0 {
		return
	}
	rules := make([]nftlib.Rule, 0, 1+pickRules(fb.svc, eps))
	if fb.internalChain == chain && masq != nil {
		rules = append(rules, *masq)
	}
	fb.fr.Chains = append(fb.fr.Chains, &nftlib.Chain{Name: chain, Comment: fb.name, Rules: pickEndpoint(rules, fb.svc, eps, fb.epNames, fb.name)})
}

// externalChain is KUBE-EXT, for traffic to external destinations.
func (fb *fragmentBuilder) externalChain() {
	if !fb.usesExternalChain {
		return
	}
	name, hasCluster := fb.name, len(fb.cluster) > 0
	var rules []nftlib.Rule
	if !fb.svc.ExternalPolicyLocal {
		rules = append(rules, nftlib.R(nftlib.JumpTo(chainMarkMasq)).WithComment("masquerade traffic for "+name+" external destinations"))
	} else {
		// Pods and the node itself reach external destinations
		// cluster-wide, as if going out to a load balancer and back; the
		// node's traffic is masqueraded (its source is the LB IP or node
		// address itself). Others keep their source and go to local
		// endpoints only.
		if isPod, ok := localMatch(fb.f, fb.cfg, fb.node, false); ok && hasCluster {
			rules = append(rules, nftlib.R(isPod, nftlib.GotoChain(fb.svcChain)).WithComment("pod traffic for "+name+" external destinations"))
		}
		rules = append(rules, nftlib.R(nftlib.FibLocal{Saddr: true}, nftlib.JumpTo(chainMarkMasq)).WithComment("masquerade LOCAL traffic for "+name+" external destinations"))
		if hasCluster {
			rules = append(rules, nftlib.R(nftlib.FibLocal{Saddr: true}, nftlib.GotoChain(fb.svcChain)).WithComment("route LOCAL traffic for "+name+" external destinations"))
		}
	}
	if fb.hasExternal {
		rules = append(rules, nftlib.R(nftlib.GotoChain(fb.externalPolicyChain)))
	}
	fb.fr.Chains = append(fb.fr.Chains, &nftlib.Chain{Name: fb.extChain, Comment: name, Rules: rules})
}

// jumpMarkMasq is the hairpin rule's verdict, boxed once for the endpoint
// chains of every Ruleset rather than once per endpoint.
var jumpMarkMasq nftlib.Term = nftlib.JumpTo(chainMarkMasq)

// pickEndpoint chooses among endpoints at random without a set per service:
// endpoint i is taken with probability 1/(n-i), so each of the n is equally
// likely. Sets per service make the kernel's commit time quadratic.
// It appends the rules to rules; epNames holds the names of the endpoints'
// chains (see endpointNames).
func pickEndpoint(rules []nftlib.Rule, svc *model.ServicePort, eps []model.Endpoint, epNames map[netip.AddrPort]endpointNames, name string) []nftlib.Rule {
	namesOf := func(ep model.Endpoint) endpointNames {
		if n, ok := epNames[netip.AddrPortFrom(ep.Addr, ep.Port)]; ok {
			return n
		}
		return newEndpointNames(svc, ep, name)
	}
	terms := make([]nftlib.Term, 0, 2*pickRules(svc, eps)) // carved up as in endpointChains
	rule := func(match nftlib.Term, n endpointNames) nftlib.Rule {
		at := len(terms)
		if match != nil {
			terms = append(terms, match)
		}
		terms = append(terms, n.pickVerdict)
		return nftlib.Rule{Terms: terms[at:len(terms):len(terms)], Comment: n.pick}
	}
	if svc.AffinityTimeout > 0 {
		// A client with affinity to one of these endpoints goes back to it.
		for _, ep := range eps {
			n := namesOf(ep)
			rules = append(rules, rule(nftlib.StickyMatch{Set: setAffinity, ID: nftlib.StickyID(n.chain)}, n))
		}
	}
	for i, ep := range eps {
		var match nftlib.Term
		if left := len(eps) - i; left > 1 {
			match = nftlib.NumgenZero{Mod: uint32(left)}
		}
		rules = append(rules, rule(match, namesOf(ep)))
	}
	return rules
}

// pickRules is how many rules pickEndpoint makes.
func pickRules(svc *model.ServicePort, eps []model.Endpoint) int {
	if svc.AffinityTimeout > 0 {
		return 2 * len(eps)
	}
	return len(eps)
}

// endpointNames are an endpoint's KUBE-SEP chain name, the comment of the
// rules that pick it and their verdict (a goto to the chain), made once
// per endpoint and service port: the endpoint chain, the SVC and SVL
// chains' rules and the affinity rules share them (and the hashing), which
// a Ruleset holds for every endpoint of the cluster. The two strings share
// one allocation.
type endpointNames struct {
	chain, pick string
	pickVerdict nftlib.Term
}

func newEndpointNames(svc *model.ServicePort, ep model.Endpoint, name string) endpointNames {
	var addr, buf [128]byte
	s := netip.AddrPortFrom(ep.Addr, ep.Port).AppendTo(addr[:0])
	b := appendChainName(buf[:0], prefixSEP, svc.Name, svc.Protocol, s)
	chainLen := len(b)
	b = append(append(append(b, name...), " -> "...), s...)
	both := string(b)
	chain := both[:chainLen]
	return endpointNames{chain: chain, pick: both[chainLen:], pickVerdict: nftlib.GotoChain(chain)}
}

// clusterMasquerade is the rule that marks ClusterIP traffic for SNAT:
// all of it with --masquerade-all, else what does not come from a pod;
// nil when neither is configured.
func clusterMasquerade(f nftlib.Family, cfg Config, node model.Node, clusterIP netip.Addr, port uint16, name string) *nftlib.Rule {
	match := []nftlib.Term{nftlib.AddrMatch{Field: nftlib.FieldDaddr, Prefix: netip.PrefixFrom(clusterIP, clusterIP.BitLen())}, nftlib.PortMatch{Port: port}}
	if cfg.MasqueradeAll {
		r := nftlib.R(append(match, nftlib.JumpTo(chainMarkMasq))...).WithComment(name + " cluster IP")
		return &r
	}
	if notPod, ok := localMatch(f, cfg, node, true); ok {
		r := nftlib.R(append(match, notPod, nftlib.JumpTo(chainMarkMasq))...).WithComment(name + " cluster IP")
		return &r
	}
	return nil
}

func familyPrefixes(f nftlib.Family, ps []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		if f.Has(p.Addr()) {
			out = append(out, p)
		}
	}
	return out
}

func firstOfFamily(f nftlib.Family, addrs []netip.Addr) (netip.Addr, bool) {
	for _, a := range addrs {
		if f.Has(a) {
			return a, true
		}
	}
	return netip.Addr{}, false
}
