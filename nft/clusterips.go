package nft

import (
	"net/netip"
	"slices"

	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// Checks on ClusterIP traffic (Config.ClusterIPChecks), as upstream's
// nftables mode makes them. The filter chains at priority 0 run after
// DNAT and after every table's no-endpoint checks (the delta and affinity
// tables' chains run one and two priorities earlier, and the main table's
// own no-endpoint jump comes first in its chains): a new connection that
// still goes to a ClusterIP there was taken by no Service port, so it is
// to a port no Service defines and is rejected; one to any other address
// of a ServiceCIDR goes to an address no Service holds, and is dropped.
//
// The set holds one element per ClusterIP, while fragments are per
// service port and the ports of a Service share its ClusterIP. So the
// elements live in fragments of their own, keyed by address (see
// clusterIPKey), in the main table, which never move: the backend knows
// which service ports hold each address (clusterIPIndex), and a sync
// touches the element of an address only when a port it changes held it
// or holds it now. The element exists while any port holds the address.

// Names of the set and chain, upstream's.
const (
	setClusterIPs        = "cluster-ips"
	chainClusterIPsCheck = "cluster-ips-check"
)

// clusterIPKeyPrefix begins the fragment key of a ClusterIP's element: a
// space, which no service port's key (namespace/name:port) holds.
const clusterIPKeyPrefix = "cluster-ip "

// clusterIPKey is the key of the fragment that holds ip's element.
func clusterIPKey(ip netip.Addr) string { return clusterIPKeyPrefix + ip.String() }

// addClusterIPChecks gives a main table the set, the chain, and the jumps
// to it from the filter chains after DNAT (forward and output; traffic to
// a ClusterIP is not for this host's input).
func addClusterIPChecks(t *nftlib.Table) {
	t.Maps = append(t.Maps, &nftlib.Map{Name: setClusterIPs, Key: []nftlib.Field{nftlib.FieldDaddr}, Plain: true,
		Comment: "ClusterIPs of the Services"})
	t.Chains = append(t.Chains, &nftlib.Chain{Name: chainClusterIPsCheck, Rules: clusterIPsCheckRules(t.Family, nil)})
	for _, name := range []string{"filter-forward", "filter-output"} {
		c := t.FixedChain(name)
		c.Rules = append(c.Rules, nftlib.R(nftlib.CtState{Bits: nftlib.CtNew}, nftlib.JumpTo(chainClusterIPsCheck)))
	}
}

// clusterIPsCheckRules are the chain's rules: reject what goes to a
// ClusterIP, drop what goes elsewhere in a ServiceCIDR of family f (one
// rule per range; upstream writes one rule with an anonymous set).
func clusterIPsCheckRules(f nftlib.Family, cidrs []netip.Prefix) []nftlib.Rule {
	rules := []nftlib.Rule{nftlib.R(nftlib.SetMatch{Field: nftlib.FieldDaddr, Set: setClusterIPs}, nftlib.Reject{}).
		WithComment("reject traffic to ports of ClusterIPs no Service port defines")}
	for _, p := range familyPrefixes(f, cidrs) {
		rules = append(rules, nftlib.R(nftlib.AddrMatch{Field: nftlib.FieldDaddr, Prefix: p}, nftlib.Verdict{Kind: nftlib.Drop}).
			WithComment("drop traffic to addresses of ServiceCIDR "+p.String()+" no Service holds"))
	}
	return rules
}

// withServiceCIDRs is t with its cluster-ips-check chain dropping traffic
// to the cidrs: a copy (sharing the rest), or t itself when it has no such
// chain.
func withServiceCIDRs(t *nftlib.Table, cidrs []netip.Prefix) *nftlib.Table {
	i := slices.IndexFunc(t.Chains, func(c *nftlib.Chain) bool { return c.Name == chainClusterIPsCheck })
	if i < 0 {
		return t
	}
	c := *t
	c.Chains = slices.Clone(t.Chains)
	c.Chains[i] = &nftlib.Chain{Name: chainClusterIPsCheck, Rules: clusterIPsCheckRules(t.Family, cidrs)}
	return &c
}

// clusterIPIndex holds, per ClusterIP, the service ports that hold it, in
// the order of their names. A port holds the first ClusterIP of each
// family, the one its fragment maps.
type clusterIPIndex map[netip.Addr][]model.ServicePortName

// newClusterIPIndex indexes every service port of st.
func newClusterIPIndex(st *model.State) clusterIPIndex {
	ix := make(clusterIPIndex, st.Services.Len())
	for name, svc := range st.Services.All() {
		for _, ip := range portClusterIPs(svc) {
			ix[ip] = withHolder(ix[ip], name)
		}
	}
	return ix
}

// portClusterIPs are the ClusterIPs a service port's fragments map (nil
// svc: none).
func portClusterIPs(svc *model.ServicePort) []netip.Addr {
	var out []netip.Addr
	if svc == nil {
		return nil
	}
	for _, f := range nftlib.Families {
		if ip, ok := firstOfFamily(f, svc.ClusterIPs); ok {
			out = append(out, ip)
		}
	}
	return out
}

// withHolder adds name to the sorted holders, once.
func withHolder(holders []model.ServicePortName, name model.ServicePortName) []model.ServicePortName {
	i, found := slices.BinarySearchFunc(holders, name, model.ServicePortName.Compare)
	if found {
		return holders
	}
	return slices.Insert(holders, i, name)
}

// withoutHolder removes name from the sorted holders (a copy: the index's
// slice stays as applied).
func withoutHolder(holders []model.ServicePortName, name model.ServicePortName) []model.ServicePortName {
	i, found := slices.BinarySearchFunc(holders, name, model.ServicePortName.Compare)
	if !found {
		return holders
	}
	return slices.Delete(slices.Clone(holders), i, i+1)
}

// clusterIPFragment is the fragment of ip's element, commented with the
// Service of its first holder; nil when no port holds it.
func clusterIPFragment(ip netip.Addr, holders []model.ServicePortName) *nftlib.Fragment {
	if len(holders) == 0 {
		return nil
	}
	h := holders[0]
	return &nftlib.Fragment{Elements: []nftlib.MapElement{{Map: setClusterIPs,
		Element: nftlib.Element{Key: nftlib.Key{Addr: ip}, Comment: h.Namespace + "/" + h.Name}}}}
}

// placeClusterIPs puts the element of every address of the index that
// belongs to the family of main (a main table) into it.
func placeClusterIPs(main *nftlib.Table, ix clusterIPIndex) {
	for ip, holders := range ix {
		if main.Family.Has(ip) {
			main.Fragments[clusterIPKey(ip)] = clusterIPFragment(ip, holders)
		}
	}
}

// mainTableOf is the main table of ip's family.
func mainTableOf(ip netip.Addr) tableID {
	if nftlib.IPv4.Has(ip) {
		return tableID{nftlib.IPv4, MainTable}
	}
	return tableID{nftlib.IPv6, MainTable}
}

// planClusterIPs adds to a plan that is not full the elements of the
// ClusterIPs its changed ports held or hold now: have as applied, want
// after the sync, and their keys to diff. The holders after the sync go to
// p.clusterIPs, which record makes the index.
func (b *Backend) planClusterIPs(p *syncPlan, st *model.State) {
	if !b.cfg.ClusterIPChecks {
		return
	}
	if !slices.Equal(b.serviceCIDRs, st.ServiceCIDRs) {
		for _, f := range nftlib.Families {
			id := tableID{f, MainTable}
			p.want[id] = withServiceCIDRs(p.want[id], st.ServiceCIDRs)
		}
	}
	after := map[netip.Addr][]model.ServicePortName{}
	holders := func(ip netip.Addr) []model.ServicePortName {
		if h, ok := after[ip]; ok {
			return h
		}
		return b.clusterIPs[ip]
	}
	applied := b.changes.State()
	for _, name := range p.changed {
		var old *model.ServicePort
		if applied != nil {
			old, _ = applied.Services.Lookup(name)
		}
		now, _ := st.Services.Lookup(name)
		for _, ip := range portClusterIPs(old) {
			after[ip] = withoutHolder(holders(ip), name)
		}
		for _, ip := range portClusterIPs(now) {
			after[ip] = withHolder(slices.Clone(holders(ip)), name)
		}
	}
	for ip, h := range after {
		id, key := mainTableOf(ip), clusterIPKey(ip)
		p.have[id].Fragments[key] = clusterIPFragment(ip, b.clusterIPs[ip])
		p.want[id].Fragments[key] = clusterIPFragment(ip, h)
		p.extraKeys = append(p.extraKeys, key)
	}
	p.clusterIPs = after
}

// recordClusterIPs makes the index and the ServiceCIDRs those of the
// State a sync applied.
func (b *Backend) recordClusterIPs(st *model.State, p *syncPlan) {
	if !b.cfg.ClusterIPChecks {
		return
	}
	b.serviceCIDRs = st.ServiceCIDRs
	if p.full {
		b.clusterIPs = p.clusterIPs
		return
	}
	for ip, h := range p.clusterIPs {
		if len(h) == 0 {
			delete(b.clusterIPs, ip)
		} else {
			b.clusterIPs[ip] = h
		}
	}
}
