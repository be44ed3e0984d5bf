package sandbox

import (
	"fmt"
	"net/netip"
	"regexp"
)

// Names of the fixed namespaces (see e2e/TOPOLOGY.md). Pod namespaces are
// named after their pods.
const (
	Node   = "node"
	Client = "client"
)

// Link names.
const (
	Bridge     = "kbr0" // the pod network bridge in the node namespace
	NodeExtDev = "ext0" // the node's veth towards the client
	PodDev     = "eth0" // the veth inside each pod and inside the client
)

// The addresses of the topology. Prefixes carry the interface's prefix
// length; use .Addr() for the address alone.
var (
	// BridgeIPv4 and BridgeIPv6 are the node's addresses on kbr0 (the
	// pods' default gateways).
	BridgeIPv4 = netip.MustParsePrefix("10.244.0.1/24")
	BridgeIPv6 = netip.MustParsePrefix("fd00:10:244::1/64")
	// NodeIPv4 and NodeIPv6 are the node's addresses on ext0, facing the
	// client: the addresses to use for NodePorts.
	NodeIPv4 = netip.MustParsePrefix("10.99.0.1/24")
	NodeIPv6 = netip.MustParsePrefix("fd00:99::1/64")
	// ClientIPv4 and ClientIPv6 are the off-cluster client's addresses.
	ClientIPv4 = netip.MustParsePrefix("10.99.0.2/24")
	ClientIPv6 = netip.MustParsePrefix("fd00:99::2/64")

	// ClusterCIDRs is the pod network, as --cluster-cidr wants it.
	ClusterCIDRs = []netip.Prefix{
		netip.MustParsePrefix("10.244.0.0/16"),
		netip.MustParsePrefix("fd00:10:244::/48"),
	}
	// ServiceCIDRs holds the Service addresses (on no interface).
	ServiceCIDRs = []netip.Prefix{
		netip.MustParsePrefix("10.96.0.0/16"),
		netip.MustParsePrefix("fd00:10:96::/112"),
	}
)

// Pod is a pod namespace: a veth eth0 whose peer is enslaved to kbr0 in the
// node namespace, with addresses in BridgeIPv4's and BridgeIPv6's subnets.
type Pod struct {
	Name string     // namespace suffix and pod name, e.g. "pod-a"
	IPv4 netip.Addr // in 10.244.0.0/24; required
	IPv6 netip.Addr // in fd00:10:244::/64; the zero Addr means IPv4 only
}

// NewPod returns a dual-stack pod at host number host (2..254) of the pod
// subnets, numbered like the topology's pods: host 10 gives 10.244.0.10 and
// fd00:10:244::10 (the same digits, read as hexadecimal).
func NewPod(name string, host int) Pod {
	if host < 2 || host > 254 {
		return Pod{Name: name}
	}
	var v6 netip.Addr
	if a, err := netip.ParseAddr(fmt.Sprintf("fd00:10:244::%d", host)); err == nil {
		v6 = a
	}
	return Pod{
		Name: name,
		IPv4: netip.AddrFrom4([4]byte{10, 244, 0, byte(host)}),
		IPv6: v6,
	}
}

// DefaultPods are the pods of e2e/TOPOLOGY.md: pod-a and pod-b.
func DefaultPods() []Pod {
	return []Pod{NewPod("pod-a", 10), NewPod("pod-b", 11)}
}

var podNameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$`)

func validatePods(pods []Pod) error {
	names := map[string]bool{Node: true, Client: true}
	addrs := map[netip.Addr]string{
		BridgeIPv4.Addr(): "the bridge",
		BridgeIPv6.Addr(): "the bridge",
	}
	for _, p := range pods {
		if !podNameRE.MatchString(p.Name) {
			return fmt.Errorf("pod name %q: want 1-32 of [a-z0-9-], starting and ending alphanumeric", p.Name)
		}
		if names[p.Name] {
			return fmt.Errorf("pod name %q is already taken", p.Name)
		}
		names[p.Name] = true
		if !p.IPv4.Is4() || !BridgeIPv4.Contains(p.IPv4) {
			return fmt.Errorf("pod %s: IPv4 address %v is not in %v", p.Name, p.IPv4, BridgeIPv4.Masked())
		}
		if p.IPv6.IsValid() && (!p.IPv6.Is6() || !BridgeIPv6.Contains(p.IPv6)) {
			return fmt.Errorf("pod %s: IPv6 address %v is not in %v", p.Name, p.IPv6, BridgeIPv6.Masked())
		}
		for _, a := range []netip.Addr{p.IPv4, p.IPv6} {
			if !a.IsValid() {
				continue
			}
			if other, ok := addrs[a]; ok {
				return fmt.Errorf("pod %s: address %v is already used by %s", p.Name, a, other)
			}
			addrs[a] = "pod " + p.Name
		}
	}
	return nil
}

// hostVeth is the name of a pod's veth peer in the node namespace: "veth-"
// and the pod name if that fits in IFNAMSIZ, else "veth-p" and its index.
func hostVeth(pod string, index int) string {
	if name := "veth-" + pod; len(name) <= 15 {
		return name
	}
	return fmt.Sprintf("veth-p%d", index)
}
