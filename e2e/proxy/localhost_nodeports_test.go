package proxy

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

// Localhost NodePorts (issue 21): in --proxy-mode=iptables, as kube-proxy's
// iptables mode, the node's own connections to 127.0.0.1:NodePort are
// DNATed to the endpoints and masqueraded (route_localnet=1 in the node's
// namespace), while KUBE-FIREWALL drops what other hosts send to
// 127.0.0.0/8 unless DNATed. nftables mode (the default) serves no
// NodePort on loopback and leaves route_localnet alone.

// lnpListenPort is a TCP port a server in the node namespace listens on at
// 127.0.0.1 only: a loopback service other hosts must not reach.
const lnpListenPort = "9111"

var lnpNodePort = hostPort("127.0.0.1", webNodePort)

func TestLocalhostNodePorts(t *testing.T) {
	t.Parallel()
	needRoot(t)
	t.Run("IPTablesMode", func(t *testing.T) {
		e := newFlagsEnv(t, nil, "--proxy-mode=iptables")
		e.proxy.waitLog(t, 5*time.Second, "the iptables mode line", func(lines []string) bool {
			return lnpCount(lines, "proxy mode iptables") == 1 && lnpCount(lines, "setting route_localnet=1") == 1
		})
		lnpExpectRouteLocalnet(t, e, "1")
		// The node itself: DNATed to pod-a and pod-b, masqueraded to the
		// node's bridge address (127.0.0.1 cannot leave the node).
		flagsExpectSource(t, e, sandbox.Node, lnpNodePort, sandbox.BridgeIPv4.Addr(), "masqueraded: 127.0.0.1 cannot leave the node")
		// IPv6 has no route_localnet: never on ::1.
		lnpExpectFailure(t, e, sandbox.Node, hostPort("::1", webNodePort), "refused")

		// Another host that routes 127.0.0.0/8 to the node: the localhost
		// NodePort is DNATed (KUBE-FIREWALL lets DNATed packets through)
		// and answered; a loopback-only server of the node is not reached.
		lnpClientRoutesLoopbackToNode(t, e)
		lnpListenOnLoopback(t, e)
		flagsExpectAnswered(t, e, lnpNodePort)
		lnpExpectFailure(t, e, sandbox.Client, hostPort("127.0.0.1", lnpListenPort), "timeout")
	})

	t.Run("NFTablesMode", func(t *testing.T) {
		e := newFlagsEnv(t, nil, "--proxy-mode=nftables")
		lnpExpectRouteLocalnet(t, e, "0")
		lnpExpectFailure(t, e, sandbox.Node, lnpNodePort, "refused")
	})

	// nftables mode behind kube-proxy's alpha gate (KEP-6032): a userspace
	// proxy answers TCP NodePorts on 127.0.0.1 and ::1, with no
	// route_localnet, so another host still reaches nothing there.
	t.Run("NFTablesModeUserspace", func(t *testing.T) {
		e := newFlagsEnv(t, nil, "--proxy-mode=nftables", "--nodeport-addresses=primary,localhost",
			"--feature-gates=KubeProxyNFTablesLocalhostNodePorts=true")
		lnpExpectRouteLocalnet(t, e, "0")
		v6NodePort := hostPort("::1", webNodePort)
		for _, addr := range []string{lnpNodePort, v6NodePort} {
			err := sandbox.Poll(t.Context(), 10*time.Second, 20*time.Millisecond, func(ctx context.Context) error {
				_, err := e.client(ctx, sandbox.Node, "tcp", addr, 1, "--timeout", "200ms")
				return err
			})
			if err != nil {
				t.Fatalf("the userspace listener on %s: %v", addr, err)
			}
		}
		// Both pods answer, from the node's bridge address: the proxy's
		// own connection to each pod.
		flagsExpectSource(t, e, sandbox.Node, lnpNodePort, sandbox.BridgeIPv4.Addr(), "the userspace proxy connects from the node")
		flagsExpectSource(t, e, sandbox.Node, v6NodePort, sandbox.BridgeIPv6.Addr(), "the userspace proxy connects from the node")
		lnpClientRoutesLoopbackToNode(t, e)
		lnpExpectFailure(t, e, sandbox.Client, lnpNodePort, "timeout")
		// UDP is not proxied, as upstream.
		sum, _ := e.client(t.Context(), sandbox.Node, "udp", hostPort("127.0.0.1", dnsNodePort), 1, "--timeout", "300ms")
		if sum != nil && sum.OK > 0 {
			t.Errorf("udp to 127.0.0.1:%s answered; the userspace proxy serves TCP only", dnsNodePort)
		}
	})

	t.Run("IPTablesModeWithoutLocalhost", func(t *testing.T) {
		e := newFlagsEnv(t, nil, "--proxy-mode=iptables", "--iptables-localhost-nodeports=false")
		lnpExpectRouteLocalnet(t, e, "0")
		lnpExpectFailure(t, e, sandbox.Node, lnpNodePort, "refused")
	})

	// The control for the drop above: with route_localnet=1 and no
	// KUBE-FIREWALL (nftables mode, the key set by hand), the other host
	// does reach the node's loopback-only server.
	t.Run("RouteLocalnetWithoutGuard", func(t *testing.T) {
		e := newFlagsEnv(t, nil, "--proxy-mode=nftables")
		flagsExec(t, e, sandbox.Node, "sysctl", "-qw", "net.ipv4.conf.all.route_localnet=1")
		lnpClientRoutesLoopbackToNode(t, e)
		lnpListenOnLoopback(t, e)
		sum := e.requests(t, sandbox.Client, "tcp", hostPort("127.0.0.1", lnpListenPort), 2)
		expectBackends(t, "tcp from the client to the node's 127.0.0.1 without KUBE-FIREWALL", sum, "node-lo")
	})
}

func lnpCount(lines []string, s string) int {
	n := 0
	for _, l := range lines {
		if strings.Contains(l, s) {
			n++
		}
	}
	return n
}

// lnpExpectRouteLocalnet checks net.ipv4.conf.all.route_localnet in the
// node's namespace (the host's is never touched: it is per namespace).
func lnpExpectRouteLocalnet(t *testing.T, e *env, want string) {
	t.Helper()
	if got := strings.TrimSpace(flagsExec(t, e, sandbox.Node, "cat", "/proc/sys/net/ipv4/conf/all/route_localnet")); got != want {
		t.Errorf("route_localnet in the node namespace = %s, want %s", got, want)
	}
}

// lnpExpectFailure sends two TCP requests from ns to addr and checks that
// each fails as said: "refused" (nothing DNATed it, nothing listens) or
// "timeout" (dropped).
func lnpExpectFailure(t *testing.T, e *env, ns, addr, how string) {
	t.Helper()
	const count = 2
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	sum, err := e.client(ctx, ns, "tcp", addr, count, "--timeout", "1s", "--results", "all")
	if sum == nil {
		t.Fatalf("tcp from %s to %s: %v", ns, addr, err)
	}
	if sum.OK > 0 || sum.Errors[how] != count {
		t.Errorf("tcp from %s to %s: want each of %d requests to fail (%s), got %d answers (backends %v), errors %v",
			ns, addr, count, how, sum.OK, sum.Backend, sum.Errors)
	}
}

// lnpClientRoutesLoopbackToNode makes the client send 127.0.0.0/8 to the
// node (as a hostile neighbour could): its loopback address (and so its
// local routes for 127.0.0.0/8) is taken away and route_localnet lets it
// send and receive such packets.
func lnpClientRoutesLoopbackToNode(t *testing.T, e *env) {
	t.Helper()
	flagsExec(t, e, sandbox.Client, "sysctl", "-qw", "net.ipv4.conf.all.route_localnet=1")
	flagsExec(t, e, sandbox.Client, "ip", "addr", "del", "127.0.0.1/8", "dev", "lo")
	flagsExec(t, e, sandbox.Client, "ip", "route", "add", "127.0.0.0/8", "via", sandbox.NodeIPv4.Addr().String(), "dev", sandbox.PodDev)
}

// lnpListenOnLoopback runs an agent server named node-lo in the node
// namespace on 127.0.0.1:lnpListenPort and waits until it answers there.
func lnpListenOnLoopback(t *testing.T, e *env) {
	t.Helper()
	addr := hostPort("127.0.0.1", lnpListenPort)
	if _, err := e.sb.Start(t.Context(), sandbox.Node, agentBin, "serve", "--name", "node-lo", "--tcp", addr, "--udp", ""); err != nil {
		t.Fatal(err)
	}
	err := sandbox.Poll(t.Context(), 10*time.Second, 20*time.Millisecond, func(ctx context.Context) error {
		_, err := e.client(ctx, sandbox.Node, "tcp", addr, 1, "--timeout", "200ms")
		return err
	})
	if err != nil {
		t.Fatal(fmt.Errorf("server on the node's %s: %w", addr, err))
	}
}
