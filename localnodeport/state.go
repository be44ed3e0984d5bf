package localnodeport

import (
	"net/netip"

	"github.com/kube-nftproxy/kube-nftproxy/model"
)

// Ports are a State's TCP NodePorts in one IP family, each with the
// endpoints its external policy chooses, as upstream's userspace proxy:
// the cluster-wide ones, or with externalTrafficPolicy Local the node's
// own. A Service port without a ClusterIP of the family is not served in
// it.
func Ports(st *model.State, ipv6 bool) []Port {
	var out []Port
	for name, svc := range st.Services.All() {
		np := svc.NodePortIn(ipv6)
		if svc.Protocol != model.TCP || np == 0 || !hasFamily(svc.ClusterIPs, ipv6) {
			continue
		}
		var eps []model.Endpoint
		for _, ep := range st.Endpoints.Get(name) {
			if ep.Addr.Is6() == ipv6 {
				eps = append(eps, ep)
			}
		}
		cluster, local, _, _ := model.CategorizeEndpoints(svc, eps, st.Node)
		if svc.ExternalPolicyLocal {
			cluster = local
		}
		port := Port{Name: name.String(), NodePort: np, Affinity: svc.AffinityTimeout}
		for _, ep := range cluster {
			port.Endpoints = append(port.Endpoints, netip.AddrPortFrom(ep.Addr, ep.Port))
		}
		out = append(out, port)
	}
	return out
}

func hasFamily(ips []netip.Addr, ipv6 bool) bool {
	for _, ip := range ips {
		if ip.Is6() == ipv6 {
			return true
		}
	}
	return false
}
