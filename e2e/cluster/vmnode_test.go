package cluster

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestVMNodesNetwork: with guests the node network is the bridge and a tap
// per node, and the cluster owns no namespace but the node network's.
func TestVMNodesNetwork(t *testing.T) {
	l := testLayout(t)
	l.NodeKernel = "/cache/vm/linux"
	var got []string
	for _, s := range l.networkSteps() {
		got = append(got, strings.Join(s, " "))
	}
	want := []string{
		"ip netns add nodenet",
		"ip -n nodenet link set lo up",
		"ip -n nodenet link add br0 type bridge",
		"ip -n nodenet addr add 10.200.0.1/24 dev br0",
		"ip -n nodenet link set br0 up",
		"nsenter --net=/run/netns/nodenet -- sysctl -q -w net.ipv4.ip_forward=1",
		"ip -n nodenet tuntap add dev tap-node1 mode tap",
		"ip -n nodenet link set tap-node1 master br0 up",
		"ip -n nodenet tuntap add dev tap-node2 mode tap",
		"ip -n nodenet link set tap-node2 master br0 up",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("steps:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if names := l.netnsNames(); len(names) != 1 || names[0] != "nodenet" {
		t.Errorf("namespaces %v, want [nodenet]", names)
	}
	if ns := l.podProbeNS(); ns != "nodenet" {
		t.Errorf("pods probed from %s, want nodenet", ns)
	}
}

// TestVMNodeGuestCommand: the guest boots the kernel on the node's share
// and tap, and its script runs the cluster command as that node with the
// cluster's settings.
func TestVMNodeGuestCommand(t *testing.T) {
	l := testLayout(t)
	l.NodeKernel = "/cache/vm/linux"
	l.Proxy = ProxyIPVS
	l.Family = FamilyDual
	l.GuestImages = GuestImagesCore
	n := l.Nodes[1]
	t.Setenv(nodeMemEnv, "3072")
	args := strings.Join(l.UMLArgs(n, "/repo/hack/vm/uml-init"), " ")
	for _, want := range []string{"/cache/vm/linux mem=3072M ", " init=/repo/hack/vm/uml-init ",
		" knp.share=" + filepath.Join(l.Dir, "vm", "node2") + " ", " eth0=tuntap,tap-node2 "} {
		if !strings.Contains(args, want) {
			t.Errorf("UML arguments %q lack %q", args, want)
		}
	}
	script := filepath.Join(t.TempDir(), "guest.sh")
	if err := os.WriteFile(script, []byte(l.guestScript(n, "/cluster/knp-cluster")), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("sh", "-n", script).CombinedOutput(); err != nil {
		t.Fatalf("guest.sh: %v: %s", err, out)
	}
	text := l.guestScript(n, "/cluster/knp-cluster")
	for _, want := range []string{"export KNP_CLUSTER_DIR='" + l.Dir + "'", "export KNP_CLUSTER_PROXY='ipvs'",
		"export KNP_CLUSTER_FAMILY='dual'", "export KNP_CLUSTER_NODES='2'",
		"export KNP_CLUSTER_GUEST_IMAGES='core'", "exec /cluster/knp-cluster guest-node node2"} {
		if !strings.Contains(text, want) {
			t.Errorf("guest.sh lacks %q:\n%s", want, text)
		}
	}
}

// TestGuestImages: a guest imports every archive, or with GuestImagesCore
// only those of the images every cluster runs, the proxy's by mode.
func TestGuestImages(t *testing.T) {
	imgs := []Image{
		{Ref: "registry.k8s.io/pause:3.10.2"}, {Ref: "registry.local/kube-nftproxy:v1"},
		{Ref: "registry.k8s.io/kube-proxy:v1.37.1"}, {Ref: "registry.k8s.io/e2e-test-images/nginx:1.27.0-2"},
		{Ref: "registry.k8s.io/e2e-test-images/agnhost:2.55"}, {Ref: "registry.k8s.io/coredns/coredns:v1.14.6"},
		{Ref: "ghcr.io/flannel-io/flannel:v0.28.10"}, {Ref: "ghcr.io/flannel-io/flannel-cni-plugin:v1.9.1-flannel3"},
		{Ref: "quay.io/metallb/speaker:v0.16.1"},
	}
	names := func(imgs []Image) string {
		var out []string
		for _, im := range imgs {
			out = append(out, imageName(im.Ref))
		}
		return strings.Join(out, " ")
	}
	for _, tc := range []struct{ proxy, which, want string }{
		{ProxyIPVS, GuestImagesAll, "pause kube-nftproxy kube-proxy nginx agnhost coredns flannel flannel-cni-plugin speaker"},
		{ProxyIPVS, GuestImagesCore, "pause kube-nftproxy agnhost coredns flannel flannel-cni-plugin"},
		{ProxyUpstreamIPVS, GuestImagesCore, "pause kube-proxy agnhost coredns flannel flannel-cni-plugin"},
	} {
		l := Layout{Proxy: tc.proxy, GuestImages: tc.which}
		if got := names(l.guestImages(imgs)); got != tc.want {
			t.Errorf("%s, %q: imports %q, want %q", tc.proxy, tc.which, got, tc.want)
		}
	}
}
