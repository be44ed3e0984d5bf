package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/apiserver"
)

// rootLayout is a Layout with namespace and cgroup names of its own, so
// the test cannot meet a running cluster.
func rootLayout(t *testing.T) Layout {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces and cgroups")
	}
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	p := "t" + hex.EncodeToString(b)
	l := testLayout(t)
	l.NodeNet = p + "net"
	l.Nodes = []Node{
		{Name: p + "n1", IP: "10.200.0.11", IP6: "fd00:200::11"},
		{Name: p + "n2", IP: "10.200.0.12", IP6: "fd00:200::12"},
	}
	return l
}

// TestNodeNetwork builds the node network (bridge, veths, addresses,
// routes) of each family shape with no Kubernetes, checks TCP between the
// nodes and to the bridge on every address, routes pod CIDRs of each
// family, then deletes it and checks nothing is left.
func TestNodeNetwork(t *testing.T) {
	for _, tc := range []struct {
		family string
		cidrs  [2][]string // node1's and node2's pod CIDRs
	}{
		{FamilyIPv4, [2][]string{{"10.244.0.0/24"}, {"10.244.1.0/24"}}},
		{FamilyDual, [2][]string{{"10.244.0.0/24", "fd00:10:244::/64"}, {"10.244.1.0/24", "fd00:10:244:1::/64"}}},
		{FamilyIPv6, [2][]string{{"fd00:10:244::/64"}, {"fd00:10:244:1::/64"}}},
	} {
		t.Run(tc.family, func(t *testing.T) {
			l := rootLayout(t)
			l.Family = tc.family
			checkNodeNetwork(t, l, map[string][]string{l.Nodes[0].Name: tc.cidrs[0], l.Nodes[1].Name: tc.cidrs[1]})
		})
	}
}

func checkNodeNetwork(t *testing.T, l Layout, cidrs map[string][]string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	t.Cleanup(func() { l.deleteNetwork(context.Background()) })
	if err := l.setupNetwork(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.setupNetwork(ctx); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("second setup: err = %v, want already exists", err)
	}
	n1, n2 := l.Nodes[0], l.Nodes[1]
	for i := range l.BridgeIPs() {
		for _, c := range []struct{ from, to, addr string }{
			{n1.Name, n2.Name, l.NodeIPs(n2)[i]},
			{n2.Name, n1.Name, l.NodeIPs(n1)[i]},
			{n1.Name, l.NodeNet, l.BridgeIPs()[i]},
		} {
			if err := tcpCheck(c.from, c.to, c.addr); err != nil {
				t.Errorf("%s -> %s (%s): %v", c.from, c.to, c.addr, err)
			}
		}
	}
	if err := l.routePodCIDRs(ctx, cidrs); err != nil {
		t.Fatal(err)
	}
	if err := l.routeNodeNet(ctx, cidrs); err != nil {
		t.Fatal(err)
	}
	for i, dst := range cidrs[n1.Name] {
		checkRoute(ctx, t, l.NodeNet, dst, l.NodeIPs(n1)[i])
	}
	for i, dst := range cidrs[n2.Name] {
		checkRoute(ctx, t, n1.Name, dst, l.NodeIPs(n2)[i])
	}
	for _, ns := range []string{n1.Name, n2.Name} {
		for _, key := range forwardingKeys(l) {
			v, err := output(ctx, nsenter(ns, "sysctl", "-n", key)...)
			if err != nil || strings.TrimSpace(v) != "1" {
				t.Errorf("%s: %s = %q, %v", ns, key, v, err)
			}
		}
	}
	if errs := l.deleteNetwork(ctx); len(errs) > 0 {
		t.Fatal(errs)
	}
	for _, ns := range l.netnsNames() {
		if _, err := os.Stat(NetNSPath(ns)); err == nil {
			t.Errorf("namespace %s left behind", ns)
		}
	}
}

// checkRoute says whether namespace ns routes dst via gw.
func checkRoute(ctx context.Context, t *testing.T, ns, dst, gw string) {
	t.Helper()
	family := "-4"
	if isIPv6(dst) {
		family = "-6"
	}
	out, err := output(ctx, "ip", family, "-n", ns, "route", "show", dst)
	if err != nil || !strings.Contains(out, "via "+gw) {
		t.Errorf("%s's route to %s: %q, %v; want via %s", ns, dst, out, err, gw)
	}
}

// forwardingKeys are the sysctls that must be 1 on a node of l's families.
func forwardingKeys(l Layout) []string {
	var keys []string
	if l.HasIPv4() {
		keys = append(keys, "net.ipv4.ip_forward")
	}
	if l.HasIPv6() {
		keys = append(keys, "net.ipv6.conf.all.forwarding", "net.bridge.bridge-nf-call-ip6tables")
	}
	return keys
}

// tcpCheck listens on addr:7777 in namespace to and connects from
// namespace from.
func tcpCheck(from, to, addr string) error {
	var ln net.Listener
	err := apiserver.RunInNetNS(to, func() error {
		var err error
		ln, err = net.Listen("tcp", net.JoinHostPort(addr, "7777"))
		return err
	})
	if err != nil {
		return err
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			_, _ = c.Write([]byte("ok"))
			c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := apiserver.DialerInNetNS(from)(ctx, "tcp", net.JoinHostPort(addr, "7777"))
	if err != nil {
		return err
	}
	defer c.Close()
	buf := make([]byte, 2)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = c.Read(buf)
	return err
}

// TestCgroupRoots creates the nodes' cgroup roots in every v1 hierarchy
// (cpuset seeded from the root), then removes them.
func TestCgroupRoots(t *testing.T) {
	l := rootLayout(t)
	v1, _, err := cgroupHierarchies()
	if err != nil || len(v1) == 0 {
		t.Skipf("no cgroup v1 hierarchy (%v)", err)
	}
	t.Cleanup(func() { l.removeCgroups(t.Logf) })
	if err := l.createCgroupRoots(); err != nil {
		t.Fatal(err)
	}
	for _, h := range v1 {
		for _, n := range l.Nodes {
			if _, err := os.Stat(filepath.Join(h, n.Name)); err != nil {
				t.Error(err)
			}
			want, err := os.ReadFile(filepath.Join(h, "cpuset.cpus"))
			if err != nil {
				continue
			}
			got, _ := os.ReadFile(filepath.Join(h, n.Name, "cpuset.cpus"))
			if string(got) != string(want) {
				t.Errorf("%s cpuset.cpus = %q, want %q", n.Name, got, want)
			}
		}
	}
	l.removeCgroups(t.Errorf)
	if dirs, _ := l.cgroupDirs(); len(dirs) > 0 {
		t.Errorf("left behind: %v", dirs)
	}
}

// forgetGlobalPaths keeps a test's Down away from /var/lib/cni and the
// like: a real cluster may be using them.
func forgetGlobalPaths(t *testing.T, l Layout) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(l.Dir, createdFile), nil, 0o644); err != nil {
		t.Fatal(err)
	}
}
