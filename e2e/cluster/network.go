package cluster

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

const netnsDir = "/run/netns"

// NetNSPath is the bind mount of a named network namespace.
func NetNSPath(name string) string { return filepath.Join(netnsDir, name) }

// netnsNames are the namespaces the cluster owns: the node network and one
// per node.
func (l Layout) netnsNames() []string {
	names := []string{l.NodeNet}
	if l.VMNodes() {
		return names // the nodes' are in their guests
	}
	for _, n := range l.Nodes {
		names = append(names, n.Name)
	}
	return names
}

// run runs a command and returns its error with the command's output.
func run(ctx context.Context, argv ...string) error {
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// output runs a command and returns its standard output.
func output(ctx context.Context, argv ...string) (string, error) {
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return string(out), nil
}

// nsenter prefixes argv so that it runs in the named network namespace
// (and only that: unlike `ip netns exec`, no private mount namespace,
// which would hide kubelet's volume mounts from runc).
func nsenter(ns string, argv ...string) []string {
	return append([]string{"nsenter", "--net=" + NetNSPath(ns), "--"}, argv...)
}

// networkSteps are the commands that build the node network: a bridge in
// NodeNet holding the bridge's addresses, and per node a veth whose eth0
// end (in the node's namespace) has the node's addresses and a default
// route via the bridge, per family. Forwarding is on in every namespace,
// and bridged traffic goes through the node's netfilter (br_netfilter),
// as kube-proxy expects on a node. IPv6 addresses skip duplicate address
// detection: nothing else holds them, and a tentative address could not
// be bound yet.
func (l Layout) networkSteps() [][]string {
	steps := [][]string{
		{"ip", "netns", "add", l.NodeNet},
		{"ip", "-n", l.NodeNet, "link", "set", "lo", "up"},
		{"ip", "-n", l.NodeNet, "link", "add", BridgeName, "type", "bridge"},
	}
	for _, gw := range l.BridgeIPs() {
		steps = append(steps, addrStep(l.NodeNet, BridgeName, gw))
	}
	steps = append(steps, []string{"ip", "-n", l.NodeNet, "link", "set", BridgeName, "up"})
	steps = append(steps, l.forwardingSteps(l.NodeNet)...)
	for _, n := range l.Nodes {
		if l.VMNodes() {
			steps = append(steps, l.vmNetworkSteps(n)...)
			continue
		}
		host := "veth-" + n.Name
		steps = append(steps,
			[]string{"ip", "netns", "add", n.Name},
			[]string{"ip", "-n", n.Name, "link", "set", "lo", "up"},
			[]string{"ip", "-n", l.NodeNet, "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", n.Name},
			[]string{"ip", "-n", l.NodeNet, "link", "set", host, "master", BridgeName, "up"},
		)
		steps = append(steps, l.nodeNetworkSteps(n)...)
	}
	return steps
}

// nodeNetworkSteps configure a node's namespace once eth0 is in it: its
// addresses, the default routes via the bridge, forwarding and sysctls.
func (l Layout) nodeNetworkSteps(n Node) [][]string {
	var steps [][]string
	for _, ip := range l.NodeIPs(n) {
		steps = append(steps, addrStep(n.Name, "eth0", ip))
	}
	steps = append(steps, []string{"ip", "-n", n.Name, "link", "set", "eth0", "up"})
	for _, gw := range l.BridgeIPs() {
		steps = append(steps, []string{"ip", "-n", n.Name, "route", "add", "default", "via", gw})
	}
	steps = append(steps, l.forwardingSteps(n.Name)...)
	return append(steps, l.nodeSysctlSteps(n.Name)...)
}

// addrStep puts ip (with the node network's prefix length) on dev.
func addrStep(ns, dev, ip string) []string {
	if isIPv6(ip) {
		return []string{"ip", "-n", ns, "addr", "add", fmt.Sprintf("%s/%d", ip, NodeNetPrefix6), "dev", dev, "nodad"}
	}
	return []string{"ip", "-n", ns, "addr", "add", fmt.Sprintf("%s/%d", ip, NodeNetPrefix), "dev", dev}
}

// forwardingSteps turn on forwarding for the cluster's families in ns.
func (l Layout) forwardingSteps(ns string) [][]string {
	var steps [][]string
	if l.HasIPv4() {
		steps = append(steps, nsenter(ns, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"))
	}
	if l.HasIPv6() {
		steps = append(steps, nsenter(ns, "sysctl", "-q", "-w", "net.ipv6.conf.all.forwarding=1"))
	}
	return steps
}

// nodeSysctlSteps send a node's bridged traffic through its netfilter
// (for each family) and turn reverse path filtering off.
func (l Layout) nodeSysctlSteps(ns string) [][]string {
	steps := [][]string{nsenter(ns, "sysctl", "-q", "-w", "net.bridge.bridge-nf-call-iptables=1")}
	if l.HasIPv6() {
		steps = append(steps, nsenter(ns, "sysctl", "-q", "-w", "net.bridge.bridge-nf-call-ip6tables=1"))
	}
	return append(steps, nsenter(ns, "sysctl", "-q", "-w", "net.ipv4.conf.all.rp_filter=0"))
}

// setupNetwork creates the namespaces, bridge and veths.
func (l Layout) setupNetwork(ctx context.Context) error {
	for _, ns := range l.netnsNames() {
		if _, err := os.Stat(NetNSPath(ns)); err == nil {
			return fmt.Errorf("network namespace %s already exists: run `make cluster-down` first", ns)
		}
	}
	for _, argv := range l.networkSteps() {
		if err := run(ctx, argv...); err != nil {
			return fmt.Errorf("node network: %w", err)
		}
	}
	return nil
}

// routeNodeNet routes each node's pod CIDRs from the node network (where
// the API server is) to that node: pods reach the API server through the
// kubernetes Service unmasqueraded, and the replies must find them.
func (l Layout) routeNodeNet(ctx context.Context, podCIDRs map[string][]string) error {
	for _, n := range l.Nodes {
		if err := l.routeVia(ctx, l.NodeNet, podCIDRs[n.Name], n); err != nil {
			return err
		}
	}
	return nil
}

// routePodCIDRs is the fallback (no flannel) pod network: each node routes
// every other node's pod CIDRs via that node's address of their family.
func (l Layout) routePodCIDRs(ctx context.Context, podCIDRs map[string][]string) error {
	for _, n := range l.Nodes {
		for _, peer := range l.Nodes {
			if peer.Name == n.Name {
				continue
			}
			if err := l.routeVia(ctx, n.Name, podCIDRs[peer.Name], peer); err != nil {
				return err
			}
		}
	}
	return nil
}

// routeVia routes cidrs in namespace ns via node to's address of each
// CIDR's family.
func (l Layout) routeVia(ctx context.Context, ns string, cidrs []string, to Node) error {
	for _, c := range cidrs {
		gw, ok := sameFamily(c, l.NodeIPs(to))
		if !ok {
			return fmt.Errorf("pod CIDR %s of %s: the node has no address of its family", c, to.Name)
		}
		if err := run(ctx, "ip", "-n", ns, "route", "replace", c, "via", gw); err != nil {
			return err
		}
	}
	return nil
}

// deleteNetwork deletes the cluster's namespaces (their links go with
// them).
func (l Layout) deleteNetwork(ctx context.Context) []error {
	var errs []error
	for _, ns := range l.netnsNames() {
		if _, err := os.Stat(NetNSPath(ns)); err != nil {
			continue
		}
		if err := run(ctx, "ip", "netns", "delete", ns); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}
