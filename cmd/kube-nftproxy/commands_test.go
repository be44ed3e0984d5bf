package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	logsapi "k8s.io/component-base/logs/api/v1"
	proxyconfig "k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/yaml"
)

// run runs the command with args in this process, logging to its
// output as well (logging is reset before and after: it is process-wide).
func run(args ...string) (string, error) {
	_ = logsapi.ResetForTest(nil)
	defer func() { _ = logsapi.ResetForTest(nil) }()
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
		{[]string{"--bogus"}, "unknown flag: --bogus (see kube-nftproxy --help)"},
		{[]string{"--nodeport-addresess", "10.0.0.0/8"}, "unknown flag: --nodeport-addresess; did you mean --nodeport-addresses?"},
		{[]string{"render", "--hostname-overide", "n"}, "unknown flag: --hostname-overide; did you mean --hostname-override?"},
		{[]string{"render", "--state", "../../examples/demo", "--cluster-cidr", "10.0.0/8"},
			`--cluster-cidr "10.0.0/8": not a CIDR (such as 10.244.0.0/16; one per IP family, comma-separated)`},
		{[]string{"--proxy-mode", "ipvs", "--ipvs-scheduler", "fo", "--write-config-to", "/dev/null"}, `--ipvs-scheduler "fo": want one of rr, wrr`},
		{[]string{"--show-hidden-metrics-for-version=1.30", "--write-config-to", "/dev/null"},
			`--show-hidden-metrics-for-version "1.30": must be omitted or have the value '1.36'; only the previous minor version is allowed`},
		{[]string{"--show-hidden-metrics-for-version=1.37", "--write-config-to", "/dev/null"}, "must be omitted or have the value '1.36'"},
		{[]string{"--oom-score-adj=-1001", "--write-config-to", "/dev/null"}, "--oom-score-adj -1001: must be within the range [-1000, 1000]"},
		{[]string{"--conntrack-min=-1", "--write-config-to", "/dev/null"}, "--conntrack-min -1"},
		{[]string{"--conntrack-udp-timeout=500ms", "--write-config-to", "/dev/null"}, "--conntrack-udp-timeout 500ms"},
		{[]string{"--conntrack-max-per-core=lots"}, "--conntrack-max-per-core"},
		{[]string{"--logging-format=yaml", "--write-config-to", "/dev/null"}, `logging.format: Invalid value: "yaml": Unsupported log format`},
		{[]string{"render"}, "render needs --state"},
		{[]string{"render", "--state", "../../examples/demo", "--cluster-cidr", "10.0.0.0/33"}, "--cluster-cidr"},
		{[]string{"render", "--state", "../../examples/demo", "--cluster-cidr", "10.0.0.0/8,10.1.0.0/16"}, "one CIDR per IP family"},
		{[]string{"render", "--state", "../../examples/demo", "--iptables-masquerade-bit", "32"}, "within 0-31"},
		{[]string{"render", "--state", "/nonexistent"}, "/nonexistent"},
		{[]string{"--state", "/nonexistent"}, "--state: reading manifests: stat /nonexistent: no such file or directory"},
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
		{"apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: kernelspace\n", "not supported"},
		{"apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nclusterCIDRs: x\n", "unknown field"},
		{"apiVersion: v1\nkind: ConfigMap\n", "want apiVersion"},
	}
	for i, b := range bad {
		p := write(fmt.Sprintf("bad%d.yaml", i), b.body)
		if _, err := run("--config", p, "--write-config-to", out); err == nil || !strings.Contains(err.Error(), b.want) {
			t.Errorf("config %q: err %v, want it to mention %q", b.body, err, b.want)
		}
	}
	if _, err := run("--proxy-mode", "userspace", "--write-config-to", out); err == nil || !strings.Contains(err.Error(), "not supported") {
		t.Errorf("--proxy-mode userspace: %v", err)
	}
	if _, err := run("--feature-gates", "Foo", "--write-config-to", out); err == nil {
		t.Errorf("--feature-gates Foo accepted")
	}
}

// TestConntrackTuningConfig: kube-proxy's --conntrack-* flags, their types
// and defaults, and the conntrack section of a KubeProxyConfiguration
// (nil means the default; a flag given wins), as --write-config-to writes
// them. Nothing here reaches the kernel.
func TestConntrackTuningConfig(t *testing.T) {
	fs := newRootCommand().Flags()
	for _, f := range []struct{ name, typ, def string }{
		{"conntrack-max-per-core", "int32", "32768"},
		{"conntrack-min", "int32", "131072"},
		{"conntrack-tcp-timeout-established", "duration", "24h0m0s"},
		{"conntrack-tcp-timeout-close-wait", "duration", "1h0m0s"},
		{"conntrack-tcp-be-liberal", "bool", "false"},
		{"conntrack-udp-timeout", "duration", "0s"},
		{"conntrack-udp-timeout-stream", "duration", "0s"},
	} {
		fl := fs.Lookup(f.name)
		if fl == nil || fl.Hidden || fl.Value.Type() != f.typ || fl.DefValue != f.def {
			t.Errorf("--%s: %+v; want a visible %s flag defaulting to %s", f.name, fl, f.typ, f.def)
		}
	}

	dir := t.TempDir()
	effective := func(args ...string) proxyconfig.KubeProxyConntrackConfiguration {
		t.Helper()
		out := filepath.Join(dir, "effective.yaml")
		if _, err := run(append(args, "--write-config-to", out)...); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		var c proxyconfig.KubeProxyConfiguration
		if err := yaml.UnmarshalStrict(data, &c); err != nil {
			t.Fatalf("%v:\n%s", err, data)
		}
		return c.Conntrack
	}
	show := func(c proxyconfig.KubeProxyConntrackConfiguration) string {
		d := func(p *metav1.Duration) string {
			if p == nil {
				return "nil"
			}
			return p.Duration.String()
		}
		i := func(p *int32) string {
			if p == nil {
				return "nil"
			}
			return fmt.Sprint(*p)
		}
		return fmt.Sprintf("maxPerCore=%s min=%s established=%s closeWait=%s beLiberal=%v udp=%s udpStream=%s",
			i(c.MaxPerCore), i(c.Min), d(c.TCPEstablishedTimeout), d(c.TCPCloseWaitTimeout), c.TCPBeLiberal, c.UDPTimeout.Duration, c.UDPStreamTimeout.Duration)
	}
	if got, want := show(effective()), "maxPerCore=32768 min=131072 established=24h0m0s closeWait=1h0m0s beLiberal=false udp=0s udpStream=0s"; got != want {
		t.Errorf("defaults:\n got %s\nwant %s", got, want)
	}
	if got, want := show(effective("--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0", "--conntrack-udp-timeout=30s", "--conntrack-tcp-be-liberal")),
		"maxPerCore=0 min=131072 established=0s closeWait=1h0m0s beLiberal=true udp=30s udpStream=0s"; got != want {
		t.Errorf("flags:\n got %s\nwant %s", got, want)
	}
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
conntrack:
  maxPerCore: 0
  min: null
  tcpEstablishedTimeout: 2h
  tcpBeLiberal: true
  udpTimeout: 45s
  udpStreamTimeout: 5m
`), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, want := show(effective("--config", cfg, "--conntrack-udp-timeout-stream=3m")),
		"maxPerCore=0 min=131072 established=2h0m0s closeWait=1h0m0s beLiberal=true udp=45s udpStream=5m0s"; got != want {
		t.Errorf("config file (the flag given is ignored, as kube-proxy):\n got %s\nwant %s", got, want)
	}
}
