package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	proxyconfig "k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/yaml"
)

// fullConfig sets every KubeProxyConfiguration field kube-nftproxy reads in
// ipvs mode, each to a value other than its default (bindAddress and
// logging.flushFrequency, which it only accepts, at the values it writes;
// nftables.masqueradeBit, a section ipvs mode does not read, at the
// default kube-proxy writes there). In ipvs mode, as in kube-proxy, the
// masquerade settings are iptables:'s, the sync periods ipvs:'s.
const fullConfig = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
bindAddress: 0.0.0.0
hostnameOverride: node-a
clusterCIDR: 10.244.0.0/16
healthzBindAddress: 127.0.0.1:20256
metricsBindAddress: 127.0.0.1:20249
mode: ipvs
detectLocalMode: InterfaceNamePrefix
detectLocal: {bridgeInterface: br0, interfaceNamePrefix: veth}
nodePortAddresses: [10.0.0.0/8, 192.168.0.0/16]
oomScoreAdj: -500
clientConnection: {kubeconfig: /etc/kubeconfig, qps: 7.5, burst: 20, contentType: application/json}
configSyncPeriod: 20m0s
featureGates: {LoggingAlphaOptions: true}
iptables: {masqueradeAll: true, masqueradeBit: 9, localhostNodePorts: false}
nftables: {masqueradeBit: 14}
ipvs:
  scheduler: wrr
  syncPeriod: 50s
  minSyncPeriod: 3s
  excludeCIDRs: [10.1.0.0/16]
  strictARP: true
  tcpTimeout: 10m0s
  tcpFinTimeout: 1m0s
  udpTimeout: 20s
conntrack:
  maxPerCore: 65536
  min: 262144
  tcpEstablishedTimeout: 12h0m0s
  tcpCloseWaitTimeout: 30m0s
  tcpBeLiberal: true
  udpTimeout: 45s
  udpStreamTimeout: 3m0s
logging:
  format: json
  verbosity: 3
  flushFrequency: 5s
  options:
    text: {splitStream: true, infoBufferSize: 4Ki}
    json: {splitStream: true, infoBufferSize: 8Ki}
`

// fullFlags gives every flag a --config setting maps to, each with a value
// other than the default and than fullConfig's.
var fullFlags = []string{
	"--bind-address=10.9.8.7", "--hostname-override=node-b", "--cluster-cidr=10.245.0.0/16",
	"--healthz-bind-address=127.0.0.1:30256", "--metrics-bind-address=127.0.0.1:30249", "--proxy-mode=nftables",
	"--detect-local-mode=BridgeInterface", "--pod-bridge-interface=cbr0", "--pod-interface-name-prefix=cali",
	"--nodeport-addresses=172.16.0.0/12", "--oom-score-adj=-100",
	"--kubeconfig=/root/kubeconfig", "--kube-api-qps=9", "--kube-api-burst=30", "--kube-api-content-type=application/yaml",
	"--masquerade-all", "--iptables-masquerade-bit=10", "--iptables-sync-period=45s", "--iptables-min-sync-period=4s",
	"--ipvs-scheduler=lc", "--ipvs-sync-period=55s", "--ipvs-min-sync-period=5s", "--ipvs-exclude-cidrs=10.2.0.0/16",
	"--ipvs-strict-arp", "--ipvs-tcp-timeout=11m", "--ipvs-tcpfin-timeout=2m", "--ipvs-udp-timeout=25s",
	"--conntrack-max-per-core=1000", "--conntrack-min=2000", "--conntrack-tcp-timeout-established=13h",
	"--conntrack-tcp-timeout-close-wait=31m", "--conntrack-tcp-be-liberal", "--conntrack-udp-timeout=46s",
	"--conntrack-udp-timeout-stream=4m", "--logging-format=text", "--v=5",
	"--log-text-split-stream", "--log-text-info-buffer-size=1Ki", "--log-json-split-stream", "--log-json-info-buffer-size=2Ki",
	"--feature-gates=LoggingAlphaOptions=true", "--config-sync-period=25m", "--iptables-localhost-nodeports=true",
}

// writeEffective runs with args and --write-config-to and returns what it wrote.
func writeEffective(t *testing.T, args ...string) []byte {
	t.Helper()
	out := filepath.Join(t.TempDir(), "effective.yaml")
	if _, err := run(append(args, "--write-config-to", out)...); err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// Every setting the config file holds comes back from --write-config-to as
// it was: none is dropped on load or on write.
func TestConfigRoundTrip(t *testing.T) {
	in := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(in, []byte(fullConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	out := writeEffective(t, "--config", in)
	want, err := decodeConfig([]byte(fullConfig))
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeConfig(out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	mustEqualConfig(t, got, want)
	// Written again, the effective configuration is the same.
	if again := writeEffective(t, "--config", writeFile(t, out)); string(again) != string(out) {
		t.Errorf("written twice, the configuration changed:\n%s\nthen\n%s", out, again)
	}
}

// With --config, as in kube-proxy, the file replaces every setting: the
// flags given are ignored, each with a warning naming it, but for
// --hostname-override and the logging flags, which win over the file.
func TestConfigIgnoresFlags(t *testing.T) {
	in := writeFile(t, []byte(fullConfig))
	kept := []string{"--hostname-override=node-b", "--logging-format=text", "--v=5",
		"--log-text-split-stream", "--log-text-info-buffer-size=1Ki", "--log-json-split-stream", "--log-json-info-buffer-size=2Ki"}
	want := writeEffective(t, append([]string{"--config", in}, kept...)...)
	args := append([]string{"--config", in}, fullFlags...)
	out := filepath.Join(t.TempDir(), "effective.yaml")
	logs, err := run(append(args, "--write-config-to", out)...)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(out); string(got) != string(want) {
		t.Errorf("with --config, the flags given were not all ignored:\n%s\nwant\n%s", got, want)
	}
	for _, f := range fullFlags {
		name, _, _ := strings.Cut(f, "=")
		warned := strings.Contains(logs, `"flag ignored: --config is given, as in kube-proxy; set it in the config file" flag="`+name+`"`)
		if ignored := !slices.Contains(kept, f); warned != ignored {
			t.Errorf("%s (ignored: %v): warned %v", f, ignored, warned)
		}
	}
	// One example in full: the value given, and the file's in use.
	if w := `flag="--proxy-mode" value="nftables" config="ipvs"`; !strings.Contains(logs, w) {
		t.Errorf("no %s in:\n%s", w, logs)
	}
}

func writeFile(t *testing.T, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func mustEqualConfig(t *testing.T, got, want *proxyconfig.KubeProxyConfiguration) {
	t.Helper()
	g, w := writeConfigYAML(t, got), writeConfigYAML(t, want)
	if g != w {
		t.Errorf("effective configuration:\n%s\nwant\n%s", g, w)
	}
}

func writeConfigYAML(t *testing.T, c *proxyconfig.KubeProxyConfiguration) string {
	t.Helper()
	data, err := yaml.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// Every config field names a flag of the proxy command, once.
func TestConfigFieldsNameFlags(t *testing.T) {
	root := newRootCommand()
	seen := map[string]bool{}
	for _, f := range configFields() {
		if root.Flags().Lookup(f.flag) == nil && root.PersistentFlags().Lookup(f.flag) == nil {
			t.Errorf("config field of --%s: no such flag", f.flag)
		}
		if seen[f.flag] {
			t.Errorf("--%s is bound twice", f.flag)
		}
		seen[f.flag] = true
	}
}
