package proxy

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/echo"
	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

// Helpers of the tests of the node's edge (features_edge*_test.go and
// features_forward_test.go): external IPs, LoadBalancer ingress IPs, source
// ranges, Services without endpoints, KUBE-FORWARD. Their Services live in
// namespace "edge" of a state file of their own, next to the example's web
// and dns-like.
//
// External and LoadBalancer IPs are in 203.0.113.0/24 and fd00:203::/64
// (documentation ranges): the client routes them via the node, and the node
// has no route of its own for them but its default route back to the
// client, so nothing leaves the sandbox.

const (
	edgeNamespace = "edge"
	edgeStateFile = "edge.yaml"
	// edgeDropTimeout bounds each request that should get no answer:
	// answers through the sandbox take well under a millisecond, and TCP
	// retransmits its first SYN only after 1s.
	edgeDropTimeout = 300 * time.Millisecond
	edgeDropCount   = 2
	// Requests that must fail at once with an ICMP error: how many, the
	// client's timeout, and how long the error may take (see
	// edgeExpectICMPError).
	edgeRefusedCount   = 2
	edgeRefusedTimeout = 3 * time.Second
	edgeICMPWait       = 200 * time.Millisecond
	edgeICMPWaitTCP6   = 1500 * time.Millisecond
)

// The client's second addresses, outside every source range of the tests.
// The IPv6 one is deprecated (preferred_lft 0) so that the client picks it
// only where a route names it as the source.
var (
	edgeClient2IPv4 = netip.MustParseAddr("10.99.0.3")
	edgeClient2IPv6 = netip.MustParseAddr("fd00:99::3")
)

// The external address ranges and where the client sends them.
var edgeExternalRanges = []struct {
	prefix   netip.Prefix
	via, src netip.Addr
}{
	{netip.MustParsePrefix("203.0.113.0/24"), sandbox.NodeIPv4.Addr(), sandbox.ClientIPv4.Addr()},
	{netip.MustParsePrefix("fd00:203::/64"), sandbox.NodeIPv6.Addr(), sandbox.ClientIPv6.Addr()},
}

// edgeFamily holds one IP family's addresses of the edge Services.
type edgeFamily struct {
	name       string     // "IPv4", "IPv6"
	nft        string     // "ip", "ip6"
	node       netip.Addr // the node's address facing the client
	client     netip.Addr // the client's first address
	client2    netip.Addr // the client's second address
	extIP      netip.Addr // ext-ip's external IP
	lbVIP      netip.Addr // lb: ipMode VIP
	lbDefault  netip.Addr // lb: no ipMode (IPv4 only; invalid otherwise)
	lbProxy    netip.Addr // lb: ipMode Proxy, must not be programmed
	fwLB       netip.Addr // fw: source ranges client and node
	fwNoNodeLB netip.Addr // fw-nonode: source range client only
	none       edgeNone   // none: no usable endpoints
	clusterIP  map[string]netip.Addr
}

type edgeNone struct{ clusterIP, extIP, lbIP netip.Addr }

var edgeFamilies = []edgeFamily{
	{
		name: "IPv4", nft: "ip",
		node: sandbox.NodeIPv4.Addr(), client: sandbox.ClientIPv4.Addr(), client2: edgeClient2IPv4,
		extIP:      netip.MustParseAddr("203.0.113.10"),
		lbVIP:      netip.MustParseAddr("203.0.113.20"),
		lbProxy:    netip.MustParseAddr("203.0.113.21"),
		lbDefault:  netip.MustParseAddr("203.0.113.22"),
		fwLB:       netip.MustParseAddr("203.0.113.30"),
		fwNoNodeLB: netip.MustParseAddr("203.0.113.31"),
		none: edgeNone{
			clusterIP: netip.MustParseAddr("10.96.3.40"),
			extIP:     netip.MustParseAddr("203.0.113.40"),
			lbIP:      netip.MustParseAddr("203.0.113.41"),
		},
		clusterIP: map[string]netip.Addr{
			"ext-ip":    netip.MustParseAddr("10.96.3.10"),
			"lb":        netip.MustParseAddr("10.96.3.20"),
			"fw":        netip.MustParseAddr("10.96.3.30"),
			"fw-nonode": netip.MustParseAddr("10.96.3.31"),
		},
	},
	{
		name: "IPv6", nft: "ip6",
		node: sandbox.NodeIPv6.Addr(), client: sandbox.ClientIPv6.Addr(), client2: edgeClient2IPv6,
		extIP:      netip.MustParseAddr("fd00:203::10"),
		lbVIP:      netip.MustParseAddr("fd00:203::20"),
		lbProxy:    netip.MustParseAddr("fd00:203::21"),
		fwLB:       netip.MustParseAddr("fd00:203::6"),
		fwNoNodeLB: netip.MustParseAddr("fd00:203::31"),
		none: edgeNone{
			clusterIP: netip.MustParseAddr("fd00:10:96::340"),
			extIP:     netip.MustParseAddr("fd00:203::40"),
			lbIP:      netip.MustParseAddr("fd00:203::41"),
		},
		clusterIP: map[string]netip.Addr{
			"ext-ip":    netip.MustParseAddr("fd00:10:96::310"),
			"lb":        netip.MustParseAddr("fd00:10:96::320"),
			"fw":        netip.MustParseAddr("fd00:10:96::330"),
			"fw-nonode": netip.MustParseAddr("fd00:10:96::331"),
		},
	},
}

// Ports of the edge Services.
const (
	edgeHTTPPort       = 80
	edgeDNSPort        = 53
	edgeLBNodePort     = 30181
	edgeFWNodePort     = 30182
	edgeFWNoNodePort   = 30183
	edgeNoneNodePort   = 30190 // TCP and UDP
	edgeNoneListenName = "node-listener"
)

func edgeAddr(a netip.Addr, port int) string { return hostPort(a.String(), fmt.Sprint(port)) }

// edgeState is the edge.yaml of the tests: Services ext-ip, lb, fw,
// fw-nonode and none, dual-stack, and their EndpointSlices (pod-a and pod-b,
// none for "none").
func edgeState() string {
	v4, v6 := edgeFamilies[0], edgeFamilies[1]
	clusterIPs := func(name string) string {
		return fmt.Sprintf(`  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv6]
  clusterIP: %s
  clusterIPs: [%s, %q]
`, v4.clusterIP[name], v4.clusterIP[name], v6.clusterIP[name])
	}
	http := func(nodePort int) string {
		s := fmt.Sprintf("  - name: http\n    protocol: TCP\n    port: %d\n    targetPort: %d\n", edgeHTTPPort, podTCPPort)
		if nodePort != 0 {
			s += fmt.Sprintf("    nodePort: %d\n", nodePort)
		}
		return s
	}
	dns := func(nodePort int) string {
		s := fmt.Sprintf("  - name: dns\n    protocol: UDP\n    port: %d\n    targetPort: %d\n", edgeDNSPort, podUDPPort)
		if nodePort != 0 {
			s += fmt.Sprintf("    nodePort: %d\n", nodePort)
		}
		return s
	}
	head := func(name, typ string) string {
		return fmt.Sprintf("apiVersion: v1\nkind: Service\nmetadata:\n  name: %s\n  namespace: %s\nspec:\n  type: %s\n", name, edgeNamespace, typ)
	}
	docs := []string{
		// 1. External IPs.
		head("ext-ip", "ClusterIP") + clusterIPs("ext-ip") +
			fmt.Sprintf("  externalIPs: [%s, %q]\n", v4.extIP, v6.extIP) +
			"  ports:\n" + http(0) + dns(0),
		// 2. LoadBalancer ingress IPs: VIP mode (explicit or by default)
		// is programmed, Proxy mode is not.
		head("lb", "LoadBalancer") + clusterIPs("lb") + "  ports:\n" + http(edgeLBNodePort) + dns(edgeLBNodePort) +
			fmt.Sprintf(`status:
  loadBalancer:
    ingress:
    - {ip: %s, ipMode: VIP}
    - {ip: %s, ipMode: Proxy}
    - {ip: %s}
    - {ip: %q, ipMode: VIP}
    - {ip: %q, ipMode: Proxy}
    - {hostname: lb.example.invalid}
`, v4.lbVIP, v4.lbProxy, v4.lbDefault, v6.lbVIP, v6.lbProxy),
		// 3. loadBalancerSourceRanges: the client's first address and
		// the node's; fw-nonode the client's only.
		head("fw", "LoadBalancer") + clusterIPs("fw") + "  ports:\n" + http(edgeFWNodePort) +
			fmt.Sprintf("  loadBalancerSourceRanges: [%s/32, %s/32, \"%s/128\", \"%s/128\"]\n",
				sandbox.ClientIPv4.Addr(), sandbox.NodeIPv4.Addr(), sandbox.ClientIPv6.Addr(), sandbox.NodeIPv6.Addr()) +
			fmt.Sprintf("status:\n  loadBalancer:\n    ingress:\n    - {ip: %s}\n    - {ip: %q}\n", v4.fwLB, v6.fwLB),
		head("fw-nonode", "LoadBalancer") + clusterIPs("fw-nonode") + "  ports:\n" + http(edgeFWNoNodePort) +
			fmt.Sprintf("  loadBalancerSourceRanges: [%s/32, \"%s/128\"]\n", sandbox.ClientIPv4.Addr(), sandbox.ClientIPv6.Addr()) +
			fmt.Sprintf("status:\n  loadBalancer:\n    ingress:\n    - {ip: %s}\n    - {ip: %q}\n", v4.fwNoNodeLB, v6.fwNoNodeLB),
		// 7. No usable endpoint: ClusterIP, NodePort, external IP, LB IP.
		head("none", "LoadBalancer") +
			fmt.Sprintf(`  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv6]
  clusterIP: %s
  clusterIPs: [%s, %q]
  externalIPs: [%s, %q]
`, v4.none.clusterIP, v4.none.clusterIP, v6.none.clusterIP, v4.none.extIP, v6.none.extIP) +
			"  ports:\n" + http(edgeNoneNodePort) + dns(edgeNoneNodePort) +
			fmt.Sprintf("status:\n  loadBalancer:\n    ingress:\n    - {ip: %s}\n    - {ip: %q}\n", v4.none.lbIP, v6.none.lbIP),
	}
	both := []sandbox.Pod{podA, podB}
	for _, svc := range []string{"ext-ip", "lb", "fw", "fw-nonode"} {
		docs = append(docs,
			endpointSlice{namespace: edgeNamespace, name: svc + "-http-ipv4", service: svc, portName: "http", protocol: "TCP", port: podTCPPort, pods: both}.yaml(),
			endpointSlice{namespace: edgeNamespace, name: svc + "-http-ipv6", service: svc, ipv6: true, portName: "http", protocol: "TCP", port: podTCPPort, pods: both}.yaml(),
		)
		if svc == "ext-ip" || svc == "lb" {
			docs = append(docs,
				endpointSlice{namespace: edgeNamespace, name: svc + "-dns-ipv4", service: svc, portName: "dns", protocol: "UDP", port: podUDPPort, pods: both}.yaml(),
				endpointSlice{namespace: edgeNamespace, name: svc + "-dns-ipv6", service: svc, ipv6: true, portName: "dns", protocol: "UDP", port: podUDPPort, pods: both}.yaml(),
			)
		}
	}
	// "none": pod-a neither ready nor serving (not usable), and empty
	// slices; no IPv6 slice for dns at all.
	docs = append(docs,
		fmt.Sprintf(`apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: none-http-ipv4
  namespace: %s
  labels:
    kubernetes.io/service-name: none
addressType: IPv4
ports:
- {name: http, protocol: TCP, port: %d}
endpoints:
- addresses: [%s]
  conditions: {ready: false, serving: false, terminating: false}
  nodeName: %s
  targetRef: {kind: Pod, namespace: %s, name: %s}
`, edgeNamespace, podTCPPort, podA.IPv4, nodeName, edgeNamespace, podA.Name),
		endpointSlice{namespace: edgeNamespace, name: "none-http-ipv6", service: "none", ipv6: true, portName: "http", protocol: "TCP", port: podTCPPort}.yaml(),
		endpointSlice{namespace: edgeNamespace, name: "none-dns-ipv4", service: "none", portName: "dns", protocol: "UDP", port: podUDPPort}.yaml(),
	)
	return documents(docs...)
}

// newEdgeEnv runs the proxy, with the extra flags given, on the example
// state plus edge.yaml, with pod-a and pod-b serving and pod-c as a client
// pod, and sets up the
// sandbox for external traffic:
//   - the client routes 203.0.113.0/24 and fd00:203::/64 via the node, and
//     has second addresses 10.99.0.3 and fd00:99::3 (used only where a
//     route names them);
//   - the node has unreachable routes for the Proxy-mode ingress IPs, as
//     if they belonged to a load balancer it cannot reach: unprogrammed,
//     they get a quick ICMP error instead of bouncing back to the client;
//   - the node sends ICMP errors without rate limit: by default the kernel
//     sends a peer a burst of 6, then one a second (icmp_ratelimit), and
//     the rejected requests past those would time out.
func newEdgeEnv(t *testing.T, proxyArgs ...string) *env {
	t.Helper()
	e := newEnv(t, envOptions{
		pods:      []sandbox.Pod{podA, podB, podC},
		extra:     map[string]string{edgeStateFile: edgeState()},
		proxyArgs: proxyArgs,
	})
	steps := []struct {
		ns   string
		args []string
	}{
		{sandbox.Node, []string{"sysctl", "-q", "-w", "net.ipv4.icmp_ratelimit=0", "net.ipv6.icmp.ratelimit=0"}},
		{sandbox.Client, []string{"ip", "addr", "add", netip.PrefixFrom(edgeClient2IPv4, sandbox.ClientIPv4.Bits()).String(), "dev", sandbox.PodDev}},
		{sandbox.Client, []string{"ip", "addr", "add", netip.PrefixFrom(edgeClient2IPv6, sandbox.ClientIPv6.Bits()).String(), "dev", sandbox.PodDev, "nodad", "preferred_lft", "0"}},
	}
	for _, r := range edgeExternalRanges {
		steps = append(steps, struct {
			ns   string
			args []string
		}{sandbox.Client, []string{"ip", "route", "add", r.prefix.String(), "via", r.via.String(), "dev", sandbox.PodDev, "src", r.src.String()}})
	}
	for _, f := range edgeFamilies {
		steps = append(steps, struct {
			ns   string
			args []string
		}{sandbox.Node, []string{"ip", "route", "add", "unreachable", netip.PrefixFrom(f.lbProxy, f.lbProxy.BitLen()).String()}})
	}
	for _, s := range steps {
		if _, err := e.sb.Exec(t.Context(), s.ns, s.args...); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// clientRoute makes the client reach dst (one address) via gw (invalid:
// on the link) from source src.
func (e *env) clientRoute(t *testing.T, dst, gw, src netip.Addr) {
	t.Helper()
	args := []string{"ip", "route", "replace", netip.PrefixFrom(dst, dst.BitLen()).String()}
	if gw.IsValid() {
		args = append(args, "via", gw.String())
	}
	args = append(args, "dev", sandbox.PodDev, "src", src.String())
	if _, err := e.sb.Exec(t.Context(), sandbox.Client, args...); err != nil {
		t.Fatal(err)
	}
}

// edgeExpectMasq checks that requests from ns to addr are answered by
// pod-a and pod-b and that the servers saw a node address, never src.
func edgeExpectMasq(t *testing.T, e *env, ns, proto, addr string, src netip.Addr) {
	t.Helper()
	what := fmt.Sprintf("%s from %s (%v) to %s", proto, ns, src, addr)
	sum := e.requests(t, ns, proto, addr, requestsPerCheck)
	expectBackends(t, what, sum, podA.Name, podB.Name)
	for _, s := range sources(sum) {
		if !slices.Contains(nodeAddrs, s) {
			t.Errorf("%s: servers saw source %v, want a node address %v (not masqueraded?)", what, s, nodeAddrs)
		}
	}
}

// edgeExpectFail sends count requests from ns to addr, each with timeout,
// and checks that every one failed with an error of kind (see
// echo.Summary.Errors).
func edgeExpectFail(t *testing.T, e *env, kind, ns, proto, addr string, count int, timeout time.Duration) (*echo.Summary, bool) {
	t.Helper()
	what := fmt.Sprintf("%s from %s to %s", proto, ns, addr)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	sum, err := e.client(ctx, ns, proto, addr, count, "--results", "all", "--timeout", timeout.String())
	if sum == nil {
		t.Fatalf("%s: %v", what, err)
	}
	if sum.OK > 0 || sum.Errors[kind] != count {
		t.Errorf("%s: got %d answers (backends %v) and errors %v, want %d %q errors", what, sum.OK, sum.Backend, sum.Errors, count, kind)
		return sum, false
	}
	return sum, true
}

// edgeExpectICMPError checks that requests from ns to addr fail with an
// error of kind, the ICMP error's, at once: within edgeICMPWait, or, for TCP
// over IPv6, within edgeICMPWaitTCP6. Linux reports an ICMPv6 error to a
// TCP SYN only when the SYN is retransmitted, after 1s (the error to the
// first one comes back while connect still holds the socket; seen with
// plain `reject` rules without the proxy too), so that case gets a
// single request.
func edgeExpectICMPError(t *testing.T, e *env, kind, ns, proto, addr string) {
	t.Helper()
	count, wait := edgeRefusedCount, edgeICMPWait
	if ap, err := netip.ParseAddrPort(addr); err == nil && ap.Addr().Is6() && proto == "tcp" {
		count, wait = 1, edgeICMPWaitTCP6
	}
	sum, ok := edgeExpectFail(t, e, kind, ns, proto, addr, count, edgeRefusedTimeout)
	if !ok {
		return
	}
	for _, r := range sum.Results {
		if r.Error != "" && r.RTTMS > float64(wait.Milliseconds()) {
			t.Errorf("%s from %s to %s: %q after %.1fms, want within %v", proto, ns, addr, r.Error, r.RTTMS, wait)
		}
	}
}

// edgeExpectRefused checks that requests are refused at once: TCP connect
// and UDP read get ECONNREFUSED from a reject.
func edgeExpectRefused(t *testing.T, e *env, ns, proto, addr string) {
	t.Helper()
	edgeExpectICMPError(t, e, "refused", ns, proto, addr)
}

// edgeExpectDropped checks that requests get no answer at all.
func edgeExpectDropped(t *testing.T, e *env, ns, proto, addr string) {
	t.Helper()
	edgeExpectFail(t, e, "timeout", ns, proto, addr, edgeDropCount, edgeDropTimeout)
}

// edgeRuleset lists the node's ruleset and parses it; on failure of the
// test, it is logged.
func edgeRuleset(t *testing.T, e *env) (ruleset, string) {
	t.Helper()
	out, err := e.sb.Exec(t.Context(), sandbox.Node, "nft", "list", "ruleset")
	if err != nil {
		t.Fatal(err)
	}
	text := string(out)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("nft list ruleset:\n%s", text)
		}
	})
	rs, err := parseRuleset(text)
	if err != nil {
		t.Fatal(err)
	}
	return rs, text
}

// edgeElement is how nft lists a map element of the edge Services: "ADDR .
// PROTO . PORT comment "COMMENT"".
func edgeElement(a netip.Addr, proto string, port int, comment string) string {
	return fmt.Sprintf("%s . %s . %d comment %q", a, proto, port, comment)
}

// edgeSPN names an edge Service port for chain names and comments.
func edgeSPN(svc, port string) string { return edgeNamespace + "/" + svc + ":" + port }
