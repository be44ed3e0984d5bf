package cluster

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// familyCase is what one KNP_CLUSTER_FAMILY must configure.
type familyCase struct {
	family       string
	apiServer    string   // APIServerURL
	serviceCIDRs string   // --service-cluster-ip-range
	clusterCIDRs string   // --cluster-cidr of the controller manager and the proxies
	maskArgs     []string // the controller manager's node CIDR sizes
	nodeIP       string   // node1's kubelet --node-ip
	dns          string   // kubelet's clusterDNS
	bind         string   // the API server's --bind-address
}

var familyCases = []familyCase{
	{FamilyIPv4, "https://10.200.0.1:6443", "10.96.0.0/16", "10.244.0.0/16",
		[]string{"--node-cidr-mask-size=24"}, "10.200.0.11", "10.96.0.10", "0.0.0.0"},
	{FamilyDual, "https://10.200.0.1:6443", "10.96.0.0/16,fd00:10:96::/112", "10.244.0.0/16,fd00:10:244::/56",
		[]string{"--node-cidr-mask-size-ipv4=24", "--node-cidr-mask-size-ipv6=64"}, "10.200.0.11,fd00:200::11", "10.96.0.10", "::"},
	{FamilyIPv6, "https://[fd00:200::1]:6443", "fd00:10:96::/112", "fd00:10:244::/56",
		[]string{"--node-cidr-mask-size-ipv6=64"}, "fd00:200::11", "fd00:10:96::a", "::"},
}

// TestFamilyControlPlane checks the flags each family shape gives the API
// server, the controller manager and the kubelets, and the API server's
// certificate addresses.
func TestFamilyControlPlane(t *testing.T) {
	for _, tc := range familyCases {
		t.Run(tc.family, func(t *testing.T) {
			l := testLayout(t)
			l.Family = tc.family
			if err := l.checkFamily(); err != nil {
				t.Fatal(err)
			}
			if got := l.APIServerURL(); got != tc.apiServer {
				t.Errorf("APIServerURL = %q, want %q", got, tc.apiServer)
			}
			args := l.controlPlaneArgs("etcd")
			wantFlags(t, "kube-apiserver", args["kube-apiserver"], "--service-cluster-ip-range="+tc.serviceCIDRs,
				"--advertise-address="+l.BridgeIPs()[0], "--bind-address="+tc.bind)
			wantFlags(t, "kube-controller-manager", args["kube-controller-manager"],
				append(tc.maskArgs, "--cluster-cidr="+tc.clusterCIDRs, "--service-cluster-ip-range="+tc.serviceCIDRs)...)
			n := l.Nodes[0]
			wantFlags(t, "kubelet", l.KubeletArgs(n), "--node-ip="+tc.nodeIP)
			var c struct {
				ClusterDNS []string `json:"clusterDNS"`
				Address    string   `json:"address"`
			}
			if err := yaml.Unmarshal([]byte(l.KubeletConfig(n)), &c); err != nil {
				t.Fatal(err)
			}
			if len(c.ClusterDNS) != 1 || c.ClusterDNS[0] != tc.dns {
				t.Errorf("clusterDNS %v, want [%s]", c.ClusterDNS, tc.dns)
			}
			if want := map[bool]string{true: n.IP, false: "::"}[tc.family == FamilyIPv4]; c.Address != want {
				t.Errorf("kubelet address %q, want %q", c.Address, want)
			}
			certIPs := l.certSpecs()[0].IPs
			for _, ip := range append(l.BridgeIPs(), l.kubernetesIPs()...) {
				if !slices.Contains(certIPs, ip) {
					t.Errorf("the API server's certificate lacks %s: %v", ip, certIPs)
				}
			}
		})
	}
	if err := (Layout{Family: "ipv5"}).checkFamily(); err == nil {
		t.Error("KNP_CLUSTER_FAMILY=ipv5 accepted")
	}
}

// wantFlags fails unless argv holds each of flags.
func wantFlags(t *testing.T, what string, argv []string, flags ...string) {
	t.Helper()
	for _, f := range flags {
		if !slices.Contains(argv, f) {
			t.Errorf("%s lacks %s: %v", what, f, argv)
		}
	}
	if slices.Contains(argv, "--node-cidr-mask-size=24") && slices.ContainsFunc(argv, func(a string) bool {
		return strings.HasPrefix(a, "--node-cidr-mask-size-ipv")
	}) {
		t.Errorf("%s: both mask flag kinds (kube-controller-manager refuses that): %v", what, argv)
	}
}

// TestFamilyAddons checks what each family shape deploys: flannel's
// net-conf.json, the proxies' cluster CIDRs, kube-dns's ClusterIPs and the
// smoke check's Services, all decoded strictly.
func TestFamilyAddons(t *testing.T) {
	deploy := filepath.Join("..", "..", "deploy")
	for _, tc := range familyCases {
		t.Run(tc.family, func(t *testing.T) {
			l := testLayout(t)
			l.Family = tc.family
			checkFlannelNetConf(t, l)
			dns := serviceNamed(t, CoreDNSManifests("img", l.DNSServiceIPs()), "kube-dns")
			if !slices.Equal(dns.Spec.ClusterIPs, l.DNSServiceIPs()) && !(len(l.DNSServiceIPs()) == 1 && dns.Spec.ClusterIP == tc.dns) {
				t.Errorf("kube-dns ClusterIPs %v / %s, want %v", dns.Spec.ClusterIPs, dns.Spec.ClusterIP, l.DNSServiceIPs())
			}
			smoke := l.SmokeManifests("agnhost")
			if has := strings.Contains(smoke, "name: web6\n"); has != (tc.family == FamilyDual) {
				t.Errorf("smoke manifests have web6: %v", has)
			}
			if tc.family == FamilyDual {
				if s := serviceNamed(t, smoke, "web6"); !slices.Equal(s.Spec.IPFamilies, []corev1.IPFamily{corev1.IPv6Protocol}) {
					t.Errorf("web6 families %v", s.Spec.IPFamilies)
				}
			}
			for _, proxy := range []string{ProxyUpstream, ProxyOurs} {
				l.Proxy = proxy
				if proxy == ProxyOurs {
					needKubectl(t) // deploy/ rendered by kubectl kustomize: last, as it may skip
				}
				m, err := l.proxyManifests(t.Context(), deploy, "img")
				if err != nil {
					t.Fatal(err)
				}
				splitDocs(t, m)
				want := map[string]string{ProxyOurs: "- --cluster-cidr=", ProxyUpstream: "clusterCIDR: "}[proxy] + tc.clusterCIDRs + "\n"
				if !strings.Contains(m, want) {
					t.Errorf("%s: lacks %q", proxy, want)
				}
			}
		})
	}
}

// checkFlannelNetConf decodes flannel's net-conf.json and checks its
// families; IPv4's stays what it always was.
func checkFlannelNetConf(t *testing.T, l Layout) {
	t.Helper()
	var c struct {
		Network, IPv6Network   string
		EnableIPv4, EnableIPv6 *bool
	}
	if err := json.Unmarshal([]byte(l.flannelNetConf()), &c); err != nil {
		t.Fatal(err)
	}
	v4 := c.EnableIPv4 == nil || *c.EnableIPv4 // flannel's default: on
	v6 := c.EnableIPv6 != nil && *c.EnableIPv6
	if v4 != l.HasIPv4() || v6 != l.HasIPv6() || (v4 && c.Network != ClusterCIDR) || (v6 && c.IPv6Network != ClusterCIDR6) {
		t.Errorf("%s: net-conf.json %s", l.Family, l.flannelNetConf())
	}
	if l.Family == FamilyIPv4 && l.flannelNetConf() != `{"Network": "10.244.0.0/16", "Backend": {"Type": "vxlan"}}` {
		t.Errorf("IPv4's net-conf.json changed: %s", l.flannelNetConf())
	}
}

// serviceNamed decodes the Service called name from manifests.
func serviceNamed(t *testing.T, manifests, name string) corev1.Service {
	t.Helper()
	splitDocs(t, manifests)
	for _, doc := range strings.Split(manifests, "\n---\n") {
		var s corev1.Service
		if err := yaml.Unmarshal([]byte(doc), &s); err == nil && s.Kind == "Service" && s.Name == name {
			return s
		}
	}
	t.Fatalf("no Service %s", name)
	return corev1.Service{}
}

// TestBridgeCNIDualStack checks the fallback pod network's ranges and
// default routes: one of each per family.
func TestBridgeCNIDualStack(t *testing.T) {
	l := testLayout(t)
	l.Family = FamilyDual
	conf, err := l.BridgeCNIConfig(l.Nodes[0], []string{"10.244.3.0/24", "fd00:10:244:3::/64"})
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Plugins []struct {
			IPAM struct {
				Ranges [][]map[string]string `json:"ranges"`
				Routes []map[string]string   `json:"routes"`
			} `json:"ipam"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal([]byte(conf), &c); err != nil {
		t.Fatal(err)
	}
	ipam := c.Plugins[0].IPAM
	if len(ipam.Ranges) != 2 || ipam.Ranges[1][0]["subnet"] != "fd00:10:244:3::/64" ||
		len(ipam.Routes) != 2 || ipam.Routes[0]["dst"] != "0.0.0.0/0" || ipam.Routes[1]["dst"] != "::/0" {
		t.Errorf("ipam %+v", ipam)
	}
}

func TestParseNodeStatuses(t *testing.T) {
	st := parseNodeStatuses("node1|True|10.244.0.0/24 fd00:10:244::/64\nnode2||\nnode3|False|10.244.2.0/24\n\n")
	want := map[string]nodeStatus{
		"node1": {name: "node1", ready: "True", podCIDRs: []string{"10.244.0.0/24", "fd00:10:244::/64"}},
		"node2": {name: "node2"},
		"node3": {name: "node3", ready: "False", podCIDRs: []string{"10.244.2.0/24"}},
	}
	if len(st) != len(want) {
		t.Fatalf("got %+v", st)
	}
	for name, w := range want {
		g := st[name]
		if g.name != w.name || g.ready != w.ready || !slices.Equal(g.podCIDRs, w.podCIDRs) {
			t.Errorf("%s: got %+v, want %+v", name, g, w)
		}
	}
}
