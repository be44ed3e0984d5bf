package proxy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

// An extra Service without endpoints, for the reject case.
const traceEmptyService = `apiVersion: v1
kind: Service
metadata: {name: empty, namespace: default}
spec:
  type: ClusterIP
  clusterIP: 10.96.0.99
  clusterIPs: [10.96.0.99]
  ipFamilies: [IPv4]
  ports: [{name: http, protocol: TCP, port: 80, targetPort: 8080}]
`

// traceResult is what `kube-nftproxy trace` predicts for a packet.
type traceResult struct {
	verdict    string   // accept, reject, drop
	targets    []string // DNAT targets, ip:port, sorted
	masquerade string   // yes, no, or "50% of the time"
	text       string
}

// trace runs `kube-nftproxy trace` in the node namespace, on the live tables.
func (e *env) trace(t *testing.T, args ...string) traceResult {
	t.Helper()
	out, err := e.sb.Exec(t.Context(), sandbox.Node, append([]string{proxyBin, "trace"}, args...)...)
	if err != nil {
		t.Fatalf("trace %v: %v: %s", args, err, out)
	}
	r := traceResult{text: string(out)}
	for _, l := range strings.Split(string(out), "\n") {
		switch {
		case strings.HasPrefix(l, "verdict: "):
			r.verdict = strings.TrimPrefix(l, "verdict: ")
		case strings.HasPrefix(l, "dnat targets: none"):
		case strings.HasPrefix(l, "dnat targets: "):
			for _, tgt := range strings.Split(strings.TrimPrefix(l, "dnat targets: "), ", ") {
				addr, _, _ := strings.Cut(tgt, " ")
				r.targets = append(r.targets, addr)
			}
		case strings.HasPrefix(l, "masquerade: "):
			r.masquerade = strings.TrimPrefix(l, "masquerade: ")
		}
	}
	slices.Sort(r.targets)
	return r
}

// TestTraceMatchesTraffic checks `trace` on the live tables against real
// traffic for cases of TestServices and the edge features: the verdict it
// predicts is what the client sees, the backends it predicts are the ones
// that answer, and the sources the backends see are masqueraded exactly
// when it says so.
func TestTraceMatchesTraffic(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{pods: []sandbox.Pod{podA, podB, podC}, extra: map[string]string{"empty.yaml": traceEmptyService}})
	backendOf := map[string]string{} // DNAT target -> the pod that answers
	for _, p := range []sandbox.Pod{podA, podB} {
		backendOf[fmt.Sprintf("%s:%d", p.IPv4, podTCPPort)] = p.Name
		backendOf[fmt.Sprintf("%s:%d", p.IPv4, podUDPPort)] = p.Name
		backendOf[fmt.Sprintf("[%s]:%d", p.IPv6, podTCPPort)] = p.Name
	}
	node4 := sandbox.NodeIPv4.Addr().String()
	for _, tc := range []struct {
		name      string
		ns        string // where the client runs
		src       netip.Addr
		proto     string
		dst       string // ip:port
		fromNode  bool
		verdict   string
		masquerad string
	}{
		{name: "pod to ClusterIP", ns: podC.Name, src: podC.IPv4, proto: "tcp", dst: hostPort(webClusterIPv4, webPort), verdict: "accept", masquerad: "no"},
		{name: "pod to IPv6 ClusterIP", ns: podC.Name, src: podC.IPv6, proto: "tcp", dst: hostPort(webClusterIPv6, webPort), verdict: "accept", masquerad: "no"},
		{name: "off-cluster client to NodePort", ns: sandbox.Client, src: sandbox.ClientIPv4.Addr(), proto: "tcp", dst: hostPort(node4, webNodePort), verdict: "accept", masquerad: "yes"},
		{name: "off-cluster client to UDP ClusterIP", ns: sandbox.Client, src: sandbox.ClientIPv4.Addr(), proto: "udp", dst: hostPort(dnsClusterIP, dnsPort), verdict: "accept", masquerad: "yes"},
		{name: "node to UDP ClusterIP", ns: sandbox.Node, src: sandbox.NodeIPv4.Addr(), proto: "udp", dst: hostPort(dnsClusterIP, dnsPort), fromNode: true, verdict: "accept", masquerad: "yes"},
		{name: "hairpin", ns: podA.Name, src: podA.IPv4, proto: "tcp", dst: hostPort(webClusterIPv4, webPort), verdict: "accept", masquerad: "50% of the time"},
		{name: "no endpoints", ns: podC.Name, src: podC.IPv4, proto: "tcp", dst: "10.96.0.99:80", verdict: "reject", masquerad: "no"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"--src", tc.src.String(), "--dst", tc.dst + "/" + tc.proto}
			if tc.fromNode {
				args = append(args, "--from-node")
			}
			tr := e.trace(t, args...)
			t.Logf("trace %s:\n%s", strings.Join(args, " "), tr.text)
			if tr.verdict != tc.verdict || tr.masquerade != tc.masquerad {
				t.Fatalf("trace predicts %s, masquerade %s; the test expects %s, %s", tr.verdict, tr.masquerade, tc.verdict, tc.masquerad)
			}
			if tc.verdict == "reject" {
				edgeExpectRefused(t, e, tc.ns, tc.proto, tc.dst)
				return
			}
			var want []string
			for _, tgt := range tr.targets {
				want = append(want, backendOf[tgt])
			}
			sum := e.requests(t, tc.ns, tc.proto, tc.dst, requestsPerCheck)
			expectBackends(t, tc.name, sum, want...)
			// The sources each backend saw: masqueraded ones are node addresses.
			for _, r := range sum.Results {
				src, err := netip.ParseAddr(r.Source)
				if err != nil {
					continue
				}
				masq := slices.Contains(nodeAddrs, src)
				switch {
				case tc.masquerad == "yes" && !masq, tc.masquerad == "no" && masq:
					t.Errorf("%s answered to source %s; trace says masquerade %s", r.Backend, src, tc.masquerad)
				case tc.masquerad != "yes" && tc.masquerad != "no":
					// Hairpin: only the connection back to the client
					// pod itself is masqueraded.
					if self := r.Backend == tc.ns; self != masq {
						t.Errorf("%s answered to source %s (masqueraded %v), trace's paths say only the pod's own endpoint is", r.Backend, src, masq)
					}
				}
			}
		})
	}
}
