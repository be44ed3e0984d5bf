package proxy

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

// Helpers of the traffic policy, endpoint condition and topology tests
// (features_policy*_test.go). Their Services live in namespace "policy" of a
// state file of their own, next to the example's web and dns-like.

const (
	policyNamespace = "policy"
	policyStateFile = "policy.yaml"
	// policyRemoteNode is where an EndpointSlice says a pod runs when the
	// proxy must treat it as remote; the pod still answers, from this
	// node's bridge, if traffic reaches it.
	policyRemoteNode = "node-2"
	// A request that must fail (dropped or rejected) waits this long,
	// this many times. Answers through the sandbox take well under a
	// millisecond. A TCP request outlasts the first SYN retransmission
	// (after 1s): the ICMP error of a reject can come back while
	// connect(2) still holds the socket's lock, and is then only noted as
	// a soft error (TcpExtLockDroppedIcmps; it happens to the first SYN
	// over IPv6 in the sandbox), but the retransmission's fails the
	// connection. So a TCP timeout does show that nothing was rejected.
	policyUDPFailTimeout = 300 * time.Millisecond
	policyUDPFailCount   = 2
	policyTCPFailTimeout = 1500 * time.Millisecond
	policyTCPFailCount   = 1
)

// policyPodD is one more server pod (pod-c remains the client pod).
var policyPodD = sandbox.NewPod("pod-d", 13)

// policyPort is a Service port; nodePort 0 means none.
type policyPort struct {
	name, protocol             string // protocol: TCP or UDP
	port, targetPort, nodePort int
}

var (
	policyHTTP = policyPort{name: "http", protocol: "TCP", port: 80, targetPort: podTCPPort}
	policyDNS  = policyPort{name: "dns", protocol: "UDP", port: 53, targetPort: podUDPPort}
)

// withNodePort returns p with a NodePort.
func (p policyPort) withNodePort(n int) policyPort { p.nodePort = n; return p }

// policyService is a Service in policyNamespace: of type NodePort if a port
// has a NodePort, else ClusterIP; dual-stack if clusterIPv6 is set.
type policyService struct {
	name                     string
	clusterIPv4, clusterIPv6 netip.Addr
	ports                    []policyPort
	externalLocal            bool // externalTrafficPolicy: Local
	internalLocal            bool // internalTrafficPolicy: Local
	trafficDistribution      string
}

func (s policyService) yaml() string {
	var b strings.Builder
	typ := "ClusterIP"
	if slices.ContainsFunc(s.ports, func(p policyPort) bool { return p.nodePort != 0 }) {
		typ = "NodePort"
	}
	fmt.Fprintf(&b, `apiVersion: v1
kind: Service
metadata:
  name: %s
  namespace: %s
spec:
  type: %s
  clusterIP: %s
`, s.name, policyNamespace, typ, s.clusterIPv4)
	if s.clusterIPv6.IsValid() {
		fmt.Fprintf(&b, "  clusterIPs: [%s, %q]\n  ipFamilyPolicy: RequireDualStack\n  ipFamilies: [IPv4, IPv6]\n", s.clusterIPv4, s.clusterIPv6)
	} else {
		fmt.Fprintf(&b, "  clusterIPs: [%s]\n  ipFamilyPolicy: SingleStack\n  ipFamilies: [IPv4]\n", s.clusterIPv4)
	}
	if s.externalLocal {
		b.WriteString("  externalTrafficPolicy: Local\n")
	}
	if s.internalLocal {
		b.WriteString("  internalTrafficPolicy: Local\n")
	}
	if s.trafficDistribution != "" {
		fmt.Fprintf(&b, "  trafficDistribution: %s\n", s.trafficDistribution)
	}
	b.WriteString("  ports:\n")
	for _, p := range s.ports {
		fmt.Fprintf(&b, "  - {name: %s, protocol: %s, port: %d, targetPort: %d", p.name, p.protocol, p.port, p.targetPort)
		if p.nodePort != 0 {
			fmt.Fprintf(&b, ", nodePort: %d", p.nodePort)
		}
		b.WriteString("}\n")
	}
	return b.String()
}

// policyEndpoint is one pod in an EndpointSlice, with explicit conditions.
type policyEndpoint struct {
	pod                         sandbox.Pod
	node                        string // nodeName; "" means nodeName (this node)
	zone                        string // "" for none
	ready, serving, terminating bool
	hints                       []string // hints.forZones; nil for no hints
	nodeHints                   []string // hints.forNodes; nil for none
}

// policyReady is a ready endpoint on node (nodeName if "").
func policyReady(p sandbox.Pod, node string) policyEndpoint {
	return policyEndpoint{pod: p, node: node, ready: true, serving: true}
}

// policySlices returns the Service's EndpointSlices, one per family of its
// cluster IPs, each holding every endpoint with an address of the family.
func policySlices(svc policyService, eps ...policyEndpoint) string {
	docs := []string{policySlice(svc, false, eps)}
	if svc.clusterIPv6.IsValid() {
		docs = append(docs, policySlice(svc, true, eps))
	}
	return documents(docs...)
}

func policySlice(svc policyService, ipv6 bool, eps []policyEndpoint) string {
	var b strings.Builder
	family, suffix := "IPv4", "-ipv4"
	if ipv6 {
		family, suffix = "IPv6", "-ipv6"
	}
	fmt.Fprintf(&b, `apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: %s
  namespace: %s
  labels:
    kubernetes.io/service-name: %s
addressType: %s
ports:
`, svc.name+suffix, policyNamespace, svc.name, family)
	for _, p := range svc.ports {
		fmt.Fprintf(&b, "- {name: %s, protocol: %s, port: %d}\n", p.name, p.protocol, p.targetPort)
	}
	b.WriteString("endpoints:\n")
	for _, ep := range eps {
		addr := ep.pod.IPv4
		if ipv6 {
			addr = ep.pod.IPv6
		}
		node := ep.node
		if node == "" {
			node = nodeName
		}
		fmt.Fprintf(&b, `- addresses: [%q]
  conditions: {ready: %t, serving: %t, terminating: %t}
  nodeName: %s
  targetRef: {kind: Pod, namespace: %s, name: %s}
`, addr, ep.ready, ep.serving, ep.terminating, node, policyNamespace, ep.pod.Name)
		if ep.zone != "" {
			fmt.Fprintf(&b, "  zone: %s\n", ep.zone)
		}
		if ep.hints != nil || ep.nodeHints != nil {
			b.WriteString("  hints:\n")
		}
		if ep.hints != nil {
			b.WriteString("    forZones:\n")
			for _, z := range ep.hints {
				fmt.Fprintf(&b, "    - name: %s\n", z)
			}
		}
		if ep.nodeHints != nil {
			b.WriteString("    forNodes:\n")
			for _, n := range ep.nodeHints {
				fmt.Fprintf(&b, "    - name: %s\n", n)
			}
		}
	}
	return b.String()
}

// newPolicyEnv starts a sandbox with pods pod-a, pod-b, pod-c (the client
// pod) and pod-d, agent servers in pod-a, pod-b and pod-d, and the proxy on
// the example state plus state (written as policyStateFile) and the extra
// files given, by name (which replace the example's files of that name).
func newPolicyEnv(t *testing.T, state string, extra map[string]string) *env {
	t.Helper()
	files := map[string]string{policyStateFile: state}
	for name, data := range extra {
		files[name] = data
	}
	e := newEnv(t, envOptions{pods: []sandbox.Pod{podA, podB, podC, policyPodD}, extra: files})
	e.startServer(t, policyPodD)
	return e
}

// policyExpect sends requestsPerCheck requests from ns to addr and fails the
// test unless every one is answered, by exactly the pods named, and (if
// srcs is not nil) the servers saw only those source addresses.
func policyExpect(t *testing.T, e *env, ns, proto, addr string, srcs []netip.Addr, pods ...sandbox.Pod) {
	t.Helper()
	what := fmt.Sprintf("%s from %s to %s", proto, ns, addr)
	sum := e.requests(t, ns, proto, addr, requestsPerCheck)
	var names []string
	for _, p := range pods {
		names = append(names, p.Name)
	}
	expectBackends(t, what, sum, names...)
	if srcs == nil {
		return
	}
	for _, src := range sources(sum) {
		if !slices.Contains(srcs, src) {
			t.Errorf("%s: servers saw source %v, want only %v (sources %v)", what, src, srcs, sum.Sources)
		}
	}
}

// policyExpectNoAnswer sends a few requests from ns to addr (see
// policyTCPFailCount) and fails the test unless each fails with the echo
// client's error kind kind: "timeout" for a packet dropped on the way
// (neither answered nor rejected), "refused" for an ICMP port unreachable
// (nft's reject), "prohibited" for the EPERM that a datagram the node
// itself sends gets when its own output hook drops it.
func policyExpectNoAnswer(t *testing.T, e *env, kind, ns, proto, addr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	timeout, count := policyUDPFailTimeout, policyUDPFailCount
	if proto == "tcp" {
		timeout, count = policyTCPFailTimeout, policyTCPFailCount
	}
	sum, err := e.client(ctx, ns, proto, addr, count, "--timeout", timeout.String(), "--results", "all")
	if sum == nil {
		t.Fatalf("%s from %s to %s: %v", proto, ns, addr, err)
	}
	if sum.OK > 0 || sum.Errors[kind] != count {
		t.Errorf("%s from %s to %s: want each of %d requests to fail with %q, got %d answers (backends %v, sources %v), errors %v",
			proto, ns, addr, count, kind, sum.OK, sum.Backend, sum.Sources, sum.Errors)
	}
}

// policyConverge polls, after a change of the state, until requests from ns
// to addr are answered by exactly the pods named, and fails the test if that
// takes more than 10s (the proxy resyncs within about a second). Every
// request must be answered all along: old and new endpoints both answer.
func policyConverge(t *testing.T, e *env, what, ns, proto, addr string, pods ...sandbox.Pod) {
	t.Helper()
	var want []string
	for _, p := range pods {
		want = append(want, p.Name)
	}
	slices.Sort(want)
	target := fmt.Sprintf("%s %s from %s", proto, addr, ns)
	e.proxy.poll(t, 10*time.Second, fmt.Sprintf("%s: %s answered by %v only", what, target, want), func(context.Context) error {
		sum := e.requests(t, ns, proto, addr, requestsPerCheck)
		if sum.Failed > 0 {
			t.Fatalf("%s: %s: a request failed: %s", what, target, firstError(sum))
		}
		if got := sortedKeys(sum.Backend); !slices.Equal(got, want) {
			return fmt.Errorf("answered by %v", sum.Backend)
		}
		return nil
	})
}
