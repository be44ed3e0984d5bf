package nftlib

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

const SetCommentType = 7 // NFTNL_UDATA_SET_COMMENT

// metaDrift compares a table's, chains' and sets' attributes; stale are
// chains we flushed and will delete, which may still be there.
func metaDrift(t *Table, kt *KernelTable, stale map[string]bool, d *drift) {
	name := t.Family.String() + " " + t.Name
	if !kt.Exists {
		d.add("table %s: missing", name)
		return
	}
	if kt.Flags != 0 {
		d.add("table %s: flags 0x%x, want 0", name, kt.Flags)
	}
	if !bytes.Equal(kt.udata, commentUdata(0, t.Comment)) {
		d.add("table %s: comment differs", name)
	}
	wanted := make(map[string]bool, t.ChainCount())
	t.EachChain(func(c *Chain) {
		wanted[c.Name] = true
		kc := kt.Chains[c.Name]
		if kc == nil {
			d.add("chain %s: missing", c.Name)
		} else if why := chainMismatch(kc, c); why != "" {
			d.add("chain %s: %s", c.Name, why)
		}
	})
	for n, kc := range kt.Chains {
		switch {
		case wanted[n] || (stale[n] && !kc.Base):
		case kc.Base:
			d.add("chain %s: not ours, a base chain (%s)", n, kc.describe())
		default:
			d.add("chain %s: not ours", n)
		}
	}
	for _, m := range t.Maps {
		if why := mapMismatch(t.Family, kt.Sets[m.Name], m); why != "" {
			d.add("%s %s: %s", m.kind(), m.Name, why)
		}
	}
	if t.Sticky != "" {
		if why := stickyMismatch(t.Family, kt.Sets[t.Sticky], t.StickyComment); why != "" {
			d.add("set %s: %s", t.Sticky, why)
		}
	}
	for n, ks := range kt.Sets {
		if t.Map(n) == nil && n != t.Sticky {
			foreignSet(n, ks, d)
		}
	}
	statefulDrift(kt, d)
}

// foreignSet reports a set that is not ours.
func foreignSet(name string, ks *kernelSet, d *drift) {
	if ks.anonymous() {
		d.add("set %s: not ours, an anonymous set (goes with its rule)", name)
		return
	}
	d.add("set %s: not ours", name)
}

// statefulDrift reports a table's stateful objects and flowtables: we
// create none, so each is another process's.
func statefulDrift(kt *KernelTable, d *drift) {
	for _, o := range kt.objs {
		d.add("%s %s: not ours", o.kind(), o.Name)
	}
	for _, ft := range kt.flowtables {
		d.add("flowtable %s: not ours", ft)
	}
}

// chainMismatch says how a chain in the kernel differs from ours, or "".
func chainMismatch(kc *kernelChain, c *Chain) string {
	want := kernelChain{Flags: 0}
	if h := c.Hook; h != nil {
		want = kernelChain{Base: true, typ: h.Type, hook: hookNumbers[h.Hook], priority: h.Priority, policy: nfAccept, Flags: nftChainBase}
	}
	if kc.Base != want.Base || kc.typ != want.typ || kc.hook != want.hook || kc.priority != want.priority ||
		kc.policy != want.policy || kc.Flags != want.Flags {
		return fmt.Sprintf("%s, want %s", kc.describe(), want.describe())
	}
	if !bytes.Equal(kc.udata, commentUdata(0, c.Comment)) {
		return "comment differs"
	}
	return ""
}

func (kc *kernelChain) describe() string {
	if !kc.Base {
		return fmt.Sprintf("a regular chain (flags 0x%x)", kc.Flags)
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
	return fmt.Sprintf("type %s hook %s priority %d policy %s flags 0x%x", kc.typ, hook, kc.priority, policy, kc.Flags)
}

const VerdictType = 0xffffff00 // NFT_DATA_VERDICT as a set's data type

// mapMismatch says how a map in the kernel differs from ours, or "".
func mapMismatch(f Family, ks *kernelSet, m *Map) string {
	switch {
	case ks == nil:
		return "missing"
	case m.Plain && (ks.Flags != m.flags() || ks.KeyType != concatType(f, m.Key) || ks.KeyLen != keyLen(f, m.Key) || ks.DataType != 0):
		return fmt.Sprintf("flags 0x%x key type 0x%x (%d bytes) data type 0x%x, want a plain set with flags 0x%x key type 0x%x (%d bytes)",
			ks.Flags, ks.KeyType, ks.KeyLen, ks.DataType, m.flags(), concatType(f, m.Key), keyLen(f, m.Key))
	case !m.Plain && (ks.Flags != m.flags() || ks.KeyType != concatType(f, m.Key) || ks.KeyLen != keyLen(f, m.Key) || ks.DataType != VerdictType):
		return fmt.Sprintf("flags 0x%x key type 0x%x (%d bytes) data type 0x%x, want a verdict map with key type 0x%x (%d bytes)",
			ks.Flags, ks.KeyType, ks.KeyLen, ks.DataType, concatType(f, m.Key), keyLen(f, m.Key))
	case !bytes.Equal(ks.Udata, commentUdata(SetCommentType, m.Comment)):
		return "comment differs"
	}
	return ""
}

const stickyFlags = unix.NFT_SET_TIMEOUT | unix.NFT_SET_EVAL

// stickyMismatch says how the sticky set in the kernel differs, or "".
func stickyMismatch(f Family, ks *kernelSet, comment string) string {
	switch {
	case ks == nil:
		return "missing"
	case ks.Flags != stickyFlags || ks.KeyType != stickyKeyType(f) || ks.KeyLen != stickyKeyLen(f) || ks.DataType != 0:
		return fmt.Sprintf("flags 0x%x key type 0x%x (%d bytes), want flags 0x%x key type 0x%x (%d bytes)",
			ks.Flags, ks.KeyType, ks.KeyLen, stickyFlags, stickyKeyType(f), stickyKeyLen(f))
	case !bytes.Equal(ks.Udata, stickyUserdata(f, comment)):
		return "userdata differs"
	}
	return ""
}

// EachChain calls fn for every chain of the table, fixed ones first, then
// the fragments' in no particular order.
func (t *Table) EachChain(fn func(c *Chain)) {
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
func (k *Kernel) rulesDrift(t *Table, kt *KernelTable, d *drift) error {
	want := make(map[string]*Chain, t.ChainCount())
	t.EachChain(func(c *Chain) { want[c.Name] = c })
	return k.chainRulesDrift(t.Family, t.Name, want, kt, d)
}

// chainRulesDrift compares the rules of the kernel's chains of a table
// (kt) with want's, by chain name, in canonical form.
func (k *Kernel) chainRulesDrift(f Family, table string, want map[string]*Chain, kt *KernelTable, d *drift) error {
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
			d.add("chain %s: rule %d differs, want %q", chain, i+1, r.Text(f))
		}
	}
	for name := range kt.Chains {
		if err := k.dumpChainRules(f, table, name, compare); err != nil {
			return err
		}
	}
	for name, c := range want {
		if kt.Chains[name] != nil && seen[name] != len(c.Rules) {
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
func (k *Kernel) elementsDrift(t *Table, kt *KernelTable, d *drift) error {
	for _, m := range t.Maps {
		if mapMismatch(t.Family, kt.Sets[m.Name], m) != "" {
			continue
		}
		if _, err := k.mapElementsDrift(t, m, d); err != nil {
			return err
		}
	}
	return nil
}

// elementDiff is how a map's elements in the kernel differ from ours:
// ours missing there, ours there with another verdict or comment, and
// whether it holds elements that are not ours.
type elementDiff struct {
	missing, changed []Element
	foreign          bool
}

// mapElementsDrift compares the elements of t's map m with the kernel's.
func (k *Kernel) mapElementsDrift(t *Table, m *Map, d *drift) (elementDiff, error) {
	f := t.Family
	var ed elementDiff
	want := map[string]Element{}
	t.eachElement(m.Name, func(e Element) { want[m.elementID(f, e.Key)] = e })
	err := k.dumpElements(f, t.Name, m.Name, func(e kElement) {
		id := string(e.key) + string(e.end)
		w, ok := want[id]
		if !ok {
			ed.foreign = true
			d.add("%s %s: element %s is not ours", m.kind(), m.Name, m.kernelElementText(f, e))
			return
		}
		delete(want, id)
		v := w.Verdict.expr()
		if !m.Plain && (e.verdict != int32(v.Kind) || e.chain != v.Chain) {
			ed.changed = append(ed.changed, w)
			d.add("map %s: element %s has verdict %d %s, want %s", m.Name, w.keyText(m.Key), e.verdict, e.chain, w.Verdict.text(f))
		} else if !bytes.Equal(e.udata, commentUdata(0, w.Comment)) {
			ed.changed = append(ed.changed, w)
			d.add("%s %s: element %s: comment differs", m.kind(), m.Name, w.keyText(m.Key))
		}
	})
	if err != nil {
		return ed, err
	}
	for _, w := range want {
		ed.missing = append(ed.missing, w)
		d.add("%s %s: element %s missing", m.kind(), m.Name, w.keyText(m.Key))
	}
	return ed, nil
}

// kind is what nft calls the map: "set" when Plain.
func (m *Map) kind() string {
	if m.Plain {
		return "set"
	}
	return "map"
}

// kernelElementText is a kernel's element of m as nft prints its key, or
// in hex when it is not of m's type.
func (m *Map) kernelElementText(f Family, e kElement) string {
	k, err := m.decodeKey(f, e.key, e.end)
	if err != nil {
		return fmt.Sprintf("%x", append(e.key, e.end...))
	}
	return k.text(m.Key)
}

// TableDrift describes every difference between an applied table and the
// kernel's (kt, as ReadFamily read it): the table's attributes, its chains,
// rules, sets and elements, and what is not ours. stale are chains the
// caller flushed and deletes later: they may still be there. Nil means
// they match.
func (k *Kernel) TableDrift(t *Table, kt *KernelTable, stale []string) ([]string, error) {
	var d drift
	staleSet := make(map[string]bool, len(stale))
	for _, n := range stale {
		staleSet[n] = true
	}
	metaDrift(t, kt, staleSet, &d)
	if kt.Exists {
		if err := k.rulesDrift(t, kt, &d); err != nil {
			return nil, err
		}
		if err := k.elementsDrift(t, kt, &d); err != nil {
			return nil, err
		}
	}
	return d.list(), nil
}
