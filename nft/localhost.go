package nft

import (
	"net/netip"

	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// Localhost NodePorts, as kube-proxy's iptables mode serves them
// (--iptables-localhost-nodeports, on by default there): IPv4 NodePorts
// answer on 127.0.0.0/8 as well, which needs net.ipv4.conf.all.route_localnet=1
// (a DNATed packet keeps its 127.0.0.1 source until masqueraded; without
// it the kernel drops it as martian). route_localnet also lets other hosts
// reach the node's loopback services, which KUBE-FIREWALL closes: a packet
// to 127.0.0.0/8 from outside it is dropped unless DNATed or part of a
// connection already accepted. IPv6 has no route_localnet: never on ::1.

const (
	chainLocalnetFirewall = "KUBE-FIREWALL" // iptables mode's (and kubelet's) name
	localnetComment       = "block incoming localnet connections"
)

var (
	ipv4Loopback      = netip.MustParsePrefix("127.0.0.0/8")
	ipv6Loopback      = netip.MustParsePrefix("::1/128")
	ipv4LoopbackStart = netip.MustParseAddr("127.0.0.0")
)

// LocalhostNodePorts reports whether cfg serves NodePorts on 127.0.0.0/8:
// asked for, and the NodePort addresses include IPv4 loopback (all
// addresses, or a CIDR holding 127.0.0.0, as upstream's NodePortAddresses
// decides). When true, route_localnet must be set.
func LocalhostNodePorts(cfg Config) bool {
	if !cfg.LocalhostNodePorts {
		return false
	}
	v4 := familyPrefixes(nftlib.IPv4, cfg.NodePortAddresses)
	if len(v4) == 0 {
		// Every IPv4 address, loopback included; or, with primary, the
		// Node object's only.
		return !cfg.NodePortPrimary
	}
	for _, p := range v4 {
		if p.Addr().IsLoopback() || p.Contains(ipv4LoopbackStart) {
			return true
		}
	}
	return false
}

func localhostNodePorts(f nftlib.Family, cfg Config) bool {
	return f == nftlib.IPv4 && LocalhostNodePorts(cfg)
}

// loopbackExclusion is the match that keeps NodePorts off loopback: none
// when localhost NodePorts are on.
func loopbackExclusion(f nftlib.Family, cfg Config) []nftlib.Term {
	if localhostNodePorts(f, cfg) {
		return nil
	}
	return []nftlib.Term{nftlib.AddrMatch{Field: nftlib.FieldDaddr, Negate: true, Prefix: loopbackPrefix(f)}}
}

// loopbackPrefix is the family's loopback range: 127.0.0.0/8 or ::1.
func loopbackPrefix(f nftlib.Family) netip.Prefix {
	if f == nftlib.IPv6 {
		return ipv6Loopback
	}
	return ipv4Loopback
}

// addLocalnetFirewall adds KUBE-FIREWALL and its jumps from the input and
// output filter hooks, first in each (iptables mode's rule, which kubelet
// writes too): drop what reaches 127.0.0.0/8 from elsewhere, unless DNATed
// or established/related.
func addLocalnetFirewall(t *nftlib.Table) {
	t.Chains = append(t.Chains, &nftlib.Chain{Name: chainLocalnetFirewall, Rules: []nftlib.Rule{
		nftlib.R(
			nftlib.AddrMatch{Field: nftlib.FieldDaddr, Prefix: ipv4Loopback},
			nftlib.AddrMatch{Field: nftlib.FieldSaddr, Negate: true, Prefix: ipv4Loopback},
			nftlib.CtStateNone{Bits: nftlib.CtEstablished | nftlib.CtRelated},
			nftlib.CtStatusNone{Bits: nftlib.CtStatusDNAT},
			nftlib.Verdict{Kind: nftlib.Drop},
		).WithComment(localnetComment),
	}})
	for _, hook := range []string{"filter-input", "filter-output"} {
		c := t.FixedChain(hook)
		c.Rules = append([]nftlib.Rule{nftlib.R(nftlib.JumpTo(chainLocalnetFirewall))}, c.Rules...)
	}
}
