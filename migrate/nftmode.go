package migrate

import (
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// Upstream's nftables mode names its per-service chains
// <role>-<hash>-<namespace>/<name>/<protocol>/<port> and keeps no chain per
// endpoint (but with session affinity): a policy chain DNATs with a numgen
// map. Its facts are read here in roles both sides share, so that the
// comparison is of where traffic goes, not of names.

// Roles of the per-service chains: upstream's prefixes and ours.
const (
	roleCluster  = "cluster endpoints"
	roleLocal    = "local endpoints"
	roleExternal = "external"
	roleFW       = "firewall"
	roleSEP      = "endpoint"
)

var upstreamRoles = map[string]string{"service-": roleCluster, "local-": roleLocal, "external-": roleExternal, "firewall-": roleFW, "endpoint-": roleSEP}

var ourRoles = map[string]string{"KUBE-SVC-": roleCluster, "KUBE-SVL-": roleLocal, "KUBE-EXT-": roleExternal, "KUBE-FW-": roleFW, "KUBE-SEP-": roleSEP}

func roleOf(chain string, roles map[string]string) string {
	for prefix, role := range roles {
		if strings.HasPrefix(chain, prefix) {
			return role
		}
	}
	return ""
}

// upstreamChain reads a per-service chain's name: its role and Service
// port (namespace/name:port, or namespace/name for a port without a name,
// and protocol).
var upstreamChain = regexp.MustCompile(`^(service|local|external|firewall|endpoint)-[A-Z0-9]+-([^/]+)/([^/]+)/([a-z]+)/([^_]*)`)

func upstreamKey(chain string, ipv6 bool) (Key, bool) {
	m := upstreamChain.FindStringSubmatch(chain)
	if m == nil {
		return Key{}, false
	}
	service := m[2] + "/" + m[3]
	if m[5] != "" { // a port without a name is the Service's alone
		service += ":" + m[5]
	}
	return Key{Service: service, Proto: m[4], IPv6: ipv6}, true
}

// modeFacts are one Service port's facts as both nftables modes can say
// them, by category (catDestinations, catEndpoints, catAffinity,
// catFirewall, catExternal), each sorted.
type modeFacts map[string][]string

func (f modeFacts) add(cat, format string, args ...any) {
	f[cat] = append(f[cat], fmt.Sprintf(format, args...))
}

// upstreamFacts reads a kube-proxy table's Service ports.
func upstreamFacts(t *nftTable) map[Key]modeFacts {
	out := map[Key]modeFacts{}
	get := func(k Key) modeFacts {
		if out[k] == nil {
			out[k] = modeFacts{}
		}
		return out[k]
	}
	for _, m := range []string{"service-ips", "service-nodeports", "no-endpoint-services", "no-endpoint-nodeports"} {
		for _, el := range t.elements[m] {
			dest, k, verdict, ok := upstreamEntry(el, t.ipv6)
			if !ok {
				get(Key{Service: "(unknown)", Proto: "?", IPv6: t.ipv6}).add(catOther, "%s element %s", m, strings.Join(el.key, " . "))
				continue
			}
			get(k).add(catDestinations, "%s -> %s", dest, verdict)
		}
	}
	for _, el := range t.elements["firewall-ips"] {
		chain := strings.TrimPrefix(el.value, "goto ")
		if k, ok := upstreamKey(chain, t.ipv6); ok && len(el.key) == 3 {
			get(k).add(catFirewall, "%s from %s", hostPortOf(el.key[0], el.key[2]), upstreamFirewall(t.chains[chain]))
		}
	}
	for name, rules := range t.chains {
		k, ok := upstreamKey(name, t.ipv6)
		if !ok {
			continue
		}
		switch role := roleOf(name, upstreamRoles); role {
		case roleCluster, roleLocal:
			upstreamPolicy(get(k), t, role, rules)
		case roleExternal:
			for i, r := range rules {
				get(k).add(catExternal, "#%d: %s", i+1, upstreamExternalRule(r))
			}
		}
	}
	return out
}

// upstreamEntry reads an element of service-ips, service-nodeports or the
// no-endpoint maps: its destination, Service port and verdict.
func upstreamEntry(el nftElement, ipv6 bool) (dest string, k Key, verdict string, ok bool) {
	switch len(el.key) {
	case 3:
		dest = hostPortOf(el.key[0], el.key[2])
	case 2:
		dest = "nodeport " + el.key[1]
	default:
		return "", k, "", false
	}
	proto := el.key[len(el.key)-2]
	switch chain, isGoto := strings.CutPrefix(el.value, "goto "); {
	case el.value == "goto reject-chain":
		verdict = "reject"
	case el.value == "drop":
		verdict = "drop"
	case isGoto:
		verdict = roleOf(chain, upstreamRoles)
		if k, ok = upstreamKey(chain, ipv6); !ok {
			return "", k, "", false
		}
		return dest, k, verdict, true
	default:
		verdict = el.value
	}
	if el.comment == "" {
		return "", k, "", false
	}
	return dest, Key{Service: serviceOf(el.comment), Proto: proto, IPv6: ipv6}, verdict, true
}

func hostPortOf(addr, port string) string {
	a, err := netip.ParseAddr(addr)
	p, perr := strconv.ParseUint(port, 10, 16)
	if err != nil || perr != nil {
		return addr + ":" + port
	}
	return netip.AddrPortFrom(a, uint16(p)).String()
}

var (
	dnatOne  = regexp.MustCompile(`dnat (?:ip6? )?to (\S+)$`)
	dnatMap  = regexp.MustCompile(`dnat (?:ip6? )?(?:addr \. port )?to numgen random mod (\d+) map \{ (.*) \}$`)
	jumpMap  = regexp.MustCompile(`^numgen random mod (\d+) vmap \{ (.*) \}$`)
	affinity = regexp.MustCompile(`^ip6? saddr @(\S+) goto (\S+)$`)
)

// upstreamPolicy reads a service- or local- chain: the endpoints its
// numgen picks (each 1/n), or with session affinity its endpoint chains.
func upstreamPolicy(f modeFacts, t *nftTable, role string, rules []string) {
	for _, r := range rules {
		switch {
		case dnatMap.MatchString(r):
			m := dnatMap.FindStringSubmatch(r)
			n, _ := strconv.Atoi(m[1])
			for _, el := range splitElements(m[2]) {
				_, target, _ := strings.Cut(el, " : ")
				addr, port, _ := strings.Cut(target, " . ")
				f.add(catEndpoints, "%s %s %s", role, hostPortOf(addr, port), percentOf(1/float64(n)))
			}
		case dnatOne.MatchString(r):
			f.add(catEndpoints, "%s %s %s", role, dnatOne.FindStringSubmatch(r)[1], percentOf(1))
		case jumpMap.MatchString(r):
			m := jumpMap.FindStringSubmatch(r)
			n, _ := strconv.Atoi(m[1])
			for _, el := range splitElements(m[2]) {
				_, target, _ := strings.Cut(el, " : goto ")
				f.add(catEndpoints, "%s %s %s", role, upstreamDNAT(t.chains[target]), percentOf(1/float64(n)))
			}
		case affinity.MatchString(r):
			m := affinity.FindStringSubmatch(r)
			f.add(catAffinity, "%s for %s", role, seconds(t.timeouts[m[1]]))
		default:
			f.add(catOther, "%s: %s", role, r)
		}
	}
}

// upstreamDNAT is where an endpoint chain DNATs to.
func upstreamDNAT(rules []string) string {
	for _, r := range rules {
		if m := dnatOne.FindStringSubmatch(r); m != nil {
			return m[1]
		}
	}
	return "?"
}

var saddrNotIn = regexp.MustCompile(`^ip6? saddr != \{ (.*) \} drop$`)

// upstreamFirewall reads a firewall- chain: "a, b; others drop".
func upstreamFirewall(rules []string) string {
	for _, r := range rules {
		if m := saddrNotIn.FindStringSubmatch(r); m != nil {
			var allowed []string
			for _, s := range splitElements(m[1]) {
				allowed = append(allowed, bareAddr(s))
			}
			sort.Strings(allowed)
			return strings.Join(allowed, ", ") + "; others drop"
		}
	}
	return "everyone; others go on"
}

// bareAddr writes a one-address prefix as the address, as nft does.
func bareAddr(s string) string {
	if p, err := netip.ParsePrefix(s); err == nil && p.IsSingleIP() {
		return p.Addr().String()
	}
	return s
}

var (
	upstreamCond = regexp.MustCompile(`^(?:ip6? )?(saddr|daddr)( != | )(\S+)`)
	fibLocal     = regexp.MustCompile(`^fib (saddr|daddr) type local`)
)

// upstreamExternalRule reads an external- chain's rule as "conditions ->
// outcome", in the words nftRule gives ours.
func upstreamExternalRule(r string) string {
	var conds []string
	rest := r
	for {
		if m := upstreamCond.FindStringSubmatch(rest); m != nil {
			op := strings.TrimSpace(m[2])
			if op != "" {
				op += " "
			}
			conds = append(conds, m[1]+" "+op+m[3])
			rest = strings.TrimSpace(rest[len(m[0]):])
			continue
		}
		if m := fibLocal.FindStringSubmatch(rest); m != nil {
			conds = append(conds, m[1]+" type local")
			rest = strings.TrimSpace(rest[len(m[0]):])
			continue
		}
		break
	}
	outcome := rest
	switch chain, ok := strings.CutPrefix(rest, "goto "); {
	case strings.Contains(rest, "mark set"):
		outcome = "masquerade"
	case ok:
		outcome = roleOf(chain, upstreamRoles)
	}
	return ruleText(conds, outcome)
}

func ruleText(conds []string, outcome string) string {
	sort.Strings(conds)
	when := "always"
	if len(conds) > 0 {
		when = strings.Join(conds, " ")
	}
	return when + " -> " + outcome
}

func percentOf(p float64) string { return strconv.FormatFloat(100*p, 'f', 2, 64) + "%" }

// ourModeFacts reads our view in the same words: each Service port's
// destinations, endpoints by policy, affinity, source ranges and
// external traffic.
func ourModeFacts(v *view) map[Key]modeFacts {
	out := map[Key]modeFacts{}
	get := func(k Key) modeFacts {
		if out[k] == nil {
			out[k] = modeFacts{}
		}
		return out[k]
	}
	for _, e := range v.entries {
		k := Key{Service: e.service, Proto: e.proto, IPv6: v.ipv6}
		dest := e.dest()
		if !e.addr.IsValid() && e.kind != "" { // a NodePort, on loopback too in iptables mode
			dest = e.kind + " " + dest
		}
		verdict := e.verdict
		if role := roleOf(e.verdict, ourRoles); role != "" {
			verdict = role
		}
		get(k).add(catDestinations, "%s -> %s", dest, verdict)
	}
	for _, fw := range v.firewalls {
		var allowed []string
		for _, s := range fw.allowed {
			allowed = append(allowed, bareAddr(s))
		}
		sort.Strings(allowed)
		get(Key{Service: fw.service, Proto: fw.proto, IPv6: v.ipv6}).add(catFirewall, "%s from %s; others %s",
			netip.AddrPortFrom(fw.addr, fw.port), strings.Join(allowed, ", "), fw.others)
	}
	for k, f := range v.facts() {
		mf := get(k)
		for chain, eps := range f.Endpoints {
			for _, ep := range eps {
				mf.add(catEndpoints, "%s %s %s", roleOf(chain, ourRoles), ep.Addr, percentOf(ep.Prob))
			}
		}
		for _, a := range f.Sets[catAffinity] {
			if chain, rest, ok := strings.Cut(a, " -> "); ok {
				_, timeout, _ := strings.Cut(rest, " for ")
				mf.add(catAffinity, "%s for %s", roleOf(chain, ourRoles), timeout)
			}
		}
	}
	keys := map[string]Key{} // the Service port each chain an entry names
	for _, e := range v.entries {
		keys[e.verdict] = Key{Service: e.service, Proto: e.proto, IPv6: v.ipv6}
	}
	for name, rules := range v.chains {
		k, ok := keys[name]
		if roleOf(name, ourRoles) != roleExternal || !ok {
			continue
		}
		for i, r := range rules {
			outcome := r.outcome()
			if role := roleOf(r.target, ourRoles); role != "" {
				outcome = role
			}
			get(k).add(catExternal, "#%d: %s", i+1, ruleText(slices.Clone(r.conds), outcome))
		}
	}
	return out
}

// CompareNFT compares a listing of kube-proxy's nftables mode with our
// ruleset, Service port by Service port, for the families it holds:
// destinations, endpoints and their chances, session affinity, source
// ranges and the routing of external traffic. Node-wide rules are not
// compared.
func CompareNFT(theirs *NFTRuleset, ours *nftlib.Ruleset) (*Report, error) {
	rep := &Report{}
	seen := map[bool]bool{}
	for _, t := range theirs.Tables {
		if seen[t.ipv6] {
			return nil, fmt.Errorf("two kube-proxy tables of the same IP family (IPv6: %v)", t.ipv6)
		}
		seen[t.ipv6] = true
		rep.Results = append(rep.Results, compareModeFacts(upstreamFacts(t), ourModeFacts(fromRuleset(ours, t.ipv6)))...)
	}
	sortResults(rep.Results)
	return rep, nil
}

// modeCategories are the categories compareModeFacts reports, in order.
var modeCategories = []string{catDestinations, catFirewall, catEndpoints, catAffinity, catExternal, catOther}

func compareModeFacts(theirs, ours map[Key]modeFacts) []Result {
	keys := map[Key]bool{}
	for k := range theirs {
		keys[k] = true
	}
	for k := range ours {
		keys[k] = true
	}
	var out []Result
	for k := range keys {
		res := Result{Key: k}
		a, b := theirs[k], ours[k]
		switch {
		case b == nil:
			res.Differences, b = []string{"only in the nft ruleset"}, modeFacts{}
		case a == nil:
			res.Differences, a = []string{"only in ours"}, modeFacts{}
		}
		for _, cat := range modeCategories {
			sort.Strings(a[cat])
			sort.Strings(b[cat])
			onlyTheirs, onlyOurs := setDiff(slices.Compact(a[cat]), slices.Compact(b[cat]))
			var parts []string
			if len(onlyTheirs) > 0 {
				parts = append(parts, "nft has "+strings.Join(onlyTheirs, ", "))
			}
			if len(onlyOurs) > 0 {
				parts = append(parts, "ours has "+strings.Join(onlyOurs, ", "))
			}
			if len(parts) > 0 {
				res.Differences = append(res.Differences, cat+": "+strings.Join(parts, "; "))
			}
		}
		out = append(out, res)
	}
	return out
}
