package migrate

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/kube-nftproxy/kube-nftproxy/iptsave"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// Localhost NodePorts (iptables mode's --iptables-localhost-nodeports) are
// node-wide: whether KUBE-SERVICES' tail-call to KUBE-NODEPORTS lets a
// loopback destination through, and whether KUBE-FIREWALL drops what
// reaches 127.0.0.0/8 from elsewhere unless DNATed or established
// ("block incoming localnet connections"). kubelet writes that rule too,
// so the guard is only compared where both sides serve localhost NodePorts.

const localnetChain = "KUBE-FIREWALL"

var (
	ipv4Loopback = netip.MustParsePrefix("127.0.0.0/8")
	loopbackAddr = map[bool]netip.Addr{false: netip.MustParseAddr("127.0.0.1"), true: netip.IPv6Loopback()}
)

// localhostFacts are one side's localhost NodePort rules.
type localhostFacts struct {
	nodePorts bool // KUBE-NODEPORTS is reached for a loopback destination
	guarded   bool // KUBE-FIREWALL's localnet drop is in place (input)
}

// localhostNodePort is the kind of entry of a NodePort on 127.0.0.0/8:
// iptables mode writes one per NodePort (counting its packets before the
// rule for every address); ours serves every NodePort there when its
// KUBE-SERVICES lets loopback through.
const localhostNodePort = "nodeport on 127.0.0.0/8"

// addLocalhostNodePorts adds ours' localhost entries: one per NodePort
// that leads to a Service chain, when NodePorts are served on loopback.
func (v *view) addLocalhostNodePorts() {
	if v.ipv6 || !v.localhost.nodePorts {
		return
	}
	for _, e := range slices.Clone(v.entries) {
		if e.kind == "nodeport" && isServiceChain(e.verdict) {
			e.kind = localhostNodePort
			v.entries = append(v.entries, e)
		}
	}
}

// readLocalhostIPT reads them from iptables mode's nat and filter tables.
func readLocalhostIPT(ipv6 bool, nat, filter *iptsave.Table) localhostFacts {
	var lf localhostFacts
	for _, r := range nat.Rules["KUBE-SERVICES"] {
		if r.Target == "KUBE-NODEPORTS" && (!r.Dst.Valid() || r.Dst.Prefix.Contains(loopbackAddr[ipv6]) != r.Dst.Negate) {
			lf.nodePorts = true
		}
	}
	if filter == nil || ipv6 || !jumpsTo(filter, "INPUT", localnetChain) || !jumpsTo(filter, "OUTPUT", localnetChain) {
		return lf
	}
	for _, r := range filter.Rules[localnetChain] {
		if r.Target == "DROP" && r.Dst == (iptsave.Match{Prefix: ipv4Loopback}) && r.Src == (iptsave.Match{Prefix: ipv4Loopback, Negate: true}) &&
			ctStates(r.CtState) == "!DNAT,ESTABLISHED,RELATED" {
			lf.guarded = true
		}
	}
	return lf
}

// ctStates normalizes a --ctstate list: "!" in front when negated, the
// states sorted.
func ctStates(s string) string {
	neg := strings.HasPrefix(s, "!")
	states := strings.Split(strings.TrimSpace(strings.TrimPrefix(s, "!")), ",")
	slices.Sort(states)
	out := strings.Join(states, ",")
	if neg {
		out = "!" + out
	}
	return out
}

// readLocalhostOurs reads them from one of our tables (the main table
// holds both; the others add nothing).
func readLocalhostOurs(f nftlib.Family, t *nftlib.Table, lf *localhostFacts) {
	lo := loopbackAddr[f == nftlib.IPv6]
	if c := t.Chain("KUBE-SERVICES"); c != nil {
		for _, r := range c.Rules {
			if hasVerdictChain(r, "KUBE-NODEPORTS") && admits(r, lo) {
				lf.nodePorts = true
			}
		}
	}
	fw := t.Chain(localnetChain)
	if f == nftlib.IPv6 || fw == nil || !jumpsToOurs(t, "filter-input", localnetChain) || !jumpsToOurs(t, "filter-output", localnetChain) {
		return
	}
	guard := nftlib.R(
		nftlib.AddrMatch{Field: nftlib.FieldDaddr, Prefix: ipv4Loopback},
		nftlib.AddrMatch{Field: nftlib.FieldSaddr, Negate: true, Prefix: ipv4Loopback},
		nftlib.CtStateNone{Bits: nftlib.CtEstablished | nftlib.CtRelated},
		nftlib.CtStatusNone{Bits: nftlib.CtStatusDNAT},
		nftlib.Verdict{Kind: nftlib.Drop},
	)
	for _, r := range fw.Rules {
		if slices.Equal(r.Terms, guard.Terms) {
			lf.guarded = true
		}
	}
}

func jumpsToOurs(t *nftlib.Table, from, to string) bool {
	c := t.Chain(from)
	return c != nil && slices.ContainsFunc(c.Rules, func(r nftlib.Rule) bool { return hasVerdictChain(r, to) })
}

func hasVerdictChain(r nftlib.Rule, chain string) bool {
	return slices.ContainsFunc(r.Terms, func(t nftlib.Term) bool { v, ok := t.(nftlib.Verdict); return ok && v.Chain == chain })
}

// admits reports whether a rule's destination matches let addr through.
func admits(r nftlib.Rule, addr netip.Addr) bool {
	for _, t := range r.Terms {
		if m, ok := t.(nftlib.AddrMatch); ok && m.Field == nftlib.FieldDaddr && m.Prefix.Contains(addr) == m.Negate {
			return false
		}
	}
	return true
}

// compareLocalhost says how the two sides' localhost NodePorts differ.
func compareLocalhost(family string, theirs, ours localhostFacts) []string {
	yes := map[bool]string{true: "served", false: "not served"}
	switch {
	case theirs.nodePorts != ours.nodePorts:
		return []string{fmt.Sprintf("%s: NodePorts on localhost (KUBE-SERVICES -> KUBE-NODEPORTS for a loopback destination): iptables %s, ours %s (--proxy-mode iptables, --iptables-localhost-nodeports)",
			family, yes[theirs.nodePorts], yes[ours.nodePorts])}
	case theirs.nodePorts && theirs.guarded != ours.guarded:
		has := map[bool]string{true: "has", false: "lacks"}
		return []string{fmt.Sprintf("%s: localhost NodePorts served; iptables %s, ours %s KUBE-FIREWALL's drop of non-loopback sources to 127.0.0.0/8 not DNATed or established (block incoming localnet connections), jumped to from INPUT and OUTPUT",
			family, has[theirs.guarded], has[ours.guarded])}
	}
	return nil
}
