package migrate

import (
	"net/netip"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/iptsave"
	"github.com/kube-nftproxy/kube-nftproxy/nft"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
	"github.com/kube-nftproxy/kube-nftproxy/source/filesource"
)

// The dumps in testdata/upstream-localhost are real: upstream kube-proxy
// v1.37.1 in iptables mode with --iptables-localhost-nodeports at its
// default (true), beside ours in --proxy-mode=iptables, in e2e/upstream's
// TestUpstreamIPTablesDiff (KNP_SAVE_DUMPS). Ours rendered in iptables mode
// is equal to it; taking the localhost rules out of the dump, or ours out
// of iptables mode, is a node-wide difference naming them.
func TestCompareUpstreamLocalhost(t *testing.T) {
	dir := filepath.Join("testdata", "upstream-localhost")
	v4 := readDump(t, filepath.Join(dir, "iptables-legacy-save.txt"))
	v6 := readDump(t, filepath.Join(dir, "ip6tables-legacy-save.txt"))
	line := func(re string) *regexp.Regexp { return regexp.MustCompile(`(?m)^` + re + `.*\n`) }
	noGuard := func(s string) string {
		return line(`-A KUBE-FIREWALL .*block incoming localnet connections`).ReplaceAllString(s, "")
	}
	notLoopback := func(s string) string {
		s = strings.Replace(s, `-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports;`, `-A KUBE-SERVICES ! -d 127.0.0.0/8 -m comment --comment "kubernetes service nodeports;`, 1)
		return line(`-A KUBE-NODEPORTS -d 127.0.0.0/8 `).ReplaceAllString(s, "")
	}
	for _, tc := range []struct {
		name      string
		edit      func(string) string
		localhost bool   // ours in iptables mode, localhost NodePorts on
		want      string // the one node-wide difference; "" for none
		// ports: what each NodePort's line says of its localhost entry
		// when one side serves NodePorts on loopback and the other not.
		ports string
	}{
		{name: "as upstream wrote it", edit: func(s string) string { return s }, localhost: true},
		{name: "ours in nftables mode", edit: func(s string) string { return s },
			want: "IPv4: NodePorts on localhost (KUBE-SERVICES -> KUBE-NODEPORTS for a loopback destination): iptables served, ours not served", ports: "iptables has"},
		{name: "no KUBE-FIREWALL guard", edit: noGuard, localhost: true,
			want: "IPv4: localhost NodePorts served; iptables lacks, ours has KUBE-FIREWALL's drop"},
		{name: "guard not jumped to", edit: func(s string) string { return line(`-A INPUT -j KUBE-FIREWALL`).ReplaceAllString(s, "") }, localhost: true,
			want: "iptables lacks, ours has KUBE-FIREWALL's drop"},
		{name: "guard lets DNATed through no more", edit: func(s string) string { return strings.Replace(s, "RELATED,ESTABLISHED,DNAT", "RELATED,ESTABLISHED", 1) },
			localhost: true, want: "iptables lacks, ours has"},
		{name: "NodePorts off loopback", edit: notLoopback, localhost: true,
			want: "iptables not served, ours served", ports: "ours has"},
		{name: "all localhost rules deleted", edit: func(s string) string { return notLoopback(noGuard(s)) }, localhost: true,
			want: "iptables not served, ours served", ports: "ours has"},
		// kube-proxy with --iptables-localhost-nodeports=false, kubelet's
		// copy of the guard left: equal to ours in nftables mode.
		{name: "localhost off, kubelet's guard", edit: notLoopback},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var dumps []*iptsave.Dump
			for _, text := range []string{tc.edit(v4), v6} {
				d, err := iptsave.Parse(strings.NewReader(text))
				if err != nil {
					t.Fatal(err)
				}
				dumps = append(dumps, d)
			}
			rep, err := Compare(dumps, oursLocalhost(t, filepath.Join(dir, "objects.json"), tc.localhost))
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case tc.want == "" && len(rep.Node) > 0:
				t.Errorf("node differences %q, want none", rep.Node)
			case tc.want != "" && (len(rep.Node) != 1 || !strings.Contains(rep.Node[0], tc.want) || rep.Equal()):
				t.Errorf("node differences %q, want one saying %q", rep.Node, tc.want)
			}
			rep.Node = nil
			var ports map[string]string
			if tc.ports != "" {
				ports = map[string]string{}
				for _, s := range []string{"etp-local-none:http", "etp-local:http", "lb:https", "np:http", "sticky:http"} {
					ports["default/"+s+" tcp"] = "destinations: " + tc.ports + " nodeport on 127.0.0.0/8 "
				}
			}
			checkReport(t, rep, ports, 18)
		})
	}
}

// oursLocalhost renders the state as `diff --state` does, in iptables mode
// (localhost NodePorts on) or nftables mode.
func oursLocalhost(t *testing.T, dir string, localhost bool) *nftlib.Ruleset {
	t.Helper()
	st, problems := filesource.LoadState(dir, "node-1")
	if st == nil || len(problems) > 0 {
		t.Fatalf("loading %s: %v", dir, problems)
	}
	cfg := nft.DefaultConfig()
	cfg.LocalhostNodePorts = localhost
	for _, c := range []string{"10.244.0.0/16", "fd00:10:244::/48"} {
		cfg.ClusterCIDRs = append(cfg.ClusterCIDRs, netip.MustParsePrefix(c))
	}
	return nft.Build(st, cfg)
}
