package proxy

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

// Topology-aware routing with real traffic (issue 3, item 9), as upstream's
// CategorizeEndpoints: zone hints (hints.forZones, written by the
// EndpointSlice controller for trafficDistribution PreferClose or the
// topology-mode annotation) keep ClusterIP traffic on the endpoints hinted
// for this node's zone (its topology.kubernetes.io/zone label) unless a
// Ready endpoint has no hints, or no Ready endpoint is hinted for the zone:
// then every endpoint is used.

// policyNodeYAML is the Node object of the state, in zone.
func policyNodeYAML(zone string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Node
metadata:
  name: %s
  labels:
    kubernetes.io/hostname: %[1]s
    topology.kubernetes.io/zone: %s
status:
  addresses:
  - {type: InternalIP, address: %s}
  - {type: InternalIP, address: %q}
`, nodeName, zone, sandbox.NodeIPv4.Addr(), sandbox.NodeIPv6.Addr())
}

// policyHinted is a Ready endpoint in zone, hinted for the zones given.
func policyHinted(p sandbox.Pod, zone string, hints ...string) policyEndpoint {
	ep := policyReady(p, "")
	ep.zone, ep.hints = zone, hints
	return ep
}

func TestPolicyTopologyHints(t *testing.T) {
	t.Parallel()
	svc := func(name, v4 string) policyService {
		return policyService{
			name: name, clusterIPv4: netip.MustParseAddr(v4),
			ports: []policyPort{policyHTTP}, trafficDistribution: "PreferClose",
		}
	}
	tests := []struct {
		name string
		svc  policyService
		eps  []policyEndpoint
		want []sandbox.Pod // in zone-a
	}{
		{
			// pod-d is hinted for two zones, zone-a among them.
			name: "HintedForZoneOnly", svc: svc("topo", "10.96.90.1"),
			eps: []policyEndpoint{
				policyHinted(podA, "zone-a", "zone-a"),
				policyHinted(podB, "zone-b", "zone-b"),
				policyHinted(policyPodD, "zone-c", "zone-a", "zone-c"),
			},
			want: []sandbox.Pod{podA, policyPodD},
		},
		{
			name: "ReadyEndpointWithoutHintsUsesAll", svc: svc("topo-unhinted", "10.96.90.2"),
			eps: []policyEndpoint{
				policyHinted(podA, "zone-a", "zone-a"),
				policyHinted(podB, "zone-b"),
				policyHinted(policyPodD, "zone-b", "zone-b"),
			},
			want: []sandbox.Pod{podA, podB, policyPodD},
		},
		{
			name: "NoneHintedForZoneUsesAll", svc: svc("topo-otherzones", "10.96.90.3"),
			eps: []policyEndpoint{
				policyHinted(podA, "zone-b", "zone-b"),
				policyHinted(podB, "zone-c", "zone-c"),
			},
			want: []sandbox.Pod{podA, podB},
		},
		{
			// Only Ready endpoints count: pod-d, not ready and
			// without hints, neither gets traffic nor turns the
			// hints off.
			name: "NotReadyWithoutHintsIgnored", svc: svc("topo-notready", "10.96.90.4"),
			eps: []policyEndpoint{
				policyHinted(podA, "zone-a", "zone-a"),
				policyHinted(podB, "zone-b", "zone-b"),
				{pod: policyPodD, zone: "zone-b"},
			},
			want: []sandbox.Pod{podA},
		},
	}
	var docs []string
	for _, tt := range tests {
		docs = append(docs, tt.svc.yaml(), policySlices(tt.svc, tt.eps...))
	}
	// The Node object, in place of the example's (in the same zone).
	const nodeFile = "node.yaml"
	e := newPolicyEnv(t, documents(docs...), map[string]string{nodeFile: policyNodeYAML("zone-a")})

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			policyExpect(t, e, podC.Name, "tcp", policyAddr(tt.svc.clusterIPv4, policyHTTP.port), nil, tt.want...)
		})
	}

	// The node moves to zone-b: "topo" follows its label, to pod-b only.
	t.Run("NodeZoneChange", func(t *testing.T) {
		writeAtomic(t, e.state, nodeFile, policyNodeYAML("zone-b"))
		policyConverge(t, e, "node in zone-b", podC.Name, "tcp", policyAddr(tests[0].svc.clusterIPv4, policyHTTP.port), podB)
	})
}

// TestPolicyTopologyNodeHints: trafficDistribution PreferSameNode, for which
// the EndpointSlice controller writes hints.forNodes (and forZones). As
// upstream, node hints win over zone hints: this node's ClusterIP traffic
// goes to the endpoint hinted for this node only, and the rules hold no
// KUBE-SEP chain for the others (they are not reachable from here).
// Incomplete node hints fall back to the zone hints, and with none for this
// node either to every endpoint.
func TestPolicyTopologyNodeHints(t *testing.T) {
	t.Parallel()
	svc := func(name, v4 string) policyService {
		return policyService{
			name: name, clusterIPv4: netip.MustParseAddr(v4),
			ports: []policyPort{policyHTTP}, trafficDistribution: "PreferSameNode",
		}
	}
	// hinted is a Ready endpoint on node in zone, hinted for both.
	hinted := func(p sandbox.Pod, node, zone string) policyEndpoint {
		ep := policyHinted(p, zone, zone)
		ep.node, ep.nodeHints = node, []string{node}
		return ep
	}
	const nodeC = "node-3"
	tests := []struct {
		name string
		svc  policyService
		eps  []policyEndpoint
		want []sandbox.Pod // this node in zone-a
	}{
		{
			// pod-b is in this node's zone too, yet gets none of its traffic.
			name: "HintedForNodeOnly", svc: svc("samenode", "10.96.92.1"),
			eps:  []policyEndpoint{hinted(podA, nodeName, "zone-a"), hinted(podB, policyRemoteNode, "zone-a"), hinted(policyPodD, nodeC, "zone-b")},
			want: []sandbox.Pod{podA},
		},
		{
			// pod-d has zone hints only: node hints incomplete, the zone's
			// endpoints serve.
			name: "IncompleteNodeHintsUseZone", svc: svc("samenode-partial", "10.96.92.2"),
			eps: []policyEndpoint{hinted(podA, nodeName, "zone-a"), hinted(podB, policyRemoteNode, "zone-b"),
				policyHinted(policyPodD, "zone-a", "zone-a")},
			want: []sandbox.Pod{podA, policyPodD},
		},
		{
			// No endpoint on or hinted for this node, none in its zone.
			name: "NoneForNodeOrZoneUsesAll", svc: svc("samenode-elsewhere", "10.96.92.3"),
			eps:  []policyEndpoint{hinted(podB, policyRemoteNode, "zone-b"), hinted(policyPodD, nodeC, "zone-c")},
			want: []sandbox.Pod{podB, policyPodD},
		},
	}
	var docs []string
	for _, tt := range tests {
		docs = append(docs, tt.svc.yaml(), policySlices(tt.svc, tt.eps...))
	}
	e := newPolicyEnv(t, documents(docs...), map[string]string{"node.yaml": policyNodeYAML("zone-a")})
	ruleset := e.nftRuleset(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			policyExpect(t, e, podC.Name, "tcp", policyAddr(tt.svc.clusterIPv4, policyHTTP.port), nil, tt.want...)
			// One KUBE-SEP chain per endpoint this node may use, no more.
			comment := fmt.Sprintf("comment %q", policyNamespace+"/"+tt.svc.name+":"+policyHTTP.name)
			lines := strings.Split(ruleset, "\n")
			seps := 0
			for i, l := range lines {
				if strings.HasPrefix(strings.TrimSpace(l), "chain KUBE-SEP-") && i+1 < len(lines) && strings.TrimSpace(lines[i+1]) == comment {
					seps++
				}
			}
			if seps != len(tt.want) {
				t.Errorf("%d KUBE-SEP chains of %s, want %d (one per endpoint for this node):\n%s", seps, tt.svc.name, len(tt.want), ruleset)
			}
		})
	}
}
