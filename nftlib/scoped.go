package nftlib

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"

	"golang.org/x/sys/unix"
)

// ScopedDrift compares, of t, only what scope names: the chains and sets
// the change monitor saw another process add, delete or change (or their
// rules and elements), the table's attributes, its stateful objects and
// flowtables. It returns the differences and the transactions that repair
// them in place (none when there are none):
//   - rules not ours are deleted by handle from a chain that otherwise
//     holds ours in order; other chains of ours are rewritten (flushed and
//     filled again), or created again when they are missing; our base
//     chains whose hook, type, priority, policy or comment changed are
//     deleted and created;
//   - our maps get their missing or changed elements back (a map holding
//     elements not ours, or missing, is filled again);
//   - chains, named sets, objects and flowtables not ours are deleted;
//     anonymous sets and chains go with the rule that holds them;
//   - the table's flags are set back to none.
//
// An error means the caller compares the whole table instead: the table
// or a chain or map of ours that exists with another kind or comment, a
// missing table, or a chain the last sync left to delete later (stale).
func (k *Kernel) ScopedDrift(t *Table, scope ChangeScope, stale []string) ([]string, []*Tx, error) {
	if scope.Whole {
		return nil, nil, errors.New("the whole table may have changed")
	}
	r := newScopedRepair(t)
	var d drift
	if scope.Table {
		if err := k.scopedTable(t, &d, r); err != nil {
			return nil, nil, err
		}
	}
	if err := k.scopedChains(t, slices.Sorted(maps.Keys(scope.Chains)), stale, &d, r); err != nil {
		return nil, nil, err
	}
	if err := k.scopedSets(t, slices.Sorted(maps.Keys(scope.Sets)), &d, r); err != nil {
		return nil, nil, err
	}
	if scope.Stateful {
		if err := k.scopedStateful(t, &d, r); err != nil {
			return nil, nil, err
		}
	}
	if len(d.diffs) == 0 {
		return nil, nil, nil
	}
	return d.list(), r.txs(), nil
}

// scopedTable compares the table's attributes; flags set by another
// process (dormant) are cleared by adding the table again.
func (k *Kernel) scopedTable(t *Table, d *drift, r *scopedRepair) error {
	kt, err := k.TableInfo(t.Family, t.Name)
	if err != nil {
		return err
	}
	switch {
	case kt == nil || !kt.Exists:
		return errors.New("the table is missing")
	case !bytes.Equal(kt.udata, commentUdata(0, t.Comment)):
		return errors.New("the table's comment differs")
	case kt.Flags != 0:
		d.add("table %s %s: flags 0x%x, want 0", t.Family, t.Name, kt.Flags)
		r.fix.newTable, r.fix.table.Comment = true, t.Comment
	}
	return nil
}

// scopedStateful deletes the table's stateful objects and flowtables: we
// create none. Rules using them are in chains the scope names (their
// events came with them), flushed before.
func (k *Kernel) scopedStateful(t *Table, d *drift, r *scopedRepair) error {
	kt := &KernelTable{}
	if err := k.readStateful(t.Family, t.Name, kt); err != nil {
		return err
	}
	statefulDrift(kt, d)
	r.drop.delObjs = append(r.drop.delObjs, kt.objs...)
	r.drop.delFlowtables = append(r.drop.delFlowtables, kt.flowtables...)
	return nil
}

// scopedRepair builds the repair of a scoped drift in two transactions
// applied as one: fix rewrites our chains and maps and flushes the foreign
// chains (dropping every reference the foreign objects hold to each
// other); then drop deletes the foreign sets, then the foreign chains.
type scopedRepair struct {
	t         *Table
	fix, drop *Tx
}

func newScopedRepair(t *Table) *scopedRepair {
	part := func() *Tx { return newTx(&Table{Family: t.Family, Name: t.Name}) }
	return &scopedRepair{t: t, fix: part(), drop: part()}
}

func (r *scopedRepair) txs() []*Tx { return []*Tx{r.fix, r.drop} }

// rewrite flushes one of our chains and writes its rules again; create
// when the kernel lacks it, recreate when it is a base chain whose
// attributes changed.
func (r *scopedRepair) rewrite(c *Chain, create, recreate bool) {
	switch {
	case recreate:
		r.fix.delBase = append(r.fix.delBase, c.Name)
		r.fix.newChains = append(r.fix.newChains, c)
	case create:
		r.fix.newChains = append(r.fix.newChains, c)
	default:
		r.fix.flush = append(r.fix.flush, c.Name)
	}
	r.fix.rules = append(r.fix.rules, c)
}

// foreignChain deletes a chain that is not ours; a base chain at once (no
// rule can refer to it), a regular one once every chain is flushed.
func (r *scopedRepair) foreignChain(name string, base bool) {
	if base {
		r.fix.delBase = append(r.fix.delBase, name)
		return
	}
	r.fix.flush = append(r.fix.flush, name)
	r.drop.DelChains = append(r.drop.DelChains, name)
}

// refill flushes one of our maps (creating it when the kernel lacks it)
// and adds its elements again.
func (r *scopedRepair) refill(m *Map, create bool) {
	if create {
		r.fix.newMaps = append(r.fix.newMaps, m)
	} else {
		r.fix.flushMaps = append(r.fix.flushMaps, m.Name)
	}
	r.fix.table.Maps = append(r.fix.table.Maps, m)
	r.t.eachElement(m.Name, func(e Element) { r.fix.addElems[m.Name] = append(r.fix.addElems[m.Name], e) })
}

// mend repairs the elements of one of our maps: those missing or changed
// alone, unless the kernel holds elements not ours (their keys are only
// bytes here), which a refill removes.
func (r *scopedRepair) mend(m *Map, ed elementDiff) {
	switch {
	case ed.foreign:
		r.refill(m, false)
	case len(ed.missing)+len(ed.changed) > 0:
		r.fix.table.Maps = append(r.fix.table.Maps, m)
		r.fix.delElems[m.Name] = ed.changed
		r.fix.addElems[m.Name] = append(ed.missing, ed.changed...)
	}
}

// scopedChains compares the named chains' attributes, and the rules of
// those of ours the kernel holds as they should be.
func (k *Kernel) scopedChains(t *Table, names, stale []string, d *drift, r *scopedRepair) error {
	if len(names) == 0 {
		return nil
	}
	ours, _ := t.chainsNamed(names)
	have := make(map[string]*kernelChain, len(names))
	if err := k.getChains(t.Family, t.Name, names, have); err != nil {
		return fmt.Errorf("reading chains %v: %w", names, err)
	}
	compared := make(map[string]bool, len(names))
	for i, name := range names {
		c, kc := ours[i], have[name]
		if c == nil && slices.Contains(stale, name) {
			return fmt.Errorf("chain %s is left to delete", name)
		}
		compare, err := scopedChain(name, c, kc, d, r)
		if err != nil {
			return err
		}
		compared[name] = compare
	}
	for _, c := range ours {
		if c != nil && compared[c.Name] {
			if err := k.scopedRules(t.Family, t.Name, c, d, r); err != nil {
				return err
			}
		}
	}
	return nil
}

// keptRule is a rule of a chain as the kernel holds it.
type keptRule struct {
	handle       uint64
	canon, udata []byte
	ok           bool // its expressions could be read
}

// scopedRules compares the rules of one of our chains with the kernel's.
// When the kernel holds ours, in order, and others besides, those others
// alone are deleted, by handle: rewriting the chain would add our rules
// again, and a rule that jumps makes the kernel validate the whole table,
// which costs in proportion to the table. Else the chain is rewritten.
func (k *Kernel) scopedRules(f Family, table string, c *Chain, d *drift, r *scopedRepair) error {
	kept, err := k.chainRules(f, table, c.Name)
	if err != nil {
		return err
	}
	scratch := &batch{}
	var cw []byte
	same := func(kr keptRule, r Rule) bool {
		cw, _ = canonExprs(cw[:0], ruleExprs(scratch, f, r))
		return kr.ok && bytes.Equal(kr.canon, cw) && bytes.Equal(kr.udata, commentUdata(0, r.Comment))
	}
	j, extra := 0, map[int]uint64{}
	for i, kr := range kept {
		if j < len(c.Rules) && same(kr, c.Rules[j]) {
			j++
		} else {
			extra[i] = kr.handle
		}
	}
	switch {
	case j == len(c.Rules) && len(extra) > 0:
		for _, i := range slices.Sorted(maps.Keys(extra)) {
			d.add("chain %s: rule %d (handle %d) is not ours", c.Name, i+1, extra[i])
			r.fix.delRules[c.Name] = append(r.fix.delRules[c.Name], extra[i])
		}
	case j < len(c.Rules):
		rulesDiffer(f, c, kept, same, d)
		r.rewrite(c, false, false)
	}
	return nil
}

// rulesDiffer describes how the kernel's rules of c differ from ours: the
// first rule that differs, or their numbers.
func rulesDiffer(f Family, c *Chain, kept []keptRule, same func(keptRule, Rule) bool, d *drift) {
	for i := range min(len(kept), len(c.Rules)) {
		if !same(kept[i], c.Rules[i]) {
			d.add("chain %s: rule %d differs, want %q", c.Name, i+1, c.Rules[i].Text(f))
			break
		}
	}
	if len(kept) != len(c.Rules) {
		d.add("chain %s: %d rules, want %d", c.Name, len(kept), len(c.Rules))
	}
}

// chainRules reads the rules of one chain, in order.
func (k *Kernel) chainRules(f Family, table, chain string) ([]keptRule, error) {
	var out []keptRule
	attrs := func(m *batch) {
		m.str(unix.NFTA_RULE_TABLE, table)
		m.str(unix.NFTA_RULE_CHAIN, chain)
	}
	err := k.dump(unix.NFT_MSG_GETRULE, f, attrs, func(p []byte) error {
		var kr keptRule
		in := true
		forAttrs(p, func(a nlAttr) {
			switch a.typ {
			case unix.NFTA_RULE_CHAIN:
				in = a.str() == chain
			case unix.NFTA_RULE_HANDLE:
				if len(a.data) == 8 {
					kr.handle = binary.BigEndian.Uint64(a.data)
				}
			case unix.NFTA_RULE_EXPRESSIONS:
				kr.canon, kr.ok = canonExprs(nil, a.data)
			case unix.NFTA_RULE_USERDATA:
				kr.udata = clone(a.data)
			}
		})
		if in {
			out = append(out, kr)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing rules of %s %s %s: %w", f, table, chain, err)
	}
	return out, nil
}

// scopedChain compares one chain's attributes: ours (c) with the kernel's
// (kc). It reports whether the rules are to be compared; the repair of a
// chain whose attributes differ is added to r.
func scopedChain(name string, c *Chain, kc *kernelChain, d *drift, r *scopedRepair) (compare bool, err error) {
	switch {
	case c == nil && (kc == nil || kc.binding()):
		// Came and went, or belongs to a rule (whose chain is named too).
	case c == nil:
		if kc.Base {
			d.add("chain %s: not ours, a base chain (%s)", name, kc.describe())
		} else {
			d.add("chain %s: not ours", name)
		}
		r.foreignChain(name, kc.Base)
	case kc == nil:
		d.add("chain %s: missing", name)
		r.rewrite(c, true, false)
	default:
		why := chainMismatch(kc, c)
		if why == "" {
			return true, nil
		}
		if !kc.Base || c.Hook == nil {
			return false, fmt.Errorf("chain %s: %s", name, why)
		}
		d.add("chain %s: %s", name, why)
		r.rewrite(c, false, true)
	}
	return false, nil
}

// scopedSets compares the named sets' attributes, and the elements of
// those of our maps the kernel holds as they should be. The sticky
// set's elements are the clients' and never compared.
func (k *Kernel) scopedSets(t *Table, names []string, d *drift, r *scopedRepair) error {
	if len(names) == 0 {
		return nil
	}
	kt := &KernelTable{Sets: map[string]*kernelSet{}}
	if err := k.readSets(t.Family, t.Name, kt); err != nil {
		return err
	}
	for _, name := range names {
		ks, m := kt.Sets[name], t.Map(name)
		switch {
		case name == t.Sticky && name != "":
			if err := scopedSticky(t, ks, d, r); err != nil {
				return err
			}
		case m == nil && ks != nil && !ks.anonymous():
			d.add("set %s: not ours", name)
			r.drop.delSets = append(r.drop.delSets, name)
		case m == nil:
			// Came and went, or an anonymous set: it goes with its rule.
		case ks == nil:
			d.add("map %s: missing", name)
			r.refill(m, true)
		default:
			if why := mapMismatch(t.Family, ks, m); why != "" {
				return fmt.Errorf("map %s: %s", name, why)
			}
			ed, err := k.mapElementsDrift(t, m, d)
			if err != nil {
				return err
			}
			r.mend(m, ed)
		}
	}
	return nil
}

// scopedSticky creates the sticky set again when it is missing.
func scopedSticky(t *Table, ks *kernelSet, d *drift, r *scopedRepair) error {
	if ks == nil {
		d.add("set %s: missing", t.Sticky)
		// The repair's table holds only what it writes: the set's name
		// and comment too.
		r.fix.newSticky, r.fix.table.Sticky, r.fix.table.StickyComment = true, t.Sticky, t.StickyComment
		return nil
	}
	if why := stickyMismatch(t.Family, ks, t.StickyComment); why != "" {
		return fmt.Errorf("set %s: %s", t.Sticky, why)
	}
	return nil
}
