package nftlib

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
)

// setTxWriter is what writing a SetTable needs of a transaction writer:
// txWriter's table, chain and rule operations (batch and scriptWriter
// implement both) plus plain sets and their elements.
type setTxWriter interface {
	AddTable(f Family, name, comment string)
	DelTable(f Family, name string)
	AddChain(f Family, table string, c *Chain)
	AddRule(f Family, table, chain string, r Rule)
	addSet(f Family, table string, s *Set, id uint32)
	setElements(add bool, f Family, table string, s *Set, elems []SetElement)
}

var (
	_ setTxWriter = (*batch)(nil)
	_ setTxWriter = (*scriptWriter)(nil)
)

// writeReplace writes the whole table: add it (which does nothing when it
// exists), delete it, and create it with its sets, chains, rules and
// elements. In one transaction the kernel never shows a table in between.
func (t *SetTable) writeReplace(w setTxWriter, setID *uint32) {
	w.AddTable(t.Family, t.Name, t.Comment)
	w.DelTable(t.Family, t.Name)
	w.AddTable(t.Family, t.Name, t.Comment)
	for _, s := range t.Sets {
		*setID++
		w.addSet(t.Family, t.Name, s, *setID)
	}
	for _, c := range t.Chains {
		w.AddChain(t.Family, t.Name, c)
	}
	for _, c := range t.Chains {
		for _, r := range c.Rules {
			w.AddRule(t.Family, t.Name, c.Name, r)
		}
	}
	for _, s := range t.Sets {
		if elems := t.sortedElements(s); len(elems) > 0 {
			w.setElements(true, t.Family, t.Name, s, elems)
		}
	}
}

// SetElementChange adds elements to, or deletes them from, one set of a table.
type SetElementChange struct {
	Table    *SetTable
	Set      string
	Delete   bool
	Elements []SetElement
}

// writeElementChanges writes element changes in their order.
func writeElementChanges(w setTxWriter, changes []SetElementChange) error {
	for _, c := range changes {
		if len(c.Elements) == 0 {
			continue
		}
		s := c.Table.set(c.Set)
		if s == nil {
			return fmt.Errorf("table %s %s has no set %q", c.Table.Family, c.Table.Name, c.Set)
		}
		w.setElements(!c.Delete, c.Table.Family, c.Table.Name, s, c.Elements)
	}
	return nil
}

// ReplaceSetTables writes the tables whole, with their elements, in one
// transaction.
func (k *Kernel) ReplaceSetTables(tables ...*SetTable) error {
	b := k.startBatch()
	var id uint32
	for _, t := range tables {
		t.writeReplace(b, &id)
	}
	err := k.commit(b)
	k.finished(b)
	return err
}

// ApplySetElements applies element changes, in order, in one transaction:
// all of them or, when the kernel refuses one (an element added twice with
// other data, one deleted that is not there), none.
func (k *Kernel) ApplySetElements(changes []SetElementChange) error {
	b := k.startBatch()
	if err := writeElementChanges(b, changes); err != nil {
		return err
	}
	if b.Messages() == 0 {
		return nil
	}
	err := k.commit(b)
	k.finished(b)
	return err
}

// ReadSetTable reads back what the kernel holds of want's table: the
// elements of each set whose type and comment are want's (others count as
// empty), and a description of each difference in table, sets and chains
// (rules are not compared: whoever adopts the table rewrites them).
func (k *Kernel) ReadSetTable(want *SetTable) (elems map[string][]SetElement, diffs []string, err error) {
	kts, err := k.ReadFamily(want.Family, []string{want.Name}, nil) // chains dumped family-wide: a helper table is small
	if err != nil {
		return nil, nil, err
	}
	kt := kts[want.Name]
	elems = map[string][]SetElement{}
	if !kt.Exists {
		return elems, []string{"table missing"}, nil
	}
	for _, s := range want.Sets {
		ks := kt.Sets[s.Name]
		if d := setMismatch(want.Family, ks, s); d != "" {
			diffs = append(diffs, "set "+s.Name+": "+d)
			continue
		}
		got, err := k.readSetElements(want.Family, want.Name, s)
		if err != nil {
			return nil, nil, err
		}
		elems[s.Name] = got
	}
	for name := range kt.Sets {
		if want.set(name) == nil {
			diffs = append(diffs, "unexpected set "+name)
		}
	}
	for _, c := range want.Chains {
		kc := kt.Chains[c.Name]
		if kc == nil {
			diffs = append(diffs, "chain "+c.Name+": missing")
		} else if d := chainMismatch(kc, c); d != "" {
			diffs = append(diffs, "chain "+c.Name+": "+d)
		}
	}
	for name := range kt.Chains {
		if want.chain(name) == nil {
			diffs = append(diffs, "unexpected chain "+name)
		}
	}
	var d drift
	statefulDrift(kt, &d)
	return elems, append(diffs, d.list()...), nil
}

func setMismatch(f Family, ks *kernelSet, s *Set) string {
	switch {
	case ks == nil:
		return "missing"
	case ks.Flags != s.flags() || ks.KeyType != concatType(f, s.Key) || ks.KeyLen != s.keyLen(f) || ks.DataType != 0:
		return fmt.Sprintf("flags 0x%x key type 0x%x (%d bytes), want flags 0x%x key type 0x%x (%d bytes)",
			ks.Flags, ks.KeyType, ks.KeyLen, s.flags(), concatType(f, s.Key), s.keyLen(f))
	case !bytes.Equal(ks.Udata, commentUdata(SetCommentType, s.Comment)):
		return "comment differs"
	}
	return ""
}

// nftaSetElemKeyEnd is NFTA_SET_ELEM_KEY_END: the inclusive end of a
// concatenated range.
const nftaSetElemKeyEnd = 10

// NFTA_SET_DESC_CONCAT and NFTA_SET_FIELD_LEN: a concatenation's field lengths.
const (
	nftaSetDescConcat = 2
	nftaSetFieldLen   = 1
)

func (k *Kernel) readSetElements(f Family, table string, s *Set) ([]SetElement, error) {
	var out []SetElement
	var bad error
	attrs := func(m *batch) {
		m.str(unix.NFTA_SET_ELEM_LIST_TABLE, table)
		m.str(unix.NFTA_SET_ELEM_LIST_SET, s.Name)
	}
	err := k.dump(unix.NFT_MSG_GETSETELEM, f, attrs, func(p []byte) error {
		forAttrs(p, func(a nlAttr) {
			if a.typ != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
				return
			}
			forAttrs(a.data, func(el nlAttr) {
				var key, end []byte
				forAttrs(el.data, func(x nlAttr) {
					if x.typ != unix.NFTA_SET_ELEM_KEY && x.typ != nftaSetElemKeyEnd {
						return
					}
					forAttrs(x.data, func(v nlAttr) {
						if v.typ != unix.NFTA_DATA_VALUE {
							return
						}
						if x.typ == unix.NFTA_SET_ELEM_KEY {
							key = v.data
						} else {
							end = v.data
						}
					})
				})
				e, err := s.decode(f, key, end)
				if err != nil {
					bad = errors.Join(bad, err)
					return
				}
				out = append(out, e)
			})
		})
		return nil
	})
	if err != nil {
		if errors.Is(err, syscall.ENOENT) {
			return nil, nil
		}
		return nil, fmt.Errorf("listing elements of %s %s %s: %w", f, table, s.Name, err)
	}
	if bad != nil {
		return nil, fmt.Errorf("set %s %s %s: %w", f, table, s.Name, bad)
	}
	return out, nil
}

// decode turns an element's key (and, in an interval set, its end) back
// into a SetElement.
func (s *Set) decode(f Family, key, end []byte) (SetElement, error) {
	var e SetElement
	if len(key) != int(s.keyLen(f)) || (s.Interval && len(end) != len(key)) {
		return e, fmt.Errorf("element key of %d bytes (end %d), want %d", len(key), len(end), s.keyLen(f))
	}
	off := 0
	for _, fl := range s.Key {
		n := int(fl.size(f))
		v := key[off : off+n]
		switch fl {
		case FieldDaddr:
			e.Daddr, _ = netip.AddrFromSlice(v)
		case FieldL4Proto:
			e.Proto = v[0]
		case FieldDport:
			e.Port = uint16(v[0])<<8 | uint16(v[1])
		case FieldSaddr:
			lo, _ := netip.AddrFromSlice(v)
			e.Saddr = netip.PrefixFrom(lo, lo.BitLen())
			if s.Interval {
				hi, _ := netip.AddrFromSlice(end[off : off+n])
				p, ok := prefixOfRange(lo, hi)
				if !ok {
					return e, fmt.Errorf("range %s-%s is no prefix", lo, hi)
				}
				e.Saddr = p
			}
		}
		off += n
		if len(s.Key) > 1 {
			off = (off + 3) &^ 3
		}
	}
	return e, nil
}

func prefixOfRange(lo, hi netip.Addr) (netip.Prefix, bool) {
	for bits := lo.BitLen(); bits >= 0; bits-- {
		p := netip.PrefixFrom(lo, bits)
		if p.Masked().Addr() == lo && lastAddr(p) == hi {
			return p, true
		}
	}
	return netip.Prefix{}, false
}

// addSet declares a plain set (nft's `add set`).
func (b *batch) addSet(f Family, table string, s *Set, id uint32) {
	b.begin(unix.NFT_MSG_NEWSET, unix.NLM_F_CREATE, f)
	b.str(unix.NFTA_SET_TABLE, table)
	b.str(unix.NFTA_SET_NAME, s.Name)
	b.u32(unix.NFTA_SET_FLAGS, s.flags())
	b.u32(unix.NFTA_SET_KEY_TYPE, concatType(f, s.Key))
	b.u32(unix.NFTA_SET_KEY_LEN, s.keyLen(f))
	b.u32(unix.NFTA_SET_ID, id)
	if s.Interval {
		// The kernel's pipapo set needs each field's length.
		b.nest(unix.NFTA_SET_DESC)
		b.nest(nftaSetDescConcat)
		for _, fl := range s.Key {
			b.nest(unix.NFTA_LIST_ELEM)
			b.u32(nftaSetFieldLen, fl.size(f))
			b.unnest()
		}
		b.unnest()
		b.unnest()
	}
	if s.Comment != "" {
		b.commentAttr(unix.NFTA_SET_USERDATA, SetCommentType, clampComment(s.Comment))
	}
	b.end()
}

// setElements adds or deletes elements of a plain set.
func (b *batch) setElements(add bool, f Family, table string, s *Set, elems []SetElement) {
	b.elementMessages(add, f, table, s.Name, len(elems), func(i int) {
		b.nest(unix.NFTA_SET_ELEM_KEY)
		b.attr(unix.NFTA_DATA_VALUE, s.key(f, elems[i], false))
		b.unnest()
		if s.Interval {
			b.nest(nftaSetElemKeyEnd)
			b.attr(unix.NFTA_DATA_VALUE, s.key(f, elems[i], true))
			b.unnest()
		}
	})
}

func (s *scriptWriter) addSet(f Family, table string, set *Set, _ uint32) {
	flags := ""
	if set.Interval {
		flags = " flags interval;"
	}
	s.line("add set %s %s %s { type %s;%s comment %s; }", f, table, set.Name, set.typ(f), flags, quoteComment(set.Comment))
}

func (s *scriptWriter) setElements(add bool, f Family, table string, set *Set, elems []SetElement) {
	verb := "delete"
	if add {
		verb = "add"
	}
	for _, e := range elems {
		s.line("%s element %s %s %s { %s }", verb, f, table, set.Name, set.elementText(e))
	}
}
