// Package nftlocal turns the local-traffic detection settings
// (--detect-local-mode and its companions) into an nftables match: the
// test both modes' nftables tables use to tell pod traffic from other
// traffic.
package nftlocal

import (
	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
	"github.com/kube-nftproxy/kube-nftproxy/proxier"
)

// Match is the term that matches pod traffic (negate: any other traffic)
// for family f by s.DetectLocal, and false when the mode cannot tell (e.g.
// no CIDR of that family), in which case, like kube-proxy, nothing is
// treated as local.
func Match(f nftlib.Family, s proxier.Settings, node model.Node, negate bool) (nftlib.Term, bool) {
	d := s.DetectLocal
	switch d.Mode {
	case proxier.DetectBridgeInterface:
		return nftlib.IfName{Name: d.BridgeInterface, Negate: negate}, d.BridgeInterface != ""
	case proxier.DetectInterfaceNamePrefix:
		return nftlib.IfName{Name: d.InterfacePrefix, Prefix: true, Negate: negate}, d.InterfacePrefix != ""
	case proxier.DetectNodeCIDR:
		for _, p := range node.PodCIDRs {
			if f.Has(p.Addr()) {
				return nftlib.AddrMatch{Field: nftlib.FieldSaddr, Negate: negate, Prefix: p.Masked()}, true
			}
		}
		return nil, false
	}
	for _, cidr := range s.ClusterCIDRs {
		if f.Has(cidr.Addr()) {
			return nftlib.AddrMatch{Field: nftlib.FieldSaddr, Negate: negate, Prefix: cidr}, true // one CIDR per family
		}
	}
	return nil, false
}
