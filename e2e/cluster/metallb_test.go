package cluster

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// TestLBPoolsPerFamily checks each family's address ranges: one per family
// of the cluster, the primary first, each inside the node network (so the
// node network's namespace reaches it on br0) and clear of the bridge's and
// the nodes' addresses.
func TestLBPoolsPerFamily(t *testing.T) {
	nodeNet := map[bool]netip.Prefix{
		false: netip.MustParsePrefix(BridgeIP + "/24"),
		true:  netip.MustParsePrefix(BridgeIP6 + "/64"),
	}
	for _, tc := range []struct {
		family string
		want   []string
	}{
		{FamilyIPv4, []string{"10.200.0.200-10.200.0.239"}},
		{FamilyDual, []string{"10.200.0.200-10.200.0.239", "fd00:200::200-fd00:200::239"}},
		{FamilyIPv6, []string{"fd00:200::200-fd00:200::239"}},
	} {
		t.Run(tc.family, func(t *testing.T) {
			l := testLayout(t)
			l.Family = tc.family
			got := l.LBPools()
			if !slices.Equal(got, tc.want) {
				t.Fatalf("LBPools() = %v, want %v", got, tc.want)
			}
			taken := append(l.BridgeIPs(), l.NodeIPs(l.Nodes[0])...)
			for _, n := range l.Nodes[1:] {
				taken = append(taken, l.NodeIPs(n)...)
			}
			for _, pool := range got {
				checkPool(t, pool, nodeNet, taken)
			}
		})
	}
}

// checkPool: pool is "first-last" of one family, inside that family's node
// network, and holds none of taken.
func checkPool(t *testing.T, pool string, nodeNet map[bool]netip.Prefix, taken []string) {
	t.Helper()
	a, b, ok := strings.Cut(pool, "-")
	first, err1 := netip.ParseAddr(a)
	last, err2 := netip.ParseAddr(b)
	if !ok || err1 != nil || err2 != nil || first.Is6() != last.Is6() || last.Less(first) {
		t.Fatalf("pool %q is not a range first-last of one family", pool)
	}
	if p := nodeNet[first.Is6()]; !p.Contains(first) || !p.Contains(last) {
		t.Errorf("pool %q is not inside the node network %v", pool, p)
	}
	for _, s := range taken {
		ip := netip.MustParseAddr(s)
		if ip.Is6() == first.Is6() && !ip.Less(first) && !last.Less(ip) {
			t.Errorf("pool %q holds %s, an address of the node network", pool, ip)
		}
	}
}

// TestMetalLBManifests decodes the rendered objects (the Kubernetes kinds
// strictly, MetalLB's own as unstructured) and checks what the cluster
// relies on: the images, the speaker on every node's network with raw
// sockets, the controller without its webhook, memberlist off, and the
// pool of the cluster's families advertised on eth0.
func TestMetalLBManifests(t *testing.T) {
	for _, family := range []string{FamilyIPv4, FamilyDual, FamilyIPv6} {
		t.Run(family, func(t *testing.T) {
			l := testLayout(t)
			l.Family = family
			m := l.MetalLBManifests("quay.io/metallb/controller:v0", "quay.io/metallb/speaker:v0")
			var kube []string
			crs := map[string]unstructured.Unstructured{}
			for _, doc := range strings.Split(m, "\n---\n") {
				var u unstructured.Unstructured
				if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
					t.Fatalf("%v in:\n%s", err, doc)
				}
				if strings.HasPrefix(u.GetAPIVersion(), "metallb.io/") {
					crs[u.GetKind()] = u
					continue
				}
				kube = append(kube, doc)
			}
			kinds := splitDocs(t, strings.Join(kube, "\n---\n"))
			for _, k := range []string{"Namespace", "ServiceAccount", "ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding", "Deployment", "DaemonSet"} {
				if !slices.Contains(kinds, k) {
					t.Errorf("no %s in %v", k, kinds)
				}
			}
			checkMetalLBWorkloads(t, kube)
			addrs, _, _ := unstructured.NestedStringSlice(crs["IPAddressPool"].Object, "spec", "addresses")
			if !slices.Equal(addrs, l.LBPools()) {
				t.Errorf("IPAddressPool addresses %v, want %v", addrs, l.LBPools())
			}
			pool := crs["IPAddressPool"]
			pools, _, _ := unstructured.NestedStringSlice(crs["L2Advertisement"].Object, "spec", "ipAddressPools")
			ifaces, _, _ := unstructured.NestedStringSlice(crs["L2Advertisement"].Object, "spec", "interfaces")
			if !slices.Equal(pools, []string{pool.GetName()}) || !slices.Equal(ifaces, []string{"eth0"}) {
				t.Errorf("L2Advertisement pools %v interfaces %v, want [%s] [eth0]", pools, ifaces, pool.GetName())
			}
		})
	}
}

func checkMetalLBWorkloads(t *testing.T, docs []string) {
	t.Helper()
	for _, doc := range docs {
		switch {
		case strings.Contains(doc, "kind: Deployment"):
			var d appsv1.Deployment
			if err := yaml.UnmarshalStrict([]byte(doc), &d); err != nil {
				t.Fatal(err)
			}
			c := d.Spec.Template.Spec.Containers[0]
			if c.Image != "quay.io/metallb/controller:v0" || !slices.Contains(c.Args, "--webhook-mode=disabled") {
				t.Errorf("controller: image %s args %v", c.Image, c.Args)
			}
		case strings.Contains(doc, "kind: DaemonSet"):
			var ds appsv1.DaemonSet
			if err := yaml.UnmarshalStrict([]byte(doc), &ds); err != nil {
				t.Fatal(err)
			}
			p := ds.Spec.Template.Spec
			c := p.Containers[0]
			if c.Image != "quay.io/metallb/speaker:v0" || !p.HostNetwork ||
				!slices.Contains(c.SecurityContext.Capabilities.Add, "NET_RAW") {
				t.Errorf("speaker: image %s hostNetwork %v capabilities %+v", c.Image, p.HostNetwork, c.SecurityContext.Capabilities)
			}
			if strings.Contains(strings.Join(c.Args, " "), "--ml-") {
				t.Errorf("speaker runs memberlist: %v", c.Args)
			}
		}
	}
}

// TestNodeImagesLeaveMetalLBOut: without KNP_CLUSTER_LB the nodes import
// what they did before MetalLB's images existed; with it, everything.
func TestNodeImagesLeaveMetalLBOut(t *testing.T) {
	imgs := []Image{{Ref: PauseImage}, {Ref: "quay.io/metallb/controller:v0.16.1"},
		{Ref: "quay.io/metallb/speaker:v0.16.1"}, {Ref: "registry.k8s.io/coredns/coredns:v1.12.1"}}
	l := testLayout(t)
	l.LB = LBNone
	if got := l.nodeImages(imgs); len(got) != 2 || got[0] != imgs[0] || got[1] != imgs[3] {
		t.Errorf("without the load balancer: %v", got)
	}
	l.LB = LBMetalLB
	if got := l.nodeImages(imgs); len(got) != 4 {
		t.Errorf("with MetalLB: %v", got)
	}
	if FindImage(imgs, "controller") != imgs[1].Ref || FindImage(imgs, "speaker") != imgs[2].Ref {
		t.Error("FindImage does not find MetalLB's images")
	}
}

func TestCheckLB(t *testing.T) {
	l := testLayout(t)
	for lb, ok := range map[string]bool{LBNone: true, LBMetalLB: true, "cilium": false} {
		l.LB = lb
		if err := l.checkLB(); (err == nil) != ok {
			t.Errorf("checkLB(%q) = %v", lb, err)
		}
	}
}

// TestLBClientOutsideNodeSubnets: the node network's client address of
// each family lies outside the subnet e2e.test takes for the nodes' (the
// node's address masked to /16, /64: its "Source IP was NOT preserved"
// check), and the route from it covers that family's pool.
func TestLBClientOutsideNodeSubnets(t *testing.T) {
	for _, tc := range []struct {
		client, route, pool, node string
		bits                      int
	}{
		{LBClient4, LBRoute4, LBPool4, "10.200.0.11", 16},
		{LBClient6, LBRoute6, LBPool6, "fd00:200::11", 64},
	} {
		nodeSubnet := netip.PrefixFrom(netip.MustParseAddr(tc.node), tc.bits).Masked()
		if nodeSubnet.Contains(netip.MustParseAddr(tc.client)) {
			t.Errorf("client %s is inside the nodes' %v", tc.client, nodeSubnet)
		}
		route := netip.MustParsePrefix(tc.route)
		first, last, _ := strings.Cut(tc.pool, "-")
		if !route.Contains(netip.MustParseAddr(first)) || !route.Contains(netip.MustParseAddr(last)) {
			t.Errorf("route %v does not cover pool %s", route, tc.pool)
		}
	}
	l := testLayout(t)
	l.Family = FamilyDual
	if got := len(l.lbClientSteps()); got != 4 {
		t.Errorf("dual-stack: %d steps, want an address and a route per family", got)
	}
}

func TestInRange(t *testing.T) {
	for _, tc := range []struct {
		addr, pool string
		want       bool
	}{
		{"10.200.0.200", LBPool4, true},
		{"10.200.0.239", LBPool4, true},
		{"10.200.0.240", LBPool4, false},
		{"10.200.0.12", LBPool4, false},
		{"fd00:200::2ff", LBPool6, false},
		{"fd00:200::20a", LBPool6, true},
		{"fd00:200::20a", LBPool4, false},
		{"nonsense", LBPool4, false},
	} {
		if got := inRange(tc.addr, tc.pool); got != tc.want {
			t.Errorf("inRange(%s, %s) = %v, want %v", tc.addr, tc.pool, got, tc.want)
		}
	}
}

// TestInPoolsPerFamily: an ingress address of either family is found in
// the dual-stack pools (ranges, which are not prefixes).
func TestInPoolsPerFamily(t *testing.T) {
	l := testLayout(t)
	l.Family = FamilyDual
	for addr, want := range map[string]bool{"10.200.0.200": true, "fd00:200::200": true, "fd00:200::239": true,
		"fd00:200::11": false, "10.200.0.11": false} {
		if got := inPools(addr, l.LBPools()); got != want {
			t.Errorf("inPools(%s, %v) = %v, want %v", addr, l.LBPools(), got, want)
		}
	}
}
