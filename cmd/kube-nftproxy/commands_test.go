package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func run(args ...string) (string, error) {
	cmd := newRootCommand()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String() + errOut.String(), err
}

func TestFlagErrors(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--bogus"}, "unknown flag: --bogus"},
		{[]string{"--ipvs-scheduler", "rr"}, "--ipvs-scheduler is a kube-proxy flag that kube-nftproxy does not support"},
		{[]string{"--profiling"}, "--profiling is a kube-proxy flag"},
		{[]string{"--conntrack-min=131072"}, "--conntrack-min is a kube-proxy flag"},
		{[]string{"render"}, "render needs --state"},
		{[]string{"render", "--state", "../../examples/demo", "--cluster-cidr", "10.0.0.0/33"}, "--cluster-cidr"},
		{[]string{"render", "--state", "../../examples/demo", "--cluster-cidr", "10.0.0.0/8,10.1.0.0/16"}, "one CIDR per IP family"},
		{[]string{"render", "--state", "../../examples/demo", "--iptables-masquerade-bit", "32"}, "within 0-31"},
		{[]string{"render", "--state", "/nonexistent"}, "/nonexistent"},
		{[]string{}, "no --state, --kubeconfig or --master"},
		{[]string{"--kubeconfig", "/nonexistent/kubeconfig"}, "/nonexistent/kubeconfig"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			out, err := run(tt.args...)
			if err == nil || !strings.Contains(err.Error()+out, tt.want) {
				t.Errorf("err = %v, output %q; want an error mentioning %q", err, out, tt.want)
			}
		})
	}
}

func TestRender(t *testing.T) {
	out, err := run("render", "--state", "../../examples/demo", "--hostname-override", "node-1",
		"--cluster-cidr", "10.244.0.0/16,fd00:10:244::/48")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"table ip kube-nftproxy {",
		"table ip6 kube-nftproxy {",
		"chain KUBE-SVC-CDGGSHYLG3RE2FKL {",
		`comment "default/web:http"`,
		"ip saddr != 10.244.0.0/16 jump KUBE-MARK-MASQ",
		"udp . 30053",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("render output lacks %q", want)
		}
	}
}

func TestVersion(t *testing.T) {
	out, err := run("version")
	if err != nil || !strings.HasPrefix(out, "kube-nftproxy ") {
		t.Errorf("version: %q, %v", out, err)
	}
}

func TestConfigFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good.yaml", `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clusterCIDR: 10.244.0.0/16
hostnameOverride: node-7
nftables:
  masqueradeAll: true
  masqueradeBit: 12
  minSyncPeriod: 2s
detectLocalMode: ClusterCIDR
`)
	out := filepath.Join(dir, "effective.yaml")
	if _, err := run("--config", good, "--hostname-override", "node-9", "--write-config-to", out); err != nil {
		t.Fatal(err)
	}
	eff, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"clusterCIDR: 10.244.0.0/16", "hostnameOverride: node-9", "masqueradeAll: true", "masqueradeBit: 12", "minSyncPeriod: 2s", "mode: nftables"} {
		if !strings.Contains(string(eff), want) {
			t.Errorf("effective config lacks %q (the flag wins over the file for the hostname):\n%s", want, eff)
		}
	}
	bad := []struct {
		body, want string
	}{
		{"apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: ipvs\n", "not supported"},
		{"apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nclusterCIDRs: x\n", "unknown field"},
		{"apiVersion: v1\nkind: ConfigMap\n", "want apiVersion"},
	}
	for i, b := range bad {
		p := write(fmt.Sprintf("bad%d.yaml", i), b.body)
		if _, err := run("--config", p, "--write-config-to", out); err == nil || !strings.Contains(err.Error(), b.want) {
			t.Errorf("config %q: err %v, want it to mention %q", b.body, err, b.want)
		}
	}
	if _, err := run("--proxy-mode", "iptables", "--write-config-to", out); err == nil || !strings.Contains(err.Error(), "not supported") {
		t.Errorf("--proxy-mode iptables: %v", err)
	}
	if _, err := run("--feature-gates", "Foo", "--write-config-to", out); err == nil {
		t.Errorf("--feature-gates Foo accepted")
	}
}
