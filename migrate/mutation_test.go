package migrate

import (
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/iptsave"
	"github.com/kube-nftproxy/kube-nftproxy/source/filesource"
)

// mutation is one change to a real dump of upstream kube-proxy: the kind of
// rule it touches, what it does, and what diff must then say.
type mutation struct {
	kind string
	name string
	ipv6 bool // edits the ip6tables dump instead of the iptables one
	edit func(string) (string, bool)
	want string // in diff's output
	// documented: a deliberate difference between the modes; diff says
	// equal and names it (want), instead of exit 1.
	documented bool
}

// deleteLine removes the one line matching re (anchored at "-A ").
func deleteLine(re string) func(string) (string, bool) {
	rx := regexp.MustCompile(`(?m)^` + re + `.*\n`)
	return func(s string) (string, bool) {
		if len(rx.FindAllString(s, -1)) != 1 {
			return s, false
		}
		return rx.ReplaceAllString(s, ""), true
	}
}

// alterLine replaces old with new in the one line matching re.
func alterLine(re, old, new string) func(string) (string, bool) {
	rx := regexp.MustCompile(`(?m)^` + re + `.*$`)
	return func(s string) (string, bool) {
		lines := rx.FindAllString(s, -1)
		if len(lines) != 1 || !strings.Contains(lines[0], old) {
			return s, false
		}
		return strings.Replace(s, lines[0], strings.Replace(lines[0], old, new, 1), 1), true
	}
}

// addLine adds a line after the one matching re.
func addLine(re, line string) func(string) (string, bool) {
	rx := regexp.MustCompile(`(?m)^` + re + `.*$`)
	return func(s string) (string, bool) {
		lines := rx.FindAllString(s, -1)
		if len(lines) != 1 {
			return s, false
		}
		return strings.Replace(s, lines[0], lines[0]+"\n"+line, 1), true
	}
}

// deleteChain removes an empty chain's declaration from a table.
func deleteChain(table, chain string) func(string) (string, bool) {
	return func(s string) (string, bool) {
		begin := strings.Index(s, "*"+table+"\n")
		decl := ":" + chain + " - [0:0]\n"
		at := strings.Index(s[max(begin, 0):], decl)
		if begin < 0 || at < 0 || strings.Contains(s, "-A "+chain+" ") {
			return s, false
		}
		at += begin
		return s[:at] + s[at+len(decl):], true
	}
}

// mutations covers every kind of rule kube-proxy's iptables mode writes
// (as upstream's own proxier tests enumerate them), each deleted and, where
// it has a field that matters, altered.
var mutations = []mutation{
	// nat KUBE-SERVICES: where Service addresses lead.
	{kind: "KUBE-SERVICES cluster IP", name: "deleted", edit: deleteLine(`-A KUBE-SERVICES -d 10.96.20.1/32 `), want: "default/web:http tcp: different: only in ours"},
	{kind: "KUBE-SERVICES cluster IP", name: "port", edit: alterLine(`-A KUBE-SERVICES -d 10.96.20.1/32 `, "--dport 80", "--dport 81"), want: "iptables has cluster IP 10.96.20.1:81"},
	{kind: "KUBE-SERVICES external IP", name: "deleted", edit: deleteLine(`-A KUBE-SERVICES -d 192.0.2.50/32 -p udp`), want: "default/ext:dns udp: different: destinations: ours has external IP 192.0.2.50:53"},
	{kind: "KUBE-SERVICES external IP", name: "address", edit: alterLine(`-A KUBE-SERVICES -d 192.0.2.50/32 -p tcp`, "192.0.2.50/32", "192.0.2.59/32"), want: "iptables has external IP 192.0.2.59:53"},
	{kind: "KUBE-SERVICES load balancer IP", name: "deleted", edit: deleteLine(`-A KUBE-SERVICES -d 203.0.113.12/32 `), want: "default/etp-local:http tcp: different: destinations: ours has loadbalancer IP 203.0.113.12:80"},
	{kind: "KUBE-SERVICES load balancer IP", name: "chain", edit: alterLine(`-A KUBE-SERVICES -d 203.0.113.12/32 `, "KUBE-EXT-F7NDLNIQR2UPIWCN", "KUBE-SVC-F7NDLNIQR2UPIWCN"), want: "iptables has loadbalancer IP 203.0.113.12:80 -> KUBE-SVC-F7NDLNIQR2UPIWCN"},
	// KUBE-SVC: masquerade of off-cluster sources, the random choice.
	{kind: "KUBE-SVC masquerade", name: "deleted", edit: deleteLine(`-A KUBE-SVC-CDGGSHYLG3RE2FKL ! -s`), want: "default/web:http tcp: different: masquerade: ours has KUBE-SVC-CDGGSHYLG3RE2FKL"},
	{kind: "KUBE-SVC masquerade", name: "cluster CIDR", edit: alterLine(`-A KUBE-SVC-CDGGSHYLG3RE2FKL ! -s`, "10.244.0.0/16", "10.245.0.0/16"), want: "masquerade: iptables has KUBE-SVC-CDGGSHYLG3RE2FKL when daddr 10.96.20.1/32 dport 80 saddr != 10.245.0.0/16"},
	{kind: "KUBE-SVC probability", name: "altered", edit: alterLine(`-A KUBE-SVC-QUMPV5Z3SF2IMFUJ .*0.33333333349`, "0.33333333349", "0.50000000000"), want: "default/np:http tcp: different: endpoints: KUBE-SVC-QUMPV5Z3SF2IMFUJ: iptables [10.244.0.10:8080 50%"},
	{kind: "KUBE-SVC endpoint jump", name: "deleted", edit: deleteLine(`-A KUBE-SVC-CDGGSHYLG3RE2FKL -m comment --comment "default/web:http -> 10.244.0.11:8080"`), want: "endpoints: KUBE-SVC-CDGGSHYLG3RE2FKL: iptables [10.244.0.10:8080 50%], ours [10.244.0.10:8080 50%, 10.244.0.11:8080 50%]"},
	// KUBE-SEP: DNAT and the hairpin masquerade.
	{kind: "KUBE-SEP DNAT", name: "target", edit: alterLine(`-A KUBE-SEP-QZSIC2ZS53EHPBVZ -p tcp`, "10.244.0.11:8080", "10.244.0.11:8081"), want: "default/web:http tcp: different: endpoints: KUBE-SVC-CDGGSHYLG3RE2FKL: iptables [10.244.0.10:8080 50%, 10.244.0.11:8081 50%]"},
	{kind: "KUBE-SEP DNAT", name: "deleted", edit: deleteLine(`-A KUBE-SEP-QZSIC2ZS53EHPBVZ -p tcp`), want: "default/web:http tcp: different: endpoints: KUBE-SVC-CDGGSHYLG3RE2FKL: iptables [10.244.0.10:8080 50%, ? 50%]"},
	{kind: "KUBE-SEP masquerade", name: "deleted", edit: deleteLine(`-A KUBE-SEP-QZSIC2ZS53EHPBVZ -s`), want: "default/web:http tcp: different: masquerade: ours has KUBE-SEP-QZSIC2ZS53EHPBVZ when saddr 10.244.0.11/32"},
	{kind: "KUBE-SEP masquerade", name: "source", edit: alterLine(`-A KUBE-SEP-QZSIC2ZS53EHPBVZ -s`, "-s 10.244.0.11/32", "-s 10.244.0.12/32"), want: "masquerade: iptables has KUBE-SEP-QZSIC2ZS53EHPBVZ when saddr 10.244.0.12/32"},
	// Session affinity (-m recent).
	{kind: "sessionAffinity recent check", name: "timeout", edit: alterLine(`-A KUBE-SVC-T2ECBIYT2WDZZK45 .*--name KUBE-SEP-PKIVLFZHEJG6GBYJ`, "--seconds 600", "--seconds 60"), want: "default/sticky:http tcp: different: session affinity: iptables has KUBE-SVC-T2ECBIYT2WDZZK45 -> KUBE-SEP-PKIVLFZHEJG6GBYJ for 60s"},
	{kind: "sessionAffinity recent check", name: "deleted", edit: deleteLine(`-A KUBE-SVC-T2ECBIYT2WDZZK45 .*--rcheck .*--name KUBE-SEP-PKIVLFZHEJG6GBYJ`), want: "session affinity: ours has KUBE-SVC-T2ECBIYT2WDZZK45 -> KUBE-SEP-PKIVLFZHEJG6GBYJ for 600s"},
	{kind: "sessionAffinity recent set", name: "deleted", edit: alterLine(`-A KUBE-SEP-HBFFEUML3KQEPO24 -p tcp`, "-m recent --set --name KUBE-SEP-HBFFEUML3KQEPO24 --mask 255.255.255.255 --rsource ", ""), want: "session affinity: ours has KUBE-SEP-HBFFEUML3KQEPO24 records the client"},
	// KUBE-EXT: external traffic.
	{kind: "KUBE-EXT masquerade", name: "deleted", edit: deleteLine(`-A KUBE-EXT-QUMPV5Z3SF2IMFUJ -m comment --comment "masquerade`), want: "default/np:http tcp: different: external traffic: "},
	{kind: "KUBE-EXT policy jump", name: "deleted", edit: deleteLine(`-A KUBE-EXT-QUMPV5Z3SF2IMFUJ -j KUBE-SVC`), want: "default/np:http tcp: different: external traffic: "},
	{kind: "KUBE-EXT eTP Local pod short cut", name: "deleted", edit: deleteLine(`-A KUBE-EXT-F7NDLNIQR2UPIWCN -s 10.244.0.0/16`), want: "default/etp-local:http tcp: different: external traffic: "},
	{kind: "KUBE-EXT eTP Local node-local traffic", name: "deleted", edit: deleteLine(`-A KUBE-EXT-F7NDLNIQR2UPIWCN -m comment --comment "route LOCAL`), want: "default/etp-local:http tcp: different: external traffic: "},
	// KUBE-SVL: the local policy.
	{kind: "KUBE-SVL endpoint jump", name: "deleted", edit: deleteLine(`-A KUBE-SVL-F7NDLNIQR2UPIWCN `), want: "default/etp-local:http tcp: different: endpoints: KUBE-SVL-F7NDLNIQR2UPIWCN: iptables [], ours [10.244.0.10:8080 100%]"},
	{kind: "KUBE-SVL masquerade", name: "deleted", edit: deleteLine(`-A KUBE-SVL-Q6PIQ6MST54P2YU5 ! -s`), want: "default/itp-local:http tcp: different: masquerade: ours has KUBE-SVL-Q6PIQ6MST54P2YU5"},
	// loadBalancerSourceRanges: KUBE-FW and KUBE-PROXY-FIREWALL.
	{kind: "KUBE-FW source range", name: "altered", edit: alterLine(`-A KUBE-FW-WMXB4IV4XJUTQTS2 -s 192.0.2.0/24`, "192.0.2.0/24", "192.0.3.0/24"), want: "default/lb:https tcp: different: source ranges: iptables has 203.0.113.10:443 from 10.99.0.0/24, 192.0.3.0/24"},
	{kind: "KUBE-FW source range", name: "deleted", edit: deleteLine(`-A KUBE-FW-WMXB4IV4XJUTQTS2 -s 192.0.2.0/24`), want: "default/lb:https tcp: different: source ranges: iptables has 203.0.113.10:443 from 10.99.0.0/24, 203.0.113.10/32"},
	{kind: "KUBE-PROXY-FIREWALL DROP", name: "deleted", edit: deleteLine(`-A KUBE-PROXY-FIREWALL -d 203.0.113.10/32`), want: "default/lb:https tcp: different: source ranges: iptables has 203.0.113.10:443 from 10.99.0.0/24, 192.0.2.0/24, 203.0.113.10/32; others go on un-DNATed"},
	{kind: "KUBE-PROXY-FIREWALL DROP", name: "address", edit: alterLine(`-A KUBE-PROXY-FIREWALL -d 203.0.113.10/32`, "203.0.113.10/32", "203.0.113.19/32"), want: "node: different: IPv4: a rule diff does not understand: filter -A KUBE-PROXY-FIREWALL -d 203.0.113.19/32"},
	// KUBE-NODEPORTS (nat) and localhost NodePorts.
	{kind: "KUBE-NODEPORTS", name: "port", edit: alterLine(`-A KUBE-NODEPORTS -p tcp -m comment --comment "default/np:http"`, "--dport 30080", "--dport 30090"), want: "default/np:http tcp: different: destinations: iptables has nodeport 30090 -> KUBE-EXT-QUMPV5Z3SF2IMFUJ"},
	{kind: "KUBE-NODEPORTS", name: "deleted", edit: deleteLine(`-A KUBE-NODEPORTS -p tcp -m comment --comment "default/np:http"`), want: "default/np:http tcp: different: destinations: ours has nodeport 30080 -> KUBE-EXT-QUMPV5Z3SF2IMFUJ"},
	{kind: "localhost NodePort", name: "deleted", edit: deleteLine(`-A KUBE-NODEPORTS -d 127.0.0.0/8 -p tcp -m comment --comment "default/np:http"`), want: "default/np:http tcp: different: destinations: ours has nodeport on 127.0.0.0/8 30080 -> KUBE-EXT-QUMPV5Z3SF2IMFUJ"},
	{kind: "localhost NodePort", name: "off loopback", edit: alterLine(`-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports`, "-m addrtype", "! -d 127.0.0.0/8 -m addrtype"), want: "NodePorts on localhost (KUBE-SERVICES -> KUBE-NODEPORTS for a loopback destination): iptables not served, ours served"},
	{kind: "IPv6 NodePorts off ::1", name: "deleted", ipv6: true, edit: alterLine(`-A KUBE-SERVICES ! -d ::1/128`, "! -d ::1/128 ", ""), want: "IPv6: NodePorts on localhost (KUBE-SERVICES -> KUBE-NODEPORTS for a loopback destination): iptables served, ours not served"},
	// The tail-call to KUBE-NODEPORTS.
	{kind: "KUBE-SERVICES -> KUBE-NODEPORTS", name: "deleted", edit: deleteLine(`-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports`), want: "NodePorts (KUBE-SERVICES -> KUBE-NODEPORTS) answer on: iptables none; ours every local address"},
	{kind: "KUBE-SERVICES -> KUBE-NODEPORTS", name: "nodeport addresses", edit: alterLine(`-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports`, "-m addrtype --dst-type LOCAL", "-d 10.99.0.7/32"), want: "NodePorts (KUBE-SERVICES -> KUBE-NODEPORTS) answer on: iptables local addresses in 10.99.0.7/32; ours every local address"},
	// KUBE-MARK-MASQ, KUBE-POSTROUTING and the nat hooks.
	{kind: "KUBE-MARK-MASQ", name: "bit", edit: alterLine(`-A KUBE-MARK-MASQ`, "0x4000/0x4000", "0x8000/0x8000"), want: "KUBE-MARK-MASQ sets 0x8000 in iptables, 0x4000 in ours"},
	{kind: "KUBE-MARK-MASQ", name: "deleted", edit: deleteLine(`-A KUBE-MARK-MASQ`), want: "KUBE-MARK-MASQ sets 0x0 in iptables, 0x4000 in ours"},
	{kind: "KUBE-POSTROUTING RETURN", name: "deleted", edit: deleteLine(`-A KUBE-POSTROUTING -m mark`), want: "IPv4: ours has KUBE-POSTROUTING #1: mark 0x4000 clear -> return"},
	{kind: "KUBE-POSTROUTING RETURN", name: "mark", edit: alterLine(`-A KUBE-POSTROUTING -m mark`, "0x4000/0x4000", "0x2000/0x2000"), want: "IPv4: iptables has KUBE-POSTROUTING #1: mark 0x2000 clear -> return"},
	{kind: "KUBE-POSTROUTING MARK xor", name: "deleted", edit: deleteLine(`-A KUBE-POSTROUTING -j MARK`), want: "ours has KUBE-POSTROUTING #2: -> mark ^= 0x4000"},
	{kind: "KUBE-POSTROUTING MASQUERADE", name: "deleted", edit: deleteLine(`-A KUBE-POSTROUTING .*-j MASQUERADE`), want: "IPv4: ours has KUBE-POSTROUTING #3: -> masquerade fully-random"},
	{kind: "KUBE-POSTROUTING MASQUERADE", name: "not fully random", edit: alterLine(`-A KUBE-POSTROUTING .*-j MASQUERADE`, " --random-fully", ""), want: "IPv4: iptables has KUBE-POSTROUTING #3: -> masquerade\n"},
	{kind: "nat PREROUTING jump", name: "deleted", edit: deleteLine(`-A PREROUTING .*-j KUBE-SERVICES`), want: "IPv4: ours has nat PREROUTING: -> KUBE-SERVICES"},
	{kind: "nat OUTPUT jump", name: "deleted", edit: deleteLine(`-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`), want: "IPv4: ours has nat OUTPUT: -> KUBE-SERVICES"},
	{kind: "nat POSTROUTING jump", name: "deleted", ipv6: true, edit: deleteLine(`-A POSTROUTING .*-j KUBE-POSTROUTING`), want: "IPv6: ours has nat POSTROUTING: -> KUBE-POSTROUTING"},
	// KUBE-FORWARD.
	{kind: "KUBE-FORWARD invalid drop", name: "deleted", edit: deleteLine(`-A KUBE-FORWARD -m conntrack --ctstate INVALID`), want: "IPv4: ours has KUBE-FORWARD #1: ct state invalid -> drop"},
	{kind: "KUBE-FORWARD mark ACCEPT", name: "deleted", edit: deleteLine(`-A KUBE-FORWARD .*-m mark`), want: "IPv4: ours has KUBE-FORWARD #2: mark 0x4000 set -> accept"},
	{kind: "KUBE-FORWARD mark ACCEPT", name: "mark", ipv6: true, edit: alterLine(`-A KUBE-FORWARD .*-m mark`, "0x4000/0x4000", "0x4000/0xc000"), want: "IPv6: iptables has KUBE-FORWARD #2: mark 0x4000/0xc000 negate=false -> accept"},
	{kind: "KUBE-FORWARD conntrack ACCEPT", name: "deleted", edit: deleteLine(`-A KUBE-FORWARD .*RELATED,ESTABLISHED`), want: "IPv4: ours has KUBE-FORWARD #3: ct state established,related -> accept"},
	{kind: "KUBE-FORWARD conntrack ACCEPT", name: "states", edit: alterLine(`-A KUBE-FORWARD .*RELATED,ESTABLISHED`, "RELATED,ESTABLISHED", "ESTABLISHED"), want: "IPv4: iptables has KUBE-FORWARD #3: ct state established -> accept"},
	// The filter hooks.
	{kind: "filter FORWARD -> KUBE-FORWARD", name: "deleted", edit: deleteLine(`-A FORWARD .*-j KUBE-FORWARD`), want: "IPv4: ours has filter FORWARD: -> KUBE-FORWARD"},
	{kind: "filter -> KUBE-PROXY-FIREWALL", name: "INPUT deleted", edit: deleteLine(`-A INPUT .*-j KUBE-PROXY-FIREWALL`), want: "IPv4: ours has filter INPUT: ct state new -> source ranges (KUBE-PROXY-FIREWALL)"},
	{kind: "filter -> KUBE-PROXY-FIREWALL", name: "OUTPUT not only new", edit: alterLine(`-A OUTPUT .*-j KUBE-PROXY-FIREWALL`, "-m conntrack --ctstate NEW ", ""), want: "IPv4: iptables has filter OUTPUT: -> source ranges (KUBE-PROXY-FIREWALL)"},
	{kind: "filter -> KUBE-SERVICES", name: "FORWARD deleted", edit: deleteLine(`-A FORWARD .*-j KUBE-SERVICES`), want: "IPv4: ours has filter FORWARD: ct state new -> no-endpoint checks of cluster IPs (filter KUBE-SERVICES)"},
	{kind: "filter -> KUBE-SERVICES", name: "OUTPUT deleted", edit: deleteLine(`-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`), want: "IPv4: ours has filter OUTPUT: ct state new -> no-endpoint checks of cluster IPs"},
	{kind: "filter -> KUBE-EXTERNAL-SERVICES", name: "INPUT deleted", edit: deleteLine(`-A INPUT .*-j KUBE-EXTERNAL-SERVICES`), want: "IPv4: ours has filter INPUT: ct state new -> no-endpoint checks of external IPs and NodePorts"},
	// KUBE-FIREWALL: the localnet guard of localhost NodePorts.
	{kind: "KUBE-FIREWALL localnet drop", name: "deleted", edit: deleteLine(`-A KUBE-FIREWALL `), want: "IPv4: localhost NodePorts served; iptables lacks, ours has KUBE-FIREWALL's drop"},
	{kind: "KUBE-FIREWALL localnet drop", name: "states", edit: alterLine(`-A KUBE-FIREWALL `, "RELATED,ESTABLISHED,DNAT", "RELATED,ESTABLISHED"), want: "iptables lacks, ours has KUBE-FIREWALL's drop"},
	{kind: "KUBE-FIREWALL jumps", name: "OUTPUT deleted", edit: deleteLine(`-A OUTPUT -j KUBE-FIREWALL`), want: "iptables lacks, ours has KUBE-FIREWALL's drop"},
	// No endpoints: filter KUBE-SERVICES and KUBE-EXTERNAL-SERVICES.
	{kind: "filter KUBE-SERVICES REJECT", name: "deleted", edit: deleteLine(`-A KUBE-SERVICES -d 10.96.20.12/32 `), want: "default/empty:http tcp: different: destinations: ours has 10.96.20.12:80 -> reject"},
	{kind: "filter KUBE-SERVICES REJECT", name: "drop", edit: alterLine(`-A KUBE-SERVICES -d 10.96.20.12/32 `, "-j REJECT --reject-with icmp-port-unreachable", "-j DROP"), want: "default/empty:http tcp: different: destinations: iptables has 10.96.20.12:80 -> drop"},
	{kind: "filter KUBE-SERVICES DROP (no local endpoints)", name: "deleted", edit: deleteLine(`-A KUBE-SERVICES -d 10.96.20.11/32 `), want: "default/itp-local-none:http tcp: different: only in ours"},
	{kind: "KUBE-EXTERNAL-SERVICES REJECT", name: "external IP deleted", edit: deleteLine(`-A KUBE-EXTERNAL-SERVICES -d 192.0.2.51/32`), want: "default/ext-empty:http tcp: different: destinations: ours has 192.0.2.51:80 -> reject"},
	{kind: "KUBE-EXTERNAL-SERVICES REJECT", name: "NodePort deleted", edit: deleteLine(`-A KUBE-EXTERNAL-SERVICES -p tcp -m comment --comment "default/empty:http`), want: "default/empty:http tcp: different: destinations: ours has nodeport 30084 -> reject"},
	{kind: "KUBE-EXTERNAL-SERVICES DROP (no local endpoints)", name: "port", edit: alterLine(`-A KUBE-EXTERNAL-SERVICES -p tcp -m comment --comment "default/etp-local-none:http`, "--dport 30083", "--dport 30093"), want: "default/etp-local-none:http tcp: different: destinations: iptables has nodeport 30093 -> drop"},
	// Health check node ports (filter KUBE-NODEPORTS).
	{kind: "health check ACCEPT", name: "deleted", edit: deleteLine(`-A KUBE-NODEPORTS -p tcp -m comment --comment "default/etp-local:http health check node port"`), want: "default/etp-local:http tcp: different: health check node port: iptables accepts none, the Service's is 32000"},
	{kind: "health check ACCEPT", name: "port", edit: alterLine(`-A KUBE-NODEPORTS -p tcp -m comment --comment "default/etp-local:http health check node port"`, "--dport 32000", "--dport 32001"), want: "health check node port: iptables accepts 32001, the Service's is 32000"},
	{kind: "health check ACCEPT", name: "as a documented difference", edit: func(s string) (string, bool) { return s, true }, documented: true, want: "default/etp-local:http tcp: equal (known difference: health check node port 32000 accepted by iptables in filter INPUT; ours writes no such rule)"},
	{kind: "filter INPUT -> KUBE-NODEPORTS", name: "deleted", edit: deleteLine(`-A INPUT .*-j KUBE-NODEPORTS`), want: "IPv4: iptables accepts health check node ports in filter KUBE-NODEPORTS, but INPUT does not jump there"},
	// Documented differences: named, not compared.
	{kind: "KUBE-PROXY-CANARY", name: "mangle's deleted", documented: true, edit: deleteChain("mangle", "KUBE-PROXY-CANARY"),
		want: "IPv4: iptables has the empty KUBE-PROXY-CANARY chains kube-proxy watches for flushes; ours watches its tables itself (in nat, filter)"},
	{kind: "nfacct counters", name: "invalid drop uncounted", documented: true, edit: alterLine(`-A KUBE-FORWARD -m conntrack --ctstate INVALID`, "-m nfacct --nfacct-name  ct_state_invalid_dropped_pkts ", ""),
		want: "IPv4: iptables counts packets with nfacct for kube-proxy's metrics; ours keeps no such counters (localhost_nps_accepted_pkts)"},
	// What diff cannot read is a difference, not skipped.
	{kind: "a rule kube-proxy does not write", name: "added to KUBE-SERVICES", edit: addLine(`-A KUBE-SERVICES -d 10.96.20.1/32 `, `-A KUBE-SERVICES -d 10.96.20.1/32 -p tcp -m tcp --dport 80 -j ACCEPT`), want: "a rule diff does not understand: nat -A KUBE-SERVICES -d 10.96.20.1/32 -p tcp -m tcp --dport 80 -j ACCEPT"},
	{kind: "a rule kube-proxy does not write", name: "added to KUBE-POSTROUTING", ipv6: true, edit: addLine(`-A KUBE-POSTROUTING -j MARK`, `-A KUBE-POSTROUTING -j ACCEPT`), want: "IPv6: iptables has KUBE-POSTROUTING #3: -> accept"},
}

// TestDiffMutations: each mutation of a real dump of upstream kube-proxy
// v1.37.1 (testdata/upstream-localhost: iptables mode, localhost NodePorts
// on, every Service feature) makes diff report a difference naming what
// changed; the documented ones are named as known differences.
func TestDiffMutations(t *testing.T) {
	dir := filepath.Join("testdata", "upstream-localhost")
	rs := oursLocalhost(t, filepath.Join(dir, "objects.json"), true)
	st, _ := filesource.LoadState(filepath.Join(dir, "objects.json"), "node-1")
	want := ExpectFromState(st)
	dumps := [2]string{readDump(t, filepath.Join(dir, "iptables-legacy-save.txt")), readDump(t, filepath.Join(dir, "ip6tables-legacy-save.txt"))}
	report := func(texts [2]string) (string, bool) {
		var ds []*iptsave.Dump
		for _, text := range texts {
			d, err := iptsave.Parse(strings.NewReader(text))
			if err != nil {
				t.Fatal(err)
			}
			ds = append(ds, d)
		}
		rep, err := CompareWith(ds, rs, want)
		if err != nil {
			t.Fatal(err)
		}
		var out strings.Builder
		if err := rep.Write(&out); err != nil {
			t.Fatal(err)
		}
		return out.String(), rep.Equal()
	}
	if out, equal := report(dumps); !equal {
		t.Fatalf("the dump as upstream wrote it is not equal:\n%s", out)
	}
	kinds := map[string]bool{}
	for _, m := range mutations {
		kinds[m.kind] = true
		t.Run(m.kind+"/"+m.name, func(t *testing.T) {
			texts := dumps
			i := 0
			if m.ipv6 {
				i = 1
			}
			var ok bool
			if texts[i], ok = m.edit(texts[i]); !ok {
				t.Fatalf("the mutation does not apply to the dump")
			}
			out, equal := report(texts)
			switch {
			case m.documented && !equal:
				t.Errorf("a documented difference made diff say different:\n%s", out)
			case !m.documented && equal:
				t.Errorf("diff says equal:\n%s", out)
			}
			if !strings.Contains(out, m.want) {
				t.Errorf("diff's output lacks %q:\n%s", m.want, out)
			}
		})
	}
	t.Logf("mutation suite: %d mutations, %d kinds", len(mutations), len(kinds))
}
