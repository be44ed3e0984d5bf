package proxy

import (
	"fmt"
	"net/netip"
	"strconv"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

// Traffic policies with real traffic (issue 3, items 5, 6 and 12). Every
// endpoint pod runs on this one node; an EndpointSlice that says nodeName
// node-2 makes the proxy treat the pod as remote, while the pod would still
// answer if traffic reached it. So "only pod-a answers" shows that the
// proxy, not the topology, kept traffic off pod-b.

// policyFamily is what a check needs of one IP family.
type policyFamily struct {
	name         string
	node, client netip.Addr // the node's address facing the client, the client's
	clusterIP    func(policyService) netip.Addr
	podAddr      func(sandbox.Pod) netip.Addr
	nodeSources  []netip.Addr // what masquerading turns the node's traffic into
}

var policyFamilies = []policyFamily{
	{
		name: "IPv4", node: sandbox.NodeIPv4.Addr(), client: sandbox.ClientIPv4.Addr(),
		clusterIP:   func(s policyService) netip.Addr { return s.clusterIPv4 },
		podAddr:     func(p sandbox.Pod) netip.Addr { return p.IPv4 },
		nodeSources: []netip.Addr{sandbox.BridgeIPv4.Addr(), sandbox.NodeIPv4.Addr()},
	},
	{
		name: "IPv6", node: sandbox.NodeIPv6.Addr(), client: sandbox.ClientIPv6.Addr(),
		clusterIP:   func(s policyService) netip.Addr { return s.clusterIPv6 },
		podAddr:     func(p sandbox.Pod) netip.Addr { return p.IPv6 },
		nodeSources: []netip.Addr{sandbox.BridgeIPv6.Addr(), sandbox.NodeIPv6.Addr()},
	},
}

func policyAddr(a netip.Addr, port int) string { return hostPort(a.String(), strconv.Itoa(port)) }

// TestPolicyExternalTrafficLocal: externalTrafficPolicy Local on a
// dual-stack NodePort Service, over TCP and UDP (items 5 and 12).
func TestPolicyExternalTrafficLocal(t *testing.T) {
	t.Parallel()
	// pod-a is local, pod-b "on node-2".
	etp := policyService{
		name: "etp", externalLocal: true,
		clusterIPv4: netip.MustParseAddr("10.96.50.1"), clusterIPv6: netip.MustParseAddr("fd00:10:96::5001"),
		ports: []policyPort{policyHTTP.withNodePort(30501), policyDNS.withNodePort(30502)},
	}
	// Both endpoints "on node-2": no local endpoint.
	etpNone := policyService{
		name: "etp-none", externalLocal: true,
		clusterIPv4: netip.MustParseAddr("10.96.50.2"), clusterIPv6: netip.MustParseAddr("fd00:10:96::5002"),
		ports: []policyPort{policyHTTP.withNodePort(30503), policyDNS.withNodePort(30504)},
	}
	e := newPolicyEnv(t, documents(
		etp.yaml(), policySlices(etp, policyReady(podA, ""), policyReady(podB, policyRemoteNode)),
		etpNone.yaml(), policySlices(etpNone, policyReady(podA, policyRemoteNode), policyReady(podB, policyRemoteNode)),
	), nil)

	for _, f := range policyFamilies {
		t.Run(f.name, func(t *testing.T) {
			// From outside: local endpoints only, and the client's own
			// address reaches the pod (no masquerade): the point of
			// externalTrafficPolicy Local.
			t.Run("ClientToLocalEndpointOnly", func(t *testing.T) {
				for _, p := range etp.ports {
					policyExpect(t, e, sandbox.Client, p.proto(), policyAddr(f.node, p.nodePort), []netip.Addr{f.client}, podA)
				}
			})
			// From outside without a local endpoint: dropped, neither
			// sent to the remote endpoints nor rejected (a NodePort
			// that nothing programs would be refused by the node).
			t.Run("ClientWithoutLocalEndpointDropped", func(t *testing.T) {
				for _, p := range etpNone.ports {
					policyExpectNoAnswer(t, e, "timeout", sandbox.Client, p.proto(), policyAddr(f.node, p.nodePort))
				}
			})
			// Pods reach the NodePort on the node's address cluster-wide
			// with their own source, with or without a local endpoint.
			// This pins iptables mode's "pod traffic for SVC external
			// destinations" rule in KUBE-EXT (-s clusterCIDR -j KUBE-SVC),
			// kube-proxy's short-circuit for pods, so that they do not
			// lose traffic to eTP Local.
			t.Run("PodGoesClusterWide", func(t *testing.T) {
				for _, svc := range []policyService{etp, etpNone} {
					for _, p := range svc.ports {
						policyExpect(t, e, podC.Name, p.proto(), policyAddr(f.node, p.nodePort), []netip.Addr{f.podAddr(podC)}, podA, podB)
					}
					// The ClusterIP ignores externalTrafficPolicy.
					policyExpect(t, e, podC.Name, "tcp", policyAddr(f.clusterIP(svc), policyHTTP.port), []netip.Addr{f.podAddr(podC)}, podA, podB)
				}
			})
			// The node itself reaches its NodePort cluster-wide,
			// masqueraded. This pins iptables mode's "masquerade LOCAL
			// traffic for SVC external destinations" and "route LOCAL
			// traffic for SVC external destinations" rules in KUBE-EXT
			// (-m addrtype --src-type LOCAL -j KUBE-MARK-MASQ, then
			// -j KUBE-SVC).
			t.Run("NodeGoesClusterWide", func(t *testing.T) {
				for _, svc := range []policyService{etp, etpNone} {
					for _, p := range svc.ports {
						policyExpect(t, e, sandbox.Node, p.proto(), policyAddr(f.node, p.nodePort), f.nodeSources, podA, podB)
					}
				}
			})
		})
	}
}

// TestPolicyInternalTrafficLocal: internalTrafficPolicy Local on a
// dual-stack ClusterIP Service, over TCP and UDP (items 6 and 12).
func TestPolicyInternalTrafficLocal(t *testing.T) {
	t.Parallel()
	itp := policyService{
		name: "itp", internalLocal: true,
		clusterIPv4: netip.MustParseAddr("10.96.60.1"), clusterIPv6: netip.MustParseAddr("fd00:10:96::6001"),
		ports: []policyPort{policyHTTP, policyDNS},
	}
	itpNone := policyService{
		name: "itp-none", internalLocal: true,
		clusterIPv4: netip.MustParseAddr("10.96.60.2"), clusterIPv6: netip.MustParseAddr("fd00:10:96::6002"),
		ports: []policyPort{policyHTTP, policyDNS},
	}
	e := newPolicyEnv(t, documents(
		itp.yaml(), policySlices(itp, policyReady(podA, ""), policyReady(podB, policyRemoteNode)),
		itpNone.yaml(), policySlices(itpNone, policyReady(podA, policyRemoteNode), policyReady(podB, policyRemoteNode)),
	), nil)

	for _, f := range policyFamilies {
		t.Run(f.name, func(t *testing.T) {
			// Pods and the node reach the local endpoint only; pods
			// keep their source.
			t.Run("LocalEndpointOnly", func(t *testing.T) {
				for _, p := range itp.ports {
					addr := policyAddr(f.clusterIP(itp), p.port)
					policyExpect(t, e, podC.Name, p.proto(), addr, []netip.Addr{f.podAddr(podC)}, podA)
					policyExpect(t, e, sandbox.Node, p.proto(), addr, nil, podA)
				}
			})
			// No local endpoint: dropped ("has no local endpoints"),
			// neither rejected nor sent to the remote endpoints. The
			// node's own UDP datagrams are dropped in its output hook,
			// which fails their send with EPERM at once; its TCP SYNs
			// are dropped there too, but TCP only retransmits them.
			t.Run("WithoutLocalEndpointDropped", func(t *testing.T) {
				for _, p := range itpNone.ports {
					addr := policyAddr(f.clusterIP(itpNone), p.port)
					policyExpectNoAnswer(t, e, "timeout", podC.Name, p.proto(), addr)
					nodeKind := "timeout"
					if p.protocol == "UDP" {
						nodeKind = "prohibited"
					}
					policyExpectNoAnswer(t, e, nodeKind, sandbox.Node, p.proto(), addr)
				}
			})
		})
	}
}

// proto is the agent client's name for p's protocol.
func (p policyPort) proto() string {
	switch p.protocol {
	case "TCP":
		return "tcp"
	case "UDP":
		return "udp"
	}
	panic(fmt.Sprintf("port %s: protocol %q", p.name, p.protocol))
}
