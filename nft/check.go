package nft

import (
	"bytes"
	"fmt"

	"golang.org/x/sys/unix"
)

// maxDiffs bounds the differences described per table: a flushed table
// would otherwise list every rule.
const maxDiffs = 20

// drift collects the differences found in one table.
type drift struct {
	diffs []string
	more  int
}

func (d *drift) add(format string, args ...any) {
	if len(d.diffs) < maxDiffs {
		d.diffs = append(d.diffs, fmt.Sprintf(format, args...))
		return
	}
	d.more++
}

func (d *drift) list() []string {
	if d.more == 0 {
		return d.diffs
	}
	return append(d.diffs, fmt.Sprintf("and %d more differences", d.more))
}

// commentUdata is the userdata we send for a comment (nil for none).
func commentUdata(typ byte, c string) []byte {
	if c == "" {
		return nil
	}
	return userdataComment(typ, clampComment(c))
}

const setCommentType = 7 // NFTNL_UDATA_SET_COMMENT

// metaDrift compares a table's, chains' and sets' attributes; stale are
// chains we flushed and will delete, which may still be there.
func metaDrift(t *Table, kt *kTable, stale map[string]bool, d *drift) {
	name := t.Family.String() + " " + t.Name
	if !kt.exists {
		d.add("table %s: missing", name)
		return
	}
	if kt.flags != 0 {
		d.add("table %s: flags 0x%x, want 0", name, kt.flags)
	}
	if !bytes.Equal(kt.udata, commentUdata(0, t.Comment)) {
		d.add("table %s: comment differs", name)
	}
	wanted := make(map[string]bool, t.chainCount())
	t.eachChain(func(c *Chain) {
		wanted[c.Name] = true
		kc := kt.chains[c.Name]
		if kc == nil {
			d.add("chain %s: missing", c.Name)
		} else if why := chainMismatch(kc, c); why != "" {
			d.add("chain %s: %s", c.Name, why)
		}
	})
	for n, kc := range kt.chains {
		switch {
		case wanted[n] || (stale[n] && !kc.base):
		case kc.base:
			d.add("chain %s: not ours, a base chain (%s)", n, kc.describe())
		default:
			d.add("chain %s: not ours", n)
		}
	}
	for _, m := range t.Maps {
		if why := mapMismatch(t.Family, kt.sets[m.Name], m); why != "" {
			d.add("map %s: %s", m.Name, why)
		}
	}
	if t.Affinity {
		if why := affinityMismatch(t.Family, kt.sets[setAffinity]); why != "" {
			d.add("set %s: %s", setAffinity, why)
		}
	}
	for n, ks := range kt.sets {
		if t.Map(n) == nil && (n != setAffinity || !t.Affinity) {
			foreignSet(n, ks, d)
		}
	}
	statefulDrift(kt, d)
}

// foreignSet reports a set that is not ours.
func foreignSet(name string, ks *kSet, d *drift) {
	if ks.anonymous() {
		d.add("set %s: not ours, an anonymous set (goes with its rule)", name)
		return
	}
	d.add("set %s: not ours", name)
}

// statefulDrift reports a table's stateful objects and flowtables: we
// create none, so each is another process's.
func statefulDrift(kt *kTable, d *drift) {
	for _, o := range kt.objs {
		d.add("%s %s: not ours", o.kind(), o.name)
	}
	for _, ft := range kt.flowtables {
		d.add("flowtable %s: not ours", ft)
	}
}

// chainMismatch says how a chain in the kernel differs from ours, or "".
func chainMismatch(kc *kChain, c *Chain) string {
	want := kChain{flags: 0}
	if h := c.Hook; h != nil {
		want = kChain{base: true, typ: h.Type, hook: hookNumbers[h.Hook], priority: h.Priority, policy: nfAccept, flags: nftChainBase}
	}
	if kc.base != want.base || kc.typ != want.typ || kc.hook != want.hook || kc.priority != want.priority ||
		kc.policy != want.policy || kc.flags != want.flags {
		return fmt.Sprintf("%s, want %s", kc.describe(), want.describe())
	}
	if !bytes.Equal(kc.udata, commentUdata(0, c.Comment)) {
		return "comment differs"
	}
	return ""
}

func (kc *kChain) describe() string {
	if !kc.base {
		return fmt.Sprintf("a regular chain (flags 0x%x)", kc.flags)
	}
	hook := fmt.Sprint(kc.hook)
	for n, v := range hookNumbers {
		if v == kc.hook {
			hook = n
		}
	}
	policy := map[uint32]string{0: "drop", 1: "accept"}[kc.policy]
	if policy == "" {
		policy = fmt.Sprint(kc.policy)
	}
	return fmt.Sprintf("type %s hook %s priority %d policy %s flags 0x%x", kc.typ, hook, kc.priority, policy, kc.flags)
}

const verdictType = 0xffffff00 // NFT_DATA_VERDICT as a set's data type

// mapMismatch says how a map in the kernel differs from ours, or "".
func mapMismatch(f Family, ks *kSet, m *Map) string {
	switch {
	case ks == nil:
		return "missing"
	case ks.flags != unix.NFT_SET_MAP || ks.keyType != concatType(f, m.Key) || ks.keyLen != keyLen(f, m.Key) || ks.dataType != verdictType:
		return fmt.Sprintf("flags 0x%x key type 0x%x (%d bytes) data type 0x%x, want a verdict map with key type 0x%x (%d bytes)",
			ks.flags, ks.keyType, ks.keyLen, ks.dataType, concatType(f, m.Key), keyLen(f, m.Key))
	case !bytes.Equal(ks.udata, commentUdata(setCommentType, m.Comment)):
		return "comment differs"
	}
	return ""
}

const affinityFlags = unix.NFT_SET_TIMEOUT | unix.NFT_SET_EVAL

// affinityMismatch says how the affinity set in the kernel differs, or "".
func affinityMismatch(f Family, ks *kSet) string {
	switch {
	case ks == nil:
		return "missing"
	case ks.flags != affinityFlags || ks.keyType != affinityKeyType(f) || ks.keyLen != affinityKeyLen(f) || ks.dataType != 0:
		return fmt.Sprintf("flags 0x%x key type 0x%x (%d bytes), want flags 0x%x key type 0x%x (%d bytes)",
			ks.flags, ks.keyType, ks.keyLen, affinityFlags, affinityKeyType(f), affinityKeyLen(f))
	case !bytes.Equal(ks.udata, affinityUserdata(f)):
		return "userdata differs"
	}
	return ""
}

// eachChain calls fn for every chain of the table, fixed ones first, in
// no particular order of services.
func (t *Table) eachChain(fn func(c *Chain)) {
	for _, c := range t.Chains {
		fn(c)
	}
	for _, fr := range t.Fragments {
		for _, c := range fr.Chains {
			fn(c)
		}
	}
}

// eachElement calls fn for every element of the named map.
func (t *Table) eachElement(m string, fn func(e Element)) {
	if mp := t.Map(m); mp != nil {
		for _, e := range mp.Elements {
			fn(e)
		}
	}
	for _, fr := range t.Fragments {
		for _, e := range fr.Elements {
			if e.Map == m {
				fn(e.Element)
			}
		}
	}
}

// rulesDrift compares every rule of the table with the kernel's, in one
// dump of the table's rules.
func (k *Kernel) rulesDrift(t *Table, kt *kTable, d *drift) error {
	want := make(map[string]*Chain, t.chainCount())
	t.eachChain(func(c *Chain) { want[c.Name] = c })
	return k.chainRulesDrift(t.Family, t.Name, want, kt, d)
}

// chainRulesDrift compares the rules of the kernel's chains of a table
// (kt) with want's, by chain name, in canonical form.
func (k *Kernel) chainRulesDrift(f Family, table string, want map[string]*Chain, kt *kTable, d *drift) error {
	seen := make(map[string]int, len(want))
	bad := map[string]bool{}
	scratch := &batch{}
	var ck, cw []byte
	compare := func(chain string, exprs, udata []byte) {
		i := seen[chain]
		seen[chain] = i + 1
		c := want[chain]
		if c == nil || i >= len(c.Rules) || bad[chain] {
			return
		}
		r := c.Rules[i]
		var ok bool
		ck, ok = canonExprs(ck[:0], exprs)
		cw, _ = canonExprs(cw[:0], ruleExprs(scratch, f, r))
		if !ok || !bytes.Equal(ck, cw) || !bytes.Equal(udata, commentUdata(0, r.Comment)) {
			bad[chain] = true
			d.add("chain %s: rule %d differs, want %q", chain, i+1, r.text(f))
		}
	}
	for name := range kt.chains {
		if err := k.dumpChainRules(f, table, name, compare); err != nil {
			return err
		}
	}
	for name, c := range want {
		if kt.chains[name] != nil && seen[name] != len(c.Rules) {
			d.add("chain %s: %d rules, want %d", name, seen[name], len(c.Rules))
		}
	}
	for name, n := range seen {
		if want[name] == nil && n > 0 {
			d.add("chain %s: not ours, %d rules", name, n)
		}
	}
	return nil
}

// elementsDrift compares the elements of each of the table's maps that has
// the right type (the others are rewritten whole anyway).
func (k *Kernel) elementsDrift(t *Table, kt *kTable, d *drift) error {
	f := t.Family
	for _, m := range t.Maps {
		if mapMismatch(f, kt.sets[m.Name], m) != "" {
			continue
		}
		want := map[string]Element{}
		t.eachElement(m.Name, func(e Element) { want[string(encodeKey(f, m.Key, e.Key))] = e })
		err := k.dumpElements(f, t.Name, m.Name, func(e kElement) {
			w, ok := want[string(e.key)]
			if !ok {
				d.add("map %s: element %x is not ours", m.Name, e.key)
				return
			}
			delete(want, string(e.key))
			v := w.Verdict.expr()
			if e.verdict != int32(v.Kind) || e.chain != v.Chain {
				d.add("map %s: element %s has verdict %d %s, want %s", m.Name, w.keyText(m.Key), e.verdict, e.chain, w.Verdict.text(f))
			} else if !bytes.Equal(e.udata, commentUdata(0, w.Comment)) {
				d.add("map %s: element %s: comment differs", m.Name, w.keyText(m.Key))
			}
		})
		if err != nil {
			return err
		}
		for _, w := range want {
			d.add("map %s: element %s missing", m.Name, w.keyText(m.Key))
		}
	}
	return nil
}

// tableDrift describes every difference between an applied table and the
// kernel's.
func (k *Kernel) tableDrift(t *Table, kt *kTable, stale []string) ([]string, error) {
	var d drift
	staleSet := make(map[string]bool, len(stale))
	for _, n := range stale {
		staleSet[n] = true
	}
	metaDrift(t, kt, staleSet, &d)
	if kt.exists {
		if err := k.rulesDrift(t, kt, &d); err != nil {
			return nil, err
		}
		if err := k.elementsDrift(t, kt, &d); err != nil {
			return nil, err
		}
	}
	return d.list(), nil
}
