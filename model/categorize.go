package model

import (
	"net/netip"
	"slices"
)

// CategorizeEndpoints returns the endpoints for cluster-wide traffic, for node-local traffic,
// and whether the service port has any usable endpoint at all.
//
// It follows upstream kube-proxy's CategorizeEndpoints (pkg/proxy/topology.go,
// v1.33 and later) rule for rule:
//
//   - cluster is nil when the port never uses "Cluster" traffic policy, that
//     is when internalTrafficPolicy is Local and the port is not reachable
//     from outside (no NodePort, external IP or load balancer IP of the
//     endpoints' family). Otherwise it is never nil: the Ready endpoints
//     available for this node's topology or, when there are none, every
//     serving and terminating endpoint, topology ignored; possibly empty.
//   - local is nil when the port never uses "Local" traffic policy
//     (internalTrafficPolicy Local, or externalTrafficPolicy Local on a port
//     reachable from outside). Otherwise it is the Ready endpoints on this
//     node or, when there are none, this node's serving and terminating ones;
//     nil when there are neither. Topology never applies to it.
//   - allReachable is the union of the two: cluster itself when local is not
//     used, local itself when cluster is not used, cluster again when it is
//     known to hold every endpoint of local, else a merged list.
//   - hasAny reports whether a Ready or serving-terminating endpoint exists
//     anywhere in the cluster; it may be true while allReachable is empty.
//
// Endpoints that are neither Ready nor serving-and-terminating are never
// returned. Topology comes from the hints alone (see topologyMode):
// svc.TrafficDistribution is not consulted, as upstream kube-proxy reads
// only the hints that the EndpointSlice controller writes (for PreferClose,
// PreferSameZone, PreferSameNode or the topology-mode annotation alike).
// Node hints win over zone hints, as with upstream's
// PreferSameTrafficDistribution feature, GA and locked on since 1.35.
//
// eps should be one IP family's endpoints, as a backend programs them:
// upstream's ServicePort is per family, so only external and load balancer
// IPs of the endpoints' family make the port reachable from outside (with
// mixed families, those of either family count). Unlike upstream, the order of every result is deterministic: cluster and local
// keep the order of eps, and a merged allReachable is cluster followed by
// the endpoints of local not already in it.
func CategorizeEndpoints(svc *ServicePort, eps []Endpoint, node Node) (cluster, local []Endpoint, allReachable []Endpoint, hasAny bool) {
	if len(eps) == 0 {
		return nil, nil, nil, false
	}
	if svc == nil {
		svc = &ServicePort{}
	}
	usesCluster, usesLocal := usesClusterEndpoints(svc, eps), usesLocalEndpoints(svc, eps)

	mode := topologyNone
	if usesCluster {
		mode = topologyMode(eps, node)
		cluster = selectEndpoints(eps, func(ep Endpoint) bool {
			return ep.Ready && availableForTopology(ep, mode, node)
		})
		if len(cluster) == 0 {
			// Hints were already ignored if no Ready endpoint suited this
			// node or zone, so nothing is Ready anywhere: keep connections
			// alive on the serving terminating endpoints, wherever they are.
			cluster = selectEndpoints(eps, servingTerminating)
		}
		hasAny = len(cluster) > 0
	}
	if !usesLocal {
		return cluster, nil, cluster, hasAny
	}

	var localReady, localTerminating bool
	for _, ep := range eps {
		switch {
		case ep.Ready:
			hasAny = true
			localReady = localReady || ep.IsLocal(node.Name)
		case servingTerminating(ep):
			hasAny = true
			localTerminating = localTerminating || ep.IsLocal(node.Name)
		}
	}
	localUsesTerminating := false
	switch {
	case localReady:
		local = selectEndpoints(eps, func(ep Endpoint) bool { return ep.Ready && ep.IsLocal(node.Name) })
	case localTerminating:
		localUsesTerminating = true
		local = selectEndpoints(eps, func(ep Endpoint) bool { return servingTerminating(ep) && ep.IsLocal(node.Name) })
	}

	if !usesCluster {
		return nil, local, local, hasAny
	}
	if mode == topologyNone && !localUsesTerminating {
		// cluster holds every Ready endpoint and local only Ready ones, so
		// cluster already contains local.
		return cluster, local, cluster, hasAny
	}
	return cluster, local, unionEndpoints(cluster, local), hasAny
}

// servingTerminating is upstream's fallback condition: IsServing() && IsTerminating().
func servingTerminating(ep Endpoint) bool { return ep.Serving && ep.Terminating }

// externallyAccessible mirrors upstream ServicePort.ExternallyAccessible: a
// NodePort, or an external or load balancer IP. Upstream's ServicePort is per
// IP family, so only addresses of a family present in eps count.
func externallyAccessible(svc *ServicePort, eps []Endpoint) bool {
	if svc.NodePort != 0 {
		return true
	}
	var v4, v6 bool
	for _, ep := range eps {
		if ep.Addr.Unmap().Is4() {
			v4 = true
		} else {
			v6 = true
		}
	}
	ofFamily := func(a []netip.Addr) bool {
		return slices.ContainsFunc(a, func(ip netip.Addr) bool {
			if ip.Unmap().Is4() {
				return v4
			}
			return v6
		})
	}
	return ofFamily(svc.ExternalIPs) || ofFamily(svc.LoadBalancerIPs)
}

// usesClusterEndpoints mirrors upstream ServicePort.UsesClusterEndpoints:
// internal traffic policy Cluster, or any external traffic at all (even with
// externalTrafficPolicy Local, short-circuited traffic from the node itself
// uses the cluster endpoints).
func usesClusterEndpoints(svc *ServicePort, eps []Endpoint) bool {
	return !svc.InternalPolicyLocal || externallyAccessible(svc, eps)
}

// usesLocalEndpoints mirrors upstream ServicePort.UsesLocalEndpoints.
func usesLocalEndpoints(svc *ServicePort, eps []Endpoint) bool {
	return svc.InternalPolicyLocal || (svc.ExternalPolicyLocal && externallyAccessible(svc, eps))
}

// topology is how cluster traffic is restricted by hints (upstream's
// topology modes: "", PreferSameZone, PreferSameNode).
type topology int

const (
	topologyNone     topology = iota // every Ready endpoint
	topologySameZone                 // those hinted for this node's zone
	topologySameNode                 // those hinted for this node
)

// topologyMode is upstream's topologyModeFromHints. Only Ready endpoints
// count, and with none there is no topology. Node hints are used when
// every Ready endpoint has at least one and at least one Ready endpoint is
// hinted for this node; else zone hints, when every Ready endpoint has a
// zone hint and at least one is hinted for this node's zone (a node
// without a zone has none); else none. So incomplete node hints fall back
// to the zone hints, and incomplete zone hints to every endpoint.
func topologyMode(eps []Endpoint, node Node) topology {
	anyReady := false
	allNodeHints, forNode := true, false
	allZoneHints, forZone := true, false
	for _, ep := range eps {
		if !ep.Ready {
			continue
		}
		anyReady = true
		if len(ep.NodeHints) == 0 {
			allNodeHints = false
		} else if slices.Contains(ep.NodeHints, node.Name) {
			forNode = true
		}
		if len(ep.ZoneHints) == 0 {
			allZoneHints = false
		} else if slices.Contains(ep.ZoneHints, node.Zone) {
			forZone = true
		}
	}
	switch {
	case !anyReady:
		return topologyNone
	case allNodeHints && forNode:
		return topologySameNode
	case allZoneHints && forZone:
		return topologySameZone
	}
	return topologyNone
}

// availableForTopology is upstream's: whether ep may take this node's
// cluster traffic in mode (no fallback here: that is topologyMode's).
func availableForTopology(ep Endpoint, mode topology, node Node) bool {
	switch mode {
	case topologySameNode:
		return slices.Contains(ep.NodeHints, node.Name)
	case topologySameZone:
		return slices.Contains(ep.ZoneHints, node.Zone)
	}
	return true
}

// selectEndpoints is upstream's filterEndpoints: a new slice, never nil, of
// the endpoints keep accepts, in order.
func selectEndpoints(eps []Endpoint, keep func(Endpoint) bool) []Endpoint {
	out := make([]Endpoint, 0, len(eps))
	for _, ep := range eps {
		if keep(ep) {
			out = append(out, ep)
		}
	}
	return out
}

// unionEndpoints merges two endpoint lists by "ip:port", as upstream does
// through a map, but in a stable order: a, then what b adds.
func unionEndpoints(a, b []Endpoint) []Endpoint {
	out := make([]Endpoint, 0, len(a)+len(b))
	seen := make(map[string]bool, len(a)+len(b))
	for _, list := range [][]Endpoint{a, b} {
		for _, ep := range list {
			if k := ep.String(); !seen[k] {
				seen[k] = true
				out = append(out, ep)
			}
		}
	}
	return out
}
