package nftlib

import (
	"bytes"
	"maps"
	"slices"
	"strings"
)

// txWriter receives the operations of one transaction, in the order the
// kernel must see them. *batch encodes them for the kernel; scriptWriter
// prints them as an nft script (for tests and debugging).
type txWriter interface {
	AddTable(f Family, name, comment string)
	DelTable(f Family, name string)
	delSet(f Family, table, name string)
	delObj(f Family, table string, o kernelObject)
	delFlowtable(f Family, table, name string)
	addMap(f Family, table string, m *Map, id uint32)
	addStickySet(f Family, table, name, comment string, id uint32)
	flushMap(f Family, table string, m *Map)
	// AddChains adds chains without their rules, addChainRules their
	// rules, in order (a batch encodes large lists on all CPUs).
	AddChains(f Family, table string, chains []*Chain)
	FlushChain(f Family, table, chain string)
	DelRule(f Family, table, chain string, handle uint64)
	DelChain(f Family, table, name string)
	addChainRules(f Family, table string, chains []*Chain)
	AddRule(f Family, table, chain string, r Rule)
	Elements(add bool, f Family, table string, m *Map, elems []Element)
}

// Tx collects one table's changes and writes them in a safe order: objects
// are created before anything refers to them, and references are dropped
// (elements deleted, chains flushed) before the chains they point to are
// deleted.
type Tx struct {
	f          Family
	table      *Table
	newTable   bool
	flushTable bool
	// fresh: the kernel holds no such table (see Stage).
	fresh bool
	// delTable deletes the table first, for what only a re-creation
	// changes (its comment).
	delTable bool
	// delSets and delBase are deleted right after the flush, before they
	// are created again: sets of the wrong type, chains whose hook, type,
	// priority, policy or comment are wrong, and base chains not ours
	// (no rule can refer to a base chain, so deleting them is always safe).
	delSets []string
	delBase []string
	// delObjs and delFlowtables are another process's: deleted after the
	// flush and the sets, which drop the references to them.
	delObjs       []kernelObject
	delFlowtables []string
	newMaps       []*Map
	// newSticky creates the sticky set if it does not exist; it is
	// never flushed (its elements are live: the sources it remembers).
	newSticky bool
	flushMaps []string
	newChains []*Chain
	delElems  map[string][]Element
	// delRules are rules not ours, by chain, deleted by handle (a chain
	// otherwise as it should be keeps its rules).
	delRules  map[string][]uint64
	flush     []string
	DelChains []string
	rules     []*Chain // chains whose rules are (re)written
	addElems  map[string][]Element
	// release, when set, makes Write let go of the fragments as it
	// encodes them, round rules at a time (see ReleaseRules).
	release func()
	round   int
}

func newTx(t *Table) *Tx {
	return &Tx{f: t.Family, table: t, delElems: map[string][]Element{}, delRules: map[string][]uint64{}, addElems: map[string][]Element{}}
}

func (x *Tx) Empty() bool {
	return !x.newTable && !x.flushTable && !x.delTable && len(x.delSets) == 0 && len(x.delBase) == 0 &&
		len(x.delObjs) == 0 && len(x.delFlowtables) == 0 && len(x.newMaps) == 0 && !x.newSticky && len(x.flushMaps) == 0 && len(x.newChains) == 0 &&
		len(x.delElems) == 0 && len(x.delRules) == 0 && len(x.flush) == 0 && len(x.DelChains) == 0 && len(x.rules) == 0 && len(x.addElems) == 0
}

// Rules is how many rules the transaction writes: what most of a large
// transaction's encoded size is.
func (x *Tx) Rules() int {
	n := 0
	for _, c := range x.rules {
		n += len(c.Rules)
	}
	return n
}

// Script is the transaction as nft commands, one a line: what Write sends,
// readable (setID numbers new sets as in Write).
func (x *Tx) Script(setID *uint32) string {
	var s scriptWriter
	x.Write(&s, setID)
	return s.B.String()
}

func (x *Tx) Write(w txWriter, setID *uint32) {
	t := x.table
	if x.delTable {
		w.DelTable(x.f, t.Name)
	}
	if x.newTable {
		w.AddTable(x.f, t.Name, t.Comment)
	}
	if x.flushTable {
		w.FlushChain(x.f, t.Name, "")
	}
	for _, c := range x.delBase {
		w.DelChain(x.f, t.Name, c)
	}
	for _, s := range x.delSets {
		w.delSet(x.f, t.Name, s)
	}
	for _, o := range x.delObjs {
		w.delObj(x.f, t.Name, o)
	}
	for _, ft := range x.delFlowtables {
		w.delFlowtable(x.f, t.Name, ft)
	}
	for _, m := range x.newMaps {
		*setID++
		w.addMap(x.f, t.Name, m, *setID)
	}
	if x.newSticky {
		*setID++
		w.addStickySet(x.f, t.Name, t.Sticky, t.StickyComment, *setID)
	}
	w.AddChains(x.f, t.Name, x.newChains)
	if x.release != nil {
		x.newChains, t.Fragments = nil, nil
		cloneElementStrings(x.addElems)
	}
	for _, m := range x.flushMaps {
		w.flushMap(x.f, t.Name, t.Map(m))
	}
	for _, m := range t.Maps {
		if e := x.delElems[m.Name]; len(e) > 0 {
			w.Elements(false, x.f, t.Name, m, e)
		}
	}
	for _, c := range slices.Sorted(maps.Keys(x.delRules)) {
		for _, h := range x.delRules[c] {
			w.DelRule(x.f, t.Name, c, h)
		}
	}
	for _, c := range x.flush {
		w.FlushChain(x.f, t.Name, c)
	}
	for _, c := range x.DelChains {
		w.DelChain(x.f, t.Name, c)
	}
	x.writeRules(w)
	for _, m := range t.Maps {
		if e := x.addElems[m.Name]; len(e) > 0 {
			w.Elements(true, x.f, t.Name, m, e)
		}
	}
}

// ReleaseRules makes Write let go of the table's fragments as it encodes
// them: for a transaction whose messages are the size of the fragments
// themselves (hundreds of MiB for a large table), so that the process does
// not hold both at once. Write then drops the table's Fragments, writes
// the rules in rounds of about round rules, forgets each round's chains
// once written, and calls between after each full round (to collect
// them; the chains of the last round go with the transaction).
// The elements keep copies of their strings: sharing the fragments'
// memory, they would keep its pages in use. The table keeps its fixed
// parts. Only for a table whose fragments are not used again (the
// nftables backend rebuilds them from its State), and a writer that
// copies what it writes (the kernel's batch, the fake kernel).
func (x *Tx) ReleaseRules(round int, between func()) {
	x.round, x.release = max(round, 1), between
}

// writeRules writes the rules of every chain in x.rules, in order.
func (x *Tx) writeRules(w txWriter) {
	if x.release == nil {
		w.addChainRules(x.f, x.table.Name, x.rules)
		return
	}
	for lo := 0; lo < len(x.rules); {
		hi, n := lo, 0
		for hi < len(x.rules) && n < x.round {
			n += len(x.rules[hi].Rules)
			hi++
		}
		w.addChainRules(x.f, x.table.Name, x.rules[lo:hi])
		clear(x.rules[lo:hi])
		if n >= x.round { // the last, partial round goes with the Tx
			x.release()
		}
		lo = hi
	}
	x.rules = nil
}

// cloneElementStrings gives the elements' strings memory of their own.
func cloneElementStrings(elems map[string][]Element) {
	for _, es := range elems {
		for i := range es {
			es[i] = es[i].withOwnStrings()
		}
	}
}

// withOwnStrings is e with copies of its strings, so that it does not keep
// the memory they shared (a fragment's) in use.
func (e Element) withOwnStrings() Element {
	e.Verdict.Chain, e.Comment = strings.Clone(e.Verdict.Chain), strings.Clone(e.Comment)
	return e
}

// FullTx rewrites the whole table in one transaction: every rule and element
// is replaced; whatever the kernel holds with other attributes than ours is
// deleted and created again; chains we no longer want are flushed and
// returned as stale (to be deleted by the next transaction, once nothing
// refers to them), but base chains, which nothing can refer to, are deleted,
// and so are another process's sets, objects and flowtables. With replace
// (or when only a re-creation can repair the table), the table is deleted
// and created again whole, in the same transaction: the kernel never shows
// it in between.
func FullTx(want *Table, have *KernelTable, replace bool) (x *Tx, stale []string) {
	x = newTx(want)
	x.newTable, x.fresh = true, !have.Exists
	if have.Exists && (replace || !bytes.Equal(have.udata, commentUdata(0, want.Comment))) {
		x.delTable = true // a comment is set only when a table is created
		have = &KernelTable{}
	}
	x.flushTable = have.Exists
	x.newSticky = want.Sticky != ""
	keys := want.fragmentKeys()
	x.fullSets(have, keys)
	x.delObjs = append(x.delObjs, have.objs...)
	x.delFlowtables = append(x.delFlowtables, have.flowtables...)
	return x, x.fullChains(have, want.chainsOf(keys))
}

// fullSets rewrites every map's elements, and deletes the sets that are
// not ours or not of our type. Anonymous sets go with their rules (the
// table's flush deletes them): the kernel refuses to delete them alone.
func (x *Tx) fullSets(have *KernelTable, keys []string) {
	want, f := x.table, x.f
	if ks := have.Sets[want.Sticky]; want.Sticky != "" && ks != nil && stickyMismatch(f, ks, want.StickyComment) != "" {
		x.delSets = append(x.delSets, want.Sticky)
	}
	for _, m := range want.Maps {
		ks := have.Sets[m.Name]
		switch {
		case ks == nil:
			x.newMaps = append(x.newMaps, m)
		case mapMismatch(f, ks, m) != "":
			x.delSets = append(x.delSets, m.Name)
			x.newMaps = append(x.newMaps, m)
		default:
			x.flushMaps = append(x.flushMaps, m.Name)
		}
		x.addElems[m.Name] = want.elementsOf(keys, m.Name)
	}
	for name, ks := range have.Sets {
		if want.Map(name) == nil && name != want.Sticky && !ks.anonymous() {
			x.delSets = append(x.delSets, name)
		}
	}
}

// fullChains creates the chains the kernel lacks, writes every chain's
// rules, and returns the regular chains not ours, to delete later.
// Anonymous chains go with the rules that jump to them.
func (x *Tx) fullChains(have *KernelTable, all []*Chain) (stale []string) {
	x.newChains = make([]*Chain, 0, len(all))
	x.rules = all
	// Which of the kernel's chains stay: only asked when it has any (not
	// in a new namespace, where this map would hold every chain for nothing).
	var wanted map[string]bool
	if len(have.Chains) > 0 {
		wanted = make(map[string]bool, len(all))
	}
	for _, c := range all {
		if wanted != nil {
			wanted[c.Name] = true
		}
		kc := have.Chains[c.Name]
		if kc != nil && chainMismatch(kc, c) != "" {
			x.delBase = append(x.delBase, c.Name)
			kc = nil
		}
		if kc == nil {
			x.newChains = append(x.newChains, c)
		}
	}
	for name, kc := range have.Chains {
		switch {
		case wanted[name] || kc.binding():
		case kc.Base:
			x.delBase = append(x.delBase, name)
		default:
			stale = append(stale, name)
		}
	}
	return stale
}

// DiffTx turns the last applied table into the wanted one, looking only at
// the fixed objects and the fragments that keys names: the others are
// known to be the same fragments in both. It returns the chains this
// transaction flushes (their references dropped), for the caller to
// delete in a later transaction (Tx.DelChains) once the kernel has
// released them.
func DiffTx(have, want *Table, keys []string) (x *Tx, stale []string) {
	x = newTx(want)
	x.newSticky = want.Sticky != "" && have.Sticky != want.Sticky
	for _, m := range want.Maps {
		if have.Map(m.Name) == nil {
			x.newMaps = append(x.newMaps, m)
		}
	}
	if have != want {
		x.diffChains(have.Chains, want.Chains, &stale)
		x.diffElements(mapElements(have.Maps), mapElements(want.Maps))
	}
	for _, key := range keys {
		old, fr := have.Fragments[key], want.Fragments[key]
		if old == fr {
			continue // same fragment (or absent from both): nothing to do
		}
		x.diffChains(old.chains(), fr.chains(), &stale)
		x.diffElements(old.elements(), fr.elements())
	}
	return x, stale
}

func (fr *Fragment) chains() []*Chain {
	if fr == nil {
		return nil
	}
	return fr.Chains
}

func (fr *Fragment) elements() []MapElement {
	if fr == nil {
		return nil
	}
	return fr.Elements
}

func mapElements(maps []*Map) []MapElement {
	var out []MapElement
	for _, m := range maps {
		for _, e := range m.Elements {
			out = append(out, MapElement{Map: m.Name, Element: e})
		}
	}
	return out
}

func (x *Tx) diffChains(have, want []*Chain, stale *[]string) {
	old := make(map[string]*Chain, len(have))
	for _, c := range have {
		old[c.Name] = c
	}
	for _, c := range want {
		o, ok := old[c.Name]
		delete(old, c.Name)
		switch {
		case !ok:
			x.newChains = append(x.newChains, c)
			x.rules = append(x.rules, c)
		case !equalChains(o, c):
			x.flush = append(x.flush, c.Name)
			x.rules = append(x.rules, c)
		}
	}
	for _, c := range have {
		if _, gone := old[c.Name]; gone {
			x.flush = append(x.flush, c.Name)
			*stale = append(*stale, c.Name)
		}
	}
}

type elemKey struct {
	m string
	k Key
}

func (x *Tx) diffElements(have, want []MapElement) {
	old := make(map[elemKey]Element, len(have))
	for _, e := range have {
		old[elemKey{e.Map, e.Key}] = e.Element
	}
	for _, e := range want {
		k := elemKey{e.Map, e.Key}
		o, ok := old[k]
		delete(old, k)
		if ok && o == e.Element {
			continue
		}
		if ok {
			x.delElems[e.Map] = append(x.delElems[e.Map], o)
		}
		x.addElems[e.Map] = append(x.addElems[e.Map], e.Element)
	}
	for _, e := range have {
		if o, gone := old[elemKey{e.Map, e.Key}]; gone {
			x.delElems[e.Map] = append(x.delElems[e.Map], o)
		}
	}
}
