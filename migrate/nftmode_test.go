package migrate

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// The listing in testdata/upstream-nftables is real: upstream kube-proxy
// v1.37.1 in nftables mode programmed objects.json in e2e/upstream's
// TestUpstreamNFTablesDiff (KNP_SAVE_NFT_DUMP=dir refreshes it).
func upstreamNFTListing(t *testing.T) (string, *nftlib.Ruleset) {
	t.Helper()
	dir := filepath.Join("testdata", "upstream-nftables")
	rs := ours(t, filepath.Join(dir, "objects.json"), "node-1", "10.244.0.0/16,fd00:10:244::/48")
	return readDump(t, filepath.Join(dir, "nft-ruleset.txt")), rs
}

func nftReport(t *testing.T, listing string, rs *nftlib.Ruleset) (string, bool) {
	t.Helper()
	theirs, err := ParseNFTRuleset(strings.NewReader(listing))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := CompareNFT(theirs, rs)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := rep.Write(&b); err != nil {
		t.Fatal(err)
	}
	return b.String(), rep.Equal()
}

// replaceOnce replaces the one occurrence of old.
func replaceOnce(old, new string) func(string) (string, bool) {
	return func(s string) (string, bool) {
		if strings.Count(s, old) != 1 {
			return s, false
		}
		return strings.Replace(s, old, new, 1), true
	}
}

// TestDiffNFTMutations: each change to the real listing of upstream's
// nftables mode, of each kind of fact diff compares, makes diff exit 1
// naming the Service port and what changed; the listing as written is
// equal for all 18 Service ports.
func TestDiffNFTMutations(t *testing.T) {
	listing, rs := upstreamNFTListing(t)
	if out, equal := nftReport(t, listing, rs); !equal || !strings.Contains(out, "18 service ports: 18 equal") {
		t.Fatalf("the listing as upstream wrote it is not equal:\n%s", out)
	}
	const webDNAT = "service-SUSTUHLJ-default/web/tcp/http {\n\t\tmeta l4proto tcp dnat ip to numgen random mod 2 map { 0 : 10.244.0.10 . 8080, 1 : 10.244.0.11 . 8080 }"
	for _, m := range []struct {
		name string
		edit func(string) (string, bool)
		want string
	}{
		{"cluster IP element gone", replaceOnce("10.96.20.1 . tcp . 80 : goto service-SUSTUHLJ-default/web/tcp/http,\n", ""),
			"default/web:http tcp: different: destinations: ours has 10.96.20.1:80 -> cluster endpoints"},
		{"cluster IP to another port", replaceOnce("10.96.20.1 . tcp . 80 :", "10.96.20.1 . tcp . 81 :"),
			"default/web:http tcp: different: destinations: nft has 10.96.20.1:81 -> cluster endpoints; ours has 10.96.20.1:80 -> cluster endpoints"},
		{"external IP gone", replaceOnce("192.0.2.50 . tcp . 53 : goto external-SB52OEO6-default/ext/tcp/dns-tcp,\n", ""),
			"default/ext:dns-tcp tcp: different: destinations: ours has 192.0.2.50:53 -> external"},
		{"load balancer IP skips the external chain", replaceOnce("203.0.113.10 . tcp . 443 : goto external-BPKTVXJ3", "203.0.113.10 . tcp . 443 : goto service-BPKTVXJ3"),
			"default/lb:https tcp: different: destinations: nft has 203.0.113.10:443 -> cluster endpoints; ours has 203.0.113.10:443 -> external"},
		{"NodePort moved", replaceOnce("tcp . 30080 : goto", "tcp . 30090 : goto"),
			"default/np:http tcp: different: destinations: nft has nodeport 30090 -> external; ours has nodeport 30080 -> external"},
		{"no endpoints: drop instead of reject", replaceOnce(`10.96.20.12 . tcp . 80 comment "default/empty:http" : goto reject-chain`, `10.96.20.12 . tcp . 80 comment "default/empty:http" : drop`),
			"default/empty:http tcp: different: destinations: nft has 10.96.20.12:80 -> drop; ours has 10.96.20.12:80 -> reject"},
		{"no local endpoints: the drop gone", replaceOnce(`10.96.20.11 . tcp . 80 comment "default/itp-local-none:http" : drop,`+"\n", ""),
			"default/itp-local-none:http tcp: different: only in ours; destinations: ours has 10.96.20.11:80 -> drop"},
		{"NodePort without local endpoints rejected", replaceOnce(`tcp . 30083 comment "default/etp-local-none:http" : drop`, `tcp . 30083 comment "default/etp-local-none:http" : goto reject-chain`),
			"default/etp-local-none:http tcp: different: destinations: nft has nodeport 30083 -> reject; ours has nodeport 30083 -> drop"},
		{"source range changed", replaceOnce("{ 10.99.0.0/24, 192.0.2.0/24, 203.0.113.10 }", "{ 10.99.0.0/24, 192.0.3.0/24, 203.0.113.10 }"),
			"default/lb:https tcp: different: source ranges: nft has 203.0.113.10:443 from 10.99.0.0/24, 192.0.3.0/24, 203.0.113.10; others drop"},
		{"source ranges not checked", replaceOnce("203.0.113.10 . tcp . 443 : goto firewall-BPKTVXJ3-default/lb/tcp/https,\n", ""),
			"default/lb:https tcp: different: source ranges: ours has 203.0.113.10:443 from"},
		{"endpoint moved", replaceOnce("np/tcp/http {\n\t\tmeta l4proto tcp dnat ip to numgen random mod 3 map { 0 : 10.244.0.10 . 8080, 1 : 10.244.1.20 . 8080, 2 : 10.244.1.21", "np/tcp/http {\n\t\tmeta l4proto tcp dnat ip to numgen random mod 3 map { 0 : 10.244.0.10 . 8080, 1 : 10.244.1.20 . 8080, 2 : 10.244.1.99"),
			"default/np:http tcp: different: endpoints: nft has cluster endpoints 10.244.1.99:8080 33.33%; ours has cluster endpoints 10.244.1.21:8080 33.33%"},
		{"one endpoint fewer", replaceOnce(webDNAT, "service-SUSTUHLJ-default/web/tcp/http {\n\t\tmeta l4proto tcp dnat to 10.244.0.10:8080"),
			"default/web:http tcp: different: endpoints: nft has cluster endpoints 10.244.0.10:8080 100.00%"},
		{"local endpoint moved", replaceOnce("local-XS2J2BLH-default/etp-local/tcp/http {\n\t\tmeta l4proto tcp dnat to 10.244.0.10:8080", "local-XS2J2BLH-default/etp-local/tcp/http {\n\t\tmeta l4proto tcp dnat to 10.244.0.12:8080"),
			"default/etp-local:http tcp: different: endpoints: nft has local endpoints 10.244.0.12:8080 100.00%; ours has local endpoints 10.244.0.10:8080 100.00%"},
		{"affinity timeout", replaceOnce("http__10.244.0.10/8080 {\n\t\ttype ipv4_addr\n\t\tsize 65535\n\t\tflags dynamic,timeout\n\t\ttimeout 10m", "http__10.244.0.10/8080 {\n\t\ttype ipv4_addr\n\t\tsize 65535\n\t\tflags dynamic,timeout\n\t\ttimeout 20m"),
			"default/sticky:http tcp: different: session affinity: nft has cluster endpoints for 1200s"},
		{"affinity endpoint's DNAT", replaceOnce("meta l4proto tcp dnat to 10.244.0.11:8080\n\t}\n\n\tchain service-H6U4RGLG", "meta l4proto tcp dnat to 10.244.0.12:8080\n\t}\n\n\tchain service-H6U4RGLG"),
			"default/sticky:http tcp: different: endpoints: nft has cluster endpoints 10.244.0.12:8080 50.00%"},
		{"external traffic not masqueraded", replaceOnce("\t\tmeta mark set meta mark | 0x00004000 comment \"masquerade\"\n\t\tgoto service-ASNVMIOD", "\t\tgoto service-ASNVMIOD"),
			"default/np:http tcp: different: external traffic: nft has #1: always -> cluster endpoints"},
		{"eTP Local without the pod short cut", replaceOnce("\t\tip saddr 10.244.0.0/16 goto service-XS2J2BLH-default/etp-local/tcp/http comment \"short-circuit pod traffic\"\n", ""),
			"default/etp-local:http tcp: different: external traffic: "},
		{"IPv6 endpoint moved", replaceOnce("1 : fd00:10:244::11 . 8080 }", "1 : fd00:10:244::12 . 8080 }"),
			"default/dual:http tcp (IPv6): different: endpoints: nft has cluster endpoints [fd00:10:244::12]:8080 50.00%"},
		{"a rule diff does not read", replaceOnce("chain service-CFUP4SXE-default/multi/tcp/metrics {\n", "chain service-CFUP4SXE-default/multi/tcp/metrics {\n\t\tip saddr 10.0.0.1 drop\n"),
			"default/multi:metrics tcp: different: other rules: nft has cluster endpoints: ip saddr 10.0.0.1 drop"},
		{"a Service port only in the listing", replaceOnce("10.96.20.13 . tcp . 9090 : goto", "10.96.20.13 . tcp . 9091 : goto service-CFUP4SXE-default/multi/tcp/metrics,\n\t\t\t     10.96.20.99 . tcp . 1 : goto service-AAAAAAAA-default/ghost/tcp/x,\n\t\t\t     10.96.20.13 . tcp . 9090 : goto"),
			"default/ghost:x tcp: different: only in the nft ruleset; destinations: nft has 10.96.20.99:1 -> cluster endpoints"},
	} {
		t.Run(m.name, func(t *testing.T) {
			edited, ok := m.edit(listing)
			if !ok {
				t.Fatal("the mutation does not apply to the listing")
			}
			out, equal := nftReport(t, edited, rs)
			if equal || !strings.Contains(out, m.want) {
				t.Errorf("diff says equal=%v, want different with %q:\n%s", equal, m.want, out)
			}
		})
	}
}

// Each family's table alone compares that family only; two of one family
// are refused.
func TestCompareNFTOneFamily(t *testing.T) {
	listing, rs := upstreamNFTListing(t)
	v6 := listing[strings.Index(listing, "table ip6 kube-proxy {"):]
	out, equal := nftReport(t, v6, rs)
	if !equal || !strings.Contains(out, "1 service ports: 1 equal") {
		t.Errorf("the IPv6 table alone:\n%s", out)
	}
	theirs, err := ParseNFTRuleset(strings.NewReader(v6 + v6))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := CompareNFT(theirs, rs); err == nil {
		t.Error("two IPv6 tables: no error")
	}
}

// TestUpstreamKey reads upstream nftables mode's per-service chain names.
// A port without a name ends the name with "/", and its Service port is
// namespace/name alone, as iptables mode's comments and ours name it.
func TestUpstreamKey(t *testing.T) {
	for chain, want := range map[string]Key{
		"service-ULMVA6XW-default/web/tcp/http":                  {Service: "default/web:http", Proto: "tcp"},
		"service-4ZHDTQUV-knp-faults/other/tcp/":                 {Service: "knp-faults/other", Proto: "tcp"},
		"endpoint-5OJB2KTY-knp-faults/other/tcp/__10.244.1.4/80": {Service: "knp-faults/other", Proto: "tcp"},
		"external-ABCDEFGH-default/lb/udp/dns":                   {Service: "default/lb:dns", Proto: "udp"},
	} {
		got, ok := upstreamKey(chain, false)
		if !ok || got != want {
			t.Errorf("upstreamKey(%q) = %+v, %v; want %+v", chain, got, ok, want)
		}
	}
	if _, ok := upstreamKey("services", false); ok {
		t.Errorf("upstreamKey(services) read a Service port")
	}
}
