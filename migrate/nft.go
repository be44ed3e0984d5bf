package migrate

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// The maps of our tables (see nft/build.go) that say where Service
// addresses lead.
const (
	mapServiceIPs      = "service-ips"
	mapServicePorts    = "service-nodeports"
	mapNoEndpointIPs   = "no-endpoint-services"
	mapNoEndpointPorts = "no-endpoint-nodeports"
	mapFirewallIPs     = "firewall-ips"
)

// fromRuleset reads our tables of one family (main, delta and affinity:
// a Service port lives in one of them) into a view.
func fromRuleset(rs *nftlib.Ruleset, ipv6 bool) *view {
	f := nftlib.IPv4
	if ipv6 {
		f = nftlib.IPv6
	}
	v := &view{ipv6: ipv6, chains: map[string][]irRule{}}
	for _, t := range rs.Tables {
		if t.Family != f {
			continue
		}
		ids := map[uint32]string{}
		chains := t.AllChains()
		for _, c := range chains {
			if strings.HasPrefix(c.Name, "KUBE-SEP-") {
				ids[nftlib.StickyID(c.Name)] = c.Name
			}
		}
		for _, c := range chains {
			switch {
			case isServiceChain(c.Name):
				var rules []irRule
				for _, r := range c.Rules {
					rules = append(rules, nftRule(f, c.Name, r, ids))
				}
				v.chains[c.Name] = rules
			case c.Name == "KUBE-MARK-MASQ":
				for _, r := range c.Rules {
					for _, term := range r.Terms {
						if m, ok := term.(nftlib.MarkSet); ok && !m.Toggle {
							v.masqMark = m.Bit
						}
					}
				}
			case c.Name == "filter-output":
				for _, r := range c.Rules {
					for _, term := range r.Terms {
						if vd, ok := term.(nftlib.Verdict); ok && vd.Chain == "KUBE-EXTERNAL-SERVICES" {
							v.outputChecksExternal = true
						}
					}
				}
			}
		}
		v.readEntries(t)
		readLocalhostOurs(f, t, &v.localhost)
	}
	v.readOurFirewalls()
	v.global = readGlobalOurs(f, rs)
	v.addLocalhostNodePorts()
	sort.SliceStable(v.entries, func(i, j int) bool { return v.entries[i].service < v.entries[j].service })
	return v
}

func (v *view) readEntries(t *nftlib.Table) {
	for _, m := range []string{mapServiceIPs, mapServicePorts, mapNoEndpointIPs, mapNoEndpointPorts, mapFirewallIPs} {
		for _, el := range t.Elements(m) {
			service := serviceOf(el.Comment)
			if service == "" && el.Verdict.Chain != "" {
				if c := t.Chain(el.Verdict.Chain); c != nil {
					service = serviceOf(c.Comment)
				}
			}
			e := entry{service: service, proto: nftlib.ProtoName(el.Key.Proto), port: el.Key.Port}
			switch m {
			case mapServiceIPs, mapNoEndpointIPs, mapFirewallIPs:
				e.addr = el.Key.Addr
			}
			switch m {
			case mapServiceIPs:
				e.kind = strings.TrimSpace(strings.TrimPrefix(el.Comment, service))
			case mapServicePorts, mapNoEndpointPorts:
				e.kind = "nodeport"
			}
			e.verdict = verdictText(el.Verdict)
			if m == mapFirewallIPs {
				v.firewalls = append(v.firewalls, firewall{service: e.service, proto: e.proto, addr: e.addr, port: e.port, chain: el.Verdict.Chain})
				continue
			}
			v.entries = append(v.entries, e)
		}
	}
}

// verdictText is where a map element leads: its chain, or for the
// no-endpoint maps what the filter does ("goto KUBE-REJECT" rejects).
func verdictText(vd nftlib.Verdict) string {
	switch vd.Kind {
	case nftlib.Drop:
		return "drop"
	case nftlib.Accept:
		return "accept"
	case nftlib.Return:
		return "return"
	}
	if vd.Chain == "KUBE-REJECT" {
		return "reject"
	}
	return vd.Chain
}

// readOurFirewalls reads our KUBE-FW chains: sources in a range return (the
// packet goes on to DNAT), the rest meets the final drop.
func (v *view) readOurFirewalls() {
	type fwChain struct {
		allowed []string
		others  string
	}
	read := map[string]*fwChain{} // a chain's rules are read once
	for i := range v.firewalls {
		fw := &v.firewalls[i]
		c := read[fw.chain]
		if c == nil {
			c = &fwChain{others: "go on"}
			for _, r := range v.chains[fw.chain] {
				if src, ok := onlySource(r); ok && r.action == "return" {
					c.allowed = append(c.allowed, src)
					continue
				}
				if len(r.conds) == 0 && r.prob == 1 && r.action != "" {
					c.others = r.outcome()
					break
				}
			}
			read[fw.chain] = c
		}
		fw.allowed, fw.others = c.allowed, c.others
	}
}

// nftRule reads one of our rules; ids maps affinity ids to endpoint chains.
func nftRule(f nftlib.Family, chain string, r nftlib.Rule, ids map[uint32]string) irRule {
	ir := irRule{prob: 1, text: r.Text(f)}
	for _, term := range r.Terms {
		switch t := term.(type) {
		case nftlib.AddrMatch:
			field := "saddr"
			if t.Field == nftlib.FieldDaddr {
				field = "daddr"
			}
			op := ""
			if t.Negate {
				op = "!= "
			}
			ir.conds = append(ir.conds, field+" "+op+t.Prefix.String())
		case nftlib.ProtoMatch:
			// Left out, as iptRule does.
		case nftlib.PortMatch:
			ir.conds = append(ir.conds, fmt.Sprintf("dport %d", t.Port))
		case nftlib.FibLocal:
			field := "daddr"
			if t.Saddr {
				field = "saddr"
			}
			ir.conds = append(ir.conds, field+" type local")
		case nftlib.IfName:
			op, name := "", t.Name
			if t.Negate {
				op = "!= "
			}
			if t.Prefix {
				name += "*"
			}
			ir.conds = append(ir.conds, "iifname "+op+name)
		case nftlib.CtState:
			ir.conds = append(ir.conds, nftlib.R(t).Text(f))
		case nftlib.NumgenZero:
			ir.prob = 1 / float64(t.Mod)
		case nftlib.StickyMatch:
			ir.affinityCheck = ids[t.ID]
			if ir.affinityCheck == "" {
				ir.conds = append(ir.conds, fmt.Sprintf("affinity to unknown endpoint id %d", t.ID))
			}
		case nftlib.StickyUpdate:
			ir.affinitySet = true
			ir.affinitySetSeconds = int(t.Timeout / time.Second)
			if nftlib.StickyID(chain) != t.ID {
				ir.conds = append(ir.conds, fmt.Sprintf("affinity update for another endpoint id %d", t.ID))
			}
		case nftlib.DNAT:
			ir.action, ir.dnat = "dnat", nftlib.R(t).Text(f)[len("dnat to "):]
		case nftlib.Reject:
			ir.action = "reject"
		case nftlib.Verdict:
			switch {
			case t.Chain == "KUBE-MARK-MASQ":
				ir.action = "masquerade"
			case t.Chain != "":
				ir.action, ir.target = "goto", t.Chain
			default:
				ir.action = verdictText(t)
			}
		default:
			ir.conds = append(ir.conds, "nft "+nftlib.R(t).Text(f))
		}
	}
	sort.Strings(ir.conds)
	return ir
}
