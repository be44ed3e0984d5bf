package main

import (
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/kube-nftproxy/kube-nftproxy/nft"
	"github.com/kube-nftproxy/kube-nftproxy/sysctl"
)

// iptables mode, given or by default (an empty mode, as kube-proxy on
// Linux), with its defaults (localhost NodePorts on) and its config
// section; nftables mode keeps its own and ignores
// --iptables-localhost-nodeports.
func TestIPTablesMode(t *testing.T) {
	const head = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
	blocks := "iptables: {localhostNodePorts: false, masqueradeAll: true, masqueradeBit: 9, syncPeriod: 40s, minSyncPeriod: 2s}\n" +
		"nftables: {masqueradeAll: false, masqueradeBit: 12, syncPeriod: 50s, minSyncPeriod: 3s}\n"
	dir := t.TempDir()
	file := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(head+body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name      string
		args      []string
		localhost bool
		masqAll   bool
		bit       int
		sync      time.Duration
		log       string // a line the run logs
	}{
		{name: "default mode is iptables", args: nil, localhost: true, bit: 14, sync: 30 * time.Second,
			log: "kube-proxy's default on Linux"},
		{name: "empty mode in config is iptables", args: []string{"--config", file("empty.yaml", "mode: \"\"\n"+blocks)},
			masqAll: true, bit: 9, sync: 40 * time.Second, log: "kube-proxy's default on Linux"},
		{name: "nftables", args: []string{"--proxy-mode=nftables"}, bit: 14, sync: 30 * time.Second},
		{name: "nftables ignores the flag", args: []string{"--proxy-mode=nftables", "--iptables-localhost-nodeports"}, bit: 14, sync: 30 * time.Second,
			log: "applies in iptables mode only; ignored"},
		{name: "iptables defaults", args: []string{"--proxy-mode=iptables"}, localhost: true, bit: 14, sync: 30 * time.Second,
			log: "proxy mode iptables: kube-proxy's iptables mode behaviour"},
		{name: "iptables without localhost", args: []string{"--proxy-mode=iptables", "--iptables-localhost-nodeports=false"}, bit: 14, sync: 30 * time.Second},
		{name: "config iptables block", args: []string{"--config", file("ipt.yaml", "mode: iptables\n"+blocks)},
			masqAll: true, bit: 9, sync: 40 * time.Second},
		{name: "config nftables block", args: []string{"--config", file("nft.yaml", "mode: nftables\n"+blocks)}, bit: 12, sync: 50 * time.Second},
		{name: "config nftables with localhost", args: []string{"--config", file("nftlh.yaml", "mode: nftables\niptables: {localhostNodePorts: true}\n")},
			bit: 14, sync: 30 * time.Second, log: "applies in iptables mode only; ignored"},
		{name: "flags ignored with config", args: []string{"--config", file("ipt2.yaml", "mode: iptables\n"+blocks), "--iptables-localhost-nodeports=true",
			"--iptables-masquerade-bit=3", "--proxy-mode=nftables"},
			masqAll: true, bit: 9, sync: 40 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, logs := parseOptions(t, tc.args...)
			cfg, err := o.nftConfig()
			if err != nil {
				t.Fatal(err)
			}
			if cfg.LocalhostNodePorts != tc.localhost || o.masqueradeAll != tc.masqAll || o.masqueradeBit != tc.bit || o.syncPeriod != tc.sync {
				t.Errorf("localhost %v masqueradeAll %v bit %d sync %v; want %v %v %d %v",
					cfg.LocalhostNodePorts, o.masqueradeAll, o.masqueradeBit, o.syncPeriod, tc.localhost, tc.masqAll, tc.bit, tc.sync)
			}
			if tc.log != "" && strings.Count(logs, tc.log) != 1 {
				t.Errorf("want one line saying %q; logged:\n%s", tc.log, logs)
			}
			if tc.log == "" && strings.Contains(logs, "ignored") {
				t.Errorf("unexpected warning:\n%s", logs)
			}
		})
	}
}

// parseOptions parses args as the root command does and validates them,
// then logs what the mode means (noteMode), returning the options and logs.
func parseOptions(t *testing.T, args ...string) (*options, string) {
	t.Helper()
	o := &options{}
	fs := pflag.NewFlagSet("kube-nftproxy", pflag.ContinueOnError)
	o.addRuleFlags(fs)
	o.addProxyFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	if o.configFile != "" {
		if err := o.loadConfig(o.configFile, fs); err != nil {
			t.Fatal(err)
		}
	}
	if err := o.complete(); err != nil {
		t.Fatal(err)
	}
	if err := o.validate(); err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	o.noteMode(fs, slog.New(slog.NewTextHandler(&logs, nil)))
	return o, logs.String()
}

// The effective configuration of iptables mode is written in its section,
// localhostNodePorts included, and read back the same.
func TestIPTablesModeWriteConfig(t *testing.T) {
	c := effectiveConfig(t, "--proxy-mode=iptables", "--iptables-localhost-nodeports=false", "--masquerade-all", "--iptables-sync-period=45s")
	if c.Mode != "iptables" || c.IPTables.LocalhostNodePorts == nil || *c.IPTables.LocalhostNodePorts || !c.IPTables.MasqueradeAll ||
		c.IPTables.SyncPeriod.Duration != 45*time.Second || c.NFTables.MasqueradeAll {
		t.Errorf("written: mode %q iptables %+v nftables %+v", c.Mode, c.IPTables, c.NFTables)
	}
	// As kube-proxy, every mode writes localhostNodePorts.
	if c := effectiveConfig(t, "--proxy-mode=nftables"); c.IPTables.LocalhostNodePorts == nil || !*c.IPTables.LocalhostNodePorts {
		t.Errorf("nftables mode did not write iptables.localhostNodePorts: true")
	}
}

// `render` in iptables mode (no mode, as the proxy's default, or
// --proxy-mode iptables) serves NodePorts on localhost, guarded by
// KUBE-FIREWALL; in nftables mode (or with the flag off) they stay off
// loopback.
func TestRenderIPTablesMode(t *testing.T) {
	base := []string{"render", "--state", "../../examples/demo", "--hostname-override", "node-1", "--cluster-cidr", "10.244.0.0/16"}
	for _, tc := range []struct {
		args      []string
		localhost bool
	}{
		{nil, true}, // no mode: iptables, as the proxy's default
		{[]string{"--proxy-mode", "nftables"}, false},
		{[]string{"--proxy-mode", "iptables"}, true},
		{[]string{"--proxy-mode", "iptables", "--iptables-localhost-nodeports=false"}, false},
		{[]string{"--proxy-mode", "iptables", "--nodeport-addresses", "10.0.0.0/8"}, false},
		{[]string{"--proxy-mode", "iptables", "--nodeport-addresses", "127.0.0.0/8"}, true},
		{[]string{"--proxy-mode", "nftables", "--iptables-localhost-nodeports"}, false},
	} {
		out, err := run(append(base, tc.args...)...)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		guard := strings.Contains(out, `ct state ! established,related ct status ! dnat drop comment "block incoming localnet connections"`)
		excluded := strings.Contains(out, "ip daddr != 127.0.0.0/8 jump KUBE-NODEPORTS")
		if guard != tc.localhost || excluded == tc.localhost {
			t.Errorf("%v: KUBE-FIREWALL guard %v, loopback excluded %v; want localhost NodePorts %v", tc.args, guard, excluded, tc.localhost)
		}
	}
}

// route_localnet is set only when localhost NodePorts are served; a
// read-only /proc/sys turns them off with a warning.
func TestEnsureRouteLocalnet(t *testing.T) {
	on := nft.DefaultConfig()
	on.LocalhostNodePorts = true
	for _, tc := range []struct {
		name  string
		cfg   nft.Config
		was   string
		want  string // the key afterwards
		serve bool
	}{
		{name: "off", cfg: nft.DefaultConfig(), was: "0", want: "0"},
		{name: "on", cfg: on, was: "0", want: "1", serve: true},
		{name: "already set", cfg: on, was: "1", want: "1", serve: true},
		{name: "no loopback address", cfg: withNodePorts(on, "10.0.0.0/8"), was: "0", want: "0"},
		{name: "loopback CIDR", cfg: withNodePorts(on, "127.0.0.0/8"), was: "0", want: "1", serve: true},
		{name: "catch-all CIDR", cfg: withNodePorts(on, "0.0.0.0/0"), was: "0", want: "1", serve: true},
		{name: "IPv6 CIDR only", cfg: withNodePorts(on, "fd00::/8"), was: "0", want: "1", serve: true},
		{name: "primary", cfg: withPrimary(on), was: "0", want: "0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			key := filepath.Join(root, routeLocalnet)
			if err := os.MkdirAll(filepath.Dir(key), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(key, []byte(tc.was+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := ensureRouteLocalnet(sysctl.New(root), tc.cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := os.ReadFile(key)
			if strings.TrimSpace(string(b)) != tc.want || nft.LocalhostNodePorts(got) != tc.serve {
				t.Errorf("route_localnet %q, serving %v; want %q, %v", b, nft.LocalhostNodePorts(got), tc.want, tc.serve)
			}
		})
	}
}

func withNodePorts(cfg nft.Config, cidrs ...string) nft.Config {
	cfg.NodePortAddresses = nil
	for _, c := range cidrs {
		cfg.NodePortAddresses = append(cfg.NodePortAddresses, netip.MustParsePrefix(c))
	}
	return cfg
}

func withPrimary(cfg nft.Config) nft.Config {
	cfg.NodePortPrimary = true
	return cfg
}
