package nftlib

import (
	"bytes"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// Render writes the ruleset in nft syntax, laid out as `nft list ruleset`
// prints it, so that `nft -f` loads it and a listing of the kernel can be
// compared with it line by line.
func (rs *Ruleset) Render(w io.Writer) error {
	var b strings.Builder
	for _, t := range rs.Tables {
		t.renderTo(&b)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// String is the rendered ruleset.
func (rs *Ruleset) String() string {
	var b strings.Builder
	_ = rs.Render(&b)
	return b.String()
}

func (t *Table) renderTo(b *strings.Builder) {
	fmt.Fprintf(b, "table %s %s {\n", t.Family, t.Name)
	if t.Comment != "" {
		fmt.Fprintf(b, "\tcomment %s\n", quoteComment(t.Comment))
	}
	first := true
	sep := func() {
		if !first {
			b.WriteString("\n")
		}
		first = false
	}
	for _, m := range t.Maps {
		sep()
		t.renderMap(b, m)
	}
	if t.Sticky != "" {
		sep()
		t.renderStickySet(b)
	}
	for _, c := range t.AllChains() {
		sep()
		c.renderTo(b, t.Family)
	}
	b.WriteString("}\n")
}

func (t *Table) renderMap(b *strings.Builder, m *Map) {
	types := make([]string, 0, len(m.Key))
	for _, fl := range m.Key {
		name, _ := fl.datatype(t.Family)
		types = append(types, name)
	}
	if m.Plain {
		fmt.Fprintf(b, "\tset %s {\n\t\ttype %s\n", m.Name, strings.Join(types, " . "))
		if m.Interval {
			b.WriteString("\t\tflags interval\n")
		}
	} else {
		fmt.Fprintf(b, "\tmap %s {\n\t\ttype %s : verdict\n", m.Name, strings.Join(types, " . "))
	}
	if m.Comment != "" {
		fmt.Fprintf(b, "\t\tcomment %s\n", quoteComment(m.Comment))
	}
	elems, n := t.Elements(m.Name), 1
	if m.Plain {
		// nft sorts a set's elements by key and prints narrow keys
		// several to a line.
		elems = sortedByKey(t.Family, m.Key, elems)
		n = perLine(t.Family, m.Key)
	}
	for i, e := range elems {
		switch {
		case i == 0:
			b.WriteString("\t\telements = { ")
		case i%n == 0:
			b.WriteString(",\n\t\t\t     ")
		default:
			b.WriteString(", ")
		}
		b.WriteString(m.elementText(t.Family, e))
	}
	if len(elems) > 0 {
		b.WriteString(" }\n")
	}
	b.WriteString("\t}\n")
}

func (c *Chain) renderTo(b *strings.Builder, f Family) {
	fmt.Fprintf(b, "\tchain %s {\n", c.Name)
	if c.Comment != "" {
		fmt.Fprintf(b, "\t\tcomment %s\n", quoteComment(c.Comment))
	}
	if h := c.Hook; h != nil {
		fmt.Fprintf(b, "\t\ttype %s hook %s priority %s; policy accept;\n", h.Type, h.Hook, priorityText(h))
	}
	for _, r := range c.Rules {
		b.WriteString("\t\t")
		b.WriteString(r.Text(f))
		b.WriteString("\n")
	}
	b.WriteString("\t}\n")
}

// Text is the rule as `nft list ruleset` prints it in a chain of family f.
func (r Rule) Text(f Family) string {
	parts := make([]string, 0, len(r.Terms)+1)
	for _, t := range r.Terms {
		parts = append(parts, t.text(f))
	}
	if r.Comment != "" {
		parts = append(parts, "comment "+quoteComment(r.Comment))
	}
	return strings.Join(parts, " ")
}

// sortedByKey is a copy of elems in the order of their encoded keys, each
// encoded once.
func sortedByKey(f Family, key []Field, elems []Element) []Element {
	type keyed struct {
		k []byte
		e Element
	}
	ks := make([]keyed, len(elems))
	for i, e := range elems {
		ks[i] = keyed{encodeKey(f, key, e.Key), e}
	}
	slices.SortFunc(ks, func(a, c keyed) int { return bytes.Compare(a.k, c.k) })
	out := make([]Element, len(ks))
	for i, k := range ks {
		out[i] = k.e
	}
	return out
}

// elementText is an element of the map as nft prints it: without a
// verdict in a Plain set.
func (m *Map) elementText(f Family, e Element) string {
	if !m.Plain {
		return e.Text(f, m.Key)
	}
	s := e.keyText(m.Key)
	if e.Comment != "" {
		s += " comment " + quoteComment(e.Comment)
	}
	return s
}

func (e Element) Text(f Family, key []Field) string {
	s := e.keyText(key)
	if e.Comment != "" {
		s += " comment " + quoteComment(e.Comment)
	}
	return s + " : " + e.Verdict.text(f)
}

func (e Element) keyText(key []Field) string { return e.Key.text(key) }

// priorityText names priorities the way nft prints them: a standard
// priority valid for the hook, plus or minus an offset of up to 10; any
// other value as a number.
func priorityText(h *Hook) string {
	std := []struct {
		name string
		prio int32
		hook string // "" for every hook
	}{
		{"raw", -300, ""}, {"mangle", -150, ""}, {"dstnat", -100, "prerouting"},
		{"filter", 0, ""}, {"security", 50, ""}, {"srcnat", 100, "postrouting"},
	}
	for _, p := range std {
		if p.hook != "" && p.hook != h.Hook {
			continue
		}
		switch off := h.Priority - p.prio; {
		case off == 0:
			return p.name
		case off > 0 && off <= 10:
			return fmt.Sprintf("%s + %d", p.name, off)
		case off < 0 && off >= -10:
			return fmt.Sprintf("%s - %d", p.name, -off)
		}
	}
	return strconv.Itoa(int(h.Priority))
}
