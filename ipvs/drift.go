package ipvs

import (
	"fmt"
	"iter"
	"maps"
	"net/netip"
	"slices"

	"github.com/kube-nftproxy/kube-nftproxy/internal/ipvsnl"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// DriftScope is what a helper drift check reads back.
type DriftScope struct {
	IPv4, IPv6 bool // the helper table of that family
	Addrs      bool // kube-ipvs0's addresses
}

func (s DriftScope) empty() bool { return !s.IPv4 && !s.IPv6 && !s.Addrs }

// allHelpers reads everything back.
var allHelpers = DriftScope{IPv4: true, IPv6: true, Addrs: true}

// DriftChecker is a Helper that can compare the kernel with what was
// applied. NftHelper is one.
type DriftChecker interface {
	// Drift compares the kernel with addrs and elems, all that was
	// applied, within scope, and returns the differences by object: "ip
	// kube-nftproxy-ipvs", "ip6 kube-nftproxy-ipvs", "kube-ipvs0". elems
	// may be walked more than once, in no order.
	Drift(addrs []netip.Addr, elems iter.Seq[Element], scope DriftScope) (map[string][]string, error)
}

var _ DriftChecker = (*NftHelper)(nil)

// Drift reads the helper tables back (rules, sets and elements, through
// nftlib's ReadFamily and TableDrift) and kube-ipvs0's addresses.
func (h *NftHelper) Drift(addrs []netip.Addr, elems iter.Seq[Element], scope DriftScope) (map[string][]string, error) {
	out := map[string][]string{}
	if scope.Addrs && h.link != nil {
		got, err := h.link.Addrs()
		if err != nil {
			return nil, fmt.Errorf("reading %s addresses: %w", ipvsnl.DummyName, err)
		}
		if d := addrDrift(addrs, got); len(d) > 0 {
			out[ipvsnl.DummyName] = d
		}
	}
	for _, t := range h.tables {
		if (t.Family == nftlib.IPv4 && !scope.IPv4) || (t.Family == nftlib.IPv6 && !scope.IPv6) {
			continue
		}
		want := withElements(t, familyElements(elems, t.Family == nftlib.IPv6))
		d, err := h.tableDrift(want)
		if err != nil {
			return nil, fmt.Errorf("reading back %s %s: %w", t.Family, t.Name, err)
		}
		if len(d) > 0 {
			out[t.Family.String()+" "+t.Name] = d
		}
	}
	return out, nil
}

// tableDrift describes every difference between want, its elements
// included, and the kernel's table.
func (h *NftHelper) tableDrift(want *nftlib.Table) ([]string, error) {
	names := make([]string, len(want.Chains))
	for i, c := range want.Chains {
		names[i] = c.Name
	}
	kts, err := h.k.ReadFamily(want.Family, []string{want.Name}, map[string][]string{want.Name: names})
	if err != nil {
		return nil, err
	}
	return h.k.TableDrift(want, kts[want.Name], nil)
}

// familyElements groups one family's elements by set, each set's list
// made once at its size (a hundred thousand at 10k Services).
func familyElements(elems iter.Seq[Element], v6 bool) map[string][]nftlib.Element {
	count := map[string]int{}
	for e := range elems {
		if e.V6 == v6 {
			count[e.Set]++
		}
	}
	out := make(map[string][]nftlib.Element, len(count))
	for set, n := range count {
		out[set] = make([]nftlib.Element, 0, n)
	}
	for e := range elems {
		if e.V6 == v6 {
			out[e.Set] = append(out[e.Set], setElement(e))
		}
	}
	return out
}

// HelperTableRefs names the helper tables, for a change monitor.
func HelperTableRefs() []nftlib.TableRef {
	return []nftlib.TableRef{{Family: nftlib.IPv4, Name: HelperTableName}, {Family: nftlib.IPv6, Name: HelperTableName}}
}

// scopeOf is the part of the helpers that changed tables name.
func scopeOf(changed map[nftlib.TableRef]bool) DriftScope {
	var s DriftScope
	for t := range changed {
		if t.Name == HelperTableName {
			s.IPv4 = s.IPv4 || t.Family == nftlib.IPv4
			s.IPv6 = s.IPv6 || t.Family == nftlib.IPv6
		}
	}
	return s
}

func addrDrift(want, got []netip.Addr) []string {
	var d []string
	have := map[netip.Addr]bool{}
	for _, a := range got {
		have[a] = true
	}
	for _, a := range want {
		if !have[a] {
			d = append(d, "address "+a.String()+" missing")
		}
		delete(have, a)
	}
	for _, a := range slices.SortedFunc(maps.Keys(have), netip.Addr.Compare) {
		d = append(d, "address "+a.String()+" is not ours")
	}
	return d
}

// maxIPVSDiffs bounds the differences CheckIPVS describes.
const maxIPVSDiffs = 20

// CheckHelper compares the helper with what the Syncer applied (within
// scope). On a difference the next Sync reads the helper again and
// rewrites it: the tables whole with the elements found, then the missing
// elements and addresses by difference. It returns the differences by
// object; nothing when the helper cannot check.
func (s *Syncer) CheckHelper(scope DriftScope) (map[string][]string, error) {
	c, ok := s.h.(DriftChecker)
	if !ok || !s.read || s.helperRead || scope.empty() {
		return nil, nil
	}
	addrs := slices.SortedFunc(maps.Keys(s.haveAddrs), netip.Addr.Compare)
	// The elements applied, unpacked one at a time as Drift walks them.
	diffs, err := c.Drift(addrs, s.elems.held(), scope)
	if err != nil {
		return nil, err
	}
	if len(diffs) > 0 {
		s.helperRead = true
	}
	return diffs, nil
}

// CheckIPVS reads the kernel's virtual and real servers and compares them
// with what the Syncer applied: someone may have deleted or changed one
// (ipvsadm). On a difference it adopts what it read, so that the next
// Sync makes every key match again. It returns the differences.
func (s *Syncer) CheckIPVS() ([]string, error) {
	if !s.read {
		return nil, nil
	}
	vss, err := s.k.Read()
	if err != nil {
		return nil, fmt.Errorf("reading IPVS services: %w", err)
	}
	var d []string
	more := 0
	add := func(format string, args ...any) {
		if len(d) < maxIPVSDiffs {
			d = append(d, fmt.Sprintf(format, args...))
		} else {
			more++
		}
	}
	got := make(map[ipvsnl.ServiceKey]ipvsnl.VirtualServer, len(vss))
	for _, v := range vss {
		got[v.ServiceKey] = v
	}
	for _, key := range slices.SortedFunc(maps.Keys(s.have), ipvsnl.ServiceKey.Compare) {
		a := s.have[key]
		v, ok := got[key]
		if !ok {
			add("virtual server %s: missing", key)
			continue
		}
		if !v.SameSettings(a.svc) {
			add("virtual server %s: scheduler %s flags 0x%x timeout %d, want %s 0x%x %d", key, v.Scheduler, v.Flags, v.Timeout, a.svc.Scheduler, a.svc.Flags, a.svc.Timeout)
		}
		destDrift(key, a.dests, v.Dests, add)
	}
	for _, key := range slices.SortedFunc(maps.Keys(got), ipvsnl.ServiceKey.Compare) {
		if s.have[key] == nil && !s.excluded(key.Addr) {
			add("virtual server %s: not ours", key)
		}
	}
	if more > 0 {
		d = append(d, fmt.Sprintf("and %d more differences", more))
	}
	if len(d) > 0 {
		s.adoptIPVS(vss)
	}
	return d, nil
}

// destDrift describes how the real servers got differ from those applied
// (want), both ordered by address: missing ones and changed weights in
// want's order, then those not ours.
func destDrift(key ipvsnl.ServiceKey, want, got []ipvsnl.Dest, add func(format string, args ...any)) {
	byAddr := func(a, b ipvsnl.Dest) int { return a.Addr.Compare(b.Addr) }
	if !slices.IsSortedFunc(got, byAddr) {
		got = slices.SortedFunc(slices.Values(got), byAddr)
	}
	seen := make([]bool, len(got))
	for _, w := range want {
		i, ok := slices.BinarySearchFunc(got, w.Addr, compareDestAddr)
		switch {
		case !ok:
			add("real server %s -> %s: missing", key, w.Addr)
			continue
		case w.Weight != unknownWeight && (got[i].Weight != w.Weight || got[i].Fwd&ipvsnl.FwdMask != w.Fwd&ipvsnl.FwdMask):
			add("real server %s -> %s: weight %d, want %d", key, w.Addr, got[i].Weight, w.Weight)
		}
		seen[i] = true
	}
	for i, x := range got {
		if !seen[i] {
			add("real server %s -> %s: not ours", key, x.Addr)
		}
	}
}
