package nftlib

import (
	"fmt"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// The fake transaction's commands: each keeps its nft text (as the trace
// writes it) and its change to the tables.

func (x *fakeTx) Messages() int { return len(x.ops) }
func (x *fakeTx) Size() int     { return x.bytes }

// add records one command; write prints it with a scriptWriter.
func (x *fakeTx) add(f Family, table string, write func(w *scriptWriter), apply func(t *fakeTable, all map[TableRef]*fakeTable) error) {
	var w scriptWriter
	write(&w)
	text := strings.TrimSuffix(w.B.String(), "\n")
	x.bytes += len(text) + 1
	n := TableRef{f, table}
	x.ops = append(x.ops, fakeOp{text: text, table: n, apply: func(t *fakeTable, all map[TableRef]*fakeTable) error {
		if t == nil && apply != nil {
			return syscall.ENOENT
		}
		if apply == nil {
			return nil
		}
		return apply(t, all)
	}})
}

func (x *fakeTx) AddTable(f Family, name, comment string) { x.addTable(f, name, comment, false) }

// AddOwnedTable is AddTable that fails when the table exists: the fake
// has one socket, so ownership itself is not modelled.
func (x *fakeTx) AddOwnedTable(f Family, name, comment string) { x.addTable(f, name, comment, true) }

// addTable adds a table; an existing one keeps its comment, or fails the
// transaction when exclusive.
func (x *fakeTx) addTable(f Family, name, comment string, exclusive bool) {
	n := TableRef{f, name}
	x.bytes += len(name)
	var w scriptWriter
	w.AddTable(f, name, comment)
	x.ops = append(x.ops, fakeOp{text: strings.TrimSpace(w.B.String()), table: n, apply: func(t *fakeTable, all map[TableRef]*fakeTable) error {
		switch {
		case t == nil:
			all[n] = &fakeTable{comment: comment, sets: map[string]*fakeSet{}, chains: map[string]*Chain{}}
		case exclusive:
			return fmt.Errorf("table %s exists: %w", n, unix.EEXIST)
		}
		return nil
	}})
}

func (x *fakeTx) DelTable(f Family, name string) {
	n := TableRef{f, name}
	x.add(f, name, func(w *scriptWriter) { w.DelTable(f, name) }, func(_ *fakeTable, all map[TableRef]*fakeTable) error {
		delete(all, n)
		return nil
	})
}

func (x *fakeTx) delSet(f Family, table, name string) {
	x.add(f, table, func(w *scriptWriter) { w.delSet(f, table, name) }, func(t *fakeTable, _ map[TableRef]*fakeTable) error {
		if t.sets[name] == nil {
			return syscall.ENOENT
		}
		if t.setUsed(name) {
			return syscall.EBUSY
		}
		delete(t.sets, name)
		return nil
	})
}

// The fake holds no stateful objects or flowtables.
func (x *fakeTx) delObj(f Family, table string, o kernelObject) {
	x.add(f, table, func(w *scriptWriter) { w.delObj(f, table, o) }, func(*fakeTable, map[TableRef]*fakeTable) error { return syscall.ENOENT })
}

func (x *fakeTx) delFlowtable(f Family, table, name string) {
	x.add(f, table, func(w *scriptWriter) { w.delFlowtable(f, table, name) }, func(*fakeTable, map[TableRef]*fakeTable) error { return syscall.ENOENT })
}

func (x *fakeTx) addMap(f Family, table string, m *Map, id uint32) {
	x.add(f, table, func(w *scriptWriter) { w.addMap(f, table, m, id) }, func(t *fakeTable, _ map[TableRef]*fakeTable) error {
		if s := t.sets[m.Name]; s != nil {
			if s.m == nil || mapMismatch(f, fakeKSet(f, s), m) != "" {
				return syscall.EEXIST
			}
			return nil
		}
		t.sets[m.Name] = &fakeSet{m: &Map{Name: m.Name, Key: m.Key, Comment: m.Comment, Plain: m.Plain, Interval: m.Interval}, elems: map[Key]Element{}}
		return nil
	})
}

func (x *fakeTx) addStickySet(f Family, table, name, comment string, id uint32) {
	x.add(f, table, func(w *scriptWriter) { w.addStickySet(f, table, name, comment, id) }, func(t *fakeTable, _ map[TableRef]*fakeTable) error {
		if t.sets[name] == nil {
			t.sets[name] = &fakeSet{elems: map[Key]Element{}, stickyComment: comment}
		}
		return nil
	})
}

func (x *fakeTx) flushMap(f Family, table string, m *Map) {
	x.add(f, table, func(w *scriptWriter) { w.flushMap(f, table, m) }, func(t *fakeTable, _ map[TableRef]*fakeTable) error {
		s := t.sets[m.Name]
		if s == nil {
			return syscall.ENOENT
		}
		s.elems = map[Key]Element{}
		return nil
	})
}

func (x *fakeTx) AddChains(f Family, table string, chains []*Chain) {
	for _, c := range chains {
		x.add(f, table, func(w *scriptWriter) { w.AddChain(f, table, c) }, func(t *fakeTable, _ map[TableRef]*fakeTable) error {
			old := t.chains[c.Name]
			if old == nil {
				t.chains[c.Name] = &Chain{Name: c.Name, Comment: c.Comment, Hook: c.Hook}
				return nil
			}
			if (old.Hook == nil) != (c.Hook == nil) || old.Hook != nil && *old.Hook != *c.Hook {
				return syscall.EOPNOTSUPP // a chain's hook cannot change
			}
			return nil
		})
	}
}

// DelRule cannot find a rule here: the fake kernel keeps no handles (and
// never compares in scope, where such deletions come from).
func (x *fakeTx) DelRule(f Family, table, chain string, handle uint64) {
	x.add(f, table, func(w *scriptWriter) { w.DelRule(f, table, chain, handle) }, func(*fakeTable, map[TableRef]*fakeTable) error { return syscall.ENOENT })
}

func (x *fakeTx) FlushChain(f Family, table, chain string) {
	x.add(f, table, func(w *scriptWriter) { w.FlushChain(f, table, chain) }, func(t *fakeTable, _ map[TableRef]*fakeTable) error {
		if chain == "" {
			for name, c := range t.chains {
				t.chains[name] = &Chain{Name: c.Name, Comment: c.Comment, Hook: c.Hook}
			}
			return nil
		}
		c := t.chains[chain]
		if c == nil {
			return syscall.ENOENT
		}
		t.chains[chain] = &Chain{Name: c.Name, Comment: c.Comment, Hook: c.Hook}
		return nil
	})
}

// DelChain deletes a chain and its rules; EBUSY while a rule or a map
// element of the table still jumps or goes to it.
func (x *fakeTx) DelChain(f Family, table, name string) {
	x.add(f, table, func(w *scriptWriter) { w.DelChain(f, table, name) }, func(t *fakeTable, _ map[TableRef]*fakeTable) error {
		if t.chains[name] == nil {
			return syscall.ENOENT
		}
		if t.chainUsed(name) {
			return syscall.EBUSY
		}
		delete(t.chains, name)
		return nil
	})
}

// AddRule appends a rule to a chain.
func (x *fakeTx) AddRule(f Family, table, chain string, r Rule) {
	x.addChainRules(f, table, []*Chain{{Name: chain, Rules: []Rule{r}}})
}

func (x *fakeTx) addChainRules(f Family, table string, chains []*Chain) {
	for _, c := range chains {
		for _, r := range c.Rules {
			x.add(f, table, func(w *scriptWriter) { w.AddRule(f, table, c.Name, r) }, func(t *fakeTable, _ map[TableRef]*fakeTable) error {
				return t.AddRule(c.Name, r)
			})
		}
	}
}

func (x *fakeTx) Elements(add bool, f Family, table string, m *Map, elems []Element) {
	for _, e := range elems {
		x.add(f, table, func(w *scriptWriter) { w.Elements(add, f, table, m, []Element{e}) }, func(t *fakeTable, _ map[TableRef]*fakeTable) error {
			return t.element(add, m.Name, e)
		})
	}
}

func (t *fakeTable) AddRule(chain string, r Rule) error {
	c := t.chains[chain]
	if c == nil {
		return syscall.ENOENT
	}
	for _, term := range r.Terms {
		if !t.refersToExisting(term) {
			return syscall.ENOENT
		}
	}
	n := *c
	n.Rules = append(append([]Rule(nil), c.Rules...), r)
	t.chains[chain] = &n
	return nil
}

// refersToExisting reports whether the chain or set a term names exists.
func (t *fakeTable) refersToExisting(term Term) bool {
	switch v := term.(type) {
	case Verdict:
		return v.Chain == "" || t.chains[v.Chain] != nil
	case vmapLookup:
		return t.sets[v.Map] != nil
	case StickyMatch:
		return t.sets[v.Set] != nil
	case StickyUpdate:
		return t.sets[v.Set] != nil
	}
	return true
}

func (t *fakeTable) element(add bool, set string, e Element) error {
	s := t.sets[set]
	if s == nil {
		return syscall.ENOENT
	}
	old, ok := s.elems[e.Key]
	switch {
	case !add && !ok:
		return syscall.ENOENT
	case !add:
		delete(s.elems, e.Key)
	case ok && old.Verdict != e.Verdict:
		return syscall.EBUSY
	case ok:
	case e.Verdict.Chain != "" && t.chains[e.Verdict.Chain] == nil:
		return syscall.ENOENT
	default:
		s.elems[e.Key] = e
	}
	return nil
}

// chainUsed reports whether a rule or map element refers to the chain.
func (t *fakeTable) chainUsed(name string) bool {
	for _, c := range t.chains {
		for _, r := range c.Rules {
			for _, term := range r.Terms {
				if v, ok := term.(Verdict); ok && v.Chain == name {
					return true
				}
			}
		}
	}
	for _, s := range t.sets {
		for _, e := range s.elems {
			if e.Verdict.Chain == name {
				return true
			}
		}
	}
	return false
}

// setUsed reports whether a rule looks the set up.
func (t *fakeTable) setUsed(name string) bool {
	for _, c := range t.chains {
		for _, r := range c.Rules {
			for _, term := range r.Terms {
				switch v := term.(type) {
				case vmapLookup:
					if v.Map == name {
						return true
					}
				case StickyMatch:
					if name == v.Set {
						return true
					}
				case StickyUpdate:
					if name == v.Set {
						return true
					}
				}
			}
		}
	}
	return false
}
