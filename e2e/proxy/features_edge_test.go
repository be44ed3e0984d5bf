package proxy

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

// Traffic to the node's edge: external IPs, LoadBalancer ingress IPs and
// their source ranges, and Services without endpoints, on IPv4 and IPv6.
// Every test runs its own proxy on the example state plus edge.yaml (see
// features_edge_helpers_test.go).

// TestFeaturesExternalIPs: traffic from the client to an external IP on the
// Service port is load-balanced like the ClusterIP's and masqueraded.
func TestFeaturesExternalIPs(t *testing.T) {
	t.Parallel()
	e := newEdgeEnv(t)
	rs, _ := edgeRuleset(t, e)
	for _, f := range edgeFamilies {
		t.Run(f.name, func(t *testing.T) {
			for _, tc := range []struct{ proto, port string }{{"tcp", "http"}, {"udp", "dns"}} {
				port := edgeHTTPPort
				if tc.proto == "udp" {
					port = edgeDNSPort
				}
				want := edgeElement(f.extIP, tc.proto, port, edgeSPN("ext-ip", tc.port)+" external IP") + " : goto " + extChain(edgeSPN("ext-ip", tc.port), tc.proto)
				if m := rs.mapText(f.nft, "service-ips"); !strings.Contains(m, want) {
					t.Errorf("map %s service-ips has no element %q", f.nft, want)
				}
				edgeExpectMasq(t, e, sandbox.Client, tc.proto, edgeAddr(f.extIP, port), f.client)
				// The same Service through its ClusterIP, for comparison.
				edgeExpectMasq(t, e, sandbox.Client, tc.proto, edgeAddr(f.clusterIP["ext-ip"], port), f.client)
			}
		})
	}
}

// TestFeaturesLoadBalancerIngress: the ingress IPs of a LoadBalancer Service
// in VIP mode (explicit or by default) take traffic like external IPs; those
// in Proxy mode are not programmed; the NodePort of the Service works on
// both node addresses.
func TestFeaturesLoadBalancerIngress(t *testing.T) {
	t.Parallel()
	e := newEdgeEnv(t)
	rs, text := edgeRuleset(t, e)
	for _, f := range edgeFamilies {
		t.Run(f.name, func(t *testing.T) {
			vips := []string{f.lbVIP.String()}
			if f.lbDefault.IsValid() {
				vips = append(vips, f.lbDefault.String())
			}
			for _, vip := range vips {
				for _, tc := range []struct {
					proto, port string
					num         int
				}{{"tcp", "http", edgeHTTPPort}, {"udp", "dns", edgeDNSPort}} {
					spn := edgeSPN("lb", tc.port)
					want := fmt.Sprintf("%s . %s . %d comment %q : goto %s", vip, tc.proto, tc.num, spn+" loadbalancer IP", extChain(spn, tc.proto))
					if m := rs.mapText(f.nft, "service-ips"); !strings.Contains(m, want) {
						t.Errorf("map %s service-ips has no element %q", f.nft, want)
					}
					edgeExpectMasq(t, e, sandbox.Client, tc.proto, hostPort(vip, fmt.Sprint(tc.num)), f.client)
				}
			}
			// Proxy mode: the load balancer delivers to the node or
			// pod itself, the IP is nowhere in the ruleset, and
			// traffic to it meets the node's unreachable route.
			if strings.Contains(text, " "+f.lbProxy.String()+" ") {
				t.Errorf("the ruleset mentions %v, an ingress IP of ipMode Proxy", f.lbProxy)
			}
			edgeExpectICMPError(t, e, "unreachable", sandbox.Client, "tcp", edgeAddr(f.lbProxy, edgeHTTPPort))
			// The NodePort, TCP and UDP.
			edgeExpectMasq(t, e, sandbox.Client, "tcp", edgeAddr(f.node, edgeLBNodePort), f.client)
			edgeExpectMasq(t, e, sandbox.Client, "udp", edgeAddr(f.node, edgeLBNodePort), f.client)
		})
	}
}

// TestFeaturesLoadBalancerSourceRanges: only sources within the ranges
// reach the LB IP, others are dropped; the node's own traffic passes when a
// range holds the node's address; the ClusterIP and the NodePort are not
// restricted.
func TestFeaturesLoadBalancerSourceRanges(t *testing.T) {
	t.Parallel()
	e := newEdgeEnv(t)
	rs, _ := edgeRuleset(t, e)
	spn := edgeSPN("fw", "http")
	for _, f := range edgeFamilies {
		t.Run(f.name, func(t *testing.T) {
			want := fmt.Sprintf("%s . tcp . %d comment %q : goto KUBE-FW-%s", f.fwLB, edgeHTTPPort, spn+" loadbalancer IP", hash16(spn+"tcp"))
			if m := rs.mapText(f.nft, "firewall-ips"); !strings.Contains(m, want) {
				t.Errorf("map %s firewall-ips has no element %q", f.nft, want)
			}
			lb := edgeAddr(f.fwLB, edgeHTTPPort)
			lbNoNode := edgeAddr(f.fwNoNodeLB, edgeHTTPPort)

			// Allowed: the client's first address, and the node,
			// whose own address is in a range.
			edgeExpectMasq(t, e, sandbox.Client, "tcp", lb, f.client)
			edgeExpectMasq(t, e, sandbox.Node, "tcp", lb, f.node)
			// The node gets no exemption: without its address in the
			// ranges, its traffic is dropped like anyone's.
			edgeExpectMasq(t, e, sandbox.Client, "tcp", lbNoNode, f.client)
			edgeExpectDropped(t, e, sandbox.Node, "tcp", lbNoNode)

			// From the client's second address, outside the ranges:
			// the LB IP drops, the ClusterIP and the NodePort of the
			// same Service answer (which also shows that the second
			// address works).
			e.clientRoute(t, f.fwLB, f.node, f.client2)
			e.clientRoute(t, f.clusterIP["fw"], f.node, f.client2)
			e.clientRoute(t, f.node, netip.Addr{}, f.client2) // on the link
			edgeExpectDropped(t, e, sandbox.Client, "tcp", lb)
			edgeExpectMasq(t, e, sandbox.Client, "tcp", edgeAddr(f.clusterIP["fw"], edgeHTTPPort), f.client2)
			edgeExpectMasq(t, e, sandbox.Client, "tcp", edgeAddr(f.node, edgeFWNodePort), f.client2)
			// Back to the first address: allowed again.
			e.clientRoute(t, f.fwLB, f.node, f.client)
			edgeExpectMasq(t, e, sandbox.Client, "tcp", lb, f.client)
		})
	}
	// Last, as it changes the node's addresses.
	t.Run("LocalLBIP", func(t *testing.T) {
		testLocalLBIP(t, e)
	})
}

// testLocalLBIP: where the LB IP is a local address of the node (as load
// balancer setups often make it), the node's own requests to it leave from
// the LB IP itself. kube-proxy (iptables and nftables modes) then accepts
// the LB IPs as sources too when a range holds the node's IP ("For VIP-like
// LBs, the VIP is often added as a local address ... We need the following
// rules to allow requests from this node"); so does KUBE-FW-<hash> here
// (found missing by this test).
func testLocalLBIP(t *testing.T, e *env) {
	for _, f := range edgeFamilies {
		lbIP := netip.PrefixFrom(f.fwLB, f.fwLB.BitLen()).String()
		if _, err := e.sb.Exec(t.Context(), sandbox.Node, "ip", "addr", "add", lbIP, "dev", "lo"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := e.sb.Exec(ctx, sandbox.Node, "ip", "addr", "del", lbIP, "dev", "lo"); err != nil {
				t.Error(err)
			}
		})
		edgeExpectMasq(t, e, sandbox.Node, "tcp", edgeAddr(f.fwLB, edgeHTTPPort), f.fwLB)
	}
}

// TestFeaturesNoEndpointsReject: a Service without a usable endpoint rejects
// at once, TCP and UDP, on its ClusterIP (from a pod and from the node), its
// NodePort, its external IP and its LB IP (from the client). A server on the
// node listens on the NodePort: only the reject keeps the client from it.
func TestFeaturesNoEndpointsReject(t *testing.T) {
	t.Parallel()
	e := newEdgeEnv(t)
	rs, _ := edgeRuleset(t, e)
	if _, err := e.sb.Start(t.Context(), sandbox.Node, agentBin, "serve", "--name", edgeNoneListenName,
		"--tcp", fmt.Sprintf(":%d", edgeNoneNodePort), "--udp", fmt.Sprintf(":%d", edgeNoneNodePort)); err != nil {
		t.Fatal(err)
	}
	// The listener answers on loopback, where NodePorts do not apply.
	for _, lo := range []string{"127.0.0.1", "::1"} {
		for _, proto := range []string{"tcp", "udp"} {
			addr := hostPort(lo, fmt.Sprint(edgeNoneNodePort))
			e.proxy.poll(t, 10*time.Second, "the node's listener on "+addr, func(ctx context.Context) error {
				_, err := e.client(ctx, sandbox.Node, proto, addr, 1, "--timeout", "200ms")
				return err
			})
		}
	}
	for _, f := range edgeFamilies {
		t.Run(f.name, func(t *testing.T) {
			for _, tc := range []struct {
				proto, port string
				num         int
			}{{"tcp", "http", edgeHTTPPort}, {"udp", "dns", edgeDNSPort}} {
				spn := edgeSPN("none", tc.port)
				for _, el := range []string{
					edgeElement(f.none.clusterIP, tc.proto, tc.num, spn+" has no endpoints") + " : goto KUBE-REJECT",
					edgeElement(f.none.extIP, tc.proto, tc.num, spn+" has no endpoints") + " : goto KUBE-REJECT",
					edgeElement(f.none.lbIP, tc.proto, tc.num, spn+" has no endpoints") + " : goto KUBE-REJECT",
				} {
					if m := rs.mapText(f.nft, "no-endpoint-services"); !strings.Contains(m, el) {
						t.Errorf("map %s no-endpoint-services has no element %q", f.nft, el)
					}
				}
				edgeExpectRefused(t, e, podC.Name, tc.proto, edgeAddr(f.none.clusterIP, tc.num))
				edgeExpectRefused(t, e, sandbox.Client, tc.proto, edgeAddr(f.node, edgeNoneNodePort))
				edgeExpectRefused(t, e, sandbox.Client, tc.proto, edgeAddr(f.none.extIP, tc.num))
				edgeExpectRefused(t, e, sandbox.Client, tc.proto, edgeAddr(f.none.lbIP, tc.num))
				// The node's UDP: the reject drops the datagram on
				// its way out, and the send fails with EPERM before
				// the ICMP error can arrive.
				if tc.proto == "udp" {
					edgeExpectICMPError(t, e, "prohibited", sandbox.Node, tc.proto, edgeAddr(f.none.clusterIP, tc.num))
				} else {
					edgeExpectRefused(t, e, sandbox.Node, tc.proto, edgeAddr(f.none.clusterIP, tc.num))
				}
			}
		})
	}
}
