package proxy

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

// KUBE-FORWARD, in the base chain filter-forward of the proxy's main tables:
//
//	ct state invalid drop                 (unless --conntrack-tcp-be-liberal)
//	meta mark & 0x00004000 == 0x00004000 accept
//	ct state established,related accept
//
// In iptables mode these accepts let Service traffic through a FORWARD
// chain whose policy is DROP. nftables has no such thing as one table's
// accept overriding another's drop: a packet goes through every base chain
// of the hook, and an accept only ends the chain it is in. A forward chain
// with policy drop elsewhere drops NodePort traffic that KUBE-FORWARD
// accepted; TestFeaturesKubeForward shows that, then shows that the packets
// carry the mark KUBE-FORWARD accepts, by accepting that mark in such a
// chain of our own (the proxy's rules have no counters; ours do).

const (
	edgeFwdTable = "edge-forward-policy" // family inet, in the node namespace
	edgeFwdMark  = "0x00004000"          // the masquerade bit, 14
)

// TestFeaturesKubeForward checks KUBE-FORWARD with and without
// --conntrack-tcp-be-liberal, and that forwarded NodePort traffic carries
// the mark its accept rule matches.
func TestFeaturesKubeForward(t *testing.T) {
	t.Parallel()
	needRoot(t)
	t.Run("Default", func(t *testing.T) {
		e := newEnv(t, envOptions{pods: []sandbox.Pod{podA, podB, podC}})
		checkKubeForward(t, e, true)
		testForwardDropPolicy(t, e)
	})
	t.Run("TCPBeLiberal", func(t *testing.T) {
		e := newEnv(t, envOptions{pods: []sandbox.Pod{podA, podB, podC}, proxyArgs: []string{"--conntrack-tcp-be-liberal"}})
		checkKubeForward(t, e, false)
		// Nothing else changes: NodePort traffic still flows.
		sum := e.requests(t, sandbox.Client, "tcp", hostPort(sandbox.NodeIPv4.Addr().String(), webNodePort), requestsPerCheck)
		expectBackends(t, "tcp from the client to the NodePort", sum, podA.Name, podB.Name)
	})
}

// checkKubeForward checks `nft list chain FAMILY kube-nftproxy
// KUBE-FORWARD` in both families: `ct state invalid drop` first if
// invalidDrop, else nowhere; then the mark and conntrack accepts; and that
// filter-forward jumps to it.
func checkKubeForward(t *testing.T, e *env, invalidDrop bool) {
	t.Helper()
	for _, family := range []string{"ip", "ip6"} {
		rules := listProxyChain(t, e, family, "KUBE-FORWARD")
		const drop = "ct state invalid drop"
		switch i := slices.Index(rules, drop); {
		case invalidDrop && i != 0:
			t.Errorf("%s KUBE-FORWARD: %q is rule %d, want the first rule: %q", family, drop, i, rules)
		case !invalidDrop && i >= 0:
			t.Errorf("%s KUBE-FORWARD: %q with --conntrack-tcp-be-liberal: %q", family, drop, rules)
		}
		for _, want := range []string{
			"meta mark & " + edgeFwdMark + " == " + edgeFwdMark + " accept",
			"ct state established,related accept",
		} {
			if !slices.ContainsFunc(rules, func(l string) bool { return strings.HasPrefix(l, want) }) {
				t.Errorf("%s KUBE-FORWARD has no %q: %q", family, want, rules)
			}
		}
		if fwd := listProxyChain(t, e, family, "filter-forward"); !slices.Contains(fwd, "jump KUBE-FORWARD") {
			t.Errorf("%s filter-forward does not jump to KUBE-FORWARD: %q", family, fwd)
		}
	}
}

// listProxyChain returns the rules of a chain of the proxy's main table in
// family, as `nft list chain` prints them (the chain's type line included,
// for base chains).
func listProxyChain(t *testing.T, e *env, family, chain string) []string {
	t.Helper()
	out, err := e.sb.Exec(t.Context(), sandbox.Node, "nft", "list", "chain", family, "kube-nftproxy", chain)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := parseRuleset(string(out))
	if err != nil {
		t.Fatal(err)
	}
	body, ok := rs[family+" kube-nftproxy"]["chain "+chain]
	if !ok {
		t.Fatalf("nft list chain %s kube-nftproxy %s printed no such chain:\n%s", family, chain, out)
	}
	return slices.DeleteFunc(body, func(l string) bool { return l == "" })
}

// testForwardDropPolicy adds a forward chain with policy drop (priority 10,
// after the proxy's filter-forward) that accepts established flows only,
// shows that NodePort traffic does not get through it, then accepts what
// carries the masquerade mark and shows that NodePort traffic flows again
// while unmarked forwarded traffic (a pod to a ClusterIP) stays dropped.
func testForwardDropPolicy(t *testing.T, e *env) {
	t.Helper()
	nftIn := func(args ...string) string {
		t.Helper()
		out, err := e.sb.Exec(t.Context(), sandbox.Node, append([]string{"nft"}, args...)...)
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	}
	nftIn("add", "table", "inet", edgeFwdTable)
	t.Cleanup(func() {
		// Before the proxy stops and the sandbox goes with the table.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := e.sb.Exec(ctx, sandbox.Node, "nft", "delete", "table", "inet", edgeFwdTable); err != nil {
			t.Error(err)
		}
	})
	nftIn("add", "chain", "inet", edgeFwdTable, "forward", "{ type filter hook forward priority 10; policy drop; }")
	nftIn("add", "rule", "inet", edgeFwdTable, "forward", "ct", "state", "established,related", "accept")

	nodePorts := []struct{ proto, addr string }{
		{"tcp", hostPort(sandbox.NodeIPv4.Addr().String(), webNodePort)},
		{"tcp", hostPort(sandbox.NodeIPv6.Addr().String(), webNodePort)},
		{"udp", hostPort(sandbox.NodeIPv4.Addr().String(), dnsNodePort)},
	}
	// KUBE-FORWARD accepts these packets, and they are dropped all the same.
	for _, np := range nodePorts {
		edgeExpectDropped(t, e, sandbox.Client, np.proto, np.addr)
	}

	nftIn("insert", "rule", "inet", edgeFwdTable, "forward", "meta", "mark", "&", edgeFwdMark, "==", edgeFwdMark, "counter", "accept")
	for _, np := range nodePorts {
		sum := e.requests(t, sandbox.Client, np.proto, np.addr, requestsPerCheck)
		expectBackends(t, fmt.Sprintf("%s from the client to %s through a drop policy that accepts the mark", np.proto, np.addr), sum, podA.Name, podB.Name)
	}
	// Unmarked forwarded traffic: a pod's own, to a ClusterIP.
	edgeExpectDropped(t, e, podC.Name, "tcp", hostPort(webClusterIPv4, webPort))

	// NodePort connections' first packets were counted. Not necessarily
	// every one: a UDP request that reuses a 5-tuple conntrack still holds
	// is not new, gets no mark and passes as established.
	listing := nftIn("list", "chain", "inet", edgeFwdTable, "forward")
	m := regexp.MustCompile(`meta mark & ` + edgeFwdMark + ` == ` + edgeFwdMark + ` counter packets (\d+) bytes \d+ accept`).FindStringSubmatch(listing)
	if m == nil {
		t.Fatalf("no counted mark rule in our chain:\n%s", listing)
	}
	if n, _ := strconv.Atoi(m[1]); n < len(nodePorts)*requestsPerCheck/2 {
		t.Errorf("our mark rule counted %d packets, want at least %d (one per new NodePort connection, %d requests):\n%s",
			n, len(nodePorts)*requestsPerCheck/2, len(nodePorts)*requestsPerCheck, listing)
	}
}
