package cluster

import (
	"fmt"
	"net"
	"strings"
)

// The cluster's IP families, by KNP_CLUSTER_FAMILY.
const (
	FamilyIPv4 = "ipv4" // single-stack IPv4 (the default)
	FamilyDual = "dual" // dual-stack, IPv4 the primary family
	FamilyIPv6 = "ipv6" // single-stack IPv6
)

// The IPv6 side of the addressing: unique local addresses that exist only
// inside the cluster's namespaces (the Service and pod ranges are those of
// e2e/TOPOLOGY.md and e2e/apiserver).
const (
	ServiceCIDR6   = "fd00:10:96::/112"
	ClusterCIDR6   = "fd00:10:244::/56"
	DNSServiceIP6  = "fd00:10:96::a"
	KubernetesIP6  = "fd00:10:96::1"
	BridgeIP6      = "fd00:200::1"
	NodeNetPrefix6 = 64
	// nodeCIDRMask4 and nodeCIDRMask6 are each node's share of the pod
	// ranges (kube-controller-manager's --node-cidr-mask-size-ipv4/-ipv6).
	nodeCIDRMask4 = 24
	nodeCIDRMask6 = 64
)

// checkFamily refuses an unknown KNP_CLUSTER_FAMILY before anything starts.
func (l Layout) checkFamily() error {
	switch l.Family {
	case "", FamilyIPv4, FamilyDual, FamilyIPv6:
		return nil
	}
	return fmt.Errorf("KNP_CLUSTER_FAMILY=%q: want %q, %q or %q", l.Family, FamilyIPv4, FamilyDual, FamilyIPv6)
}

// HasIPv4 says whether the cluster has IPv4 addresses (every shape but ipv6).
func (l Layout) HasIPv4() bool { return l.Family != FamilyIPv6 }

// HasIPv6 says whether the cluster has IPv6 addresses (dual and ipv6).
func (l Layout) HasIPv6() bool { return l.Family == FamilyDual || l.Family == FamilyIPv6 }

// byFamily keeps v4 and v6 as the cluster's families say, the primary
// family first.
func (l Layout) byFamily(v4, v6 string) []string {
	switch l.Family {
	case FamilyDual:
		return []string{v4, v6}
	case FamilyIPv6:
		return []string{v6}
	}
	return []string{v4}
}

// BridgeIPs are the node network's gateway addresses, the primary first:
// the API server advertises the first.
func (l Layout) BridgeIPs() []string { return l.byFamily(BridgeIP, BridgeIP6) }

// NodeIPs are node n's addresses on the node network (kubelet's
// --node-ip), the primary first.
func (l Layout) NodeIPs(n Node) []string { return l.byFamily(n.IP, n.IP6) }

// PrimaryNodeIP is node n's address of the primary family.
func (l Layout) PrimaryNodeIP(n Node) string { return l.NodeIPs(n)[0] }

// ServiceCIDRs is --service-cluster-ip-range: one range per family.
func (l Layout) ServiceCIDRs() string {
	return strings.Join(l.byFamily(ServiceCIDR, ServiceCIDR6), ",")
}

// ClusterCIDRs are the pod ranges, one per family, comma-separated (the
// controller manager's and the proxies' --cluster-cidr).
func (l Layout) ClusterCIDRs() string {
	return strings.Join(l.byFamily(ClusterCIDR, ClusterCIDR6), ",")
}

// DNSServiceIPs are kube-dns's ClusterIPs, the primary first (kubelet's
// clusterDNS names that one, as kubeadm's does).
func (l Layout) DNSServiceIPs() []string { return l.byFamily(DNSServiceIP, DNSServiceIP6) }

// kubernetesIPs are the kubernetes Service's possible ClusterIPs (the
// first address of each Service range), for the API server's certificate.
func (l Layout) kubernetesIPs() []string { return l.byFamily(KubernetesIP, KubernetesIP6) }

// wildcard is the any-address of the cluster's listeners: IPv4's for
// IPv4 single-stack, else IPv6's (which takes both families on Linux).
func (l Layout) wildcard() string {
	if l.HasIPv6() {
		return "::"
	}
	return "0.0.0.0"
}

// nodeCIDRMaskArgs are the controller manager's per-node pod range sizes:
// IPv4 single-stack keeps the one flag it always had; the others need
// the per-family flags (--node-cidr-mask-size is refused with two ranges).
func (l Layout) nodeCIDRMaskArgs() []string {
	switch l.Family {
	case FamilyDual:
		return []string{fmt.Sprintf("--node-cidr-mask-size-ipv4=%d", nodeCIDRMask4),
			fmt.Sprintf("--node-cidr-mask-size-ipv6=%d", nodeCIDRMask6)}
	case FamilyIPv6:
		return []string{fmt.Sprintf("--node-cidr-mask-size-ipv6=%d", nodeCIDRMask6)}
	}
	return []string{fmt.Sprintf("--node-cidr-mask-size=%d", nodeCIDRMask4)}
}

// sameFamily picks from addrs the one of addr's (or prefix's) family.
func sameFamily(cidrOrAddr string, addrs []string) (string, bool) {
	want := isIPv6(cidrOrAddr)
	for _, a := range addrs {
		if isIPv6(a) == want {
			return a, true
		}
	}
	return "", false
}

// isIPv6 says whether an address or prefix is IPv6.
func isIPv6(cidrOrAddr string) bool {
	s, _, _ := strings.Cut(cidrOrAddr, "/")
	ip := net.ParseIP(s)
	return ip != nil && ip.To4() == nil
}
