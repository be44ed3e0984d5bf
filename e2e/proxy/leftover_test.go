package proxy

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/apiserver"
	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

// upstreamKubeProxy is where hack/kube-proxy/build.sh caches upstream
// kube-proxy ($KNP_KUBE_PROXY overrides).
func upstreamKubeProxy(t *testing.T) string {
	t.Helper()
	p := apiserver.KubeProxyPath()
	if _, err := os.Stat(p); err != nil {
		t.Skipf("no upstream kube-proxy (build it with hack/kube-proxy/build.sh): %v", err)
	}
	for _, tool := range []string{"iptables-nft-restore", "ip6tables-nft-restore", "iptables"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s (apt-get install iptables)", tool)
		}
	}
	return p
}

// someoneElses are rules of other software in the iptables-nft tables
// kube-proxy writes in (Docker-like chains and jumps, kubelet's
// KUBE-FIREWALL as kube-proxy itself writes it and its canaries), and a
// foreign nftables table: none of it may change.
const someoneElses = `
iptables-nft-restore --noflush <<'EOF'
*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:DOCKER - [0:0]
-A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER
-A OUTPUT ! -d 127.0.0.0/8 -m addrtype --dst-type LOCAL -j DOCKER
-A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE
-A DOCKER -i docker0 -j RETURN
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:DOCKER-USER - [0:0]
:KUBE-FIREWALL - [0:0]
-A INPUT -j KUBE-FIREWALL
-A FORWARD -j DOCKER-USER
-A OUTPUT -j KUBE-FIREWALL
-A DOCKER-USER -j RETURN
-A KUBE-FIREWALL -m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
COMMIT
*mangle
:PREROUTING ACCEPT [0:0]
:KUBE-IPTABLES-HINT - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
-A PREROUTING -p tcp --dport 22 -j MARK --set-mark 0x10
COMMIT
EOF
ip6tables-nft-restore --noflush <<'EOF'
*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
-A POSTROUTING -s fd00:17::/64 -j MASQUERADE
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:DOCKER-USER - [0:0]
:KUBE-FIREWALL - [0:0]
-A INPUT -j KUBE-FIREWALL
-A FORWARD -j DOCKER-USER
-A OUTPUT -j KUBE-FIREWALL
COMMIT
*mangle
:KUBE-IPTABLES-HINT - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
COMMIT
EOF
nft -f - <<'EOF'
table inet cni-filter {
	chain forward {
		type filter hook forward priority filter; policy accept;
		ct state established,related accept
	}
}
EOF
`

// upstreamEnv is a sandbox with the API server in the node namespace, a
// Node and a few Services, and someone else's rules; no proxy runs yet.
type upstreamEnv struct {
	*apiEnv
	kubeProxy string
	before    string // the node's ruleset before any proxy ran
}

func newUpstreamEnv(t *testing.T) *upstreamEnv {
	t.Helper()
	needRoot(t)
	bin := upstreamKubeProxy(t)
	if err := apiserver.Available(); err != nil {
		if os.Getenv("KNP_REQUIRE_APISERVER") == "1" {
			t.Fatalf("KNP_REQUIRE_APISERVER=1 but %v", err)
		}
		t.Skipf("skipping API server test: %v", err)
	}
	e := &env{sb: newSandbox(t, []sandbox.Pod{podA, podB, podC})}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	srv, err := apiserver.StartWithOptions(ctx, t, apiserver.Options{NetNS: e.sb.NS(sandbox.Node)})
	if err != nil {
		t.Fatal(err)
	}
	a := &apiEnv{env: e, srv: srv}
	a.do(t, "POST", "/api/v1/nodes", &corev1.Node{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{Name: nodeName},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: sandbox.NodeIPv4.Addr().String()},
			{Type: corev1.NodeInternalIP, Address: sandbox.NodeIPv6.Addr().String()},
		}},
	}, nil)
	for i, name := range []string{"left-web", "left-other"} {
		svc := apiService(name, fmt.Sprintf("10.96.2.%d", 10+i), nil)
		if i == 0 {
			svc.Spec.Type = corev1.ServiceTypeNodePort
		}
		a.do(t, "POST", servicesPath, svc, nil)
		a.do(t, "POST", slicesPath, apiSlice(name, nil, podA, podB), nil)
	}
	if out, err := e.sb.Exec(t.Context(), sandbox.Node, "sh", "-ec", someoneElses); err != nil {
		t.Fatalf("someone else's rules: %v: %s", err, out)
	}
	return &upstreamEnv{apiEnv: a, kubeProxy: bin, before: counters.ReplaceAllString(e.nftRuleset(t), "counter packets 0 bytes 0")}
}

var counters = regexp.MustCompile(`counter packets \d+ bytes \d+`)

// ruleset is the node's ruleset with counters zeroed: the API server's
// traffic on loopback moves them.
func (u *upstreamEnv) ruleset(t *testing.T) string {
	return counters.ReplaceAllString(u.nftRuleset(t), "counter packets 0 bytes 0")
}

// runKubeProxy starts upstream kube-proxy in mode in the node namespace,
// waits until its rules are in the ruleset (a line containing want), and
// returns it running; the end of the test stops it.
func (u *upstreamEnv) runKubeProxy(t *testing.T, mode string, want ...string) *sandbox.Process {
	t.Helper()
	log := &lineLog{prefix: "kube-proxy " + mode + ": ", logf: t.Logf}
	cmd := u.sb.Command(context.Background(), sandbox.Node, u.kubeProxy,
		"--kubeconfig", u.srv.ProxyKubeconfig, "--hostname-override", nodeName,
		"--proxy-mode", mode, "--cluster-cidr", clusterCIDRs(),
		"--conntrack-max-per-core", "0", "--conntrack-tcp-timeout-established", "0", "--conntrack-tcp-timeout-close-wait", "0",
		"--healthz-bind-address", "127.0.0.1:30256", "--metrics-bind-address", "127.0.0.1:30249", "--v", "2")
	cmd.Stdout, cmd.Stderr = log, log
	proc, err := u.sb.StartCmd(sandbox.Node, cmd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proc.Stop(10 * time.Second) })
	err = sandbox.Poll(t.Context(), 90*time.Second, 100*time.Millisecond, func(context.Context) error {
		if proc.Exited() {
			return fmt.Errorf("kube-proxy exited: %v", proc.Wait())
		}
		r := u.nftRuleset(t)
		for _, w := range want {
			if !strings.Contains(r, w) {
				return fmt.Errorf("no %q in the ruleset yet", w)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("waiting for kube-proxy's %s rules: %v", mode, err)
	}
	return proc
}

// leftKubeProxy leaves real upstream kube-proxy rules of both modes, as
// after a node switched modes and then to us: kube-proxy in nftables mode,
// stopped, then in iptables mode (with iptables-nft), stopped. Each mode
// removes the other's at start, so the nftables mode's tables, as it
// wrote them, are loaded again afterwards.
func (u *upstreamEnv) leftKubeProxy(t *testing.T) string {
	t.Helper()
	p := u.runKubeProxy(t, "nftables", "table ip kube-proxy", "table ip6 kube-proxy")
	if err := p.Stop(10 * time.Second); err != nil {
		t.Logf("kube-proxy nftables on SIGTERM: %v", err)
	}
	var tables strings.Builder
	for _, f := range []string{"ip", "ip6"} {
		out, err := u.sb.Exec(t.Context(), sandbox.Node, "nft", "list", "table", f, "kube-proxy")
		if err != nil {
			t.Fatalf("nft list table %s kube-proxy: %v: %s", f, err, out)
		}
		tables.Write(out)
	}
	p = u.runKubeProxy(t, "iptables", "jump KUBE-SVC-", "table ip6 nat")
	if err := p.Stop(10 * time.Second); err != nil {
		t.Logf("kube-proxy iptables on SIGTERM: %v", err)
	}
	if out, err := u.sb.Exec(t.Context(), sandbox.Node, "sh", "-ec", "nft -f - <<'EOF'\n"+tables.String()+"EOF\n"); err != nil {
		t.Fatalf("loading kube-proxy's nftables tables again: %v: %s", err, out)
	}
	during := u.nftRuleset(t)
	for _, want := range []string{"table ip kube-proxy", "table ip6 kube-proxy", "chain KUBE-SERVICES", "jump KUBE-SVC-", "jump KUBE-POSTROUTING"} {
		if !strings.Contains(during, want) {
			t.Fatalf("kube-proxy left no %q:\n%s", want, during)
		}
	}
	return during
}

// withoutOurs is a ruleset without our own tables (kube-nftproxy*).
func withoutOurs(ruleset string) string {
	var b strings.Builder
	skip := false
	for l := range strings.Lines(ruleset) {
		if strings.HasPrefix(l, "table ") {
			f := strings.Fields(l)
			skip = len(f) >= 3 && strings.HasPrefix(f[2], "kube-nftproxy")
		}
		if !skip {
			b.WriteString(l)
		}
		if skip && l == "}\n" {
			skip = false
		}
	}
	return b.String()
}

// TestCleanupLeavesUpstreamRules: real upstream kube-proxy's iptables-mode
// (iptables-nft) and nftables-mode rules, as on a node rolled back to
// kube-proxy (docs/migration.md, step 6), then `kube-nftproxy --cleanup`:
// it removes nothing of theirs, so the ruleset stays exactly as it was.
func TestCleanupLeavesUpstreamRules(t *testing.T) {
	t.Parallel()
	u := newUpstreamEnv(t)
	u.leftKubeProxy(t)
	withKubeProxy := u.ruleset(t)
	if out := cleanup(t, u.sb); !strings.Contains(out, "nothing to clean up") {
		t.Errorf("--cleanup printed %q, want nothing to clean up", out)
	}
	if after := u.ruleset(t); after != withKubeProxy {
		t.Errorf("--cleanup changed kube-proxy's rules:\n%s", lineDiff(withKubeProxy, after))
	}
}

// TestUpstreamLeftoversStartAndWatch: kube-proxy's leftovers are removed
// when our proxy starts, and kube-proxy rules that appear while it runs (an
// old kube-proxy still running) are removed with a warning and counted.
func TestUpstreamLeftoversStartAndWatch(t *testing.T) {
	t.Parallel()
	u := newUpstreamEnv(t)
	u.leftKubeProxy(t)
	p := startAPIProxy(t, u.sb, u.srv.ProxyKubeconfig)
	u.proxy = p
	p.waitLog(t, 10*time.Second, "the start-up removal", func(lines []string) bool {
		return logHas(lines, "removed upstream kube-proxy's leftovers")
	})
	if after := withoutOurs(u.ruleset(t)); after != u.before {
		t.Errorf("after our start-up, the ruleset but our tables is not what it was before kube-proxy ran:\n%s", lineDiff(u.before, after))
	}

	// An old kube-proxy still running: its rules come back, and go again.
	// Not waiting for its rules: ours may remove them before a look.
	kp := u.runKubeProxy(t, "iptables")
	p.waitLog(t, 30*time.Second, "the warning about kube-proxy's rules", func(lines []string) bool {
		return logHas(warningLines(lines), "appeared while running", "ip nat")
	})
	p.poll(t, 30*time.Second, "kube-proxy's rules gone", func(context.Context) error {
		if r := u.nftRuleset(t); strings.Contains(r, "KUBE-SERVICES") && strings.Contains(withoutOurs(r), "KUBE-SERVICES") {
			return fmt.Errorf("kube-proxy's chains are still there")
		}
		return nil
	})
	if err := kp.Stop(10 * time.Second); err != nil {
		t.Logf("kube-proxy on SIGTERM: %v", err)
	}
	m, err := u.fetchMetrics(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if n := m[`kubenftproxy_upstream_leftovers_removed_total{kind="iptables_chain"}`]; n < 2 {
		t.Errorf("iptables_chain removals counted: %v, want those at start and while running", n)
	}
	p.poll(t, 30*time.Second, "the ruleset but ours as before", func(context.Context) error {
		if after := withoutOurs(u.ruleset(t)); after != u.before {
			return fmt.Errorf("differs:\n%s", lineDiff(u.before, after))
		}
		return nil
	})
}

func logHas(lines []string, subs ...string) bool {
	for _, l := range lines {
		ok := true
		for _, s := range subs {
			ok = ok && strings.Contains(l, s)
		}
		if ok {
			return true
		}
	}
	return false
}

// lineDiff lists the lines only in a (-) and only in b (+).
func lineDiff(a, b string) string {
	count := map[string]int{}
	for l := range strings.Lines(a) {
		count[l]++
	}
	for l := range strings.Lines(b) {
		count[l]--
	}
	var out strings.Builder
	for l, n := range count {
		for ; n > 0; n-- {
			out.WriteString("- " + l)
		}
		for ; n < 0; n++ {
			out.WriteString("+ " + l)
		}
	}
	if out.Len() == 0 {
		return "(same lines, in another order)\n--- want\n" + a + "--- got\n" + b
	}
	return out.String()
}
