package nftlib

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// SetTable is a table of plain named sets and constant chains: every
// changing fact is a set element, so a sync changes elements only. It is
// built from the same terms and written by the same transaction writer as
// a Table, so that render, golden tests and the kernel see one object.
type SetTable struct {
	Family  Family
	Name    string
	Comment string
	Sets    []*Set
	Chains  []*Chain
	// Elements are the sets' elements, by set name.
	Elements map[string][]SetElement
}

// Set is a named set without data. Its key is a concatenation of packet
// fields, exactly those a SetLookup of it loads; with Interval the last
// field (an address) holds prefixes.
type Set struct {
	Name     string
	Key      []Field
	Interval bool
	Comment  string
}

// SetElement is one element of a Set; which fields count depends on the
// set's key: Daddr for FieldDaddr, Proto for FieldL4Proto, Port for
// FieldDport, Saddr for FieldSaddr (a full-length prefix unless the set is
// an interval set).
type SetElement struct {
	Daddr netip.Addr
	Proto uint8
	Port  uint16
	Saddr netip.Prefix
}

// set returns the table's set of that name, or nil.
func (t *SetTable) set(name string) *Set {
	for _, s := range t.Sets {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// chain returns the table's chain of that name, or nil.
func (t *SetTable) chain(name string) *Chain {
	for _, c := range t.Chains {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// Type is the set's key type as nft prints it.
func (s *Set) typ(f Family) string {
	types := make([]string, len(s.Key))
	for i, fl := range s.Key {
		types[i], _ = fl.datatype(f)
	}
	return strings.Join(types, " . ")
}

func (s *Set) flags() uint32 {
	if s.Interval {
		return unix.NFT_SET_INTERVAL | nftSetConcat
	}
	return 0
}

// nftSetConcat is NFT_SET_CONCAT: an interval set of concatenations
// (the kernel's pipapo set), which golang.org/x/sys/unix does not define.
const nftSetConcat = 0x80

// keyLen is the key's length as nft declares it: a single field as it is,
// a concatenation with each field padded to 4 bytes.
func (s *Set) keyLen(f Family) uint32 {
	if len(s.Key) == 1 {
		return s.Key[0].size(f)
	}
	return keyLen(f, s.Key)
}

// key encodes an element's key; with end, the last address of an
// interval set's prefix (pipapo ranges are inclusive).
func (s *Set) key(f Family, e SetElement, end bool) []byte {
	out := make([]byte, 0, 40)
	for _, fl := range s.Key {
		start := len(out)
		switch fl {
		case FieldDaddr:
			out = append(out, e.Daddr.AsSlice()...)
		case FieldSaddr:
			a := e.Saddr.Masked().Addr()
			if end {
				a = lastAddr(e.Saddr)
			}
			out = append(out, a.AsSlice()...)
		case FieldL4Proto:
			out = append(out, e.Proto)
		case FieldDport:
			out = binary.BigEndian.AppendUint16(out, e.Port)
		}
		for len(s.Key) > 1 && (len(out)-start)%4 != 0 {
			out = append(out, 0)
		}
	}
	return out
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// elementText is an element as nft prints it.
func (s *Set) elementText(e SetElement) string {
	parts := make([]string, 0, len(s.Key))
	for _, fl := range s.Key {
		switch fl {
		case FieldDaddr:
			parts = append(parts, e.Daddr.String())
		case FieldSaddr:
			if e.Saddr.IsSingleIP() {
				parts = append(parts, e.Saddr.Addr().String())
			} else {
				parts = append(parts, e.Saddr.Masked().String())
			}
		case FieldL4Proto:
			parts = append(parts, ProtoName(e.Proto))
		case FieldDport:
			parts = append(parts, strconv.Itoa(int(e.Port)))
		}
	}
	return strings.Join(parts, " . ")
}

// perLine is how many elements nft prints on one line: by the key's width.
func (s *Set) perLine(f Family) int {
	switch {
	case len(s.Key) > 1:
		return 1
	case s.Key[0].size(f) <= 2:
		return 5
	case s.Key[0].size(f) <= 4:
		return 2
	}
	return 1
}

// sortedElements returns the elements in the order nft lists them: by key value.
func (t *SetTable) sortedElements(s *Set) []SetElement {
	elems := slices.Clone(t.Elements[s.Name])
	slices.SortFunc(elems, func(a, b SetElement) int {
		return bytes.Compare(s.key(t.Family, a, false), s.key(t.Family, b, false))
	})
	return elems
}

// Render writes the table as `nft list ruleset` prints it.
func (t *SetTable) Render(w io.Writer) error {
	_, err := io.WriteString(w, t.String())
	return err
}

// String is the rendered table.
func (t *SetTable) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "table %s %s {\n", t.Family, t.Name)
	if t.Comment != "" {
		fmt.Fprintf(&b, "\tcomment %s\n", quoteComment(t.Comment))
	}
	first := true
	sep := func() {
		if !first {
			b.WriteString("\n")
		}
		first = false
	}
	for _, s := range t.Sets {
		sep()
		fmt.Fprintf(&b, "\tset %s {\n\t\ttype %s\n", s.Name, s.typ(t.Family))
		if s.Interval {
			b.WriteString("\t\tflags interval\n")
		}
		if s.Comment != "" {
			fmt.Fprintf(&b, "\t\tcomment %s\n", quoteComment(s.Comment))
		}
		elems := t.sortedElements(s)
		n := s.perLine(t.Family)
		for i, e := range elems {
			switch {
			case i == 0:
				b.WriteString("\t\telements = { ")
			case i%n == 0:
				b.WriteString(",\n\t\t\t     ")
			default:
				b.WriteString(", ")
			}
			b.WriteString(s.elementText(e))
		}
		if len(elems) > 0 {
			b.WriteString(" }\n")
		}
		b.WriteString("\t}\n")
	}
	for _, c := range t.Chains {
		sep()
		c.renderTo(&b, t.Family)
	}
	b.WriteString("}\n")
	return b.String()
}
