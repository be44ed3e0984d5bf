package upstream

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/echo"
	"github.com/kube-nftproxy/kube-nftproxy/e2e/internal/testbin"
)

// TestUpstreamNFTablesClusterIPChecks: upstream kube-proxy v1.37.1 and
// kube-nftproxy, both in nftables mode, on one API server (whose default
// ServiceCIDR is 10.96.0.0/16 and fd00:10:96::/112), give the node's own
// traffic the same verdicts: a port the Service does not define is
// refused at once (TCP) or the send refused (UDP: the reject drops the
// datagram on its way out), an address of the ServiceCIDR that no Service
// holds gets no answer, and an address outside it is left to the routes.
// Each namespace routes everything to the API server's, which drops what is
// not for it, so only the proxies' rules answer.
func TestUpstreamNFTablesClusterIPChecks(t *testing.T) {
	t.Parallel()
	kubeProxy := needTools(t)
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skipf("skipping: upstream's nftables mode runs nft: %v", err)
	}
	dir := t.TempDir()
	ours, err := testbin.Build(testbin.Module+"/cmd/kube-nftproxy", dir)
	if err != nil {
		t.Fatal(err)
	}
	agent, err := testbin.Build(testbin.Module+"/e2e/agent", dir)
	if err != nil {
		t.Fatal(err)
	}
	e := newTestEnv(t, dir, ours)
	e.do("POST", "/api/v1/namespaces/default/services", map[string]any{
		"apiVersion": "v1", "kind": "Service",
		"metadata": map[string]any{"name": "web", "namespace": "default"},
		"spec": map[string]any{"clusterIP": "10.96.5.10", "clusterIPs": []string{"10.96.5.10"},
			"ports": []map[string]any{{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080}}},
	}, nil)

	taken := map[int]bool{}
	common := func(ns string) []string {
		return []string{"--proxy-mode=nftables", "--hostname-override", localNode, "--cluster-cidr", "10.244.0.0/16,fd00:10:244::/48",
			"--metrics-bind-address", fmt.Sprintf("127.0.0.1:%d", freePort(t, ns, taken)),
			"--healthz-bind-address", fmt.Sprintf("127.0.0.1:%d", freePort(t, ns, taken)),
			"--iptables-min-sync-period=100ms"}
	}
	procs := map[string]*process{
		e.upNS: start(t, "kube-proxy", e.upNS, filepath.Join(dir, "kube-proxy-nft.log"), []string{"PATH=" + os.Getenv("PATH")},
			append([]string{kubeProxy, "--kubeconfig", kubeconfigVia(t, e.srv, "10.123.1.1", dir), "--v=2",
				"--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0"}, common(e.upNS)...)...),
		e.ouNS: start(t, "kube-nftproxy", e.ouNS, filepath.Join(dir, "kube-nftproxy-nft.log"), nil,
			append([]string{ours, "--kubeconfig", kubeconfigVia(t, e.srv, "10.123.2.1", dir)}, common(e.ouNS)...)...),
	}
	tables := map[string]string{e.upNS: "kube-proxy", e.ouNS: "kube-nftproxy"}
	gateways := map[string]string{e.upNS: "10.123.1.1", e.ouNS: "10.123.2.1"}
	for ns, p := range procs {
		run(t, "ip", "-n", ns, "route", "add", "default", "via", gateways[ns])
		waitChain(t, p, ns, tables[ns], "10.96.5.10", "10.96.0.0/16")
		for _, what := range [][]string{{"chain", "ip", tables[ns], "cluster-ips-check"}, {"chain", "ip", tables[ns], "filter-forward"}, {"chain", "ip", tables[ns], "filter-output"}} {
			out, _ := exec.Command("ip", append([]string{"netns", "exec", ns, "nft", "list"}, what...)...).CombinedOutput()
			t.Logf("%s: nft list %s:\n%s", p.name, strings.Join(what, " "), out)
		}
	}

	for _, tc := range []struct {
		proto, addr, want string
	}{
		{"tcp", "10.96.5.10:81", "refused"},
		{"udp", "10.96.5.10:81", "prohibited"},
		{"tcp", "10.96.5.200:80", "timeout"},
		{"udp", "10.96.5.200:80", "prohibited"}, // dropped on the way out: the send fails
		{"tcp", "10.97.0.1:80", "timeout"},      // outside: routed away, unanswered
		{"udp", "10.97.0.1:80", "timeout"},      // sent, unanswered: not dropped
	} {
		got := map[string]string{}
		for ns := range procs {
			got[tables[ns]] = clientError(t, agent, ns, tc.proto, tc.addr)
		}
		t.Logf("%s %s: upstream %s, ours %s", tc.proto, tc.addr, got["kube-proxy"], got["kube-nftproxy"])
		if got["kube-proxy"] != got["kube-nftproxy"] || got["kube-nftproxy"] != tc.want {
			t.Errorf("%s %s: upstream %q, ours %q; want both %q", tc.proto, tc.addr, got["kube-proxy"], got["kube-nftproxy"], tc.want)
		}
	}
}

// waitChain waits until the namespace's table has the ClusterIP in its
// set and the ServiceCIDR's drop rule in cluster-ips-check.
func waitChain(t *testing.T, p *process, ns, table, clusterIP, cidr string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if err := p.exited(); err != nil {
			t.Fatal(err)
		}
		set, _ := exec.Command("ip", "netns", "exec", ns, "nft", "list", "set", "ip", table, "cluster-ips").CombinedOutput()
		chain, _ := exec.Command("ip", "netns", "exec", ns, "nft", "list", "chain", "ip", table, "cluster-ips-check").CombinedOutput()
		drops := strings.Contains(string(chain), "ip daddr "+cidr+" drop") || strings.Contains(string(chain), "ip daddr { "+cidr+" } drop")
		if strings.Contains(string(set), clusterIP) && drops {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: table %s lacks %s in cluster-ips or %s's drop in cluster-ips-check after 60s:\n%s\n%s", p.name, table, clusterIP, cidr, set, chain)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// clientError sends two requests from the namespace and returns the error
// kind both got ("" if any was answered, or they differ).
func clientError(t *testing.T, agent, ns, proto, addr string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	out, _ := exec.CommandContext(ctx, "ip", "netns", "exec", ns, agent, "client", "--"+proto, addr, "--count", "2",
		"--timeout", "500ms", "--results", "all").Output()
	var sum echo.Summary
	if err := json.Unmarshal(out, &sum); err != nil {
		t.Fatalf("client output %q: %v", out, err)
	}
	for kind, n := range sum.Errors {
		if n == 2 {
			return kind
		}
	}
	return fmt.Sprintf("answers %d, errors %v", sum.OK, sum.Errors)
}
