package kube

import (
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/kube-nftproxy/kube-nftproxy/model"
)

// toBeDeletedTaint is the cluster autoscaler's mark on a node it is removing.
const toBeDeletedTaint = "ToBeDeletedByClusterAutoscaler"

// nodeLeaving reports a node that is being deleted or drained for removal:
// kube-proxy's /healthz then fails so load balancers stop sending to it.
func nodeLeaving(node *corev1.Node) bool {
	if node.DeletionTimestamp != nil {
		return true
	}
	for _, t := range node.Spec.Taints {
		if t.Key == toBeDeletedTaint {
			return true
		}
	}
	return false
}

// NodeInfo converts a Node object. Bad pod CIDRs or addresses are dropped
// and reported; the rest of the Node is still returned.
func NodeInfo(node *corev1.Node) (model.Node, error) {
	if node == nil {
		return model.Node{}, nil
	}
	p := &problems{kind: "node", name: node.Name}
	out := model.Node{Name: node.Name, Zone: node.Labels[corev1.LabelTopologyZone], Leaving: nodeLeaving(node)}
	if node.Name == "" {
		p.add("metadata.name is empty")
	}

	cidrs, field := node.Spec.PodCIDRs, "spec.podCIDRs"
	if len(cidrs) == 0 && node.Spec.PodCIDR != "" {
		cidrs, field = []string{node.Spec.PodCIDR}, "spec.podCIDR"
	}
	for i, s := range cidrs {
		pfx, err := parsePrefix(s)
		if err != nil {
			p.add("%s[%d]: %v, dropped", field, i, err)
			continue
		}
		if !slices.Contains(out.PodCIDRs, pfx) {
			out.PodCIDRs = append(out.PodCIDRs, pfx)
		}
	}

	// InternalIPs first, then ExternalIPs, as kube-proxy's GetNodeHostIPs
	// orders them: the first of each family is the node's primary one
	// (--nodeport-addresses primary).
	for _, typ := range []corev1.NodeAddressType{corev1.NodeInternalIP, corev1.NodeExternalIP} {
		out.IPs = appendNodeIPs(out.IPs, node.Status.Addresses, typ, p)
	}
	return out, p.err()
}

// appendNodeIPs appends the node's addresses of type typ to ips, once each.
func appendNodeIPs(ips []netip.Addr, addrs []corev1.NodeAddress, typ corev1.NodeAddressType, p *problems) []netip.Addr {
	for i, a := range addrs {
		if a.Type != typ {
			continue // hostnames and DNS names are not addresses
		}
		ip, err := parseIP(a.Address)
		if err != nil {
			p.add("status.addresses[%d] (%s): %v, dropped", i, a.Type, err)
			continue
		}
		if !slices.Contains(ips, ip) {
			ips = append(ips, ip)
		}
	}
	return ips
}
