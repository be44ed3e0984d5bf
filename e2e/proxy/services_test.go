package proxy

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

// requestsPerCheck is enough for both of two endpoints to answer: a random
// choice misses one with probability 2^-39.
const requestsPerCheck = 40

// TestServices runs the proxy on the example state and checks the data path
// and the ruleset. The subtests share one sandbox and proxy; only the last
// one changes the state, and it puts it back.
func TestServices(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{pods: []sandbox.Pod{podA, podB, podC}})
	nodePort4 := hostPort(sandbox.NodeIPv4.Addr().String(), webNodePort)

	t.Run("ClusterIP", func(t *testing.T) {
		for _, from := range []string{podA.Name, sandbox.Node} {
			for _, tc := range []struct{ proto, addr string }{
				{"tcp", hostPort(webClusterIPv4, webPort)},
				{"udp", hostPort(dnsClusterIP, dnsPort)},
			} {
				what := fmt.Sprintf("%s from %s to %s", tc.proto, from, tc.addr)
				sum := e.requests(t, from, tc.proto, tc.addr, requestsPerCheck)
				expectBackends(t, what, sum, podA.Name, podB.Name)
			}
		}
	})

	t.Run("NodePort", func(t *testing.T) {
		for _, tc := range []struct{ proto, addr string }{
			{"tcp", nodePort4},
			{"udp", hostPort(sandbox.NodeIPv4.Addr().String(), dnsNodePort)},
			{"tcp", hostPort(sandbox.NodeIPv6.Addr().String(), webNodePort)},
		} {
			sum := e.requests(t, sandbox.Client, tc.proto, tc.addr, requestsPerCheck)
			expectBackends(t, fmt.Sprintf("%s from the client to %s", tc.proto, tc.addr), sum, podA.Name, podB.Name)
		}
	})

	// A pod that reaches itself through its Service is masqueraded (else
	// it would answer itself directly, bypassing conntrack's reverse NAT);
	// one that reaches another pod keeps its own address.
	t.Run("Hairpin", func(t *testing.T) {
		for _, from := range []sandbox.Pod{podA, podB} {
			for _, tc := range []struct {
				proto, addr string
				own, node   netip.Addr
			}{
				{"tcp", hostPort(webClusterIPv4, webPort), from.IPv4, sandbox.BridgeIPv4.Addr()},
				{"udp", hostPort(dnsClusterIP, dnsPort), from.IPv4, sandbox.BridgeIPv4.Addr()},
				{"tcp", hostPort(webClusterIPv6, webPort), from.IPv6, sandbox.BridgeIPv6.Addr()},
			} {
				what := fmt.Sprintf("%s from %s to %s", tc.proto, from.Name, tc.addr)
				sum := e.requests(t, from.Name, tc.proto, tc.addr, requestsPerCheck)
				expectBackends(t, what, sum, podA.Name, podB.Name)
				for _, r := range sum.Results {
					if r.Error != "" {
						continue
					}
					src, err := netip.ParseAddrPort(r.Source)
					if err != nil {
						t.Fatalf("%s: source %q: %v", what, r.Source, err)
					}
					want := tc.own
					if r.Backend == from.Name {
						want = tc.node
					}
					if src.Addr() != want {
						t.Errorf("%s: %s saw source %v, want %v", what, r.Backend, src.Addr(), want)
					}
				}
			}
		}
	})

	t.Run("SourceIP", func(t *testing.T) {
		for _, tc := range []struct {
			from, proto, addr string
			want              []netip.Addr // the sources allowed
		}{
			// Off-cluster clients are masqueraded to a node address:
			// NodePorts always, ClusterIPs because they come from
			// outside --cluster-cidr.
			{sandbox.Client, "tcp", nodePort4, nodeAddrs},
			{sandbox.Client, "udp", hostPort(sandbox.NodeIPv4.Addr().String(), dnsNodePort), nodeAddrs},
			{sandbox.Client, "tcp", hostPort(sandbox.NodeIPv6.Addr().String(), webNodePort), nodeAddrs},
			{sandbox.Client, "tcp", hostPort(webClusterIPv4, webPort), nodeAddrs},
			// Pods keep their own address.
			{podC.Name, "tcp", hostPort(webClusterIPv4, webPort), []netip.Addr{podC.IPv4}},
			{podC.Name, "udp", hostPort(dnsClusterIP, dnsPort), []netip.Addr{podC.IPv4}},
			{podC.Name, "tcp", hostPort(webClusterIPv6, webPort), []netip.Addr{podC.IPv6}},
		} {
			what := fmt.Sprintf("%s from %s to %s", tc.proto, tc.from, tc.addr)
			sum := e.requests(t, tc.from, tc.proto, tc.addr, requestsPerCheck)
			expectBackends(t, what, sum, podA.Name, podB.Name)
			for _, src := range sources(sum) {
				if !slices.Contains(tc.want, src) {
					t.Errorf("%s: servers saw source %v, want one of %v (sources %v)", what, src, tc.want, sum.Sources)
				}
			}
		}
	})

	t.Run("IPv6ClusterIP", func(t *testing.T) {
		addr := hostPort(webClusterIPv6, webPort)
		for _, from := range []string{podC.Name, podA.Name, sandbox.Node} {
			sum := e.requests(t, from, "tcp", addr, requestsPerCheck)
			expectBackends(t, fmt.Sprintf("tcp from %s to %s", from, addr), sum, podA.Name, podB.Name)
			for _, src := range sources(sum) {
				if !src.Is6() || src.Is4In6() {
					t.Errorf("tcp from %s to %s: servers saw source %v, want an IPv6 address", from, addr, src)
				}
			}
		}
	})

	t.Run("Ruleset", func(t *testing.T) {
		out, err := e.sb.Exec(t.Context(), sandbox.Node, "nft", "list", "ruleset")
		if err != nil {
			t.Fatal(err)
		}
		checkExampleRuleset(t, string(out))
	})

	// Last: it edits the state, and puts it back.
	t.Run("EndpointUpdates", func(t *testing.T) {
		testEndpointUpdates(t, e)
	})
}

// checkExampleRuleset checks the listing of the example state's rules.
func checkExampleRuleset(t *testing.T, text string) {
	t.Helper()
	defer func() {
		if t.Failed() {
			t.Logf("nft list ruleset:\n%s", text)
		}
	}()
	rs, err := parseRuleset(text)
	if err != nil {
		t.Fatal(err)
	}
	for _, table := range []string{"ip kube-nftproxy", "ip6 kube-nftproxy"} {
		if _, ok := rs[table]; !ok {
			t.Errorf("no table %s; tables: %v", table, sortedKeys(rs))
			continue
		}
		for _, chain := range []string{"KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-MARK-MASQ", "KUBE-POSTROUTING"} {
			if _, ok := rs[table]["chain "+chain]; !ok {
				t.Errorf("table %s: no chain %s", table, chain)
			}
		}
	}

	type servicePort struct {
		family, spn, proto string
		clusterIP          string
		port, nodePort     string
		endpoints          []netip.AddrPort
	}
	v4 := func(p sandbox.Pod, port uint16) netip.AddrPort { return netip.AddrPortFrom(p.IPv4, port) }
	v6 := func(p sandbox.Pod, port uint16) netip.AddrPort { return netip.AddrPortFrom(p.IPv6, port) }
	for _, sp := range []servicePort{
		{"ip", webSPN, "tcp", webClusterIPv4, webPort, webNodePort, []netip.AddrPort{v4(podA, podTCPPort), v4(podB, podTCPPort)}},
		{"ip6", webSPN, "tcp", webClusterIPv6, webPort, webNodePort, []netip.AddrPort{v6(podA, podTCPPort), v6(podB, podTCPPort)}},
		{"ip", dnsSPN, "udp", dnsClusterIP, dnsPort, dnsNodePort, []netip.AddrPort{v4(podA, podUDPPort), v4(podB, podUDPPort)}},
	} {
		svc, ext := svcChain(sp.spn, sp.proto), extChain(sp.spn, sp.proto)
		comment := fmt.Sprintf("comment %q", sp.spn)
		where := fmt.Sprintf("%s %s %s", sp.family, sp.spn, sp.proto)

		want := fmt.Sprintf("%s . %s . %s comment %q : goto %s", sp.clusterIP, sp.proto, sp.port, sp.spn+" cluster IP", svc)
		if m := rs.mapText(sp.family, "service-ips"); !strings.Contains(m, want) {
			t.Errorf("%s: map service-ips has no element %q:\n%s", where, want, m)
		}
		want = fmt.Sprintf("%s . %s comment %q : goto %s", sp.proto, sp.nodePort, sp.spn, ext)
		if m := rs.mapText(sp.family, "service-nodeports"); !strings.Contains(m, want) {
			t.Errorf("%s: map service-nodeports has no element %q:\n%s", where, want, m)
		}

		svcBody, ok := rs.chain(sp.family, svc)
		if !ok {
			t.Errorf("%s: no chain %s", where, svc)
			continue
		}
		if !slices.Contains(svcBody, comment) {
			t.Errorf("%s: chain %s has no %s: %q", where, svc, comment, svcBody)
		}
		// Off-cluster sources are masqueraded.
		masq := fmt.Sprintf("%s saddr != %v jump KUBE-MARK-MASQ", sp.family, clusterCIDR(sp.family))
		if !slices.ContainsFunc(svcBody, hasWord(masq)) {
			t.Errorf("%s: chain %s has no %q: %q", where, svc, masq, svcBody)
		}
		if body, ok := rs.chain(sp.family, ext); !ok {
			t.Errorf("%s: no chain %s", where, ext)
		} else if !slices.Contains(body, comment) || !slices.ContainsFunc(body, hasWord("goto "+svc)) {
			t.Errorf("%s: chain %s lacks %s or a goto %s: %q", where, ext, comment, svc, body)
		}
		for _, ep := range sp.endpoints {
			sep := sepChain(sp.spn, sp.proto, ep)
			if !slices.ContainsFunc(svcBody, hasWord("goto "+sep)) {
				t.Errorf("%s: chain %s does not go to %s (endpoint %v): %q", where, svc, sep, ep, svcBody)
			}
			body, ok := rs.chain(sp.family, sep)
			if !ok {
				t.Errorf("%s: no chain %s for endpoint %v", where, sep, ep)
				continue
			}
			hairpin := fmt.Sprintf("%s saddr %v jump KUBE-MARK-MASQ", sp.family, ep.Addr())
			dnat := fmt.Sprintf("meta l4proto %s dnat to %v", sp.proto, ep)
			for _, want := range []string{comment, hairpin, dnat} {
				if !slices.Contains(body, want) {
					t.Errorf("%s: chain %s has no %q: %q", where, sep, want, body)
				}
			}
		}
	}
	// dns-like is IPv4 only.
	if _, ok := rs.chain("ip6", svcChain(dnsSPN, "udp")); ok {
		t.Errorf("ip6: chain %s of the IPv4-only %s", svcChain(dnsSPN, "udp"), dnsSPN)
	}
}

// clusterCIDR returns the --cluster-cidr of nft family "ip" or "ip6".
func clusterCIDR(family string) netip.Prefix {
	for _, p := range sandbox.ClusterCIDRs {
		if p.Addr().Is4() == (family == "ip") {
			return p
		}
	}
	panic("no cluster CIDR for " + family)
}

// hasWord returns a predicate for lines holding s followed by a space or
// the line's end (so that a chain name is not matched by its prefix).
func hasWord(s string) func(string) bool {
	return func(line string) bool {
		i := strings.Index(line, s)
		return i >= 0 && (len(line) == i+len(s) || line[i+len(s)] == ' ')
	}
}

// testEndpointUpdates rewrites the example's endpointslices.yaml and checks
// that traffic follows: pod-a removed, then put back.
func testEndpointUpdates(t *testing.T, e *env) {
	const file = "endpointslices.yaml"
	original, err := os.ReadFile(filepath.Join(e.state, file))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { writeAtomic(t, e.state, file, string(original)) })

	checks := []struct{ proto, addr string }{
		{"tcp", hostPort(webClusterIPv4, webPort)},
		{"tcp", hostPort(webClusterIPv6, webPort)},
		{"udp", hostPort(dnsClusterIP, dnsPort)},
	}
	// converge polls until every check is answered by exactly the pods
	// named. The old and the new endpoints both answer all along, so a
	// failed request in between is an error too.
	converge := func(what string, pods ...string) {
		t.Helper()
		for _, c := range checks {
			target := fmt.Sprintf("%s %s from %s", c.proto, c.addr, podC.Name)
			e.proxy.poll(t, 10*time.Second, fmt.Sprintf("%s: %s answered by %v only", what, target, pods), func(context.Context) error {
				sum := e.requests(t, podC.Name, c.proto, c.addr, requestsPerCheck)
				if sum.Failed > 0 {
					t.Fatalf("%s: %s: a request failed while the endpoints changed: %s", what, target, firstError(sum))
				}
				if got := sortedKeys(sum.Backend); !slices.Equal(got, pods) {
					return fmt.Errorf("answered by %v", sum.Backend)
				}
				return nil
			})
		}
	}

	writeAtomic(t, e.state, file, exampleSlices(podB))
	converge("pod-a removed", podB.Name)

	writeAtomic(t, e.state, file, exampleSlices(podA, podB))
	converge("pod-a back", podA.Name, podB.Name)
	e.proxy.checkRunning(t)
}
