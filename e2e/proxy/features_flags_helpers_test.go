package proxy

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

// Helpers of the tests of kube-proxy's flags (features_flags_test.go). Each
// test runs its own proxy, with the flags under test, on the example state
// (web: ClusterIPs 10.96.0.10 and fd00:10:96::10, NodePort 30080, endpoints
// pod-a and pod-b) and checks, with real TCP traffic, which source address
// the endpoints see and where the NodePort answers.

// flagsPodR is a pod that is not on the bridge: its host-side veth
// (veth-pod-r) is taken off kbr0 and the node routes its address to that
// veth, as CNIs with per-pod veths and no bridge (Calico, Cilium's veth
// mode...) do. See flagsRoutePod.
var flagsPodR = sandbox.NewPod("pod-r", 20)

// flagsHostVethPrefix is what the sandbox names the node's ends of the
// pods' veths start with ("veth-pod-a", ...; see e2e/sandbox).
const flagsHostVethPrefix = "veth-"

// flagsFamily holds one IP family's addresses of the checks.
type flagsFamily struct {
	name      string     // "IPv4", "IPv6"
	web       netip.Addr // web's ClusterIP
	node      netip.Addr // the node's address facing the client (its InternalIP)
	node2     netip.Addr // a second node address, on ext0 too (flagsAddNodeAddr2)
	bridge    netip.Addr // the node's address on kbr0: what masquerading towards a pod makes the source
	client    netip.Addr // the client's address
	remotePod netip.Addr // a pod address of another node: within --cluster-cidr, outside the Node's podCIDRs
	pod       func(sandbox.Pod) netip.Addr
}

var flagsFamilies = []flagsFamily{
	{
		name: "IPv4", web: netip.MustParseAddr(webClusterIPv4),
		node: sandbox.NodeIPv4.Addr(), node2: netip.MustParseAddr("10.98.0.1"),
		bridge: sandbox.BridgeIPv4.Addr(), client: sandbox.ClientIPv4.Addr(),
		remotePod: netip.MustParseAddr("10.244.7.2"),
		pod:       func(p sandbox.Pod) netip.Addr { return p.IPv4 },
	},
	{
		name: "IPv6", web: netip.MustParseAddr(webClusterIPv6),
		node: sandbox.NodeIPv6.Addr(), node2: netip.MustParseAddr("fd00:98::1"),
		bridge: sandbox.BridgeIPv6.Addr(), client: sandbox.ClientIPv6.Addr(),
		remotePod: netip.MustParseAddr("fd00:10:244:7::2"),
		pod:       func(p sandbox.Pod) netip.Addr { return p.IPv6 },
	},
}

func flagsWeb(f flagsFamily) string { return hostPort(f.web.String(), webPort) }

func flagsNodePort(a netip.Addr) string { return hostPort(a.String(), webNodePort) }

// newFlagsEnv runs the proxy with the extra flags given on the example
// state, with servers in pod-a and pod-b, pod-c as a client pod on the
// bridge, and the extra pods given.
func newFlagsEnv(t *testing.T, extraPods []sandbox.Pod, args ...string) *env {
	t.Helper()
	return newEnv(t, envOptions{
		pods:      append([]sandbox.Pod{podA, podB, podC}, extraPods...),
		proxyArgs: args,
	})
}

// flagsExec runs args in namespace ns and fails the test if that fails.
func flagsExec(t *testing.T, e *env, ns string, args ...string) string {
	t.Helper()
	out, err := e.sb.Exec(t.Context(), ns, args...)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// flagsExpectSource sends requestsPerCheck TCP requests from ns to addr and
// fails the test unless pod-a and pod-b answer them all and saw src as the
// only source.
func flagsExpectSource(t *testing.T, e *env, ns, addr string, src netip.Addr, why string) {
	t.Helper()
	what := fmt.Sprintf("tcp from %s to %s", ns, addr)
	sum := e.requests(t, ns, "tcp", addr, requestsPerCheck)
	expectBackends(t, what, sum, podA.Name, podB.Name)
	if got := sources(sum); !slices.Equal(got, []netip.Addr{src}) {
		t.Errorf("%s: servers saw sources %v, want only %v (%s)", what, got, src, why)
	}
}

// flagsExpectKept checks that ns reaches addr with its own address src.
func flagsExpectKept(t *testing.T, e *env, ns, addr string, src netip.Addr) {
	t.Helper()
	flagsExpectSource(t, e, ns, addr, src, "its own: not masqueraded")
}

// flagsExpectMasq checks that ns reaches addr masqueraded: the endpoints
// (on the bridge) see the node's bridge address of the family.
func flagsExpectMasq(t *testing.T, e *env, ns, addr string, f flagsFamily) {
	t.Helper()
	flagsExpectSource(t, e, ns, addr, f.bridge, "the node's bridge address: masqueraded")
}

// flagsExpectAnswered checks that the client reaches addr, answered by
// pod-a and pod-b (whatever the source: NodePort traffic is masqueraded).
func flagsExpectAnswered(t *testing.T, e *env, addr string) {
	t.Helper()
	sum := e.requests(t, sandbox.Client, "tcp", addr, requestsPerCheck)
	expectBackends(t, "tcp from the client to "+addr, sum, podA.Name, podB.Name)
}

// flagsExpectRefused checks that TCP from the client to addr is refused at
// once: the node's own TCP stack answers the SYN with a reset, as nothing
// listens there and nothing DNATed it to a pod.
func flagsExpectRefused(t *testing.T, e *env, addr string) {
	t.Helper()
	const count = 2
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	sum, err := e.client(ctx, sandbox.Client, "tcp", addr, count, "--timeout", "1s", "--results", "all")
	if sum == nil {
		t.Fatalf("tcp from the client to %s: %v", addr, err)
	}
	if sum.OK > 0 || sum.Errors["refused"] != count {
		t.Errorf("tcp from the client to %s: want each of %d requests refused by the node, got %d answers (backends %v), errors %v",
			addr, count, sum.OK, sum.Backend, sum.Errors)
	}
}

// flagsAddNodeAddr2 gives the node a second address per family on ext0,
// 10.98.0.1/32 and fd00:98::1/128, which the client routes via the node.
// Neither is in the Node object or in 10.99.0.0/24 / fd00:99::/64.
func flagsAddNodeAddr2(t *testing.T, e *env) {
	t.Helper()
	for _, f := range flagsFamilies {
		host := netip.PrefixFrom(f.node2, f.node2.BitLen()).String()
		flagsExec(t, e, sandbox.Node, "ip", "addr", "add", host, "dev", sandbox.NodeExtDev, "nodad")
		flagsExec(t, e, sandbox.Client, "ip", "route", "add", host, "via", f.node.String(), "dev", sandbox.PodDev)
	}
}

// flagsUseRemotePodSource gives the client the addresses of a pod on
// another node (f.remotePod) and makes it reach web's ClusterIPs from them:
// a pod CIDR of the cluster, not of this node, arriving on ext0. The IPv6
// address is deprecated so that the client uses it only where a route names
// it. Traffic the endpoints answer without masquerading goes back via the
// node's default route, to the client.
func flagsUseRemotePodSource(t *testing.T, e *env) {
	t.Helper()
	for _, f := range flagsFamilies {
		args := []string{"ip", "addr", "add", netip.PrefixFrom(f.remotePod, f.remotePod.BitLen()).String(), "dev", sandbox.PodDev}
		if f.remotePod.Is6() {
			args = append(args, "nodad", "preferred_lft", "0")
		}
		flagsExec(t, e, sandbox.Client, args...)
		flagsExec(t, e, sandbox.Client, "ip", "route", "replace", netip.PrefixFrom(f.web, f.web.BitLen()).String(),
			"via", f.node.String(), "dev", sandbox.PodDev, "src", f.remotePod.String())
	}
}

// flagsRoutePod turns pod p from a bridged pod into a routed one, the way
// CNIs with per-pod veths and no bridge wire pods (IPv4 only): its veth
// peer leaves kbr0 and the node routes p's address to it. The node answers
// ARP by proxy (at once) on that veth and on kbr0, as the pods on either
// side still have the other's addresses on their link (10.244.0.0/24); its
// own 10.244.0.1, p's gateway, it answers anyway.
func flagsRoutePod(t *testing.T, e *env, p sandbox.Pod) {
	t.Helper()
	veth := flagsHostVethPrefix + p.Name
	flagsExec(t, e, sandbox.Node, "ip", "link", "set", veth, "nomaster")
	flagsExec(t, e, sandbox.Node, "ip", "route", "add", netip.PrefixFrom(p.IPv4, 32).String(), "dev", veth)
	var sysctls []string
	for _, dev := range []string{sandbox.Bridge, veth} {
		sysctls = append(sysctls, "net.ipv4.conf."+dev+".proxy_arp=1", "net.ipv4.neigh."+dev+".proxy_delay=0")
	}
	flagsExec(t, e, sandbox.Node, append([]string{"sysctl", "-q", "-w"}, sysctls...)...)
	e.proxy.poll(t, 10*time.Second, p.Name+" routed via "+veth, func(ctx context.Context) error {
		_, err := e.client(ctx, p.Name, "tcp", hostPort(podA.IPv4.String(), fmt.Sprint(podTCPPort)), 1, "--timeout", "500ms")
		return err
	})
}

// flagsProbe is a table of ours in the node namespace that counts, in
// prerouting before anything else, the packets of a source to web's
// ClusterIP by the input interface nftables sees ("meta iifname").
type flagsProbe struct {
	e    *env
	name string         // inet table name
	base map[string]int // the counts at the last reset
}

// newFlagsProbe adds the probe table for sources srcs (IPv4 or IPv6) and
// the interface names (nft patterns such as "kbr0" or "veth-*") given,
// one counting rule each, commented "SRC IFNAME"; the end of the test
// deletes it.
func newFlagsProbe(t *testing.T, e *env, srcs []netip.Addr, ifnames []string) *flagsProbe {
	t.Helper()
	p := &flagsProbe{e: e, name: "flags-probe"}
	flagsExec(t, e, sandbox.Node, "nft", "add", "table", "inet", p.name)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := e.sb.Exec(ctx, sandbox.Node, "nft", "delete", "table", "inet", p.name); err != nil {
			t.Error(err)
		}
	})
	flagsExec(t, e, sandbox.Node, "nft", "add", "chain", "inet", p.name, "pre", "{ type filter hook prerouting priority -300; }")
	for _, src := range srcs {
		ipp, web := "ip", netip.MustParseAddr(webClusterIPv4)
		if src.Is6() {
			ipp, web = "ip6", netip.MustParseAddr(webClusterIPv6)
		}
		for _, ifname := range ifnames {
			flagsExec(t, e, sandbox.Node, "nft", "add", "rule", "inet", p.name, "pre",
				ipp, "saddr", src.String(), ipp, "daddr", web.String(), "tcp", "dport", webPort,
				"iifname", strconv.Quote(ifname), "counter", "comment", strconv.Quote(src.String()+" "+ifname))
		}
	}
	return p
}

var flagsCounterRE = regexp.MustCompile(`counter packets (\d+) bytes \d+ comment "([^"]+)"`)

// counts returns the packets counted so far, by rule comment.
func (p *flagsProbe) counts(t *testing.T) map[string]int {
	t.Helper()
	out := flagsExec(t, p.e, sandbox.Node, "nft", "list", "chain", "inet", p.name, "pre")
	counts := map[string]int{}
	for _, m := range flagsCounterRE.FindAllStringSubmatch(out, -1) {
		n, _ := strconv.Atoi(m[1])
		counts[m[2]] = n
	}
	return counts
}

// reset makes expect count from now on.
func (p *flagsProbe) reset(t *testing.T) {
	t.Helper()
	p.base = p.counts(t)
}

// expect fails the test unless the rule for src and ifname counted packets
// (seen) or none (!seen) since the last reset.
func (p *flagsProbe) expect(t *testing.T, src netip.Addr, ifname string, seen bool) {
	t.Helper()
	key := src.String() + " " + ifname
	counts := p.counts(t)
	for k, n := range p.base {
		counts[k] -= n
	}
	n, ok := counts[key]
	switch {
	case !ok:
		t.Errorf("probe: no rule %q in %v", key, counts)
	case seen && n == 0:
		t.Errorf("probe: no packet from %v to web's ClusterIP with iifname %q in prerouting (counts %v)", src, ifname, counts)
	case !seen && n > 0:
		t.Errorf("probe: %d packets from %v to web's ClusterIP with iifname %q in prerouting, want none (counts %v)", n, src, ifname, counts)
	}
}

// flagsSetBrNetfilter turns br_netfilter's bridge-nf-call-ip{,6}tables on
// or off in the node namespace, and reports (as an error) a kernel without
// br_netfilter.
func flagsSetBrNetfilter(ctx context.Context, e *env, on bool) error {
	v := "0"
	if on {
		v = "1"
	}
	_, err := e.sb.Exec(ctx, sandbox.Node, "sysctl", "-q", "-w",
		"net.bridge.bridge-nf-call-iptables="+v, "net.bridge.bridge-nf-call-ip6tables="+v)
	return err
}
