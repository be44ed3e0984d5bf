package cluster

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

func testLayout(t *testing.T) Layout {
	l := DefaultLayout()
	l.Dir = t.TempDir()
	l.Family = FamilyIPv4 // whatever KNP_CLUSTER_FAMILY says
	return l
}

func TestKubeletConfigPerNode(t *testing.T) {
	l := testLayout(t)
	seen := map[string]string{}
	for _, n := range l.Nodes {
		var c map[string]any
		if err := yaml.UnmarshalStrict([]byte(l.KubeletConfig(n)), &c); err != nil {
			t.Fatalf("%s: %v", n.Name, err)
		}
		for key, want := range map[string]any{
			"kind": "KubeletConfiguration", "failCgroupV1": false, "cgroupDriver": "cgroupfs",
			"cgroupRoot": "/" + n.Name, "address": n.IP, "resolvConf": l.resolvConf(n),
			"containerRuntimeEndpoint": "unix://" + l.ContainerdSocket(n),
		} {
			if c[key] != want {
				t.Errorf("%s: %s = %v, want %v", n.Name, key, c[key], want)
			}
		}
		if dns, _ := c["clusterDNS"].([]any); len(dns) != 1 || dns[0] != DNSServiceIP {
			t.Errorf("%s: clusterDNS = %v", n.Name, c["clusterDNS"])
		}
		logs, _ := c["podLogsDir"].(string)
		if other, dup := seen[logs]; dup || logs == "/var/log/pods" {
			t.Errorf("%s: podLogsDir %q shared (with %q)", n.Name, logs, other)
		}
		seen[logs] = n.Name
	}
}

func TestContainerdConfig(t *testing.T) {
	l := testLayout(t)
	for _, major := range []int{1, 2} {
		a, b := l.ContainerdConfig(l.Nodes[0], major), l.ContainerdConfig(l.Nodes[1], major)
		if a == b {
			t.Errorf("containerd %d.x: both nodes get the same configuration", major)
		}
		for _, want := range []string{
			"restrict_oom_score_adj = true", "SystemdCgroup = false", `snapshotter = "overlayfs"`,
			"netns_mounts_under_state_dir = true", PauseImage, l.ContainerdSocket(l.Nodes[0]),
			l.cniConfDir(l.Nodes[0]), `state = "/run/containerd-node1"`,
		} {
			if !strings.Contains(a, want) {
				t.Errorf("containerd %d.x configuration lacks %q:\n%s", major, want, a)
			}
		}
	}
	if !strings.Contains(l.ContainerdConfig(l.Nodes[0], 2), "[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = true") {
		t.Error("containerd 2.x: NRI enabled (both nodes would bind /var/run/nri/nri.sock)")
	}
	if !strings.HasPrefix(l.ContainerdConfig(l.Nodes[0], 1), "version = 2\n") ||
		!strings.HasPrefix(l.ContainerdConfig(l.Nodes[0], 2), "version = 3\n") {
		t.Error("containerd 1.x wants configuration version 2, 2.x version 3")
	}
}

func TestKubeconfig(t *testing.T) {
	l := testLayout(t)
	var c struct {
		Clusters []struct {
			Cluster map[string]string `json:"cluster"`
		} `json:"clusters"`
		Users []struct {
			User map[string]string `json:"user"`
		} `json:"users"`
		CurrentContext string `json:"current-context"`
	}
	if err := yaml.Unmarshal([]byte(l.kubeconfig(l.APIServerURL(), "kubelet-node1")), &c); err != nil {
		t.Fatal(err)
	}
	if len(c.Clusters) != 1 || c.Clusters[0].Cluster["server"] != "https://10.200.0.1:6443" {
		t.Errorf("clusters = %+v", c.Clusters)
	}
	if len(c.Users) != 1 || c.Users[0].User["client-certificate"] != l.pki("kubelet-node1.crt") {
		t.Errorf("users = %+v", c.Users)
	}
}

func TestWritePKI(t *testing.T) {
	l := testLayout(t)
	if err := l.writePKI(); err != nil {
		t.Fatal(err)
	}
	for _, s := range l.certSpecs() {
		for _, ext := range []string{".crt", ".key"} {
			if _, err := os.Stat(l.pki(s.File + ext)); err != nil {
				t.Error(err)
			}
		}
	}
}

// splitDocs decodes a multi-document manifest into typed objects,
// strictly (an unknown field fails), and returns the kinds.
func splitDocs(t *testing.T, manifests string) []string {
	t.Helper()
	var kinds []string
	for _, doc := range strings.Split(manifests, "\n---\n") {
		var u unstructured.Unstructured
		if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
			t.Fatalf("%v in:\n%s", err, doc)
		}
		var obj any
		switch u.GetKind() {
		case "Deployment":
			obj = &appsv1.Deployment{}
		case "DaemonSet":
			obj = &appsv1.DaemonSet{}
		case "Service":
			obj = &corev1.Service{}
		case "Pod":
			obj = &corev1.Pod{}
		case "ConfigMap":
			obj = &corev1.ConfigMap{}
		case "ServiceAccount", "Namespace":
			obj = &corev1.ServiceAccount{}
		case "ClusterRole":
			obj = &rbacv1.ClusterRole{}
		case "ClusterRoleBinding":
			obj = &rbacv1.ClusterRoleBinding{}
		case "Role":
			obj = &rbacv1.Role{}
		case "RoleBinding":
			obj = &rbacv1.RoleBinding{}
		default:
			t.Fatalf("unexpected kind %q", u.GetKind())
		}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
		}
		kinds = append(kinds, u.GetKind())
	}
	return kinds
}

func TestManifestsDecode(t *testing.T) {
	l := testLayout(t)
	for name, m := range map[string]string{
		"coredns": CoreDNSManifests("registry.k8s.io/coredns/coredns:v1.15.0", []string{DNSServiceIP}),
		"flannel": FlannelManifests("ghcr.io/flannel-io/flannel:v0.27.0", l.flannelNetConf()),
		"smoke":   l.SmokeManifests("registry.k8s.io/e2e-test-images/agnhost:2.66.1"),
	} {
		if kinds := splitDocs(t, m); len(kinds) < 3 {
			t.Errorf("%s: only %v", name, kinds)
		}
	}
	if !strings.Contains(CoreDNSManifests("x", []string{DNSServiceIP}), "clusterIP: "+DNSServiceIP) {
		t.Error("kube-dns Service lacks its ClusterIP")
	}
}

// needKubectl is the kubectl DeployManifests renders deploy/ with (the
// cluster's, from hack/cluster/build.sh): without it the test skips, or
// fails with KNP_REQUIRE_APISERVER=1, as CI builds it before the tests.
func needKubectl(t *testing.T) string {
	t.Helper()
	kubectl := testLayout(t).KubectlBin()
	if _, err := exec.LookPath(kubectl); err != nil {
		if os.Getenv("KNP_REQUIRE_APISERVER") == "1" {
			t.Fatalf("KNP_REQUIRE_APISERVER=1 but no kubectl: %v", err)
		}
		t.Skipf("no kubectl to render deploy/ with (hack/cluster/build.sh kubectl builds it): %v", err)
	}
	return kubectl
}

// TestDeployManifests: deploy/ as kubectl kustomize renders it, with only
// the image and the API server address changed.
func TestDeployManifests(t *testing.T) {
	kubectl := needKubectl(t)
	deploy := filepath.Join("..", "..", "deploy")
	out, err := DeployManifests(t.Context(), kubectl, deploy, "example.org/kube-nftproxy:v1", "https://10.200.0.1:6443")
	if err != nil {
		t.Fatal(err)
	}
	if kinds := splitDocs(t, out); strings.Join(kinds, " ") != "ServiceAccount ClusterRole ClusterRoleBinding ConfigMap DaemonSet" {
		t.Errorf("kinds %v", kinds)
	}
	for _, want := range []string{"image: example.org/kube-nftproxy:v1", "server: https://10.200.0.1:6443"} {
		if !strings.Contains(out, want) {
			t.Errorf("lacks %q", want)
		}
	}
	rendered, err := exec.Command(kubectl, "kustomize", deploy).Output()
	if err != nil {
		t.Fatal(err)
	}
	back := strings.NewReplacer("example.org/kube-nftproxy:v1", "kube-nftproxy:latest",
		"https://10.200.0.1:6443", "https://API-SERVER:6443").Replace(out)
	if back != string(rendered) {
		t.Error("changed more than the image and the API server address")
	}

	bad := t.TempDir()
	for f, content := range map[string]string{"kustomization.yaml": "resources: [cm.yaml]\n",
		"cm.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n"} {
		if err := os.WriteFile(filepath.Join(bad, f), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := DeployManifests(t.Context(), kubectl, bad, "i", "s"); err == nil || !strings.Contains(err.Error(), "occurs 0 times") {
		t.Errorf("manifests without an image line: err = %v", err)
	}
	if _, err := DeployManifests(t.Context(), kubectl, t.TempDir(), "i", "s"); err == nil {
		t.Error("a directory without a kustomization was taken")
	}
}

func TestCleanupManifests(t *testing.T) {
	deploy := filepath.Join("..", "..", "deploy")
	out, err := CleanupManifests(deploy, "example.org/kube-nftproxy:v1", "example.org/pause:9")
	if err != nil {
		t.Fatal(err)
	}
	splitDocs(t, out)
	orig, err := os.ReadFile(filepath.Join(deploy, "cleanup", "daemonset.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	back := strings.NewReplacer("example.org/kube-nftproxy:v1", "kube-nftproxy:latest",
		"example.org/pause:9", "registry.k8s.io/pause:3.10.2").Replace(out)
	if back != string(orig) || strings.Count(out, "example.org/") != 2 {
		t.Error("changed more, or less, than the two images")
	}
	if _, err := CleanupManifests(t.TempDir(), "i", "p"); err == nil {
		t.Error("a directory without deploy/cleanup was taken")
	}
}

func TestImages(t *testing.T) {
	dir := t.TempDir()
	txt := "# comment\nregistry.k8s.io/pause:3.10.2 pause.tar\n\nlocalhost:5000/kube-nftproxy:dev knp.tar\nregistry.k8s.io/e2e-test-images/agnhost:2.66.1 agnhost.tar\n"
	if err := os.WriteFile(filepath.Join(dir, "images.txt"), []byte(txt), 0o644); err != nil {
		t.Fatal(err)
	}
	imgs, err := ReadImages(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(imgs) != 3 || imgs[1].File != filepath.Join(dir, "knp.tar") {
		t.Fatalf("images = %+v", imgs)
	}
	for name, want := range map[string]string{
		"pause": PauseImage, "kube-nftproxy": "localhost:5000/kube-nftproxy:dev",
		"agnhost": "registry.k8s.io/e2e-test-images/agnhost:2.66.1", "coredns": "", "5000": "",
	} {
		if got := FindImage(imgs, name); got != want {
			t.Errorf("FindImage(%q) = %q, want %q", name, got, want)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "images.txt"), []byte("one two three\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadImages(dir); err == nil {
		t.Error("a line with three fields was accepted")
	}
}

func TestInClusterCgroup(t *testing.T) {
	l := testLayout(t)
	for _, tc := range []struct {
		cgroup string
		want   bool
	}{
		{"4:memory:/node1/kubepods/besteffort/pod1\n0::/", true},
		{"3:cpuset:/node2\n", true},
		{"4:memory:/process_api/abc\n1:cpu:/\n0::/", false},
		{"4:memory:/node10/x\n", false},
	} {
		if got := l.inClusterCgroup(tc.cgroup); got != tc.want {
			t.Errorf("inClusterCgroup(%q) = %v, want %v", tc.cgroup, got, tc.want)
		}
	}
}

func TestUnescapeMount(t *testing.T) {
	for in, want := range map[string]string{`/a\040b`: "/a b", "/plain": "/plain", `/x\134y`: `/x\y`} {
		if got := unescapeMount(in); got != want {
			t.Errorf("unescapeMount(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestContainerdMajor(t *testing.T) {
	for out, want := range map[string]int{
		"containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3": 1,
		"containerd github.com/containerd/containerd/v2 v2.4.2 abcdef":                2,
	} {
		if got := parseContainerdMajor(out); got != want {
			t.Errorf("parseContainerdMajor(%q) = %d, want %d", out, got, want)
		}
	}
}

func TestCNIConfigs(t *testing.T) {
	l := testLayout(t)
	names := map[string]bool{}
	for _, n := range l.Nodes {
		var flannel struct {
			Name    string `json:"name"`
			Plugins []struct {
				Type       string         `json:"type"`
				SubnetFile string         `json:"subnetFile"`
				Delegate   map[string]any `json:"delegate"`
			} `json:"plugins"`
		}
		if err := json.Unmarshal([]byte(l.FlannelCNIConfig(n)), &flannel); err != nil {
			t.Fatalf("%s flannel: %v", n.Name, err)
		}
		p := flannel.Plugins[0]
		if p.Type != "flannel" || p.SubnetFile != FlannelSubnetFile(n) || p.Delegate["ipMasq"] != false {
			t.Errorf("%s flannel plugin = %+v", n.Name, p)
		}
		bridge, err := l.BridgeCNIConfig(n, []string{"10.244.7.0/24"})
		if err != nil {
			t.Fatal(err)
		}
		var b struct {
			Name string `json:"name"`
		}
		if err := json.Unmarshal([]byte(bridge), &b); err != nil || !strings.Contains(bridge, `"subnet": "10.244.7.0/24"`) {
			t.Errorf("%s bridge: %v\n%s", n.Name, err, bridge)
		}
		// host-local keeps its leases per network name: one per node.
		for _, name := range []string{flannel.Name, b.Name} {
			if names[name] {
				t.Errorf("network name %q used twice", name)
			}
			names[name] = true
		}
	}
}
