package migrate

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	"github.com/kube-nftproxy/kube-nftproxy/iptsave"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// The node-wide rules: the hooks' jumps into kube-proxy's chains,
// KUBE-POSTROUTING, KUBE-FORWARD, KUBE-MARK-MASQ and the tail-call to
// KUBE-NODEPORTS. Each side's are read into facts of one vocabulary,
// "<where>: <conditions> -> <what>", where iptables' hooks and ours line up
// by what they do: ours checks source ranges in prerouting (before DNAT),
// iptables in input and forward (after it, by the original destination);
// ours has one chain for every no-endpoint check, iptables two (cluster IPs
// in filter KUBE-SERVICES, the rest in KUBE-EXTERNAL-SERVICES).

// What a hook's jump leads to, named by role.
const (
	roleFirewall     = "source ranges (KUBE-PROXY-FIREWALL)"
	roleNoEPCluster  = "no-endpoint checks of cluster IPs (filter KUBE-SERVICES)"
	roleNoEPExternal = "no-endpoint checks of external IPs and NodePorts (KUBE-EXTERNAL-SERVICES)"
	roleHealthChecks = "health check node ports (filter KUBE-NODEPORTS)"
)

// Known node-wide differences, reported as such.
const (
	// KnownHealthCheckAccept: iptables mode accepts each health check
	// node port in filter INPUT (for an INPUT policy of DROP). An accept in
	// our table could not undo a drop in another table, so ours, like
	// upstream's nftables mode, writes none.
	KnownHealthCheckAccept = "iptables accepts health check node ports in filter INPUT (KUBE-NODEPORTS); ours, like upstream's nftables mode, writes no such rule (an accept in one nftables table cannot undo another table's drop)"
	// KnownCounters: iptables mode counts some packets with nfacct
	// for its metrics.
	KnownCounters = "iptables counts packets with nfacct for kube-proxy's metrics; ours keeps no such counters"
	// KnownCanary: iptables mode's empty KUBE-PROXY-CANARY chains tell
	// it when someone flushed its tables.
	KnownCanary = "iptables has the empty KUBE-PROXY-CANARY chains kube-proxy watches for flushes; ours watches its tables itself"
	// KnownClusterIPChecks: upstream's nftables mode rejects new
	// connections to a ClusterIP's undefined ports and drops those to
	// unallocated ServiceCIDR addresses; iptables mode lets them leave by
	// the node's routes.
	KnownClusterIPChecks = "ours in nftables mode, like upstream's nftables mode, rejects new connections to undefined ports of ClusterIPs and drops those to unallocated ServiceCIDR addresses (cluster-ips-check); iptables mode lets them out by the node's routes"
	// KnownKubeletFirewall: without localhost NodePorts, KUBE-FIREWALL's
	// localnet drop is kubelet's rule, not kube-proxy's.
	KnownKubeletFirewall = "KUBE-FIREWALL's localnet drop without localhost NodePorts is kubelet's rule (kube-proxy writes it only for localhost NodePorts): not compared"
)

// globalFacts are one side's node-wide rules.
type globalFacts struct {
	facts []string
	// nodePorts: where the tail-call to KUBE-NODEPORTS applies.
	nodePorts nodePortDests
	// counters are the nfacct counters iptables' rules update.
	counters []string
	// canary lists the tables holding KUBE-PROXY-CANARY.
	canary []string
	// firewallRules: KUBE-FIREWALL has rules (compared in localhost.go).
	firewallRules bool
	// unread are rules of kube-proxy's chains that nothing else read.
	unread []string
}

// nodePortDests is where NodePorts answer: every local address, or those
// listed (iptables: the node's addresses; ours: prefixes holding them).
// Loopback is left to the localhost facts.
type nodePortDests struct {
	local    bool
	prefixes []netip.Prefix
	other    []string
}

func (n nodePortDests) String() string {
	var parts []string
	if n.local {
		parts = append(parts, "every local address")
	}
	for _, p := range n.prefixes {
		parts = append(parts, "local addresses in "+p.String())
	}
	parts = append(parts, n.other...)
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// sameNodePorts: the same destinations. iptables lists the node's
// addresses within --nodeport-addresses, ours matches the CIDRs: equal
// when each listed address is in a CIDR and each CIDR holds one.
func sameNodePorts(theirs, ours nodePortDests) bool {
	if theirs.local != ours.local || !slices.Equal(theirs.other, ours.other) {
		return false
	}
	for _, a := range theirs.prefixes {
		if !slices.ContainsFunc(ours.prefixes, func(p netip.Prefix) bool { return p.Overlaps(a) }) {
			return false
		}
	}
	for _, p := range ours.prefixes {
		if !slices.ContainsFunc(theirs.prefixes, func(a netip.Prefix) bool { return p.Overlaps(a) }) {
			return false
		}
	}
	return true
}

// iptChainRoles: what a filter hook's jump to a kube-proxy chain does.
var iptChainRoles = map[string]string{
	"KUBE-PROXY-FIREWALL":    roleFirewall,
	"KUBE-FORWARD":           "KUBE-FORWARD",
	"KUBE-SERVICES":          roleNoEPCluster,
	"KUBE-EXTERNAL-SERVICES": roleNoEPExternal,
	"KUBE-NODEPORTS":         roleHealthChecks,
}

// Per-chain rules compared one by one, in order.
var orderedChains = map[string][]string{
	"nat":    {"KUBE-MARK-MASQ", "KUBE-POSTROUTING"},
	"filter": {"KUBE-FORWARD"},
}

// readGlobalIPT reads iptables' node-wide rules.
func readGlobalIPT(d *iptsave.Dump) globalFacts {
	var g globalFacts
	for _, name := range []string{"mangle", "nat", "filter"} {
		if t := d.Tables[name]; t != nil && t.Has("KUBE-PROXY-CANARY") {
			g.canary = append(g.canary, name)
		}
	}
	if nat := d.Tables["nat"]; nat != nil {
		for _, hook := range []string{"PREROUTING", "OUTPUT", "POSTROUTING"} {
			for _, r := range nat.Rules[hook] {
				if isKubeProxyChain(r.Target) {
					g.facts = append(g.facts, fmt.Sprintf("nat %s: %s", hook, g.iptGlobalRule(r, r.Target)))
				}
			}
		}
		for _, r := range nat.Rules["KUBE-SERVICES"] {
			if r.Target == "KUBE-NODEPORTS" {
				g.iptNodePortTail(r, d.IPv6)
			}
		}
	}
	if filter := d.Tables["filter"]; filter != nil {
		for _, hook := range []string{"INPUT", "FORWARD", "OUTPUT"} {
			for _, r := range filter.Rules[hook] {
				if role, ok := iptChainRoles[r.Target]; ok {
					g.facts = append(g.facts, fmt.Sprintf("filter %s: %s", hook, g.iptGlobalRule(r, role)))
				}
			}
		}
		g.firewallRules = len(filter.Rules[localnetChain]) > 0
	}
	for table, chains := range orderedChains {
		t := d.Tables[table]
		if t == nil {
			continue
		}
		for _, c := range chains {
			for i, r := range t.Rules[c] {
				g.facts = append(g.facts, fmt.Sprintf("%s #%d: %s", c, i+1, g.iptGlobalRule(r, "")))
			}
		}
	}
	return g
}

func isKubeProxyChain(name string) bool {
	return name == "KUBE-SERVICES" || name == "KUBE-POSTROUTING"
}

// iptNodePortTail reads a KUBE-SERVICES -> KUBE-NODEPORTS rule.
func (g *globalFacts) iptNodePortTail(r *iptsave.Rule, ipv6 bool) {
	rest := *r
	rest.Comment, rest.Target = "", ""
	if rest.Dst.Negate && rest.Dst.Prefix.Contains(loopbackAddr[ipv6]) {
		rest.Dst = iptsave.Match{} // the localhost facts' part
	}
	local := rest.DstType == "LOCAL"
	rest.DstType = ""
	switch {
	case local && !rest.Dst.Valid():
		g.nodePorts.local = true
	case !local && rest.Dst.Valid() && !rest.Dst.Negate:
		if !rest.Dst.Prefix.Contains(loopbackAddr[ipv6]) {
			g.nodePorts.prefixes = append(g.nodePorts.prefixes, rest.Dst.Prefix)
		}
	default:
		g.nodePorts.other = append(g.nodePorts.other, r.Line)
		return
	}
	rest.Dst = iptsave.Match{}
	if c := g.iptConds(&rest); len(c) > 0 {
		g.nodePorts.other = append(g.nodePorts.other, r.Line)
	}
}

// iptGlobalRule reads a node-wide rule; target, when given, names where
// its jump leads.
func (g *globalFacts) iptGlobalRule(r *iptsave.Rule, target string) string {
	conds := g.iptConds(r)
	action := target
	switch {
	case target != "":
	case r.Target == "MARK" && r.SetXMark != nil:
		action = markAction(r.SetXMark.Value, r.SetXMark.Mask)
	case r.Target == "MASQUERADE" && r.RandomFully:
		action = "masquerade fully-random"
	case r.Target == "MASQUERADE":
		action = "masquerade"
	case r.Target == "REJECT":
		action = "reject"
	default:
		action = strings.ToLower(r.Target)
		if r.Target == "" {
			action = "nothing"
		}
	}
	return globalText(conds, action)
}

func globalText(conds []string, action string) string {
	sort.Strings(conds)
	if len(conds) == 0 {
		return "-> " + action
	}
	return strings.Join(conds, " ") + " -> " + action
}

func markAction(value, mask uint32) string {
	switch {
	case value == mask:
		return fmt.Sprintf("mark |= %#x", value)
	case mask == 0:
		return fmt.Sprintf("mark ^= %#x", value)
	}
	return fmt.Sprintf("mark = mark & ^%#x ^ %#x", mask, value)
}

// iptConds are a rule's matches; nfacct counters are noted, not matches.
func (g *globalFacts) iptConds(r *iptsave.Rule) []string {
	var conds []string
	for field, m := range map[string]iptsave.Match{"saddr": r.Src, "daddr": r.Dst} {
		if m.Valid() {
			op := ""
			if m.Negate {
				op = "!= "
			}
			conds = append(conds, field+" "+op+m.Prefix.String())
		}
	}
	if r.Proto != "" {
		conds = append(conds, "proto "+r.Proto)
	}
	if r.Dport != 0 {
		conds = append(conds, fmt.Sprintf("dport %d", r.Dport))
	}
	if r.InIface != "" {
		conds = append(conds, "iifname "+r.InIface)
	}
	for field, typ := range map[string]string{"saddr": r.SrcType, "daddr": r.DstType} {
		if typ != "" {
			conds = append(conds, field+" type "+strings.ToLower(typ))
		}
	}
	if r.CtState != "" {
		conds = append(conds, "ct state "+strings.ToLower(ctStates(r.CtState)))
	}
	if m := r.Mark; m != nil {
		conds = append(conds, markCond(m.Value, m.Mask, m.Negate))
	}
	if r.Probability > 0 || r.Recent != nil || r.ToDestination != "" {
		conds = append(conds, "iptables "+r.Line)
	}
	other, counters := withoutCounters(r.Other)
	g.counters = append(g.counters, counters...)
	if len(other) > 0 {
		conds = append(conds, "iptables "+strings.Join(other, " "))
	}
	return conds
}

func markCond(value, mask uint32, negate bool) string {
	switch {
	case value == mask && !negate, value == 0 && negate:
		return fmt.Sprintf("mark %#x set", mask)
	case value == mask && negate, value == 0 && !negate:
		return fmt.Sprintf("mark %#x clear", mask)
	}
	return fmt.Sprintf("mark %#x/%#x negate=%v", value, mask, negate)
}

// withoutCounters takes `-m nfacct --nfacct-name NAME` out of a rule's
// other options and returns the names.
func withoutCounters(other []string) (rest, counters []string) {
	for i := 0; i < len(other); i++ {
		if other[i] == "-m" && i+1 < len(other) && other[i+1] == "nfacct" {
			i++
			continue
		}
		if other[i] == "--nfacct-name" && i+1 < len(other) {
			counters = append(counters, other[i+1])
			i++
			continue
		}
		rest = append(rest, other[i])
	}
	return rest, counters
}

// ourHookNames: our base chains, named as iptables' hooks; filter
// prerouting stands for iptables' input and forward.
var ourHookNames = map[string][]string{
	"nat-prerouting":         {"nat PREROUTING"},
	"nat-output":             {"nat OUTPUT"},
	"nat-postrouting":        {"nat POSTROUTING"},
	"filter-prerouting":      {"filter INPUT", "filter FORWARD"},
	"filter-output-pre-dnat": {"filter OUTPUT"},
	"filter-input":           {"filter INPUT"},
	"filter-forward":         {"filter FORWARD"},
	"filter-output":          {"filter OUTPUT"},
}

// ourJumpRoles: what our hooks' jumps do, as iptables' roles. Our
// KUBE-EXTERNAL-SERVICES holds the cluster IPs' checks too; they are
// not counted for input, where a cluster IP never arrives.
func ourJumpRoles(hook, chain string) []string {
	switch chain {
	case "KUBE-PROXY-FIREWALL":
		return []string{roleFirewall}
	case "KUBE-EXTERNAL-SERVICES":
		if hook == "filter INPUT" {
			return []string{roleNoEPExternal}
		}
		return []string{roleNoEPCluster, roleNoEPExternal}
	case localnetChain:
		return nil // localhost.go
	}
	return []string{chain}
}

// readGlobalOurs reads our main table's node-wide rules (the delta and
// affinity tables hold no node-wide rules of their own).
func readGlobalOurs(f nftlib.Family, rs *nftlib.Ruleset) globalFacts {
	var g globalFacts
	for _, t := range rs.Tables {
		if t.Family != f || t.Secondary {
			continue
		}
		for _, c := range t.Chains {
			if hooks, ok := ourHookNames[c.Name]; ok {
				g.ourHookRules(f, hooks, c)
			}
		}
		for _, chains := range orderedChains {
			for _, name := range chains {
				if c := t.Chain(name); c != nil {
					for i, r := range c.Rules {
						g.facts = append(g.facts, fmt.Sprintf("%s #%d: %s", name, i+1, ourGlobalRule(f, r, "")))
					}
				}
			}
		}
		if c := t.Chain("KUBE-SERVICES"); c != nil {
			for _, r := range c.Rules {
				if hasVerdictChain(r, "KUBE-NODEPORTS") {
					g.ourNodePortTail(f, r)
				}
			}
		}
		if c := t.Chain(localnetChain); c != nil {
			g.firewallRules = len(c.Rules) > 0
		}
	}
	return g
}

func (g *globalFacts) ourHookRules(f nftlib.Family, hooks []string, c *nftlib.Chain) {
	for _, r := range c.Rules {
		chain := ""
		for _, term := range r.Terms {
			if v, ok := term.(nftlib.Verdict); ok && v.Chain != "" {
				chain = v.Chain
			}
		}
		if chain == "" {
			g.unread = append(g.unread, fmt.Sprintf("%s: %s", c.Name, r.Text(f)))
			continue
		}
		for _, hook := range hooks {
			for _, role := range ourJumpRoles(hook, chain) {
				g.facts = append(g.facts, fmt.Sprintf("%s: %s", hook, ourGlobalRule(f, r, role)))
			}
		}
	}
}

// ourNodePortTail reads our KUBE-SERVICES -> KUBE-NODEPORTS rule.
func (g *globalFacts) ourNodePortTail(f nftlib.Family, r nftlib.Rule) {
	lo := loopbackAddr[f == nftlib.IPv6]
	local, other := false, false
	var within []netip.Prefix
	for _, term := range r.Terms {
		switch t := term.(type) {
		case nftlib.FibLocal:
			local = local || !t.Saddr
		case nftlib.AddrMatch:
			switch {
			case t.Field == nftlib.FieldDaddr && t.Negate && t.Prefix.Contains(lo):
			case t.Field == nftlib.FieldDaddr && !t.Negate:
				if !t.Prefix.Contains(lo) {
					within = append(within, t.Prefix)
				}
			default:
				other = true
			}
		case nftlib.Verdict:
		default:
			other = true
		}
	}
	switch {
	case other || !local:
		g.nodePorts.other = append(g.nodePorts.other, r.Text(f))
	case len(within) == 0:
		g.nodePorts.local = true
	default:
		g.nodePorts.prefixes = append(g.nodePorts.prefixes, within...)
	}
}

// ourGlobalRule reads one of our node-wide rules in iptables' terms.
func ourGlobalRule(f nftlib.Family, r nftlib.Rule, target string) string {
	var conds []string
	action := target
	for _, term := range r.Terms {
		switch t := term.(type) {
		case nftlib.CtState:
			conds = append(conds, nftlib.R(t).Text(f))
		case nftlib.MarkIsSet:
			conds = append(conds, markCond(t.Bit, t.Bit, false))
		case nftlib.MarkZero:
			conds = append(conds, markCond(t.Bit, t.Bit, true))
		case nftlib.MarkSet:
			if t.Toggle {
				action = markAction(t.Bit, 0)
			} else {
				action = markAction(t.Bit, t.Bit)
			}
		case nftlib.Masquerade:
			action = "masquerade fully-random"
		case nftlib.Verdict:
			if target == "" {
				action = verdictText(t)
			}
		default:
			conds = append(conds, "nft "+nftlib.R(t).Text(f))
		}
	}
	if action == "" {
		action = "nothing"
	}
	return globalText(conds, action)
}

// compareGlobal lists the node-wide differences, and the known ones that
// apply.
func compareGlobal(family string, theirs, ours globalFacts, localhost bool) (diffs, known []string) {
	ourFacts := slices.Clone(ours.facts)
	// The node's own connections to external IPs without endpoints: only
	// ours checks them (reported per Service port where it matters).
	outputExternal := "filter OUTPUT: ct state new -> " + roleNoEPExternal
	if !slices.Contains(theirs.facts, outputExternal) && slices.Contains(ourFacts, outputExternal) {
		ourFacts = slices.DeleteFunc(ourFacts, func(s string) bool { return s == outputExternal })
		known = append(known, KnownNodeToExternalNoEndpoints)
	}
	if slices.ContainsFunc(ourFacts, isClusterIPCheck) && !slices.ContainsFunc(theirs.facts, isClusterIPCheck) {
		ourFacts = slices.DeleteFunc(ourFacts, isClusterIPCheck)
		known = append(known, KnownClusterIPChecks)
	}
	theirFacts := slices.Clone(theirs.facts)
	if slices.ContainsFunc(theirFacts, isHealthCheckJump) {
		theirFacts = slices.DeleteFunc(theirFacts, isHealthCheckJump)
		known = append(known, KnownHealthCheckAccept+" (INPUT -> KUBE-NODEPORTS)")
	}
	onlyTheirs, onlyOurs := setDiff(theirFacts, ourFacts)
	for _, x := range onlyTheirs {
		diffs = append(diffs, fmt.Sprintf("%s: iptables has %s", family, x))
	}
	for _, x := range onlyOurs {
		diffs = append(diffs, fmt.Sprintf("%s: ours has %s", family, x))
	}
	if !sameNodePorts(theirs.nodePorts, ours.nodePorts) {
		diffs = append(diffs, fmt.Sprintf("%s: NodePorts (KUBE-SERVICES -> KUBE-NODEPORTS) answer on: iptables %s; ours %s (--nodeport-addresses)", family, theirs.nodePorts, ours.nodePorts))
	}
	for _, u := range append(slices.Clone(theirs.unread), ours.unread...) {
		diffs = append(diffs, fmt.Sprintf("%s: a rule diff does not understand: %s", family, u))
	}
	if c := slices.Compact(slices.Sorted(slices.Values(theirs.counters))); len(c) > 0 {
		known = append(known, KnownCounters+" ("+strings.Join(c, ", ")+")")
	}
	if len(theirs.canary) > 0 {
		known = append(known, KnownCanary+" (in "+strings.Join(theirs.canary, ", ")+")")
	}
	if theirs.firewallRules && !localhost {
		known = append(known, KnownKubeletFirewall)
	}
	for i := range known {
		known[i] = family + ": " + known[i]
	}
	return diffs, known
}

func isHealthCheckJump(fact string) bool { return strings.HasSuffix(fact, "-> "+roleHealthChecks) }

// isClusterIPCheck: a hook's jump to nftables mode's cluster-ips-check.
func isClusterIPCheck(fact string) bool { return strings.HasSuffix(fact, "-> cluster-ips-check") }
