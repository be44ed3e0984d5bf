package migrate

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"

	"github.com/kube-nftproxy/kube-nftproxy/iptsave"
)

// fromIPTables reads kube-proxy's rules of an iptables-save dump (its nat
// and filter tables) into a view.
func fromIPTables(d *iptsave.Dump) (*view, error) {
	v := &view{ipv6: d.IPv6, chains: map[string][]irRule{}}
	nat := d.Tables["nat"]
	if nat == nil {
		return nil, fmt.Errorf("the dump has no nat table")
	}
	filter := d.Tables["filter"]
	for _, name := range nat.Chains {
		if isServiceChain(name) {
			var rules []irRule
			for _, r := range nat.Rules[name] {
				rules = append(rules, iptRule(r))
			}
			v.chains[name] = rules
		}
	}
	for _, r := range nat.Rules["KUBE-MARK-MASQ"] {
		if r.Target == "MARK" && r.SetXMark != nil && r.SetXMark.Mask == r.SetXMark.Value {
			v.masqMark = r.SetXMark.Value
		}
	}
	// Where Service addresses lead.
	v.global = readGlobalIPT(d)
	for _, r := range nat.Rules["KUBE-SERVICES"] {
		switch {
		case r.Target == "KUBE-NODEPORTS": // the tail-call: global.go
		case !r.Dst.Valid() || r.Dst.Negate || r.Comment == "" || !isServiceChain(r.Target):
			v.global.unread = append(v.global.unread, "nat "+r.Line)
		default:
			e := entry{service: serviceOf(r.Comment), proto: r.Proto, addr: r.Dst.Prefix.Addr(), port: uint16(r.Dport), verdict: r.Target}
			e.kind = strings.TrimSpace(strings.TrimPrefix(r.Comment, e.service))
			v.entries = append(v.entries, e)
		}
	}
	for _, r := range nat.Rules["KUBE-NODEPORTS"] {
		e := entry{service: serviceOf(r.Comment), proto: r.Proto, kind: "nodeport", port: uint16(r.Dport), verdict: r.Target}
		switch {
		case r.Comment == "" || !isServiceChain(r.Target) || r.Dst.Valid() && r.Dst != (iptsave.Match{Prefix: ipv4Loopback}):
			v.global.unread = append(v.global.unread, "nat "+r.Line)
			continue
		case r.Dst.Valid(): // the localhost copy, which counts its packets
			e.kind = localhostNodePort
			_, counters := withoutCounters(r.Other)
			v.global.counters = append(v.global.counters, counters...)
		}
		v.entries = append(v.entries, e)
	}
	if filter != nil {
		// No endpoints: REJECT (none at all) or DROP (none local).
		for _, chain := range []string{"KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES"} {
			for _, r := range filter.Rules[chain] {
				if r.Target != "REJECT" && r.Target != "DROP" || r.Comment == "" || r.Dst.Negate {
					v.global.unread = append(v.global.unread, "filter "+r.Line)
					continue
				}
				e := entry{service: serviceOf(r.Comment), proto: r.Proto, port: uint16(r.Dport), verdict: strings.ToLower(r.Target)}
				switch {
				case r.Dst.Valid():
					e.addr = r.Dst.Prefix.Addr()
					e.external = chain == "KUBE-EXTERNAL-SERVICES"
				case r.DstType == "LOCAL":
					e.kind = "nodeport"
				default:
					v.global.unread = append(v.global.unread, "filter "+r.Line)
					continue
				}
				v.entries = append(v.entries, e)
			}
		}
		v.outputChecksExternal = jumpsTo(filter, "OUTPUT", "KUBE-EXTERNAL-SERVICES")
		v.readHealthChecks(filter)
	}
	v.readFirewalls(filter)
	v.localhost = readLocalhostIPT(d.IPv6, nat, filter)
	sort.SliceStable(v.entries, func(i, j int) bool { return v.entries[i].service < v.entries[j].service })
	return v, nil
}

// readHealthChecks reads filter KUBE-NODEPORTS: an ACCEPT of each
// health check node port.
func (v *view) readHealthChecks(filter *iptsave.Table) {
	v.healthChecks = map[string][]uint16{}
	for _, r := range filter.Rules["KUBE-NODEPORTS"] {
		service := serviceOf(r.Comment)
		if r.Target != "ACCEPT" || r.Proto != "tcp" || r.Dport == 0 || r.Dst.Valid() || r.Src.Valid() || r.DstType != "" || len(r.Other) > 0 ||
			strings.TrimSpace(strings.TrimPrefix(r.Comment, service)) != "health check node port" {
			v.global.unread = append(v.global.unread, "filter "+r.Line)
			continue
		}
		v.healthChecks[service] = append(v.healthChecks[service], uint16(r.Dport))
	}
}

func jumpsTo(t *iptsave.Table, from, to string) bool {
	for _, r := range t.Rules[from] {
		if r.Target == to {
			return true
		}
	}
	return false
}

// readFirewalls turns iptables mode's source ranges into firewall facts: a
// load balancer IP leads to KUBE-FW, whose rules send the allowed sources on
// to KUBE-EXT; others fall through un-DNATed and KUBE-PROXY-FIREWALL (filter)
// drops them. The entry is rewritten to lead where allowed sources go, as
// ours does (our KUBE-FW only filters).
func (v *view) readFirewalls(filter *iptsave.Table) {
	drops := map[string]*iptsave.Rule{} // by destination; nil once used
	if filter != nil {
		for _, r := range filter.Rules["KUBE-PROXY-FIREWALL"] {
			if r.Target != "DROP" || !r.Dst.Valid() || r.Dst.Negate || r.Src.Valid() {
				v.global.unread = append(v.global.unread, "filter "+r.Line)
				continue
			}
			drops[netip.AddrPortFrom(r.Dst.Prefix.Addr(), uint16(r.Dport)).String()+"/"+r.Proto] = r
		}
	}
	defer func() { // a drop of an address with no KUBE-FW chain
		for _, r := range drops {
			if r != nil {
				v.global.unread = append(v.global.unread, "filter "+r.Line)
			}
		}
	}()
	// A chain's rules are read once, however many addresses lead to it.
	type fwChain struct {
		allowed []string
		pass    string
	}
	read := map[string]*fwChain{}
	for i, e := range v.entries {
		if !strings.HasPrefix(e.verdict, "KUBE-FW-") {
			continue
		}
		c := read[e.verdict]
		if c == nil {
			c = &fwChain{}
			for _, r := range v.chains[e.verdict] {
				if src, ok := onlySource(r); r.action == "goto" && ok {
					c.allowed = append(c.allowed, src)
					c.pass = r.target
				}
			}
			read[e.verdict] = c
		}
		fw := firewall{service: e.service, proto: e.proto, addr: e.addr, port: e.port, chain: e.verdict, others: "go on un-DNATed", allowed: c.allowed}
		if _, ok := drops[e.dest()+"/"+e.proto]; ok {
			fw.others = "drop"
			drops[e.dest()+"/"+e.proto] = nil
		}
		if c.pass != "" {
			v.entries[i].verdict = c.pass
		}
		v.firewalls = append(v.firewalls, fw)
	}
}

// onlySource is the source prefix of a rule that matches nothing else.
func onlySource(r irRule) (string, bool) {
	if len(r.conds) != 1 || !strings.HasPrefix(r.conds[0], "saddr ") || strings.HasPrefix(r.conds[0], "saddr != ") || r.prob != 1 {
		return "", false
	}
	return strings.TrimPrefix(r.conds[0], "saddr "), true
}

// iptRule reads a rule of a per-service chain. The protocol match is left
// out: such a chain is only reached for its Service port's protocol, and
// iptables needs -p where ours needs none (or `meta l4proto`, before dnat).
func iptRule(r *iptsave.Rule) irRule {
	ir := irRule{prob: 1, text: r.Line}
	addr := func(field string, m iptsave.Match) {
		if !m.Valid() {
			return
		}
		op := ""
		if m.Negate {
			op = "!= "
		}
		ir.conds = append(ir.conds, field+" "+op+m.Prefix.String())
	}
	addr("saddr", r.Src)
	addr("daddr", r.Dst)
	if r.Dport != 0 {
		ir.conds = append(ir.conds, fmt.Sprintf("dport %d", r.Dport))
	}
	if r.InIface != "" {
		name, neg := strings.CutPrefix(r.InIface, "!")
		op := ""
		if neg {
			op = "!= "
		}
		ir.conds = append(ir.conds, "iifname "+op+strings.Replace(name, "+", "*", 1))
	}
	for field, t := range map[string]string{"saddr": r.SrcType, "daddr": r.DstType} {
		if t == "" {
			continue
		}
		typ, neg := strings.CutPrefix(t, "!")
		op := ""
		if neg {
			op = "!= "
		}
		ir.conds = append(ir.conds, field+" type "+op+strings.ToLower(typ))
	}
	if r.CtState != "" {
		ir.conds = append(ir.conds, "ct state "+strings.ToLower(r.CtState))
	}
	if r.Mark != nil {
		ir.conds = append(ir.conds, fmt.Sprintf("mark %#x/%#x negate=%v", r.Mark.Value, r.Mark.Mask, r.Mark.Negate))
	}
	for _, o := range r.Other {
		ir.conds = append(ir.conds, "iptables "+o)
	}
	if r.Probability > 0 {
		ir.prob = r.Probability
	}
	if r.Recent != nil {
		switch {
		case r.Recent.Check:
			ir.affinityCheck, ir.affinitySeconds = r.Recent.Name, r.Recent.Seconds
		case r.Recent.Set:
			ir.affinitySet = true
			if r.Recent.Name != r.Chain {
				ir.conds = append(ir.conds, "recent --set --name "+r.Recent.Name)
			}
		}
	}
	sort.Strings(ir.conds)
	switch r.Target {
	case "KUBE-MARK-MASQ":
		ir.action = "masquerade"
	case "DNAT":
		ir.action, ir.dnat = "dnat", r.ToDestination
	case "DROP", "REJECT", "RETURN", "ACCEPT":
		ir.action = strings.ToLower(r.Target)
	case "":
	default:
		ir.action, ir.target = "goto", r.Target
	}
	return ir
}
