package proxy

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

// kube-proxy's flags with real TCP traffic (issue 3, item 10), one proxy per
// case: --masquerade-all, --detect-local-mode and its companions,
// --nodeport-addresses, --iptables-masquerade-bit, and bad values. See
// features_flags_helpers_test.go for the addresses.

// TestFlagsMasqueradeAll: without the flag a pod keeps its own address on
// its way to a ClusterIP; with it, the pod is masqueraded like everyone.
// The client off the node is masqueraded either way.
func TestFlagsMasqueradeAll(t *testing.T) {
	t.Parallel()
	needRoot(t)
	for _, tc := range []struct {
		name string
		args []string
		masq bool
	}{
		{"Off", nil, false},
		{"On", []string{"--masquerade-all"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newFlagsEnv(t, nil, tc.args...)
			for _, f := range flagsFamilies {
				t.Run(f.name, func(t *testing.T) {
					if tc.masq {
						flagsExpectMasq(t, e, podC.Name, flagsWeb(f), f)
					} else {
						flagsExpectKept(t, e, podC.Name, flagsWeb(f), f.pod(podC))
					}
					flagsExpectMasq(t, e, sandbox.Client, flagsWeb(f), f)
				})
			}
		})
	}
}

// TestFlagsDetectLocal: each --detect-local-mode tells pod traffic, which
// keeps its source on its way to a ClusterIP, from other traffic, which is
// masqueraded. Three sources: pod-c on the bridge; the client (10.99.0.2,
// in no pod CIDR, arriving on ext0); and the client with the address of a
// pod of another node (10.244.7.2, fd00:10:244:7::2: within --cluster-cidr
// 10.244.0.0/16 and fd00:10:244::/48, outside the Node's podCIDRs
// 10.244.0.0/24 and fd00:10:244::/64 of examples/demo/node.yaml, arriving on
// ext0), which tells ClusterCIDR from the other modes.
func TestFlagsDetectLocal(t *testing.T) {
	t.Parallel()
	needRoot(t)

	// ClusterCIDR (the default, here explicit): a source within
	// --cluster-cidr is a pod, wherever it comes from.
	t.Run("ClusterCIDR", func(t *testing.T) {
		e := newFlagsEnv(t, nil, "--detect-local-mode=ClusterCIDR")
		for _, f := range flagsFamilies {
			flagsExpectKept(t, e, podC.Name, flagsWeb(f), f.pod(podC))
			flagsExpectMasq(t, e, sandbox.Client, flagsWeb(f), f)
		}
		flagsUseRemotePodSource(t, e)
		for _, f := range flagsFamilies {
			flagsExpectKept(t, e, sandbox.Client, flagsWeb(f), f.remotePod)
		}
	})

	// NodeCIDR: only the Node object's spec.podCIDRs are pods.
	t.Run("NodeCIDR", func(t *testing.T) {
		e := newFlagsEnv(t, nil, "--detect-local-mode=NodeCIDR")
		for _, f := range flagsFamilies {
			flagsExpectKept(t, e, podC.Name, flagsWeb(f), f.pod(podC))
			flagsExpectMasq(t, e, sandbox.Client, flagsWeb(f), f)
		}
		flagsUseRemotePodSource(t, e)
		for _, f := range flagsFamilies {
			flagsExpectMasq(t, e, sandbox.Client, flagsWeb(f), f)
		}
	})

	// BridgeInterface: what comes in on kbr0 is a pod's, whatever its
	// source; nothing else is. The probe shows the input interface
	// nftables sees for pod-c: the bridge.
	t.Run("BridgeInterface", func(t *testing.T) {
		e := newFlagsEnv(t, nil, "--detect-local-mode=BridgeInterface", "--pod-bridge-interface", sandbox.Bridge)
		probe := newFlagsProbe(t, e, []netip.Addr{podC.IPv4, podC.IPv6}, []string{sandbox.Bridge})
		for _, f := range flagsFamilies {
			flagsExpectKept(t, e, podC.Name, flagsWeb(f), f.pod(podC))
			probe.expect(t, f.pod(podC), sandbox.Bridge, true)
			flagsExpectMasq(t, e, sandbox.Client, flagsWeb(f), f)
		}
		flagsUseRemotePodSource(t, e)
		for _, f := range flagsFamilies {
			flagsExpectMasq(t, e, sandbox.Client, flagsWeb(f), f)
		}
	})

	// InterfaceNamePrefix with the prefix of the node's ends of the pods'
	// veths ("veth-"). A pod on the bridge does not match it: nftables
	// sees its packets come in on kbr0, with br_netfilter (which sets the
	// bridge as the input device before calling the IP hooks; the port
	// is only a "physdev", which iifname does not match) as without it
	// (the bridge hands them up as its own). So a bridged pod is
	// masqueraded to a ClusterIP, as with upstream kube-proxy, whose
	// iptables and nftables modes match `-i veth+` / `iifname "veth*"` the
	// same way: upstream documents the mode for CNIs that give each pod a
	// veth of its own without a bridge. Such a pod (pod-r, routed to its
	// veth) keeps its source.
	t.Run("InterfaceNamePrefix", func(t *testing.T) {
		e := newFlagsEnv(t, []sandbox.Pod{flagsPodR},
			"--detect-local-mode=InterfaceNamePrefix", "--pod-interface-name-prefix", flagsHostVethPrefix)
		flagsRoutePod(t, e, flagsPodR)
		ifPods := flagsHostVethPrefix + "*"
		probe := newFlagsProbe(t, e, []netip.Addr{podC.IPv4, podC.IPv6, flagsPodR.IPv4}, []string{sandbox.Bridge, ifPods})

		// The routed pod (IPv4 only: the sandbox routes no IPv6 to it).
		f4 := flagsFamilies[0]
		flagsExpectKept(t, e, flagsPodR.Name, flagsWeb(f4), flagsPodR.IPv4)
		probe.expect(t, flagsPodR.IPv4, ifPods, true)

		for _, brnf := range []bool{true, false} {
			name := "BrNetfilter"
			if !brnf {
				name = "NoBrNetfilter"
			}
			t.Run(name, func(t *testing.T) {
				if err := flagsSetBrNetfilter(t.Context(), e, brnf); err != nil {
					t.Skipf("no br_netfilter: %v", err)
				}
				probe.reset(t)
				for _, f := range flagsFamilies {
					flagsExpectMasq(t, e, podC.Name, flagsWeb(f), f)
					probe.expect(t, f.pod(podC), sandbox.Bridge, true)
					probe.expect(t, f.pod(podC), ifPods, false)
				}
			})
		}
		_ = flagsSetBrNetfilter(t.Context(), e, true) // as the sandbox had it
		for _, f := range flagsFamilies {
			flagsExpectMasq(t, e, sandbox.Client, flagsWeb(f), f)
		}
	})
}

// TestFlagsNodePortAddresses: NodePorts answer on the node addresses the
// flag selects; on another node address (10.98.0.1, fd00:98::1 on ext0)
// the node refuses the connection itself. Without the flag, nftables mode
// serves the Node's primary addresses only, as kube-proxy's; with "all",
// every node address serves NodePorts: the control that the second
// address works.
func TestFlagsNodePortAddresses(t *testing.T) {
	t.Parallel()
	needRoot(t)
	for _, tc := range []struct {
		name string
		args []string
		// restricted[i]: whether family i serves on f.node only.
		restricted [2]bool
		note       string // logged if the case fails
	}{
		{"Default", nil, [2]bool{true, true}, "nftables mode's default is primary, as kube-proxy's"},
		{"All", []string{"--nodeport-addresses", "all"}, [2]bool{false, false}, ""},
		{"CIDRs", []string{"--nodeport-addresses", "10.99.0.0/24,fd00:99::/64"}, [2]bool{true, true}, ""},
		// The Node object's InternalIPs: 10.99.0.1 and fd00:99::1.
		{"Primary", []string{"--nodeport-addresses", "primary"}, [2]bool{true, true}, ""},
		// Only IPv4 CIDRs: upstream kube-proxy (NewNodePortAddresses in
		// pkg/proxy/util) serves a family that has no CIDR in the list
		// on all its addresses ("If there are no CIDRs of the given
		// family then the CIDR "0.0.0.0/0" or "::/0" will be added").
		{"IPv4Only", []string{"--nodeport-addresses", "10.99.0.0/24"}, [2]bool{true, false},
			"with CIDRs of one family only, upstream kube-proxy serves the other family's NodePorts on all its addresses"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newFlagsEnv(t, nil, tc.args...)
			flagsAddNodeAddr2(t, e)
			t.Cleanup(func() {
				if t.Failed() && tc.note != "" {
					t.Log(tc.note)
				}
			})
			for i, f := range flagsFamilies {
				t.Run(f.name, func(t *testing.T) {
					flagsExpectAnswered(t, e, flagsNodePort(f.node))
					if tc.restricted[i] {
						flagsExpectRefused(t, e, flagsNodePort(f.node2))
					} else {
						flagsExpectAnswered(t, e, flagsNodePort(f.node2))
					}
				})
			}
		})
	}
}

// TestFlagsMasqueradeBit: with --iptables-masquerade-bit 10 the proxy marks
// with 0x400 and masquerades what carries 0x400, NodePort traffic included,
// and pays no heed to the default bit 0x4000: a pod's packets that a table
// of ours marks 0x4000 keep their source, those it marks 0x400 are
// masqueraded.
func TestFlagsMasqueradeBit(t *testing.T) {
	t.Parallel()
	needRoot(t)
	e := newFlagsEnv(t, nil, "--iptables-masquerade-bit", "10")
	const bit, defaultBit = "0x00000400", "0x00004000"
	for _, family := range []string{"ip", "ip6"} {
		if rules := listProxyChain(t, e, family, "KUBE-MARK-MASQ"); !slices.Contains(rules, "meta mark set meta mark | "+bit) {
			t.Errorf("%s KUBE-MARK-MASQ: %q, want it to set %s", family, rules, bit)
		}
		for _, chain := range []string{"KUBE-MARK-MASQ", "KUBE-POSTROUTING", "KUBE-FORWARD"} {
			rules := strings.Join(listProxyChain(t, e, family, chain), "\n")
			if !strings.Contains(rules, bit) || strings.Contains(rules, defaultBit) {
				t.Errorf("%s %s uses not %s alone:\n%s", family, chain, bit, rules)
			}
		}
	}
	for _, f := range flagsFamilies {
		flagsExpectMasq(t, e, sandbox.Client, flagsNodePort(f.node), f)
	}

	const table = "flags-mark"
	flagsExec(t, e, sandbox.Node, "nft", "add", "table", "inet", table)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := e.sb.Exec(ctx, sandbox.Node, "nft", "delete", "table", "inet", table); err != nil {
			t.Error(err)
		}
	})
	flagsExec(t, e, sandbox.Node, "nft", "add", "chain", "inet", table, "pre", "{ type filter hook prerouting priority -300; }")
	for _, mark := range []string{defaultBit, bit} {
		flagsExec(t, e, sandbox.Node, "nft", "flush", "chain", "inet", table, "pre")
		for _, f := range flagsFamilies {
			ipp := "ip"
			if f.web.Is6() {
				ipp = "ip6"
			}
			flagsExec(t, e, sandbox.Node, "nft", "add", "rule", "inet", table, "pre",
				ipp, "saddr", f.pod(podC).String(), "meta", "mark", "set", "meta", "mark", "|", mark)
		}
		for _, f := range flagsFamilies {
			if mark == bit {
				flagsExpectMasq(t, e, podC.Name, flagsWeb(f), f)
			} else {
				flagsExpectKept(t, e, podC.Name, flagsWeb(f), f.pod(podC))
			}
		}
	}
}

// TestFlagsBadValues: flag values that cannot work stop the proxy before it
// touches nftables, with a message naming the flag and an exit status other
// than 0. Last, the same command line with good values does program the
// tables: the control that "nothing programmed" can fail.
func TestFlagsBadValues(t *testing.T) {
	t.Parallel()
	needRoot(t)
	sb := newSandbox(t, []sandbox.Pod{})
	state := t.TempDir()
	copyDir(t, exampleState, state)
	base := []string{proxyBin, "--proxy-mode=nftables", "--state", state, "--hostname-override", nodeName, "--cluster-cidr", clusterCIDRs(),
		"--iptables-min-sync-period", "100ms"}

	for _, tc := range []struct {
		name string
		args []string
		want []string // in the message
	}{
		{"DetectLocalModeUnknown", []string{"--detect-local-mode=Foo"}, []string{"--detect-local-mode", "Foo"}},
		{"BridgeInterfaceWithoutBridge", []string{"--detect-local-mode=BridgeInterface"}, []string{"--pod-bridge-interface"}},
		{"InterfaceNamePrefixWithoutPrefix", []string{"--detect-local-mode=InterfaceNamePrefix"}, []string{"--pod-interface-name-prefix"}},
		{"NodePortAddressesBadPrefixLength", []string{"--nodeport-addresses", "10.0.0.0/33"}, []string{"--nodeport-addresses", "10.0.0.0/33"}},
		{"NodePortAddressesNotACIDR", []string{"--nodeport-addresses", "10.99.0.1"}, []string{"--nodeport-addresses", "10.99.0.1"}},
		{"NodePortAddressesBadIPv6", []string{"--nodeport-addresses", "fd00:99::/129"}, []string{"--nodeport-addresses", "fd00:99::/129"}},
		// Upstream's validation: a keyword at most once.
		{"NodePortAddressesKeywordTwice", []string{"--nodeport-addresses", "primary,10.99.0.0/24,primary"}, []string{"--nodeport-addresses", "primary"}},
		{"MasqueradeBitTooBig", []string{"--iptables-masquerade-bit", "32"}, []string{"--iptables-masquerade-bit", "32"}},
		{"MasqueradeBitNegative", []string{"--iptables-masquerade-bit", "-1"}, []string{"--iptables-masquerade-bit", "-1"}},
		{"ClusterCIDRBad", []string{"--cluster-cidr", "10.244.0.0/40"}, []string{"--cluster-cidr", "10.244.0.0/40"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			cmd := sb.Command(ctx, sandbox.Node, append(slices.Clone(base), tc.args...)...)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			msg := strings.TrimSpace(stderr.String())
			t.Logf("kube-nftproxy %s: %v: %s", strings.Join(tc.args, " "), err, msg)
			// Whatever went wrong, the next case starts without tables.
			defer func() {
				if got := nftTables(t, sb); len(got) > 0 {
					t.Errorf("with %q: the node has tables %q, want none", tc.args, got)
					cleanup(t, sb)
				}
			}()
			var exit *exec.ExitError
			switch {
			case ctx.Err() != nil:
				t.Errorf("with %q: the proxy accepted the value and ran until killed after 5s, want it refused (stderr %q)", tc.args, msg)
				return
			case !errors.As(err, &exit):
				t.Errorf("with %q: exited with %v, want an exit status other than 0 (stderr %q)", tc.args, err, msg)
			}
			if klogHeader.MatchString(msg) || strings.Contains(msg, "\n") {
				t.Errorf("with %q: want a one-line message and nothing else on stderr, got %q", tc.args, msg)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("with %q: stderr %q does not mention %q", tc.args, msg, w)
				}
			}
		})
	}

	t.Run("GoodValuesControl", func(t *testing.T) {
		startProxy(t, sb, state, "--detect-local-mode=BridgeInterface", "--pod-bridge-interface", sandbox.Bridge,
			"--nodeport-addresses", "10.99.0.0/24,fd00:99::/64", "--iptables-masquerade-bit", "10")
		got := nftTables(t, sb)
		for _, want := range []string{"table ip kube-nftproxy", "table ip6 kube-nftproxy"} {
			if !slices.Contains(got, want) {
				t.Errorf("with good values the node has tables %q, want %q among them", got, want)
			}
		}
	})
}
