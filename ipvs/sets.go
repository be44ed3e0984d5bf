package ipvs

import (
	"cmp"
	"net/netip"
	"strconv"
	"strings"

	"github.com/kube-nftproxy/kube-nftproxy/model"
)

// KeyPart is one field of a helper set's key.
type KeyPart uint8

// The key fields the helper sets use.
const (
	PartAddr  KeyPart = iota // ipv4_addr / ipv6_addr
	PartProto                // inet_proto
	PartPort                 // inet_service
	PartAddr2                // a second address (hairpin, node source)
	PartNet                  // a prefix (needs an interval set)
)

// SetDef is one set of the helper table. Names are upstream IPVS mode's
// ipset names, so that rules, docs and users' scripts name the same
// objects; there is one table per family, and both use the same names.
type SetDef struct {
	Name string
	// IPSetType is upstream's ipset type, for reference ("": none upstream).
	IPSetType string
	Key       []KeyPart
	// Interval: the key ends in a prefix (nft "flags interval").
	Interval bool
	Comment  string
}

// Helper set names (upstream's ipset names).
const (
	SetClusterIP           = "KUBE-CLUSTER-IP"
	SetLoopBack            = "KUBE-LOOP-BACK"
	SetExternalIP          = "KUBE-EXTERNAL-IP"
	SetExternalIPLocal     = "KUBE-EXTERNAL-IP-LOCAL"
	SetLoadBalancer        = "KUBE-LOAD-BALANCER"
	SetLoadBalancerLocal   = "KUBE-LOAD-BALANCER-LOCAL"
	SetLoadBalancerFW      = "KUBE-LOAD-BALANCER-FW"
	SetLBSourceCIDR        = "KUBE-LOAD-BALANCER-SOURCE-CIDR"
	SetLBSourceIP          = "KUBE-LOAD-BALANCER-SOURCE-IP"
	SetNodePortTCP         = "KUBE-NODE-PORT-TCP"
	SetNodePortLocalTCP    = "KUBE-NODE-PORT-LOCAL-TCP"
	SetNodePortUDP         = "KUBE-NODE-PORT-UDP"
	SetNodePortLocalUDP    = "KUBE-NODE-PORT-LOCAL-UDP"
	SetNodePortSCTP        = "KUBE-NODE-PORT-SCTP-HASH"
	SetNodePortLocalSCTP   = "KUBE-NODE-PORT-LOCAL-SCTP-HASH"
	SetHealthCheckNodePort = "KUBE-HEALTH-CHECK-NODE-PORT"
	SetIPVSIPs             = "KUBE-IPVS-IPS"
	// SetLBNoNodeAccess has no ipset upstream, where each element is a
	// rule of KUBE-IPVS-OUT-FILTER (-s LB IP -m ipvs --vaddr LB IP ...
	// -j DROP): an nft rule cannot compare two fields of a packet, a
	// set lookup of both can.
	SetLBNoNodeAccess = "KUBE-LOAD-BALANCER-NO-NODE-ACCESS"
)

var (
	keyIPPort   = []KeyPart{PartAddr, PartProto, PartPort}
	keyIPPortIP = []KeyPart{PartAddr, PartProto, PartPort, PartAddr2}
	keyPort     = []KeyPart{PartPort}
)

// Sets are the helper table's sets. The comments say what each is for in
// our words; the types are what upstream's ipsets hold, as nft keys.
var Sets = []SetDef{
	{SetLoopBack, "hash:ip,port,ip", keyIPPortIP, false, "local endpoint . proto . port . same endpoint as source: hairpin traffic to masquerade"},
	{SetClusterIP, "hash:ip,port", keyIPPort, false, "ClusterIP . proto . port: to masquerade off-cluster clients (or all)"},
	{SetExternalIP, "hash:ip,port", keyIPPort, false, "external IP . proto . port of Cluster-policy services: masqueraded"},
	{SetExternalIPLocal, "hash:ip,port", keyIPPort, false, "external IP . proto . port of Local-policy services: source kept"},
	{SetLoadBalancer, "hash:ip,port", keyIPPort, false, "LoadBalancer IP . proto . port of every service"},
	{SetLoadBalancerFW, "hash:ip,port", keyIPPort, false, "LoadBalancer IP . proto . port with loadBalancerSourceRanges"},
	{SetLoadBalancerLocal, "hash:ip,port", keyIPPort, false, "LoadBalancer IP . proto . port of Local-policy services: source kept"},
	{SetLBSourceIP, "hash:ip,port,ip", keyIPPortIP, false, "LoadBalancer IP . proto . port . the LB IP as source: the node's own requests, allowed when a range holds the node"},
	{SetLBNoNodeAccess, "", keyIPPortIP, false, "LoadBalancer IP . proto . port . the LB IP as source: the node's own requests, dropped when no range holds the node"},
	{SetLBSourceCIDR, "hash:ip,port,net", []KeyPart{PartAddr, PartProto, PartPort, PartNet}, true, "LoadBalancer IP . proto . port . allowed source range"},
	{SetNodePortTCP, "bitmap:port", keyPort, false, "TCP NodePorts: masqueraded"},
	{SetNodePortLocalTCP, "bitmap:port", keyPort, false, "TCP NodePorts of Local-policy services: source kept"},
	{SetNodePortUDP, "bitmap:port", keyPort, false, "UDP NodePorts: masqueraded"},
	{SetNodePortLocalUDP, "bitmap:port", keyPort, false, "UDP NodePorts of Local-policy services: source kept"},
	{SetNodePortSCTP, "hash:ip,port", []KeyPart{PartAddr, PartPort}, false, "node address . SCTP NodePort: masqueraded"},
	{SetNodePortLocalSCTP, "hash:ip,port", []KeyPart{PartAddr, PartPort}, false, "node address . SCTP NodePort of Local-policy services: source kept"},
	{SetHealthCheckNodePort, "bitmap:port", keyPort, false, "healthCheckNodePorts: accepted in the filter"},
	{SetIPVSIPs, "hash:ip", []KeyPart{PartAddr}, false, "every address on kube-ipvs0: the filter rejects new connections to a port that is no service"},
}

// SetByName returns the helper set of that name.
func SetByName(name string) (SetDef, bool) {
	for _, s := range Sets {
		if s.Name == name {
			return s, true
		}
	}
	return SetDef{}, false
}

// NftType is the set's key type as nft spells it.
func (s SetDef) NftType(ipv6 bool) string {
	addr := "ipv4_addr"
	if ipv6 {
		addr = "ipv6_addr"
	}
	parts := make([]string, len(s.Key))
	for i, p := range s.Key {
		switch p {
		case PartAddr, PartAddr2, PartNet:
			parts[i] = addr
		case PartProto:
			parts[i] = "inet_proto"
		case PartPort:
			parts[i] = "inet_service"
		}
	}
	return strings.Join(parts, " . ")
}

// Element is one element of a helper set; which fields count depends on
// the set's key. It is comparable, so it keys maps.
type Element struct {
	Set string
	// V6 says which family's table holds it (port-only sets have no
	// address to tell).
	V6       bool
	Addr     netip.Addr
	Protocol model.Protocol
	Port     uint16
	Addr2    netip.Addr
	Net      netip.Prefix
}

// String is the element's key as nft prints it, e.g. "10.96.0.10 . tcp . 80".
func (e Element) String() string {
	def, _ := SetByName(e.Set)
	parts := make([]string, 0, len(def.Key))
	for _, p := range def.Key {
		switch p {
		case PartAddr:
			parts = append(parts, e.Addr.String())
		case PartProto:
			parts = append(parts, e.Protocol.Lower())
		case PartPort:
			parts = append(parts, strconv.Itoa(int(e.Port)))
		case PartAddr2:
			parts = append(parts, e.Addr2.String())
		case PartNet:
			parts = append(parts, e.Net.String())
		}
	}
	return strings.Join(parts, " . ")
}

// compareElements orders elements by set (in Sets order), then key.
func compareElements(a, b Element) int {
	if c := cmp.Compare(setIndex(a.Set), setIndex(b.Set)); c != 0 {
		return c
	}
	if a.V6 != b.V6 {
		if b.V6 {
			return -1
		}
		return 1
	}
	if c := a.Addr.Compare(b.Addr); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Protocol, b.Protocol); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Port, b.Port); c != 0 {
		return c
	}
	if c := a.Addr2.Compare(b.Addr2); c != 0 {
		return c
	}
	if c := a.Net.Addr().Compare(b.Net.Addr()); c != 0 {
		return c
	}
	return cmp.Compare(a.Net.Bits(), b.Net.Bits())
}

func setIndex(name string) int {
	for i, s := range Sets {
		if s.Name == name {
			return i
		}
	}
	return len(Sets)
}
