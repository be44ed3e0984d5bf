package leftover

import (
	"slices"
	"strings"

	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// NFTablesTable is the name of upstream kube-proxy's nftables-mode table,
// one in family ip and one in ip6 (pkg/proxy/nftables: kubeProxyTable).
const NFTablesTable = "kube-proxy"

// fixedChains are the chains of kube-proxy's iptables and ipvs modes, per
// iptables table, that its own CleanupLeftovers removes: iptables mode's
// (pkg/proxy/iptables/cleanup.go) and ipvs mode's (iptablesCleanupChains).
// Chains that share the KUBE- prefix but are kubelet's (KUBE-FIREWALL,
// KUBE-KUBELET-CANARY, KUBE-IPTABLES-HINT, KUBE-MARK-DROP) are not listed:
// kube-proxy leaves them, and so do we.
var fixedChains = map[string][]string{
	"nat": {
		"KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-MARK-MASQ", "KUBE-PROXY-CANARY",
		// ipvs mode
		"KUBE-NODE-PORT", "KUBE-LOAD-BALANCER",
	},
	"filter": {
		"KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES", "KUBE-FORWARD", "KUBE-NODEPORTS",
		"KUBE-PROXY-FIREWALL", "KUBE-PROXY-CANARY",
		// ipvs mode
		"KUBE-NODE-PORT", "KUBE-SOURCE-RANGES-FIREWALL", "KUBE-IPVS-FILTER", "KUBE-IPVS-OUT-FILTER",
	},
	"mangle": {"KUBE-PROXY-CANARY"},
}

// servicePrefixes start the names of iptables mode's per-Service chains in
// the nat table (isServiceChainName upstream), and KUBE-XLB- of the
// per-Service chains of kube-proxy before 1.24.
var servicePrefixes = []string{"KUBE-SVC-", "KUBE-SVL-", "KUBE-SEP-", "KUBE-FW-", "KUBE-EXT-", "KUBE-XLB-"}

// iptablesTables are the iptables tables kube-proxy writes chains in.
var iptablesTables = []string{"nat", "filter", "mangle"}

// isKubeProxyChain reports whether chain, in the iptables table named
// table, is one kube-proxy creates and removes in its cleanup.
func isKubeProxyChain(table, chain string) bool {
	for _, c := range fixedChains[table] {
		if c == chain {
			return true
		}
	}
	if table != "nat" {
		return false
	}
	for _, p := range servicePrefixes {
		if strings.HasPrefix(chain, p) && len(chain) > len(p) {
			return true
		}
	}
	return false
}

// isIPTablesTable reports whether nftables table t is one iptables-nft uses for a table kube-proxy writes in.
func isIPTablesTable(t nftlib.TableRef) bool {
	return (t.Family == nftlib.IPv4 || t.Family == nftlib.IPv6) && slices.Contains(iptablesTables, t.Name)
}

// isNFTablesTable reports whether t is one of upstream kube-proxy's
// nftables-mode tables.
func isNFTablesTable(t nftlib.TableRef) bool {
	return (t.Family == nftlib.IPv4 || t.Family == nftlib.IPv6) && t.Name == NFTablesTable
}

// ipsets are the ipsets of kube-proxy's ipvs mode (pkg/proxy/ipvs/ipset.go,
// ipsetInfo); its cleanup destroys them after the rules that use them.
var ipsets = []string{
	"KUBE-LOOP-BACK", "KUBE-CLUSTER-IP", "KUBE-EXTERNAL-IP", "KUBE-EXTERNAL-IP-LOCAL",
	"KUBE-LOAD-BALANCER", "KUBE-LOAD-BALANCER-FW", "KUBE-LOAD-BALANCER-LOCAL",
	"KUBE-LOAD-BALANCER-SOURCE-IP", "KUBE-LOAD-BALANCER-SOURCE-CIDR",
	"KUBE-NODE-PORT-TCP", "KUBE-NODE-PORT-LOCAL-TCP", "KUBE-NODE-PORT-UDP", "KUBE-NODE-PORT-LOCAL-UDP",
	"KUBE-NODE-PORT-SCTP-HASH", "KUBE-NODE-PORT-LOCAL-SCTP-HASH",
	"KUBE-HEALTH-CHECK-NODE-PORT", "KUBE-IPVS-IPS",
}
