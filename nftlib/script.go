package nftlib

import (
	"fmt"
	"strings"
)

// scriptWriter writes a transaction as nft commands, one per line: what the
// kernel is told, readable (Tx.Script).
type scriptWriter struct{ B strings.Builder }

func (s *scriptWriter) line(format string, args ...any) {
	fmt.Fprintf(&s.B, format, args...)
	s.B.WriteByte('\n')
}

func (s *scriptWriter) AddTable(f Family, name, comment string) {
	s.line("add table %s %s { comment %s; }", f, name, quoteComment(comment))
}

func (s *scriptWriter) DelTable(f Family, name string) { s.line("delete table %s %s", f, name) }

func (s *scriptWriter) delSet(f Family, table, name string) {
	s.line("delete set %s %s %s", f, table, name)
}

func (s *scriptWriter) delObj(f Family, table string, o kernelObject) {
	s.line("delete %s %s %s %s", o.kind(), f, table, o.Name)
}

func (s *scriptWriter) delFlowtable(f Family, table, name string) {
	s.line("delete flowtable %s %s %s", f, table, name)
}

func (s *scriptWriter) addMap(f Family, table string, m *Map, _ uint32) {
	var types []string
	for _, fl := range m.Key {
		n, _ := fl.datatype(f)
		types = append(types, n)
	}
	switch {
	case m.Interval:
		s.line("add set %s %s %s { type %s; flags interval; }", f, table, m.Name, strings.Join(types, " . "))
		return
	case m.Plain:
		s.line("add set %s %s %s { type %s; }", f, table, m.Name, strings.Join(types, " . "))
		return
	}
	s.line("add map %s %s %s { type %s : verdict; }", f, table, m.Name, strings.Join(types, " . "))
}

func (s *scriptWriter) flushMap(f Family, table string, m *Map) {
	kind := "map"
	if m.Plain {
		kind = "set"
	}
	s.line("flush %s %s %s %s", kind, f, table, m.Name)
}

func (s *scriptWriter) AddChains(f Family, table string, chains []*Chain) {
	for _, c := range chains {
		s.AddChain(f, table, c)
	}
}

func (s *scriptWriter) addChainRules(f Family, table string, chains []*Chain) {
	for _, c := range chains {
		for _, r := range c.Rules {
			s.AddRule(f, table, c.Name, r)
		}
	}
}

// AddChain writes a base chain with its hook, so the script loads with
// nft -f as it stands.
func (s *scriptWriter) AddChain(f Family, table string, c *Chain) {
	if h := c.Hook; h != nil {
		s.line("add chain %s %s %s { type %s hook %s priority %s; policy accept; }",
			f, table, c.Name, h.Type, h.Hook, priorityText(h))
		return
	}
	s.line("add chain %s %s %s", f, table, c.Name)
}

func (s *scriptWriter) FlushChain(f Family, table, chain string) {
	if chain == "" {
		s.line("flush table %s %s", f, table)
		return
	}
	s.line("flush chain %s %s %s", f, table, chain)
}

func (s *scriptWriter) DelChain(f Family, table, name string) {
	s.line("delete chain %s %s %s", f, table, name)
}

func (s *scriptWriter) AddRule(f Family, table, chain string, r Rule) {
	s.line("add rule %s %s %s %s", f, table, chain, r.Text(f))
}

func (s *scriptWriter) Elements(add bool, f Family, table string, m *Map, elems []Element) {
	for _, e := range elems {
		if add {
			s.line("add element %s %s %s { %s }", f, table, m.Name, m.elementText(f, e))
		} else {
			s.line("delete element %s %s %s { %s }", f, table, m.Name, e.keyText(m.Key))
		}
	}
}
