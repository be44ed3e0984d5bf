package migrate

import (
	"net/netip"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/iptsave"
	"github.com/kube-nftproxy/kube-nftproxy/nft"
	"github.com/kube-nftproxy/kube-nftproxy/source/filesource"
)

// The dumps in testdata/upstream are real: upstream kube-proxy v1.37.1 in
// iptables mode (iptables-legacy) programmed objects.json in
// e2e/upstream's TestUpstreamIPTablesDiff (KNP_SAVE_DUMPS=dir refreshes
// them). Each case edits the IPv4 dump the way a kube-proxy with another
// configuration or state would have written it, and checks that diff names
// exactly the Service port that changed, and how.
func TestCompareUpstream(t *testing.T) {
	dir := filepath.Join("testdata", "upstream")
	rs := ours(t, filepath.Join(dir, "objects.json"), "node-1", "10.244.0.0/16,fd00:10:244::/48")
	v4 := readDump(t, filepath.Join(dir, "iptables-legacy-save.txt"))
	v6 := readDump(t, filepath.Join(dir, "ip6tables-legacy-save.txt"))
	line := func(re string) *regexp.Regexp { return regexp.MustCompile(`(?m)^` + re + `.*\n`) }
	for _, tc := range []struct {
		name string
		edit func(string) string
		want map[string]string
	}{
		{name: "as upstream wrote it", edit: func(s string) string { return s }},
		{name: "with counters (iptables-save -c)", edit: func(s string) string {
			return regexp.MustCompile(`(?m)^-A `).ReplaceAllString(s, "[7:420] -A ")
		}},
		{name: "affinity timeout", edit: func(s string) string { return strings.ReplaceAll(s, "--seconds 600", "--seconds 700") },
			want: map[string]string{"default/sticky:http tcp": "different: session affinity: iptables has KUBE-SVC-T2ECBIYT2WDZZK45 -> KUBE-SEP-HBFFEUML3KQEPO24 for 700s"}},
		{name: "affinity not recorded", edit: func(s string) string {
			return strings.ReplaceAll(s, "-m recent --set --name KUBE-SEP-HBFFEUML3KQEPO24 --mask 255.255.255.255 --rsource ", "")
		}, want: map[string]string{"default/sticky:http tcp": "different: session affinity: ours has KUBE-SEP-HBFFEUML3KQEPO24 records the client"}},
		{name: "source range", edit: func(s string) string { return strings.ReplaceAll(s, "-s 192.0.2.0/24", "-s 192.0.3.0/24") },
			want: map[string]string{"default/lb:https tcp": "different: source ranges: iptables has 203.0.113.10:443 from 10.99.0.0/24, 192.0.3.0/24, 203.0.113.10/32; others drop; ours has 203.0.113.10:443 from 10.99.0.0/24, 192.0.2.0/24, 203.0.113.10/32; others drop"}},
		{name: "no firewall drop", edit: func(s string) string {
			return line(`-A KUBE-PROXY-FIREWALL -d 203.0.113.10/32`).ReplaceAllString(s, "")
		},
			want: map[string]string{"default/lb:https tcp": "others go on un-DNATed"}},
		{name: "eTP Local without the pod short cut", edit: func(s string) string {
			return line(`-A KUBE-EXT-F7NDLNIQR2UPIWCN -s 10.244.0.0/16`).ReplaceAllString(s, "")
		}, want: map[string]string{"default/etp-local:http tcp": "different: external traffic: "}},
		{name: "drop instead of reject", edit: func(s string) string {
			return strings.Replace(s, `"default/empty:http has no endpoints" -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable`, `"default/empty:http has no endpoints" -m tcp --dport 80 -j DROP`, 1)
		}, want: map[string]string{"default/empty:http tcp": "different: destinations: iptables has 10.96.20.12:80 -> drop; ours has 10.96.20.12:80 -> reject"}},
		{name: "masquerade all", edit: func(s string) string {
			return strings.ReplaceAll(s, "! -s 10.244.0.0/16 -d 10.96.20.1/32", "-d 10.96.20.1/32")
		},
			want: map[string]string{"default/web:http tcp": "different: masquerade: iptables has KUBE-SVC-"}},
		{name: "another masquerade bit", edit: func(s string) string {
			return strings.ReplaceAll(s, "--set-xmark 0x4000/0x4000", "--set-xmark 0x8000/0x8000")
		},
			want: map[string]string{"node": "KUBE-MARK-MASQ sets 0x8000 in iptables, 0x4000 in ours"}},
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
			rep, err := Compare(dumps, rs)
			if err != nil {
				t.Fatal(err)
			}
			if w, ok := tc.want["node"]; ok {
				if !slices.ContainsFunc(rep.Node, func(n string) bool { return strings.Contains(n, w) }) || rep.Equal() {
					t.Errorf("node differences %q, want one saying %q", rep.Node, w)
				}
				delete(tc.want, "node")
				rep.Node = nil
			}
			checkReport(t, rep, tc.want, 18)
			known := 0
			for _, r := range rep.Results {
				if len(r.Known) > 0 {
					known++
				}
			}
			if known != 3 {
				t.Errorf("%d Service ports with known differences, want 3 (lb-empty, ext-empty, etp-local's health check)", known)
			}
		})
	}
}

// Each family's dump alone compares that family only.
func TestCompareOneFamily(t *testing.T) {
	dir := filepath.Join("testdata", "upstream")
	rs := ours(t, filepath.Join(dir, "objects.json"), "node-1", "10.244.0.0/16,fd00:10:244::/48")
	d, err := iptsave.Parse(strings.NewReader(readDump(t, filepath.Join(dir, "ip6tables-legacy-save.txt"))))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Compare([]*iptsave.Dump{d}, rs)
	if err != nil {
		t.Fatal(err)
	}
	checkReport(t, rep, nil, 1)
	if _, err := Compare([]*iptsave.Dump{d, d}, rs); err == nil {
		t.Errorf("two IPv6 dumps: no error")
	}
}

// Ours in nftables mode checks ClusterIPs (cluster-ips-check) where
// iptables mode does not: a known node-wide difference, not a difference.
func TestCompareClusterIPChecksKnown(t *testing.T) {
	dir := filepath.Join("testdata", "upstream")
	st, problems := filesource.LoadState(filepath.Join(dir, "objects.json"), "node-1")
	if st == nil || len(problems) > 0 {
		t.Fatalf("loading: %v", problems)
	}
	cfg := nft.DefaultConfig()
	cfg.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/48")}
	cfg.ClusterIPChecks = true
	var dumps []*iptsave.Dump
	for _, f := range []string{"iptables-legacy-save.txt", "ip6tables-legacy-save.txt"} {
		d, err := iptsave.Parse(strings.NewReader(readDump(t, filepath.Join(dir, f))))
		if err != nil {
			t.Fatal(err)
		}
		dumps = append(dumps, d)
	}
	rep, err := Compare(dumps, nft.Build(st, cfg))
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Equal() || !slices.ContainsFunc(rep.NodeKnown, func(k string) bool { return strings.Contains(k, KnownClusterIPChecks) }) {
		t.Errorf("equal %v, node %q, known %q; want equal with the cluster-ips-check known difference", rep.Equal(), rep.Node, rep.NodeKnown)
	}
}
