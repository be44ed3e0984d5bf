package nftlib

import (
	"fmt"
	"reflect"
	"slices"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
)

// The kernel's side of TestEveryTermKind: every example the kernel takes
// (not those that name a chain or set it lacks) is written into a table of
// a fresh namespace and read back as the kernel dumps it (its own attribute
// order, register numbering and defaults), which must decode into the term
// again.
func TestKernelEveryTermKind(t *testing.T) {
	ns := testns.New(t, "knp-nft-")
	k, err := OpenKernel("/run/netns/" + ns)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	mapLookups := takesLookupInMap(t, k)
	for _, f := range Families {
		tbl := traceTable(f, Verdict{Kind: Accept})
		tbl.Name = "knp-terms"
		tbl.Chains = []*Chain{tbl.Chain("target")} // without the base chain, which masquerades in prerouting
		want := map[string]termCase{}
		for _, kind := range termKinds {
			name := reflect.TypeOf(kind).Name()
			for i, tc := range termCases(f)[name] {
				if !kernelTakes(tbl, tc.term, mapLookups) {
					continue
				}
				c := &Chain{Name: fmt.Sprintf("%s-%d", name, i), Rules: []Rule{R(tc.term)}}
				tbl.Chains = append(tbl.Chains, c)
				want[c.Name] = tc
			}
		}
		b := k.startBatch()
		b.AddTable(f, tbl.Name, "")
		b.AddChains(f, tbl.Name, tbl.Chains)
		for i, m := range tbl.Maps {
			b.addMap(f, tbl.Name, m, uint32(i+1))
			b.Elements(true, f, tbl.Name, m, m.Elements)
		}
		b.addStickySet(f, tbl.Name, tbl.Sticky, tbl.StickyComment, uint32(len(tbl.Maps)+1))
		b.addChainRules(f, tbl.Name, tbl.Chains)
		if err := k.commit(b); err != nil {
			t.Fatalf("%s: writing every term: %v", f, err)
		}
		t.Logf("%s: %d examples through the kernel", f, len(want))
		got, err := k.ReadTable(f, tbl.Name, tbl)
		if err != nil {
			t.Fatalf("%s: reading every term back: %v", f, err)
		}
		for _, c := range got.Chains {
			tc, ok := want[c.Name]
			if !ok {
				continue
			}
			delete(want, c.Name)
			w := tc.term
			if tc.decodesAs != nil {
				w = tc.decodesAs
			}
			if len(c.Rules) != 1 || len(c.Rules[0].Terms) != 1 || c.Rules[0].Terms[0] != w {
				t.Errorf("%s %s: %q read back as %+v", f, c.Name, tc.term.text(f), c.Rules)
			}
		}
		for name := range want {
			t.Errorf("%s: chain %s not read back", f, name)
		}
		checkReadBackEqual(t, k, tbl, got)
	}
}

// checkReadBackEqual checks that what was read back of want (got, from
// ReadTable) has its maps' elements, and that the canonical comparison of
// the kernel's dump with want (TableDrift, what a drift check runs) finds
// no difference though the dump is not byte-equal to what was sent.
func checkReadBackEqual(t *testing.T, k *Kernel, want, got *Table) {
	t.Helper()
	for _, m := range want.Maps {
		if g, w := elementTexts(got, m), elementTexts(want, m); !slices.Equal(g, w) {
			t.Errorf("%s %s: map %s's elements read back as %q, want %q", want.Family, want.Name, m.Name, g, w)
		}
	}
	kts, err := k.ReadFamily(want.Family, []string{want.Name}, nil)
	if err != nil {
		t.Fatal(err)
	}
	diffs, err := k.TableDrift(want, kts[want.Name], nil)
	if err != nil || len(diffs) > 0 {
		t.Errorf("%s %s: the kernel's dump differs from what was written: %q, %v", want.Family, want.Name, diffs, err)
	}
}

// elementTexts are map m's elements in t as nft text, sorted.
func elementTexts(t *Table, m *Map) []string {
	var out []string
	for _, e := range t.Elements(m.Name) {
		out = append(out, e.Text(t.Family, m.Key))
	}
	slices.Sort(out)
	return out
}

// kernelTakes tells whether the kernel accepts the term in the table: it
// refuses a jump to a chain the table lacks, and a lookup in a set the
// table lacks or whose key is not the lookup's.
// A plain lookup (no destination) in a map is taken by newer kernels only
// (Linux 6.1 refuses it with EINVAL): mapLookups says whether this one does.
// Nothing of ours writes one (IPVS mode's lookups are in plain sets, read
// back by its own kernel tests).
func kernelTakes(t *Table, term Term, mapLookups bool) bool {
	switch term := term.(type) {
	case Verdict:
		return term.Chain == "" || t.Chain(term.Chain) != nil
	case SetMatch:
		return mapLookups && lookupFits(t, term.Set, []Field{term.Field})
	case SetLookup:
		return mapLookups && lookupFits(t, term.Set, term.fields())
	}
	return true
}

// takesLookupInMap tries a plain lookup in a verdict map in a scratch
// table, which it deletes again.
func takesLookupInMap(t *testing.T, k *Kernel) bool {
	t.Helper()
	const table = "knp-probe-lookup"
	m := &Map{Name: "m", Key: []Field{FieldSaddr}}
	c := &Chain{Name: "c", Rules: []Rule{R(SetMatch{Field: FieldSaddr, Set: m.Name})}}
	b := k.startBatch()
	b.AddTable(IPv4, table, "")
	b.AddChains(IPv4, table, []*Chain{c})
	b.addMap(IPv4, table, m, 1)
	b.addChainRules(IPv4, table, []*Chain{c})
	if err := k.commit(b); err != nil {
		t.Logf("this kernel refuses a lookup without a destination in a map (%v): such examples are not tried", err)
		return false
	}
	b = k.startBatch()
	b.DelTable(IPv4, table)
	if err := k.commit(b); err != nil {
		t.Fatal(err)
	}
	return true
}

func lookupFits(t *Table, set string, key []Field) bool {
	m := t.Map(set)
	if m == nil {
		return false
	}
	n := keyLen(t.Family, key)
	if len(key) == 1 {
		n = key[0].size(t.Family)
	}
	return n == keyLen(t.Family, m.Key)
}
