package main

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/apiserver"
)

// upstreamKubeProxy is kube-proxy v1.37.1 (apiserver.KubeProxyPath), or the
// test skips. CI (KNP_REQUIRE_APISERVER=1) builds it, so there a missing one
// fails.
func upstreamKubeProxy(t *testing.T) string {
	t.Helper()
	p := apiserver.KubeProxyPath()
	if _, err := os.Stat(p); err != nil {
		if os.Getenv("KNP_REQUIRE_APISERVER") == "1" {
			t.Fatalf("KNP_REQUIRE_APISERVER=1 but no upstream kube-proxy: %v", err)
		}
		t.Skipf("no upstream kube-proxy (hack/kube-proxy/build.sh builds it): %v", err)
	}
	return p
}

// kubeadmConfig is the config.conf kubeadm 1.37 writes in the kube-proxy
// ConfigMap (deploy/kubeadm/config.conf).
func kubeadmConfig(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("../../deploy/kubeadm/config.conf")
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

const configHead = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"

// undefaultedKubeadmConfig is config.conf as kubeadm 1.37 writes it: zero
// values and nulls where kube-proxy's defaulting has not run.
func undefaultedKubeadmConfig(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("testdata/kubeadm-config.conf")
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// The same config file (and flags) give the same --write-config-to from
// kube-proxy and from us, field by field.
func TestWriteConfigAsUpstream(t *testing.T) {
	kubeProxy := upstreamKubeProxy(t)
	const nftablesConfig = configHead + "mode: nftables\nnftables: {masqueradeAll: true, syncPeriod: 40s}\nclusterCIDR: 10.244.0.0/16\n"
	for _, tc := range []struct {
		name, config string
		args         []string
	}{
		{name: "no config"},
		{name: "kubeadm iptables", config: "kubeadm"},
		{name: "kubeadm undefaulted", config: "kubeadm-undefaulted"},
		{name: "empty mode with iptables block", config: configHead + "mode: \"\"\niptables: {masqueradeAll: true, masqueradeBit: 15, syncPeriod: 20s, minSyncPeriod: 2s}\nconfigSyncPeriod: 5m\n"},
		{name: "nftables", config: nftablesConfig},
		{name: "nftables flag", args: []string{"--proxy-mode=nftables"}},
		{name: "nftables with addresses", config: configHead + "mode: nftables\nnodePortAddresses: [primary, localhost, 10.0.0.0/8]\n"},
		{name: "ipvs", config: configHead + "mode: ipvs\nipvs: {scheduler: wrr, syncPeriod: 1m, excludeCIDRs: [10.9.0.0/16]}\n"},
		{name: "feature gates", config: configHead + "featureGates: {KubeProxyNFTablesLocalhostNodePorts: true, LoggingBetaOptions: false, NFTablesProxyMode: true}\n"},
		{name: "flags", args: []string{"--proxy-mode=ipvs", "--ipvs-scheduler=lc", "--nodeport-addresses=all", "--config-sync-period=3m",
			"--masquerade-all", "--feature-gates=LoggingAlphaOptions=true", "--hostname-override=Node-A"}},
		{name: "hostname flag over config", config: configHead + "hostnameOverride: file-node\n", args: []string{"--hostname-override=flag-node"}},
		// With --config every other flag is ignored, but the logging ones.
		{name: "flags ignored with config", config: nftablesConfig, args: []string{"--proxy-mode=ipvs", "--ipvs-scheduler=lc",
			"--nodeport-addresses=all", "--config-sync-period=3m", "--masquerade-all=false", "--iptables-sync-period=10s",
			"--cluster-cidr=10.9.0.0/16", "--feature-gates=LoggingAlphaOptions=true", "--oom-score-adj=5", "--kube-api-burst=99",
			"--bind-address=10.1.2.3", "--healthz-bind-address=127.0.0.1:1", "--conntrack-max-per-core=7", "--iptables-localhost-nodeports=false",
			"--hostname-override=Flag-Node", "--v=4", "--logging-format=json"}},
		{name: "flags ignored with undefaulted kubeadm config", config: "kubeadm-undefaulted", args: []string{"--proxy-mode=nftables",
			"--kube-api-qps=50", "--metrics-bind-address=0.0.0.0:10249", "--conntrack-tcp-timeout-established=1h", "--config-sync-period=1m",
			"--hostname-override=node-1", "--v=2"}},
		{name: "empty hostname flag keeps config's", config: configHead + "hostnameOverride: file-node\n", args: []string{"--hostname-override="}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.args
			switch tc.config {
			case "kubeadm":
				tc.config = kubeadmConfig(t)
			case "kubeadm-undefaulted":
				tc.config = undefaultedKubeadmConfig(t)
			}
			if tc.config != "" {
				args = append([]string{"--config", writeFile(t, []byte(tc.config))}, args...)
			}
			theirs := upstreamWriteConfig(t, kubeProxy, args...)
			ours := decodeYAMLMap(t, writeEffective(t, args...))
			compareMaps(t, "", theirs, ours)
		})
	}
}

func upstreamWriteConfig(t *testing.T, kubeProxy string, args ...string) map[string]any {
	t.Helper()
	out := filepath.Join(t.TempDir(), "upstream.yaml")
	cmd := exec.Command(kubeProxy, append(args, "--write-config-to", out)...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("kube-proxy %v: %v\n%s", args, err, b)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return decodeYAMLMap(t, data)
}

func decodeYAMLMap(t *testing.T, data []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := yaml.Unmarshal(data, &m); err != nil {
		t.Fatalf("%v:\n%s", err, data)
	}
	return m
}

// compareMaps reports every field that differs, by its path.
func compareMaps(t *testing.T, path string, want, got map[string]any) {
	t.Helper()
	for k, w := range want {
		g, ok := got[k]
		p := strings.TrimPrefix(path+"."+k, ".")
		wm, wIsMap := w.(map[string]any)
		gm, gIsMap := g.(map[string]any)
		switch {
		case !ok:
			t.Errorf("%s: kube-proxy writes %v, we write nothing", p, w)
		case wIsMap && gIsMap:
			compareMaps(t, p, wm, gm)
		case !reflect.DeepEqual(w, g):
			t.Errorf("%s: kube-proxy writes %v, we write %v", p, w, g)
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%s: we write %v, kube-proxy nothing", strings.TrimPrefix(path+"."+k, "."), g)
		}
	}
}

// What kube-proxy refuses, we refuse: both exit non-zero and write nothing.
func TestValidationAsUpstream(t *testing.T) {
	kubeProxy := upstreamKubeProxy(t)
	for _, tc := range []struct {
		name, config string
		args         []string
	}{
		{name: "negative sync period", args: []string{"--iptables-sync-period=-1s"}},
		{name: "negative sync period in config", config: configHead + "mode: iptables\niptables: {syncPeriod: -5s}\n"},
		{name: "min sync above sync", args: []string{"--iptables-sync-period=1s", "--iptables-min-sync-period=2s"}},
		{name: "zero config sync period", args: []string{"--config-sync-period=0"}},
		{name: "negative config sync period in config", config: configHead + "configSyncPeriod: -1m\n"},
		{name: "bad cluster CIDR", args: []string{"--cluster-cidr=10.0.0.0/33"}},
		{name: "bad cluster CIDR in config", config: configHead + "clusterCIDR: not-a-cidr\n"},
		{name: "bad nodeport address", config: configHead + "nodePortAddresses: [nowhere]\n"},
		{name: "bad bind address", args: []string{"--healthz-bind-address=300.0.0.1:10256"}},
		{name: "bad metrics address in config", config: configHead + "metricsBindAddress: 1.2.3.4.5:10249\n"},
		{name: "unknown gate", args: []string{"--feature-gates=NoSuchGate=true"}},
		{name: "unknown gate in config", config: configHead + "featureGates: {NoSuchGate: true}\n"},
		{name: "locked gate", args: []string{"--feature-gates=PreferSameTrafficDistribution=false"}},
		{name: "bad mode", config: configHead + "mode: userspace\n"},
		{name: "masquerade bit", args: []string{"--iptables-masquerade-bit=32"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.args
			if tc.config != "" {
				args = append([]string{"--config", writeFile(t, []byte(tc.config))}, args...)
			}
			dir := t.TempDir()
			theirs, ours := filepath.Join(dir, "theirs.yaml"), filepath.Join(dir, "ours.yaml")
			b, err := exec.Command(kubeProxy, append(args, "--write-config-to", theirs)...).CombinedOutput()
			if err == nil {
				t.Fatalf("kube-proxy accepts %v (the case is wrong):\n%s", args, b)
			}
			if _, err := run(append(args, "--write-config-to", ours)...); err == nil {
				t.Errorf("we accept %v; kube-proxy refuses it: %s", args, lastLine(b))
			}
			if _, err := os.Stat(ours); err == nil {
				t.Errorf("we wrote a configuration kube-proxy refuses")
			}
		})
	}
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}

// Every flag of kube-proxy's --help is one of ours.
func TestEveryUpstreamFlag(t *testing.T) {
	kubeProxy := upstreamKubeProxy(t)
	help, _ := exec.Command(kubeProxy, "--help").CombinedOutput()
	re := regexp.MustCompile(`^\s+(?:-\w, )?--([a-z0-9-]+)`)
	root := newRootCommand()
	n := 0
	sc := bufio.NewScanner(bytes.NewReader(help))
	for sc.Scan() {
		m := re.FindStringSubmatch(sc.Text())
		if m == nil || m[1] == "help" {
			continue
		}
		n++
		name := m[1]
		f := root.Flags().Lookup(name)
		if f == nil {
			f = root.PersistentFlags().Lookup(name)
		}
		if f == nil {
			t.Errorf("--%s: kube-proxy has it, we do not", name)
		}
	}
	if n < 50 {
		t.Fatalf("read only %d flags from kube-proxy --help:\n%s", n, help)
	}
}
