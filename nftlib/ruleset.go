package nftlib

import (
	"net/netip"
	"slices"

	"golang.org/x/sys/unix"
)

// Families are the families of the tables the modes write: one table each,
// like upstream (no inet table).
var Families = []Family{IPv4, IPv6}

// Family is a table's address family.
type Family uint8

// Our two table families (one table each, like upstream: no inet table).
const (
	IPv4 Family = unix.NFPROTO_IPV4
	IPv6 Family = unix.NFPROTO_IPV6
)

// String is the family as nft spells it ("ip", "ip6", "inet").
func (f Family) String() string {
	switch f {
	case IPv6:
		return "ip6"
	case unix.NFPROTO_INET:
		return "inet"
	case unix.NFPROTO_ARP:
		return "arp"
	case unix.NFPROTO_BRIDGE:
		return "bridge"
	case unix.NFPROTO_NETDEV:
		return "netdev"
	}
	return "ip"
}

func (f Family) addrLen() int {
	if f == IPv6 {
		return 16
	}
	return 4
}

// addrOffset is the source or destination address offset in the network header.
func (f Family) addrOffset(src bool) uint32 {
	switch {
	case f == IPv6 && src:
		return 8
	case f == IPv6:
		return 24
	case src:
		return 12
	}
	return 16
}

// Has reports whether addr belongs to this family.
func (f Family) Has(addr netip.Addr) bool { return addr.Is4() == (f == IPv4) }

// Ruleset is everything we program: one Table per family. It is a plain
// value: build it, print it, diff it, trace packets through it.
type Ruleset struct {
	Tables []*Table
}

// Table is one nftables table and all of its objects.
type Table struct {
	Family  Family
	Name    string
	Comment string
	// Secondary marks a table besides its family's main one (a caller's
	// extra tables at other priorities), for readers that want one table
	// a family.
	Secondary bool
	Maps      []*Map
	// Sticky names the table's sticky set ("": none; see sticky.go), and
	// StickyComment is its comment.
	Sticky        string
	StickyComment string
	// Chains are the fixed chains: base chains and those every fragment
	// shares.
	Chains []*Chain
	// Fragments hold chains and map elements kept apart by key (a caller's
	// unit of change), so that a sync rebuilds and
	// diffs only the fragments that changed. They are listed in key order.
	Fragments map[string]*Fragment
}

// Fragment is what one key contributes to a table.
type Fragment struct {
	Chains   []*Chain
	Elements []MapElement
}

// MapElement is an element destined for a named map of the table.
type MapElement struct {
	Map string
	Element
}

// Hook makes a chain a base chain.
type Hook struct {
	Type     string // "nat" or "filter"
	Hook     string // "prerouting", "output", "postrouting", "input", "forward"
	Priority int32
}

// Chain is a chain and its rules.
type Chain struct {
	Name    string
	Comment string
	Hook    *Hook
	Rules   []Rule
}

// Rule is a list of terms and an optional comment.
type Rule struct {
	Terms   []Term
	Comment string
}

// R builds a rule from terms.
func R(terms ...Term) Rule { return Rule{Terms: terms} }

// WithComment returns the rule with a comment.
func (r Rule) WithComment(c string) Rule { r.Comment = c; return r }

// Map is a named verdict map, or with Plain a named set.
type Map struct {
	Name    string
	Key     []Field
	Comment string
	// Plain makes it a set: keys without verdicts (`set NAME { type ... }`),
	// for lookups (SetMatch, SetLookup). Its elements' Verdict is unused;
	// adding them costs the kernel no validation of the table.
	Plain bool
	// Interval makes a Plain set hold ranges (`flags interval`): its key's
	// second address (Key.Net) is a prefix. The key must be a
	// concatenation (the kernel's pipapo set).
	Interval bool
	// Elements are the map's fixed elements; fragments add theirs.
	Elements []Element
}

// Element is one map element: a key and the verdict it maps to.
type Element struct {
	Key     Key
	Verdict Verdict
	Comment string
}

// Key is a map key; which parts count depends on the map's key fields:
// Addr is the first address field's value, Net a second address field's
// (a prefix in an Interval set, of full length otherwise).
type Key struct {
	Addr  netip.Addr
	Proto uint8
	Port  uint16
	Net   netip.Prefix
}

// Chain returns the fixed or fragment chain of that name, or nil.
func (t *Table) Chain(name string) *Chain {
	if c := t.FixedChain(name); c != nil {
		return c
	}
	for _, fr := range t.Fragments {
		for _, c := range fr.Chains {
			if c.Name == name {
				return c
			}
		}
	}
	return nil
}

// chainsNamed returns the fixed or fragment chains of those names, in
// their order, and false if one is missing: one walk of the table, where
// Chain would walk it once a name.
func (t *Table) chainsNamed(names []string) ([]*Chain, bool) {
	idx := make(map[string]int, len(names))
	for i, n := range names {
		idx[n] = i
	}
	out, found := make([]*Chain, len(names)), 0
	t.EachChain(func(c *Chain) {
		if i, ok := idx[c.Name]; ok && out[i] == nil {
			out[i] = c
			found++
		}
	})
	return out, found == len(names)
}

func (t *Table) FixedChain(name string) *Chain {
	for _, c := range t.Chains {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// Map returns the named map, or nil.
func (t *Table) Map(name string) *Map {
	for _, m := range t.Maps {
		if m.Name == name {
			return m
		}
	}
	return nil
}

// AllChains lists fixed chains first, then fragment chains by key.
func (t *Table) AllChains() []*Chain {
	return t.chainsOf(t.fragmentKeys())
}

// chainsOf is AllChains, with the table's fragment keys already sorted.
func (t *Table) chainsOf(keys []string) []*Chain {
	out := make([]*Chain, 0, t.ChainCount())
	out = append(out, t.Chains...)
	for _, k := range keys {
		out = append(out, t.Fragments[k].Chains...)
	}
	return out
}

// ChainCount is len(AllChains()) without building the list.
func (t *Table) ChainCount() int {
	n := len(t.Chains)
	for _, fr := range t.Fragments {
		n += len(fr.Chains)
	}
	return n
}

// Elements lists every element of the named map, fixed ones first, then by fragment key.
func (t *Table) Elements(m string) []Element {
	return t.elementsOf(t.fragmentKeys(), m)
}

// elementsOf is Elements, with the table's fragment keys already sorted.
func (t *Table) elementsOf(keys []string, m string) []Element {
	var out []Element
	if mp := t.Map(m); mp != nil {
		out = append(out, mp.Elements...)
	}
	for _, k := range keys {
		for _, e := range t.Fragments[k].Elements {
			if e.Map == m {
				out = append(out, e.Element)
			}
		}
	}
	return out
}

// fragmentKeys lists the table's fragment keys in order.
func (t *Table) fragmentKeys() []string {
	keys := make([]string, 0, len(t.Fragments))
	for k := range t.Fragments {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func equalChains(a, b *Chain) bool {
	if a == b {
		return true
	}
	if a.Name != b.Name || a.Comment != b.Comment || len(a.Rules) != len(b.Rules) {
		return false
	}
	if (a.Hook == nil) != (b.Hook == nil) || (a.Hook != nil && *a.Hook != *b.Hook) {
		return false
	}
	for i := range a.Rules {
		if !equalRules(a.Rules[i], b.Rules[i]) {
			return false
		}
	}
	return true
}

func equalRules(a, b Rule) bool {
	if a.Comment != b.Comment || len(a.Terms) != len(b.Terms) {
		return false
	}
	for i := range a.Terms {
		if a.Terms[i] != b.Terms[i] {
			return false
		}
	}
	return true
}
