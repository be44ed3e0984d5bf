package nft

import (
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/proxier"
)

// DefaultTableName is the name of our main tables (one per family); the
// delta tables add deltaSuffix.
const DefaultTableName = "kube-nftproxy"

// deltaSuffix names the tables that hold the service ports changed since the
// last fold. The kernel validates every chain reachable from a table's base
// chains whenever a transaction adds a jump, goto, dnat or map verdict to
// that table: 100 ms at 5k services on kernel 6.18, growing with the table.
// Changes therefore go to a small delta table whose base chains run just
// before the main table's; the main table only loses elements and rules
// (which needs no validation) until a fold moves the delta back into it.
const deltaSuffix = "-delta"

// Names of the fixed chains and maps (iptables mode's, where it has one).
const (
	chainServices    = "KUBE-SERVICES"
	chainNodePorts   = "KUBE-NODEPORTS"
	chainMarkMasq    = "KUBE-MARK-MASQ"
	chainPostrouting = "KUBE-POSTROUTING"

	mapServiceIPs   = "service-ips"
	mapServicePorts = "service-nodeports"
)

// Config is what shapes the ruleset besides the State: kube-proxy's flags.
type Config struct {
	TableName string
	// ClusterCIDRs: traffic from outside them to a ClusterIP is masqueraded
	// (--cluster-cidr, detect-local-mode ClusterCIDR).
	ClusterCIDRs []netip.Prefix
	// MasqueradeAll masquerades all traffic to ClusterIPs (--masquerade-all).
	MasqueradeAll bool
	// MasqueradeBit is the fwmark bit that asks for SNAT (--iptables-masquerade-bit, default 14).
	MasqueradeBit uint
}

// DefaultConfig is kube-proxy's defaults.
func DefaultConfig() Config {
	return Config{TableName: DefaultTableName, MasqueradeBit: 14}
}

// Validate reports flag values that cannot work.
func (c Config) Validate() error {
	if c.MasqueradeBit > 31 {
		return fmt.Errorf("masquerade bit %d out of range 0-31", c.MasqueradeBit)
	}
	if c.TableName == "" {
		return fmt.Errorf("empty table name")
	}
	return nil
}

func (c Config) markBit() uint32 { return 1 << c.MasqueradeBit }

// Build returns the whole Ruleset for a State as a full sync programs it:
// per family, a main table holding every service port and an empty delta table.
func Build(st *proxier.State, cfg Config) *Ruleset {
	rs := &Ruleset{}
	for _, f := range families {
		t := BuildTable(f, cfg, false)
		for name, svc := range st.Services {
			if fr := BuildFragment(f, cfg, st.Node, svc, st.Endpoints[name]); fr != nil {
				t.Services[name] = fr
			}
		}
		rs.Tables = append(rs.Tables, t, BuildTable(f, cfg, true))
	}
	return rs
}

var families = []Family{IPv4, IPv6}

// BuildTable returns a main or delta table with its fixed chains and maps and
// no services.
func BuildTable(f Family, cfg Config, delta bool) *Table {
	mark := cfg.markBit()
	loopback := netip.MustParsePrefix("127.0.0.0/8")
	if f == IPv6 {
		loopback = netip.MustParsePrefix("::1/128")
	}
	t := &Table{
		Family:  f,
		Name:    cfg.TableName,
		Comment: "rules for kube-nftproxy",
		Maps: []*Map{
			{Name: mapServiceIPs, Key: []Field{FieldDaddr, FieldL4Proto, FieldDport}, Comment: "ClusterIP, ExternalIP and LoadBalancer IP traffic"},
			{Name: mapServicePorts, Key: []Field{FieldL4Proto, FieldDport}, Comment: "NodePort traffic"},
		},
		Chains: []*Chain{
			{Name: "nat-prerouting", Hook: &Hook{Type: "nat", Hook: "prerouting", Priority: -100},
				Rules: []Rule{R(JumpTo(chainServices))}},
			{Name: "nat-output", Hook: &Hook{Type: "nat", Hook: "output", Priority: -100},
				Rules: []Rule{R(JumpTo(chainServices))}},
			{Name: "nat-postrouting", Hook: &Hook{Type: "nat", Hook: "postrouting", Priority: 100},
				Rules: []Rule{R(JumpTo(chainPostrouting))}},
			{Name: chainServices, Rules: []Rule{
				R(Vmap(mapServiceIPs, FieldDaddr, FieldL4Proto, FieldDport)),
				// NodePorts answer on the node's own addresses, never on
				// loopback (no route_localnet), as upstream's nftables mode.
				R(FibLocal{}, AddrMatch{Field: FieldDaddr, Negate: true, Prefix: loopback}, JumpTo(chainNodePorts)),
			}},
			{Name: chainNodePorts, Rules: []Rule{R(Vmap(mapServicePorts, FieldL4Proto, FieldDport))}},
			{Name: chainMarkMasq, Rules: []Rule{R(MarkSet{Bit: mark})}},
			{Name: chainPostrouting, Rules: []Rule{
				R(MarkZero{Bit: mark}, Verdict{Kind: Return}),
				R(MarkSet{Bit: mark, Toggle: true}),
				R(Masquerade{}),
			}},
		},
		Services: map[proxier.ServicePortName]*Fragment{},
	}
	if delta {
		// The same topology, one priority earlier, without postrouting:
		// the main table's KUBE-POSTROUTING masquerades what either marks.
		t.Name += deltaSuffix
		t.Delta = true
		t.Comment = "kube-nftproxy: service ports changed since the last fold into " + cfg.TableName + "; evaluated first"
		var chains []*Chain
		for _, c := range t.Chains {
			switch c.Name {
			case "nat-postrouting", chainPostrouting:
				continue
			}
			if c.Hook != nil {
				h := *c.Hook
				h.Priority--
				c.Hook = &h
			}
			chains = append(chains, c)
		}
		t.Chains = chains
	}
	return t
}

// BuildFragment returns one service port's chains and map elements in family
// f, or nil when the service has no ClusterIP of that family.
func BuildFragment(f Family, cfg Config, node proxier.Node, svc *proxier.ServicePort, eps []proxier.Endpoint) *Fragment {
	clusterIP, ok := firstOfFamily(f, svc.ClusterIPs)
	if !ok {
		return nil
	}
	name := svc.Name.String()
	proto := protoNumber(svc.Protocol)
	svcChain := ServiceChain(svc.Name, svc.Protocol)
	extChain := ExternalChain(svc.Name, svc.Protocol)
	fr := &Fragment{}

	var familyEps []proxier.Endpoint
	for _, ep := range eps {
		if f.has(ep.Addr) {
			familyEps = append(familyEps, ep)
		}
	}
	// Traffic policies get their own chains (KUBE-SVL) in a later
	// milestone; until then a Local policy uses the local endpoints here.
	cluster, local, _, _ := proxier.CategorizeEndpoints(svc, familyEps, node)
	clusterEps := cluster
	if cluster == nil {
		clusterEps = local
	}

	svcRules := []Rule{}
	if cfg.MasqueradeAll {
		svcRules = append(svcRules, R(JumpTo(chainMarkMasq)).WithComment(name+" cluster IP"))
	} else {
		for _, cidr := range cfg.ClusterCIDRs {
			if f.has(cidr.Addr()) {
				svcRules = append(svcRules, R(AddrMatch{Field: FieldSaddr, Negate: true, Prefix: cidr}, JumpTo(chainMarkMasq)).WithComment(name+" cluster IP"))
				break // one CIDR per family, as kube-proxy's ClusterCIDR mode
			}
		}
	}
	// Random choice without a set per service: endpoint i is taken with
	// probability 1/(n-i), so each of the n is equally likely. Sets per
	// service make the kernel's commit time quadratic (see the design).
	for i, ep := range clusterEps {
		sep := EndpointChain(svc.Name, svc.Protocol, ep.String())
		if left := len(clusterEps) - i; left > 1 {
			svcRules = append(svcRules, R(NumgenZero{Mod: uint32(left)}, GotoChain(sep)).WithComment(name+" -> "+ep.String()))
		} else {
			svcRules = append(svcRules, R(GotoChain(sep)).WithComment(name+" -> "+ep.String()))
		}
		fr.Chains = append(fr.Chains, &Chain{Name: sep, Comment: name, Rules: []Rule{
			R(AddrMatch{Field: FieldSaddr, Prefix: netip.PrefixFrom(ep.Addr, ep.Addr.BitLen())}, JumpTo(chainMarkMasq)),
			R(ProtoMatch{Proto: proto}, DNAT{Addr: ep.Addr, Port: ep.Port}),
		}})
	}
	fr.Chains = append(fr.Chains, &Chain{Name: svcChain, Comment: name, Rules: svcRules})
	fr.Elements = append(fr.Elements, MapElement{Map: mapServiceIPs, Element: Element{
		Key: Key{Addr: clusterIP, Proto: proto, Port: svc.Port}, Verdict: GotoChain(svcChain), Comment: name + " cluster IP"}})

	external := svc.NodePort != 0
	for _, ip := range svc.ExternalIPs {
		if f.has(ip) {
			external = true
			fr.Elements = append(fr.Elements, MapElement{Map: mapServiceIPs, Element: Element{
				Key: Key{Addr: ip, Proto: proto, Port: svc.Port}, Verdict: GotoChain(extChain), Comment: name + " external IP"}})
		}
	}
	for _, ip := range svc.LoadBalancerIPs {
		if f.has(ip) {
			external = true
			fr.Elements = append(fr.Elements, MapElement{Map: mapServiceIPs, Element: Element{
				Key: Key{Addr: ip, Proto: proto, Port: svc.Port}, Verdict: GotoChain(extChain), Comment: name + " loadbalancer IP"}})
		}
	}
	if svc.NodePort != 0 {
		fr.Elements = append(fr.Elements, MapElement{Map: mapServicePorts, Element: Element{
			Key: Key{Proto: proto, Port: svc.NodePort}, Verdict: GotoChain(extChain), Comment: name}})
	}
	if external {
		fr.Chains = append(fr.Chains, &Chain{Name: extChain, Comment: name, Rules: []Rule{
			R(JumpTo(chainMarkMasq)).WithComment("masquerade traffic for " + name + " external destinations"),
			R(GotoChain(svcChain)),
		}})
	}
	return fr
}

func firstOfFamily(f Family, addrs []netip.Addr) (netip.Addr, bool) {
	for _, a := range addrs {
		if f.has(a) {
			return a, true
		}
	}
	return netip.Addr{}, false
}

func protoNumber(p proxier.Protocol) uint8 {
	switch p {
	case proxier.UDP:
		return unix.IPPROTO_UDP
	case proxier.SCTP:
		return unix.IPPROTO_SCTP
	}
	return unix.IPPROTO_TCP
}
