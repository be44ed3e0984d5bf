package migrate

import (
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"

	"github.com/kube-nftproxy/kube-nftproxy/iptsave"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// Known differences between upstream's iptables and nftables modes, where
// ours follows upstream's nftables mode. diff reports them as equal, with
// the reason.
const (
	// KnownFirewallNoEndpoints: iptables mode builds KUBE-FW (and the
	// KUBE-PROXY-FIREWALL drop) only for Services with endpoints, so
	// without endpoints every source is rejected; nftables mode checks the
	// source ranges first, whether or not there are endpoints.
	KnownFirewallNoEndpoints = "loadBalancerSourceRanges without endpoints: iptables mode rejects every source; ours, like upstream's nftables mode, drops sources outside the ranges and rejects the others"
	// KnownNodeToExternalNoEndpoints: iptables mode checks external and
	// load balancer IPs without endpoints in INPUT and FORWARD only.
	KnownNodeToExternalNoEndpoints = "the node's own connections to external/LB IPs of a Service without endpoints: iptables mode lets them go on un-DNATed (KUBE-EXTERNAL-SERVICES is not in OUTPUT); ours, like upstream's nftables mode, rejects them"
)

// Result is the comparison of one Service port.
type Result struct {
	Key
	// Differences, one per category that differs; none when equal.
	Differences []string
	// Known are the known differences between the modes that apply.
	Known []string
}

// Equal reports whether the Service port does the same on both sides.
func (r Result) Equal() bool { return len(r.Differences) == 0 }

func (r Result) String() string {
	if r.Equal() {
		if len(r.Known) > 0 {
			return fmt.Sprintf("%s: equal (known difference: %s)", r.Key, strings.Join(r.Known, "; "))
		}
		return r.Key.String() + ": equal"
	}
	return fmt.Sprintf("%s: different: %s", r.Key, strings.Join(r.Differences, "; "))
}

// Report is the comparison of every Service port.
type Report struct {
	Results []Result
	// Node lists differences that concern no one Service port.
	Node []string
	// NodeKnown lists the known node-wide differences that apply.
	NodeKnown []string
	// Hints say what probably explains the differences.
	Hints []string
	// Likely say what probably explains the differences as a whole
	// (another proxy mode): printed "probably: ...".
	Likely []string
	// clusterCIDRs: off-cluster ranges only iptables masquerades from,
	// and how many Service ports differ by that alone (see hint.go).
	clusterCIDRs []string
	cidrOnly     int
}

// Equal reports whether everything is equal.
func (r *Report) Equal() bool {
	if len(r.Node) > 0 {
		return false
	}
	for _, res := range r.Results {
		if !res.Equal() {
			return false
		}
	}
	return true
}

// Write prints one line per Service port, the node-wide differences, and a
// summary.
func (r *Report) Write(w io.Writer) error {
	equal, known := 0, 0
	for _, res := range r.Results {
		if _, err := fmt.Fprintln(w, res); err != nil {
			return err
		}
		if res.Equal() {
			equal++
			if len(res.Known) > 0 {
				known++
			}
		}
	}
	for _, n := range r.NodeKnown {
		if _, err := fmt.Fprintf(w, "node: equal (known difference: %s)\n", n); err != nil {
			return err
		}
	}
	for _, n := range r.Node {
		if _, err := fmt.Fprintf(w, "node: different: %s\n", n); err != nil {
			return err
		}
	}
	for _, h := range r.Hints {
		if _, err := fmt.Fprintf(w, "probably missing: %s\n", h); err != nil {
			return err
		}
	}
	for _, l := range r.Likely {
		if _, err := fmt.Fprintf(w, "probably: %s\n", l); err != nil {
			return err
		}
	}
	_, err := fmt.Fprintf(w, "%d service ports: %d equal (%d with known differences), %d different", len(r.Results), equal, known, len(r.Results)-equal)
	if err == nil && len(r.Node) > 0 {
		_, err = fmt.Fprintf(w, "; %d node-wide differences", len(r.Node))
	}
	if err == nil {
		_, err = fmt.Fprintln(w)
	}
	return err
}

// Expect is what the rules should say that our ruleset does not hold:
// known where ours is rendered from a state (diff --state).
type Expect struct {
	// HealthCheckNodePorts by Service port ("namespace/name:port"): every
	// Service port with one (eTP Local); nil when not known.
	HealthCheckNodePorts map[string]uint16
}

// Compare compares iptables-save dumps (one per family at most) with our
// ruleset, for the families the dumps cover.
func Compare(dumps []*iptsave.Dump, ours *nftlib.Ruleset) (*Report, error) {
	return CompareWith(dumps, ours, Expect{})
}

// CompareWith is Compare with what is expected beyond our ruleset.
func CompareWith(dumps []*iptsave.Dump, ours *nftlib.Ruleset, want Expect) (*Report, error) {
	rep := &Report{}
	seen := map[bool]bool{}
	for _, d := range dumps {
		if seen[d.IPv6] {
			return nil, fmt.Errorf("two dumps of the same IP family (IPv6: %v)", d.IPv6)
		}
		seen[d.IPv6] = true
		theirs, err := fromIPTables(d)
		if err != nil {
			return nil, err
		}
		compareViews(rep, theirs, fromRuleset(ours, d.IPv6), want)
	}
	rep.hintClusterCIDR()
	sortResults(rep.Results)
	return rep, nil
}

// sortResults orders results as compareKeys does: IPv4 first, then by
// Service port and protocol.
func sortResults(rs []Result) {
	sort.Slice(rs, func(i, j int) bool { return compareKeys(rs[i].Key, rs[j].Key) < 0 })
}

func compareViews(rep *Report, theirs, ours *view, want Expect) {
	family := "IPv4"
	if theirs.ipv6 {
		family = "IPv6"
	}
	if theirs.masqMark != ours.masqMark {
		rep.Node = append(rep.Node, fmt.Sprintf("%s: KUBE-MARK-MASQ sets %#x in iptables, %#x in ours (--iptables-masquerade-bit)", family, theirs.masqMark, ours.masqMark))
	}
	rep.Node = append(rep.Node, compareLocalhost(family, theirs.localhost, ours.localhost)...)
	diffs, known := compareGlobal(family, theirs.global, ours.global, theirs.localhost.nodePorts && ours.localhost.nodePorts)
	if len(theirs.healthChecks) > 0 && !slices.ContainsFunc(theirs.global.facts, isHealthCheckJump) {
		diffs = append(diffs, family+": iptables accepts health check node ports in filter KUBE-NODEPORTS, but INPUT does not jump there")
	}
	if theirs.masqMark != ours.masqMark { // said above, with its flag
		diffs = slices.DeleteFunc(diffs, func(d string) bool { return strings.Contains(d, " KUBE-MARK-MASQ #") })
	}
	rep.Node = append(rep.Node, diffs...)
	rep.NodeKnown = append(rep.NodeKnown, known...)
	a, b := theirs.facts(), ours.facts()
	keys := map[Key]bool{}
	for k := range a {
		keys[k] = true
	}
	for k := range b {
		keys[k] = true
	}
	for k := range keys {
		res := Result{Key: k}
		switch fa, fb := a[k], b[k]; {
		case fb == nil:
			res.Differences = []string{"only in iptables-save"}
		case fa == nil:
			res.Differences = []string{"only in ours"}
		default:
			res.Known = explainKnown(fa, fb, theirs, ours)
			res.Differences = diffFacts(fa, fb)
			if d := diffHealthCheck(k, fa.healthChecks, want); d != "" {
				res.Differences = append(res.Differences, d)
			}
			rep.noteClusterCIDR(fa, fb, res.Differences)
		}
		rep.Results = append(rep.Results, res)
	}
}

// explainKnown removes from ours what the known differences explain, and
// says which applied.
func explainKnown(theirs, ours *Facts, tv, ov *view) []string {
	var known []string
	// Source ranges of a Service without endpoints: only ours checks them.
	if len(theirs.Sets[catFirewall]) == 0 && len(ours.Sets[catFirewall]) > 0 && len(theirs.Endpoints) == 0 && len(ours.Endpoints) == 0 {
		allRejected := true
		for _, fw := range ours.Sets[catFirewall] {
			dest, _, _ := strings.Cut(fw, " ")
			allRejected = allRejected && theirs.rejects[dest] && ours.rejects[dest]
		}
		if allRejected {
			delete(ours.Sets, catFirewall)
			ours.Sets[catChains] = slices.DeleteFunc(ours.Sets[catChains], func(c string) bool { return strings.HasPrefix(c, "KUBE-FW-") })
			known = append(known, KnownFirewallNoEndpoints)
		}
	}
	for _, p := range theirs.healthChecks {
		known = append(known, fmt.Sprintf("health check node port %d accepted by iptables in filter INPUT; ours writes no such rule", p))
	}
	if len(theirs.externalRejects) > 0 && !tv.outputChecksExternal && ov.outputChecksExternal {
		known = append(known, KnownNodeToExternalNoEndpoints+" ("+strings.Join(theirs.externalRejects, ", ")+")")
	}
	return known
}

// diffHealthCheck compares the health check node ports iptables accepts
// with the Service port's, where known.
func diffHealthCheck(k Key, accepted []uint16, want Expect) string {
	if want.HealthCheckNodePorts == nil {
		return ""
	}
	var w []uint16
	if p := want.HealthCheckNodePorts[k.Service]; p != 0 {
		w = []uint16{p}
	}
	if slices.Equal(accepted, w) {
		return ""
	}
	return fmt.Sprintf("health check node port: iptables accepts %v, the Service's is %v", ports(accepted), ports(w))
}

func ports(ps []uint16) string {
	if len(ps) == 0 {
		return "none"
	}
	return strings.Trim(fmt.Sprint(ps), "[]")
}

// diffFacts lists each category in which the two differ.
func diffFacts(theirs, ours *Facts) []string {
	var out []string
	for _, cat := range categories {
		if cat == catEndpoints {
			if d := diffEndpoints(theirs.Endpoints, ours.Endpoints); d != "" {
				out = append(out, d)
			}
			continue
		}
		onlyTheirs, onlyOurs := setDiff(theirs.Sets[cat], ours.Sets[cat])
		if len(onlyTheirs) == 0 && len(onlyOurs) == 0 {
			continue
		}
		var parts []string
		if len(onlyTheirs) > 0 {
			parts = append(parts, "iptables has "+strings.Join(onlyTheirs, ", "))
		}
		if len(onlyOurs) > 0 {
			parts = append(parts, "ours has "+strings.Join(onlyOurs, ", "))
		}
		out = append(out, cat+": "+strings.Join(parts, "; "))
	}
	return out
}

// setDiff returns what of a is not in b, and what of b is not in a, in
// their order; in time linear in their lengths, as a Service port with
// many endpoints has many facts.
func setDiff(a, b []string) (onlyA, onlyB []string) {
	return missingFrom(a, b), missingFrom(b, a)
}

func missingFrom(a, b []string) []string {
	in := make(map[string]bool, len(b))
	for _, x := range b {
		in[x] = true
	}
	var out []string
	for _, x := range a {
		if !in[x] {
			out = append(out, x)
		}
	}
	return out
}

// probTolerance absorbs iptables' rounding of --probability (2^-31 steps,
// printed with 11 decimals).
const probTolerance = 1e-6

// diffEndpoints compares each policy chain's endpoints and probabilities
// (the order of the rules does not matter, only what each endpoint gets).
func diffEndpoints(theirs, ours map[string][]Endpoint) string {
	names := append(slices.Collect(maps.Keys(theirs)), slices.Collect(maps.Keys(ours))...)
	slices.Sort(names)
	names = slices.Compact(names)
	var parts []string
	for _, c := range names {
		a, b := byChain(theirs[c]), byChain(ours[c])
		same := len(a) == len(b)
		for sep, ea := range a {
			eb, ok := b[sep]
			same = same && ok && ea.Addr == eb.Addr && math.Abs(ea.Prob-eb.Prob) < probTolerance
		}
		if !same {
			parts = append(parts, fmt.Sprintf("%s: iptables [%s], ours [%s]", c, endpointList(theirs[c]), endpointList(ours[c])))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return catEndpoints + ": " + strings.Join(parts, "; ")
}

func byChain(eps []Endpoint) map[string]Endpoint {
	m := map[string]Endpoint{}
	for _, e := range eps {
		if prev, ok := m[e.Chain]; ok { // the same endpoint twice: add up
			e.Prob += prev.Prob
		}
		m[e.Chain] = e
	}
	return m
}

func endpointList(eps []Endpoint) string {
	sorted := append([]Endpoint(nil), eps...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Addr < sorted[j].Addr })
	var s []string
	for _, e := range sorted {
		s = append(s, fmt.Sprintf("%s %.4g%%", e.Addr, 100*e.Prob))
	}
	return strings.Join(s, ", ")
}
