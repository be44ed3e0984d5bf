// Package model is the proxy's view of the cluster, as both modes program
// it: immutable State snapshots (a ServicePort per Service port, its
// Endpoints, the Node) kept in persistent maps (PortMap), the
// ChangeTracker that tells which service ports changed between two
// States, and the endpoint selection both modes share
// (CategorizeEndpoints), as upstream. The sources build States (package
// source/kube); the sync loop (package proxier) hands them to a mode. It
// imports nothing of the project and knows nothing of the kernel or of
// Kubernetes' API types.
package model

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// Protocol is a Service port's L4 protocol as Kubernetes spells it.
type Protocol string

// The protocols kube-proxy programs.
const (
	TCP  Protocol = "TCP"
	UDP  Protocol = "UDP"
	SCTP Protocol = "SCTP"
)

// Number is the protocol's IP protocol number (IPPROTO_TCP, ...); TCP
// for any other value.
func (p Protocol) Number() uint8 {
	switch p {
	case UDP:
		return 17 // IPPROTO_UDP
	case SCTP:
		return 132 // IPPROTO_SCTP
	}
	return 6 // IPPROTO_TCP
}

// ParseProtocol accepts the Kubernetes spelling; empty means TCP, as the API defaults it.
func ParseProtocol(s string) (Protocol, error) {
	switch Protocol(s) {
	case "":
		return TCP, nil
	case TCP, UDP, SCTP:
		return Protocol(s), nil
	}
	return "", fmt.Errorf("unknown protocol %q (want TCP, UDP or SCTP)", s)
}

// Lower is the protocol as the chain-name hashes and nft spell it.
func (p Protocol) Lower() string { return strings.ToLower(string(p)) }

// ServicePortName names one port of one Service, as kube-proxy does.
type ServicePortName struct {
	Namespace, Name, Port string
}

// String is "namespace/name:port" (":port" left out for an unnamed port),
// the text iptables mode puts in its comments and hashes into chain names.
func (n ServicePortName) String() string {
	if n.Port == "" {
		return n.Namespace + "/" + n.Name
	}
	return n.Namespace + "/" + n.Name + ":" + n.Port
}

// Compare orders service port names as their String forms are ordered,
// without building them (sorting thousands of names by String allocates
// two strings per comparison).
func (n ServicePortName) Compare(o ServicePortName) int {
	var a, b [5]string
	return compareJoined(n.pieces(a[:0]), o.pieces(b[:0]))
}

// pieces appends the parts of n's String form.
func (n ServicePortName) pieces(buf []string) []string {
	buf = append(buf, n.Namespace, "/", n.Name)
	if n.Port != "" {
		buf = append(buf, ":", n.Port)
	}
	return buf
}

// compareJoined compares strings.Join(a, "") with strings.Join(b, "").
func compareJoined(a, b []string) int {
	var x, y string
	for {
		for x == "" && len(a) > 0 {
			x, a = a[0], a[1:]
		}
		for y == "" && len(b) > 0 {
			y, b = b[0], b[1:]
		}
		switch {
		case x == "" && y == "":
			return 0
		case x == "":
			return -1
		case y == "":
			return 1
		}
		k := min(len(x), len(y))
		if c := strings.Compare(x[:k], y[:k]); c != 0 {
			return c
		}
		x, y = x[k:], y[k:]
	}
}

// ServicePort is everything the backends need to know about one Service port.
// Addresses of both families live here; a backend picks its family's.
type ServicePort struct {
	Name     ServicePortName
	Protocol Protocol
	Port     uint16 // the Service's port
	NodePort uint16 // 0: none
	// NodePortHeldV4 and NodePortHeldV6 say that another Service holds
	// this NodePort in that IP family: it is programmed in the other one
	// only (see NodePortIn).
	NodePortHeldV4, NodePortHeldV6 bool

	ClusterIPs      []netip.Addr
	ExternalIPs     []netip.Addr
	LoadBalancerIPs []netip.Addr
	// LoadBalancerSourceRanges restricts who may reach the LoadBalancer IPs.
	LoadBalancerSourceRanges []netip.Prefix

	// AffinityTimeout > 0 means sessionAffinity: ClientIP with that timeout.
	AffinityTimeout time.Duration

	ExternalPolicyLocal bool // externalTrafficPolicy: Local
	InternalPolicyLocal bool // internalTrafficPolicy: Local
	HealthCheckNodePort uint16
	// TrafficDistribution is spec.trafficDistribution ("" or "PreferClose", ...).
	TrafficDistribution string
}

// Endpoint is one address:port serving a ServicePort.
type Endpoint struct {
	Addr     netip.Addr
	Port     uint16
	NodeName string
	Zone     string

	Ready       bool
	Serving     bool
	Terminating bool
	// ZoneHints is hints.forZones and NodeHints hints.forNodes (written
	// for trafficDistribution PreferSameNode); nil when the slice carries
	// none.
	ZoneHints []string
	NodeHints []string
}

// String is "ip:port" with brackets for IPv6, the form hashed into KUBE-SEP names.
func (e Endpoint) String() string {
	return netip.AddrPortFrom(e.Addr, e.Port).String()
}

// IsLocal reports whether the endpoint runs on the named node.
func (e Endpoint) IsLocal(node string) bool { return node != "" && e.NodeName == node }

// Node is what the proxy knows about the node it runs on.
type Node struct {
	Name     string
	Zone     string
	PodCIDRs []netip.Prefix
	// IPs are the node's addresses (from the Node object); may be empty.
	IPs []netip.Addr
	// Leaving is true while the node is being deleted or tainted for
	// removal: /healthz reports it so load balancers drain the node.
	Leaving bool
}

// State is one immutable snapshot handed to a backend: every Service port and
// its endpoints. Backends must not modify it. Its maps are persistent
// (PortMap): the next State of a source shares all it did not change with
// this one, and costs what changed.
type State struct {
	Node     Node
	Services PortMap[*ServicePort]
	// Endpoints holds every endpoint of a service port, whatever its
	// conditions, deduplicated and in a stable order.
	Endpoints PortMap[[]Endpoint]
	// ServiceCIDRs are the ranges of the cluster's ServiceCIDR objects
	// (networking.k8s.io/v1, spec.cidrs), masked, sorted and without
	// repeats; none when the source knows of none. The nftables mode drops
	// new connections to an address in them that no Service holds, as
	// upstream's nftables mode does.
	ServiceCIDRs []netip.Prefix
	// Changes, when its source keeps track: how this State differs from
	// the one before it of the same lineage.
	Changes StateChanges
}

// StateChanges relates a State to the previous one of its source (a
// Builder), so that a backend that programmed that one can look at the
// service ports that changed alone instead of comparing every one.
type StateChanges struct {
	// Lineage identifies the source; nil: the changes are not known.
	Lineage *Lineage
	// Gen counts the States of the lineage, from 1.
	Gen uint64
	// Ports are the service ports added, changed or removed since the
	// State of generation Gen-1, whose Node was the same unless
	// NodeChanged.
	Ports       []ServicePortName
	NodeChanged bool
	// ServiceCIDRsChanged: the ServiceCIDRs differ from those of the
	// State of generation Gen-1 (the Ports remain valid).
	ServiceCIDRsChanged bool
}

// Lineage is the identity of a source of States (compared by address).
type Lineage struct{ _ byte }

// Follows reports whether d describes the change from the State of
// generation gen of lineage l.
func (d StateChanges) Follows(l *Lineage, gen uint64) bool {
	return d.Lineage != nil && d.Lineage == l && gen != 0 && d.Gen == gen+1 && !d.NodeChanged
}

// NewState returns an empty State.
func NewState() *State { return &State{} }

// SortedNames lists the service ports in a stable order, so everything built
// from a State is deterministic.
func (s *State) SortedNames() []ServicePortName { return s.Services.SortedKeys() }

// NodePortIn is the NodePort to program in one IP family: 0 when there is
// none, or another Service holds it in that family.
func (s *ServicePort) NodePortIn(ipv6 bool) uint16 {
	if ipv6 && s.NodePortHeldV6 || !ipv6 && s.NodePortHeldV4 {
		return 0
	}
	return s.NodePort
}

// Equal reports whether two service ports program the same rules.
func (s *ServicePort) Equal(o *ServicePort) bool {
	if s == o {
		return true
	}
	if s == nil || o == nil {
		return false
	}
	return s.Name == o.Name && s.Protocol == o.Protocol && s.Port == o.Port && s.NodePort == o.NodePort &&
		s.NodePortHeldV4 == o.NodePortHeldV4 && s.NodePortHeldV6 == o.NodePortHeldV6 &&
		slices.Equal(s.ClusterIPs, o.ClusterIPs) && slices.Equal(s.ExternalIPs, o.ExternalIPs) &&
		slices.Equal(s.LoadBalancerIPs, o.LoadBalancerIPs) &&
		slices.Equal(s.LoadBalancerSourceRanges, o.LoadBalancerSourceRanges) &&
		s.AffinityTimeout == o.AffinityTimeout && s.ExternalPolicyLocal == o.ExternalPolicyLocal &&
		s.InternalPolicyLocal == o.InternalPolicyLocal && s.HealthCheckNodePort == o.HealthCheckNodePort &&
		s.TrafficDistribution == o.TrafficDistribution
}

// EndpointsEqual reports whether two endpoint lists are the same, in order.
func EndpointsEqual(a, b []Endpoint) bool {
	return slices.EqualFunc(a, b, func(x, y Endpoint) bool {
		return x.Addr == y.Addr && x.Port == y.Port && x.NodeName == y.NodeName && x.Zone == y.Zone &&
			x.Ready == y.Ready && x.Serving == y.Serving && x.Terminating == y.Terminating &&
			slices.Equal(x.ZoneHints, y.ZoneHints) && slices.Equal(x.NodeHints, y.NodeHints)
	})
}

// Equal reports whether two node descriptions program the same rules
// (Leaving changes no rule).
func (n Node) Equal(o Node) bool {
	return n.Name == o.Name && n.Zone == o.Zone && slices.Equal(n.PodCIDRs, o.PodCIDRs) && slices.Equal(n.IPs, o.IPs)
}
