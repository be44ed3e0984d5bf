// Package migrate compares what kube-proxy's iptables mode programmed (an
// iptables-save dump) with what kube-nftproxy programs (its Ruleset, live or
// rendered), Service port by Service port, so that a node can be switched
// over knowing nothing changes for its Services.
//
// Both sides are first read into one small vocabulary (a view: where each
// Service address leads, and the per-service chains as lists of conditions
// and actions), then each Service port's facts are drawn from its view the
// same way: destinations, chains, endpoints and their probabilities,
// masquerading, source ranges, session affinity, external traffic routing.
// What differs only in form (maps instead of rule lists, numgen instead of
// statistic, comments) is gone by then.
package migrate

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strings"
)

// view is one side (iptables or ours) of one IP family, in the common
// vocabulary.
type view struct {
	ipv6 bool
	// chains are the per-service chains (KUBE-SVC-, SVL-, EXT-, FW-, SEP-).
	chains map[string][]irRule
	// entries are where each Service address and NodePort leads.
	entries []entry
	// firewalls are the load balancer IPs with source ranges.
	firewalls []firewall
	// outputChecksExternal: the node's own new connections meet the
	// no-endpoint check of external and load balancer IPs.
	outputChecksExternal bool
	// masqMark is the bit KUBE-MARK-MASQ sets (0: not found).
	masqMark uint32
	// localhost: NodePorts on loopback and their guard (localhost.go).
	localhost localhostFacts
	// global: the node-wide rules (global.go).
	global globalFacts
	// healthChecks: iptables' accepted health check node ports, by
	// Service port (ours writes none).
	healthChecks map[string][]uint16
	// dnats and affinitySets are, by endpoint chain, its first DNAT's
	// target and its first affinity update's timeout (see indexChains).
	dnats        map[string]string
	affinitySets map[string]int
}

// entry is one way into a Service port: its cluster IP, an external or
// load balancer IP, or its NodePort, and where that leads.
type entry struct {
	service, proto string
	kind           string // "cluster IP", "external IP", "loadbalancer IP", "nodeport", or "" (a no-endpoint check, which names only the address)
	addr           netip.Addr
	port           uint16
	verdict        string // a chain, "reject" or "drop"
	// external marks iptables mode's checks in KUBE-EXTERNAL-SERVICES
	// (external and load balancer IPs without endpoints).
	external bool
}

func (e entry) dest() string {
	if !e.addr.IsValid() {
		return fmt.Sprintf("%d", e.port)
	}
	return netip.AddrPortFrom(e.addr, e.port).String()
}

// firewall is a load balancer IP whose sources are checked.
type firewall struct {
	service, proto string
	addr           netip.Addr
	port           uint16
	chain          string
	allowed        []string // source prefixes let through
	others         string   // what happens to other sources ("drop", ...)
}

// irRule is one rule of a per-service chain.
type irRule struct {
	conds []string // sorted: "saddr != 10.244.0.0/16", "daddr 10.96.0.1/32", "dport 80", "saddr local", ...
	prob  float64  // chance a random match passes; 1 when the rule has none
	// affinityCheck is the endpoint chain a client must have affinity to
	// for the rule to match; affinitySeconds its timeout where the rule says.
	affinityCheck   string
	affinitySeconds int
	// affinitySet: the rule (re)starts the client's affinity to this
	// endpoint chain, for affinitySetSeconds where it says.
	affinitySet        bool
	affinitySetSeconds int
	action             string // "masquerade", "goto", "dnat", "drop", "reject", "return", "accept", "" (nothing)
	target             string // goto's chain
	dnat               string // dnat's ip:port
	text               string // the rule as written, for messages
}

func (r irRule) when() string {
	if len(r.conds) == 0 {
		return "always"
	}
	return strings.Join(r.conds, " ")
}

// Per-service chain prefixes: iptables mode's, which ours keeps.
var serviceChainPrefixes = []string{"KUBE-SVC-", "KUBE-SVL-", "KUBE-EXT-", "KUBE-FW-", "KUBE-SEP-"}

func isServiceChain(name string) bool {
	for _, p := range serviceChainPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// serviceOf is the Service port a comment names: its first word.
func serviceOf(comment string) string {
	s, _, _ := strings.Cut(strings.TrimSpace(comment), " ")
	return s
}

// Key names a Service port of one family.
type Key struct {
	Service string // namespace/name:port, as iptables mode's comments
	Proto   string // tcp, udp, sctp
	IPv6    bool
}

func (k Key) String() string {
	s := k.Service + " " + k.Proto
	if k.IPv6 {
		s += " (IPv6)"
	}
	return s
}

// Endpoint is one endpoint a policy chain picks, with its probability.
type Endpoint struct {
	Chain string  // KUBE-SEP-...
	Addr  string  // its DNAT target, ip:port
	Prob  float64 // chance a new connection without affinity gets it
}

// Facts are what one Service port does, in terms both sides share.
type Facts struct {
	Key
	// Sets holds each category's facts, sorted.
	Sets map[string][]string
	// Endpoints by policy chain (KUBE-SVC-, KUBE-SVL-), in rule order.
	Endpoints map[string][]Endpoint
	// externalRejects are external/LB addresses rejected for lack of
	// endpoints (iptables mode's KUBE-EXTERNAL-SERVICES).
	externalRejects []string
	// healthChecks are the health check node ports iptables accepts.
	healthChecks []uint16
	// rejects are load balancer addresses rejected for lack of endpoints.
	rejects map[string]bool
}

// Categories, in the order differences are reported.
const (
	catDestinations = "destinations"
	catChains       = "chains"
	catFirewall     = "source ranges"
	catEndpoints    = "endpoints"
	catAffinity     = "session affinity"
	catMasquerade   = "masquerade"
	catExternal     = "external traffic"
	catOther        = "other rules"
)

var categories = []string{catDestinations, catChains, catFirewall, catEndpoints, catAffinity, catMasquerade, catExternal, catOther}

func (f *Facts) add(cat, format string, args ...any) {
	f.Sets[cat] = append(f.Sets[cat], fmt.Sprintf(format, args...))
}

// facts draws every Service port's facts from a view.
func (v *view) facts() map[Key]*Facts {
	out := map[Key]*Facts{}
	get := func(service, proto string) *Facts {
		k := Key{Service: service, Proto: proto, IPv6: v.ipv6}
		f := out[k]
		if f == nil {
			f = &Facts{Key: k, Sets: map[string][]string{}, Endpoints: map[string][]Endpoint{}, rejects: map[string]bool{}}
			out[k] = f
		}
		return f
	}
	roots := map[Key][]string{}
	for _, e := range v.entries {
		f := get(e.service, e.proto)
		kind := e.kind
		if kind != "" {
			kind += " "
		}
		f.add(catDestinations, "%s%s -> %s", kind, e.dest(), e.verdict)
		if isServiceChain(e.verdict) {
			roots[f.Key] = append(roots[f.Key], e.verdict)
		}
		if e.verdict == "reject" {
			f.rejects[e.dest()] = true
			if e.external {
				f.externalRejects = append(f.externalRejects, e.dest())
			}
		}
	}
	for svc, ports := range v.healthChecks {
		found := false
		for k, f := range out {
			if k.Service == svc {
				f.healthChecks, found = ports, true
			}
		}
		if !found { // a Service port with no other rule: say so
			get(svc, "tcp").healthChecks = ports
		}
	}
	// A firewall chain's sources are spelled out for the first Service
	// port that leads to it, as its other chains (see chainFacts).
	fwOwners := map[string]Key{}
	for _, fw := range v.firewalls {
		f := get(fw.service, fw.proto)
		allowed := "the sources of " + fw.chain
		if owner, ok := fwOwners[fw.chain]; !ok || owner == f.Key {
			fwOwners[fw.chain] = f.Key
			allowed = strings.Join(fw.allowed, ", ")
		}
		f.add(catFirewall, "%s from %s; others %s", netip.AddrPortFrom(fw.addr, fw.port), allowed, fw.others)
		roots[f.Key] = append(roots[f.Key], fw.chain)
	}
	v.indexChains()
	owners := map[string]Key{}
	for _, k := range slices.SortedFunc(maps.Keys(roots), compareKeys) {
		v.chainFacts(out[k], roots[k], owners)
	}
	for _, f := range out {
		for c := range f.Sets {
			sort.Strings(f.Sets[c])
			f.Sets[c] = slices.Compact(f.Sets[c])
		}
	}
	return out
}

// compareKeys orders Service ports: IPv4 first, then by name and protocol.
func compareKeys(a, b Key) int {
	if a.IPv6 != b.IPv6 {
		if a.IPv6 {
			return 1
		}
		return -1
	}
	return cmp.Or(strings.Compare(a.Service, b.Service), strings.Compare(a.Proto, b.Proto))
}

// indexChains notes, once for all, what each endpoint chain DNATs to and
// how long the affinity it records lasts: a policy chain's rules look them
// up (a lookup scanning the chain's rules would cost rules x rules).
func (v *view) indexChains() {
	v.dnats, v.affinitySets = map[string]string{}, map[string]int{}
	for name, rules := range v.chains {
		for _, r := range rules {
			if _, ok := v.dnats[name]; !ok && r.action == "dnat" {
				v.dnats[name] = r.dnat
			}
			if _, ok := v.affinitySets[name]; !ok && r.affinitySet {
				v.affinitySets[name] = r.affinitySetSeconds
			}
		}
	}
}

// chainFacts walks the Service port's chains from its entries. Each chain
// is read once, for the first Service port (in key order) that reaches it
// (owners): kube-proxy gives every Service port chains of its own, so that
// another Service port reaching it is a difference, said as such. Reading
// it again for each would make a dump whose Service ports all lead to one
// chain cost Service ports x chains.
func (v *view) chainFacts(f *Facts, roots []string, owners map[string]Key) {
	queue := slices.Clone(roots)
	for len(queue) > 0 {
		name := queue[0]
		queue = queue[1:]
		if owner, ok := owners[name]; ok {
			if owner != f.Key {
				f.add(catChains, "%s (reached from %s too)", name, owner)
			}
			continue
		}
		owners[name] = f.Key
		rules, ok := v.chains[name]
		if !ok {
			f.add(catChains, "%s (missing)", name)
			continue
		}
		f.add(catChains, "%s", name)
		for _, r := range rules {
			for _, t := range []string{r.target, r.affinityCheck} {
				if owner, seen := owners[t]; isServiceChain(t) && (!seen || owner != f.Key) {
					queue = append(queue, t)
				}
			}
		}
		switch {
		case strings.HasPrefix(name, "KUBE-SVC-"), strings.HasPrefix(name, "KUBE-SVL-"):
			v.policyFacts(f, name, rules)
		case strings.HasPrefix(name, "KUBE-SEP-"):
			v.endpointFacts(f, name, rules)
		case strings.HasPrefix(name, "KUBE-EXT-"):
			for i, r := range rules {
				f.add(catExternal, "%s #%d: %s -> %s", name, i+1, r.when(), r.outcome())
			}
		}
		// KUBE-FW chains were read into the firewall facts already.
	}
}

func (r irRule) outcome() string {
	switch r.action {
	case "goto":
		return r.target
	case "dnat":
		return "dnat " + r.dnat
	case "":
		return "nothing"
	}
	return r.action
}

// policyFacts reads a KUBE-SVC/KUBE-SVL chain: masquerade marks, affinity
// checks, then the random choice among endpoints.
func (v *view) policyFacts(f *Facts, name string, rules []irRule) {
	left := 1.0
	for _, r := range rules {
		switch {
		case r.action == "masquerade" && r.prob == 1 && r.affinityCheck == "":
			f.add(catMasquerade, "%s when %s", name, r.when())
		case r.affinityCheck != "" && r.action == "goto" && r.target == r.affinityCheck && len(r.conds) == 0:
			f.add(catAffinity, "%s -> %s for %s", name, r.target, seconds(v.affinityTimeout(r)))
		case r.action == "goto" && strings.HasPrefix(r.target, "KUBE-SEP-") && len(r.conds) == 0 && r.affinityCheck == "":
			p := left * r.prob
			left -= p
			f.Endpoints[name] = append(f.Endpoints[name], Endpoint{Chain: r.target, Addr: v.dnatOf(r.target), Prob: p})
		default:
			f.add(catOther, "%s: %s", name, r.text)
		}
	}
}

// affinityTimeout is how long a check's affinity lasts: the check's own
// seconds (iptables' --rcheck --seconds), else the endpoint chain's update.
func (v *view) affinityTimeout(check irRule) int {
	if check.affinitySeconds > 0 {
		return check.affinitySeconds
	}
	return v.affinitySets[check.affinityCheck]
}

func seconds(s int) string {
	if s == 0 {
		return "an unknown time"
	}
	return fmt.Sprintf("%ds", s)
}

// dnatOf is where an endpoint chain DNATs to.
func (v *view) dnatOf(sep string) string {
	if d, ok := v.dnats[sep]; ok {
		return d
	}
	return "?"
}

func (v *view) endpointFacts(f *Facts, name string, rules []irRule) {
	for _, r := range rules {
		switch {
		case r.action == "masquerade" && r.prob == 1:
			f.add(catMasquerade, "%s when %s", name, r.when())
		case r.action == "dnat" && len(r.conds) == 0 && r.prob == 1:
			if r.affinitySet {
				f.add(catAffinity, "%s records the client", name)
			}
		case r.action == "" && r.affinitySet && len(r.conds) == 0:
			f.add(catAffinity, "%s records the client", name)
		default:
			f.add(catOther, "%s: %s", name, r.text)
		}
	}
}
