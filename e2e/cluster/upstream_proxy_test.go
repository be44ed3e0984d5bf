package cluster

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestProxyChoice checks KNP_CLUSTER_PROXY's values: the DaemonSet each
// deploys (decoded strictly) and the refusal of an unknown one.
func TestProxyChoice(t *testing.T) {
	deploy := filepath.Join("..", "..", "deploy")
	for _, tc := range []struct {
		proxy, name string
		contains    []string
		wantErr     bool
	}{
		{proxy: "", name: "kube-nftproxy", contains: []string{"image: img"}},
		{proxy: ProxyOurs, name: "kube-nftproxy", contains: []string{
			"k8s-app: kube-proxy", "app.kubernetes.io/name: kube-nftproxy", "kubernetes.io/os: linux",
		}},
		{proxy: ProxyPrivileged, name: "kube-nftproxy", contains: []string{"app.kubernetes.io/name: kube-nftproxy"}},
		{proxy: ProxyUpstream, name: "kube-proxy", contains: []string{
			"k8s-app: kube-proxy", "mode: iptables", "maxPerCore: 0", "name: system:node-proxier",
			"privileged: true", "path: /lib/modules", "server: https://10.200.0.1:6443",
			"clusterCIDR: " + ClusterCIDR,
		}},
		{proxy: ProxyUpstreamNFT, name: "kube-proxy", contains: []string{
			"k8s-app: kube-proxy", "mode: nftables", "privileged: true", "image: img",
		}},
		{proxy: ProxyKubeadm, name: "kube-proxy", contains: []string{
			"k8s-app: kube-proxy", "mode: iptables", "privileged: true", "image: img",
			"- /usr/local/bin/kube-proxy\n        - --config=/var/lib/kube-proxy/config.conf",
			"server: https://10.200.0.1:6443", "clusterCIDR: " + ClusterCIDR, "burst: 0",
		}},
		{proxy: ProxyIPVS, name: "kube-nftproxy", contains: []string{
			"        - --init-only\n        - --proxy-mode=ipvs\n", "        - /kube-nftproxy\n        - --proxy-mode=ipvs\n",
		}},
		{proxy: ProxyUpstreamIPVS, name: "kube-proxy", contains: []string{
			"k8s-app: kube-proxy", "mode: ipvs", "privileged: true", "path: /lib/modules",
		}},
		{proxy: "userspace", wantErr: true},
	} {
		t.Run(tc.proxy, func(t *testing.T) {
			l := testLayout(t)
			l.Proxy = tc.proxy
			if err := l.checkProxy(); (err != nil) != tc.wantErr {
				t.Fatalf("checkProxy: %v, want error %v", err, tc.wantErr)
			}
			if tc.wantErr {
				return
			}
			if got := l.proxyName(); got != tc.name {
				t.Errorf("proxyName %q, want %q", got, tc.name)
			}
			if l.proxyName() == "kube-nftproxy" {
				needKubectl(t) // deploy/ rendered by kubectl kustomize
			}
			m, err := l.proxyManifests(t.Context(), deploy, "img")
			if err != nil {
				t.Fatal(err)
			}
			if kinds := splitDocs(t, m); !strings.Contains(strings.Join(kinds, " "), "DaemonSet") {
				t.Errorf("no DaemonSet in %v", kinds)
			}
			for _, want := range append(tc.contains, "name: "+tc.name) {
				if !strings.Contains(m, want) {
					t.Errorf("manifests lack %q", want)
				}
			}
		})
	}
}

// TestIPVSNeedsIPVS: the IPVS-mode proxies are refused, naming the VM that
// runs them, where the kernel has no IPVS; the others never ask.
func TestIPVSNeedsIPVS(t *testing.T) {
	have := filepath.Join(t.TempDir(), "ip_vs")
	if err := os.WriteFile(have, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "ip_vs")
	for _, tc := range []struct {
		proxy, procFile string
		wantErr         bool
	}{
		{ProxyIPVS, have, false},
		{ProxyUpstreamIPVS, have, false},
		{ProxyIPVS, missing, true},
		{ProxyUpstreamIPVS, missing, true},
		{ProxyOurs, missing, false},
		{ProxyUpstream, missing, false},
	} {
		l := testLayout(t)
		l.Proxy = tc.proxy
		err := l.checkKernel(tc.procFile)
		if (err != nil) != tc.wantErr {
			t.Errorf("%s with %s: %v, want error %v", tc.proxy, filepath.Base(filepath.Dir(tc.procFile)), err, tc.wantErr)
		}
		if err != nil && !strings.Contains(err.Error(), "hack/vm/uml-kernel.sh") {
			t.Errorf("%s: %v does not say where it runs", tc.proxy, err)
		}
		l.NodeKernel = "/cache/vm/linux"
		if err := l.checkKernel(tc.procFile); err != nil {
			t.Errorf("%s with guest nodes: %v, want none (their kernel has IPVS)", tc.proxy, err)
		}
	}
}

// TestUpstreamProxyLockInClusterDir: the xtables lock must live under the
// cluster's directory, which Down removes, not in the host's /run.
func TestUpstreamProxyLockInClusterDir(t *testing.T) {
	l := testLayout(t)
	l.Proxy = ProxyUpstream
	m, err := l.proxyManifests(t.Context(), "", "img")
	if err != nil {
		t.Fatal(err)
	}
	if want := "path: " + filepath.Join(l.Dir, "xtables.lock"); !strings.Contains(m, want) {
		t.Errorf("manifests lack %q", want)
	}
}

// TestPrivilegedPatch applies deploy/privileged/patch.yaml to
// deploy/base/daemonset.yaml with kubectl's own strategic merge (kubectl patch
// --local, no server), as the README tells a user to: the container must
// come out privileged, without the fields the API server refuses beside it
// (allowPrivilegeEscalation: false) and with the rest kept.
func TestPrivilegedPatch(t *testing.T) {
	kubectl := needKubectl(t)
	deploy := filepath.Join("..", "..", "deploy")
	out, err := exec.Command(kubectl, "patch", "--local", "--kubeconfig=/dev/null", "-o", "yaml",
		"-f", filepath.Join(deploy, "base", "daemonset.yaml"), "--patch-file", privilegedPatch(deploy)).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl patch --local: %v\n%s", err, out)
	}
	y := string(out)
	for _, want := range []string{"privileged: true", "readOnlyRootFilesystem: true", "name: kube-nftproxy"} {
		if !strings.Contains(y, want) {
			t.Errorf("patched DaemonSet lacks %q:\n%s", want, y)
		}
	}
	for _, gone := range []string{"allowPrivilegeEscalation", "capabilities", "NET_ADMIN"} {
		if strings.Contains(y, gone) {
			t.Errorf("patched DaemonSet still has %q:\n%s", gone, y)
		}
	}
}
