package cluster

import (
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
		{proxy: ProxyOurs, name: "kube-nftproxy", contains: []string{"k8s-app: kube-nftproxy"}},
		{proxy: ProxyUpstream, name: "kube-proxy", contains: []string{
			"k8s-app: kube-proxy", "mode: iptables", "maxPerCore: 0", "name: system:node-proxier",
			"privileged: true", "path: /lib/modules", "server: https://10.200.0.1:6443",
			"clusterCIDR: " + ClusterCIDR,
		}},
		{proxy: "ipvs", wantErr: true},
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
			m, err := l.proxyManifests(deploy, "img")
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

// TestUpstreamProxyLockInClusterDir: the xtables lock must live under the
// cluster's directory, which Down removes, not in the host's /run.
func TestUpstreamProxyLockInClusterDir(t *testing.T) {
	l := testLayout(t)
	l.Proxy = ProxyUpstream
	m, err := l.proxyManifests("", "img")
	if err != nil {
		t.Fatal(err)
	}
	if want := "path: " + filepath.Join(l.Dir, "xtables.lock"); !strings.Contains(m, want) {
		t.Errorf("manifests lack %q", want)
	}
}
