package nftlib

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"
)

// Packet is a hypothetical first packet of a connection, for Trace.
type Packet struct {
	Src, Dst netip.Addr
	Proto    uint8  // unix.IPPROTO_TCP, ...
	Dport    uint16 // destination port
	// Output is true for a packet the node itself sends (the output hook),
	// false for one it receives or forwards (prerouting).
	Output bool
	// Local are the node's addresses, for `fib daddr type local`.
	Local []netip.Addr
	// Iif is the interface the packet came in on (prerouting).
	Iif string
	// Sticky holds the target ids (StickyID) the sticky set already
	// remembers Src for.
	Sticky []uint32
}

// Outcome is one way a packet can go, with its probability (random load
// balancing makes several).
type Outcome struct {
	Prob       float64
	DNAT       netip.AddrPort // zero when the packet was not DNATed
	Masquerade bool           // SNAT to the node in postrouting
	Dropped    bool
	Rejected   bool
	// Sticky is the target id the packet's source is (again) remembered
	// for (StickyUpdate), 0 if none.
	Sticky uint32
	// Chains are the chains the packet went through, in order; Tables
	// the table of each (a base chain starts each table's part).
	Chains []string
	Tables []string
}

func (o Outcome) String() string {
	s := fmt.Sprintf("%.3f ", o.Prob)
	switch {
	case o.Rejected:
		s += "reject"
	case o.Dropped:
		s += "drop"
	case o.DNAT.IsValid():
		s += "dnat " + o.DNAT.String()
	default:
		s += "no dnat"
	}
	if o.Masquerade {
		s += " masquerade"
	}
	return s + " via " + strings.Join(o.Chains, ",")
}

// Trace evaluates the ruleset for the first packet of a connection the way
// the kernel would: filter before DNAT, DNAT, filter after DNAT (input for
// the node's own addresses, forward otherwise, output for the node's
// packets), then SNAT; every random choice is explored. It is how unit
// tests check what a rule set does without a kernel. A rule it cannot
// evaluate (a lookup in a set the table does not hold) is an error.
func (rs *Ruleset) Trace(p Packet) ([]Outcome, error) {
	f := IPv4
	if p.Dst.Is6() {
		f = IPv6
	}
	pre, post := "prerouting", "forward"
	if p.Output {
		pre, post = "output", "output"
	}
	states := []*state{{prob: 1, pkt: p}}
	// Hook entries in priority order; at a nat hook the first chain that
	// NATs the connection ends NAT there, as in the kernel.
	hooks := rs.hookChains(f, pre)
	var after []baseChain
	for _, bc := range hooks {
		if bc.chain.Hook.Type == "filter" && bc.chain.Hook.Priority > -100 {
			after = append(after, bc)
			continue
		}
		states = runAll(states, bc)
	}
	for _, s := range states {
		if s.dnat.IsValid() {
			s.pkt.Dst = s.dnat.Addr()
		}
	}
	for i, s := range states {
		if post == "forward" && isLocal(s.pkt.Dst, p.Local) {
			states[i].hook = "input"
		} else {
			states[i].hook = post
		}
	}
	var next []*state
	for _, s := range states {
		var chains []baseChain
		if p.Output {
			chains = after
		} else {
			chains = rs.hookChains(f, s.hook)
		}
		branch := []*state{s}
		for _, bc := range chains {
			if bc.chain.Hook.Type == "filter" {
				branch = runAll(branch, bc)
			}
		}
		next = append(next, branch...)
	}
	states = next
	var out []Outcome
	for _, s := range states {
		if !s.dropped && s.hook != "input" {
			for _, bc := range rs.hookChains(f, "postrouting") {
				if bc.chain.Hook.Type == "nat" {
					for _, s2 := range s.run(bc.table, bc.chain) {
						s = s2 // postrouting has no random choices
					}
				}
			}
		}
		if s.err != nil {
			return nil, fmt.Errorf("tracing %s: chains %s: %w", p.Dst, strings.Join(s.path, ","), s.err)
		}
		out = append(out, Outcome{Prob: s.prob, DNAT: s.dnat, Masquerade: s.masq, Dropped: s.dropped && !s.rejected, Rejected: s.rejected, Sticky: s.sticky, Chains: s.path, Tables: s.tables})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].DNAT.String() < out[j].DNAT.String() })
	return out, nil
}

// runAll runs one base chain on every live branch.
func runAll(states []*state, bc baseChain) []*state {
	var next []*state
	for _, s := range states {
		if s.dropped || (bc.chain.Hook.Type == "nat" && s.dnat.IsValid()) {
			next = append(next, s)
			continue
		}
		next = append(next, s.run(bc.table, bc.chain)...)
	}
	return next
}

func isLocal(a netip.Addr, local []netip.Addr) bool {
	if a.IsLoopback() {
		return true // the kernel's local routes cover 127.0.0.0/8 and ::1
	}
	for _, l := range local {
		if l == a {
			return true
		}
	}
	return false
}

type baseChain struct {
	table *Table
	chain *Chain
}

// hookChains lists the base chains at a hook, in priority order.
func (rs *Ruleset) hookChains(f Family, hook string) []baseChain {
	var out []baseChain
	for _, t := range rs.Tables {
		if t.Family != f {
			continue
		}
		for _, c := range t.Chains {
			if c.Hook != nil && c.Hook.Hook == hook {
				out = append(out, baseChain{t, c})
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].chain.Hook.Priority < out[j].chain.Hook.Priority })
	return out
}

// state is one branch of the evaluation.
type state struct {
	prob     float64
	pkt      Packet
	hook     string // after DNAT: input, forward or output
	mark     uint32
	dnat     netip.AddrPort
	masq     bool
	sticky   uint32
	dropped  bool
	rejected bool
	path     []string
	tables   []string // the table of each chain of path
	err      error    // the term that ended the branch could not be evaluated
}

func (s *state) fork(p float64) *state {
	c := *s
	c.prob *= p
	c.path = append([]string(nil), s.path...)
	c.tables = append([]string(nil), s.tables...)
	return &c
}

// run evaluates a base chain to its end and returns the resulting branches.
func (s *state) run(t *Table, c *Chain) []*state {
	s.path, s.tables = append(s.path, c.Name), append(s.tables, t.Name)
	var out []*state
	for _, r := range s.chain(t, c, 0) {
		out = append(out, r.st)
	}
	return out
}

// How a term, rule or chain left a branch.
type flow uint8

const (
	next     flow = iota // go on: next term, or next rule
	noMatch              // the rule did not match: next rule
	chainEnd             // return (or a goto came back): the chain is done
	final                // accept or drop: evaluation at this hook is over
)

type result struct {
	st   *state
	flow flow
}

const maxDepth = 16 // the kernel's jump stack

// chain evaluates a chain; results are chainEnd or final.
func (s *state) chain(t *Table, c *Chain, depth int) []result {
	if depth > maxDepth {
		s.dropped = true
		return []result{{s, final}}
	}
	branches := []*state{s}
	var out []result
	for _, r := range c.Rules {
		var cont []*state
		for _, b := range branches {
			for _, res := range b.rule(t, r.Terms, depth) {
				switch res.flow {
				case next, noMatch:
					cont = append(cont, res.st)
				default:
					out = append(out, res)
				}
			}
		}
		branches = cont
	}
	for _, b := range branches {
		out = append(out, result{b, chainEnd})
	}
	return out
}

// rule evaluates the remaining terms of a rule.
func (s *state) rule(t *Table, terms []Term, depth int) []result {
	if len(terms) == 0 {
		return []result{{s, next}}
	}
	var out []result
	for _, res := range terms[0].eval(s, t, depth) {
		if res.flow == next {
			out = append(out, res.st.rule(t, terms[1:], depth)...)
		} else {
			out = append(out, res)
		}
	}
	return out
}

// matchIf goes on with the rule when ok, to the next rule otherwise.
func (s *state) matchIf(ok bool) []result {
	if ok {
		return []result{{s, next}}
	}
	return []result{{s, noMatch}}
}

// goOn goes on with the rule after a statement.
func (s *state) goOn() []result { return []result{{s, next}} }

// fail ends the branch with an error, which Trace returns.
func (s *state) fail(err error) []result {
	s.err, s.dropped = err, true
	return []result{{s, final}}
}

// inMap tells whether the packet's fields are a key of the table's map.
// The table holds its maps only (and the sticky set, which StickyMatch
// reads from the packet): a lookup in any other set is an error.
func (s *state) inMap(t *Table, name string, fields []Field) (bool, error) {
	if t.Map(name) == nil {
		return false, fmt.Errorf("%s %s: lookup in %s, which is not a map of the table", t.Family, t.Name, name)
	}
	for _, e := range t.Elements(name) {
		if s.pkt.keyMatches(fields, e.Key) {
			return true, nil
		}
	}
	return false, nil
}

func (s *state) verdict(t *Table, v Verdict, depth int) []result {
	switch v.Kind {
	case Accept:
		return []result{{s, final}}
	case Drop:
		s.dropped = true
		return []result{{s, final}}
	case Return:
		return []result{{s, chainEnd}}
	}
	c := t.Chain(v.Chain)
	if c == nil { // the kernel would refuse such a rule; show it as a drop
		s.path, s.tables = append(s.path, "missing:"+v.Chain), append(s.tables, t.Name)
		s.dropped = true
		return []result{{s, final}}
	}
	s.path, s.tables = append(s.path, c.Name), append(s.tables, t.Name)
	var out []result
	for _, r := range s.chain(t, c, depth+1) {
		switch {
		case r.flow == final:
			out = append(out, r)
		case v.Kind == Goto:
			out = append(out, result{r.st, chainEnd})
		default:
			out = append(out, result{r.st, next})
		}
	}
	return out
}
