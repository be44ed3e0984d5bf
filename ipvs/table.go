package ipvs

import (
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/nft"
	"github.com/kube-nftproxy/kube-nftproxy/proxier"
)

// HelperTableName is the helper table of each family (ip and ip6).
const HelperTableName = "kube-nftproxy-ipvs"

// Chain names: upstream IPVS mode's, plus our base chains.
const (
	chainServices      = "KUBE-SERVICES"
	chainPostrouting   = "KUBE-POSTROUTING"
	chainMarkMasq      = "KUBE-MARK-MASQ"
	chainNodePort      = "KUBE-NODE-PORT"
	chainLoadBalancer  = "KUBE-LOAD-BALANCER"
	chainFirewall      = "KUBE-PROXY-FIREWALL"
	chainSourceRanges  = "KUBE-SOURCE-RANGES-FIREWALL"
	chainIPVSFilter    = "KUBE-IPVS-FILTER"
	chainIPVSOutFilter = "KUBE-IPVS-OUT-FILTER"
	chainForward       = "KUBE-FORWARD"
)

// Base chain priorities around IPVS's hooks (LOCAL_IN 99, LOCAL_OUT -99):
// NAT marks at dstnat (-100), before IPVS takes the packet; the input
// filter at 0 still sees the virtual address; the output filter runs
// before IPVS's LOCAL_OUT so it sees the LB IP the node asked for.
const (
	priorityDstNAT    = -100
	prioritySrcNAT    = 100
	priorityFilter    = 0
	priorityOutFilter = -110
)

// keyFields are a helper set's key as the packet fields its lookups load:
// the address, protocol and port a client asks for, then the source.
func keyFields(def SetDef) ([]nft.Field, bool) {
	var out []nft.Field
	interval := false
	for _, p := range def.Key {
		switch p {
		case PartAddr:
			out = append(out, nft.FieldDaddr)
		case PartProto:
			out = append(out, nft.FieldL4Proto)
		case PartPort:
			out = append(out, nft.FieldDport)
		case PartAddr2:
			out = append(out, nft.FieldSaddr)
		case PartNet:
			out = append(out, nft.FieldSaddr)
			interval = true
		}
	}
	return out, interval
}

// BuildHelperTable returns family f's helper table with no elements. Its
// rules are constant: every per-service fact is a set element. cfg gives
// the masquerade bit, --masquerade-all and how to tell pod traffic
// (--cluster-cidr / --detect-local-mode), as for the nftables mode.
func BuildHelperTable(f nft.Family, cfg nft.Config, node proxier.Node) *nft.SetTable {
	t := &nft.SetTable{
		Family:   f,
		Name:     HelperTableName,
		Comment:  "kube-nftproxy IPVS mode: masquerade and filter rules around IPVS; sets named as upstream's ipsets",
		Elements: map[string][]nft.SetElement{},
	}
	for _, def := range Sets {
		key, interval := keyFields(def)
		t.Sets = append(t.Sets, &nft.Set{Name: def.Name, Key: key, Interval: interval, Comment: def.Comment})
	}
	mark := cfg.MasqueradeMark()
	t.Chains = append(baseChains(), natChains(f, cfg, node, mark)...)
	t.Chains = append(t.Chains, filterChains(mark)...)
	return t
}

// inService looks the packet's service address, protocol and port up in a set.
func inService(set string) nft.SetLookup {
	return nft.LookupSet(set, nft.FieldDaddr, nft.FieldL4Proto, nft.FieldDport)
}

// inServiceFrom also looks up the packet's source.
func inServiceFrom(set string) nft.SetLookup {
	return nft.LookupSet(set, nft.FieldDaddr, nft.FieldL4Proto, nft.FieldDport, nft.FieldSaddr)
}

// inHealthCheck looks the packet's port up among the health check node ports.
func inHealthCheck() nft.SetLookup { return nft.LookupSet(SetHealthCheckNodePort, nft.FieldDport) }

// baseChains hook the helper table into netfilter and jump to upstream's chains.
func baseChains() []*nft.Chain {
	R := nft.R
	return []*nft.Chain{
		{Name: "nat-prerouting", Hook: &nft.Hook{Type: "nat", Hook: "prerouting", Priority: priorityDstNAT},
			Rules: []nft.Rule{R(nft.JumpTo(chainServices))}},
		{Name: "nat-output", Hook: &nft.Hook{Type: "nat", Hook: "output", Priority: priorityDstNAT},
			Rules: []nft.Rule{R(nft.JumpTo(chainServices))}},
		{Name: "nat-postrouting", Hook: &nft.Hook{Type: "nat", Hook: "postrouting", Priority: prioritySrcNAT},
			Rules: []nft.Rule{R(nft.JumpTo(chainPostrouting))}},
		{Name: "filter-input", Hook: &nft.Hook{Type: "filter", Hook: "input", Priority: priorityFilter},
			Rules: []nft.Rule{
				R(nft.JumpTo(chainFirewall)),
				R(inHealthCheck(), nft.Verdict{Kind: nft.Accept}).WithComment("kubernetes health check rules"),
				R(nft.JumpTo(chainIPVSFilter)),
			}},
		{Name: "filter-forward", Hook: &nft.Hook{Type: "filter", Hook: "forward", Priority: priorityFilter},
			Rules: []nft.Rule{R(nft.JumpTo(chainFirewall)), R(nft.JumpTo(chainForward))}},
		{Name: "filter-output", Hook: &nft.Hook{Type: "filter", Hook: "output", Priority: priorityOutFilter},
			Rules: []nft.Rule{R(nft.JumpTo(chainIPVSOutFilter))}},
	}
}

// natChains mark what is masqueraded and masquerade it.
func natChains(f nft.Family, cfg nft.Config, node proxier.Node, mark uint32) []*nft.Chain {
	R := nft.R
	ret := nft.Verdict{Kind: nft.Return}
	return []*nft.Chain{
		{Name: chainServices, Rules: servicesRules(f, cfg, node)},
		{Name: chainLoadBalancer, Rules: []nft.Rule{
			R(inService(SetLoadBalancerLocal), ret),
			R(nft.GotoChain(chainMarkMasq)),
		}},
		{Name: chainNodePort, Rules: nodePortRules()},
		{Name: chainMarkMasq, Rules: []nft.Rule{R(nft.MarkSet{Bit: mark})}},
		{Name: chainPostrouting, Rules: []nft.Rule{
			R(inServiceFrom(SetLoopBack), nft.Masquerade{}).WithComment("Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose"),
			R(nft.MarkZero{Bit: mark}, ret),
			R(nft.MarkSet{Bit: mark, Toggle: true}),
			R(nft.Masquerade{}),
		}},
	}
}

// servicesRules are KUBE-SERVICES: ClusterIP traffic is masqueraded when
// it does not come from a pod (or always, with --masquerade-all); without
// a way to tell, not at all.
func servicesRules(f nft.Family, cfg nft.Config, node proxier.Node) []nft.Rule {
	R := nft.R
	var services []nft.Rule
	const clusterComment = "Kubernetes service cluster ip + port for masquerade purpose"
	if cfg.MasqueradeAll {
		services = append(services, R(inService(SetClusterIP), nft.JumpTo(chainMarkMasq)).WithComment(clusterComment))
	} else if notPod, ok := nft.LocalMatch(f, cfg, node, true); ok {
		services = append(services, R(inService(SetClusterIP), notPod, nft.JumpTo(chainMarkMasq)).WithComment(clusterComment))
	}
	return append(services,
		R(inService(SetExternalIPLocal), nft.Verdict{Kind: nft.Return}).WithComment("external IPs of Local-policy services keep the source"),
		R(inService(SetExternalIP), nft.GotoChain(chainMarkMasq)).WithComment("Kubernetes service external ip + port for masquerade and filter purpose"),
		R(inService(SetLoadBalancer), nft.GotoChain(chainLoadBalancer)).WithComment("Kubernetes service lb portal"),
		R(nft.FibLocal{}, nft.GotoChain(chainNodePort)),
	)
}

// nodePortRules are KUBE-NODE-PORT: Local-policy node ports keep the
// source, the others are masqueraded.
func nodePortRules() []nft.Rule {
	var rules []nft.Rule
	for _, np := range []struct {
		proto        uint8
		local, masq  string
		withAddrSets bool
	}{
		{unix.IPPROTO_TCP, SetNodePortLocalTCP, SetNodePortTCP, false},
		{unix.IPPROTO_UDP, SetNodePortLocalUDP, SetNodePortUDP, false},
		{unix.IPPROTO_SCTP, SetNodePortLocalSCTP, SetNodePortSCTP, true},
	} {
		key := []nft.Field{nft.FieldDport}
		if np.withAddrSets {
			key = []nft.Field{nft.FieldDaddr, nft.FieldDport}
		}
		rules = append(rules,
			nft.R(nft.LookupSet(np.local, key...).WithProto(np.proto), nft.Verdict{Kind: nft.Return}),
			nft.R(nft.LookupSet(np.masq, key...).WithProto(np.proto), nft.GotoChain(chainMarkMasq)),
		)
	}
	return rules
}

// filterChains are the firewall for source ranges, upstream #72236's
// filter of virtual addresses, and forwarding.
func filterChains(mark uint32) []*nft.Chain {
	R := nft.R
	ret := nft.Verdict{Kind: nft.Return}
	return []*nft.Chain{
		{Name: chainFirewall, Rules: []nft.Rule{
			R(inService(SetLoadBalancerFW), nft.GotoChain(chainSourceRanges)).WithComment("Kubernetes service load balancer ip + port for load balancer with sourceRange"),
		}},
		{Name: chainSourceRanges, Rules: []nft.Rule{
			R(inServiceFrom(SetLBSourceCIDR), ret),
			R(inServiceFrom(SetLBSourceIP), ret),
			R(nft.Verdict{Kind: nft.Drop}),
		}},
		// Upstream #72236: without this, host daemons listening on any
		// address answer on every virtual address, on every port.
		{Name: chainIPVSFilter, Rules: []nft.Rule{
			R(inService(SetLoadBalancer), ret),
			R(inService(SetClusterIP), ret),
			R(inService(SetExternalIP), ret),
			R(inService(SetExternalIPLocal), ret),
			R(inHealthCheck(), ret),
			R(nft.CtState{Bits: nft.CtNew}, nft.LookupSet(SetIPVSIPs, nft.FieldDaddr), nft.Reject{}).WithComment("new connections to a virtual address on a port that is no service"),
		}},
		// The node's own requests to an LB IP with source ranges that do
		// not hold the node (#119656): they come from the LB IP.
		{Name: chainIPVSOutFilter, Rules: []nft.Rule{
			R(inServiceFrom(SetLBNoNodeAccess), nft.Verdict{Kind: nft.Drop}),
		}},
		{Name: chainForward, Rules: []nft.Rule{
			R(nft.MarkIsSet{Bit: mark}, nft.Verdict{Kind: nft.Accept}).WithComment("kubernetes forwarding rules"),
			R(nft.CtState{Bits: nft.CtEstablished | nft.CtRelated}, nft.Verdict{Kind: nft.Accept}).WithComment("kubernetes forwarding conntrack rule"),
		}},
	}
}

// HelperTables returns both families' helper tables holding elems.
func HelperTables(cfg nft.Config, node proxier.Node, elems []Element) []*nft.SetTable {
	v4 := BuildHelperTable(nft.IPv4, cfg, node)
	v6 := BuildHelperTable(nft.IPv6, cfg, node)
	for _, e := range elems {
		t := v4
		if e.V6 {
			t = v6
		}
		t.Elements[e.Set] = append(t.Elements[e.Set], setElement(e))
	}
	return []*nft.SetTable{v4, v6}
}

// setElement is an element as the helper table's set holds it.
func setElement(e Element) nft.SetElement {
	se := nft.SetElement{Daddr: e.Addr, Port: e.Port}
	def, _ := SetByName(e.Set)
	for _, p := range def.Key {
		switch p {
		case PartProto:
			se.Proto = uint8(protoNumber(e.Protocol))
		case PartAddr2:
			se.Saddr = netip.PrefixFrom(e.Addr2, e.Addr2.BitLen())
		case PartNet:
			se.Saddr = e.Net.Masked()
		}
	}
	return se
}

// fromSetElement is the inverse of setElement.
func fromSetElement(set string, v6 bool, se nft.SetElement) Element {
	e := Element{Set: set, V6: v6, Addr: se.Daddr, Port: se.Port}
	def, _ := SetByName(set)
	for _, p := range def.Key {
		switch p {
		case PartProto:
			e.Protocol, _ = protocolOf(uint16(se.Proto))
		case PartAddr2:
			e.Addr2 = se.Saddr.Addr()
		case PartNet:
			e.Net = se.Saddr
		}
	}
	return e
}
