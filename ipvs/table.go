package ipvs

import (
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
	"github.com/kube-nftproxy/kube-nftproxy/nftlocal"
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
func keyFields(def SetDef) ([]nftlib.Field, bool) {
	var out []nftlib.Field
	interval := false
	for _, p := range def.Key {
		switch p {
		case PartAddr:
			out = append(out, nftlib.FieldDaddr)
		case PartProto:
			out = append(out, nftlib.FieldL4Proto)
		case PartPort:
			out = append(out, nftlib.FieldDport)
		case PartAddr2:
			out = append(out, nftlib.FieldSaddr)
		case PartNet:
			out = append(out, nftlib.FieldSaddr)
			interval = true
		}
	}
	return out, interval
}

// BuildHelperTable returns family f's helper table with no elements. Its
// rules are constant: every per-service fact is a set element. cfg gives
// the masquerade bit, --masquerade-all and how to tell pod traffic
// (--cluster-cidr / --detect-local-mode), as for the nftables mode.
func BuildHelperTable(f nftlib.Family, cfg proxier.Settings, node model.Node) *nftlib.Table {
	t := &nftlib.Table{
		Family:  f,
		Name:    HelperTableName,
		Comment: "kube-nftproxy IPVS mode: masquerade and filter rules around IPVS; sets named as upstream's ipsets",
	}
	for _, def := range Sets {
		key, interval := keyFields(def)
		t.Maps = append(t.Maps, &nftlib.Map{Name: def.Name, Key: key, Plain: true, Interval: interval, Comment: def.Comment})
	}
	mark := cfg.MasqueradeMark()
	t.Chains = append(baseChains(), natChains(f, cfg, node, mark)...)
	t.Chains = append(t.Chains, filterChains(mark)...)
	return t
}

// inService looks the packet's service address, protocol and port up in a set.
func inService(set string) nftlib.SetLookup {
	return nftlib.LookupSet(set, nftlib.FieldDaddr, nftlib.FieldL4Proto, nftlib.FieldDport)
}

// inServiceFrom also looks up the packet's source.
func inServiceFrom(set string) nftlib.SetLookup {
	return nftlib.LookupSet(set, nftlib.FieldDaddr, nftlib.FieldL4Proto, nftlib.FieldDport, nftlib.FieldSaddr)
}

// inHealthCheck looks the packet's port up among the health check node ports.
func inHealthCheck() nftlib.SetLookup {
	return nftlib.LookupSet(SetHealthCheckNodePort, nftlib.FieldDport)
}

// baseChains hook the helper table into netfilter and jump to upstream's chains.
func baseChains() []*nftlib.Chain {
	R := nftlib.R
	return []*nftlib.Chain{
		{Name: "nat-prerouting", Hook: &nftlib.Hook{Type: "nat", Hook: "prerouting", Priority: priorityDstNAT},
			Rules: []nftlib.Rule{R(nftlib.JumpTo(chainServices))}},
		{Name: "nat-output", Hook: &nftlib.Hook{Type: "nat", Hook: "output", Priority: priorityDstNAT},
			Rules: []nftlib.Rule{R(nftlib.JumpTo(chainServices))}},
		{Name: "nat-postrouting", Hook: &nftlib.Hook{Type: "nat", Hook: "postrouting", Priority: prioritySrcNAT},
			Rules: []nftlib.Rule{R(nftlib.JumpTo(chainPostrouting))}},
		{Name: "filter-input", Hook: &nftlib.Hook{Type: "filter", Hook: "input", Priority: priorityFilter},
			Rules: []nftlib.Rule{
				R(nftlib.JumpTo(chainFirewall)),
				R(inHealthCheck(), nftlib.Verdict{Kind: nftlib.Accept}).WithComment("kubernetes health check rules"),
				R(nftlib.JumpTo(chainIPVSFilter)),
			}},
		{Name: "filter-forward", Hook: &nftlib.Hook{Type: "filter", Hook: "forward", Priority: priorityFilter},
			Rules: []nftlib.Rule{R(nftlib.JumpTo(chainFirewall)), R(nftlib.JumpTo(chainForward))}},
		{Name: "filter-output", Hook: &nftlib.Hook{Type: "filter", Hook: "output", Priority: priorityOutFilter},
			Rules: []nftlib.Rule{R(nftlib.JumpTo(chainIPVSOutFilter))}},
	}
}

// natChains mark what is masqueraded and masquerade it.
func natChains(f nftlib.Family, cfg proxier.Settings, node model.Node, mark uint32) []*nftlib.Chain {
	R := nftlib.R
	ret := nftlib.Verdict{Kind: nftlib.Return}
	return []*nftlib.Chain{
		{Name: chainServices, Rules: servicesRules(f, cfg, node)},
		{Name: chainLoadBalancer, Rules: []nftlib.Rule{
			R(inService(SetLoadBalancerLocal), ret),
			R(nftlib.GotoChain(chainMarkMasq)),
		}},
		{Name: chainNodePort, Rules: nodePortRules()},
		{Name: chainMarkMasq, Rules: []nftlib.Rule{R(nftlib.MarkSet{Bit: mark})}},
		{Name: chainPostrouting, Rules: []nftlib.Rule{
			R(inServiceFrom(SetLoopBack), nftlib.Masquerade{}).WithComment("Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose"),
			R(nftlib.MarkZero{Bit: mark}, ret),
			R(nftlib.MarkSet{Bit: mark, Toggle: true}),
			R(nftlib.Masquerade{}),
		}},
	}
}

// servicesRules are KUBE-SERVICES: ClusterIP traffic is masqueraded when
// it does not come from a pod (or always, with --masquerade-all); without
// a way to tell, not at all.
func servicesRules(f nftlib.Family, cfg proxier.Settings, node model.Node) []nftlib.Rule {
	R := nftlib.R
	var services []nftlib.Rule
	const clusterComment = "Kubernetes service cluster ip + port for masquerade purpose"
	if cfg.MasqueradeAll {
		services = append(services, R(inService(SetClusterIP), nftlib.JumpTo(chainMarkMasq)).WithComment(clusterComment))
	} else if notPod, ok := nftlocal.Match(f, cfg, node, true); ok {
		services = append(services, R(inService(SetClusterIP), notPod, nftlib.JumpTo(chainMarkMasq)).WithComment(clusterComment))
	}
	return append(services,
		R(inService(SetExternalIPLocal), nftlib.Verdict{Kind: nftlib.Return}).WithComment("external IPs of Local-policy services keep the source"),
		R(inService(SetExternalIP), nftlib.GotoChain(chainMarkMasq)).WithComment("Kubernetes service external ip + port for masquerade and filter purpose"),
		R(inService(SetLoadBalancer), nftlib.GotoChain(chainLoadBalancer)).WithComment("Kubernetes service lb portal"),
		R(nftlib.FibLocal{}, nftlib.GotoChain(chainNodePort)),
	)
}

// nodePortRules are KUBE-NODE-PORT: Local-policy node ports keep the
// source, the others are masqueraded.
func nodePortRules() []nftlib.Rule {
	var rules []nftlib.Rule
	for _, np := range []struct {
		proto        uint8
		local, masq  string
		withAddrSets bool
	}{
		{unix.IPPROTO_TCP, SetNodePortLocalTCP, SetNodePortTCP, false},
		{unix.IPPROTO_UDP, SetNodePortLocalUDP, SetNodePortUDP, false},
		{unix.IPPROTO_SCTP, SetNodePortLocalSCTP, SetNodePortSCTP, true},
	} {
		key := []nftlib.Field{nftlib.FieldDport}
		if np.withAddrSets {
			key = []nftlib.Field{nftlib.FieldDaddr, nftlib.FieldDport}
		}
		rules = append(rules,
			nftlib.R(nftlib.LookupSet(np.local, key...).WithProto(np.proto), nftlib.Verdict{Kind: nftlib.Return}),
			nftlib.R(nftlib.LookupSet(np.masq, key...).WithProto(np.proto), nftlib.GotoChain(chainMarkMasq)),
		)
	}
	return rules
}

// filterChains are the firewall for source ranges, upstream #72236's
// filter of virtual addresses, and forwarding.
func filterChains(mark uint32) []*nftlib.Chain {
	R := nftlib.R
	ret := nftlib.Verdict{Kind: nftlib.Return}
	return []*nftlib.Chain{
		{Name: chainFirewall, Rules: []nftlib.Rule{
			R(inService(SetLoadBalancerFW), nftlib.GotoChain(chainSourceRanges)).WithComment("Kubernetes service load balancer ip + port for load balancer with sourceRange"),
		}},
		{Name: chainSourceRanges, Rules: []nftlib.Rule{
			R(inServiceFrom(SetLBSourceCIDR), ret),
			R(inServiceFrom(SetLBSourceIP), ret),
			R(nftlib.Verdict{Kind: nftlib.Drop}),
		}},
		// Upstream #72236: without this, host daemons listening on any
		// address answer on every virtual address, on every port.
		{Name: chainIPVSFilter, Rules: []nftlib.Rule{
			R(inService(SetLoadBalancer), ret),
			R(inService(SetClusterIP), ret),
			R(inService(SetExternalIP), ret),
			R(inService(SetExternalIPLocal), ret),
			R(inHealthCheck(), ret),
			R(nftlib.CtState{Bits: nftlib.CtNew}, nftlib.LookupSet(SetIPVSIPs, nftlib.FieldDaddr), nftlib.Reject{}).WithComment("new connections to a virtual address on a port that is no service"),
		}},
		// The node's own requests to an LB IP with source ranges that do
		// not hold the node (#119656): they come from the LB IP.
		{Name: chainIPVSOutFilter, Rules: []nftlib.Rule{
			R(inServiceFrom(SetLBNoNodeAccess), nftlib.Verdict{Kind: nftlib.Drop}),
		}},
		{Name: chainForward, Rules: []nftlib.Rule{
			R(nftlib.MarkIsSet{Bit: mark}, nftlib.Verdict{Kind: nftlib.Accept}).WithComment("kubernetes forwarding rules"),
			R(nftlib.CtState{Bits: nftlib.CtEstablished | nftlib.CtRelated}, nftlib.Verdict{Kind: nftlib.Accept}).WithComment("kubernetes forwarding conntrack rule"),
		}},
	}
}

// HelperTables returns both families' helper tables holding elems.
func HelperTables(cfg proxier.Settings, node model.Node, elems []Element) []*nftlib.Table {
	v4 := BuildHelperTable(nftlib.IPv4, cfg, node)
	v6 := BuildHelperTable(nftlib.IPv6, cfg, node)
	for _, e := range elems {
		t := v4
		if e.V6 {
			t = v6
		}
		if m := t.Map(e.Set); m != nil {
			m.Elements = append(m.Elements, setElement(e))
		}
	}
	return []*nftlib.Table{v4, v6}
}

// setElement is an element as the helper table's set holds it: the
// service's address, protocol and port, and a second address (the
// source) as the set's Net.
func setElement(e Element) nftlib.Element {
	k := nftlib.Key{Addr: e.Addr, Port: e.Port}
	def, _ := SetByName(e.Set)
	for _, p := range def.Key {
		switch p {
		case PartProto:
			k.Proto = e.Protocol.Number()
		case PartAddr2:
			k.Net = netip.PrefixFrom(e.Addr2, e.Addr2.BitLen())
		case PartNet:
			k.Net = e.Net.Masked()
		}
	}
	return nftlib.Element{Key: k}
}

// fromSetElement is the inverse of setElement.
func fromSetElement(set string, v6 bool, se nftlib.Element) Element {
	k := se.Key
	e := Element{Set: set, V6: v6, Addr: k.Addr, Port: k.Port}
	def, _ := SetByName(set)
	for _, p := range def.Key {
		switch p {
		case PartProto:
			e.Protocol = protocolNumbered(k.Proto)
		case PartAddr2:
			e.Addr2 = k.Net.Addr()
		case PartNet:
			e.Net = k.Net
		}
	}
	return e
}

// protocolNumbered is the protocol of IP protocol number n; "" for one
// that no Service uses.
func protocolNumbered(n uint8) model.Protocol {
	for _, p := range []model.Protocol{model.TCP, model.UDP, model.SCTP} {
		if p.Number() == n {
			return p
		}
	}
	return ""
}
