package nft

import (
	"fmt"
	"strings"
)

// scriptWriter writes a transaction as nft commands, one per line: what the
// kernel is told, readable. Used by tests and by --dry-run style debugging.
type scriptWriter struct{ b strings.Builder }

func (s *scriptWriter) line(format string, args ...any) {
	fmt.Fprintf(&s.b, format, args...)
	s.b.WriteByte('\n')
}

func (s *scriptWriter) addTable(f Family, name, comment string) {
	s.line("add table %s %s { comment %s; }", f, name, quoteComment(comment))
}

func (s *scriptWriter) delTable(f Family, name string) { s.line("delete table %s %s", f, name) }

func (s *scriptWriter) delSet(f Family, table, name string) {
	s.line("delete set %s %s %s", f, table, name)
}

func (s *scriptWriter) delObj(f Family, table string, o kObj) {
	s.line("delete %s %s %s %s", o.kind(), f, table, o.name)
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
	s.line("add map %s %s %s { type %s : verdict; }", f, table, m.Name, strings.Join(types, " . "))
}

func (s *scriptWriter) flushMap(f Family, table, m string) { s.line("flush map %s %s %s", f, table, m) }

func (s *scriptWriter) addChains(f Family, table string, chains []*Chain) {
	for _, c := range chains {
		s.addChain(f, table, c)
	}
}

func (s *scriptWriter) addChainRules(f Family, table string, chains []*Chain) {
	for _, c := range chains {
		for _, r := range c.Rules {
			s.addRule(f, table, c.Name, r)
		}
	}
}

func (s *scriptWriter) addChain(f Family, table string, c *Chain) {
	s.line("add chain %s %s %s", f, table, c.Name)
}

func (s *scriptWriter) flushChain(f Family, table, chain string) {
	if chain == "" {
		s.line("flush table %s %s", f, table)
		return
	}
	s.line("flush chain %s %s %s", f, table, chain)
}

func (s *scriptWriter) delChain(f Family, table, name string) {
	s.line("delete chain %s %s %s", f, table, name)
}

func (s *scriptWriter) addRule(f Family, table, chain string, r Rule) {
	s.line("add rule %s %s %s %s", f, table, chain, r.text(f))
}

func (s *scriptWriter) elements(add bool, f Family, table string, m *Map, elems []Element) {
	for _, e := range elems {
		if add {
			s.line("add element %s %s %s { %s }", f, table, m.Name, e.text(f, m.Key))
		} else {
			s.line("delete element %s %s %s { %s }", f, table, m.Name, e.keyText(m.Key))
		}
	}
}
