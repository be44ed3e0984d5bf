package proxy

import (
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

// TestClusterIPChecks: in nftables mode, as upstream's nftables mode, a new
// connection to a ClusterIP on a port no Service port defines is refused
// at once (TCP and UDP, from a pod and from the node), and one to an
// address of a ServiceCIDR that no Service holds is dropped on the node;
// ports with endpoints still answer, and a Service without usable
// endpoints keeps its own verdict (a reject, or a drop with
// internalTrafficPolicy Local), which comes first. In iptables mode, as
// upstream's, neither check exists: such packets leave by the node's
// routes (here its default route, to the client, which counts them).
func TestClusterIPChecks(t *testing.T) {
	t.Parallel()
	needRoot(t)
	for _, mode := range []string{"nftables", "iptables"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t, envOptions{
				pods:      []sandbox.Pod{podA, podB, podC},
				extra:     map[string]string{"checks.yaml": checksState()},
				proxyArgs: []string{"--proxy-mode=" + mode},
			})
			// ICMP errors without rate limit: each check sends a few.
			flagsExec(t, e, sandbox.Node, "sysctl", "-q", "-w", "net.ipv4.icmp_ratelimit=0", "net.ipv6.icmp.ratelimit=0")
			probe := newLeakProbe(t, e)
			for _, f := range checksFamilies {
				t.Run(f.name, func(t *testing.T) { checkClusterIPs(t, e, probe, f, mode == "nftables") })
			}
		})
	}
}

// checkClusterIPs runs the checks of one family.
func checkClusterIPs(t *testing.T, e *env, probe *leakProbe, f checksFamily, nftablesMode bool) {
	web := func(port int) string { return edgeAddr(f.web, port) }
	// A port with endpoints answers, in both modes.
	expectBackends(t, "tcp from pod-c to "+web(80), e.requests(t, podC.Name, "tcp", web(80), requestsPerCheck), podA.Name, podB.Name)
	// A Service without endpoints rejects with its own element, and
	// one whose Local policy leaves no endpoint drops: both before the
	// ClusterIP check.
	edgeExpectRefused(t, e, podC.Name, "tcp", edgeAddr(f.none, 80))
	edgeExpectDropped(t, e, podC.Name, "tcp", edgeAddr(f.localNone, 80))

	checkClusterIPTrace(t, e, f, nftablesMode)
	before := probe.count(t, f.name)
	if nftablesMode {
		for _, proto := range []string{"tcp", "udp"} {
			edgeExpectRefused(t, e, podC.Name, proto, web(81))
		}
		edgeExpectRefused(t, e, sandbox.Node, "tcp", web(81))
		// The node's UDP: the reject drops the datagram on its way
		// out, and the send fails with EPERM.
		edgeExpectICMPError(t, e, "prohibited", sandbox.Node, "udp", web(81))
		if n := probe.count(t, f.name) - before; n != 0 {
			t.Errorf("%d packets to %s left the node; want none (rejected)", n, f.web)
		}
	} else {
		edgeExpectDropped(t, e, podC.Name, "tcp", web(81))
		edgeExpectDropped(t, e, podC.Name, "udp", web(81))
		if n := probe.count(t, f.name) - before; n < 2*edgeDropCount {
			t.Errorf("%d packets to %s:81 reached the client; want the %d sent: iptables mode leaves them to the node's routes",
				n, f.web, 2*edgeDropCount)
		}
	}

	// An address of the ServiceCIDR no Service holds gets no answer:
	// nftables mode drops it on the node, iptables mode lets it out.
	before = probe.count(t, f.name)
	for _, proto := range []string{"tcp", "udp"} {
		edgeExpectDropped(t, e, podC.Name, proto, edgeAddr(f.unallocated, 80))
	}
	left := probe.count(t, f.name) - before
	switch {
	case nftablesMode && left != 0:
		t.Errorf("%d packets to %s (unallocated) left the node; want none (dropped)", left, f.unallocated)
	case !nftablesMode && left < 2*edgeDropCount:
		t.Errorf("%d packets to %s (unallocated) reached the client; want the %d sent", left, f.unallocated, 2*edgeDropCount)
	}
}

// checkClusterIPTrace: `trace` on the live tables gives the verdicts the
// traffic meets: reject for an undefined port, drop for an unallocated
// address, in nftables mode; neither in iptables mode.
func checkClusterIPTrace(t *testing.T, e *env, f checksFamily, nftablesMode bool) {
	t.Helper()
	src := podC.IPv4
	if f.web.Is6() {
		src = podC.IPv6
	}
	for _, tc := range []struct{ dst, nft string }{
		{edgeAddr(f.web, 81), "reject"},
		{edgeAddr(f.unallocated, 80), "drop"},
	} {
		want := tc.nft
		if !nftablesMode {
			want = "accept"
		}
		for _, proto := range []string{"tcp", "udp"} {
			if tr := e.trace(t, "--src", src.String(), "--dst", tc.dst+"/"+proto); tr.verdict != want {
				t.Errorf("trace of %s/%s from %s: verdict %q, want %q:\n%s", tc.dst, proto, src, tr.verdict, want, tr.text)
			}
		}
	}
}

// checksFamily holds one family's addresses of the checks.
type checksFamily struct {
	name             string
	web              netip.Addr // the example's web: TCP 80 with endpoints
	none, localNone  netip.Addr // ClusterIPs of "none" and "local-none"
	unallocated      netip.Addr // in the ServiceCIDR, held by no Service
	serviceCIDR      netip.Prefix
	clientProbeMatch string // nft match of the client's counter
}

var checksFamilies = []checksFamily{
	{
		name: "IPv4", web: netip.MustParseAddr(webClusterIPv4),
		none: netip.MustParseAddr("10.96.0.60"), localNone: netip.MustParseAddr("10.96.0.61"),
		unallocated: netip.MustParseAddr("10.96.0.200"), serviceCIDR: netip.MustParsePrefix("10.96.0.0/16"),
		clientProbeMatch: "ip daddr 10.96.0.0/16",
	},
	{
		name: "IPv6", web: netip.MustParseAddr(webClusterIPv6),
		none: netip.MustParseAddr("fd00:10:96::60"), localNone: netip.MustParseAddr("fd00:10:96::61"),
		unallocated: netip.MustParseAddr("fd00:10:96::200"), serviceCIDR: netip.MustParsePrefix("fd00:10:96::/112"),
		clientProbeMatch: "ip6 daddr fd00:10:96::/112",
	},
}

// checksState is checks.yaml: Services "none" (TCP 80, no endpoints) and
// "local-none" (TCP 80, internalTrafficPolicy Local, its only endpoint on
// another node), dual-stack, and a ServiceCIDR of the sandbox's Service
// ranges.
func checksState() string {
	v4, v6 := checksFamilies[0], checksFamilies[1]
	svc := func(name string, v4ip, v6ip netip.Addr, extra string) string {
		return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: %s, namespace: default}
spec:
  type: ClusterIP
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv6]
  clusterIP: %s
  clusterIPs: [%s, %q]
%s  ports:
  - {name: http, protocol: TCP, port: 80, targetPort: %d}
`, name, v4ip, v4ip, v6ip, extra, podTCPPort)
	}
	elsewhere := func(family, addr string) string {
		return fmt.Sprintf(`apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: local-none-%s
  namespace: default
  labels: {kubernetes.io/service-name: local-none}
addressType: %s
ports:
- {name: http, protocol: TCP, port: %d}
endpoints:
- addresses: [%q]
  conditions: {ready: true, serving: true, terminating: false}
  nodeName: node-2
`, strings.ToLower(family), family, podTCPPort, addr)
	}
	return documents(
		fmt.Sprintf("apiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata: {name: kubernetes}\nspec: {cidrs: [%s, %q]}\n",
			v4.serviceCIDR, v6.serviceCIDR),
		svc("none", v4.none, v6.none, ""),
		svc("local-none", v4.localNone, v6.localNone, "  internalTrafficPolicy: Local\n"),
		elsewhere("IPv4", podA.IPv4.String()),
		elsewhere("IPv6", podA.IPv6.String()),
	)
}

// leakProbe counts, in the client's namespace (where the node's default
// route leads), the packets that reach it for the Service ranges: what
// the node let out by its routes.
type leakProbe struct {
	e *env
}

var leakCounterRE = regexp.MustCompile(`counter packets (\d+) bytes \d+ comment "([^"]+)"`)

func newLeakProbe(t *testing.T, e *env) *leakProbe {
	t.Helper()
	var rules []string
	for _, f := range checksFamilies {
		rules = append(rules, fmt.Sprintf("add rule inet knp-leak pre %s counter comment %q", f.clientProbeMatch, f.name))
	}
	script := "add table inet knp-leak\n" +
		"add chain inet knp-leak pre { type filter hook prerouting priority -300; policy accept; }\n" +
		strings.Join(rules, "\n") + "\n"
	cmd := e.sb.Command(t.Context(), sandbox.Client, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the client's probe table: %v: %s", err, out)
	}
	return &leakProbe{e: e}
}

// count is the client's counter of the family's Service range.
func (p *leakProbe) count(t *testing.T, family string) int {
	t.Helper()
	out := flagsExec(t, p.e, sandbox.Client, "nft", "list", "table", "inet", "knp-leak")
	for _, m := range leakCounterRE.FindAllStringSubmatch(out, -1) {
		if m[2] == family {
			n, _ := strconv.Atoi(m[1])
			return n
		}
	}
	t.Fatalf("no counter %q in the client's probe table:\n%s", family, out)
	return 0
}
