package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	proxyconfig "k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/yaml"

	"github.com/kube-nftproxy/kube-nftproxy/internal/golden"
	"github.com/kube-nftproxy/kube-nftproxy/internal/ipvsnl"
)

// kube-proxy's --ipvs-* flags: names, types, defaults, visible.
func TestIPVSFlags(t *testing.T) {
	root := newRootCommand()
	render, _, err := root.Find([]string{"render"})
	if err != nil {
		t.Fatal(err)
	}
	// As kube-proxy's: an empty scheduler is rr, an empty mode iptables
	// (render's default mode stays nftables).
	for _, f := range []struct{ name, typ, def string }{
		{"ipvs-scheduler", "string", ""},
		{"ipvs-sync-period", "duration", "30s"},
		{"ipvs-min-sync-period", "duration", "1s"},
		{"ipvs-exclude-cidrs", "stringSlice", "[]"},
		{"ipvs-strict-arp", "bool", "false"},
		{"ipvs-tcp-timeout", "duration", "0s"},
		{"ipvs-tcpfin-timeout", "duration", "0s"},
		{"ipvs-udp-timeout", "duration", "0s"},
		{"proxy-mode", "string", ""},
	} {
		for _, fs := range []string{"root", "render"} {
			fl, def := root.Flags().Lookup(f.name), f.def
			if fs == "render" {
				fl = render.Flags().Lookup(f.name) // the same defaults as the proxy's
			}
			if fl == nil || fl.Hidden || fl.Value.Type() != f.typ || fl.DefValue != def {
				t.Errorf("%s --%s: %+v; want a visible %s flag defaulting to %s", fs, f.name, fl, f.typ, def)
			}
		}
	}
}

func TestIPVSValidation(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--proxy-mode", "ipvs", "--ipvs-scheduler", "fo"}, `--ipvs-scheduler "fo": want one of rr, wrr, lc, wlc, lblc, lblcr, dh, sh, sed, nq, mh`},
		{[]string{"--proxy-mode", "ipvs", "--ipvs-sync-period", "0"}, "--ipvs-sync-period 0s: must be greater than 0"},
		{[]string{"--proxy-mode", "ipvs", "--ipvs-min-sync-period", "-1s"}, "--ipvs-min-sync-period -1s: must be greater than or equal to 0"},
		{[]string{"--proxy-mode", "ipvs", "--ipvs-min-sync-period", "1m"}, "--ipvs-sync-period 30s: must be greater than or equal to --ipvs-min-sync-period 1m0s"},
		{[]string{"--ipvs-tcp-timeout", "-1s"}, "--ipvs-tcp-timeout -1s: must be greater than or equal to 0"},
		{[]string{"--ipvs-tcpfin-timeout", "-1s"}, "--ipvs-tcpfin-timeout -1s"},
		{[]string{"--ipvs-udp-timeout", "-1s"}, "--ipvs-udp-timeout -1s"},
		{[]string{"--ipvs-exclude-cidrs", "10.0.0.0/8,bogus"}, `--ipvs-exclude-cidrs "bogus": must be a valid CIDR`},
		{[]string{"--proxy-mode", "userspace"}, `proxy mode "userspace" is not supported`},
	} {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			_, err := run(append(tt.args, "--write-config-to", filepath.Join(t.TempDir(), "c.yaml"))...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v; want one mentioning %q", err, tt.want)
			}
		})
	}
	// Every scheduler kube-proxy knows is accepted; in nftables mode the
	// scheduler is not looked at (as kube-proxy), nor are the IPVS periods.
	for _, s := range ipvsSchedulers {
		if _, err := run("--proxy-mode", "ipvs", "--ipvs-scheduler", s, "--write-config-to", filepath.Join(t.TempDir(), "c.yaml")); err != nil {
			t.Errorf("--ipvs-scheduler %s: %v", s, err)
		}
	}
	if _, err := run("--ipvs-scheduler", "fo", "--ipvs-sync-period", "0", "--write-config-to", filepath.Join(t.TempDir(), "c.yaml")); err != nil {
		t.Errorf("nftables mode looked at IPVS-only settings: %v", err)
	}
}

// effectiveConfig runs with args and --write-config-to and reads it back.
func effectiveConfig(t *testing.T, args ...string) proxyconfig.KubeProxyConfiguration {
	t.Helper()
	out := filepath.Join(t.TempDir(), "effective.yaml")
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
	return c
}

// The ipvs block of a KubeProxyConfiguration, mode: ipvs, and flags given
// on the command line winning over the file.
func TestIPVSConfig(t *testing.T) {
	c := effectiveConfig(t, "--proxy-mode", "ipvs")
	if c.Mode != "ipvs" || c.IPVS.Scheduler != "" || c.IPVS.SyncPeriod.Duration != 30*time.Second || c.IPVS.MinSyncPeriod.Duration != time.Second ||
		c.IPVS.StrictARP || len(c.IPVS.ExcludeCIDRs) != 0 || c.IPVS.TCPTimeout.Duration != 0 {
		t.Errorf("defaults: mode %q, %+v", c.Mode, c.IPVS)
	}

	file := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(file, []byte(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: ipvs
ipvs:
  scheduler: wlc
  syncPeriod: 1m
  minSyncPeriod: 2s
  excludeCIDRs: [192.168.0.0/16]
  strictARP: true
  tcpTimeout: 900s
  tcpFinTimeout: 120s
  udpTimeout: 300s
`), 0o644); err != nil {
		t.Fatal(err)
	}
	c = effectiveConfig(t, "--config", file)
	if c.Mode != "ipvs" || c.IPVS.Scheduler != "wlc" || c.IPVS.SyncPeriod.Duration != time.Minute || c.IPVS.MinSyncPeriod.Duration != 2*time.Second ||
		!c.IPVS.StrictARP || strings.Join(c.IPVS.ExcludeCIDRs, ",") != "192.168.0.0/16" ||
		c.IPVS.TCPTimeout.Duration != 900*time.Second || c.IPVS.TCPFinTimeout.Duration != 120*time.Second || c.IPVS.UDPTimeout.Duration != 300*time.Second {
		t.Errorf("from the file: mode %q, %+v", c.Mode, c.IPVS)
	}
	c = effectiveConfig(t, "--config", file, "--ipvs-scheduler", "mh", "--ipvs-sync-period", "45s", "--ipvs-min-sync-period", "0",
		"--ipvs-exclude-cidrs", "10.0.0.0/8", "--ipvs-udp-timeout", "10s")
	// As kube-proxy, the flags given with --config are ignored.
	if c.IPVS.Scheduler != "wlc" || c.IPVS.SyncPeriod.Duration != time.Minute || c.IPVS.MinSyncPeriod.Duration != 2*time.Second ||
		strings.Join(c.IPVS.ExcludeCIDRs, ",") != "192.168.0.0/16" || c.IPVS.UDPTimeout.Duration != 300*time.Second ||
		c.IPVS.TCPTimeout.Duration != 900*time.Second {
		t.Errorf("flags with the file: %+v", c.IPVS)
	}
	if c := effectiveConfig(t, "--config", file, "--proxy-mode", "nftables"); c.Mode != "ipvs" {
		t.Errorf("--proxy-mode with the file's mode: %q", c.Mode)
	}
	// A bad value in the file is refused like the flag.
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	_ = os.WriteFile(bad, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: ipvs\nipvs:\n  scheduler: bogus\n"), 0o644)
	if _, err := run("--config", bad, "--write-config-to", filepath.Join(t.TempDir(), "c.yaml")); err == nil || !strings.Contains(err.Error(), `--ipvs-scheduler "bogus"`) {
		t.Errorf("scheduler bogus in the file: %v", err)
	}
}

// In ipvs mode the loop runs with the --ipvs-* periods, else with the
// --iptables-* ones.
func TestIPVSPeriods(t *testing.T) {
	o := &options{proxyMode: modeIPVS, minSyncPeriod: time.Second, syncPeriod: 30 * time.Second,
		ipvs: ipvsOptions{minSyncPeriod: 0, syncPeriod: time.Minute}}
	if lo, hi := o.periods(); lo != 0 || hi != time.Minute {
		t.Errorf("ipvs mode: %v, %v", lo, hi)
	}
	o.proxyMode = modeNFTables
	if lo, hi := o.periods(); lo != time.Second || hi != 30*time.Second {
		t.Errorf("nftables mode: %v, %v", lo, hi)
	}
}

// `render --proxy-mode ipvs` prints the helper tables, the virtual servers
// and kube-ipvs0's addresses (go test ./cmd/kube-nftproxy -update).
func TestRenderIPVSGolden(t *testing.T) {
	out, err := run("render", "--proxy-mode", "ipvs", "--state", "../../examples/demo", "--hostname-override", "node-1", "--cluster-cidr", "10.244.0.0/16")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	golden.Check(t, "render-ipvs.golden", "render --proxy-mode ipvs", out)
	for _, s := range []string{"table ip kube-nftproxy-ipvs", "table ip6 kube-nftproxy-ipvs", "# virtual servers (ipvsadm -Sn)\n-A -t ", "# kube-ipvs0 addresses\n"} {
		if !strings.Contains(out, s) {
			t.Errorf("render output lacks %q", s)
		}
	}
	if _, err := run("render", "--proxy-mode", "ipvs", "--state", "../../examples/demo", "--ipvs-scheduler", "nope"); err == nil {
		t.Error("render accepted --ipvs-scheduler nope")
	}
}

// On a kernel without IPVS, --proxy-mode ipvs stops at once and says why.
func TestIPVSMissing(t *testing.T) {
	old := procIPVS
	procIPVS = filepath.Join(t.TempDir(), "ip_vs")
	defer func() { procIPVS = old }()
	_, err := run("--proxy-mode", "ipvs", "--state", "../../examples/demo", "--healthz-bind-address", "", "--metrics-bind-address", "")
	if !errors.Is(err, ipvsnl.ErrNoIPVS) || !strings.Contains(err.Error(), "ip_vs") || !strings.Contains(err.Error(), "--proxy-mode nftables") {
		t.Errorf("err = %v; want ErrNoIPVS saying what to do", err)
	}
}

// --nodeport-addresses primary works in ipvs mode: NodePort virtual
// servers only on the Node object's primary addresses (render takes the
// node's addresses from it: the demo node's only IPv4 one, none for IPv6
// where the Node has no address, so all of that family's).
func TestRenderIPVSNodePortPrimary(t *testing.T) {
	out, err := run("render", "--proxy-mode", "ipvs", "--state", "../../examples/demo", "--hostname-override", "node-1",
		"--cluster-cidr", "10.244.0.0/16", "--nodeport-addresses", "primary")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	all, err := run("render", "--proxy-mode", "ipvs", "--state", "../../examples/demo", "--hostname-override", "node-1", "--cluster-cidr", "10.244.0.0/16")
	if err != nil {
		t.Fatalf("%v\n%s", err, all)
	}
	if !strings.Contains(out, "-A -t 10.99.0.1:30080 -s rr") {
		t.Errorf("no NodePort on the primary address:\n%s", out)
	}
	if out != all {
		t.Errorf("the demo node has one address per family: primary should change nothing; got\n%s\nwant\n%s", out, all)
	}
}
