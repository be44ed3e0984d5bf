package model

import (
	"net/netip"
	"slices"
	"testing"
)

// Upstream references in the case comments are to kubernetes pkg/proxy
// (v1.33+): topology.go (CategorizeEndpoints, topologyModeFromHints,
// availableForTopology, filterEndpoints) and serviceport.go
// (ExternallyAccessible, UsesClusterEndpoints, UsesLocalEndpoints).

const (
	thisNode  = "node-a"
	otherNode = "node-b"
	thisZone  = "zone-a"
	otherZone = "zone-b"
)

// epState is an endpoint's conditions.
type epState int

const (
	ready            epState = iota // ready, serving
	servingTerm                     // not ready, serving, terminating
	term                            // not ready, not serving, terminating
	notReady                        // not ready, not serving
	servingNotReady                 // not ready, serving, not terminating
	readyNotServing                 // ready, but serving false (inconsistent data)
	readyTerminating                // ready, serving, terminating
)

// ep4 builds 10.0.0.<last>:80 on node with the given zone hints.
func ep4(last byte, node string, s epState, hints ...string) Endpoint {
	return mkEp(netip.AddrFrom4([4]byte{10, 0, 0, last}), node, s, hints)
}

// ep6 builds [fd00::<last>]:80.
func ep6(last byte, node string, s epState, hints ...string) Endpoint {
	var b [16]byte
	b[0], b[1], b[15] = 0xfd, 0x00, last
	return mkEp(netip.AddrFrom16(b), node, s, hints)
}

func mkEp(a netip.Addr, node string, s epState, hints []string) Endpoint {
	e := Endpoint{Addr: a, Port: 80, NodeName: node, ZoneHints: hints}
	switch s {
	case ready:
		e.Ready, e.Serving = true, true
	case servingTerm:
		e.Serving, e.Terminating = true, true
	case term:
		e.Terminating = true
	case notReady:
	case servingNotReady:
		e.Serving = true
	case readyNotServing:
		e.Ready = true
	case readyTerminating:
		e.Ready, e.Serving, e.Terminating = true, true, true
	}
	return e
}

// lasts turns endpoints into their last address bytes; nil stays nil and an
// empty non-nil slice stays empty non-nil, so the tests pin upstream's
// nil-versus-empty results.
func lasts(eps []Endpoint) []int {
	if eps == nil {
		return nil
	}
	out := []int{}
	for _, e := range eps {
		b := e.Addr.AsSlice()
		out = append(out, int(b[len(b)-1]))
	}
	return out
}

// nodeHinted adds hints.forNodes to an endpoint.
func nodeHinted(e Endpoint, nodes ...string) Endpoint {
	e.NodeHints = nodes
	return e
}

func ints(v ...int) []int {
	if v == nil {
		return []int{}
	}
	return v
}

func sameList(got, want []int) bool {
	return (got == nil) == (want == nil) && slices.Equal(got, want)
}

var (
	svcCluster = &ServicePort{Port: 80}
	// iTP Local on a ClusterIP-only port: never uses Cluster endpoints.
	svcITPLocal = &ServicePort{Port: 80, InternalPolicyLocal: true}
	// iTP Local on a NodePort: still uses Cluster endpoints (for external traffic).
	svcITPLocalNodePort = &ServicePort{Port: 80, NodePort: 30080, InternalPolicyLocal: true}
	svcETPLocalNodePort = &ServicePort{Port: 80, NodePort: 30080, ExternalPolicyLocal: true}
	svcETPLocalLB       = &ServicePort{Port: 80, ExternalPolicyLocal: true,
		LoadBalancerIPs: []netip.Addr{netip.MustParseAddr("192.0.2.1")}}
	svcETPLocalExtIP = &ServicePort{Port: 80, ExternalPolicyLocal: true,
		ExternalIPs: []netip.Addr{netip.MustParseAddr("192.0.2.2")}}
	// eTP Local but nothing external: upstream's UsesLocalEndpoints is false.
	svcETPLocalInternalOnly = &ServicePort{Port: 80, ExternalPolicyLocal: true}
	svcBothLocalNodePort    = &ServicePort{Port: 80, NodePort: 30080, ExternalPolicyLocal: true, InternalPolicyLocal: true}
	// IPv4-only external addresses, for the per-family cases.
	svcITPLocalExtIPv4 = &ServicePort{Port: 80, InternalPolicyLocal: true,
		ExternalIPs: []netip.Addr{netip.MustParseAddr("192.0.2.2")}}
	svcETPLocalLBv4 = &ServicePort{Port: 80, ExternalPolicyLocal: true,
		LoadBalancerIPs: []netip.Addr{netip.MustParseAddr("192.0.2.1")}}
	svcETPLocalLBv6 = &ServicePort{Port: 80, ExternalPolicyLocal: true,
		LoadBalancerIPs: []netip.Addr{netip.MustParseAddr("2001:db8::1")}}
	svcPreferClose = &ServicePort{Port: 80, TrafficDistribution: "PreferClose"}
)

func TestCategorizeEndpoints(t *testing.T) {
	node := Node{Name: thisNode, Zone: thisZone}
	noZone := Node{Name: thisNode}

	tests := []struct {
		name string
		svc  *ServicePort
		node Node
		eps  []Endpoint

		cluster, local, all []int // nil: expect a nil slice; ints(): expect empty non-nil
		hasAny              bool
	}{
		// --- CategorizeEndpoints: empty input ---
		{
			// CategorizeEndpoints: "If there are no endpoints, we have nothing to
			// categorize" - everything nil, whatever the policies.
			name: "no endpoints", svc: svcBothLocalNodePort, node: node,
		},
		{
			// A nil *ServicePort reads as the zero port: both policies Cluster.
			name: "nil service is cluster policy", svc: nil, node: node,
			eps:     []Endpoint{ep4(1, otherNode, ready)},
			cluster: ints(1), all: ints(1), hasAny: true,
		},

		// --- Cluster endpoints: Ready, then serving+terminating ---
		{
			// filterEndpoints with IsReady(): only Ready endpoints serve; the
			// serving-terminating fallback is not used while any is Ready.
			name: "ready only", svc: svcCluster, node: node,
			eps: []Endpoint{
				ep4(1, otherNode, ready), ep4(2, thisNode, ready), ep4(3, otherNode, servingTerm),
				ep4(4, otherNode, term), ep4(5, otherNode, notReady), ep4(6, otherNode, servingNotReady),
			},
			cluster: ints(1, 2), all: ints(1, 2), hasAny: true,
		},
		{
			// IsReady() alone decides: a ready endpoint counts even if it also
			// says terminating (or, inconsistently, not serving).
			name: "ready flag alone decides", svc: svcCluster, node: node,
			eps:     []Endpoint{ep4(1, otherNode, readyTerminating), ep4(2, otherNode, readyNotServing), ep4(3, otherNode, servingTerm)},
			cluster: ints(1, 2), all: ints(1, 2), hasAny: true,
		},
		{
			// "If we didn't get any endpoints, try again using terminating
			// endpoints": IsServing() && IsTerminating().
			name: "fallback to serving terminating", svc: svcCluster, node: node,
			eps:     []Endpoint{ep4(1, otherNode, servingTerm), ep4(2, thisNode, servingTerm), ep4(3, otherNode, term), ep4(4, otherNode, notReady)},
			cluster: ints(1, 2), all: ints(1, 2), hasAny: true,
		},
		{
			// Never non-serving endpoints, nor serving ones that are not
			// terminating (not ready and not terminating means "not yet").
			// clusterEndpoints is the (empty, non-nil) filterEndpoints result.
			name: "nothing usable", svc: svcCluster, node: node,
			eps:     []Endpoint{ep4(1, otherNode, term), ep4(2, otherNode, notReady), ep4(3, thisNode, servingNotReady)},
			cluster: ints(), all: ints(), hasAny: false,
		},

		// --- internalTrafficPolicy Local ---
		{
			// UsesClusterEndpoints() is false (iTP Local, not ExternallyAccessible):
			// clusterEndpoints stays nil; allReachableEndpoints = localEndpoints.
			name: "iTP local: local ready only", svc: svcITPLocal, node: node,
			eps:   []Endpoint{ep4(1, otherNode, ready), ep4(2, thisNode, ready), ep4(3, thisNode, servingTerm)},
			local: ints(2), all: ints(2), hasAny: true,
		},
		{
			// The local pre-scan sets hasAnyEndpoints for Ready endpoints
			// anywhere, even when none is local: localEndpoints stays nil.
			name: "iTP local: only remote ready", svc: svcITPLocal, node: node,
			eps:    []Endpoint{ep4(1, otherNode, ready)},
			hasAny: true,
		},
		{
			// Local falls back to serving-terminating on its own: the
			// remote Ready endpoint does not stop it.
			name: "iTP local: local serving terminating, remote ready", svc: svcITPLocal, node: node,
			eps:   []Endpoint{ep4(1, otherNode, ready), ep4(2, thisNode, servingTerm), ep4(3, thisNode, term)},
			local: ints(2), all: ints(2), hasAny: true,
		},
		{
			// Pre-scan: serving-terminating endpoints anywhere also make
			// hasAnyEndpoints true.
			name: "iTP local: only remote serving terminating", svc: svcITPLocal, node: node,
			eps:    []Endpoint{ep4(1, otherNode, servingTerm)},
			hasAny: true,
		},
		{
			// Pre-scan finds nothing usable anywhere.
			name: "iTP local: nothing usable", svc: svcITPLocal, node: node,
			eps: []Endpoint{ep4(1, thisNode, term), ep4(2, otherNode, notReady), ep4(3, thisNode, servingNotReady)},
		},
		{
			// Endpoint.IsLocal: an endpoint without a node name is never local.
			name: "iTP local: endpoint without node name", svc: svcITPLocal, node: node,
			eps:    []Endpoint{ep4(1, "", ready)},
			hasAny: true,
		},
		{
			// UsesClusterEndpoints() is true when ExternallyAccessible (a
			// NodePort), even with iTP Local: both lists; local has only Ready
			// endpoints and there is no topology, so allReachable = cluster.
			name: "iTP local with NodePort uses cluster too", svc: svcITPLocalNodePort, node: node,
			eps:     []Endpoint{ep4(1, otherNode, ready), ep4(2, thisNode, ready)},
			cluster: ints(1, 2), local: ints(2), all: ints(1, 2), hasAny: true,
		},

		// --- externalTrafficPolicy Local ---
		{
			// UsesLocalEndpoints(): eTP Local and ExternallyAccessible via NodePort.
			// "clusterEndpoints must be a superset of localEndpoints" shortcut.
			name: "eTP local NodePort", svc: svcETPLocalNodePort, node: node,
			eps:     []Endpoint{ep4(1, otherNode, ready), ep4(2, thisNode, ready), ep4(3, thisNode, servingTerm)},
			cluster: ints(1, 2), local: ints(2), all: ints(1, 2), hasAny: true,
		},
		{
			// ExternallyAccessible via a load balancer IP.
			name: "eTP local LoadBalancer IP", svc: svcETPLocalLB, node: node,
			eps:     []Endpoint{ep4(1, otherNode, ready), ep4(2, thisNode, ready)},
			cluster: ints(1, 2), local: ints(2), all: ints(1, 2), hasAny: true,
		},
		{
			// ExternallyAccessible via an external IP.
			name: "eTP local external IP", svc: svcETPLocalExtIP, node: node,
			eps:     []Endpoint{ep4(1, otherNode, ready), ep4(2, thisNode, ready)},
			cluster: ints(1, 2), local: ints(2), all: ints(1, 2), hasAny: true,
		},
		{
			// UsesLocalEndpoints() needs ExternallyAccessible: eTP Local alone
			// does not compute local endpoints.
			name: "eTP local without external access", svc: svcETPLocalInternalOnly, node: node,
			eps:     []Endpoint{ep4(1, otherNode, ready), ep4(2, thisNode, ready)},
			cluster: ints(1, 2), all: ints(1, 2), hasAny: true,
		},
		{
			// eTP Local with no local endpoint: localEndpoints nil, cluster
			// still serves (short-circuited node traffic).
			name: "eTP local no local endpoint", svc: svcETPLocalNodePort, node: node,
			eps:     []Endpoint{ep4(1, otherNode, ready)},
			cluster: ints(1), all: ints(1), hasAny: true,
		},
		{
			// Cluster and local fall back independently: cluster has Ready
			// remote endpoints, local only a serving-terminating one, so
			// useServingTerminatingEndpoints forces the merge.
			name: "eTP local: local terminating merged", svc: svcETPLocalNodePort, node: node,
			eps:     []Endpoint{ep4(1, otherNode, ready), ep4(2, thisNode, servingTerm), ep4(3, otherNode, servingTerm)},
			cluster: ints(1), local: ints(2), all: ints(1, 2), hasAny: true,
		},
		{
			// No Ready endpoint anywhere: both fall back; the merge dedups
			// the local endpoint that is in both lists.
			name: "eTP local: all terminating", svc: svcETPLocalNodePort, node: node,
			eps:     []Endpoint{ep4(1, otherNode, servingTerm), ep4(2, thisNode, servingTerm), ep4(3, thisNode, term)},
			cluster: ints(1, 2), local: ints(2), all: ints(1, 2), hasAny: true,
		},
		{
			// Local prefers Ready local endpoints over serving-terminating ones.
			name: "eTP local: local ready wins", svc: svcETPLocalNodePort, node: node,
			eps:     []Endpoint{ep4(1, thisNode, servingTerm), ep4(2, thisNode, ready)},
			cluster: ints(2), local: ints(2), all: ints(2), hasAny: true,
		},
		{
			// Both policies Local with a NodePort: both lists computed.
			name: "iTP and eTP local NodePort", svc: svcBothLocalNodePort, node: node,
			eps:     []Endpoint{ep4(1, otherNode, ready), ep4(2, thisNode, servingTerm)},
			cluster: ints(1), local: ints(2), all: ints(1, 2), hasAny: true,
		},
		{
			// Nothing usable with both lists in use: cluster empty (non-nil),
			// local nil, merge of nothing is empty.
			name: "eTP local: nothing usable", svc: svcETPLocalNodePort, node: node,
			eps:     []Endpoint{ep4(1, thisNode, term), ep4(2, otherNode, notReady)},
			cluster: ints(), all: ints(), hasAny: false,
		},

		// --- per-family ExternallyAccessible (upstream ServicePort is per family) ---
		{
			// The IPv4 external IP does not make the IPv6 service port
			// externally accessible: cluster not used.
			name: "family: iTP local, v4 external IP, v6 endpoints", svc: svcITPLocalExtIPv4, node: node,
			eps:   []Endpoint{ep6(1, otherNode, ready), ep6(2, thisNode, ready)},
			local: ints(2), all: ints(2), hasAny: true,
		},
		{
			// Same port, IPv4 endpoints: externally accessible, cluster used.
			name: "family: iTP local, v4 external IP, v4 endpoints", svc: svcITPLocalExtIPv4, node: node,
			eps:     []Endpoint{ep4(1, otherNode, ready), ep4(2, thisNode, ready)},
			cluster: ints(1, 2), local: ints(2), all: ints(1, 2), hasAny: true,
		},
		{
			// eTP Local with only an IPv4 LB IP: local not used for IPv6.
			name: "family: eTP local, v4 LB IP, v6 endpoints", svc: svcETPLocalLBv4, node: node,
			eps:     []Endpoint{ep6(1, otherNode, ready), ep6(2, thisNode, ready)},
			cluster: ints(1, 2), all: ints(1, 2), hasAny: true,
		},
		{
			// eTP Local with an IPv6 LB IP: local used for IPv6.
			name: "family: eTP local, v6 LB IP, v6 endpoints", svc: svcETPLocalLBv6, node: node,
			eps:     []Endpoint{ep6(1, otherNode, ready), ep6(2, thisNode, ready)},
			cluster: ints(1, 2), local: ints(2), all: ints(1, 2), hasAny: true,
		},

		// --- topology: zone hints (topologyModeFromHints / availableForTopology) ---
		{
			// Every Ready endpoint hinted, one for this zone: PreferSameZone
			// mode; only endpoints hinted for this zone serve cluster traffic.
			name: "zone hints used", svc: svcCluster, node: node,
			eps:     []Endpoint{ep4(1, otherNode, ready, thisZone), ep4(2, otherNode, ready, otherZone), ep4(3, otherNode, ready, thisZone)},
			cluster: ints(1, 3), all: ints(1, 3), hasAny: true,
		},
		{
			// ZoneHints().Has(zone): any of several hints may match.
			name: "zone hints: several zones per endpoint", svc: svcCluster, node: node,
			eps:     []Endpoint{ep4(1, otherNode, ready, otherZone, thisZone), ep4(2, otherNode, ready, otherZone)},
			cluster: ints(1), all: ints(1), hasAny: true,
		},
		{
			// "one or more endpoints is missing a zone hint": all Ready serve.
			name: "zone hints: a ready endpoint without hints", svc: svcCluster, node: node,
			eps:     []Endpoint{ep4(1, otherNode, ready, thisZone), ep4(2, otherNode, ready)},
			cluster: ints(1, 2), all: ints(1, 2), hasAny: true,
		},
		{
			// Only Ready endpoints are checked for hints: an unhinted
			// terminating endpoint does not disable topology.
			name: "zone hints: unhinted non-ready endpoint ignored", svc: svcCluster, node: node,
			eps:     []Endpoint{ep4(1, otherNode, ready, thisZone), ep4(2, otherNode, ready, otherZone), ep4(3, otherNode, servingTerm)},
			cluster: ints(1), all: ints(1), hasAny: true,
		},
		{
			// "no hints were provided for zone": all Ready serve.
			name: "zone hints: none for this zone", svc: svcCluster, node: node,
			eps:     []Endpoint{ep4(1, otherNode, ready, otherZone), ep4(2, otherNode, ready, "zone-c")},
			cluster: ints(1, 2), all: ints(1, 2), hasAny: true,
		},
		{
			// Only Ready endpoints count as hinted for the zone: a
			// serving-terminating one hinted for it does not enable topology.
			name: "zone hints: only a non-ready endpoint for this zone", svc: svcCluster, node: node,
			eps:     []Endpoint{ep4(1, otherNode, ready, otherZone), ep4(2, otherNode, servingTerm, thisZone)},
			cluster: ints(1), all: ints(1), hasAny: true,
		},
		{
			// "node is missing label" topology.kubernetes.io/zone: all Ready serve.
			name: "zone hints: node without zone", svc: svcCluster, node: noZone,
			eps:     []Endpoint{ep4(1, otherNode, ready, thisZone), ep4(2, otherNode, ready, otherZone)},
			cluster: ints(1, 2), all: ints(1, 2), hasAny: true,
		},
		{
			// The serving-terminating fallback ignores topology ("the problem
			// at this point must be that there are no ready endpoints anywhere").
			name: "zone hints: terminating fallback ignores topology", svc: svcCluster, node: node,
			eps:     []Endpoint{ep4(1, otherNode, servingTerm, otherZone), ep4(2, otherNode, servingTerm, thisZone)},
			cluster: ints(1, 2), all: ints(1, 2), hasAny: true,
		},
		{
			// kube-proxy reads hints, not spec.trafficDistribution: hints are
			// honoured with no trafficDistribution (e.g. the topology-mode
			// annotation made the controller write them) ...
			name: "zone hints: used without trafficDistribution", svc: svcCluster, node: node,
			eps:     []Endpoint{ep4(1, otherNode, ready, thisZone), ep4(2, otherNode, ready, otherZone)},
			cluster: ints(1), all: ints(1), hasAny: true,
		},
		{
			// ... and trafficDistribution without hints changes nothing.
			name: "zone hints: PreferClose without hints", svc: svcPreferClose, node: node,
			eps:     []Endpoint{ep4(1, otherNode, ready), ep4(2, otherNode, ready)},
			cluster: ints(1, 2), all: ints(1, 2), hasAny: true,
		},
		{
			// Topology never filters localEndpoints; with topology on, the
			// lists are merged (topologyMode != ""), so the local endpoint
			// hinted elsewhere is still reachable.
			name: "zone hints with eTP local: merged", svc: svcETPLocalNodePort, node: node,
			eps:     []Endpoint{ep4(1, otherNode, ready, thisZone), ep4(2, thisNode, ready, otherZone)},
			cluster: ints(1), local: ints(2), all: ints(1, 2), hasAny: true,
		},
		{
			// Merge path even when local is already in cluster: no duplicate.
			name: "zone hints with eTP local: local in cluster", svc: svcETPLocalNodePort, node: node,
			eps:     []Endpoint{ep4(1, otherNode, ready, otherZone), ep4(2, thisNode, ready, thisZone)},
			cluster: ints(2), local: ints(2), all: ints(2), hasAny: true,
		},
		{
			// iTP Local on a ClusterIP port: topology is never computed
			// (only inside UsesClusterEndpoints) and local ignores hints.
			name: "zone hints with iTP local", svc: svcITPLocal, node: node,
			eps:   []Endpoint{ep4(1, otherNode, ready, thisZone), ep4(2, thisNode, ready, otherZone)},
			local: ints(2), all: ints(2), hasAny: true,
		},

		// --- topology: node hints (PreferSameNode; upstream's
		// PreferSameTrafficDistribution, locked on) ---
		{
			// Upstream "PreferSameNode available": every Ready endpoint has
			// node hints and one is for this node: only it, though two are
			// hinted for this zone.
			name: "node hints used", svc: svcCluster, node: node,
			eps: []Endpoint{
				nodeHinted(ep4(1, thisNode, ready, thisZone), thisNode), nodeHinted(ep4(2, otherNode, ready, otherZone), otherNode),
				nodeHinted(ep4(3, "node-c", ready, "zone-c"), "node-c"), nodeHinted(ep4(4, "node-d", ready, thisZone), "node-d"),
			},
			cluster: ints(1), all: ints(1), hasAny: true,
		},
		{
			// Upstream "PreferSameNode ignored if some endpoints unhinted":
			// one Ready endpoint with no hints at all: every Ready one.
			name: "node hints: a ready endpoint without hints", svc: svcCluster, node: node,
			eps: []Endpoint{
				nodeHinted(ep4(1, thisNode, ready, thisZone), thisNode), ep4(2, otherNode, ready),
				nodeHinted(ep4(3, "node-c", ready, "zone-c"), "node-c"), nodeHinted(ep4(4, "node-d", ready, thisZone), "node-d"),
			},
			cluster: ints(1, 2, 3, 4), all: ints(1, 2, 3, 4), hasAny: true,
		},
		{
			// Upstream "PreferSameNode falls back to PreferSameZone if no
			// endpoint for node": the zone's endpoints.
			name: "node hints: none for this node, zone hints used", svc: svcCluster, node: node,
			eps: []Endpoint{
				nodeHinted(ep4(1, otherNode, ready, thisZone), otherNode), nodeHinted(ep4(2, "node-c", ready, "zone-c"), "node-c"),
				nodeHinted(ep4(3, "node-d", ready, thisZone), "node-d"),
			},
			cluster: ints(1, 3), all: ints(1, 3), hasAny: true,
		},
		{
			// Incomplete node hints fall back to complete zone hints.
			name: "node hints: a ready endpoint without node hints, zone hints used", svc: svcCluster, node: node,
			eps: []Endpoint{
				nodeHinted(ep4(1, thisNode, ready, thisZone), thisNode), ep4(2, otherNode, ready, thisZone),
				nodeHinted(ep4(3, "node-c", ready, "zone-c"), "node-c"),
			},
			cluster: ints(1, 2), all: ints(1, 2), hasAny: true,
		},
		{
			// Node hints need no zone: neither on the node nor in hints.
			name: "node hints without zones", svc: svcCluster, node: noZone,
			eps:     []Endpoint{nodeHinted(ep4(1, thisNode, ready), thisNode), nodeHinted(ep4(2, otherNode, ready), otherNode)},
			cluster: ints(1), all: ints(1), hasAny: true,
		},
		{
			// Node hints, none for this node, and no zone hints: every
			// Ready endpoint.
			name: "node hints: none for this node, no zone hints", svc: svcCluster, node: node,
			eps:     []Endpoint{nodeHinted(ep4(1, otherNode, ready), otherNode), nodeHinted(ep4(2, "node-c", ready), "node-c")},
			cluster: ints(1, 2), all: ints(1, 2), hasAny: true,
		},
		{
			// A hint names nodes, not where the endpoint runs: a remote
			// endpoint hinted for this node (several nodes per endpoint)
			// takes its traffic.
			name: "node hints: remote endpoint hinted for this node", svc: svcCluster, node: node,
			eps: []Endpoint{
				nodeHinted(ep4(1, otherNode, ready), otherNode, thisNode), nodeHinted(ep4(2, thisNode, ready), "node-c"),
				nodeHinted(ep4(3, "node-c", ready), "node-c"),
			},
			cluster: ints(1), all: ints(1), hasAny: true,
		},
		{
			// Only Ready endpoints count: a serving-terminating endpoint
			// without hints does not turn node hints off, and one hinted
			// for this node does not turn them on.
			name: "node hints: non-ready endpoints ignored", svc: svcCluster, node: node,
			eps: []Endpoint{
				nodeHinted(ep4(1, thisNode, ready), thisNode), nodeHinted(ep4(2, otherNode, ready), otherNode), ep4(3, otherNode, servingTerm),
			},
			cluster: ints(1), all: ints(1), hasAny: true,
		},
		{
			name: "node hints: only a non-ready endpoint for this node", svc: svcCluster, node: node,
			eps:     []Endpoint{nodeHinted(ep4(1, otherNode, ready), otherNode), nodeHinted(ep4(2, thisNode, servingTerm), thisNode)},
			cluster: ints(1), all: ints(1), hasAny: true,
		},
		{
			// No Ready endpoint: the serving-terminating fallback ignores
			// node hints too.
			name: "node hints: terminating fallback ignores topology", svc: svcCluster, node: node,
			eps:     []Endpoint{nodeHinted(ep4(1, otherNode, servingTerm), otherNode), nodeHinted(ep4(2, thisNode, servingTerm), thisNode)},
			cluster: ints(1, 2), all: ints(1, 2), hasAny: true,
		},
		{
			// Topology never filters local endpoints: with eTP Local the
			// local endpoint hinted for another node is still reachable
			// (merged).
			name: "node hints with eTP local: merged", svc: svcETPLocalNodePort, node: node,
			eps:     []Endpoint{nodeHinted(ep4(1, otherNode, ready), thisNode), nodeHinted(ep4(2, thisNode, ready), otherNode)},
			cluster: ints(1), local: ints(2), all: ints(1, 2), hasAny: true,
		},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := slices.Clone(tt.eps)
			cluster, local, all, hasAny := CategorizeEndpoints(tt.svc, tt.eps, tt.node)
			if got := lasts(cluster); !sameList(got, tt.cluster) {
				t.Errorf("cluster = %#v, want %#v", got, tt.cluster)
			}
			if got := lasts(local); !sameList(got, tt.local) {
				t.Errorf("local = %#v, want %#v", got, tt.local)
			}
			if got := lasts(all); !sameList(got, tt.all) {
				t.Errorf("allReachable = %#v, want %#v", got, tt.all)
			}
			if hasAny != tt.hasAny {
				t.Errorf("hasAny = %v, want %v", hasAny, tt.hasAny)
			}
			// Invariant (upstream's doc comment): allReachable is the union
			// of cluster and local, each endpoint once.
			union := map[string]bool{}
			for _, e := range append(slices.Clone(cluster), local...) {
				union[e.String()] = true
			}
			seen := map[string]bool{}
			for _, e := range all {
				if seen[e.String()] || !union[e.String()] {
					t.Errorf("allReachable %v is not the union of %v and %v", all, cluster, local)
				}
				seen[e.String()] = true
			}
			if len(seen) != len(union) {
				t.Errorf("allReachable %v is not the union of %v and %v", all, cluster, local)
			}
			if !EndpointsEqual(in, tt.eps) {
				t.Errorf("input modified: %v, was %v", tt.eps, in)
			}
		})
	}
}

// A merged allReachable does not depend on map iteration (upstream's does):
// cluster first, then what local adds, every time.
func TestCategorizeEndpointsStableMerge(t *testing.T) {
	node := Node{Name: thisNode, Zone: thisZone}
	var eps []Endpoint
	for i := byte(1); i <= 20; i++ {
		n, z := otherNode, thisZone
		if i%3 == 0 {
			n, z = thisNode, otherZone
		}
		eps = append(eps, ep4(i, n, ready, z))
	}
	_, _, first, _ := CategorizeEndpoints(svcETPLocalNodePort, eps, node)
	want := []int{1, 2, 4, 5, 7, 8, 10, 11, 13, 14, 16, 17, 19, 20, 3, 6, 9, 12, 15, 18}
	if got := lasts(first); !slices.Equal(got, want) {
		t.Fatalf("allReachable = %v, want %v", got, want)
	}
	for range 50 {
		_, _, again, _ := CategorizeEndpoints(svcETPLocalNodePort, eps, node)
		if !EndpointsEqual(first, again) {
			t.Fatalf("allReachable order changed: %v then %v", first, again)
		}
	}
}
